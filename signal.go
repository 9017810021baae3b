package backfill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"sync"
	"syscall"
)

// PauseOnSignal steers the latest run of job from the process's signals
// (SIGINT and SIGTERM, or sigs when given), through the manifest's
// control plane, as an operator's "backfill pause" and "backfill cancel"
// would (recorded in the audit trail with actor "backfill", the reason
// "SIGNAL received by pid N (USER@HOST)" and the session's database role,
// through the manifest's function library_control, which a loader may
// execute: see [PGManifest.Grants]):
//
//   - a signal pauses the run ([Runner.Pause]): every worker of every
//     process stops claiming, the chunks in flight finish and are
//     checkpointed, and this Runner's [Runner.Run] returns an error
//     wrapping [ErrRunPaused], so that the person who pressed Ctrl-C
//     gets the process back (a Run waits on a pause made by anyone
//     else: SQL, the CLI, another process; [Work] waits on this pause
//     too, as on any). A signal that finds the run paused already takes
//     that pause as its own (Run returns, the run stays paused); one
//     that finds it awaiting approval makes Run return an error
//     wrapping [ErrAwaitingApproval];
//   - a signal that arrives while the run is still paused by the pause
//     of the previous signal cancels it ([Runner.Cancel]): the chunks in
//     flight roll back and stay pending, and Run (or Work) returns
//     [ErrRunCancelled]; after it the signals are no longer caught: the
//     next one has its default effect (SIGINT and SIGTERM end the
//     process).
//
// Precisely: a signal cancels when the previous signal paused the run,
// or found it paused already (its pause refused because the run is
// paused: that pause counts as the signal's), and the run is still
// paused by that same pause: the run is paused and no resume (nor a
// later pause) was recorded in the audit trail since that pause's
// "run_paused" event. Otherwise, as when the run was resumed meanwhile
// (from the CLI, SQL or [Runner.Resume]) or the previous signal's pause
// failed for another reason (no run yet, no control plane), the signal
// pauses the run again, as the first one did.
//
// Each step, and each failure, is written to out as one line (nil:
// nothing is written) and logged with [Config.Logger]. Run the job with
// a context these signals do not cancel (not one of
// [signal.NotifyContext] on the same signals), or the first signal
// aborts the chunks in flight. stop stops catching the signals; call it
// when the run returns. It needs the control plane ([PGManifest]):
// without it every signal only writes the error wrapping
// [ErrUnsupported].
func (r *Runner) PauseOnSignal(job string, out io.Writer, sigs ...os.Signal) (stop func()) {
	if out == nil {
		out = io.Discard
	}
	if len(sigs) == 0 {
		sigs = []os.Signal{os.Interrupt, syscall.SIGTERM}
	}
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, sigs...)
	done := make(chan struct{})
	finished := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(finished)
		var last *pauseMark // the pause of the previous signal, if any
		for {
			var s os.Signal
			select {
			case <-done:
				return
			case s = <-ch:
			}
			ctx := context.Background()
			cancel := last != nil && r.stillPaused(ctx, job, *last)
			action, says := "pause", "pausing: the chunks in flight finish; send it again to cancel"
			if cancel {
				action, says = "cancel", "cancelling: the chunks in flight roll back"
				signal.Stop(ch)
			}
			fmt.Fprintf(out, "%s received: %s job %s\n", s, says, job)
			r.cfg.Logger.Warn("backfill: "+s.String()+" received: "+action+" the run", "job", job)
			err := r.controlLatest(ctx, job, action, fmt.Sprintf("%s received by pid %d", s, os.Getpid()))
			if err != nil {
				fmt.Fprintf(out, "%s of job %s failed: %v\n", action, job, err)
				r.cfg.Logger.Warn("backfill: "+action+" on a signal failed", "job", job, "error", err)
			}
			if cancel {
				return
			}
			last = nil
			if err == nil || errors.Is(err, ErrRunStatus) {
				// Paused now, by this signal or before it: the next
				// signal cancels while this pause lasts.
				if m, ok := r.currentPause(ctx, job); ok {
					last = &m
					r.signalPauses.Store(m.batch, m.event)
					if err != nil {
						fmt.Fprintf(out, "job %s is paused already; send the signal again to cancel it\n", job)
					}
				} else if batch, ok := r.awaitingApproval(ctx, job); ok {
					// Nothing to pause: the call of Run waiting for the
					// approval returns.
					r.signalPauses.Store(batch, awaitingMark)
					fmt.Fprintf(out, "job %s awaits approval: this process stops waiting for it\n", job)
				}
			}
		}
	}()
	return func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
		})
		<-finished
	}
}

// awaitingMark in signalPauses marks a run that awaited approval when a
// signal of PauseOnSignal arrived: Run stops waiting for the approval.
const awaitingMark = int64(-1)

// awaitingApproval returns the latest run of job when it awaits approval.
func (r *Runner) awaitingApproval(ctx context.Context, job string) (int64, bool) {
	if r.caps.audit == nil {
		return 0, false
	}
	run, err := r.caps.audit.LatestRun(ctx, r.db, job)
	return run.BatchID, err == nil && run.Status == RunAwaitingApproval
}

// signalledAwaiting reports whether a signal of this Runner's
// PauseOnSignal arrived while run batchID awaited approval.
func (r *Runner) signalledAwaiting(batchID int64) bool {
	v, ok := r.signalPauses.Load(batchID)
	return ok && v.(int64) == awaitingMark
}

// pausedBySignal reports whether the pause in force of run batchID is
// one that this Runner's PauseOnSignal made or found: Run returns on it
// rather than wait. It reads the audit trail only when a signal paused
// batchID.
func (r *Runner) pausedBySignal(ctx context.Context, batchID int64) bool {
	v, ok := r.signalPauses.Load(batchID)
	if !ok || r.caps.audit == nil {
		return false
	}
	events, err := r.caps.audit.Events(ctx, r.db, batchID)
	if err != nil {
		return false
	}
	for i := len(events) - 1; i >= 0; i-- {
		switch events[i].Kind {
		case "run_paused":
			return events[i].ID == v.(int64)
		case "run_resumed_by_operator":
			// Resumed since (and paused again by a gate or a throttle).
			return false
		}
	}
	return false
}

// pauseMark is a pause in force: run batch, paused by its "run_paused"
// event event.
type pauseMark struct{ batch, event int64 }

// currentPause returns the pause in force of the latest run of job: ok is
// false when the run is not paused or cannot be read.
func (r *Runner) currentPause(ctx context.Context, job string) (pauseMark, bool) {
	if r.caps.audit == nil {
		return pauseMark{}, false
	}
	run, err := r.caps.audit.LatestRun(ctx, r.db, job)
	if err != nil || run.Status != RunPaused {
		return pauseMark{}, false
	}
	events, err := r.caps.audit.Events(ctx, r.db, run.BatchID)
	if err != nil {
		return pauseMark{}, false
	}
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].Kind == "run_paused" {
			return pauseMark{batch: run.BatchID, event: events[i].ID}, true
		}
	}
	return pauseMark{}, false
}

// stillPaused reports whether the pause m is still in force: its run is
// the latest of job and paused, and neither a resume nor another pause
// was recorded after m's "run_paused" event.
func (r *Runner) stillPaused(ctx context.Context, job string, m pauseMark) bool {
	if r.caps.audit == nil {
		return false
	}
	run, err := r.caps.audit.LatestRun(ctx, r.db, job)
	if err != nil || run.BatchID != m.batch || run.Status != RunPaused {
		return false
	}
	events, err := r.caps.audit.Events(ctx, r.db, m.batch)
	if err != nil {
		return false
	}
	for _, e := range events {
		if e.ID > m.event && (e.Kind == "run_paused" || e.Kind == "run_resumed_by_operator") {
			return false
		}
	}
	return true
}

// controlLatest pauses or cancels the latest run of job on the library's
// own account (actor "backfill"; why names the signal, the process and its
// user@host), which a loader may do without the operator's control
// functions.
func (r *Runner) controlLatest(ctx context.Context, job, action, why string) error {
	cm, err := r.controlPlane(action)
	if err != nil {
		return err
	}
	if r.caps.audit == nil {
		return fmt.Errorf("backfill: %s job %q: %w: needs ManifestAudit", action, job, ErrUnsupported)
	}
	run, err := r.caps.audit.LatestRun(ctx, r.db, job)
	if err != nil {
		return err
	}
	return cm.LibraryControl(ctx, r.db, action, run.BatchID, why+" ("+osActor()+")")
}

// osActor is USER@HOST of this process, for the audit trail.
func osActor() string {
	actor := "signal"
	if u, err := user.Current(); err == nil {
		actor = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		actor += "@" + h
	}
	return actor
}
