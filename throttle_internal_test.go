package backfill

import (
	"errors"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/hysteresis"
	"github.com/pgbackfill/backfill/internal/pacer"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestThrottleHysteresis: over any sequence of readings (around the
// watermarks) at any pace on a fake clock, a throttle holds only at or
// above High, releases only below Low and after MinHold, so each hold
// lasts at least MinHold: a value sitting at the threshold causes at
// most one hold and one release per hold period.
func TestThrottleHysteresis(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		high := rapid.Float64Range(1, 100).Draw(rt, "high")
		low := high * rapid.Float64Range(0.5, 1).Draw(rt, "low_fraction")
		minHold := time.Duration(rapid.IntRange(0, 5000).Draw(rt, "min_hold_ms")) * time.Millisecond
		h := hysteresis.State{Throttle: backfillthrottle.Throttle{High: high, Low: low, MinHold: minHold}}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		start := now
		holds := 0
		var since time.Time
		n := rapid.IntRange(1, 300).Draw(rt, "readings")
		for i := range n {
			now = now.Add(time.Duration(rapid.IntRange(1, 1500).Draw(rt, "dt_ms")) * time.Millisecond)
			// Readings sit at the threshold: within 1% of High or Low.
			base := rapid.SampledFrom([]float64{high, low}).Draw(rt, "base")
			v := base * (1 + rapid.Float64Range(-0.01, 0.01).Draw(rt, "jitter"))
			was := h.Held
			switch h.Observe(now, v) {
			case hysteresis.Hold:
				require.False(rt, was, "reading %d", i)
				require.GreaterOrEqual(rt, v, high, "held below High")
				holds++
				since = now
			case hysteresis.Release:
				require.True(rt, was, "reading %d", i)
				require.Less(rt, v, low, "released at or above Low")
				require.GreaterOrEqual(rt, now.Sub(since), minHold, "released before MinHold")
			case hysteresis.Stay:
				require.Equal(rt, was, h.Held)
				if !was {
					require.Less(rt, v, high, "a reading at or above High did not hold")
				}
			}
		}
		if minHold > 0 {
			require.LessOrEqual(rt, holds, 1+int(now.Sub(start)/minHold), "more than one hold per hold period")
		}
	})
}

// TestParseSchedule: the window syntax, windows crossing midnight, time
// zones and daylight saving time (Europe/Berlin changes clocks on
// 2026-03-29 and 2026-10-25).
func TestParseSchedule(t *testing.T) {
	t.Parallel()
	utc := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339, s)
		require.NoError(t, err)
		return tm
	}
	cases := []struct {
		spec string
		at   string
		in   bool
	}{
		// 2026-12-04 is a Friday; Berlin is UTC+1 in winter.
		{"Mon–Fri 22:00–06:00 Europe/Berlin", "2026-12-04T22:30:00Z", true},  // Fri 23:30
		{"Mon-Fri 22:00-06:00 Europe/Berlin", "2026-12-05T04:59:00Z", true},  // Sat 05:59, Friday's window
		{"Mon-Fri 22:00-06:00 Europe/Berlin", "2026-12-05T05:00:00Z", false}, // Sat 06:00
		{"Mon-Fri 22:00-06:00 Europe/Berlin", "2026-12-05T22:00:00Z", false}, // Sat 23:00
		{"Mon-Fri 22:00-06:00 Europe/Berlin", "2026-12-07T04:00:00Z", false}, // Mon 05:00: Sunday has no window
		{"Mon-Fri 22:00-06:00 Europe/Berlin", "2026-12-07T21:00:00Z", true},  // Mon 22:00
		{"Mon-Fri 22:00-06:00 Europe/Berlin", "2026-12-07T20:59:59Z", false}, // Mon 21:59:59
		// Spring forward: Sat 2026-03-28 22:00 CET (21:00Z) to Sun 06:00 CEST (04:00Z).
		{"Sat 22:00-06:00 Europe/Berlin", "2026-03-29T03:59:00Z", true},
		{"Sat 22:00-06:00 Europe/Berlin", "2026-03-29T04:00:00Z", false},
		// Fall back: Sat 2026-10-24 22:00 CEST (20:00Z) to Sun 06:00 CET (05:00Z).
		{"Sat 22:00-06:00 Europe/Berlin", "2026-10-24T20:00:00Z", true},
		{"Sat 22:00-06:00 Europe/Berlin", "2026-10-24T19:59:00Z", false},
		{"Sat 22:00-06:00 Europe/Berlin", "2026-10-25T04:30:00Z", true},
		{"Sat 22:00-06:00 Europe/Berlin", "2026-10-25T05:00:00Z", false},
		// Zones, lists, wrapping ranges, several windows, 24:00.
		{"* 09:00-17:00 America/New_York", "2026-07-01T13:00:00Z", true}, // 09:00 EDT
		{"* 09:00-17:00 America/New_York", "2026-07-01T12:59:00Z", false},
		{"* 09:00-17:00 Asia/Tokyo", "2026-07-01T00:00:00Z", true}, // 09:00 JST
		{"Fri-Mon 00:00-24:00 UTC", "2026-12-06T12:00:00Z", true},  // Sunday
		{"Fri-Mon 00:00-24:00 UTC", "2026-12-08T12:00:00Z", false}, // Tuesday
		{"Tue,Thu 01:00-02:00 UTC; sat 10:00-11:00 UTC", "2026-12-05T10:30:00Z", true},
		{"Tue,Thu 01:00-02:00 UTC; sat 10:00-11:00 UTC", "2026-12-03T01:30:00Z", true},
		{"Tue,Thu 01:00-02:00 UTC; sat 10:00-11:00 UTC", "2026-12-02T01:30:00Z", false},
	}
	for _, c := range cases {
		s, err := backfillthrottle.ParseSchedule(c.spec)
		require.NoError(t, err, c.spec)
		require.Equal(t, c.in, s.Contains(utc(c.at)), "%s at %s", c.spec, c.at)
		s.Now = func() time.Time { return utc(c.at) }
		v, err := s.Read(t.Context(), nil, backfillthrottle.SignalScope{})
		require.NoError(t, err)
		require.Equal(t, map[bool]float64{true: 0, false: 1}[c.in], v, "signal outside the window is 1")
	}
	for _, bad := range []string{"", "Mon-Fry 22:00-06:00 UTC", "Mon 25:00-06:00 UTC", "Mon 22:00-06:00 Mars/Base",
		"Mon 10:00-10:00 UTC", "Mon 22:00 UTC", "Mon 22:00-06:00", "Mon 24:00-06:00 UTC", "Mon 22:00-06:00 Local", "Mon 9:00-10:00 UTC",
		"Mon +1:00-02:00 UTC", "Mon 01:+5-02:00 UTC", "Mon -0:00-02:00 UTC"} {
		_, err := backfillthrottle.ParseSchedule(bad)
		require.ErrorIs(t, err, ErrInvalidConfig, "%q", bad)
	}
}

// TestProbePercentile: the nearest-rank percentile of the probe
// latencies within the sliding window.
func TestProbePercentile(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := backfillthrottle.LatencyWindow{Span: 10 * time.Second}
	w.Add(t0, 5*time.Second) // expires first
	for i := 1; i <= 100; i++ {
		w.Add(t0.Add(time.Second), time.Duration(i)*time.Millisecond)
	}
	require.Equal(t, 5*time.Second, w.Percentile(t0.Add(time.Second), 99.9), "the slow probe is in the window")
	now := t0.Add(10*time.Second + time.Millisecond)
	require.Equal(t, 99*time.Millisecond, w.Percentile(now, 99), "the slow probe left the window")
	require.Equal(t, 95*time.Millisecond, w.Percentile(now, 95))
	require.Equal(t, 50*time.Millisecond, w.Percentile(now, 50))
	require.Equal(t, 100*time.Millisecond, w.Percentile(now, 100))
	require.Equal(t, time.Duration(0), w.Percentile(t0.Add(time.Hour), 99), "empty window")
	require.Equal(t, 7*time.Millisecond, backfillthrottle.Percentile([]time.Duration{7 * time.Millisecond}, 99))
}

// TestPacer: the rows-per-second cap on a fake clock: a chunk's rows
// are paid for before the next claim, and halving the rate (two live
// workers) doubles the wait.
func TestPacer(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := pacer.New(100)
	require.Zero(t, p.Delay(t0))
	p.Charge(t0, 100) // the burst: one second of rows
	require.Zero(t, p.Delay(t0))
	p.Charge(t0, 300)
	require.Equal(t, 3*time.Second, p.Delay(t0))
	require.Equal(t, time.Second, p.Delay(t0.Add(2*time.Second)))
	require.Zero(t, p.Delay(t0.Add(3*time.Second)))

	q := pacer.New(100)
	q.SetLimit(t0, 50)
	q.Charge(t0, 50)
	q.Charge(t0, 300)
	require.Equal(t, 6*time.Second, q.Delay(t0))
	require.Equal(t, 50.0, q.Limit())

	// Tries let through reserve the mean rows of a try, so workers
	// waking together go one after another; a shortfall is credited.
	a := pacer.New(100)
	a.Charge(t0, 100) // the burst; 100 rows is the estimate now
	require.Zero(t, a.TryAdmit(t0), "the first try")
	require.Equal(t, time.Second, a.TryAdmit(t0), "a second try at the same instant went through")
	a.Settle(t0, 50) // the first read 50: 50 credited; the estimate 0.8×100 + 0.2×50 = 90
	require.Zero(t, a.TryAdmit(t0.Add(time.Second)))
	require.Equal(t, 400*time.Millisecond, a.TryAdmit(t0.Add(time.Second)), "the credit was not used (90 - 50 = 40 rows)")
	a.Settle(t0.Add(time.Second), 0) // nothing read (no chunk claimed): all credited
	require.Zero(t, a.TryAdmit(t0.Add(1500*time.Millisecond)))
}

// TestSplitTime: a run's time splits into working, paused and throttled
// by signal; overlapping holds count once (the first started), and the
// parts sum to the total.
func TestSplitTime(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	periods := []backfilltype.ThrottlePeriod{
		{Signal: "lag", StartedAt: at(10), Ended: at(30)},
		{Signal: "wal", StartedAt: at(20), Ended: at(40)}, // 20-30 counts as lag
		{Signal: "lag", StartedAt: at(15), Ended: at(25)}, // another worker, same signal
		{Signal: "wal", StartedAt: at(55), Ended: at(70)}, // 60-70 paused
	}
	slicesSortPeriods(periods)
	paused := pgstore.PausedSpans([]backfilltype.Event{{Kind: "run_paused", CreatedAt: at(60)}, {Kind: "run_resumed_by_operator", CreatedAt: at(80)}, {Kind: "run_paused", CreatedAt: at(95)}}, at(100))
	ts := pgstore.SplitTime(t0, at(100), paused, periods)
	require.Equal(t, 100*time.Second, ts.Total)
	require.Equal(t, 25*time.Second, ts.Paused)
	require.Equal(t, map[string]time.Duration{"lag": 20 * time.Second, "wal": 15 * time.Second}, ts.Throttled)
	require.Equal(t, 40*time.Second, ts.Working)
	require.Equal(t, ts.Total, ts.Working+ts.Paused+ts.Throttled["lag"]+ts.Throttled["wal"])
}

func slicesSortPeriods(ps []backfilltype.ThrottlePeriod) {
	for i := range ps {
		for j := i + 1; j < len(ps); j++ {
			if ps[j].StartedAt.Before(ps[i].StartedAt) {
				ps[i], ps[j] = ps[j], ps[i]
			}
		}
	}
}

// TestThrottleValidate: bad watermarks are refused with the field named.
func TestThrottleValidate(t *testing.T) {
	t.Parallel()
	s := backfillthrottle.SQLSignal("x", "SELECT 1")
	for _, th := range []backfillthrottle.Throttle{{High: 1}, {Signal: s}, {Signal: s, High: 1, Low: 2}, {Signal: s, High: 2, Critical: 1}, {Signal: s, High: 1, MinHold: -1}} {
		_, err := NewWithDB(Postgres(nil), &Config{Throttles: []backfillthrottle.Throttle{th}})
		require.True(t, errors.Is(err, ErrInvalidConfig), "%+v: %v", th, err)
	}
}

// TestThrottleAdapt: an adaptive throttle (AIMD) over any sequence of
// readings on a fake clock: a reading at or above High halves the factor
// at most once per max(MinHold, interval), a reading below Low raises it
// by adaptIncrease per second of interval, readings between Low and High
// keep it, the factor stays within [adaptFloor, 1], and a release is
// reported exactly when it is back at 1.
func TestThrottleAdapt(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		high := rapid.Float64Range(1, 100).Draw(rt, "high")
		low := high * rapid.Float64Range(0.5, 1).Draw(rt, "low_fraction")
		minHold := time.Duration(rapid.IntRange(0, 3000).Draw(rt, "min_hold_ms")) * time.Millisecond
		interval := time.Duration(rapid.IntRange(50, 1000).Draw(rt, "interval_ms")) * time.Millisecond
		h := hysteresis.State{Throttle: backfillthrottle.Throttle{High: high, Low: low, MinHold: minHold, Adapt: true}}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		var lastCut time.Time
		n := rapid.IntRange(1, 300).Draw(rt, "readings")
		for i := range n {
			now = now.Add(interval)
			v := rapid.SampledFrom([]float64{high * 1.5, high, (high + low) / 2, low * 0.9}).Draw(rt, "v")
			before := max(h.Factor, 0)
			if before == 0 {
				before = 1
			}
			tr := h.Adapt(now, v, interval)
			require.GreaterOrEqual(rt, h.Factor, hysteresis.AdaptFloor, "reading %d", i)
			require.LessOrEqual(rt, h.Factor, 1.0, "reading %d", i)
			switch {
			case v >= high:
				if !lastCut.IsZero() && now.Sub(lastCut) < max(minHold, interval) {
					require.Equal(rt, hysteresis.Stay, tr, "cut twice within the hold period")
					require.Equal(rt, before, h.Factor)
					continue
				}
				require.Equal(rt, hysteresis.Hold, tr)
				require.InDelta(rt, max(before*hysteresis.AdaptDecrease, hysteresis.AdaptFloor), h.Factor, 1e-12)
				lastCut = now
			case v < low && before < 1:
				want := min(before+hysteresis.AdaptIncrease*interval.Seconds(), 1)
				require.InDelta(rt, want, h.Factor, 1e-12)
				if want == 1 {
					require.Equal(rt, hysteresis.Release, tr)
					require.False(rt, h.Held)
				} else {
					require.Equal(rt, hysteresis.Stay, tr)
				}
			default:
				require.Equal(rt, hysteresis.Stay, tr)
				require.Equal(rt, before, h.Factor, "a reading between the watermarks changed the rate")
			}
		}
	})
}
