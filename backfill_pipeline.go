package backfill

import (
	"context"

	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Extract ahead (Config.ExtractAhead).
//
// A chunk's extraction runs (backfill_shorttx.go) outside any transaction, before the chunk's transaction. Run one after
// the other, the client converts rows while the server waits, and the
// server merges and commits while the client waits. So each worker slot
// of Config.Concurrency runs two goroutines sharing one chunkPipe, a
// two-stage pipeline:
//
//	goroutine A: [lease+extract N]            [write N: fence ... commit]
//	goroutine B:                   [lease+extract N+1]      [write N+1 ...]
//
// The extract stage (the lease and the extraction into the spool) and the
// write stage (the chunk's transaction, from BEGIN to COMMIT or rollback)
// are each held by one goroutine of the slot at a time. A goroutine takes
// the write stage before it leaves the extract stage, so the chunks of a
// slot are written in the order they were leased, and the slot never has
// more than one chunk transaction open: Concurrency still counts chunk
// transactions. What the pipeline adds is one chunk per slot leased and
// extracted (held in its spool) while the slot's previous chunk is
// written; a worker's Extract calls never overlap either.
//
// The chunk waiting for the write stage holds a live lease, heartbeated as
// any other; its trace span is in PhaseQueued meanwhile. Once it has the
// stage, it checks again that the call has not stopped and that no
// throttle holds (both may have changed while it waited); if either did,
// its lease is released and the chunk stays claimable (a chunk that did
// not wait goes on, as without the pipeline). A cancel committed meanwhile is caught by the fence
// (FenceLease), as for any lease; a pause lets it finish, like any chunk
// in flight.
//
// A claimed chunk keeps its stage until next has recorded its outcome
// (chunkDone: after the hooks and the run's reject-rate check;
// chunkFailed: before the hooks and a retry's backoff, during which no
// goroutine of the call claims the chunk), so a failure that stops the
// call (a final failure, a quality gate) is known before the slot's other
// goroutine leases or writes another chunk.
//
// The pipeline is on with Config.ExtractAhead, except with a job-wide cap
// (Config.JobConcurrency counts live leases, and the chunk leased ahead
// would take a place of it), and when the connection pool is too small
// for a transaction and a lease per slot plus the heartbeat.

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

// testExtractAhead turns Config.ExtractAhead on for every call: set by
// this package's tests from BACKFILL_TEST_EXTRACT_AHEAD, to run the whole
// suite with the pipeline.
var testExtractAhead bool

// extractAhead reports whether this call's worker slots extract their
// next chunk while the current chunk's transaction runs (see the top of
// this file); asked for and not possible, it says why in the log.
func (ex *execution) extractAhead() bool {
	c := ex.r.cfg
	if !(c.ExtractAhead || testExtractAhead) {
		return false
	}
	off := func(why string, args ...any) bool {
		ex.log.Warn("backfill: Config.ExtractAhead is off for this call: "+why, args...)
		return false
	}
	if c.JobConcurrency > 0 {
		return off("Config.JobConcurrency counts live leases, and a chunk leased ahead would take a place", "job_concurrency", c.JobConcurrency)
	}
	if pd, ok := ex.r.db.(pgstore.PGDB); ok && pd.DB != nil {
		// A transaction and a lease per slot, the heartbeat and one more
		// (a release, a control read).
		if n := pd.DB.Stats().MaxOpenConnections; n > 0 && n < 2*c.Concurrency+2 {
			return off("the pool's MaxOpenConns is below 2×Concurrency+2", "max_open_conns", n, "concurrency", c.Concurrency)
		}
	}
	return true
}
