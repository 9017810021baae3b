package backfilltemporal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/pgbackfill/backfill"
)

// JobFunc builds the job of a workflow's input on a worker: the
// [backfill.Job] named in.Job, with its Extractor, from in.Params. It runs
// at the start of every attempt of every slot, so it must build the same
// job (the same plan) each time for the same input; it should be quick
// (open sources lazily, in the Extractor). An error ends the slot with a
// non-retryable error of type [ErrTypeUsage].
type JobFunc func(ctx context.Context, in Input) (backfill.Job, error)

// Activities are the activities of [BackfillWorkflow], run on the
// workers. Register them, with the workflow, on each worker of the task
// queue ([Activities.Register]). The zero value is not usable: DB and Job
// are required.
type Activities struct {
	// DB is the target database, where the manifest is.
	DB *sqlx.DB
	// Config is the Runner's configuration, copied for each activity.
	// Its Hooks, when set, are called as usual (a [backfill.ProgressHooks]
	// too) besides the activity's heartbeats. Its Manifest, when set, must
	// be a *[backfill.PGManifest] (the control activity needs its SQL
	// functions); nil means schema "backfill". WorkerID, when empty, is
	// "<host>:<pid> temporal <workflow ID>/<activity ID>#<attempt>", so the
	// manifest's workers table ("backfill status", waits logged by other
	// workers) names the Temporal attempt. StaleAfter, when zero, is the
	// activity's HeartbeatTimeout (at least three HeartbeatIntervals).
	Config backfill.Config
	// Job builds the job from the workflow's input. Required.
	Job JobFunc
}

// Register registers [BackfillWorkflow] under [WorkflowName] and the
// activities ([Activities.RegisterActivities]) on r (a worker.Worker).
func (a *Activities) Register(r worker.Registry) {
	r.RegisterWorkflowWithOptions(BackfillWorkflow, workflow.RegisterOptions{Name: WorkflowName})
	a.RegisterActivities(r)
}

// RegisterActivities registers the activities only, under [ActivityWork],
// [ActivityControl] and [ActivityStatus], on r: for workers that run
// activities but not the workflow.
func (a *Activities) RegisterActivities(r worker.ActivityRegistry) {
	r.RegisterActivityWithOptions(a.Work, activity.RegisterOptions{Name: ActivityWork})
	r.RegisterActivityWithOptions(a.Control, activity.RegisterOptions{Name: ActivityControl})
	r.RegisterActivityWithOptions(a.Status, activity.RegisterOptions{Name: ActivityStatus})
}

// manifest returns the Config's manifest as a PGManifest.
func (a *Activities) manifest() (*backfill.PGManifest, error) {
	if a.Config.Manifest == nil {
		return backfill.NewPGManifest(""), nil
	}
	m, ok := a.Config.Manifest.(*backfill.PGManifest)
	if !ok {
		return nil, fmt.Errorf("backfill temporal: Config.Manifest is a %T, not a *backfill.PGManifest: %w", a.Config.Manifest, backfill.ErrUnsupported)
	}
	return m, nil
}

// runner returns a Runner of a's Config with hooks h.
func (a *Activities) runner(cfg backfill.Config) (*backfill.Runner, error) {
	if a.DB == nil || a.Job == nil {
		return nil, fmt.Errorf("backfill temporal: Activities needs DB and Job: %w", backfill.ErrInvalidConfig)
	}
	m, err := a.manifest()
	if err != nil {
		return nil, err
	}
	cfg.Manifest = m
	return backfill.New(a.DB, &cfg)
}

// usage returns err as a non-retryable application error of type
// ErrTypeUsage.
func usage(err error) error {
	return temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeUsage, err)
}

// Work is the activity of one slot ([ActivityWork]): it builds the job
// with [Activities.Job] and runs it as one worker of the library
// ([backfill.Work], which waits while the run is paused), heartbeating
// every third of the activity's HeartbeatTimeout with the run's latest
// [Progress] as details (also after each chunk, throttled by the SDK).
// It returns the slot's result for [backfill.ExitDone]; for the other exit
// codes an application error whose message holds the run's state: of
// type [ErrTypeTempFail] (retryable) for [backfill.ExitTempFail], and
// non-retryable ones of types [ErrTypeFailed], [ErrTypeCancelled] and
// [ErrTypeUsage]. When ctx is cancelled (the workflow was cancelled, or
// Temporal timed the attempt out and told it at a heartbeat) the chunks in
// flight roll back and it returns ctx's error.
func (a *Activities) Work(ctx context.Context, in SlotInput) (SlotResult, error) {
	info := activity.GetInfo(ctx)
	res := SlotResult{Slot: in.Slot}
	job, err := a.buildJob(ctx, in.Input)
	if err != nil {
		return res, err
	}
	cfg := a.Config
	if cfg.WorkerID == "" {
		host, _ := os.Hostname()
		cfg.WorkerID = fmt.Sprintf("%s:%d temporal %s/%s#%d", host, os.Getpid(), info.WorkflowExecution.ID, info.ActivityID, info.Attempt)
	}
	if cfg.StaleAfter == 0 && info.HeartbeatTimeout > 0 {
		hi := cfg.HeartbeatInterval
		if hi <= 0 {
			hi = backfill.DefaultHeartbeatInterval
		}
		cfg.StaleAfter = max(info.HeartbeatTimeout, 3*hi)
	}
	hb := &heartbeat{ctx: ctx, user: cfg.Hooks}
	cfg.Hooks = hb
	r, err := a.runner(cfg)
	if err != nil {
		return res, usage(err)
	}
	hb.record()
	stop := hb.tick(info.HeartbeatTimeout / 3)
	code := backfill.Work(ctx, r, job)
	stop()
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	res.ExitCode = code
	// The run as the manifest has it now, for the result or the error.
	if s, err := r.Status(ctx, job); err == nil {
		res.Progress = ProgressOf(s)
	} else {
		res.Progress = hb.last()
	}
	msg := fmt.Sprintf("backfill job %q batch %d: worker exit code %d: run %s, %d/%d chunks done", job.Name, res.Progress.BatchID, code,
		res.Progress.Status, res.Progress.ChunksDone, res.Progress.ChunksTotal)
	if res.Progress.Waiting != "" {
		msg += ": " + res.Progress.Waiting
	}
	switch code {
	case backfill.ExitDone:
		return res, nil
	case backfill.ExitTempFail:
		return res, temporal.NewApplicationError(msg, ErrTypeTempFail, res)
	case backfill.ExitCancelled:
		return res, temporal.NewNonRetryableApplicationError(msg, ErrTypeCancelled, nil, res)
	case backfill.ExitUsage:
		return res, temporal.NewNonRetryableApplicationError(msg+" (bad job, configuration or deployment: see the worker's log)", ErrTypeUsage, nil, res)
	default:
		return res, temporal.NewNonRetryableApplicationError(msg, ErrTypeFailed, nil, res)
	}
}

// buildJob builds in's job and checks its name.
func (a *Activities) buildJob(ctx context.Context, in Input) (backfill.Job, error) {
	if a.Job == nil {
		return backfill.Job{}, usage(fmt.Errorf("backfill temporal: Activities.Job is nil: %w", backfill.ErrInvalidConfig))
	}
	job, err := a.Job(ctx, in)
	if err != nil {
		return job, usage(fmt.Errorf("backfill temporal: build job %q: %w", in.Job, err))
	}
	if job.Name != in.Job {
		return job, usage(fmt.Errorf("backfill temporal: the JobFunc built job %q for input job %q: %w", job.Name, in.Job, backfill.ErrInvalidConfig))
	}
	return job, nil
}

// Control is the activity of the control signals ([ActivityControl]): it
// pauses, resumes or cancels run in.BatchID (the latest run of in.Job when
// 0) through the manifest's SQL functions, recorded in its audit events
// with in.Actor and in.Reason, and returns the run's progress afterwards.
// The database role must be an operator's (see the README's "Three
// roles"); the manifest's refusals (a run that is not running, not paused,
// unknown; a missing privilege) are non-retryable errors of type
// [ErrTypeUsage].
func (a *Activities) Control(ctx context.Context, in ControlInput) (Progress, error) {
	m, err := a.manifest()
	if err != nil {
		return Progress{}, usage(err)
	}
	r, err := a.runner(a.Config)
	if err != nil {
		return Progress{}, usage(err)
	}
	batch := in.BatchID
	if batch == 0 {
		s, err := r.Status(ctx, backfill.Job{Name: in.Job})
		if err != nil {
			return Progress{}, classify(fmt.Errorf("backfill temporal: %s job %q: %w", in.Action, in.Job, err))
		}
		batch = s.BatchID
	}
	switch in.Action {
	case SignalPause:
		err = m.Pause(ctx, a.DB, batch, in.Actor, in.Reason)
	case SignalResume:
		err = m.Resume(ctx, a.DB, batch, in.Actor, in.Reason)
	case SignalCancel:
		err = m.Cancel(ctx, a.DB, batch, in.Actor, in.Reason)
	default:
		err = fmt.Errorf("unknown action %q (pause, resume or cancel): %w", in.Action, backfill.ErrInvalidConfig)
	}
	if err != nil {
		return Progress{}, classify(fmt.Errorf("backfill temporal: %s batch %d: %w", in.Action, batch, err))
	}
	s, err := r.StatusOf(ctx, batch)
	if err != nil {
		return Progress{}, classify(err)
	}
	return ProgressOf(s), nil
}

// Status is the activity that reads the progress of job's latest run
// ([ActivityStatus]). A job that never ran gives a non-retryable error
// wrapping [backfill.ErrRunNotFound]'s message.
func (a *Activities) Status(ctx context.Context, job string) (Progress, error) {
	r, err := a.runner(a.Config)
	if err != nil {
		return Progress{}, usage(err)
	}
	s, err := r.Status(ctx, backfill.Job{Name: job})
	if err != nil {
		return Progress{}, classify(err)
	}
	return ProgressOf(s), nil
}

// classify returns err as is when the library calls it retryable (a
// database away), else as a non-retryable error of type ErrTypeUsage.
func classify(err error) error {
	if backfill.IsRetryable(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return usage(err)
}

// heartbeat is the Hooks of a slot's Runner: it keeps the run's latest
// progress and records it as the activity's heartbeat, after each
// progress reading and every tick; it forwards every call to the user's
// hooks.
type heartbeat struct {
	ctx  context.Context
	user backfill.Hooks

	mu sync.Mutex
	p  Progress
}

func (h *heartbeat) last() Progress {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.p
}

func (h *heartbeat) record() { activity.RecordHeartbeat(h.ctx, h.last()) }

// tick heartbeats every d until stop is called; d <= 0: never.
func (h *heartbeat) tick(d time.Duration) (stop func()) {
	if d <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-h.ctx.Done():
				return
			case <-t.C:
				h.record()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// ChunkDone implements [backfill.Hooks].
func (h *heartbeat) ChunkDone(ctx context.Context, batchID int64, r backfill.ChunkResult) {
	if h.user != nil {
		h.user.ChunkDone(ctx, batchID, r)
	}
}

// ChunkFailed implements [backfill.ProgressHooks].
func (h *heartbeat) ChunkFailed(ctx context.Context, batchID int64, f backfill.ChunkFailure) {
	if p, ok := h.user.(backfill.ProgressHooks); ok {
		p.ChunkFailed(ctx, batchID, f)
	}
}

// Progress implements [backfill.ProgressHooks]: the reading becomes the
// heartbeat's details.
func (h *heartbeat) Progress(ctx context.Context, s backfill.Status) {
	h.mu.Lock()
	h.p = ProgressOf(s)
	h.mu.Unlock()
	h.record()
	if p, ok := h.user.(backfill.ProgressHooks); ok {
		p.Progress(ctx, s)
	}
}
