package backfill

import (
	"context"
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
// would (recorded in the audit trail with actor USER@HOST and the reason
// "SIGNAL received by pid N"):
//
//   - the first signal pauses the run ([Runner.Pause]): every worker of
//     every process stops claiming, the chunks in flight finish and are
//     checkpointed, and [Runner.Run] returns an error wrapping
//     [ErrRunPaused] ([Work] and [Config.WaitWhilePaused] wait for a
//     resume instead);
//   - the second cancels it ([Runner.Cancel]): the chunks in flight roll
//     back and stay pending, and Run (or Work) returns [ErrRunCancelled];
//   - after the second, the signals are no longer caught: a third one has
//     its default effect (SIGINT and SIGTERM end the process).
//
// Each signal is counted even when its pause or cancel fails (no run yet,
// a run already paused); the failure is written to out. Each step is
// written to out as one line (nil: nothing is written) and logged with
// [Config.Logger]. Run the job with a context these signals do not cancel
// (not one of [signal.NotifyContext] on the same signals), or the first
// signal aborts the chunks in flight. stop stops catching the signals;
// call it when the run returns. It needs the control plane
// ([PGManifest]): without it every signal only writes the error wrapping
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
		for n := 1; ; n++ {
			var s os.Signal
			select {
			case <-done:
				return
			case s = <-ch:
			}
			action, says := "pause", "pausing: the chunks in flight finish; send it again to cancel"
			if n > 1 {
				action, says = "cancel", "cancelling: the chunks in flight roll back"
				signal.Stop(ch)
			}
			fmt.Fprintf(out, "%s received: %s job %s\n", s, says, job)
			r.cfg.Logger.Warn("backfill: "+s.String()+" received: "+action+" the run", "job", job)
			if err := r.controlLatest(context.Background(), job, action, fmt.Sprintf("%s received by pid %d", s, os.Getpid())); err != nil {
				fmt.Fprintf(out, "%s of job %s failed: %v\n", action, job, err)
				r.cfg.Logger.Warn("backfill: "+action+" on a signal failed", "job", job, "error", err)
			}
			if n > 1 {
				return
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

// controlLatest pauses or cancels the latest run of job by this process's
// user.
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
	return cm.ReadControl(ctx, r.db, action, run.BatchID, osActor(), why)
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
