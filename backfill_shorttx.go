package backfill

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Short transactions (see doc.go, "Many workers and hosts").
//
// With a manifest that leases chunks across transactions ([PGManifest],
// manifest_lease.go) and a registered worker, no transaction of the
// library is open while the extractor runs:
//
//  1. lease: a short transaction of its own leases the next claimable
//     chunk (leaseChunk) and commits;
//  2. extract: the extractor runs outside any transaction; the row writer
//     converts and checks its rows as always, queues its rejects, and
//     keeps the converted rows in a spool (backfill_spool.go: memory up
//     to a bound, then a temporary file);
//  3. the chunk's transaction: the lease's session settings and the fence
//     (fenceLease: the lease still the worker's at its epoch, under the
//     row lock), then, as before, the
//     publish mode's target, staging (the spool replayed into COPY, with
//     the isolation of refused values, which replays it again), merge,
//     validation, checkpoint, commit.
//
// A chunk whose fence finds no row was taken over by another worker (this
// one stopped heartbeating for longer than its stale bound): its
// transaction rolls back and nothing of it is recorded; the worker claims
// again. Any other end without a commit releases the lease (if it is
// still the worker's) before the failure is recorded, as the rollback of
// the claim's transaction released the row lock before.
//
// A retried try (a wait, [Config.LockRetries]) leases and extracts the
// chunk again. With [Config.JobConcurrency] a lease is taken only while
// fewer than that many chunks of the batch hold a live lease: the cap
// counts the chunks from their lease to their commit, across processes.

// spooled is a chunk extracted into a spool, with the row writer that
// counted its rows and queued its rejects.
type spooled struct {
	sp *spool
	w  *rowWriter
	// skip carries the spooled rows' fingerprint (Job.SkipUnchanged; nil
	// without it).
	skip *chunkSkip
}

// close closes the spool, if the chunk was extracted (a chunk not
// extracted on its version has none, replay_skip_version.go).
func (s *spooled) close() {
	if s != nil && s.sp != nil {
		_ = s.sp.Close()
	}
}

// replay stages the spooled rows with w, a fresh row writer of a staging
// attempt: w starts from the extraction's counts and exceptions.
func (s *spooled) replay(ctx context.Context, w *rowWriter) error {
	w.row, w.read, w.rejected = s.w.row, s.w.read, s.w.rejected
	w.exceptions = slices.Clone(s.w.exceptions)
	if !slices.Equal(w.names, s.w.names) {
		return fmt.Errorf("%w: the publish target's columns [%v] differ from the columns the chunk was extracted for [%v]", backfilltype.ErrNotRetryable, w.names, s.w.names)
	}
	last := w.row
	err := s.sp.replay(ctx, func(row int64, values []any) error {
		w.row = row
		return w.stageRow(ctx, values, values)
	})
	w.row = last
	if err != nil && w.err != nil {
		// The staging's error: reported as such (chunkStaging.attempt).
		return nil
	}
	return err
}

// leasing reports whether this call's chunks run in short transactions:
// with a manifest that leases and a registered worker. The job-wide
// concurrency cap (Config.JobConcurrency) is then a cap on the batch's
// live leases (leaseChunk).
func (ex *execution) leasing() bool {
	return ex.r.caps.workers != nil && ex.worker != nil
}

// runChunkLeased is runChunk in short transactions (see the top of this
// file).
func (ex *execution) runChunkLeased(ctx context.Context, p *chunkPipe) (cr chunkRun, err error) {
	r, wm := ex.r, ex.r.caps.workers
	// The slot's extract stage, then its write stage before the chunk's
	// transaction (backfill_pipeline.go); the stage held is left on return.
	turn, ok := p.enterExtract(ctx)
	defer func() {
		// A chunk claimed hands its stage to next, which leaves it once
		// the chunk's outcome is recorded: a failure that stops the call
		// is known before the slot's other goroutine leases or writes.
		if cr.claimed {
			cr.turn = turn
		} else {
			turn.leave()
		}
	}()
	if !ok {
		return cr, ctx.Err()
	}
	if p != nil && ex.stopped() {
		// Stopped while this goroutine waited for the stage.
		return cr, nil
	}
	if p != nil && ex.ctl != nil && p.slot >= ex.liveConcurrency() {
		// The concurrency knob was lowered while this goroutine waited
		// for the stage: the slot's other goroutine held it, and this
		// one must not lease a chunk the knob no longer allows.
		cr.parked = true
		return cr, nil
	}
	s := r.cfg.txSettings()
	l := backfilldriver.Lease{Key: ex.worker.key, StaleAfter: r.cfg.StaleAfter, LockTimeout: s.TryLockTimeout(0), StmtTimeout: s.StmtSetting(),
		JobConcurrency: r.cfg.JobConcurrency}
	l.Avoid, _ = ex.avoided()

	// Lease. The leases of this call's goroutines share its worker key:
	// one goroutine leases at a time, avoiding the chunks the others
	// hold (a lease of the key that none holds is taken again: a release
	// that failed).
	leaseStart := time.Now() // the claim phase's (trace.go)
	ex.leaseMu.Lock()
	ex.mu.Lock()
	for seq := range ex.leased {
		l.Avoid = append(l.Avoid, seq)
	}
	ex.mu.Unlock()
	cl, ok, full, err := wm.LeaseChunk(ctx, r.db, ex.batchID, l)
	if err != nil || !ok {
		ex.leaseMu.Unlock()
		cr.noSlot = full
		if err == nil {
			// No lease: the run may have been paused or cancelled, which
			// the lease's statement did not report (backfill_control.go).
			ex.pollControl(ctx)
		}
		return cr, err
	}
	if r.caps.control != nil && ex.ctl != nil {
		// The control state between two chunks, read by the lease.
		ex.applyControl(ctx, cl.Control)
	}
	seq := cl.State.Chunk.Seq
	ex.mu.Lock()
	if ex.leased == nil {
		ex.leased = map[int]bool{}
	}
	ex.leased[seq] = true
	ex.mu.Unlock()
	ex.leaseMu.Unlock()
	release := true
	defer func() {
		ex.mu.Lock()
		delete(ex.leased, seq)
		ex.mu.Unlock()
		if release {
			if rerr := wm.ReleaseLease(context.WithoutCancel(ctx), r.db, ex.batchID, seq, l.Key, cl.Epoch); rerr != nil {
				// Not lost: the lease is this worker's, which claims it
				// again, and it ends with the worker's call.
				ex.log.Warn("backfill: releasing a chunk's lease failed", "seq", seq, "error", rerr)
			}
		}
	}()
	if ex.stopped() {
		return cr, nil
	}
	if ex.throttle.holding() {
		cr.throttled = true
		return cr, nil
	}
	cr.claimed, cr.attempt, cr.fresh = true, cl.State.Attempts+1, cl.State.Status == ChunkPending
	ctx = ex.traceChunk(ctx, &cr, cl.State.Chunk, leaseStart)
	defer func() { cr.span.end(&cr, err) }()
	c, ok := ex.plan.ChunkOf(cl.State.Chunk)
	if !ok {
		return cr, &ChunkError{Chunk: cl.State.Chunk, Attempt: cr.attempt, Err: fmt.Errorf("%w: manifest chunk %d %q is not in the plan (or the Chunker's ChunkOf returned another chunk for it)", backfilltype.ErrNotRetryable, seq, cl.State.Chunk.ID)}
	}
	chunkErr := func(err error) error { return &ChunkError{Chunk: c, Attempt: cr.attempt, Err: err} }
	started := time.Now()
	cr.reread = cl.State.Status == ChunkOpen
	xctx := cr.span.next(ctx, backfilltrace.PhaseExtract)

	// A job with SkipUnchanged and a ChunkVersioner: the chunk's version,
	// before its extraction, and whether its base lets it skip the
	// extraction (replay_skip_version.go): then it is not extracted, and
	// its transaction decides.
	var x *spooled
	version, err := ex.chunkVersion(xctx, c, cr.reread, started)
	if err != nil {
		return cr, chunkErr(err)
	}
	if ok, err := ex.versionCandidate(xctx, c, version); err != nil {
		return cr, chunkErr(err)
	} else if ok {
		x = &spooled{skip: &chunkSkip{version: version}}
	}

	// Extract, outside any transaction, into a spool.
	if x == nil {
		if x, err = ex.extractSpooled(xctx, c, started, version); err != nil { // replay_skip_run.go
			return cr, chunkErr(err)
		}
		defer x.close()
		cr.span.setRows(x.w.read)
	}

	// The slot's write stage: the previous chunk leased by the slot is
	// written first (backfill_pipeline.go). A chunk that waited for it
	// checks again what the lease checked.
	ok, waited := turn.enterWrite(ctx, func() { cr.span.next(ctx, backfilltrace.PhaseQueued) })
	if !ok {
		return cr, chunkErr(ctx.Err())
	}
	if waited && (ex.stopped() || ex.throttle.holding()) {
		cr.claimed, cr.throttled = false, !ex.stopped()
		cr.span.release()
		return cr, nil
	}

	// The chunk's transaction.
	cr.span.next(ctx, backfilltrace.PhaseStage)
	tx, err := r.db.Begin(ctx)
	if err != nil {
		// An attempt of the chunk: recorded as failed, like a failure
		// inside its transaction.
		return cr, chunkErr(fmt.Errorf("begin chunk transaction: %w", err))
	}
	tx = batched(tx) // backfill_batch.go
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	// The fence first: the lease still this worker's, the row locked
	// until the commit.
	fenced, pid, ok, err := wm.FenceLease(ctx, tx, ex.batchID, seq, cl.Epoch, l)
	if err != nil {
		return cr, chunkErr(err)
	}
	if b, isBatch := tx.(*pgstore.BatchTx); isBatch {
		b.Fresh = ok && fenced.Status == ChunkPending
	}
	if !ok {
		// The deferred release clears the lease only if it is still this
		// worker's at this epoch: a lease taken over is left to its new
		// holder; one left by a run paused or abandoned meanwhile is freed
		// for the run's resume.
		cr.fenced, cr.claimed = true, false
		cr.span.release()
		ex.log.Warn("backfill: chunk's fence failed: its lease was taken over (this worker was stale) or the run stopped meanwhile (paused, abandoned); its transaction rolls back", "seq", seq, "chunk", c.ID)
		return cr, nil
	}
	err = ex.loadChunk(ctx, tx, &cr, c, pid, started, x)
	if errors.Is(err, errVersionMissed) {
		// Not extracted on its version, but it must be: its transaction
		// rolls back, its lease is released (deferred) and this call's
		// next lease of it extracts it (replay_skip_version.go).
		ex.versionMissed(seq, true)
		cr.requeued, cr.claimed = true, false
		cr.span.release()
		return cr, nil
	}
	committed = err == nil
	release = !committed
	return cr, err
}
