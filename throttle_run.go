package backfill

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
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
	states   []*hysteresis
	periods  []int64 // the open throttle period of each state (0: none)
	pace     *pacer  // nil without Config.RowsPerSecond

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
	if tm := ex.r.caps.throttle; tm != nil && cfg.JobConcurrency > 0 {
		err := ex.retryConn(ctx, "create job slots", func() error { return tm.ensureSlots(ctx, ex.r.db, ex.batchID, cfg.JobConcurrency) })
		if err != nil {
			ex.fail(nil, fmt.Errorf("backfill: job %q batch %d: job concurrency slots: %w", ex.job.Name, ex.batchID, err))
			return
		}
	}
	if len(cfg.Throttles) == 0 && cfg.RowsPerSecond <= 0 && ex.ctl == nil {
		return
	}
	t := &throttler{ex: ex, interval: cfg.throttleInterval(), now: time.Now, changed: make(chan struct{})}
	for _, th := range cfg.Throttles {
		t.states = append(t.states, &hysteresis{th: th, cfgHigh: th.High, cfgLow: th.Low})
	}
	t.periods = make([]int64, len(t.states))
	if cfg.RowsPerSecond > 0 || ex.ctl != nil {
		// With the control plane the cap is a live knob: an unlimited
		// pacer until it is set.
		t.pace = newPacer(rateOrInf(cfg.RowsPerSecond))
	}
	var poke chan struct{}
	if ex.ctl != nil {
		poke = ex.ctl.poke
	}
	ex.throttle = t
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t.check(mctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
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
			t.check(mctx)
		}
	}()
	t.stop = func() {
		cancel()
		wg.Wait()
		// Holds still open end with the call.
		for i, id := range t.periods {
			if id != 0 {
				t.closePeriod(context.WithoutCancel(ctx), i, t.states[i].value)
			}
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
func (t *throttler) scope(ctx context.Context) SignalScope {
	ex := t.ex
	s := SignalScope{BatchID: ex.batchID, Table: quotedTable(ex.base)}
	if tm := ex.r.caps.throttle; tm != nil {
		keys, err := tm.liveWorkers(ctx, ex.r.db, ex.batchID)
		if err != nil {
			ex.log.Warn("backfill: throttle: listing the run's live workers failed", "error", err)
		} else {
			s.WorkerKeys = keys
			if t.pace != nil {
				// The job-wide cap, shared evenly by the live calls
				// (processes) of the run.
				t.pace.setLimit(t.now(), rateOrInf(ex.liveRowsPerSecond())/float64(max(len(keys), 1)))
			}
		}
	} else if t.pace != nil {
		t.pace.setLimit(t.now(), rateOrInf(ex.liveRowsPerSecond()))
	}
	return s
}

// check reads every signal once and applies the transitions.
func (t *throttler) check(ctx context.Context) {
	ex := t.ex
	if ex.stopped() {
		return
	}
	// The run's control state: a pause or cancel stops the call, knobs
	// replace settings (backfill_control.go).
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
		v, err := h.th.Signal.Read(rctx, ex.r.db, scope)
		cancel()
		name := h.th.Signal.Name()
		if err != nil {
			if ctx.Err() == nil {
				ex.log.Warn("backfill: throttle signal unreadable; its state is kept", "signal", name, "held", h.held, "error", err)
			}
			continue
		}
		ex.log.Debug("backfill: throttle check", "signal", name, "value", v, "high", h.th.High, "low", h.th.low(), "critical", h.th.Critical, "held", h.held)
		if h.critical(v) {
			t.pauseRun(ctx, h, v)
			return
		}
		switch h.observe(t.now(), v) {
		case hold:
			ex.log.Warn("backfill: throttle hold: no chunk is claimed until the signal is below its low watermark",
				"signal", name, "value", v, "high", h.th.High, "low", h.th.low(), "min_hold", h.th.MinHold)
			t.setHeld(+1) // the workers first, then the record
			// Recorded even when the call stops meanwhile: stop
			// closes what is open once this check returns.
			t.openPeriod(context.WithoutCancel(ctx), i, v)
		case release:
			ex.log.Info("backfill: throttle release", "signal", name, "value", v, "high", h.th.High, "low", h.th.low(),
				"held_for", t.now().Sub(h.since))
			t.setHeld(-1)
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
	ex.fail(nil, fmt.Errorf("backfill: job %q batch %d: %w: %s; resume it with Runner.Resume", ex.job.Name, ex.batchID, ErrRunPaused, run.LastError))
	t.wake()
	return true
}

func (t *throttler) setHeld(d int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.held += d
	close(t.changed)
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

func (t *throttler) openPeriod(ctx context.Context, i int, v float64) {
	tm := t.ex.r.caps.throttle
	if tm == nil {
		return
	}
	h := t.states[i]
	p := ThrottlePeriod{BatchID: t.ex.batchID, WorkerKey: t.workerKey(), Signal: h.th.Signal.Name(),
		Reason: fmt.Sprintf("%s %g at or above high watermark %g", h.th.Signal.Name(), v, h.th.High),
		Value:  finite(v), High: finite(h.th.High), Low: finite(h.th.low())}
	id, err := tm.openPeriod(ctx, t.ex.r.db, p)
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
	if err := tm.closePeriod(ctx, t.ex.r.db, t.periods[i], finite(v)); err != nil {
		t.ex.log.Warn("backfill: end of throttle period not recorded", "signal", t.states[i].th.Signal.Name(), "error", err)
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
func (t *throttler) pauseRun(ctx context.Context, h *hysteresis, v float64) {
	ex := t.ex
	name := h.th.Signal.Name()
	reason := fmt.Sprintf("throttle %s: value %g at or above critical level %g", name, v, h.th.Critical)
	ex.log.Error("backfill: throttle critical: pausing the run; resume it with Runner.Resume", "signal", name, "value", v,
		"critical", h.th.Critical, "high", h.th.High, "low", h.th.low())
	err := fmt.Errorf("backfill: job %q batch %d: %w: %s; resume it with Runner.Resume", ex.job.Name, ex.batchID, ErrRunPaused, reason)
	if mv := ex.r.caps.validations; mv != nil {
		if perr := ex.retryConn(ctx, "pause run", func() error { return mv.PauseRun(ctx, ex.r.db, ex.batchID, reason) }); perr != nil {
			err = fmt.Errorf("backfill: job %q batch %d: throttle %s critical (%g), and the run could not be paused: %w", ex.job.Name, ex.batchID, name, v, perr)
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
	for {
		t.mu.Lock()
		held, ch := t.held, t.changed
		t.mu.Unlock()
		if held == 0 || t.ex.stopped() {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
	if t.pace == nil {
		return nil
	}
	if d := t.pace.delay(t.now()); d > 0 {
		lim := t.pace.limit()
		t.ex.log.Debug("backfill: rows-per-second cap: waiting", "wait", d, "rows_per_second", lim)
		var id int64
		tm := t.ex.r.caps.throttle
		if d >= t.interval && tm != nil {
			// A wait of an interval or more is a throttle period too.
			p := ThrottlePeriod{BatchID: t.ex.batchID, WorkerKey: t.workerKey(), Signal: RateSignalName,
				Reason: fmt.Sprintf("rows-per-second cap %g (this worker's share), waiting %v", lim, d.Round(time.Millisecond)),
				Value:  finite(lim), High: finite(lim), Low: finite(lim)}
			var err error
			if id, err = tm.openPeriod(ctx, t.ex.r.db, p); err != nil {
				t.ex.log.Warn("backfill: throttle period not recorded", "signal", p.Signal, "error", err)
			}
		}
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
		if id != 0 {
			if err := tm.closePeriod(context.WithoutCancel(ctx), t.ex.r.db, id, finite(lim)); err != nil {
				t.ex.log.Warn("backfill: end of throttle period not recorded", "signal", RateSignalName, "error", err)
			}
		}
		return ctx.Err()
	}
	return nil
}

// RateSignalName is the signal of the throttle periods that waits for
// [Config.RowsPerSecond] record (waits of a ThrottleInterval or more).
const RateSignalName = "rows_per_second"

// charge counts rows read by a chunk against the rows-per-second cap.
func (t *throttler) charge(rows int64) {
	if t != nil && t.pace != nil {
		t.pace.charge(t.now(), rows)
	}
}

// pacer is a rows-per-second cap: each chunk's rows are charged after
// it ran, and the next claim waits until they are paid for (the rows of
// a chunk are not known before it is read). It uses a token bucket
// (golang.org/x/time/rate) whose burst is one second of rows.
type pacer struct {
	mu    sync.Mutex
	lim   *rate.Limiter
	until time.Time
}

func newPacer(perSecond float64) *pacer {
	return &pacer{lim: rate.NewLimiter(limitOf(perSecond), burstOf(perSecond))}
}

// rateOrInf is perSecond as a pacer's limit: no cap (0 or less) is an
// infinite rate.
func rateOrInf(perSecond float64) float64 {
	if perSecond <= 0 {
		return math.Inf(1)
	}
	return perSecond
}

// limitOf is perSecond as a rate.Limit (an infinite rate is rate.Inf).
func limitOf(perSecond float64) rate.Limit {
	if math.IsInf(perSecond, 1) {
		return rate.Inf
	}
	return rate.Limit(perSecond)
}

func burstOf(perSecond float64) int {
	return int(min(max(math.Ceil(perSecond), 1), math.MaxInt32))
}

func (p *pacer) setLimit(now time.Time, perSecond float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lim.Limit() == limitOf(perSecond) {
		return
	}
	p.lim.SetLimitAt(now, limitOf(perSecond))
	p.lim.SetBurstAt(now, burstOf(perSecond))
}

func (p *pacer) limit() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return float64(p.lim.Limit())
}

// charge takes n rows at now: the time from which the next claim may
// start moves past the moment the bucket has paid for them.
func (p *pacer) charge(now time.Time, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := int64(p.lim.Burst())
	for n > 0 {
		k := min(n, b)
		r := p.lim.ReserveN(now, int(k))
		if !r.OK() {
			return
		}
		if at := now.Add(r.DelayFrom(now)); at.After(p.until) {
			p.until = at
		}
		n -= k
	}
}

// delay is how long a claim at now waits.
func (p *pacer) delay(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.until.Sub(now), 0)
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
	for i, t := range c.Throttles {
		if err := t.validate(i); err != nil {
			return err
		}
	}
	return nil
}

// slotPoll is how often a worker without a job concurrency slot tries
// again.
const slotPoll = 50 * time.Millisecond

// takeSlot locks a job-wide concurrency slot in tx, the chunk's
// transaction (true without Config.JobConcurrency).
func (ex *execution) takeSlot(ctx context.Context, tx Tx) (bool, error) {
	n := ex.liveJobConcurrency()
	tm := ex.r.caps.throttle
	if n <= 0 || tm == nil {
		return true, nil
	}
	return tm.takeSlot(ctx, tx, ex.batchID, n)
}

// waitSlot waits for a job concurrency slot: a poll interval at a time
// it fences the stale holders of the run's chunks (a frozen worker's
// transaction holds a slot too), between polls it sleeps slotPoll. It
// returns false when the call stops.
func (ex *execution) waitSlot(ctx context.Context, ws *waitState) bool {
	if ex.stopped() || ctx.Err() != nil {
		return false
	}
	if ws.slotSince.IsZero() {
		ws.slotSince = time.Now()
		ex.log.Debug("backfill: every job concurrency slot is taken; waiting", "job_concurrency", ex.r.cfg.JobConcurrency)
	}
	if wm := ex.r.caps.workers; wm != nil && ex.worker != nil && !ws.fenceOff && time.Since(ws.fenced) >= ex.r.pollInterval() {
		ws.fenced = time.Now()
		if _, err := wm.holders(ctx, ex.r.db, ex.batchID, ex.worker.key, ex.r.cfg.StaleAfter, true, true); err != nil && isPermission(err) {
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
