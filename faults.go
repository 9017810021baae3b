package backfill

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Connection faults of a chunk's transaction (README, "Transient faults").
//
// A try of a chunk whose transaction ends because the connection or the
// server failed (pgstore.TransientCode: class 08, driver.ErrBadConn,
// io.EOF, 53300, 57P01-57P03, among them a backend terminated by
// another worker's fencing) is not a failed attempt: nothing is recorded
// against the chunk, which this call claims again after
// pgstore.ConnBackoff (100 ms doubled per fault, at most 5 s, jittered)
// under the same attempt number. A fenced worker's next lease skips the
// chunk while its new holder's lease is live. The faults of a chunk are
// bounded like the manifest's: 2 × Config.StaleAfter from the chunk's
// first fault in this call; past it the call ends with a retryable error
// and the run stays resumable (not failed). Waits (40001, 40P01, 55P03,
// 57014) are handled by chunkWaited; errors of the extraction (before
// the chunk's transaction) are attempts.

// chunkFaults are the connection faults of one chunk in this call since
// its last commit or failed attempt: the first one's time and how many.
type chunkFaults struct {
	first time.Time
	n     int
}

// chunkFault returns the SQLSTATE (or "connection") of err, the error of
// try cr, when it is a connection fault of the chunk's transaction.
func chunkFault(ctx context.Context, cr chunkRun, err error) (string, bool) {
	if !cr.inTx || errors.Is(err, backfilltype.ErrNotRetryable) || errors.Is(err, ErrExtractor) || errors.Is(err, ErrExtractorPanic) ||
		errors.Is(err, pgstore.ErrStatementPooler) {
		return "", false
	}
	return pgstore.TransientCode(ctx, err)
}

// chunkFaulted handles a try of ce's chunk whose transaction lost its
// connection (code, chunkFault): within the bound it logs the fault,
// keeps this call's claims off the chunk for the backoff, sleeps and
// reports true; past it the call stops with a retryable error that
// leaves the run resumable, and it reports false.
func (ex *execution) chunkFaulted(ctx context.Context, ce *ChunkError, cr chunkRun, code string) bool {
	seq := ce.Chunk.Seq
	bound := ex.r.reconnectBudget()
	ex.mu.Lock()
	if ex.faults == nil {
		ex.faults = map[int]*chunkFaults{}
	}
	f := ex.faults[seq]
	if f == nil {
		f = &chunkFaults{first: time.Now()}
		ex.faults[seq] = f
	}
	f.n++
	n, faulty := f.n, time.Since(f.first)
	final := faulty >= bound
	sleep := time.Duration(0)
	if final {
		delete(ex.faults, seq)
	} else {
		sleep = pgstore.ConnBackoff(n)
		ex.waits.avoid(seq, time.Now().Add(sleep))
	}
	ex.mu.Unlock()

	state := "sqlstate " + code
	if code == "connection" {
		state = "no sqlstate"
	}
	lost := &ChunkError{Chunk: ce.Chunk, Attempt: ce.Attempt, Err: fmt.Errorf("the connection to the server was lost (%s); the chunk's transaction rolled back: %w", state, ce.Err)}
	ex.traceRetry(ctx, backfilltrace.RetryData{Chunk: ce.Chunk, Attempt: ce.Attempt, Kind: backfilltrace.RetryFault, Try: n, SQLState: code, Sleep: sleep, Final: final, Err: lost})
	attrs := []any{"seq", seq, "chunk", ce.Chunk.ID, "attempt", ce.Attempt, "sqlstate", code, "fault", n, "faulty_for", faulty.Round(time.Millisecond)}
	// The slot's other chunk goes on while this one pauses.
	cr.turn.leave()
	if final {
		ex.log.Error("backfill: chunk's connection faults outlasted their bound; stopping, the run stays resumable", append(attrs, "bound", bound, "error", lost.Err)...)
		lost.Err = fmt.Errorf("%w: lost %d times in %s, past the bound of 2 × Config.StaleAfter (%s; %w); the run is not failed: run the job again once the database is reachable",
			lost.Err, n, faulty.Round(time.Millisecond), bound, pgstore.ErrFaultBound)
		// Not ex.fail(lost, nil): the chunk did not fail, and the run
		// is left running for the next call.
		ex.fail(nil, lost)
		return false
	}
	ex.log.Warn("backfill: chunk's connection to the server was lost; rolled back, retrying after a pause (not counted toward MaxAttempts)", append(attrs, "sleep", sleep, "error", lost.Err)...)
	select {
	case <-ctx.Done():
	case <-time.After(sleep):
	}
	return true
}
