package backfillthrottle_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/hysteresis"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ms(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }

// TestLatencyGoalSetting: the goal is the watermarks (ratios to the
// baseline), the throttle is adaptive, and bad settings are refused.
func TestLatencyGoalSetting(t *testing.T) {
	t.Parallel()
	th, err := backfillthrottle.LatencyGoal("SELECT 1", 0.3, backfillthrottle.GoalOptions{})
	require.NoError(t, err)
	require.Equal(t, backfillthrottle.GoalSignalName, th.Signal.Name())
	require.InDelta(t, 1.3, th.High, 1e-9)
	require.InDelta(t, 1.1, th.Low, 1e-9)
	require.True(t, th.Adapt)
	require.Equal(t, 5*time.Second, th.MinHold)
	require.NoError(t, th.Validate(0))
	_, ok := th.Signal.(backfillthrottle.Calibrator)
	require.True(t, ok, "the goal's signal holds the backfill while it calibrates")
	adv, ok := th.Signal.(backfillthrottle.ChunkAdvisor)
	require.True(t, ok, "the goal's signal suggests a chunk duration")
	require.Equal(t, 250*time.Millisecond, adv.ChunkDuration())

	for _, c := range []struct {
		query string
		rise  float64
		o     backfillthrottle.GoalOptions
	}{
		{"", 0.3, backfillthrottle.GoalOptions{Source: backfillthrottle.SourceProbe}},
		{"SELECT 1", 0.3, backfillthrottle.GoalOptions{Source: 7}},
		{"SELECT 1", 0, backfillthrottle.GoalOptions{}},
		{"SELECT 1", -0.1, backfillthrottle.GoalOptions{}},
		{"SELECT 1", math.NaN(), backfillthrottle.GoalOptions{}},
		{"SELECT 1", math.Inf(1), backfillthrottle.GoalOptions{}},
		{"SELECT 1", 0.3, backfillthrottle.GoalOptions{Percentile: 101}},
		{"BEGIN; SELECT 1; COMMIT", 0.3, backfillthrottle.GoalOptions{}},
		{"SELECT 1; rollback", 0.3, backfillthrottle.GoalOptions{}},
		{"SELECT 1", 0.3, backfillthrottle.GoalOptions{Window: -time.Second}},
		{"SELECT 1", 0.3, backfillthrottle.GoalOptions{Samples: -1}},
	} {
		_, err := backfillthrottle.LatencyGoal(c.query, c.rise, c.o)
		require.ErrorIs(t, err, backfilltype.ErrInvalidConfig, "%q %v %+v", c.query, c.rise, c.o)
	}
}

// TestGoalCalibratesThenCompares: the first reading starts a calibration
// (value 0, calibrating) that lasts Calibrate and at least 10 probes; the
// baseline is the percentile of its probes; from then on the value is the
// same percentile over the window, of probes taken after the calibration
// only, divided by the baseline.
func TestGoalCalibratesThenCompares(t *testing.T) {
	t.Parallel()
	g := backfillthrottle.NewGoalState(backfillthrottle.GoalOptions{Percentile: 50, Window: 2 * time.Second,
		Calibrate: time.Second, Recalibrate: -1}, false)
	// Slow probes during calibration: 1 s passes with only 8 probes, so
	// it goes on until the tenth.
	now := t0
	for i := range 8 {
		require.Zero(t, g.Observe(now, ms(float64(1+i%3)))) // 1, 2, 3 ms
		require.True(t, g.Calibrating())
		now = now.Add(250 * time.Millisecond)
	}
	require.Zero(t, g.Observe(now, ms(2)))
	require.True(t, g.Calibrating(), "9 probes: not yet a baseline")
	now = now.Add(250 * time.Millisecond)
	require.Zero(t, g.Observe(now, ms(2)))
	require.True(t, g.Calibrating(), "10 probes: the reading after them closes the window")
	now = now.Add(250 * time.Millisecond)
	require.Equal(t, 1.0, g.Observe(now, ms(9)), "the probe of the reading that ends the calibration is not counted")
	require.False(t, g.Calibrating())
	require.Equal(t, ms(2), g.Baseline(), "the median of 1,2,3,1,2,3,1,2,2,2 ms")

	// With the backfill: p50 of the window over the baseline, from half
	// a window after the calibration on (1 until then). The
	// calibration's probes are not in the window.
	now = now.Add(250 * time.Millisecond)
	require.Equal(t, 1.0, g.Observe(now, ms(4)), "too early")
	now = now.Add(750 * time.Millisecond)
	require.InDelta(t, 2.0, g.Observe(now, ms(4), ms(4), ms(1)), 1e-9)
	// The window forgets: what is older than 2 s no longer counts.
	now = now.Add(time.Second)
	require.InDelta(t, 2.0, g.Observe(now, ms(3)), 1e-9, "4, 4, 4, 1, 3 ms")
	now = now.Add(1500 * time.Millisecond)
	require.InDelta(t, 1.5, g.Observe(now, ms(3)), 1e-9, "3, 3 ms")
	require.False(t, g.Calibrating(), "Recalibrate < 0: never again")
	// A later call of Run: no reading for more than a window.
	now = now.Add(2*time.Second + time.Millisecond)
	require.False(t, g.Calibrating())
	require.Zero(t, g.Observe(now, ms(3)))
	require.True(t, g.Calibrating(), "a new call calibrates again")
}

// goalClock feeds a goal state one reading of one probe every step.
type goalClock struct {
	g    backfillthrottle.GoalState
	now  time.Time
	step time.Duration
}

func (c *goalClock) read(d time.Duration) float64 {
	v := c.g.Observe(c.now, d)
	c.now = c.now.Add(c.step)
	return v
}

// calibrateWindows runs a calibration to its end, one window of 10
// probes (1 s) of each latency in ds after another, and returns the value
// of the reading that ends it (a probe of the last latency, not
// counted).
func (c *goalClock) calibrateWindows(t *testing.T, ds ...time.Duration) float64 {
	t.Helper()
	for i, d := range ds {
		for range 10 {
			require.Zero(t, c.read(d), "window %d", i)
			require.True(t, c.g.Calibrating(), "window %d of %d", i, len(ds))
		}
	}
	v := c.read(ds[len(ds)-1])
	require.False(t, c.g.Calibrating(), "the calibration ends after %d windows", len(ds))
	return v
}

// TestGoalBaselineIsMedianOfWindows: the first calibration is
// Calibrate/Window windows, each of the same length as the window the
// backfill is then compared over, and the baseline is the median of
// their statistics: a burst in one window (20 ms) does not make it the
// baseline, where the percentile of all the calibration's probes pooled
// would be the burst.
func TestGoalBaselineIsMedianOfWindows(t *testing.T) {
	t.Parallel()
	c := &goalClock{g: backfillthrottle.NewGoalState(backfillthrottle.GoalOptions{Percentile: 90, Window: time.Second,
		Calibrate: 3 * time.Second, Recalibrate: -1}, false), now: t0, step: 100 * time.Millisecond}
	require.Equal(t, 1.0, c.calibrateWindows(t, ms(4), ms(20), ms(5)))
	require.Equal(t, ms(5), c.g.Baseline(), "the median of 4, 20 and 5 ms")
	for range 4 {
		require.Equal(t, 1.0, c.read(ms(6)), "half a window after the calibration: 1")
	}
	require.InDelta(t, 1.2, c.read(ms(6)), 1e-9, "the p90 of the window over the baseline")
}

// TestGoalRecalibrates: every Recalibrate the signal holds the backfill
// for Settle and one window (the Settle's probes do not count), and the
// window's statistic joins the history the baseline is the median of.
func TestGoalRecalibrates(t *testing.T) {
	t.Parallel()
	c := &goalClock{g: backfillthrottle.NewGoalState(backfillthrottle.GoalOptions{Percentile: 90, Window: time.Second,
		Calibrate: 3 * time.Second, Settle: 2 * time.Second, Recalibrate: time.Minute}, false), now: t0, step: 100 * time.Millisecond}
	c.calibrateWindows(t, ms(4), ms(20), ms(5))
	end := c.now
	for c.now.Sub(end) < time.Minute-c.step {
		v := c.read(ms(6))
		require.False(t, c.g.Calibrating())
		require.True(t, v == 1 || math.Abs(v-1.2) < 1e-9, "%v", v)
	}
	require.Zero(t, c.read(ms(50)), "a minute after the last calibration, the next one starts")
	require.True(t, c.g.Calibrating())
	// The settle: slow probes (the backfill's last chunk committing).
	for range 19 {
		require.Zero(t, c.read(ms(50)))
	}
	// One window of the application alone, 6 ms: within the band, it
	// joins 4, 20 and 5 ms.
	c.calibrateWindows(t, ms(6))
	require.Equal(t, ms(5.5), c.g.Baseline(), "the median of 4, 20, 5 and 6 ms; not the settle's 50 ms")
}

// TestGoalDriftRebaselines: readings at or above 1 + rise for 3 windows
// while the backfill runs (its rate has been halved three times and the
// latency has not come down) start a recalibration early; its window
// reads the application alone outside the band around the baseline, so
// one more window is measured, and when that one is outside it too the
// baseline is the new windows' alone: the load changed without the
// backfill.
func TestGoalDriftRebaselines(t *testing.T) {
	t.Parallel()
	c := &goalClock{g: backfillthrottle.NewGoalState(backfillthrottle.GoalOptions{Percentile: 90, Window: time.Second,
		Calibrate: 3 * time.Second, Settle: time.Second, Recalibrate: -1}, false), now: t0, step: 100 * time.Millisecond}
	c.calibrateWindows(t, ms(5), ms(5), ms(5))
	for range 5 {
		c.read(ms(10))
	}
	// 2x the baseline from here on (the first such reading was the
	// last one above): 3 windows of it, then a calibration.
	n := 0
	for v := c.read(ms(10)); v != 0; v = c.read(ms(10)) {
		require.Less(t, n, 40, "no recalibration after 4 s of readings at 2x")
		require.InDelta(t, 2.0, v, 1e-9)
		n++
	}
	require.True(t, c.g.Calibrating())
	require.Equal(t, 29, n, "3 s (3 windows) of readings at 2x, then the next reading calibrates")
	for range 9 {
		require.Zero(t, c.read(ms(10)), "the settle")
	}
	// The application alone at 10 ms: out of the band (5 ms × 1.3), one
	// more window; it is still out, on the same side.
	c.calibrateWindows(t, ms(10), ms(11))
	require.Equal(t, ms(10.5), c.g.Baseline(), "the two new windows, not the old 5 ms")
	for range 5 {
		c.read(ms(10))
	}
	require.InDelta(t, 10.0/10.5, c.read(ms(10)), 1e-9)
}

// TestGoalDriftOddWindow: a recalibration whose first window is out of
// the band but whose second is within it was one odd window: both join
// the history and its median absorbs the odd one.
func TestGoalDriftOddWindow(t *testing.T) {
	t.Parallel()
	c := &goalClock{g: backfillthrottle.NewGoalState(backfillthrottle.GoalOptions{Percentile: 90, Window: time.Second,
		Calibrate: 3 * time.Second, Settle: time.Second, Recalibrate: 10 * time.Second}, false), now: t0, step: 100 * time.Millisecond}
	c.calibrateWindows(t, ms(5), ms(6), ms(5))
	for !c.g.Calibrating() {
		c.read(ms(6))
	}
	for range 9 {
		require.Zero(t, c.read(ms(6)), "the settle")
	}
	c.calibrateWindows(t, ms(30), ms(5))
	require.Equal(t, ms(5), c.g.Baseline(), "the median of 5, 6, 5, 30 and 5 ms")
}

// TestGoalDriftBelow: readings at or below 1/(1 + rise) for 3 windows
// (the baseline was read in a busy moment: the backfill at full rate
// reads below it) start a recalibration early too, and a calibration
// that confirms the lower latency replaces the baseline.
func TestGoalDriftBelow(t *testing.T) {
	t.Parallel()
	c := &goalClock{g: backfillthrottle.NewGoalState(backfillthrottle.GoalOptions{Percentile: 90, Window: time.Second,
		Calibrate: 3 * time.Second, Settle: time.Second, Recalibrate: -1}, false), now: t0, step: 100 * time.Millisecond}
	c.calibrateWindows(t, ms(10), ms(10), ms(10))
	n := 0
	for !c.g.Calibrating() {
		require.Less(t, n, 45, "no recalibration after readings at 0.5x")
		c.read(ms(5))
		n++
	}
	for range 9 {
		require.Zero(t, c.read(ms(5)), "the settle")
	}
	c.calibrateWindows(t, ms(4), ms(4))
	require.Equal(t, ms(4), c.g.Baseline())
}

// TestGoalWithinBandNoDrift: readings within the band (below 1 + rise,
// above 1/(1 + rise)) never start a recalibration, and neither do
// readings that leave the band for less than 3 windows at a time.
func TestGoalWithinBandNoDrift(t *testing.T) {
	t.Parallel()
	c := &goalClock{g: backfillthrottle.NewGoalState(backfillthrottle.GoalOptions{Percentile: 90, Window: time.Second,
		Calibrate: time.Second, Recalibrate: -1}, false), now: t0, step: 100 * time.Millisecond}
	c.calibrateWindows(t, ms(10))
	for i := range 2000 {
		d := ms(12)
		if i/15%2 == 1 {
			d = ms(20) // 1.5 s out of the band (2.5 s of readings out of it, with the window), then back in it
		}
		c.read(d)
		require.False(t, c.g.Calibrating(), "reading %d", i)
	}
}

// TestGoalStatementsMean: with the statements source the statistic is
// their mean time (total over count), per window and for the baseline,
// and a reading without statements leaves the window as it is.
func TestGoalStatementsMean(t *testing.T) {
	t.Parallel()
	g := backfillthrottle.NewGoalState(backfillthrottle.GoalOptions{Window: time.Second, Calibrate: time.Second, Recalibrate: -1}, true)
	now := t0
	require.Zero(t, g.ObserveStatements(now, ms(10), 4)) // 2.5 ms each
	now = now.Add(500 * time.Millisecond)
	require.Zero(t, g.ObserveStatements(now, ms(2), 4)) // 0.5 ms each
	now = now.Add(500 * time.Millisecond)
	require.Zero(t, g.ObserveStatements(now, ms(6), 4)) // 1.5 ms each; 12 statements
	now = now.Add(500 * time.Millisecond)
	require.Equal(t, 1.0, g.ObserveStatements(now, ms(100), 4), "the reading that ends the calibration: not counted")
	require.Equal(t, ms(1.5), g.Baseline(), "18 ms over 12 statements")
	now = now.Add(500 * time.Millisecond)
	require.InDelta(t, 2.0, g.ObserveStatements(now, ms(30), 10), 1e-9)
	now = now.Add(500 * time.Millisecond)
	require.InDelta(t, 1.5, g.ObserveStatements(now, ms(15), 10), 1e-9, "45 ms over 20")
	now = now.Add(500 * time.Millisecond)
	require.InDelta(t, 1.5, g.Observe(now), 1e-9, "no statements: the window as it was, less what left it")
}

// TestGoalControlLoop closes the loop on a synthetic application, fed to
// the signal's state and the adaptive controller (hysteresis.State.Adapt,
// what Run applies) with a fake clock, for 10 minutes of readings every
// 250 ms. While the backfill works at a share rate of its free rate, the
// application slows down: a probe waits for a chunk's commit (+12 ms)
// with a probability proportional to rate (the p95 of the probes, the
// default statistic, jumps once that exceeds 5 %), or the statements'
// mean time grows in proportion to rate (free: 1.8x). The goal throttle
// (rise 0.3) must calibrate while the backfill is held, at the start
// only (the readings never drift: the backfill explains them), then keep
// the statistic near 1.3x of alone in the steady state (the last 8
// minutes) while the backfill keeps at least 60 % of the highest rate
// that meets the goal (0.25 and 0.375 of the free rate).
func TestGoalControlLoop(t *testing.T) {
	t.Parallel()
	const interval = 250 * time.Millisecond
	for _, c := range []struct {
		name string
		mean bool
		// read is a reading's samples at rate: probes, or the total time
		// of n statements.
		read    func(rng *rand.Rand, rate float64) ([]time.Duration, float64)
		best    float64 // the highest rate within the goal
		perfect time.Duration
	}{
		{name: "probe", best: 0.25, perfect: ms(3.9), read: func(rng *rand.Rand, rate float64) ([]time.Duration, float64) {
			var took []time.Duration
			for range 8 {
				d := ms(2 + 2*rng.Float64())
				if rng.Float64() < 0.2*rate {
					d += ms(12)
				}
				took = append(took, d)
			}
			return took, 0
		}},
		{name: "statements", mean: true, best: 0.375, perfect: ms(3), read: func(rng *rand.Rand, rate float64) ([]time.Duration, float64) {
			n := 200 + rng.IntN(100)
			each := 2 + 2*rng.Float64() // ms, the mean 3 ms
			return []time.Duration{ms(float64(n) * each * (1 + 0.8*rate))}, float64(n)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			th, err := backfillthrottle.LatencyGoal("SELECT 1", 0.3, backfillthrottle.GoalOptions{Recalibrate: -1})
			require.NoError(t, err)
			g := backfillthrottle.NewGoalState(backfillthrottle.GoalOptions{Recalibrate: -1}, c.mean)
			h := hysteresis.State{Throttle: th}
			rng := rand.New(rand.NewPCG(1, 2))
			var ratios, rates []float64
			heldAfterStart := false
			now, held := t0, true
			for now.Sub(t0) < 10*time.Minute {
				rate := 0.0 // held while calibrating (and before the first reading)
				if !held {
					rate = h.Factor
				}
				took, n := c.read(rng, rate)
				var v float64
				if c.mean {
					v = g.ObserveStatements(now, took[0], n)
				} else {
					v = g.Observe(now, took...)
				}
				held = g.Calibrating()
				if !held {
					h.Adapt(now, v, interval)
					if now.Sub(t0) > 2*time.Minute {
						ratios = append(ratios, v)
						rates = append(rates, h.Factor)
					}
				} else if now.Sub(t0) > time.Minute {
					heldAfterStart = true
				}
				now = now.Add(interval)
			}
			require.False(t, heldAfterStart, "held only while calibrating, at the start")
			require.InDelta(t, float64(c.perfect), float64(g.Baseline()), float64(ms(0.4)), "the baseline is the statistic of the application alone")
			slices.Sort(ratios)
			mean := 0.0
			for _, r := range rates {
				mean += r
			}
			mean /= float64(len(rates))
			t.Logf("steady state: median reading %.2fx alone, mean rate %.2f of free (best %.2f)", ratios[len(ratios)/2], mean, c.best)
			require.LessOrEqual(t, ratios[len(ratios)/2], 1.3, "the goal holds")
			require.GreaterOrEqual(t, mean, 0.6*c.best, "the backfill keeps most of the rate the goal allows")
			require.LessOrEqual(t, mean, c.best*1.1, "not above what the goal allows")
		})
	}
}
