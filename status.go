package backfill

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
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
	// next (see [backfilltype.Status.Rows]). A failed read of the status is
	// logged and skips the call.
	Progress(ctx context.Context, s Status)
}

// ProgressInterval is the least time between two calls of
// [ProgressHooks.Progress] after chunks, per call of [Runner.Run]: each
// reads the run's status from the manifest ([Runner.StatusOf]).
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

// Progress of a run from the manifest: [Runner.Status], [Runner.StatusOf]
// and the run_progress and chunks_in_flight views,
// readable from any process and from psql.

// Status is a run's progress as the manifest records it, readable from
// any process ([Runner.Status], [Runner.StatusOf]; the run_progress
// view in SQL). Seconds are float64 seconds of the server's clock; rates
// are rows per second. Fields a run cannot give yet (a rate before the
// first checkpoint) are nil.
type Status = backfilltype.Status

// Liveness and fencing of the workers of a run (see the package
// documentation, "Many workers and hosts"). Each call of [Runner.Run]
// registers a worker row, heartbeats it every [Config.HeartbeatInterval]
// and marks it finished on return; all times are the server's. A worker
// that finds nothing to claim while others hold chunks waits, and
// terminates the backend of a holder whose heartbeat is older than
// [Config.StaleAfter]. A fenced-out worker can never commit: its token is
// its lease (lease_key, lease_epoch), checked under the chunk's row lock
// in the transaction that holds its writes, or, for a worker inside that
// transaction, the row lock itself. The design note
// docs/design/short-transactions.md explains the mechanism.

// Liveness values of [backfilltype.RunLiveness.Liveness] for a running run;
// a run that is not running has its status as its liveness.
const (
	// LivenessRunning: a worker of the run heartbeated within its
	// [Config.StaleAfter].
	LivenessRunning = pgstore.LivenessRunning
	// LivenessStalled: no unfinished worker heartbeated within its
	// StaleAfter, but one did within twice it: a worker is frozen or cut
	// off, and waiting workers fence it.
	LivenessStalled = pgstore.LivenessStalled
	// LivenessDead: the run is running in the manifest but no unfinished
	// worker heartbeated within twice its StaleAfter (or none ever
	// registered): nobody works it. Running the job again resumes it.
	LivenessDead = pgstore.LivenessDead
)

// The manifest's side of throttles ([Config.Throttles]): the throttle periods
// of each run and the job-wide concurrency slots.

// TimeSplit returns how the time of run batchID splits into working,
// throttled (by signal), paused and idle, as [Status] and the report
// split it ([backfilltype.TimeSplit]). It needs
// [backfilldriver.ManifestThrottle] and [backfilldriver.ManifestAudit]
// (else an error wrapping [ErrUnsupported]); without
// [backfilldriver.ManifestWorkers] there is no idle time.
func (r *Runner) TimeSplit(ctx context.Context, batchID int64) (backfilltype.TimeSplit, error) {
	ctx = pgstore.WithPurpose(ctx, "read the time split", batchID)
	mt, audit := r.caps.throttlePeriods, r.caps.audit
	if mt == nil || audit == nil {
		return backfilltype.TimeSplit{}, fmt.Errorf("backfill: time split of batch %d: %w: needs ManifestThrottle and ManifestAudit", batchID, ErrUnsupported)
	}
	run, err := mt.Run(ctx, r.db, batchID)
	if err != nil {
		return backfilltype.TimeSplit{}, err
	}
	periods, err := mt.ThrottlePeriods(ctx, r.db, batchID)
	if err != nil {
		return backfilltype.TimeSplit{}, err
	}
	events, err := audit.Events(ctx, r.db, batchID)
	if err != nil {
		return backfilltype.TimeSplit{}, err
	}
	if pm, ok := r.cfg.Manifest.(*pgstore.Manifest); ok {
		var split backfilltype.TimeSplit
		err := pgstore.ReadTx(ctx, r.db, func(tx sqlx.ExtContext) error {
			var err error
			split, _, err = pm.RunTimeSplit(ctx, tx, batchID, events, periods)
			return err
		})
		if err != nil {
			return backfilltype.TimeSplit{}, fmt.Errorf("backfill: time split of batch %d: %w", batchID, err)
		}
		return split, nil
	}
	var workers []backfilltype.Worker
	if wm, ok := r.cfg.Manifest.(backfilldriver.ManifestWorkers); ok {
		if workers, err = wm.Workers(ctx, r.db, batchID); err != nil {
			return backfilltype.TimeSplit{}, err
		}
	}
	var now time.Time
	if err := pgstore.ReadTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		return sqlx.GetContext(ctx, tx, &now, `SELECT now()`)
	}); err != nil {
		return backfilltype.TimeSplit{}, err
	}
	end := now
	if run.FinishedAt != nil {
		end = *run.FinishedAt
	}
	return pgstore.SplitTime(run.CreatedAt, end, pgstore.PausedSpans(events, end), periods, pgstore.WorkerSpans(workers, now)), nil
}
