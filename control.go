package backfill

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/quote"
)

// How a call of Run obeys the control plane (the manifest's control
// state, [backfilltype.ControlState]).
//
// Each call reads its run's control state (status and knobs) from the
// manifest at every throttle check (Config.ThrottleInterval, default
// 500 ms: the throttle monitor runs whenever the manifest has the control
// plane), after each chunk it completes (with the lease of the next
// chunk, in the lease's statement, or on its own when nothing is
// leased), and at once when a notification
// for its run arrives on the schema's channel (Config.ListenURL). The
// claim itself refuses a run that is not running, so no chunk is claimed
// after a pause or cancel commits, whatever the interval; the reads make
// the workers stop (rather than wait for more chunks), abort the chunks
// in flight of a cancelled run, and apply the knobs. Polling alone works
// through PgBouncer in transaction mode, where LISTEN does not.

// runControl is a call's view of its run's control state.
type runControl struct {
	mu      sync.Mutex
	status  RunStatus // the run's status as last read
	knobs   map[string]float64
	changed chan struct{} // closed and replaced at every change
	// poke asks the monitor for an immediate check (a notification).
	poke chan struct{}
	// cancel aborts the chunks in flight (set by work).
	cancel context.CancelCauseFunc
	// ended: a worker of the call found nothing more to claim; the
	// workers the concurrency knob keeps waiting end too.
	ended atomic.Bool
}

// workerEnded records that a worker of the call found nothing more to
// claim, and wakes the workers waiting for their turn.
func (ex *execution) workerEnded() {
	if ex.ctl != nil {
		ex.ctl.ended.Store(true)
		ex.ctl.broadcast()
	}
}

func newRunControl() *runControl {
	return &runControl{knobs: map[string]float64{}, changed: make(chan struct{}), poke: make(chan struct{}, 1)}
}

// knob returns knob key, or def when unset (or without control).
func (c *runControl) knob(key string, def float64) float64 {
	if c == nil {
		return def
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return pgstore.KnobValue(c.knobs, key, def)
}

// wakeCh returns the channel closed at the next change.
func (c *runControl) wakeCh() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

func (c *runControl) broadcast() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.changed)
	c.changed = make(chan struct{})
}

// halt stops the call's claims because the run is status (paused or
// cancelled); a cancel also aborts the chunks in flight.
func (ex *execution) halt(status RunStatus, reason string) {
	ex.mu.Lock()
	first := ex.halted == ""
	if first {
		ex.halted = status
	} else if status == RunCancelled && ex.halted != RunCancelled {
		ex.halted, first = RunCancelled, true
	}
	ex.stop = true
	ex.mu.Unlock()
	if !first {
		return
	}
	if status == RunCancelled {
		ex.log.Warn("backfill: run cancelled: aborting the chunks in flight (they roll back and stay pending); no more claims", "reason", reason)
		if ex.ctl != nil && ex.ctl.cancel != nil {
			ex.ctl.cancel(fmt.Errorf("backfill: job %q batch %d: %w: %s", ex.job.Name, ex.batchID, ErrRunCancelled, reason))
		}
	} else {
		ex.log.Warn("backfill: run paused: no more claims; the chunks in flight finish", "reason", reason)
	}
	if ex.throttle != nil {
		ex.throttle.wake()
	}
	if ex.ctl != nil {
		ex.ctl.broadcast()
	}
}

// haltedAs returns the status that halted the call ("" for none).
func (ex *execution) haltedAs() RunStatus {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return ex.halted
}

// cancelled reports whether the call's run was cancelled.
func (ex *execution) cancelled() bool { return ex.haltedAs() == RunCancelled }

// pollControl reads the run's control state and applies it.
func (ex *execution) pollControl(ctx context.Context) {
	cm := ex.r.caps.control
	if cm == nil || ex.ctl == nil {
		return
	}
	st, err := cm.Control(ctx, ex.r.db, ex.batchID)
	if err != nil {
		if ctx.Err() == nil {
			ex.log.Warn("backfill: reading the run's control state failed; kept as it was", "error", err)
		}
		return
	}
	ex.applyControl(ctx, st)
}

// applyControl applies a control state read from the manifest.
func (ex *execution) applyControl(ctx context.Context, st backfilltype.ControlState) {
	switch st.Status {
	case RunPaused, RunCancelled:
		ex.halt(st.Status, st.Reason)
	}
	c := ex.ctl
	c.mu.Lock()
	statusChanged := c.status != st.Status
	c.status = st.Status
	same := len(c.knobs) == len(st.Knobs)
	for k, v := range st.Knobs {
		if old, ok := c.knobs[k]; !ok || old != v {
			same = false
		}
	}
	if !same {
		c.knobs = st.Knobs
	}
	c.mu.Unlock()
	if same {
		if statusChanged {
			// Wakes a call waiting for the resume (waitResumed).
			c.broadcast()
		}
		return
	}
	ex.log.Info("backfill: live knobs changed", "knobs", st.Knobs)
	c.broadcast()
}

// waitResumed waits, as a registered worker of the run, while the call is
// halted by a pause: it reads the run's control state every
// ThrottleInterval and at each change the throttle monitor reads (at once
// on a notification with Config.ListenURL). It reports true when the run
// is running again (the call's halt lifted, the validators' record read
// again): the caller works on. It reports false at once when the call is
// not paused, ended with errors of its own, or has no control plane, and
// when the run is cancelled (the call halted as cancelled) or ends
// otherwise, or ctx is done.
func (ex *execution) waitResumed(ctx context.Context) bool {
	cm := ex.r.caps.control
	if cm == nil || ex.ctl == nil || ex.haltedAs() != RunPaused || ctx.Err() != nil || ex.r.draining.Load() {
		return false
	}
	ex.mu.Lock()
	errs := len(ex.errs)
	ex.mu.Unlock()
	if errs > 0 {
		return false
	}
	logged := false
	for {
		wake := ex.ctl.wakeCh()
		st, err := cm.Control(ctx, ex.r.db, ex.batchID)
		if err == nil && st.Status == RunPaused {
			if ex.endOnSignal && ex.r.pausedBySignal(ctx, ex.batchID) {
				// Paused by this Runner's PauseOnSignal: the call ends.
				return false
			}
			if !logged {
				// Once per wait: a person watching the process knows it
				// is alive, why it is idle and what lets it go on.
				ex.log.Warn("backfill: run paused: this worker waits for it to be resumed (claims nothing, stays registered)",
					"paused", st.Reason, "resume", ex.r.resumeHint(ex.batchID))
				logged = true
			}
		}
		switch {
		case err != nil:
			if ctx.Err() == nil {
				ex.log.Warn("backfill: reading the run's control state failed while paused; trying again", "error", err)
			}
		case st.Status == RunRunning:
			ex.mu.Lock()
			ex.halted, ex.stop = "", false
			ex.mu.Unlock()
			ex.ctl.ended.Store(false)
			ex.applyControl(ctx, st)
			warning, accepted, baseline, err := ex.r.recordValidators(ctx, ex.job, ex.batchID)
			if err != nil {
				ex.fail(nil, fmt.Errorf("backfill: job %q batch %d: validators: %w", ex.job.Name, ex.batchID, err))
				return false
			}
			if warning != "" {
				ex.log.Warn(warning)
			}
			ex.mu.Lock()
			ex.accepted, ex.baseline = accepted, baseline
			ex.mu.Unlock()
			ex.pausedMeanwhile(ctx) // this pause is known
			ex.log.Info("backfill: run resumed: this worker claims chunks again")
			return true
		case st.Status == RunPaused:
		case st.Status == RunCancelled:
			ex.halt(RunCancelled, st.Reason)
			return false
		default:
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-ex.r.drained:
			return false
		case <-wake:
		case <-time.After(ex.r.cfg.throttleInterval()):
		}
	}
}

// auditEvents returns the call's batch's events, oldest first; false when
// the manifest keeps no audit trail or it cannot be read.
func (ex *execution) auditEvents(ctx context.Context) ([]backfilltype.Event, bool) {
	audit := ex.r.caps.audit
	if audit == nil {
		return nil, false
	}
	events, err := audit.Events(ctx, ex.r.db, ex.batchID)
	return events, err == nil
}

// pausedMeanwhile reports whether the run was paused (a "run_paused"
// event) since the call last looked; false when the audit trail cannot
// be read.
func (ex *execution) pausedMeanwhile(ctx context.Context) bool {
	events, ok := ex.auditEvents(ctx)
	if !ok {
		return false
	}
	n := 0
	for _, e := range events {
		if e.Kind == "run_paused" {
			n++
		}
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	more := n > ex.pausesSeen
	ex.pausesSeen = n
	return more
}

// pausedErr is the error of a call that ends with its run paused.
func (r *Runner) pausedErr(job Job, run Run) error {
	return fmt.Errorf("backfill: job %q batch %d: %w: %s; %s, then run the job again (a Run without Config.ReturnOnPause waits for the resume)",
		job.Name, run.BatchID, ErrRunPaused, run.LastError, r.resumeHint(run.BatchID))
}

// resumeHint says how to resume run batchID: from SQL, from the CLI, from Go.
func (r *Runner) resumeHint(batchID int64) string {
	schema := r.schemaName()
	return fmt.Sprintf("resume it with SELECT %s.resume(%d, 'ACTOR', 'WHY'), or backfill resume%s --batch %d --why WHY, or Runner.Resume",
		quote.SQLIdent(schema), batchID, quote.SchemaFlag(schema), batchID)
}

// liveConcurrency is the workers this call runs now: the concurrency knob,
// capped by Config.Concurrency.
func (ex *execution) liveConcurrency() int {
	n := ex.r.cfg.Concurrency
	if v := ex.ctl.knob(pgstore.KnobConcurrency, 0); v >= 1 {
		n = min(n, int(v))
	}
	return n
}

// liveJobConcurrency is the cap on the run's live leases that this call's
// leases apply now: the job_concurrency knob when set, also in a process
// started without a Config.JobConcurrency, otherwise
// Config.JobConcurrency (0: none).
func (ex *execution) liveJobConcurrency() int {
	if v := ex.ctl.knob(pgstore.KnobJobConcurrency, 0); v >= 1 {
		return int(v)
	}
	return ex.r.cfg.JobConcurrency
}

// liveRowsPerSecond is the job-wide rate cap now (0: none).
func (ex *execution) liveRowsPerSecond() float64 {
	return ex.ctl.knob(pgstore.KnobRowsPerSecond, ex.r.cfg.RowsPerSecond)
}

// waitTurn blocks worker i while the concurrency knob runs fewer workers
// than i+1; it returns false when the call stops, ctx ends, or a worker
// found nothing more to claim (workerEnded).
func (ex *execution) waitTurn(ctx context.Context, i int) bool {
	for {
		if ex.stopped() || ctx.Err() != nil {
			return false
		}
		if ex.ctl != nil && i >= ex.liveConcurrency() && ex.ctl.ended.Load() {
			return false
		}
		if ex.ctl == nil || i < ex.liveConcurrency() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-ex.ctl.wakeCh():
		case <-time.After(ex.r.cfg.throttleInterval()):
		}
	}
}

// throttleInterval is Config.ThrottleInterval or its default.
func (c *Config) throttleInterval() time.Duration {
	return cmp.Or(c.ThrottleInterval, backfillthrottle.DefaultThrottleInterval)
}

// listenControl LISTENs on the schema's channel on a direct connection
// (Config.ListenURL) and pokes the monitor at each notification for this
// run; it returns the function that stops it. Without ListenURL, or when
// the listener cannot connect, the call relies on polling.
func (ex *execution) listenControl(ctx context.Context) func() {
	url, cm := ex.r.cfg.ListenURL, ex.r.caps.control
	if url == "" || cm == nil || ex.ctl == nil {
		return func() {}
	}
	l := pq.NewListener(url, 100*time.Millisecond, 5*time.Second, func(ev pq.ListenerEventType, err error) {
		if err != nil {
			ex.log.Debug("backfill: control listener", "event", ev, "error", err)
		}
	})
	if err := l.Listen(cm.Schema()); err != nil {
		ex.log.Warn("backfill: LISTEN on the control channel failed; polling only (every Config.ThrottleInterval)", "channel", cm.Schema(), "error", err)
		_ = l.Close()
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case n := <-l.Notify:
				if n == nil {
					// Reconnected: notifications may have been missed.
					ex.pokeControl()
					continue
				}
				if p, ok := pgstore.ParseControlPayload(n.Extra); ok && p.BatchID == ex.batchID {
					ex.log.Debug("backfill: control notification", "action", p.Action, "key", p.Key)
					ex.pokeControl()
				}
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		_ = l.Close()
	}
}

// pokeControl asks the monitor for a check now.
func (ex *execution) pokeControl() {
	select {
	case ex.ctl.poke <- struct{}{}:
	default:
	}
}

// applyThresholds sets the watermarks of the throttles that have knobs.
func (t *throttler) applyThresholds() {
	c := t.ex.ctl
	if c == nil {
		return
	}
	for _, h := range t.states {
		name := h.Throttle.Signal.Name()
		hi := c.knob(pgstore.KnobThrottleHigh(name), h.ConfigHigh)
		lo := c.knob(pgstore.KnobThrottleLow(name), h.ConfigLow)
		if hi == h.Throttle.High && lo == h.Throttle.Low {
			continue
		}
		if lo > hi || hi == 0 && lo == 0 || math.IsNaN(hi) || math.IsNaN(lo) {
			t.ex.log.Warn("backfill: throttle knobs ignored: low above high or both zero", "signal", name, "high", hi, "low", lo)
			continue
		}
		t.ex.log.Info("backfill: throttle watermarks changed by a knob", "signal", name, "high", hi, "low", lo)
		h.Throttle.High, h.Throttle.Low = hi, lo
	}
}

// cancelledErr is the error of a call whose run was cancelled.
func (ex *execution) cancelledErr(run Run) error {
	return fmt.Errorf("backfill: job %q batch %d: %w: %s; %s (then run the job again), or start a new run with Job.NewRun",
		ex.job.Name, run.BatchID, ErrRunCancelled, run.LastError, ex.r.resumeHint(run.BatchID))
}

// schemaName is the manifest's schema for messages ("backfill" without
// the control plane).
func (r *Runner) schemaName() string {
	if cm := r.caps.control; cm != nil {
		return cm.Schema()
	}
	return "backfill"
}

// Pause pauses run batchID through the manifest's SQL function pause:
// every worker of every process stops claiming; the chunks in flight
// finish and checkpoint, and each call of [Runner.Run] on the run returns
// an error wrapping [ErrRunPaused]. actor and why are required (else an
// error wrapping [ErrInvalidConfig]). A run that is not running or failed
// gives an error wrapping [ErrRunStatus], an unknown batch
// [ErrRunNotFound]. It returns [ErrUnsupported] when the manifest has no
// control plane ([PGManifest] has one). The Runner's role must be an
// operator's ("backfill migrate --grant-operator", [PGManifest.OperatorGrants]),
// else the error wraps [ErrPrivilege], naming the role, the function and
// that fix; an actor over 200 characters or a why over 2000 is refused
// before the call ([ErrInvalidConfig], naming the cap and the length).
// Cancel and SetKnob are alike.
func (r *Runner) Pause(ctx context.Context, batchID int64, actor, why string) error {
	cm, err := r.controlPlane("pause")
	if err != nil {
		return err
	}
	return cm.ReadControl(ctx, r.db, "pause", batchID, actor, why)
}

// Cancel cancels run batchID through the manifest's SQL function cancel:
// the workers of every process abort their chunks in flight (rolled back:
// leases released, the chunks pending, nothing half-merged) and claim
// nothing more; the run ends [RunCancelled] and each call of [Runner.Run]
// on it returns an error wrapping [ErrRunCancelled]. Only an explicit
// resume ([Runner.Resume], the SQL function resume) restarts it;
// [Job.NewRun] starts a new run instead. Errors as [Runner.Pause].
func (r *Runner) Cancel(ctx context.Context, batchID int64, actor, why string) error {
	cm, err := r.controlPlane("cancel")
	if err != nil {
		return err
	}
	return cm.ReadControl(ctx, r.db, "cancel", batchID, actor, why)
}

// SetKnob sets live knob key of run batchID to value through the
// manifest's SQL function set_knob, by actor for the reason why (both
// required); every worker of every process applies it within one
// [Config.ThrottleInterval] (at once with [Config.ListenURL]). Keys:
// "concurrency" (the workers of each process: a whole number ≥ 1; a
// process runs at most its [Config.Concurrency], so the knob lowers it or
// raises it back up to that), "job_concurrency" (replaces
// [Config.JobConcurrency] in every process, also one started without it:
// a whole number ≥ 1, the most chunks of the run leased at once across
// every process), "rows_per_second" (replaces
// [Config.RowsPerSecond]: 0 for no cap, or at least 1), and
// "throttle.<signal>.high" and "throttle.<signal>.low" (the watermarks of
// the [backfillthrottle.Throttle] of that signal: finite numbers). value
// is a number as text, or "default" to drop the knob (each process goes
// back to its [Config]). A throttle watermark knob (or "default") that
// would leave the throttle's low watermark above its high one, or both
// zero, is refused: against the other knob of the pair when set, else
// against the High or Low of that signal's throttle in the Config of
// every process that has worked the run (each records them when it
// starts); setting both knobs makes the pair independent of the Configs.
// An unknown key, a bad value, such a pair or a missing actor or why
// gives an error wrapping [ErrInvalidConfig] that names the key and value
// (for a pair, both knobs and both values); a completed, rolled back or
// abandoned run [ErrRunStatus]. A paused, cancelled or failed run accepts
// knobs: they belong to the run and apply once it is resumed
// ([Runner.Resume]) or run again. It returns [ErrUnsupported] when the manifest has no
// control plane ([PGManifest] has one).
func (r *Runner) SetKnob(ctx context.Context, batchID int64, key, value, actor, why string) error {
	cm, err := r.controlPlane("set knob")
	if err != nil {
		return err
	}
	return cm.SetKnob(ctx, r.db, backfilltype.SetKnobParams{BatchID: batchID, Key: key, Value: value, Actor: actor, Why: why})
}

func (r *Runner) controlPlane(what string) (pgstore.ControlManifest, error) {
	if r.caps.control == nil {
		return nil, fmt.Errorf("backfill: %s: %w: the control plane needs PGManifest", what, ErrUnsupported)
	}
	return r.caps.control, nil
}
