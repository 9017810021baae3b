package backfill

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Waits for the advisory locks of the merge (the key locks, and a
// rollback's whole-target lock): see the package documentation,
// "Fencing". They are taken in steps of the poll interval
// ([pgstore.WaitLock]); after each step that timed out, lockWaiting
// lists the holders of a conflicting lock, terminates the backend of
// each whose worker is stale (the fence of waitHeld, with the same
// condition), logs each holder, and tries again while a holder is a live
// worker (whose merge ends on its own), was just fenced, or is gone. A
// holder that is no worker of the library (an operator's session) is a
// lock wait like any other: once the wait reaches the try's lock_timeout
// the lock's 55P03 ends the try, which chunkWaited rolls back, records
// and retries.

// lockHolderLister is the manifest that lists (and fences) the holders
// of an advisory lock: the PostgreSQL one.
type lockHolderLister interface {
	LockHolders(ctx context.Context, db sqlx.ExtContext, w pgstore.LockWait, self string, staleAfter time.Duration, fence bool) ([]backfilldriver.ChunkHolder, error)
}

// lockWaitRecord is what lockWaiting records of a wait that ended with
// the locks granted: the chunk's try (nil for a wait outside a chunk,
// which is logged only). The waits are kept in waits until the chunk's
// transaction has ended (recordLockWaits): recorded while it holds its
// connection, a wait would need one more, which a small pool (a
// pooler's server connections) may not have while every connection is
// held by a chunk.
type lockWaitRecord struct {
	chunk       Chunk
	attempt     int
	try         int
	lockTimeout string

	mu    sync.Mutex
	waits []backfilltype.Wait
}

// lockWaiting returns how a transaction of this Runner waits for the
// merge's advisory locks (see above): log is the caller's logger, self
// its worker key ("" for none), rec the chunk's try to record the wait
// of (nil: not recorded).
func (r *Runner) lockWaiting(log *slog.Logger, batchID int64, self string, rec *lockWaitRecord) pgstore.LockWaiting {
	lw := pgstore.LockWaiting{Step: r.pollInterval()}
	lister, ok := r.caps.workers.(lockHolderLister)
	if !ok {
		return lw
	}
	var fenceOff atomic.Bool
	var last []backfilldriver.ChunkHolder
	lw.Wait = func(ctx context.Context, w pgstore.LockWait) bool {
		if w.Done {
			log.Info("backfill: lock granted after waiting", "what", w.What, "batch_id", batchID, "waited", w.Waited)
			r.recordLockWait(ctx, log, batchID, w, rec, last)
			return true
		}
		// The holders are listed (and fenced) in the waiting transaction,
		// on its connection: on a pool of few server connections (a
		// pooler's) every connection may be held by a transaction that
		// waits, and a wait that needed one more to list its holders would
		// wait for ever ([pgstore.LockWait.Tx]).
		holders := func(fence bool) (hs []backfilldriver.ChunkHolder, err error) {
			if w.Tx == nil {
				return lister.LockHolders(ctx, r.db, w, self, r.cfg.StaleAfter, fence)
			}
			err = pgstore.InSavepoint(ctx, w.Tx, func(tx sqlx.ExtContext) error {
				hs, err = lister.LockHolders(ctx, tx, w, self, r.cfg.StaleAfter, fence)
				return err
			})
			return hs, err
		}
		hs, err := holders(!fenceOff.Load())
		if err != nil && pgstore.IsPermission(err) {
			fenceOff.Store(true)
			log.Error("backfill: cannot terminate a stale worker's backend: grant the role pg_signal_backend (or run every worker as the same role); waiting instead",
				"what", w.What, "error", err)
			hs, err = holders(false)
		}
		if err != nil {
			log.Warn("backfill: listing the holders of a lock failed", "what", w.What, "batch_id", batchID, "waited", w.Waited, "error", err)
		}
		last = hs
		keep := len(hs) == 0
		for _, h := range hs {
			pgstore.LogLockHolder(log, w, batchID, h)
			if h.Terminated || h.AgeSec >= 0 && !h.Stale {
				keep = true
			}
		}
		return keep || w.Budget == 0 || w.Waited < w.Budget
	}
	return lw
}

// recordLockWait keeps, for chunk try rec, a lock wait that ended with
// the locks granted, with the holders last seen as its blockers, for
// recordLockWaits.
func (r *Runner) recordLockWait(ctx context.Context, log *slog.Logger, batchID int64, w pgstore.LockWait, rec *lockWaitRecord, hs []backfilldriver.ChunkHolder) {
	if rec == nil || r.caps.waits == nil {
		return
	}
	bs := make([]backfilltype.Blocker, len(hs))
	for i, h := range hs {
		state := "live worker"
		switch {
		case h.Terminated:
			state = "stale worker, fenced"
		case h.Stale:
			state = "stale worker"
		case h.AgeSec < 0:
			state = "not a worker"
		}
		bs[i] = backfilltype.Blocker{PID: h.PID, ApplicationName: h.WorkerID, State: state, Mode: "advisory"}
	}
	rw := backfilltype.Wait{BatchID: batchID, Seq: rec.chunk.Seq, ChunkID: rec.chunk.ID, Attempt: rec.attempt, Try: rec.try, SQLState: "55P03",
		Message: fmt.Sprintf("waited for the %s; granted", w.What), LockTimeout: rec.lockTimeout, StatementTimeout: r.cfg.txSettings().StmtSetting(),
		Waited: w.Waited, Blockers: bs, Worker: r.cfg.WorkerID}
	rec.mu.Lock()
	rec.waits = append(rec.waits, rw)
	rec.mu.Unlock()
}

// recordLockWaits records the lock waits kept for a chunk's try
// (recordLockWait) once its transaction has ended, committed or rolled
// back: each in a short transaction of its own
// ([backfilldriver.ManifestWaits]), which survives the chunk's rollback.
func (ex *execution) recordLockWaits(ctx context.Context, rec *lockWaitRecord) {
	mw := ex.r.caps.waits
	if rec == nil || mw == nil {
		return
	}
	rec.mu.Lock()
	waits := rec.waits
	rec.waits = nil
	rec.mu.Unlock()
	fctx := context.WithoutCancel(ctx)
	for _, w := range waits {
		if err := ex.retryConn(fctx, "record wait", func() error { return mw.RecordWait(fctx, ex.r.db, w) }); err != nil {
			ex.log.Warn("backfill: wait not recorded in the manifest", "seq", w.Seq, "chunk", w.ChunkID, "error", err)
		}
	}
}

// chunkLockWaiting returns ctx carrying the lock waits of try t of a
// chunk ([Runner.lockWaiting]).
func (ex *execution) chunkLockWaiting(ctx context.Context, t *chunkTry) context.Context {
	self := ""
	if ex.worker != nil {
		self = ex.worker.key
	}
	rec := &lockWaitRecord{chunk: t.c, attempt: t.cr.attempt, try: ex.waitTry(t.c.Seq) + 1, lockTimeout: t.cr.lockTimeout}
	t.lockWaits = rec
	return pgstore.WithLockWaiting(ctx, ex.r.lockWaiting(ex.log.With("seq", t.c.Seq, "chunk", t.c.ID), ex.batchID, self, rec))
}
