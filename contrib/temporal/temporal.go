// Package backfilltemporal runs backfill jobs as Temporal workflows.
//
// A run of a job is one workflow, [BackfillWorkflow]: it starts
// [Input.Workers] activities ("worker slots") at once, each of which runs
// the job as one worker of the library ([backfill.Work]) until the run is
// completed, failed or cancelled. The library still decides which chunk
// each slot loads (leases with a key and epoch fence in the manifest), so
// Temporal decides where and when workers run, and the manifest decides
// what they write:
//
//   - a worker that dies (its process killed, its host lost) stops
//     heartbeating to Temporal, which times its activity out after the
//     activity's HeartbeatTimeout and retries it on another worker; the
//     chunks the dead worker held become claimable once its heartbeat in
//     the manifest is older than [backfill.Config.StaleAfter], which the
//     activity sets to the HeartbeatTimeout when the Config leaves it zero;
//   - a zombie attempt (timed out by Temporal but still running) cannot
//     merge a chunk another attempt took over: its transaction's fence
//     finds its lease gone and rolls back; while its heartbeats in the
//     manifest go on it keeps its chunks and nobody else loads them;
//   - a chunk's failed attempts are retried inside the activity by the
//     library ([backfill.Config.MaxAttempts]); Temporal's retry policy
//     restarts a slot only when the worker could not finish (exit code
//     [backfill.ExitTempFail]: context cancelled, database away, chunks
//     still open) or died. A failed, cancelled or misconfigured run ends
//     its activities with a non-retryable error (types [ErrTypeFailed],
//     [ErrTypeCancelled], [ErrTypeUsage]).
//
// Signals [SignalPause], [SignalResume] and [SignalCancel] (payload
// [ControlRequest]) steer the run through the manifest's control functions,
// recorded in its audit events with the actor and reason given; the query
// [QueryStatus] returns a [WorkflowStatus].
//
// The workflow code touches no database; every read and write is an
// activity of [Activities], which the user registers on the workers with
// a [JobFunc] that builds the [backfill.Job] from the workflow's input
// (an Extractor is code, not data, so it cannot travel in the input).
package backfilltemporal

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/pgbackfill/backfill"
)

// Names under which [Activities.Register] registers the workflow and the
// activities, and the names of the signals and the query of
// [BackfillWorkflow]. Start the workflow by [WorkflowName] from any SDK;
// send the signals with a [ControlRequest] as payload (JSON
// {"Actor": "...", "Reason": "..."}).
const (
	// WorkflowName is the registered name of [BackfillWorkflow].
	WorkflowName = "backfill.Workflow"
	// ActivityWork is the activity of one worker slot ([Activities.Work]).
	ActivityWork = "backfill.Work"
	// ActivityControl pauses, resumes or cancels a run ([Activities.Control]).
	ActivityControl = "backfill.Control"
	// ActivityStatus reads a run's progress ([Activities.Status]).
	ActivityStatus = "backfill.Status"

	// SignalPause pauses the run: no worker claims another chunk, the
	// chunks in flight finish; the slots stay running, waiting.
	SignalPause = "pause"
	// SignalResume resumes a paused (or cancelled) run.
	SignalResume = "resume"
	// SignalCancel cancels the run: chunks in flight roll back, the slots
	// end with an error of type [ErrTypeCancelled], and so does the
	// workflow.
	SignalCancel = "cancel"
	// QueryStatus returns the workflow's [WorkflowStatus].
	QueryStatus = "status"
)

// Types of the non-retryable application errors that end a slot, and then
// the workflow, for the library's exit codes ([backfill.ExitCode]), and of
// the retryable one.
const (
	// ErrTypeFailed: the run failed ([backfill.ExitFailed]): a chunk's
	// attempts are exhausted or its error is not retryable; the manifest's
	// last_error says why. Starting the workflow again resumes the run
	// and retries the failed chunks, which helps once the cause is fixed.
	ErrTypeFailed = "BackfillFailed"
	// ErrTypeCancelled: an operator cancelled the run
	// ([backfill.ExitCancelled]).
	ErrTypeCancelled = "BackfillCancelled"
	// ErrTypeUsage: the job, the configuration or the deployment is wrong
	// ([backfill.ExitUsage]): a missing privilege, the manifest behind, a
	// bad job.
	ErrTypeUsage = "BackfillUsage"
	// ErrTypeTempFail: the worker ended before the run did
	// ([backfill.ExitTempFail]); retryable: Temporal's retry policy starts
	// the slot again, which resumes the run.
	ErrTypeTempFail = "BackfillTempFail"
)

// Defaults of [Input].
const (
	// DefaultHeartbeatTimeout is the slots' activity HeartbeatTimeout.
	DefaultHeartbeatTimeout = 30 * time.Second
	// DefaultStartToCloseTimeout bounds one attempt of a slot: the time a
	// worker may take for its share of the run.
	DefaultStartToCloseTimeout = 7 * 24 * time.Hour
	// DefaultStatusEvery is how often the workflow reads the run's
	// progress for [QueryStatus] while the slots run.
	DefaultStatusEvery = 5 * time.Minute
)

// Input is the input of [BackfillWorkflow]. It is data (JSON through
// Temporal's default converter); the job's code is built on the workers by
// the [JobFunc] given to [Activities].
type Input struct {
	// Job is the job's name; the [JobFunc] must build a [backfill.Job] of
	// this name (checked). Required.
	Job string
	// Params are the job's parameters for the [JobFunc] (a scope, a
	// source), any JSON; nil when it needs none. They are part of what
	// the JobFunc builds, so changing them may change the plan: the
	// library then refuses the run with [backfill.ErrPlanChanged] unless
	// the job sets NewRun.
	Params json.RawMessage `json:",omitempty"`
	// Workers is how many slots (activities, each one worker of the
	// library with its Config.Concurrency) run the job at once. Default 1.
	Workers int `json:",omitempty"`
	// TaskQueue is the task queue of the activities; empty: the
	// workflow's.
	TaskQueue string `json:",omitempty"`
	// HeartbeatTimeout is the slots' activity HeartbeatTimeout: a slot
	// that does not heartbeat for this long (its worker died, froze or
	// lost Temporal) is timed out and retried. The activity heartbeats
	// every third of it, and uses it as the library's StaleAfter when the
	// Config does not set one. Default [DefaultHeartbeatTimeout].
	HeartbeatTimeout time.Duration `json:",omitempty"`
	// StartToCloseTimeout bounds one attempt of a slot. Default
	// [DefaultStartToCloseTimeout].
	StartToCloseTimeout time.Duration `json:",omitempty"`
	// Retry is the slots' retry policy. Nil: retry without limit, from
	// 1 s doubling up to 1 min; the error types [ErrTypeFailed],
	// [ErrTypeCancelled] and [ErrTypeUsage] are never retried, whatever
	// the policy says.
	Retry *temporal.RetryPolicy `json:",omitempty"`
	// StatusEvery is how often the workflow reads the run's progress
	// (an activity, [ActivityStatus]) while the slots run, for
	// [QueryStatus]; it also reads it after each control signal and each
	// slot's end. Each read adds a few events to the workflow's history.
	// Default [DefaultStatusEvery]; negative: only on those events.
	StatusEvery time.Duration `json:",omitempty"`
}

// SlotInput is the input of the [ActivityWork] activity.
type SlotInput struct {
	// Input is the workflow's input.
	Input Input
	// Slot is the slot's number, from 0 to Input.Workers-1.
	Slot int
}

// ControlRequest is the payload of the signals [SignalPause],
// [SignalResume] and [SignalCancel]: who asks and why, recorded in the
// manifest's audit events (at most 200 and 2000 characters). Empty, Actor
// is "temporal" and Reason names the signal and the workflow.
type ControlRequest struct {
	Actor  string `json:",omitempty"`
	Reason string `json:",omitempty"`
}

// ControlInput is the input of the [ActivityControl] activity.
type ControlInput struct {
	// Job is the job's name; the action applies to its latest run when
	// BatchID is 0.
	Job string
	// BatchID is the run's batch ID; 0: the latest run of Job.
	BatchID int64 `json:",omitempty"`
	// Action is SignalPause, SignalResume or SignalCancel.
	Action string
	// Actor and Reason are recorded in the manifest's audit event
	// (required: at most 200 and 2000 characters).
	Actor  string
	Reason string
}

// ControlRecord is one control signal the workflow handled, in
// [WorkflowStatus].
type ControlRecord struct {
	Action string
	Actor  string
	Reason string
	// At is the workflow's time the signal was handled.
	At time.Time
	// Error is why the manifest refused it (the run was not running, the
	// role is no operator, ...); empty when it was applied.
	Error string `json:",omitempty"`
}

// Progress is a compact view of a run's [backfill.Status], small enough
// for heartbeat details and the workflow's history. The full status is
// [backfill.Runner.StatusOf] or "backfill status".
type Progress struct {
	BatchID int64
	Job     string
	// Status is the run's status (running, paused, completed, failed,
	// cancelled).
	Status backfill.RunStatus
	// Liveness is the run's liveness (running, stalled, dead) while it
	// runs, else its status; LiveWorkers counts workers heartbeating in
	// the manifest (every slot of every workflow and any other process).
	Liveness    string
	LiveWorkers int
	// ChunksTotal counts the plan's chunks, ChunksDone the completed ones,
	// ChunksFailed the failed ones, ChunksInFlight those leased now.
	ChunksTotal, ChunksDone, ChunksFailed, ChunksInFlight int
	// Rows sums the checkpointed chunks' counts.
	Rows backfill.Counts
	// ETASeconds is the estimated time left, nil when unknown.
	ETASeconds *float64 `json:",omitempty"`
	// Waiting says what a run that is not working waits for (paused by
	// whom, failed with what error, ...).
	Waiting string `json:",omitempty"`
	// AsOf is the server's time of the reading.
	AsOf time.Time
}

// ProgressOf condenses s.
func ProgressOf(s backfill.Status) Progress {
	return Progress{
		BatchID: s.BatchID, Job: s.Job, Status: s.Status, Liveness: s.Liveness, LiveWorkers: s.LiveWorkers,
		ChunksTotal: s.Chunks.Total, ChunksDone: s.Chunks.Done, ChunksFailed: s.Chunks.Failed, ChunksInFlight: len(s.InFlight),
		Rows: s.Rows, ETASeconds: s.ETASeconds, Waiting: s.Waiting, AsOf: s.AsOf,
	}
}

// SlotResult is the result of the [ActivityWork] activity: the worker's
// exit code ([backfill.ExitDone] for a slot that returns) and the run's
// progress when it ended.
type SlotResult struct {
	Slot     int
	ExitCode backfill.ExitCode
	Progress Progress
}

// SlotState is one slot in [WorkflowStatus].
type SlotState struct {
	Slot int
	// State is "running", "done" or "failed".
	State string
	// Error is the slot's final error, when failed.
	Error string `json:",omitempty"`
}

// WorkflowStatus is what [QueryStatus] returns: the run's latest progress
// the workflow read (nil before the first reading), its slots and the
// control signals it handled. It does not read the database: the
// progress is as of Progress.AsOf.
type WorkflowStatus struct {
	Job      string
	Progress *Progress `json:",omitempty"`
	Slots    []SlotState
	Controls []ControlRecord `json:",omitempty"`
}

// Result is the result of [BackfillWorkflow] once every slot ended: the
// run's progress read last and each slot's result.
type Result struct {
	Progress Progress
	Slots    []SlotResult
}

// nonRetryable are the error types of a slot that a retry cannot help.
var nonRetryable = []string{ErrTypeFailed, ErrTypeCancelled, ErrTypeUsage}

// slotOptions returns the slots' activity options of in.
func slotOptions(in Input) workflow.ActivityOptions {
	hb := in.HeartbeatTimeout
	if hb <= 0 {
		hb = DefaultHeartbeatTimeout
	}
	stc := in.StartToCloseTimeout
	if stc <= 0 {
		stc = DefaultStartToCloseTimeout
	}
	rp := &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: time.Minute}
	if in.Retry != nil {
		c := *in.Retry
		rp = &c
	}
	rp.NonRetryableErrorTypes = append(append([]string(nil), rp.NonRetryableErrorTypes...), nonRetryable...)
	return workflow.ActivityOptions{
		TaskQueue:           in.TaskQueue,
		StartToCloseTimeout: stc,
		HeartbeatTimeout:    hb,
		RetryPolicy:         rp,
		// A cancelled workflow waits for its slots to roll their chunks
		// back before it closes.
		WaitForCancellation: true,
	}
}

// shortOptions returns the options of the short activities (control,
// status) of in.
func shortOptions(in Input) workflow.ActivityOptions {
	return workflow.ActivityOptions{
		TaskQueue:           in.TaskQueue,
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2,
			MaximumInterval: 30 * time.Second, MaximumAttempts: 5},
	}
}

// BackfillWorkflow drives one run of the job in.Job: it starts in.Workers
// slots ([ActivityWork]) and returns once every slot ended, with the run's
// progress. Its error is a slot's when the run did not complete: an
// application error of type [ErrTypeFailed], [ErrTypeCancelled] or
// [ErrTypeUsage] (inspect it with errors.As and
// [temporal.ApplicationError]), or the slot's last retryable error once
// the retry policy gave up. Cancelling the workflow cancels the slots:
// their chunks in flight roll back, the run stays as it was (running,
// its liveness dead) and starting the workflow again resumes it; cancel
// the run itself with [SignalCancel].
//
// Signals [SignalPause], [SignalResume] and [SignalCancel] steer the run
// (each an [ActivityControl] activity); the query [QueryStatus] returns
// a [WorkflowStatus]. The workflow is deterministic: it only schedules
// activities and timers.
func BackfillWorkflow(ctx workflow.Context, in Input) (Result, error) {
	if in.Job == "" {
		return Result{}, temporal.NewNonRetryableApplicationError("backfill workflow: the input names no job", ErrTypeUsage, nil)
	}
	if in.Workers <= 0 {
		in.Workers = 1
	}
	st := &WorkflowStatus{Job: in.Job, Slots: make([]SlotState, in.Workers)}
	for i := range st.Slots {
		st.Slots[i] = SlotState{Slot: i, State: "running"}
	}
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (WorkflowStatus, error) {
		return *st, nil
	}); err != nil {
		return Result{}, err
	}
	// readStatus refreshes st.Progress; a failed read keeps the last one.
	readStatus := func(ctx workflow.Context) {
		ctx = workflow.WithActivityOptions(ctx, shortOptions(in))
		var p Progress
		if err := workflow.ExecuteActivity(ctx, ActivityStatus, in.Job).Get(ctx, &p); err == nil {
			st.Progress = &p
		}
	}

	// Control signals, one at a time, in the order received, in a
	// coroutine of their own.
	info := workflow.GetInfo(ctx)
	workflow.Go(ctx, func(ctx workflow.Context) {
		actx := workflow.WithActivityOptions(ctx, shortOptions(in))
		control := func(action string) func(workflow.ReceiveChannel, bool) {
			return func(c workflow.ReceiveChannel, _ bool) {
				var req ControlRequest
				c.Receive(ctx, &req)
				if req.Actor == "" {
					req.Actor = "temporal"
				}
				if req.Reason == "" {
					req.Reason = fmt.Sprintf("signal %s to workflow %s (no reason given)", action, info.WorkflowExecution.ID)
				}
				rec := ControlRecord{Action: action, Actor: req.Actor, Reason: req.Reason, At: workflow.Now(ctx)}
				var p Progress
				err := workflow.ExecuteActivity(actx, ActivityControl,
					ControlInput{Job: in.Job, Action: action, Actor: req.Actor, Reason: req.Reason}).Get(actx, &p)
				if err != nil {
					rec.Error = err.Error()
				} else {
					st.Progress = &p
				}
				st.Controls = append(st.Controls, rec)
			}
		}
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(workflow.GetSignalChannel(ctx, SignalPause), control(SignalPause))
		sel.AddReceive(workflow.GetSignalChannel(ctx, SignalResume), control(SignalResume))
		sel.AddReceive(workflow.GetSignalChannel(ctx, SignalCancel), control(SignalCancel))
		for {
			sel.Select(ctx)
		}
	})

	// The slots.
	slotCtx := workflow.WithActivityOptions(ctx, slotOptions(in))
	res := Result{Slots: make([]SlotResult, in.Workers)}
	errs := make([]error, in.Workers)
	pending := in.Workers
	wg := workflow.NewWaitGroup(ctx)
	for i := range in.Workers {
		wg.Add(1)
		f := workflow.ExecuteActivity(slotCtx, ActivityWork, SlotInput{Input: in, Slot: i})
		workflow.Go(ctx, func(ctx workflow.Context) {
			defer wg.Done()
			var r SlotResult
			err := f.Get(ctx, &r)
			r.Slot = i
			res.Slots[i], errs[i] = r, err
			if err != nil {
				st.Slots[i].State, st.Slots[i].Error = "failed", err.Error()
			} else {
				st.Slots[i].State = "done"
				p := r.Progress
				st.Progress = &p
			}
			pending--
		})
	}
	// Progress readings while the slots run.
	if every := statusEvery(in); every > 0 {
		workflow.Go(ctx, func(ctx workflow.Context) {
			for pending > 0 {
				if err := workflow.Sleep(ctx, every); err != nil {
					return
				}
				if pending > 0 {
					readStatus(ctx)
				}
			}
		})
	}
	wg.Wait(ctx)
	if err := ctx.Err(); err != nil {
		// Cancelled: the slots were cancelled and waited for.
		return res, temporal.NewCanceledError()
	}
	readStatus(ctx)
	if st.Progress != nil {
		res.Progress = *st.Progress
	}
	if res.Progress.Status == backfill.RunCompleted {
		return res, nil
	}
	if err := firstSlotError(errs); err != nil {
		return res, err
	}
	return res, nil
}

// firstSlotError returns the most telling slot error: a cancel, then a
// failure, then a usage error, then any other; nil when none failed.
func firstSlotError(errs []error) error {
	for _, typ := range []string{ErrTypeCancelled, ErrTypeFailed, ErrTypeUsage, ""} {
		for _, err := range errs {
			if err == nil {
				continue
			}
			var ae *temporal.ApplicationError
			if typ == "" || errors.As(err, &ae) && ae.Type() == typ {
				return err
			}
		}
	}
	return nil
}

func statusEvery(in Input) time.Duration {
	switch {
	case in.StatusEvery < 0:
		return 0
	case in.StatusEvery == 0:
		return DefaultStatusEvery
	}
	return in.StatusEvery
}
