package backfill

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
)

// Status returns the progress of job's latest run (whatever its status) as
// the manifest records it: the work of every call, process and host that
// worked it ([Status]). It needs a manifest with
// [backfilldriver.ManifestStatus] and [backfilldriver.ManifestAudit]
// ([PGManifest]), else an error wrapping [ErrUnsupported]; a job that never
// ran gives an error wrapping [ErrRunNotFound]. Only job.Name is used.
func (r *Runner) Status(ctx context.Context, job Job) (Status, error) {
	ms, ok := r.cfg.Manifest.(backfilldriver.ManifestStatus)
	if !ok || r.caps.audit == nil {
		return Status{}, fmt.Errorf("backfill: status of job %q: %w: needs ManifestStatus and ManifestAudit", job.Name, ErrUnsupported)
	}
	run, err := r.caps.audit.LatestRun(ctx, r.db, job.Name)
	if err != nil {
		return Status{}, err
	}
	return ms.Status(ctx, r.db, run.BatchID)
}

// StatusOf returns the progress of run batchID ([Runner.Status]).
func (r *Runner) StatusOf(ctx context.Context, batchID int64) (Status, error) {
	ms, ok := r.cfg.Manifest.(backfilldriver.ManifestStatus)
	if !ok {
		return Status{}, fmt.Errorf("backfill: status of batch %d: %w: needs ManifestStatus", batchID, ErrUnsupported)
	}
	return ms.Status(ctx, r.db, batchID)
}

// ProgressHooks extends [Hooks] for progress bars and alerts: failed
// attempts, and snapshots of the run's progress read from the manifest,
// which count the work of earlier calls and of other processes (a bar
// shown after a resume starts where the run stands, not at zero). A
// [Config.Hooks] that implements it gets these calls too (resolved once
// per call of [Runner.Run]); plain Hooks keep working as before.
type ProgressHooks interface {
	Hooks
	// ChunkFailed is called after a failed attempt of a chunk was
	// recorded: f.Final when the chunk is failed for good (the run will
	// fail), otherwise it is retried. From the chunk's goroutine.
	ChunkFailed(ctx context.Context, batchID int64, f ChunkFailure)
	// Progress is called with the run's [Status] when the call starts
	// working the run, after chunks complete or fail (at most once per
	// [ProgressInterval]), and once when the call ends. Calls are never
	// concurrent and come in order, each from a later read of the
	// manifest, so its counters never decrease from one call to the
	// next (see [Status.Rows]). A failed read of the status is logged and
	// skips the call.
	Progress(ctx context.Context, s Status)
}

// ProgressInterval is the least time between two calls of
// [ProgressHooks.Progress] after chunks, per call of [Runner.Run]: each
// reads the manifest ([PGManifest.Status]).
const ProgressInterval = time.Second

// ChunkFailure is a failed attempt of a chunk ([ProgressHooks.ChunkFailed]).
type ChunkFailure struct {
	Chunk Chunk
	// Attempt is the 1-based attempt of this call that failed.
	Attempt int
	// Final is true when the chunk is failed for good; false when it is
	// retried.
	Final bool
	// Err is the attempt's error.
	Err error
	// Worker is the [Config.WorkerID] of the process that tried it.
	Worker string
}

// progressNotifier delivers [ProgressHooks.Progress] for one call of Run.
type progressNotifier struct {
	h    ProgressHooks
	ms   backfilldriver.ManifestStatus
	mu   sync.Mutex
	last time.Time
}

// progressHooks resolves the optional ProgressHooks of the Runner's
// Hooks once per execution (nil when none).
func (ex *execution) progressHooks() *progressNotifier {
	ex.progressOnce.Do(func() {
		h, ok := ex.r.cfg.Hooks.(ProgressHooks)
		if !ok {
			return
		}
		ms, _ := ex.r.cfg.Manifest.(backfilldriver.ManifestStatus)
		ex.progress = &progressNotifier{h: h, ms: ms}
	})
	return ex.progress
}

// notifyProgress calls Progress with a fresh status: always when force,
// otherwise when ProgressInterval passed since the last call and no other
// goroutine is delivering one.
func (ex *execution) notifyProgress(ctx context.Context, force bool) {
	p := ex.progressHooks()
	if p == nil || p.ms == nil {
		return
	}
	if force {
		p.mu.Lock()
	} else if !p.mu.TryLock() {
		return
	}
	defer p.mu.Unlock()
	if !force && time.Since(p.last) < ProgressInterval {
		return
	}
	s, err := p.ms.Status(ctx, ex.r.db, ex.batchID)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			ex.log.Warn("progress: status of the run", "error", err)
		}
		return
	}
	p.last = time.Now()
	p.h.Progress(ctx, s)
}

// notifyFailed calls ChunkFailed, then Progress, for a failed attempt.
func (ex *execution) notifyFailed(ctx context.Context, ce *ChunkError, attempt int, final bool) {
	p := ex.progressHooks()
	if p == nil {
		return
	}
	p.h.ChunkFailed(ctx, ex.batchID, ChunkFailure{Chunk: ce.Chunk, Attempt: attempt, Final: final, Err: ce.Err, Worker: ex.r.cfg.WorkerID})
	ex.notifyProgress(ctx, final)
}
