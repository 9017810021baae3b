package backfillthrottle

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// Calibrator is a [Signal] that measures its own baseline while the
// backfill is held. After each reading, backfill.Runner.Run asks
// Calibrating: while it is true the call claims no chunk (chunks in
// progress finish), the reading is not compared with the throttle's
// watermarks, and the time is recorded as a throttle period of the
// signal ("calibrating"). [LatencyGoal]'s signal implements it.
type Calibrator interface {
	Signal
	// Calibrating reports whether the signal is measuring its baseline
	// and needs the backfill held, as of its latest reading.
	Calibrating() bool
}

// GoalOptions tunes [LatencyGoal]; its zero value is the recommended
// setting.
type GoalOptions struct {
	// Percentile is the statistic compared, in (0, 100]: the nearest-rank
	// percentile of the probe's latencies over Window, with the backfill
	// and without it. Default 90: with the defaults a window holds about
	// 80 probes, enough for a p90 that moves with the application's tail
	// (a p99 of 80 probes is their maximum, which moves with the probe's
	// own outliers instead).
	Percentile float64
	// Window is how long a probe's latency counts. Default 5 s.
	Window time.Duration
	// Samples is how many probes each reading runs, one after another
	// in separate transactions on one connection (it stops early past
	// half the reading's deadline). Default 4: at the default
	// ThrottleInterval of 250 ms... see the README for the pace.
	Samples int
	// Calibrate is how long the backfill is held while the baseline is
	// measured: when the call starts, and at every recalibration. The
	// baseline takes at least 10 probes, so a calibration lasts longer
	// when the probes are slow. Default 10 s.
	Calibrate time.Duration
	// Settle is how long a recalibration waits, once the backfill is
	// held, before it counts the probes (the backfill's chunks in
	// flight finish, its WAL is flushed). Default 2 s. The calibration
	// when the call starts does not wait.
	Settle time.Duration
	// Recalibrate is how often the baseline is measured again, from
	// the end of the previous calibration (the application's own load
	// changes). Default 5 min; negative: never.
	Recalibrate time.Duration
}

// GoalSignalName is the name of [LatencyGoal]'s signal, in logs, throttle
// periods and knobs (throttle.latency_goal.high).
const GoalSignalName = "latency_goal"

// LatencyGoal returns an adaptive [Throttle] that keeps the latency of
// query, a transaction like the application's (run without parameters,
// timed from BEGIN to the end of its COMMIT, as [ProbeLatencySignal]
// does), within rise of its latency without the backfill: rise 0.3 lets
// the application's latency grow by 30 %. The user states the goal; the
// throttle measures the baseline itself.
//
// Its signal (name [GoalSignalName], a [Calibrator]) holds the backfill
// for o.Calibrate when the call starts (and again every o.Recalibrate),
// measures the probe's o.Percentile over that time (the baseline), then
// reads the same statistic over the last o.Window, with the backfill,
// divided by the baseline: 1 is the latency alone. The throttle is
// [Throttle.Adapt] (AIMD on the rows per second) with High 1 + rise, Low
// 1 + rise/3 and MinHold o.Window: a window above High halves the rate,
// once per window; below Low the rate is given back step by step. Its
// fields may be changed before use (e.g. Critical).
//
// Each reading runs o.Samples probes on one connection of the Runner's
// pool. The baseline is per call of backfill.Runner.Run: with several
// processes on one job, a process that calibrates while another one
// backfills measures a baseline with that backfill in it (looser than
// rise).
//
// It returns an error wrapping [backfilltype.ErrInvalidConfig] when
// rise is not a positive finite number, query is empty, or an option is
// out of range (Percentile outside (0, 100], a negative duration or
// Samples).
func LatencyGoal(query string, rise float64, o GoalOptions) (Throttle, error) {
	bad := func(format string, args ...any) (Throttle, error) {
		return Throttle{}, fmt.Errorf("%w: LatencyGoal: "+format, append([]any{backfilltype.ErrInvalidConfig}, args...)...)
	}
	switch {
	case query == "":
		return bad("query is required")
	case !(rise > 0) || math.IsInf(rise, 0):
		return bad("rise %v is not a positive number (0.3: the latency may rise 30 %%)", rise)
	case o.Percentile != 0 && !(o.Percentile > 0 && o.Percentile <= 100):
		return bad("Percentile %v is not in (0, 100]", o.Percentile)
	case o.Window < 0, o.Calibrate < 0, o.Settle < 0:
		return bad("Window, Calibrate and Settle cannot be less than zero")
	case o.Samples < 0:
		return bad("Samples cannot be less than zero")
	}
	o = o.withDefaults()
	s := &goalSignal{query: query, samples: o.Samples, st: newGoalState(o)}
	return Throttle{Signal: s, High: 1 + rise, Low: 1 + rise/3, MinHold: o.Window, Adapt: true}, nil
}

func (o GoalOptions) withDefaults() GoalOptions {
	if o.Percentile == 0 {
		o.Percentile = 90
	}
	if o.Window == 0 {
		o.Window = 5 * time.Second
	}
	if o.Samples == 0 {
		o.Samples = 4
	}
	if o.Calibrate == 0 {
		o.Calibrate = 10 * time.Second
	}
	if o.Settle == 0 {
		o.Settle = 2 * time.Second
	}
	if o.Recalibrate == 0 {
		o.Recalibrate = 5 * time.Minute
	}
	return o
}

type goalSignal struct {
	query   string
	samples int
	mu      sync.Mutex
	st      *goalState
}

func (g *goalSignal) Name() string { return GoalSignalName }

// Calibrating implements [Calibrator].
func (g *goalSignal) Calibrating() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.st.calibrating
}

// Baseline is the latency the signal last calibrated (0 before its
// first calibration ends).
func (g *goalSignal) Baseline() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.st.baseline
}

// Read runs the reading's probes and returns the ratio of the window's
// statistic to the baseline; 0 while calibrating.
func (g *goalSignal) Read(ctx context.Context, db sqlx.ExtContext, _ SignalScope) (float64, error) {
	start := time.Now()
	budget := time.Duration(math.MaxInt64)
	if dl, ok := ctx.Deadline(); ok {
		budget = dl.Sub(start) / 2
	}
	var took []time.Duration
	for i := 0; i < g.samples && (i == 0 || time.Since(start) < budget); i++ {
		d, err := timeProbe(ctx, db, g.query)
		if err != nil {
			if len(took) > 0 {
				break // a later probe cut by the deadline: keep the others
			}
			return 0, fmt.Errorf("backfill: signal %s: %w", GoalSignalName, err)
		}
		took = append(took, d)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.st.observe(time.Now(), took), nil
}

// goalState is the pure part of [LatencyGoal]'s signal: the calibration
// schedule, the baseline and the window. The caller gives the time.
type goalState struct {
	o           GoalOptions
	calibrating bool
	started     bool
	calFrom     time.Time // when the current calibration's probes count
	calUntil    time.Time // its earliest end
	calSamples  []time.Duration
	calibrated  time.Time // when the last calibration ended
	baseline    time.Duration
	win         LatencyWindow
}

// minCalibration is the least number of probes a baseline is computed
// from: a calibration lasts until it has them.
const minCalibration = 10

// baselineFloor keeps the ratio finite for a probe that takes no time.
const baselineFloor = 50 * time.Microsecond

func newGoalState(o GoalOptions) *goalState {
	return &goalState{o: o, win: LatencyWindow{Span: o.Window}}
}

// observe records the probes of a reading taken at now and returns the
// signal's value: 0 while calibrating (then calibrating is true), else
// the window's percentile over the baseline.
func (s *goalState) observe(now time.Time, took []time.Duration) float64 {
	if !s.started {
		// The first reading, before the call claims anything: the
		// backfill is not running, nothing to settle.
		s.started = true
		s.begin(now, 0)
	} else if !s.calibrating && s.o.Recalibrate > 0 && now.Sub(s.calibrated) >= s.o.Recalibrate {
		s.begin(now, s.o.Settle)
	}
	if s.calibrating {
		if !now.Before(s.calFrom) {
			s.calSamples = append(s.calSamples, took...)
		}
		if now.Before(s.calUntil) || len(s.calSamples) < minCalibration {
			return 0
		}
		s.baseline = max(Percentile(s.calSamples, s.o.Percentile), baselineFloor)
		s.calibrating, s.calibrated = false, now
		// The window compares like with like: only probes taken
		// with the backfill allowed count from here on.
		s.win = LatencyWindow{Span: s.o.Window}
		return 1
	}
	for _, d := range took {
		s.win.Add(now, d)
	}
	p := s.win.Percentile(now, s.o.Percentile)
	if p == 0 {
		return 1
	}
	return float64(p) / float64(s.baseline)
}

// begin starts a calibration at now whose probes count after settle.
func (s *goalState) begin(now time.Time, settle time.Duration) {
	s.calibrating = true
	s.calFrom = now.Add(settle)
	s.calUntil = s.calFrom.Add(s.o.Calibrate)
	s.calSamples = s.calSamples[:0]
}
