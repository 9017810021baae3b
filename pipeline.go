package backfill

import (
	"context"

	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Extract ahead (the default; [Config.SerialExtract] turns it off). Each worker slot runs two
// goroutines sharing a [chunkPipe]: one leases and extracts the next
// chunk while the other runs the previous chunk's transaction.
// Invariants: a goroutine takes the write stage before it leaves the
// extract stage, so a slot writes its chunks in lease order, has at most
// one chunk transaction open and never overlaps two Extract calls; a
// chunk that waited for the write stage checks again that the call has
// not stopped and no throttle holds, else releases its lease; a claimed
// chunk keeps its stage until its outcome is recorded, so a failure that
// stops the call is known before the slot writes another chunk. The
// pipeline is off with [Config.JobConcurrency] (the chunk leased ahead
// would take a place of the cap) and with a pool too small for a
// transaction and a lease per slot plus the heartbeat. The design note
// docs/design/short-transactions.md explains the alternatives.

// chunkPipe is a worker slot's pair of stages; a nil *chunkPipe is a slot
// without a pipeline (every method is a no-op).
type chunkPipe struct {
	extract, write chan struct{}
	// slot is the worker slot's index, which the concurrency knob may
	// leave out (waitTurn): checked again once the extract stage is
	// taken, as a goroutine may have waited for it since its turn.
	slot int
}

func newChunkPipe(slot int) *chunkPipe {
	return &chunkPipe{extract: make(chan struct{}, 1), write: make(chan struct{}, 1), slot: slot}
}

// pipeTurn is the stage a goroutine holds (0: none).
type pipeTurn struct {
	p    *chunkPipe
	held chan struct{}
}

// enterExtract waits for the slot's extract stage; false when ctx ended.
func (p *chunkPipe) enterExtract(ctx context.Context) (*pipeTurn, bool) {
	t := &pipeTurn{p: p}
	if p == nil {
		return t, true
	}
	select {
	case p.extract <- struct{}{}:
		t.held = p.extract
		return t, true
	case <-ctx.Done():
		return t, false
	}
}

// enterWrite takes the slot's write stage, then leaves the extract stage;
// ok is false when ctx ended (the extract stage is left too). When the
// stage is taken (the slot's previous chunk is being written), it calls
// wait, then waits: waited.
func (t *pipeTurn) enterWrite(ctx context.Context, wait func()) (ok, waited bool) {
	if t.p == nil {
		return true, false
	}
	select {
	case t.p.write <- struct{}{}:
	default:
		wait()
		waited = true
		select {
		case t.p.write <- struct{}{}:
		case <-ctx.Done():
			t.leave()
			return false, true
		}
	}
	t.leave()
	t.held = t.p.write
	return true, waited
}

// leave leaves the stage held, if any (nil: none).
func (t *pipeTurn) leave() {
	if t != nil && t.held != nil {
		<-t.held
		t.held = nil
	}
}

// testSerialExtract turns Config.SerialExtract on for every call: set by
// this package's tests from BACKFILL_TEST_SERIAL_EXTRACT, to run the
// whole suite without the pipeline.
var testSerialExtract bool

// extractAhead reports whether this call's worker slots extract their
// next chunk while the current chunk's transaction runs (see the top of
// this file). Called once per call; when the call cannot, it says why in
// the log.
func (ex *execution) extractAhead() bool {
	c := ex.r.cfg
	if c.SerialExtract || testSerialExtract {
		return false
	}
	if c.JobConcurrency > 0 {
		ex.log.Info("backfill: extracting serially for this call: Config.JobConcurrency counts live leases, and a chunk leased ahead would take a place",
			"job_concurrency", c.JobConcurrency)
		return false
	}
	if pd, ok := ex.r.db.(pgstore.PGDB); ok && pd.DB != nil {
		// A transaction and a lease per slot, the heartbeat and one more
		// (a release, a control read).
		if n := pd.DB.Stats().MaxOpenConnections; n > 0 && n < 2*c.Concurrency+2 {
			ex.log.Warn("backfill: extracting serially for this call: the pool's MaxOpenConns is below 2×Concurrency+2, so a worker cannot extract its next chunk while its current chunk's transaction runs",
				"max_open_conns", n, "concurrency", c.Concurrency)
			return false
		}
	}
	return true
}
