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
	require.Equal(t, 1.0, g.Observe(now, ms(2)))
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

// TestGoalRecalibrates: after Recalibrate the signal calibrates again;
// the probes of its first Settle (chunks in flight finishing) do not
// count, and the new baseline replaces the old one.
func TestGoalRecalibrates(t *testing.T) {
	t.Parallel()
	g := backfillthrottle.NewGoalState(backfillthrottle.GoalOptions{Percentile: 90, Window: time.Second, Samples: 1,
		Calibrate: 3 * time.Second, Settle: 2 * time.Second, Recalibrate: time.Minute}, false)
	now := t0
	step := func(d time.Duration) float64 {
		v := g.Observe(now, d)
		now = now.Add(250 * time.Millisecond)
		return v
	}
	for g.Calibrating() || now.Equal(t0) {
		step(ms(5))
	}
	require.Equal(t, ms(5), g.Baseline())
	end := now
	require.Equal(t, 1.0, step(ms(10)), "half a window after the calibration: 1")
	for now.Sub(end) < time.Minute-250*time.Millisecond {
		require.InDelta(t, 2.0, step(ms(10)), 1e-9)
	}
	require.Zero(t, step(ms(50)), "a minute after the last calibration, the next one starts")
	require.True(t, g.Calibrating())
	// The settle: slow probes (the backfill's last chunk committing).
	for range 7 {
		require.Zero(t, step(ms(50)))
	}
	// The application got slower on its own meanwhile: 8 ms alone.
	n := 0
	for g.Calibrating() {
		step(ms(8))
		n++
	}
	require.Equal(t, ms(8), g.Baseline(), "the settle's 50 ms probes are not in the baseline")
	require.Equal(t, 13, n, "3 s of probes after a 2 s settle (one reading of the settle counted above)")
	require.Equal(t, 1.0, step(ms(10)))
	require.InDelta(t, 1.25, step(ms(10)), 1e-9)
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
	require.Equal(t, 1.0, g.ObserveStatements(now, ms(6), 4)) // 1.5 ms each
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
// with a probability proportional to rate (the p90 of the probes jumps
// once that exceeds 10 %), or the statements' mean time grows in
// proportion to rate (free: 1.8x). The goal throttle (rise 0.3) must
// calibrate while the backfill is held, at the start only, then keep
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
		{name: "probe", best: 0.25, perfect: ms(3.8), read: func(rng *rand.Rand, rate float64) ([]time.Duration, float64) {
			var took []time.Duration
			for range 4 {
				d := ms(2 + 2*rng.Float64())
				if rng.Float64() < 0.4*rate {
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
