package backfill

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
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
	pace     *pacer  // nil without Config.RowsPerSecond and without an adaptive throttle
	share    float64 // this call's share of Config.RowsPerSecond (0: no cap)
	initial  bool    // the first check, before any claim
	ceiling  float64 // without a cap: the adaptive throttles' ceiling (rows/s), set at the first cut

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
	adapt := slices.ContainsFunc(cfg.Throttles, func(th backfillthrottle.Throttle) bool { return th.Adapt })
	if len(cfg.Throttles) == 0 && cfg.RowsPerSecond <= 0 && ex.ctl == nil {
		return
	}
	t := &throttler{ex: ex, interval: cfg.throttleInterval(), now: time.Now, changed: make(chan struct{})}
	for _, th := range cfg.Throttles {
		t.states = append(t.states, &hysteresis{th: th, cfgHigh: th.High, cfgLow: th.Low})
	}
	t.periods = make([]int64, len(t.states))
	switch {
	case cfg.RowsPerSecond > 0:
		t.share = cfg.RowsPerSecond
		t.pace = newPacer(cfg.RowsPerSecond)
	case adapt || ex.ctl != nil:
		// With the control plane the cap is a live knob: an unlimited
		// pacer until it is set.
		t.pace = newPacer(math.Inf(1))
	}
	var poke chan struct{}
	if ex.ctl != nil {
		poke = ex.ctl.poke
	}
	ex.throttle = t
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t.initial = true
	t.check(mctx)
	t.initial = false
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
		for _, h := range t.states {
			if h.held {
				ex.traceThrottle(ctx, backfilltrace.ThrottleData{Event: backfilltrace.ThrottleRelease, Signal: h.th.Signal.Name(), Value: h.value,
					High: h.th.High, Low: h.th.EffectiveLow(), Held: t.now().Sub(h.since)})
			}
		}
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
func (t *throttler) scope(ctx context.Context) backfillthrottle.SignalScope {
	ex := t.ex
	s := backfillthrottle.SignalScope{BatchID: ex.batchID, Table: pgstore.QuotedTable(ex.base)}
	if tm := ex.r.caps.throttle; tm != nil {
		keys, err := tm.LiveWorkers(ctx, ex.r.db, ex.batchID)
		if err != nil {
			ex.log.Warn("backfill: throttle: listing the run's live workers failed", "error", err)
		} else {
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
			if ctx.Err() != nil {
				continue
			}
			if t.initial && !errors.Is(err, context.DeadlineExceeded) {
				// A signal that cannot be read at all (a typo in its
				// query, a missing privilege, a bad setting) is a
				// deployment error, found before anything is claimed.
				ex.fail(nil, fmt.Errorf("backfill: job %q batch %d: %w: throttle signal %s cannot be read: %w", ex.job.Name, ex.batchID, ErrInvalidConfig, name, err))
				t.wake()
				return
			}
			h.fails++
			if h.fails < unreadableAfter {
				ex.log.Warn("backfill: throttle signal unreadable; its state is kept", "signal", name, "held", h.held, "error", err, "failures", h.fails)
				continue
			}
			// Fail closed: a signal unreadable for unreadableAfter
			// readings in a row counts as above its high watermark
			// (never as critical) until it reads again.
			ex.log.Warn("backfill: throttle signal unreadable; treated as above its high watermark until it reads again", "signal", name, "error", err, "failures", h.fails)
			v = math.Inf(1)
		} else {
			h.fails = 0
		}
		ex.log.Debug("backfill: throttle check", "signal", name, "value", v, "high", h.th.High, "low", h.th.EffectiveLow(), "critical", h.th.Critical, "held", h.held)
		if !math.IsInf(v, 1) && h.critical(v) {
			t.pauseRun(ctx, h, v)
			return
		}
		if h.th.Adapt {
			t.adapt(h, v)
			continue
		}
		switch h.observe(t.now(), v) {
		case hold:
			ex.log.Warn("backfill: throttle hold: no chunk is claimed until the signal is below its low watermark",
				"signal", name, "value", v, "high", h.th.High, "low", h.th.EffectiveLow(), "min_hold", h.th.MinHold)
			t.setHeld(+1) // the workers first, then the record
			ex.traceThrottle(ctx, backfilltrace.ThrottleData{Event: backfilltrace.ThrottleHold, Signal: name, Value: v, High: h.th.High, Low: h.th.EffectiveLow()})
			// Recorded even when the call stops meanwhile: stop
			// closes what is open once this check returns.
			t.openPeriod(context.WithoutCancel(ctx), i, v)
		case release:
			ex.log.Info("backfill: throttle release", "signal", name, "value", v, "high", h.th.High, "low", h.th.EffectiveLow(),
				"held_for", t.now().Sub(h.since))
			t.setHeld(-1)
			ex.traceThrottle(ctx, backfilltrace.ThrottleData{Event: backfilltrace.ThrottleRelease, Signal: name, Value: v, High: h.th.High, Low: h.th.EffectiveLow(),
				Held: t.now().Sub(h.since)})
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
	ex.fail(nil, fmt.Errorf("backfill: job %q batch %d: %w: %s; resume it with Runner.Resume", ex.job.Name, ex.batchID, ErrRunPaused, run.LastError))
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

func (t *throttler) openPeriod(ctx context.Context, i int, v float64) {
	tm := t.ex.r.caps.throttle
	if tm == nil {
		return
	}
	h := t.states[i]
	p := backfilltype.ThrottlePeriod{BatchID: t.ex.batchID, WorkerKey: t.workerKey(), Signal: h.th.Signal.Name(),
		Reason: fmt.Sprintf("%s %g at or above high watermark %g", h.th.Signal.Name(), v, h.th.High),
		Value:  finite(v), High: finite(h.th.High), Low: finite(h.th.EffectiveLow())}
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
		"critical", h.th.Critical, "high", h.th.High, "low", h.th.EffectiveLow())
	err := fmt.Errorf("backfill: job %q batch %d: %w: %s; resume it with Runner.Resume", ex.job.Name, ex.batchID, ErrRunPaused, reason)
	ex.traceThrottle(ctx, backfilltrace.ThrottleData{Event: backfilltrace.ThrottleCritical, Signal: name, Value: v, High: h.th.High, Low: h.th.EffectiveLow()})
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
	// The rate cap: wait until what was reserved is paid for, then
	// reserve this try's estimate (tryAdmit, atomically, so that workers
	// waking together go one after another).
	for {
		d := t.pace.tryAdmit(t.now())
		if d <= 0 {
			return nil
		}
		lim := t.pace.limit()
		t.ex.log.Debug("backfill: rows-per-second cap: waiting", "wait", d, "rows_per_second", lim)
		var id int64
		sig := RateSignalName
		tm := t.ex.r.caps.throttle
		if d >= t.interval && tm != nil {
			// A wait of an interval or more is a throttle period too,
			// of the adaptive throttle that cut the rate if one did.
			p := backfilltype.ThrottlePeriod{BatchID: t.ex.batchID, WorkerKey: t.workerKey(), Signal: RateSignalName,
				Reason: fmt.Sprintf("rows-per-second cap %g (this worker's share), waiting %v", lim, d.Round(time.Millisecond)),
				Value:  finite(lim), High: finite(lim), Low: finite(lim)}
			t.mu.Lock()
			if h := t.cutByLocked(); h != nil {
				p.Signal, p.Value, p.High, p.Low = h.th.Signal.Name(), finite(h.value), finite(h.th.High), finite(h.th.EffectiveLow())
				p.Reason = fmt.Sprintf("%s %g at or above high watermark %g: rate cut to %.0f rows/s (%.0f %% of %.0f), waiting %v",
					p.Signal, h.value, h.th.High, lim, 100*h.factor, t.ceilingLocked(), d.Round(time.Millisecond))
			}
			t.mu.Unlock()
			sig = p.Signal
			var err error
			if id, err = tm.OpenPeriod(ctx, t.ex.r.db, p); err != nil {
				t.ex.log.Warn("backfill: throttle period not recorded", "signal", p.Signal, "error", err)
			}
		}
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
			if err := tm.ClosePeriod(context.WithoutCancel(ctx), t.ex.r.db, id, finite(lim)); err != nil {
				t.ex.log.Warn("backfill: end of throttle period not recorded", "signal", RateSignalName, "error", err)
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if t.ex.stopped() {
			return nil
		}
	}
}

// RateSignalName is the signal of the throttle periods that waits for
// [Config.RowsPerSecond] record (waits of a ThrottleInterval or more).
const RateSignalName = "rows_per_second"

// settle counts the rows read by a try that wait let through against
// the rows-per-second cap (0 for a try that claimed nothing or failed):
// the pacer reserved an estimate when it let the try through.
func (t *throttler) settle(rows int64) {
	if t == nil || t.pace == nil {
		return
	}
	now := t.now()
	t.pace.settle(now, rows)
	t.mu.Lock()
	pending := t.share == 0 && t.ceiling == 0 && t.cutByLocked() != nil
	t.mu.Unlock()
	if pending && rows > 0 {
		// An adaptive throttle cut the rate before the call had read
		// anything (its signal was high from the start): the first
		// chunks read set the ceiling the cut applies to.
		t.mu.Lock()
		t.ceiling = t.pace.rateOver(now, adaptWindow)
		t.mu.Unlock()
		t.applyRate()
	}
}

// adapt applies a reading of an adaptive throttle (Throttle.Adapt): a
// cut or a raise of the call's rate.
func (t *throttler) adapt(h *hysteresis, v float64) {
	ex := t.ex
	now := t.now()
	t.mu.Lock()
	before := h.factor
	tr := h.adapt(now, v, t.interval)
	factor, since := h.factor, h.since
	if tr == hold && t.share == 0 && t.ceiling == 0 {
		// Without a cap the ceiling is what the call reads: its best
		// rate over the last seconds, before this first cut.
		t.ceiling = t.pace.rateOver(now, adaptWindow)
	}
	t.mu.Unlock()
	name := h.th.Signal.Name()
	switch {
	case tr == hold:
		ex.log.Warn("backfill: adaptive throttle: rate cut", "signal", name, "value", v, "high", h.th.High, "low", h.th.EffectiveLow(),
			"rows_per_second", math.Round(t.ceilingNow()*factor), "factor", factor)
	case tr == release:
		ex.log.Info("backfill: adaptive throttle: rate back at its ceiling", "signal", name, "value", v, "low", h.th.EffectiveLow(),
			"held_for", now.Sub(since))
	case factor != before:
		ex.log.Debug("backfill: adaptive throttle: rate raised", "signal", name, "value", v, "factor", factor)
	}
	t.applyRate()
}

// adaptWindow is how far back the call's own rate is read for the
// ceiling of an adaptive throttle without a rows-per-second cap.
const adaptWindow = 10 * time.Second

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
func (t *throttler) cutByLocked() *hysteresis {
	var by *hysteresis
	for _, h := range t.states {
		if h.th.Adapt && h.factor > 0 && h.factor < 1 && (by == nil || h.factor < by.factor) {
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
			lim = max(c*h.factor, c*adaptFloor, 1)
		}
	}
	t.mu.Unlock()
	if before := t.pace.limit(); before != float64(limitOf(lim)) {
		t.pace.setLimit(t.now(), lim)
		// Workers waiting on the old rate look again.
		t.wake()
	}
}

// pacer is a rows-per-second cap: the rows of a chunk are not known
// before it is read, so a try let through reserves an estimate (the
// recent mean rows of a chunk), settled with the rows it read when it
// ends (a shortfall is credited to the next reservations); a claim waits
// until what was reserved is paid for. The reservation spaces the tries
// of a call's workers evenly at the limited rate rather than letting
// them all through at once, so their commits (and WAL) do not come in
// bursts. It uses a token bucket (golang.org/x/time/rate) whose burst
// is one second of rows.
type pacer struct {
	mu    sync.Mutex
	lim   *rate.Limiter
	until time.Time
	// est is the recent mean rows of a try (0 before the first);
	// prepaid the estimates reserved by open tries, open their number;
	// credit rows paid for and not read.
	est, prepaid, credit float64
	open                 int
	// The charges of the last adaptWindow, oldest first, for rateOver.
	recent []charged
}

type charged struct {
	at   time.Time
	rows int64
}

func newPacer(perSecond float64) *pacer {
	return &pacer{lim: rate.NewLimiter(limitOf(perSecond), burstOf(perSecond))}
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
	if old := float64(p.lim.Limit()); old != perSecond && p.until.After(now) {
		// What is still owed is paid at the new rate: a lifted cap
		// (Inf) ends the wait, a lowered one lengthens it.
		rest := float64(p.until.Sub(now))
		switch {
		case math.IsInf(perSecond, 1):
			p.until = now
		case !math.IsInf(old, 1) && perSecond > 0:
			p.until = now.Add(time.Duration(min(rest*old/perSecond, float64(time.Hour))))
		}
	}
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

// tryAdmit lets a try through at now when what was reserved is paid
// for, reserving its estimate, and returns 0; else it returns how long
// to wait before trying again.
func (p *pacer) tryAdmit(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.until.Sub(now); d > 0 {
		return d
	}
	p.admitLocked(now)
	return 0
}

func (p *pacer) admitLocked(now time.Time) {
	p.open++
	if p.est > 0 && !math.IsInf(float64(p.lim.Limit()), 1) {
		p.prepaid += p.est
		p.reserve(now, p.est)
	}
}

// settle ends a try admitted before, which read n rows: its share of
// the estimates is replaced by n.
func (p *pacer) settle(now time.Time, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var e float64
	if p.open > 0 {
		e = p.prepaid / float64(p.open)
		p.prepaid -= e
		p.open--
	}
	if n > 0 {
		p.recent = append(p.recent, charged{now, n})
		if i := slices.IndexFunc(p.recent, func(c charged) bool { return now.Sub(c.at) <= adaptWindow }); i > 0 {
			p.recent = slices.Delete(p.recent, 0, i)
		}
		if p.est == 0 {
			p.est = float64(n)
		} else {
			p.est = 0.8*p.est + 0.2*float64(n)
		}
	}
	if d := float64(n) - e; d > 0 {
		p.reserve(now, d)
	} else {
		p.credit -= d
	}
}

// charge takes n rows at now, as a try let through and settled at
// once, whatever the wait.
func (p *pacer) charge(now time.Time, n int64) {
	p.mu.Lock()
	p.open++
	p.mu.Unlock()
	p.settle(now, n)
}

// reserve takes n rows at now, less the credit: the time from which the
// next claim may start moves past the moment the bucket has paid for
// them.
func (p *pacer) reserve(now time.Time, rows float64) {
	use := min(p.credit, rows)
	p.credit -= use
	n := int64(math.Ceil(rows - use))
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

// rateOver is the rows per second charged over the last d before now
// (over the time since the first charge, when that is shorter).
func (p *pacer) rateOver(now time.Time, d time.Duration) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var rows int64
	first := now
	for _, c := range p.recent {
		if now.Sub(c.at) <= d {
			rows += c.rows
			if c.at.Before(first) {
				first = c.at
			}
		}
	}
	// The first charge's rows were read before it: count the span from
	// one chunk earlier, at least a second.
	span := max(now.Sub(first), time.Second)
	return float64(rows) / span.Seconds()
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
		if err := t.Validate(i); err != nil {
			return err
		}
	}
	return nil
}

// slotPoll is how often a worker that found every place under
// Config.JobConcurrency taken tries to lease again.
const slotPoll = 50 * time.Millisecond

// waitSlot waits for a place under Config.JobConcurrency (every place is
// a live lease of the run): a poll interval at a time it fences the stale
// holders of the run's chunks (a frozen worker's transaction holds a
// place too), between polls it sleeps slotPoll. It returns false when the
// call stops.
func (ex *execution) waitSlot(ctx context.Context, ws *waitState) bool {
	if ex.stopped() || ctx.Err() != nil {
		return false
	}
	if ws.slotSince.IsZero() {
		ws.slotSince = time.Now()
		ex.log.Debug("backfill: every job concurrency slot is taken; waiting", "job_concurrency", ex.r.cfg.JobConcurrency)
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
