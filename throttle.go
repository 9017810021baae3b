package backfill

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/hysteresis"
	"github.com/pgbackfill/backfill/internal/pacer"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// throttler is one call of Run's throttle state: a monitor goroutine
// reads every signal each interval and holds (or pauses) the call's
// workers; the workers wait on it before each claim.
//
// Each process evaluates the signals itself rather than reading a
// decision from the manifest: the signals are server-wide reads that
// every process sees alike, a hold then reaches every worker of the
// process within one interval without a round trip through the
// manifest, and no process is a single point of failure. Every hold is
// recorded in the manifest with the worker's key, so the run's time
// split (Runner.TimeSplit) sees the holds of every process.
//
// Live knobs (a later SQL control): the watermarks are read from
// hysteresis.th at each reading, and the rate from pacer.setLimit at each
// check, so a setting re-read from the manifest between checks can
// replace them without restarting the call.
type throttler struct {
	ex       *execution
	interval time.Duration
	now      func() time.Time
	states   []*hysteresis.State
	periods  []int64      // the open throttle period of each state (0: none)
	pace     *pacer.Pacer // nil without Config.RowsPerSecond and without an adaptive throttle
	share    float64      // this call's share of Config.RowsPerSecond (0: no cap)
	// ceiling is, without a cap, the rate the adaptive throttles' factors
	// apply to (rows/s): best as of the latest cut made while no cut was
	// in force (0: none yet). best is the highest rate the call read over
	// pacer.Window at a reading while no cut was in force: the rate it
	// reaches unthrottled, learnt again at every release, so that a first
	// cut during the call's first seconds (chunks still growing toward
	// their target) does not bound the rest of the call.
	ceiling   float64
	best      float64
	firstRead time.Time // the first reading of an adaptive throttle while no cut was in force
	// calibrating is, per state, the open throttle period of its
	// signal's calibration (backfillthrottle.Calibrator; 0: none, -1:
	// held without a recorded period).
	calibrating []int64
	// observed is what each state's signal last answered to
	// backfillthrottle.Observer (the monitor goroutine's alone);
	// observedAt when the signals were last asked.
	observed   []observation
	observedAt time.Time

	mu      sync.Mutex
	held    int           // how many states hold
	changed chan struct{} // closed and replaced at every change of held
	stop    func()
}

// startThrottle starts the call's throttle monitor (nil when the Runner
// has no throttle and no rate cap). It reads every signal once before it
// returns, so a signal already high holds the first claim.
func (ex *execution) startThrottle(ctx context.Context) {
	cfg := ex.r.cfg
	if len(cfg.Throttles) == 0 && cfg.RowsPerSecond <= 0 && ex.ctl == nil {
		return
	}
	t := newThrottler(ex)
	var poke chan struct{}
	if ex.ctl != nil {
		poke = ex.ctl.poke
	}
	ex.throttle = t
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t.observe(mctx)
	t.check(mctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t.monitor(ctx, mctx, poke)
	}()
	t.stop = func() {
		cancel()
		wg.Wait()
		t.endOpen(ctx)
	}
}

// newThrottler returns ex's throttle state, not yet started: one
// hysteresis per configured throttle, no open period, and a pacer capped
// at Config.RowsPerSecond, or unlimited (a live knob) with an adaptive
// throttle or the control plane, or none.
func newThrottler(ex *execution) *throttler {
	cfg := ex.r.cfg
	adapt := slices.ContainsFunc(cfg.Throttles, func(th backfillthrottle.Throttle) bool { return th.Adapt })
	t := &throttler{ex: ex, interval: cfg.throttleInterval(), now: time.Now, changed: make(chan struct{})}
	for _, th := range cfg.Throttles {
		t.states = append(t.states, &hysteresis.State{Throttle: th, ConfigHigh: th.High, ConfigLow: th.Low})
	}
	t.periods = make([]int64, len(t.states))
	t.calibrating = make([]int64, len(t.states))
	t.observed = make([]observation, len(t.states))
	switch {
	case cfg.RowsPerSecond > 0:
		t.share = cfg.RowsPerSecond
		t.pace = pacer.New(cfg.RowsPerSecond)
	case adapt || ex.ctl != nil:
		// With the control plane the cap is a live knob: an unlimited
		// pacer until it is set.
		t.pace = pacer.New(math.Inf(1))
	}
	return t
}

// monitor checks the signals with mctx every interval and at every poke,
// until mctx or ctx is done.
func (t *throttler) monitor(ctx, mctx context.Context, poke <-chan struct{}) {
	tk := time.NewTicker(t.interval)
	defer tk.Stop()
	for {
		select {
		case <-mctx.Done():
			return
		case <-ctx.Done():
			return
		case <-tk.C:
		case <-poke:
		}
		if t.now().Sub(t.observedAt) >= backfillthrottle.ObserveInterval {
			t.observe(mctx)
		}
		t.check(mctx)
	}
}

// observation is what a signal answered to backfillthrottle.Observer.
type observation struct {
	known, inert bool
	why          string
}

// observeTimeout bounds one signal's answer to Observes.
const observeTimeout = 5 * time.Second

// observe asks each signal that implements backfillthrottle.Observer
// whether it observes what it guards. An answer that it guards nothing is
// logged at WARN when it is new (the first, or a change); every change of
// answer, the first included, is recorded in the run's audit trail
// (pgstore.SignalNoter, which records only what the trail does not say
// already), which Status reads back as the run's throttle warnings. A
// signal that cannot answer keeps its last answer.
func (t *throttler) observe(ctx context.Context) {
	ex := t.ex
	t.observedAt = t.now()
	if ex.stopped() {
		return
	}
	scope := backfillthrottle.SignalScope{BatchID: ex.batchID, Table: pgstore.QuotedTable(ex.base)}
	for i, h := range t.states {
		o, ok := h.Throttle.Signal.(backfillthrottle.Observer)
		if !ok {
			continue
		}
		name := o.Name()
		octx, cancel := context.WithTimeout(ctx, max(t.interval, observeTimeout))
		observes, why, err := o.Observes(octx, ex.r.db, scope)
		cancel()
		if err != nil {
			ex.log.Debug("backfill: throttle: whether the signal observes what it guards is unknown; asked again later", "signal", name, "error", err)
			continue
		}
		now := observation{known: true, inert: !observes, why: why}
		if observes {
			now.why = ""
		}
		prev := t.observed[i]
		if prev == now {
			continue
		}
		t.observed[i] = now
		switch {
		case now.inert:
			ex.log.Warn("backfill: throttle signal guards nothing: its throttle never holds for what it should watch", "signal", name, "why", why,
				"job", ex.job.Name, "batch", ex.batchID)
		case prev.inert:
			ex.log.Info("backfill: throttle signal observes what it guards again", "signal", name, "job", ex.job.Name, "batch", ex.batchID)
		}
		// A first answer that the signal observes is recorded too: it
		// clears the warning an earlier call of the run left (the
		// manifest records nothing for a signal never found inert).
		if n, ok := ex.r.cfg.Manifest.(pgstore.SignalNoter); ok {
			err := n.NoteSignal(ctx, ex.r.db, pgstore.SignalNote{BatchID: ex.batchID, Job: ex.job.Name, Worker: ex.r.cfg.WorkerID,
				Signal: name, Inert: now.inert, Why: now.why})
			if err != nil {
				ex.log.Warn("backfill: throttle: whether the signal observes what it guards was not recorded; Status will not show it", "signal", name, "error", err)
			}
		}
	}
}

// endOpen ends what is still open when the call stops: it traces the
// release of every state that holds and closes every open throttle
// period, whatever ctx's state.
func (t *throttler) endOpen(ctx context.Context) {
	// Holds still open end with the call.
	for _, h := range t.states {
		if h.Held {
			t.ex.traceThrottle(ctx, backfilltrace.ThrottleData{Event: backfilltrace.ThrottleRelease, Signal: h.Throttle.Signal.Name(), Value: h.Value,
				High: h.Throttle.High, Low: h.Throttle.EffectiveLow(), Held: t.now().Sub(h.Since)})
		}
	}
	for i, id := range t.periods {
		if id != 0 {
			t.closePeriod(context.WithoutCancel(ctx), i, t.states[i].Value)
		}
	}
	for i, id := range t.calibrating {
		if id != 0 {
			t.closeCalibration(context.WithoutCancel(ctx), i)
		}
	}
}

// calibrate holds the call while state i's signal measures its baseline
// (backfillthrottle.Calibrator) and reports whether it does: the reading
// is then not compared with the watermarks. The hold is a throttle
// period of the signal of its own, beside the watermarks' holds.
func (t *throttler) calibrate(ctx context.Context, i int, h *hysteresis.State) bool {
	c, ok := h.Throttle.Signal.(backfillthrottle.Calibrator)
	if !ok {
		return false
	}
	on, was := c.Calibrating(), t.calibrating[i] != 0
	switch {
	case on && !was:
		t.ex.log.Info("backfill: throttle calibrating: no chunk is claimed while the signal measures its baseline", "signal", c.Name())
		t.setHeld(+1)
		t.calibrating[i] = -1 // held, whether the period is recorded or not
		if tm := t.ex.r.caps.throttle; tm != nil {
			p := backfilltype.ThrottlePeriod{BatchID: t.ex.batchID, WorkerKey: t.workerKey(), Signal: c.Name(),
				Reason: fmt.Sprintf("%s calibrating: measuring its baseline without the backfill", c.Name()),
				High:   finite(h.Throttle.High), Low: finite(h.Throttle.EffectiveLow())}
			if id, err := tm.OpenPeriod(context.WithoutCancel(ctx), t.ex.r.db, p); err != nil {
				t.ex.log.Warn("backfill: throttle period not recorded", "signal", p.Signal, "error", err)
			} else {
				t.calibrating[i] = id
			}
		}
	case !on && was:
		t.ex.log.Info("backfill: throttle calibrated", "signal", c.Name())
		t.closeCalibration(context.WithoutCancel(ctx), i)
	}
	return on
}

// closeCalibration ends state i's calibration hold.
func (t *throttler) closeCalibration(ctx context.Context, i int) {
	id := t.calibrating[i]
	t.calibrating[i] = 0
	t.setHeld(-1)
	if tm := t.ex.r.caps.throttle; tm != nil && id > 0 {
		if err := tm.ClosePeriod(ctx, t.ex.r.db, id, 0); err != nil {
			t.ex.log.Warn("backfill: end of throttle period not recorded", "signal", t.states[i].Throttle.Signal.Name(), "error", err)
		}
	}
}

// stopThrottle stops the monitor and closes the call's open periods.
func (ex *execution) stopThrottle() {
	if ex.throttle != nil && ex.throttle.stop != nil {
		ex.throttle.stop()
	}
}

// scope is what the signals see of the run; with a manifest that lists
// workers, it also sets the job-wide rate share.
func (t *throttler) scope(ctx context.Context) backfillthrottle.SignalScope {
	ex := t.ex
	s := backfillthrottle.SignalScope{BatchID: ex.batchID, Table: pgstore.QuotedTable(ex.base)}
	if tm := ex.r.caps.throttle; tm != nil {
		keys, err := tm.LiveWorkers(ctx, ex.r.db, ex.batchID)
		switch {
		case err != nil && ctx.Err() != nil:
			// The monitor is stopping (the call's end): its own cancel,
			// nothing to warn about.
		case err != nil:
			ex.log.Warn("backfill: throttle: listing the run's live workers failed", "error", err)
		default:
			s.WorkerKeys = keys
			if t.pace != nil {
				// The job-wide cap (a live knob), shared evenly by the
				// live calls (processes) of the run; 0: none.
				t.mu.Lock()
				t.share = ex.liveRowsPerSecond() / float64(max(len(keys), 1))
				t.mu.Unlock()
				t.applyRate()
			}
		}
	} else if t.pace != nil {
		t.mu.Lock()
		t.share = ex.liveRowsPerSecond()
		t.mu.Unlock()
		t.applyRate()
	}
	return s
}

// check reads every signal once and applies the transitions.
func (t *throttler) check(ctx context.Context) {
	ex := t.ex
	if ex.stopped() {
		// A call halted by a pause lets its chunks in flight finish:
		// a cancel that follows must still reach them (halt aborts
		// them), so the control state is still read.
		if ex.haltedAs() == RunPaused {
			ex.pollControl(ctx)
		}
		return
	}
	// The run's control state: a pause or cancel stops the call, knobs
	// replace settings ([execution.pollControl]).
	ex.pollControl(ctx)
	t.applyThresholds()
	if ex.stopped() {
		return
	}
	scope := t.scope(ctx)
	if t.paused(ctx) {
		return
	}
	for i, h := range t.states {
		rctx, cancel := context.WithTimeout(ctx, t.interval)
		v, err := h.Throttle.Signal.Read(rctx, ex.r.db, scope)
		// A reading cut by its deadline may come back as the server's
		// 57014 (lib/pq cancels the statement), not as the context's
		// error: the deadline is told by the reading's context.
		cut := rctx.Err() != nil
		cancel()
		name := h.Throttle.Signal.Name()
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			if !h.Read && !cut && !errors.Is(err, context.DeadlineExceeded) {
				// A signal that has never read (a typo in its query, a
				// missing privilege, a bad setting) is a deployment
				// error: found at the first reading, before anything is
				// claimed, or at the first reading that is not cut by
				// its deadline.
				ex.fail(nil, fmt.Errorf("backfill: job %q batch %d: %w: throttle signal %s cannot be read: %w", ex.job.Name, ex.batchID, ErrInvalidConfig, name, err))
				t.wake()
				return
			}
			h.Fails++
			if h.Fails < hysteresis.UnreadableAfter {
				ex.log.Warn("backfill: throttle signal unreadable; its state is kept", "signal", name, "held", h.Held, "error", err, "failures", h.Fails)
				continue
			}
			// Fail closed: a signal unreadable for unreadableAfter
			// readings in a row counts as above its high watermark
			// (never as critical) until it reads again.
			ex.log.Warn("backfill: throttle signal unreadable; treated as above its high watermark until it reads again", "signal", name, "error", err, "failures", h.Fails)
			v = math.Inf(1)
		} else {
			h.Fails = 0
			h.Read = true
			h.LastRead = v
		}
		ex.log.Debug("backfill: throttle check", "signal", name, "value", v, "high", h.Throttle.High, "low", h.Throttle.EffectiveLow(), "critical", h.Throttle.Critical, "held", h.Held)
		if !math.IsInf(v, 1) && h.Critical(v) {
			t.pauseRun(ctx, h, v)
			return
		}
		if t.calibrate(ctx, i, h) {
			continue
		}
		if h.Throttle.Adapt {
			t.adapt(h, v)
			continue
		}
		switch h.Observe(t.now(), v) {
		case hysteresis.Hold:
			ex.log.Warn("backfill: throttle hold: no chunk is claimed until the signal is below its low watermark",
				"signal", name, "value", v, "high", h.Throttle.High, "low", h.Throttle.EffectiveLow(), "min_hold", h.Throttle.MinHold)
			t.setHeld(+1) // the workers first, then the record
			ex.traceThrottle(ctx, backfilltrace.ThrottleData{Event: backfilltrace.ThrottleHold, Signal: name, Value: v, High: h.Throttle.High, Low: h.Throttle.EffectiveLow()})
			// Recorded even when the call stops meanwhile: stop
			// closes what is open once this check returns.
			t.openPeriod(context.WithoutCancel(ctx), i, v)
		case hysteresis.Release:
			ex.log.Info("backfill: throttle release", "signal", name, "value", v, "high", h.Throttle.High, "low", h.Throttle.EffectiveLow(),
				"held_for", t.now().Sub(h.Since))
			t.setHeld(-1)
			ex.traceThrottle(ctx, backfilltrace.ThrottleData{Event: backfilltrace.ThrottleRelease, Signal: name, Value: v, High: h.Throttle.High, Low: h.Throttle.EffectiveLow(),
				Held: t.now().Sub(h.Since)})
			t.closePeriod(context.WithoutCancel(ctx), i, v)
		}
	}
}

// paused stops the call when, while a throttle holds it, the run was
// paused by another process (its throttle's critical level) or by an
// operator: the held workers would otherwise wait for a release to
// find nothing to claim.
func (t *throttler) paused(ctx context.Context) bool {
	ex := t.ex
	t.mu.Lock()
	held := t.held
	t.mu.Unlock()
	mt := ex.r.caps.throttlePeriods
	if held == 0 || mt == nil {
		return false
	}
	run, err := mt.Run(ctx, ex.r.db, ex.batchID)
	if err != nil || run.Status != RunPaused {
		return false
	}
	ex.log.Warn("backfill: throttle: the run was paused meanwhile; this call stops", "reason", run.LastError)
	ex.tracePause(ctx, backfilltrace.PauseObserved, run.LastError)
	ex.fail(nil, fmt.Errorf("backfill: job %q batch %d: %w: %s; %s", ex.job.Name, ex.batchID, ErrRunPaused, run.LastError, ex.r.resumeHint(ex.batchID)))
	t.wake()
	return true
}

func (t *throttler) setHeld(d int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.held += d
	if t.changed != nil {
		close(t.changed)
	}
	t.changed = make(chan struct{})
}

// holding reports whether a throttle holds the call (false for nil).
func (t *throttler) holding() bool {
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.held > 0
}

// wake lets the waiting workers look at the call's state again.
func (t *throttler) wake() { t.setHeld(0) }

// holdPeriod is the throttle period of a hold of h, whose signal read
// v (+Inf: unreadable), by worker workerKey of run batchID.
func holdPeriod(batchID int64, workerKey string, h *hysteresis.State, v float64) backfilltype.ThrottlePeriod {
	p := backfilltype.ThrottlePeriod{BatchID: batchID, WorkerKey: workerKey, Signal: h.Throttle.Signal.Name(),
		Reason: fmt.Sprintf("%s %g at or above high watermark %g", h.Throttle.Signal.Name(), v, h.Throttle.High),
		Value:  finite(v), High: finite(h.Throttle.High), Low: finite(h.Throttle.EffectiveLow())}
	if math.IsInf(v, 1) {
		// Held because the signal is unreadable (fail closed): no value
		// was read; the period keeps the last value that was, and says so.
		p.Reason = fmt.Sprintf("%s unreadable (%d failed readings in a row; last value read %g): held as if at or above high watermark %g",
			h.Throttle.Signal.Name(), h.Fails, h.LastRead, h.Throttle.High)
		p.Value = finite(h.LastRead)
	}
	return p
}

func (t *throttler) openPeriod(ctx context.Context, i int, v float64) {
	tm := t.ex.r.caps.throttle
	if tm == nil {
		return
	}
	p := holdPeriod(t.ex.batchID, t.workerKey(), t.states[i], v)
	id, err := tm.OpenPeriod(ctx, t.ex.r.db, p)
	if err != nil {
		t.ex.log.Warn("backfill: throttle period not recorded", "signal", p.Signal, "error", err)
		return
	}
	t.periods[i] = id
}

func (t *throttler) closePeriod(ctx context.Context, i int, v float64) {
	tm := t.ex.r.caps.throttle
	if tm == nil || t.periods[i] == 0 {
		return
	}
	if err := tm.ClosePeriod(ctx, t.ex.r.db, t.periods[i], finite(v)); err != nil {
		t.ex.log.Warn("backfill: end of throttle period not recorded", "signal", t.states[i].Throttle.Signal.Name(), "error", err)
	}
	t.periods[i] = 0
}

func (t *throttler) workerKey() string {
	if t.ex.worker != nil {
		return t.ex.worker.key
	}
	return ""
}

// pauseRun pauses the run: a signal reached its critical level.
func (t *throttler) pauseRun(ctx context.Context, h *hysteresis.State, v float64) {
	ex := t.ex
	name := h.Throttle.Signal.Name()
	reason := fmt.Sprintf("throttle %s: value %g at or above critical level %g", name, v, h.Throttle.Critical)
	ex.log.Error("backfill: throttle critical: pausing the run; "+ex.r.resumeHint(ex.batchID), "signal", name, "value", v,
		"critical", h.Throttle.Critical, "high", h.Throttle.High, "low", h.Throttle.EffectiveLow())
	err := fmt.Errorf("backfill: job %q batch %d: %w: %s; %s", ex.job.Name, ex.batchID, ErrRunPaused, reason, ex.r.resumeHint(ex.batchID))
	ex.traceThrottle(ctx, backfilltrace.ThrottleData{Event: backfilltrace.ThrottleCritical, Signal: name, Value: v, High: h.Throttle.High, Low: h.Throttle.EffectiveLow()})
	if mv := ex.r.caps.validations; mv != nil {
		if perr := ex.retryConn(ctx, "pause run", func() error { return mv.PauseRun(ctx, ex.r.db, ex.batchID, reason) }); perr != nil {
			err = fmt.Errorf("backfill: job %q batch %d: throttle %s critical (%g), and the run could not be paused: %w", ex.job.Name, ex.batchID, name, v, perr)
		} else {
			ex.tracePause(ctx, backfilltrace.PauseThrottle, reason)
		}
	} else {
		err = fmt.Errorf("backfill: job %q batch %d: throttle %s critical (%g); this manifest cannot pause runs (%w), the run stays running",
			ex.job.Name, ex.batchID, name, v, ErrUnsupported)
	}
	ex.fail(nil, err)
	t.wake()
}

// wait blocks the calling worker while a throttle holds, then while its
// rows-per-second debt lasts. It returns ctx's error, or nil (also when
// the call stops meanwhile: the caller checks).
func (t *throttler) wait(ctx context.Context) error {
	if err := t.waitRelease(ctx); err != nil {
		return err
	}
	if t.pace == nil {
		return nil
	}
	// The rate cap: wait until what was reserved is paid for, then
	// reserve this try's estimate (tryAdmit, atomically, so that workers
	// waking together go one after another).
	for {
		d := t.pace.TryAdmit(t.now())
		if d <= 0 {
			return nil
		}
		t.waitRate(ctx, d)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if t.ex.stopped() {
			return nil
		}
	}
}

// waitRelease blocks while a throttle holds and the call has not
// stopped. It returns ctx's error, or nil.
func (t *throttler) waitRelease(ctx context.Context) error {
	for {
		t.mu.Lock()
		held, ch := t.held, t.changed
		t.mu.Unlock()
		if held == 0 || t.ex.stopped() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// waitRate waits d for the rows-per-second cap, or less when ctx is done,
// the call's state changes or a knob does. A wait of an interval or more
// is recorded as a throttle period (ratePeriod); the wait is traced.
func (t *throttler) waitRate(ctx context.Context, d time.Duration) {
	lim := t.pace.Limit()
	t.ex.log.Debug("backfill: rows-per-second cap: waiting", "wait", d, "rows_per_second", lim)
	sig, id := t.ratePeriod(ctx, d, lim)
	// The wait ends early when the call's state changes (a pause, a
	// cancel, a hold) or a knob does (the cap lifted or changed):
	// the loop then looks again.
	t.mu.Lock()
	changed := t.changed
	t.mu.Unlock()
	var knobs <-chan struct{}
	if t.ex.ctl != nil {
		knobs = t.ex.ctl.wakeCh()
	}
	timer := time.NewTimer(d)
	began := t.now()
	select {
	case <-ctx.Done():
	case <-timer.C:
	case <-changed:
	case <-knobs:
	}
	timer.Stop()
	t.ex.traceThrottle(ctx, backfilltrace.ThrottleData{Event: backfilltrace.ThrottleWait, Signal: sig, Value: lim, High: lim, Low: lim, Held: t.now().Sub(began)})
	if id != 0 {
		if err := t.ex.r.caps.throttle.ClosePeriod(context.WithoutCancel(ctx), t.ex.r.db, id, finite(lim)); err != nil {
			t.ex.log.Warn("backfill: end of throttle period not recorded", "signal", RateSignalName, "error", err)
		}
	}
}

// ratePeriod opens the throttle period of a rate-cap wait of d at the
// limit lim when d is an interval or more and the manifest records
// periods. It returns the period's signal (the adaptive throttle that cut
// the rate, else RateSignalName) and its id, 0 when none was opened.
func (t *throttler) ratePeriod(ctx context.Context, d time.Duration, lim float64) (string, int64) {
	tm := t.ex.r.caps.throttle
	if d < t.interval || tm == nil {
		return RateSignalName, 0
	}
	// A wait of an interval or more is a throttle period too,
	// of the adaptive throttle that cut the rate if one did.
	p := backfilltype.ThrottlePeriod{BatchID: t.ex.batchID, WorkerKey: t.workerKey(), Signal: RateSignalName,
		Reason: fmt.Sprintf("rows-per-second cap %g (this worker's share), waiting %v", lim, d.Round(time.Millisecond)),
		Value:  finite(lim), High: finite(lim), Low: finite(lim)}
	t.mu.Lock()
	if h := t.cutByLocked(); h != nil {
		p.Signal, p.Value, p.High, p.Low = h.Throttle.Signal.Name(), finite(h.Value), finite(h.Throttle.High), finite(h.Throttle.EffectiveLow())
		p.Reason = fmt.Sprintf("%s %g at or above high watermark %g: rate cut to %.0f rows/s (%.0f %% of %.0f), waiting %v",
			p.Signal, h.Value, h.Throttle.High, lim, 100*h.Factor, t.ceilingLocked(), d.Round(time.Millisecond))
	}
	t.mu.Unlock()
	id, err := tm.OpenPeriod(ctx, t.ex.r.db, p)
	if err != nil {
		t.ex.log.Warn("backfill: throttle period not recorded", "signal", p.Signal, "error", err)
	}
	return p.Signal, id
}

// RateSignalName is the signal of the throttle periods that waits for
// [Config.RowsPerSecond] record (waits of a ThrottleInterval or more).
const RateSignalName = pgstore.RateSignalName

// settle counts the rows read by a try that wait let through against
// the rows-per-second cap (0 for a try that claimed nothing or failed):
// the pacer reserved an estimate when it let the try through.
func (t *throttler) settle(rows int64) {
	if t == nil || t.pace == nil {
		return
	}
	now := t.now()
	t.pace.Settle(now, rows)
	t.mu.Lock()
	pending := t.share == 0 && t.ceiling == 0 && t.cutByLocked() != nil
	t.mu.Unlock()
	if pending && rows > 0 {
		// An adaptive throttle cut the rate before the call had read
		// anything (its signal was high from the start): the first
		// chunks read set the ceiling the cut applies to.
		t.mu.Lock()
		t.ceiling = t.pace.RateOver(now, pacer.Window)
		t.mu.Unlock()
		t.applyRate()
	}
}

// adapt applies a reading of an adaptive throttle (Throttle.Adapt): a
// cut or a raise of the call's rate.
func (t *throttler) adapt(h *hysteresis.State, v float64) {
	ex := t.ex
	now := t.now()
	t.mu.Lock()
	uncut := t.share == 0 && t.cutByLocked() == nil
	var rate float64
	if uncut {
		rate = t.pace.RateOver(now, pacer.Window)
		if t.firstRead.IsZero() {
			t.firstRead = now
		}
		if now.Sub(t.firstRead) >= pacer.Window {
			// A whole window read: a shorter one counts the rows of its
			// first chunk over less than their time.
			t.best = max(t.best, rate)
		}
	}
	before := h.Factor
	tr := h.Adapt(now, v, t.interval)
	factor, since := h.Factor, h.Since
	if tr == hysteresis.Hold && uncut {
		// Without a cap the ceiling is what the call reads: its best
		// rate over pacer.Window while no cut was in force (before a
		// whole window, the rate read so far).
		c := t.best
		if c == 0 {
			c = rate
		}
		t.ceiling = max(t.ceiling, c)
	}
	t.mu.Unlock()
	name := h.Throttle.Signal.Name()
	switch {
	case tr == hysteresis.Hold:
		ex.log.Warn("backfill: adaptive throttle: rate cut", "signal", name, "value", v, "high", h.Throttle.High, "low", h.Throttle.EffectiveLow(),
			"rows_per_second", math.Round(t.ceilingNow()*factor), "factor", factor)
	case tr == hysteresis.Release:
		ex.log.Info("backfill: adaptive throttle: rate back at its ceiling", "signal", name, "value", v, "low", h.Throttle.EffectiveLow(),
			"held_for", now.Sub(since))
	case factor != before:
		ex.log.Debug("backfill: adaptive throttle: rate raised", "signal", name, "value", v, "factor", factor)
	}
	t.applyRate()
}

// ceilingNow is the rate the adaptive factors apply to: the call's share
// of the cap, else the ceiling read at the first cut.
func (t *throttler) ceilingNow() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ceilingLocked()
}

func (t *throttler) ceilingLocked() float64 {
	if t.share > 0 {
		return t.share
	}
	return t.ceiling
}

// cutByLocked is the adaptive throttle whose factor is the lowest below 1,
// or nil; t.mu is held.
func (t *throttler) cutByLocked() *hysteresis.State {
	var by *hysteresis.State
	for _, h := range t.states {
		if h.Throttle.Adapt && h.Factor > 0 && h.Factor < 1 && (by == nil || h.Factor < by.Factor) {
			by = h
		}
	}
	return by
}

// applyRate sets the pacer's limit: the call's share of the cap times
// the lowest adaptive factor (no limit without a cap and without a
// cut, or before a ceiling is known).
func (t *throttler) applyRate() {
	if t.pace == nil {
		return
	}
	t.mu.Lock()
	lim := math.Inf(1)
	if t.share > 0 {
		lim = t.share
	}
	if h := t.cutByLocked(); h != nil {
		if c := t.ceilingLocked(); c > 0 {
			lim = max(c*h.Factor, c*hysteresis.AdaptFloor, 1)
		}
	}
	t.mu.Unlock()
	if before := t.pace.Limit(); before != float64(pacer.LimitOf(lim)) {
		t.pace.SetLimit(t.now(), lim)
		// Workers waiting on the old rate look again.
		t.wake()
	}
}

func finite(v float64) float64 {
	switch {
	case math.IsNaN(v):
		return 0
	case math.IsInf(v, 1):
		return math.MaxFloat64
	case math.IsInf(v, -1):
		return -math.MaxFloat64
	}
	return v
}

// validateThrottles checks the throttle settings of c.
func (c *Config) validateThrottles() error {
	switch {
	case c.ThrottleInterval < 0:
		return fmt.Errorf("%w: ThrottleInterval cannot be less than zero", ErrInvalidConfig)
	case c.RowsPerSecond < 0 || math.IsNaN(c.RowsPerSecond) || math.IsInf(c.RowsPerSecond, 0):
		return fmt.Errorf("%w: RowsPerSecond must be a finite number not less than zero (0: no cap)", ErrInvalidConfig)
	case c.JobConcurrency < 0:
		return fmt.Errorf("%w: JobConcurrency cannot be less than zero", ErrInvalidConfig)
	}
	first := map[string]int{} // signal name -> index of its first throttle
	for i, t := range c.Throttles {
		if err := t.Validate(i); err != nil {
			return err
		}
		name := t.Signal.Name()
		if strings.TrimSpace(name) == "" {
			return fmt.Errorf("%w: Throttles[%d]: its signal has an empty name, which the knobs throttle.<signal>.high and .low cannot name; give the signal a name (SQLSignal's first argument)", ErrInvalidConfig, i)
		}
		if j, ok := first[name]; ok {
			return fmt.Errorf("%w: Throttles[%d] and Throttles[%d] both watch signal %q, so the knobs throttle.%s.high and .low would be ambiguous; give each signal its own name, or merge the two throttles", ErrInvalidConfig, j, i, name, name)
		}
		first[name] = i
	}
	return nil
}

// slotPoll is how often a worker that found every place under
// Config.JobConcurrency taken tries to lease again.
const slotPoll = 50 * time.Millisecond

// waitSlot waits for a place under the job concurrency
// (Config.JobConcurrency or its knob: every place is a live lease of the
// run): a poll interval at a time it fences the stale
// holders of the run's chunks (a frozen worker's transaction holds a
// place too), between polls it sleeps slotPoll. It returns false when the
// call stops.
func (ex *execution) waitSlot(ctx context.Context, ws *waitState) bool {
	if ex.stopped() || ctx.Err() != nil {
		return false
	}
	if ws.slotSince.IsZero() {
		ws.slotSince = time.Now()
		ex.log.Debug("backfill: every job concurrency slot is taken; waiting", "job_concurrency", ex.liveJobConcurrency())
	}
	if wm := ex.r.caps.workers; ex.worker != nil && !ws.fenceOff && time.Since(ws.fenced) >= ex.r.pollInterval() {
		ws.fenced = time.Now()
		if _, err := wm.Holders(ctx, ex.r.db, ex.batchID, ex.worker.key, ex.r.cfg.StaleAfter, true, true); err != nil && pgstore.IsPermission(err) {
			ws.fenceOff = true
		}
	}
	tm := time.NewTimer(slotPoll)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
	}
	return !ex.stopped()
}
