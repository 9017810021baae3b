package backfill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Running a job under another engine (a job queue such as River, a
// workflow engine, a scheduler): the engine places, retries and shows the
// work, the library keeps each chunk exactly once. [Runner.StartRunTx]
// plans a job and creates its run inside the engine's transaction, so
// that the engine enqueues the run's chunks with it; [Runner.RunChunk]
// runs one chunk of the run on the path [Runner.Run] runs every chunk on
// (lease, extraction outside any transaction, then one transaction from
// the fence to the checkpoint), and lets the engine write in that
// transaction just before its commit.

// PlannedRun is the run [Runner.StartRunTx] created or continued.
type PlannedRun struct {
	// BatchID is the run's batch ID.
	BatchID int64
	// Status is the run's status: RunRunning for a run created or
	// resumed, RunAwaitingApproval for one whose Job.Approval policy
	// awaits approvals (its chunks report ChunkRunPaused until then); a
	// completed, paused or cancelled run is returned as it is.
	Status RunStatus
	// Resumed is true when the run existed before the call.
	Resumed bool
	// Chunks are the run's chunks in Seq order, as the manifest records
	// them in the caller's transaction.
	Chunks []backfilltype.ChunkState
}

// StartRunTx freezes job into a plan and creates its run, or finds the
// run to continue, as [Runner.Run] does, but inside tx, the caller's
// transaction: the run and its chunks exist when tx commits, and not if
// it rolls back, so that an engine can enqueue the run's work in the same
// transaction. It runs no chunk. The checks before the run (the job, the
// target, the privileges) read the database outside tx.
//
// The run's creation holds a transaction lock on the job's name until tx
// ends: keep tx short. A Runner on a [DB] other than PostgreSQL's cannot
// start a run in a caller's transaction.
func (r *Runner) StartRunTx(ctx context.Context, tx *sql.Tx, job Job) (PlannedRun, error) {
	if _, ok := r.db.(pgstore.PGDB); !ok {
		return PlannedRun{}, fmt.Errorf("backfill: job %q: %w: StartRunTx needs a Runner on PostgreSQL (backfill.New)", job.Name, ErrUnsupported)
	}
	job, err := engineJob(job)
	if err != nil {
		return PlannedRun{}, err
	}
	rs, err := r.planRun(ctx, job)
	if err != nil {
		return PlannedRun{}, err
	}
	etx := pgstore.ExtTx(tx)
	run, resumed, err := r.cfg.Manifest.StartRun(withFenceWait(ctx, r.fenceWait("start run of job "+job.Name)), etx, rs.plan, r.cfg.WorkerID, job.NewRun)
	if err != nil {
		return PlannedRun{}, err
	}
	chunks, err := r.cfg.Manifest.Chunks(ctx, etx, run.BatchID)
	if err != nil {
		return PlannedRun{}, fmt.Errorf("backfill: job %q batch %d: chunks: %w", job.Name, run.BatchID, err)
	}
	return PlannedRun{BatchID: run.BatchID, Status: run.Status, Resumed: resumed, Chunks: chunks}, nil
}

// engineJob refuses the jobs whose chunks [Runner.RunChunk] cannot run
// one at a time: a publish mode other than per chunk publishes at the
// end of a run, which no single chunk's call runs, and SkipUnchanged
// commits a skipped chunk on a path without [ChunkCall.BeforeCommit].
func engineJob(job Job) (Job, error) {
	if job.Publish.Mode != PublishPerChunk {
		return job, fmt.Errorf("backfill: job %q: %w: a chunk run alone (RunChunk) publishes per chunk only, not with publish mode %q", job.Name, ErrUnsupported, job.Publish.Mode)
	}
	if job.SkipUnchanged {
		return job, fmt.Errorf("backfill: job %q: %w: a chunk run alone (RunChunk) does not skip unchanged chunks yet: unset Job.SkipUnchanged", job.Name, ErrUnsupported)
	}
	// Not the skipping a job with a ChunkColumn gets by default either:
	// every chunk is merged, in the transaction that calls BeforeCommit.
	job.MergeEveryChunk = true
	return job, nil
}

// ChunkCall names the chunk [Runner.RunChunk] runs and what the caller
// does in its transaction.
type ChunkCall struct {
	// BatchID is the run's batch ID ([PlannedRun.BatchID]).
	BatchID int64
	// Seq is the chunk's Seq in the run's plan.
	Seq int
	// Final says that a failure of this attempt is the chunk's last: the
	// caller's engine will not try it again. The failure is then
	// recorded as final and the run fails, as when [Runner.Run] runs out
	// of [Config.MaxAttempts].
	Final bool
	// BeforeCommit, if not nil, is called inside the chunk's transaction
	// after its merge and checkpoint, just before its commit, with that
	// transaction and the chunk's result as checkpointed: what it writes
	// there commits, or rolls back, with the chunk. An error rolls the
	// chunk back: a failed attempt, which is final only when call.Final
	// is set or the error wraps [ErrNotRetryable] (the engine's failure
	// says nothing of the chunk's data). It is called only when this
	// call loads the chunk.
	BeforeCommit func(ctx context.Context, tx *sql.Tx, res ChunkResult) error
}

// ChunkOutcome is what [Runner.RunChunk] did with its chunk.
type ChunkOutcome string

const (
	// ChunkLoaded: this call loaded the chunk and committed it, with
	// ChunkCall.BeforeCommit.
	ChunkLoaded ChunkOutcome = "loaded"
	// ChunkAlreadyDone: the chunk was done (or open: loaded, to be read
	// again by the next run) before this call, by another worker or an
	// earlier attempt; nothing was loaded and BeforeCommit was not
	// called.
	ChunkAlreadyDone ChunkOutcome = "already_done"
	// ChunkBusy: another worker holds the chunk's live lease, or took it
	// over while this call extracted it, or the chunk's transaction
	// waited for a lock past its timeout (a deadlock, a statement
	// timeout): its transaction rolled back and no attempt is recorded
	// (a wait is, with the sessions that blocked it, as under Run);
	// try again later. The transactions of stale workers that held it
	// were ended.
	ChunkBusy ChunkOutcome = "busy"
	// ChunkRunPaused: the run is paused (an operator, a quality gate, a
	// throttle's critical level) or awaits the approvals of its plan
	// (Job.Approval); nothing was loaded. Try again after it is resumed
	// or approved.
	ChunkRunPaused ChunkOutcome = "run_paused"
	// ChunkRunEnded: the run is cancelled, failed, abandoned or rolled
	// back; nothing was loaded, and no later call of this run loads the
	// chunk.
	ChunkRunEnded ChunkOutcome = "run_ended"
	// ChunkAttemptFailed: the chunk's attempt failed and rolled back; RunChunk
	// returns its error. [ChunkRunReport.Final] says whether the failure
	// was recorded as the chunk's last (the run failed).
	ChunkAttemptFailed ChunkOutcome = "attempt_failed"
)

// ChunkRunReport is the outcome of [Runner.RunChunk].
type ChunkRunReport struct {
	Outcome ChunkOutcome
	// Result is the chunk's result when Outcome is ChunkLoaded.
	Result ChunkResult
	// RunStatus is the run's status as the call last read it.
	RunStatus RunStatus
	// Final: a failure recorded as the chunk's last (Outcome ChunkAttemptFailed).
	Final bool
	// Reason says why the run is paused or ended, when the manifest
	// says.
	Reason string
}

// RunChunk runs chunk call.Seq of run call.BatchID in this process, on
// the path [Runner.Run] runs every chunk on: it leases the chunk under a
// worker key of its own (registered and heartbeating for the call), lets
// job's Extractor read it outside any transaction, then stages, merges,
// validates and checkpoints it in one transaction, in which it calls
// call.BeforeCommit just before the commit. The lease's epoch fences that
// transaction: a worker whose lease was taken over (it was stale: see
// [Config.StaleAfter]) rolls back, so a chunk is merged once whatever
// the engine runs twice.
//
// job must be the job the run was planned from ([Runner.StartRunTx]):
// a plan whose fingerprint differs from the run's is refused with an
// error wrapping [ErrPlanChanged]. The report's Outcome says what
// happened. The error is not nil for ChunkAttemptFailed, and for a failure
// before the chunk's try (planning the job, reading the run), which comes
// with an empty Outcome. A failed attempt is recorded in the manifest (its
// last error, its attempts); it is final when call.Final is set or the
// error is not retryable ([IsRetryable]), and then the run fails, as under
// Run. A failure before the lease, a connection fault and ctx done are not
// recorded (ChunkAttemptFailed, not Final): the caller tries again.
//
// Each call plans the job (reading the target's catalog and checking the
// privileges, as Run does), so it suits chunks that take seconds or more.
// Every chunk is merged (as with [Job.MergeEveryChunk]), even one whose
// rows are unchanged since the last load, so that BeforeCommit runs in
// each chunk's transaction; a job that sets [Job.SkipUnchanged] is
// refused with [ErrUnsupported].
func (r *Runner) RunChunk(ctx context.Context, job Job, call ChunkCall) (ChunkRunReport, error) {
	job, err := engineJob(job)
	if err != nil {
		return ChunkRunReport{}, err
	}
	rs, err := r.planRun(ctx, job)
	if err != nil {
		return ChunkRunReport{}, err
	}
	run, err := r.runOf(ctx, call.BatchID)
	if err != nil {
		return ChunkRunReport{}, err
	}
	if run.Job != job.Name || run.Fingerprint != rs.plan.Fingerprint {
		return ChunkRunReport{}, fmt.Errorf("backfill: job %q: %w: batch %d is job %q's run of plan %.12s, and the job's plan is %.12s",
			job.Name, ErrPlanChanged, run.BatchID, run.Job, run.Fingerprint, rs.plan.Fingerprint)
	}
	var target *Chunk
	seqs := make([]int, 0, rs.plan.Len())
	for c, err := range rs.plan.AllChunks(ctx) {
		if err != nil {
			return ChunkRunReport{}, fmt.Errorf("backfill: job %q: chunks: %w", job.Name, err)
		}
		if c.Seq == call.Seq {
			target = &c
		} else {
			seqs = append(seqs, c.Seq)
		}
	}
	if target == nil {
		return ChunkRunReport{}, fmt.Errorf("backfill: job %q batch %d: %w: no chunk %d in the plan", job.Name, run.BatchID, ErrInvalidConfig, call.Seq)
	}
	return r.runPlannedChunk(ctx, rs, run, seqs, call, true)
}

// runPlannedChunk is RunChunk once the job is planned (rs) and its run
// read (run, the plan's): it runs chunk call.Seq, leasing none of the
// chunks others (the plan's other chunks). With end, a chunk that was
// the run's last records the run's end (RunChunk); without, the caller
// ends the run (the graph's scheduler: Runner.endRun, after the gates
// Run judges a run by at its end).
func (r *Runner) runPlannedChunk(ctx context.Context, rs runSetup, run Run, others []int, call ChunkCall, end bool) (ChunkRunReport, error) {
	job := rs.job
	if run.Status != RunRunning {
		return r.chunkLeft(ctx, run, call.Seq)
	}
	ctx = pgstore.WithPurpose(ctx, "", run.BatchID)
	log := r.cfg.Logger.With("job", job.Name, "batch_id", run.BatchID, "seq", call.Seq)
	ex, err := r.startExecution(ctx, rs, run, log)
	if err != nil {
		return ChunkRunReport{}, err
	}
	// Only the chunk called for is leased: the lease avoids every other
	// chunk of the plan, as it avoids those of a call's retry backoffs.
	forever := time.Now().Add(100 * 365 * 24 * time.Hour)
	for _, seq := range others {
		ex.waits.avoid(seq, forever)
	}
	ex.startWorker(ctx)
	defer ex.stopWorker()

	cr, err := ex.runChunk(withBeforeCommit(ctx, call.BeforeCommit), nil)
	switch {
	case err == nil && cr.outcome == tryDone:
		return ex.engineDone(ctx, cr, end)
	case err == nil && cr.outcome == tryFenced:
		return ChunkRunReport{Outcome: ChunkBusy, RunStatus: RunRunning}, nil
	case err == nil:
		// Nothing leased: done, held by another worker, or the run
		// paused or ended meanwhile.
		rep, err := r.chunkLeft(ctx, run, call.Seq)
		if rep.Outcome == ChunkBusy {
			ex.fenceStale(ctx)
		}
		return rep, err
	}
	return ex.engineFailed(ctx, cr, call, err)
}

// fenceStale ends the chunk transactions of the run's stale workers (a
// frozen process whose lease was taken over still holds its chunk's row
// until then), as a Run's worker does when it finds nothing to lease
// ([execution.waitHeld]). A role that may not end them is logged.
func (ex *execution) fenceStale(ctx context.Context) {
	if ex.worker == nil {
		return
	}
	hs, err := ex.r.caps.workers.Holders(ctx, ex.r.db, ex.batchID, ex.worker.key, ex.r.cfg.StaleAfter, true, true)
	if err != nil {
		ex.log.Warn("backfill: fencing stale workers failed (ending another worker's backend needs pg_signal_backend, or the same role)", "error", err)
		return
	}
	for _, h := range hs {
		pgstore.LogHolder(ex.log, "chunk held by another worker", ex.batchID, h, 0)
	}
}

// engineDone records chunk try cr, committed, as [execution.chunkDone]
// does (the hooks, the run reject gate), and, with end, completes the
// run when it was its last chunk.
func (ex *execution) engineDone(ctx context.Context, cr chunkRun, end bool) (ChunkRunReport, error) {
	rep := ChunkRunReport{Outcome: ChunkLoaded, Result: cr.res, RunStatus: RunRunning}
	if !ex.chunkDone(ctx, cr.res, cr.fresh, nil) {
		// The chunk is done; the run reject gate paused the run after it,
		// or could not be checked (the next chunk's call checks again).
		ex.mu.Lock()
		gate := ex.runGate
		ex.mu.Unlock()
		if gate != nil {
			rep.RunStatus, rep.Reason = RunPaused, gate.Error()
		}
		return rep, nil
	}
	if !end {
		return rep, nil
	}
	fctx := context.WithoutCancel(ctx)
	err := ex.retryConn(fctx, "finish run", func() error {
		run, err := ex.r.cfg.Manifest.FinishRun(fctx, ex.r.db, ex.batchID, false, "")
		if err == nil {
			rep.RunStatus = run.Status
		}
		return err
	})
	if err != nil {
		// The chunk is done; the run's end is recorded by the next call,
		// or by Run.
		ex.log.Warn("backfill: the run's end could not be recorded after its chunk", "error", err)
	}
	return rep, nil
}

// engineFailed handles err, the error of RunChunk's try cr: a run
// cancelled or paused meanwhile, a quality gate that failed (the run
// pauses), a connection fault (not recorded), or a failed attempt,
// recorded, final as call says or when err is not retryable.
func (ex *execution) engineFailed(ctx context.Context, cr chunkRun, call ChunkCall, err error) (ChunkRunReport, error) {
	fctx := context.WithoutCancel(ctx)
	if ex.ctl != nil && !ex.cancelled() {
		// The checkpoint refuses a chunk of a run cancelled meanwhile.
		ex.pollControl(fctx)
	}
	if ex.cancelled() {
		return ChunkRunReport{Outcome: ChunkRunEnded, RunStatus: RunCancelled}, nil
	}
	if err = pgstore.SchemaMissing(ex.r.schemaName(), err); errors.Is(err, backfilltype.ErrSchemaMissing) {
		return ChunkRunReport{}, err
	}
	var ce *ChunkError
	if !errors.As(err, &ce) || ctx.Err() != nil || backfilltype.IsConnectionError(err) {
		// Before the lease, the caller's context done (the chunk rolled
		// back and stays pending), or a connection fault: no attempt is
		// recorded; the caller tries again.
		return ChunkRunReport{Outcome: ChunkAttemptFailed}, err
	}
	if code, msg, ok := pgstore.WaitCode(ctx, err); ok {
		// A wait (a lock held by another transaction, a deadlock, a
		// statement timeout) rolled the chunk back: not an attempt, as
		// under Run; it is logged and recorded with its blockers as
		// under Run (the caller's next call is its next try), the
		// stale holders are fenced and the caller tries again later.
		ex.noteWait(ctx, ce, cr, code, msg, 1, 0, false)
		ex.fenceStale(fctx)
		return ChunkRunReport{Outcome: ChunkBusy, RunStatus: RunRunning, Reason: err.Error()}, nil
	}
	var ge *gateError
	if errors.As(err, &ge) {
		// The chunk rolled back; its evidence is kept and the run paused,
		// as under Run.
		ex.log.Warn("quality gate failed; run paused", "chunk", ce.Chunk.ID, "attempt", ce.Attempt, "reason", ge.reason)
		if rerr := ex.recordGate(ctx, ce, ge, ge.reason); rerr != nil {
			return ChunkRunReport{Outcome: ChunkAttemptFailed}, errors.Join(err, rerr)
		}
		return ChunkRunReport{Outcome: ChunkRunPaused, RunStatus: RunPaused, Reason: ge.reason}, nil
	}
	var bce *beforeCommitError
	final := call.Final || !IsRetryable(err) && !errors.As(err, &bce) || errors.Is(err, backfilltype.ErrNotRetryable)
	ex.traceRetry(ctx, backfilltrace.RetryData{Chunk: ce.Chunk, Attempt: cr.attempt, Kind: backfilltrace.RetryAttempt, Final: final, Err: err})
	ex.log.Warn("chunk failed", "chunk", ce.Chunk.ID, "attempt", cr.attempt, "final", final, "error", err)
	if ferr := ex.retryConn(fctx, "record failed attempt", func() error {
		return ex.r.cfg.Manifest.FailChunk(fctx, ex.r.db, ex.batchID, ce.Chunk.Seq, ce.Err.Error(), final)
	}); ferr != nil {
		return ChunkRunReport{Outcome: ChunkAttemptFailed}, errors.Join(err, ferr)
	}
	ex.notifyFailed(ctx, ce, cr.attempt, final)
	rep := ChunkRunReport{Outcome: ChunkAttemptFailed, Final: final, RunStatus: RunRunning}
	if final {
		if ferr := ex.retryConn(fctx, "finish run", func() error {
			run, err := ex.r.cfg.Manifest.FinishRun(fctx, ex.r.db, ex.batchID, true, ce.Error())
			if err == nil {
				rep.RunStatus = run.Status
			}
			return err
		}); ferr != nil {
			return rep, errors.Join(err, ferr)
		}
	}
	return rep, err
}

// chunkLeft says why chunk seq of run, not leased, is left to nobody:
// done, held by another worker, the run paused or ended.
func (r *Runner) chunkLeft(ctx context.Context, run Run, seq int) (ChunkRunReport, error) {
	if run.Status == RunRunning {
		// Read again: paused or ended since.
		var err error
		if run, err = r.runOf(ctx, run.BatchID); err != nil {
			return ChunkRunReport{}, err
		}
	}
	chunks, err := r.cfg.Manifest.Chunks(ctx, r.db, run.BatchID)
	if err != nil {
		return ChunkRunReport{}, fmt.Errorf("backfill: batch %d: chunks: %w", run.BatchID, err)
	}
	rep := ChunkRunReport{RunStatus: run.Status, Reason: run.LastError}
	for _, c := range chunks {
		if c.Chunk.Seq != seq {
			continue
		}
		if c.Status == ChunkDone || c.Status == ChunkOpen && run.Status != RunRunning {
			rep.Outcome = ChunkAlreadyDone
			return rep, nil
		}
	}
	switch run.Status {
	case RunRunning:
		rep.Outcome = ChunkBusy
	case RunAwaitingApproval:
		// Not started yet: loadable once its approvals are recorded.
		rep.Outcome = ChunkRunPaused
		rep.Reason = "the run awaits approval of its plan (Runner.Approve, backfill approve)"
	case RunPaused:
		rep.Outcome = ChunkRunPaused
		if cm := r.caps.control; cm != nil {
			if st, err := cm.Control(ctx, r.db, run.BatchID); err == nil && st.Reason != "" {
				rep.Reason = st.Reason
			}
		}
	default:
		rep.Outcome = ChunkRunEnded
	}
	return rep, nil
}

// runOf reads run batchID from the manifest.
func (r *Runner) runOf(ctx context.Context, batchID int64) (Run, error) {
	m, ok := r.cfg.Manifest.(interface {
		Run(ctx context.Context, db sqlx.ExtContext, batchID int64) (Run, error)
	})
	if !ok {
		return Run{}, fmt.Errorf("backfill: batch %d: %w: the manifest (%T) cannot read a run by its batch ID", batchID, ErrUnsupported, r.cfg.Manifest)
	}
	run, err := m.Run(ctx, r.db, batchID)
	if err != nil {
		return Run{}, fmt.Errorf("backfill: batch %d: %w", batchID, err)
	}
	return run, nil
}

// beforeCommitKey carries [ChunkCall.BeforeCommit] in the context of
// the chunk RunChunk runs.
type beforeCommitKey struct{}

func withBeforeCommit(ctx context.Context, f func(context.Context, *sql.Tx, ChunkResult) error) context.Context {
	if f == nil {
		return ctx
	}
	return context.WithValue(ctx, beforeCommitKey{}, f)
}

// beforeCommit calls the BeforeCommit of the chunk RunChunk runs, if
// any, in tx, the chunk's transaction, just before its commit, with the
// chunk's result res.
func beforeCommit(ctx context.Context, tx backfilldriver.Tx, res ChunkResult) error {
	f, _ := ctx.Value(beforeCommitKey{}).(func(context.Context, *sql.Tx, ChunkResult) error)
	if f == nil {
		return nil
	}
	stx, err := pgstore.SQLTx(ctx, tx)
	if err != nil {
		return err
	}
	if err := f(ctx, stx, res); err != nil {
		return &beforeCommitError{err: err}
	}
	return nil
}

// beforeCommitError is the error of a [ChunkCall.BeforeCommit]: the
// engine's, retried by the engine unless it wraps ErrNotRetryable.
type beforeCommitError struct{ err error }

func (e *beforeCommitError) Error() string { return "before commit: " + e.err.Error() }
func (e *beforeCommitError) Unwrap() error { return e.err }
