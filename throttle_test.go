package backfill

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/hysteresis"
	"github.com/pgbackfill/backfill/internal/pacer"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/testwait"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestOpenThrottlePeriodOfKilledWorkerEndsAtItsLastHeartbeat: a worker
// killed (kill -9) during a hold never ends its throttle period; the
// period is read as ending at the worker's last heartbeat once that is
// stale, not as growing forever, so the run's time split stays right.
// A live worker's open period ends now.
func TestOpenThrottlePeriodOfKilledWorkerEndsAtItsLastHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w", nil)
	rep, err := r.Run(ctx, liveJob(nil))
	require.NoError(t, err)
	m := r.cfg.Manifest.(*PGManifest)
	for _, k := range []string{"killed", "alive"} {
		require.NoError(t, m.RegisterWorker(ctx, r.db, backfilltype.Worker{Key: k, ID: k, BatchID: rep.BatchID, Job: "live", StaleAfter: 10 * time.Second}))
	}
	db.MustExec(`UPDATE backfill.workers SET heartbeat_at = now() - interval '1 hour' WHERE worker_key = 'killed'`)
	db.MustExec(`INSERT INTO backfill.throttle_periods (batch_id, worker_key, signal, reason, value, high, low, started_at)
		VALUES ($1, 'killed', 'lag', 'held', 5, 1, 1, now() - interval '2 hours'), ($1, 'alive', 'lag', 'held', 5, 1, 1, now() - interval '2 hours')`, rep.BatchID)
	ps, err := m.ThrottlePeriods(ctx, r.db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ps, 2)
	got := map[string]time.Duration{}
	for _, p := range ps {
		require.Nil(t, p.EndedAt, "never ended by its worker")
		got[p.WorkerKey] = p.Ended.Sub(p.StartedAt)
	}
	require.InDelta(t, time.Hour.Seconds(), got["killed"].Seconds(), 60, "ends at the killed worker's last heartbeat")
	require.InDelta(t, (2 * time.Hour).Seconds(), got["alive"].Seconds(), 60, "a live worker's hold lasts until now")
}

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
	ts := pgstore.SplitTime(t0, at(100), paused, periods, nil)
	require.Equal(t, 100*time.Second, ts.Total)
	require.Equal(t, 25*time.Second, ts.Paused)
	require.Equal(t, map[string]time.Duration{"lag": 20 * time.Second, "wal": 15 * time.Second}, ts.Throttled)
	require.Equal(t, 40*time.Second, ts.Working)
	require.Zero(t, ts.Idle, "no worker registered: no idle time")
	require.Equal(t, ts.Total, ts.Working+ts.Paused+ts.Idle+ts.Throttled["lag"]+ts.Throttled["wal"])

	// Workers alive 0-50 (then dead: its last heartbeat) and 85-: the
	// time no worker is alive, neither paused nor throttled, is idle,
	// not working.
	fin := at(50)
	alive := pgstore.WorkerSpans([]backfilltype.Worker{
		{StartedAt: t0, FinishedAt: &fin},
		{StartedAt: at(85), HeartbeatAt: at(86), Stale: false},
	}, at(100))
	ts = pgstore.SplitTime(t0, at(100), paused, periods, alive)
	require.Equal(t, 25*time.Second, ts.Paused)
	require.Equal(t, map[string]time.Duration{"lag": 20 * time.Second, "wal": 15 * time.Second}, ts.Throttled)
	require.Equal(t, 10*time.Second, ts.Idle, "50-55 and 80-85")
	require.Equal(t, 30*time.Second, ts.Working)

	// A cancel ends a pause's span; the time after it, with no worker,
	// is idle.
	paused = pgstore.PausedSpans([]backfilltype.Event{{Kind: "run_paused", CreatedAt: at(10)}, {Kind: "run_cancelled", CreatedAt: at(20)},
		{Kind: "run_resumed_by_operator", CreatedAt: at(40)}}, at(100))
	alive = pgstore.WorkerSpans([]backfilltype.Worker{{StartedAt: t0, FinishedAt: &[]time.Time{at(20)}[0]}, {StartedAt: at(40), HeartbeatAt: at(60), Stale: true}}, at(100))
	ts = pgstore.SplitTime(t0, at(100), paused, nil, alive)
	require.Equal(t, 10*time.Second, ts.Paused)
	require.Equal(t, 60*time.Second, ts.Idle, "20-40 cancelled, 60-100 dead")
	require.Equal(t, 30*time.Second, ts.Working)
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

// TestThrottleSignalNames: two throttles of one signal name, or a signal
// without a name, would make the throttle.<signal>.* knobs ambiguous: New
// refuses them, naming the throttles.
func TestThrottleSignalNames(t *testing.T) {
	t.Parallel()
	a := backfillthrottle.Throttle{Signal: backfillthrottle.SQLSignal("lag", "SELECT 1"), High: 1}
	b := backfillthrottle.Throttle{Signal: backfillthrottle.SQLSignal("lag", "SELECT 2"), High: 5}
	_, err := NewWithDB(Postgres(nil), &Config{Throttles: []backfillthrottle.Throttle{a, b}})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, `Throttles[0] and Throttles[1] both watch signal "lag"`)
	empty := backfillthrottle.Throttle{Signal: backfillthrottle.SQLSignal("", "SELECT 1"), High: 1}
	_, err = NewWithDB(Postgres(nil), &Config{Throttles: []backfillthrottle.Throttle{a, empty}})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "Throttles[1]: its signal has an empty name")
	b.Signal = backfillthrottle.SQLSignal("lag2", "SELECT 2")
	_, err = NewWithDB(Postgres(nil), &Config{Throttles: []backfillthrottle.Throttle{a, b}})
	require.NoError(t, err)
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

// fakeSignal is a signal whose value the test sets; it counts its
// readings.
type fakeSignal struct {
	v     atomic.Uint64
	reads atomic.Int64
}

func (f *fakeSignal) set(v float64) { f.v.Store(math.Float64bits(v)) }
func (f *fakeSignal) Name() string  { return "fake" }
func (f *fakeSignal) Read(context.Context, sqlx.ExtContext, backfillthrottle.SignalScope) (float64, error) {
	f.reads.Add(1)
	return math.Float64frombits(f.v.Load()), nil
}

// throttleRunner is a liveRunner with cfg's throttle settings.
func throttleRunner(t *testing.T, db *sqlx.DB, id string, set func(*Config)) *Runner {
	cfg := &Config{WorkerID: id, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second, RetryBackoff: 10 * time.Millisecond,
		ThrottleInterval: 10 * time.Millisecond}
	set(cfg)
	r, err := New(db, cfg)
	require.NoError(t, err)
	return r
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	testwait.Until(t, what, f)
}

// TestThrottleHoldsRecordsPeriodsAndSplitsTime: a signal above High
// holds the run before its first claim (no chunk is read while it
// holds); below Low it releases and the run completes. The hold is one
// throttle period in the manifest, and the run's time split sums up.
func TestThrottleHoldsRecordsPeriodsAndSplitsTime(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	sig := &fakeSignal{}
	sig.set(5)
	var read atomic.Int64
	job := liveJob(func(Chunk) { read.Add(1) })
	r := throttleRunner(t, db, "w1", func(c *Config) {
		c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3, Low: 1}}
	})
	res := goRun(t.Context(), r, job)
	waitFor(t, "the hold's period", func() bool {
		var n int
		// (an error: the manifest is not migrated yet)
		return db.Get(&n, `SELECT count(*) FROM backfill.throttle_periods WHERE ended_at IS NULL`) == nil && n == 1
	})
	require.Zero(t, read.Load(), "a chunk was read while the throttle held")
	sig.set(2) // between the watermarks: still held
	seen := sig.reads.Load()
	waitFor(t, "readings of the signal between the watermarks", func() bool { return sig.reads.Load() >= seen+3 })
	require.Zero(t, read.Load(), "released above Low")
	sig.set(0.5)
	out := testwait.Recv(t, "the run after the release", res)
	require.NoError(t, out.err)
	require.Equal(t, RunCompleted, out.rep.Status)
	require.EqualValues(t, liveChunks, read.Load())

	ps, err := r.caps.throttlePeriods.ThrottlePeriods(t.Context(), r.db, out.rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ps, 1)
	require.Equal(t, "fake", ps[0].Signal)
	require.Equal(t, 5.0, ps[0].Value)
	require.Equal(t, 3.0, ps[0].High)
	require.Equal(t, 1.0, ps[0].Low)
	require.NotNil(t, ps[0].EndedAt)
	require.Contains(t, ps[0].Reason, "high watermark 3")

	ts, err := r.TimeSplit(t.Context(), out.rep.BatchID)
	require.NoError(t, err)
	require.Positive(t, ts.Throttled["fake"])
	require.Zero(t, ts.Paused)
	require.Equal(t, ts.Total, ts.Working+ts.Paused+ts.Idle+ts.Throttled["fake"])
}

// TestThrottleCriticalPausesAndResumeContinues: a reading at the
// critical level pauses the run with the signal in the reason; Run
// returns ErrRunPaused; Resume continues it to the end, and the paused
// time shows in the split.
func TestThrottleCriticalPausesAndResumeContinues(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	sig := &fakeSignal{}
	sig.set(100)
	job := liveJob(nil)
	r := throttleRunner(t, db, "w1", func(c *Config) {
		c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 10, Low: 5, Critical: 50}}
		c.ReturnOnPause = true
	})
	rep, err := r.Run(t.Context(), job)
	require.ErrorIs(t, err, ErrRunPaused)
	require.Equal(t, RunPaused, rep.Status)
	require.Zero(t, rep.ChunksDone)
	// The error says how to resume: from SQL, from the CLI, from Go.
	require.Contains(t, err.Error(), fmt.Sprintf("SELECT backfill.resume(%d, 'ACTOR', 'WHY')", rep.BatchID))
	require.Contains(t, err.Error(), fmt.Sprintf("backfill resume --batch %d", rep.BatchID))
	var lastError string
	require.NoError(t, db.Get(&lastError, `SELECT last_error FROM backfill.runs WHERE batch_id = $1`, rep.BatchID))
	require.Contains(t, lastError, "throttle fake: value 100 at or above critical level 50")

	// Still paused for another call while nobody resumed it.
	_, err = r.Run(t.Context(), job)
	require.ErrorIs(t, err, ErrRunPaused)

	sig.set(0)
	rep, err = r.Resume(t.Context(), job, "oncall", "replica caught up")
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, liveChunks, rep.ChunksDone)
	ts, err := r.TimeSplit(t.Context(), rep.BatchID)
	require.NoError(t, err)
	require.Positive(t, ts.Paused)
	require.Equal(t, ts.Total, ts.Working+ts.Paused+ts.Idle+ts.Throttled["fake"])
}

// TestJobConcurrencyAcrossRunners: three Runners on separate pools
// (three processes' worth), each with Concurrency 3, never run more than
// JobConcurrency 2 chunks at once between them.
func TestJobConcurrencyAcrossRunners(t *testing.T) {
	t.Parallel()
	url := pgtest.NewURL(t)
	open := func() *sqlx.DB {
		db, err := sqlx.Open("postgres", url)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	db := open()
	_, err := db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	var cur, most, total atomic.Int64
	var extracted sync.Map // chunk ID -> true
	job := liveJob(func(c Chunk) {
		extracted.Store(c.ID, true)
		n := cur.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		total.Add(1)
		time.Sleep(20 * time.Millisecond) // overlap, if the cap let it
		cur.Add(-1)
	})
	job.Chunker = IntRange(0, 240, 10) // 24 chunks
	var rs []<-chan runResult
	for i := range 3 {
		r := throttleRunner(t, open(), fmt.Sprint("p", i), func(c *Config) { c.Concurrency = 3; c.JobConcurrency = 2 })
		rs = append(rs, goRun(t.Context(), r, job))
	}
	for _, ch := range rs {
		out := <-ch
		require.NoError(t, out.err)
	}
	// Every chunk extracted; a chunk retried on a loaded machine (its
	// attempt failed or its lease went stale) is extracted again.
	chunks := 0
	extracted.Range(func(any, any) bool { chunks++; return true })
	require.Equal(t, 24, chunks)
	require.GreaterOrEqual(t, total.Load(), int64(24))
	require.LessOrEqual(t, most.Load(), int64(2), "more chunks at once than JobConcurrency")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 240, n)
}

// TestRowsPerSecondSharedByLiveWorkers: each call takes the job-wide
// rate cap divided by the run's live workers.
func TestRowsPerSecondSharedByLiveWorkers(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	r := throttleRunner(t, db, "w1", func(c *Config) { c.RowsPerSecond = 1000 })
	m := r.cfg.Manifest.(*PGManifest)
	rs, err := r.planRun(t.Context(), liveJob(nil))
	require.NoError(t, err)
	run, _, err := m.StartRun(t.Context(), r.db, rs.plan, "w1", false)
	require.NoError(t, err)
	for _, k := range []string{"a", "b", "c", "d"} {
		require.NoError(t, m.RegisterWorker(t.Context(), r.db, backfilltype.Worker{Key: k, ID: k, BatchID: run.BatchID, Job: "live", StaleAfter: time.Minute}))
	}
	require.NoError(t, m.FinishWorker(t.Context(), r.db, "d"))
	ex := &execution{r: r, batchID: run.BatchID, base: "live", log: r.cfg.Logger}
	th := &throttler{ex: ex, now: time.Now, pace: pacer.New(1000)}
	scope := th.scope(t.Context())
	require.Equal(t, []string{"a", "b", "c"}, scope.WorkerKeys)
	require.InDelta(t, 1000.0/3, th.pace.Limit(), 1e-9)
	require.Equal(t, `"live"`, scope.Table)
}

// TestBuiltinSignalsOnPostgres: every built-in signal's SQL runs on the
// tests' server (no replica, no archiving) and reads sane values; the
// lock-waiters signal counts a session waiting on a lock held by a
// session tagged as one of the run's workers, and only then.
func TestBuiltinSignalsOnPostgres(t *testing.T) {
	t.Parallel()
	sdb := liveDB(t)
	db := Postgres(sdb)
	ctx := t.Context()
	scope := backfillthrottle.SignalScope{BatchID: 1, Table: `"live"`}
	read := func(s backfillthrottle.Signal, sc backfillthrottle.SignalScope) float64 {
		v, err := s.Read(ctx, db, sc)
		require.NoError(t, err, s.Name())
		return v
	}
	require.Zero(t, read(backfillthrottle.ReplicaLagSignal(), scope))
	require.Zero(t, read(backfillthrottle.ArchiveBacklogSignal(), scope))
	require.Zero(t, read(backfillthrottle.AutovacuumSignal(""), scope))
	require.Zero(t, read(backfillthrottle.AutovacuumSignal("public.live"), scope))
	wal := backfillthrottle.WALRateSignal()
	require.Zero(t, read(wal, scope), "first reading")
	_, err := sdb.Exec(`INSERT INTO live SELECT g, repeat('x', 100) FROM generate_series(1, 1000) g`)
	require.NoError(t, err)
	require.Positive(t, read(wal, scope))
	require.Equal(t, 1.0, read(backfillthrottle.SQLSignal("b", `SELECT $1::int > 0`, 3), scope))
	require.Equal(t, 0.0, read(backfillthrottle.SQLSignal("b", `SELECT false`), scope))
	require.Equal(t, 2.5, read(backfillthrottle.SQLSignal("n", `SELECT 2.5::numeric`), scope))
	require.Equal(t, 0.0, read(backfillthrottle.SQLSignal("n", `SELECT NULL::int`), scope))
	require.Equal(t, 0.0, read(backfillthrottle.SQLSignal("n", `SELECT 1 WHERE false`), scope))
	_, err = backfillthrottle.SQLSignal("t", `SELECT 'abc'`).Read(ctx, db, scope)
	require.ErrorContains(t, err, `"abc" is not a number`)
	pr := backfillthrottle.ProbeLatencySignal(`SELECT pg_sleep(0.01)`, 99, time.Minute)
	require.GreaterOrEqual(t, read(pr, scope), 10.0, "milliseconds")

	// A backfill session of worker k1 holds a lock; an application
	// session waits for it.
	lw := backfillthrottle.LockWaitersSignal()
	require.Zero(t, read(lw, backfillthrottle.SignalScope{WorkerKeys: []string{"k1"}}))
	holder, err := sdb.Beginx()
	require.NoError(t, err)
	defer func() { _ = holder.Rollback() }()
	_, err = holder.Exec(`SELECT set_config('application_name', 'backfill k1 test', true)`)
	require.NoError(t, err)
	_, err = holder.Exec(`LOCK TABLE live IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	waiter := make(chan error, 1)
	go func() {
		_, err := sdb.ExecContext(ctx, `SELECT count(*) FROM live`)
		waiter <- err
	}()
	waitFor(t, "the waiter", func() bool { return read(lw, backfillthrottle.SignalScope{WorkerKeys: []string{"k1"}}) == 1 })
	require.Zero(t, read(lw, backfillthrottle.SignalScope{WorkerKeys: []string{"other"}}), "another run's worker")
	require.Equal(t, 1.0, read(lw, backfillthrottle.SignalScope{}), "any backfill session without keys")
	require.NoError(t, holder.Rollback())
	require.NoError(t, <-waiter)
}

// TestRowsPerSecondCapWaitsAndRecords: past its one second of burst,
// the cap makes claims wait for the rows read, and the waits are
// throttle periods of signal rows_per_second in the split.
func TestRowsPerSecondCapWaitsAndRecords(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	r := throttleRunner(t, db, "w1", func(c *Config) { c.RowsPerSecond = 10 }) // 60 rows: 50 past the burst, about 5 s of waits however slow the machine
	rep, err := r.Run(t.Context(), liveJob(nil))
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	ps, err := r.caps.throttlePeriods.ThrottlePeriods(t.Context(), r.db, rep.BatchID)
	require.NoError(t, err)
	require.NotEmpty(t, ps)
	for _, p := range ps {
		require.Equal(t, RateSignalName, p.Signal)
		require.NotNil(t, p.EndedAt)
	}
	ts, err := r.TimeSplit(t.Context(), rep.BatchID)
	require.NoError(t, err)
	require.Positive(t, ts.Throttled[RateSignalName])
	require.Equal(t, ts.Total, ts.Working+ts.Paused+ts.Idle+ts.Throttled[RateSignalName])
}

// TestHeldCallStopsWhenRunPausedElsewhere: a call held by a throttle
// stops, with ErrRunPaused, when the run is paused meanwhile (by another
// process's critical throttle or an operator).
func TestHeldCallStopsWhenRunPausedElsewhere(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	sig := &fakeSignal{}
	sig.set(5)
	r := throttleRunner(t, db, "w1", func(c *Config) { c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3}} })
	res := goRun(t.Context(), r, liveJob(nil))
	var batch int64
	waitFor(t, "the hold", func() bool {
		return db.Get(&batch, `SELECT batch_id FROM backfill.throttle_periods WHERE ended_at IS NULL`) == nil
	})
	require.NoError(t, r.cfg.Manifest.(*PGManifest).PauseRun(t.Context(), r.db, batch, "operator pause"))
	out := <-res
	require.ErrorIs(t, out.err, ErrRunPaused)
	require.Equal(t, RunPaused, out.rep.Status)
	require.Zero(t, out.rep.ChunksDone)
}

// TestProbeLatencyTimeoutIsASample: a probe cut off by the reading's
// deadline is a slow sample, not a skipped reading; a failing probe is
// an error.
func TestProbeLatencyTimeoutIsASample(t *testing.T) {
	t.Parallel()
	db := Postgres(pgtest.New(t))
	pr := backfillthrottle.ProbeLatencySignal(`SELECT pg_sleep(5)`, 99, time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	v, err := pr.Read(ctx, db, backfillthrottle.SignalScope{})
	require.NoError(t, err)
	require.GreaterOrEqual(t, v, 50.0, "at least the deadline, in ms")
	_, err = backfillthrottle.ProbeLatencySignal(`SELECT nonsense`, 99, time.Minute).Read(t.Context(), db, backfillthrottle.SignalScope{})
	require.ErrorContains(t, err, "probe_latency")
}

// TestProbeLatencyIncludesCommit: a probe's latency is its
// transaction's, commit included, as an application's is: a write probe
// whose commit takes 200 ms (a deferred constraint trigger sleeping,
// standing for a slow WAL flush) reads at least 200 ms.
func TestProbeLatencyIncludesCommit(t *testing.T) {
	t.Parallel()
	db := Postgres(pgtest.New(t))
	_, err := db.ExecContext(t.Context(), `CREATE TABLE probe_commit (id int);
		CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON probe_commit DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION slow_commit()`)
	require.NoError(t, err)
	pr := backfillthrottle.ProbeLatencySignal(`INSERT INTO probe_commit VALUES (1)`, 99, time.Minute)
	v, err := pr.Read(t.Context(), db, backfillthrottle.SignalScope{})
	require.NoError(t, err)
	require.GreaterOrEqual(t, v, 200.0, "the commit's 200 ms, in ms")
	var n int
	require.NoError(t, sqlx.GetContext(t.Context(), db, &n, `SELECT count(*) FROM probe_commit`))
	require.Equal(t, 1, n, "the probe committed")
}

// TestRaisedSignalHoldsEveryWorkerOfEveryProcess: two Runners on
// separate pools, Concurrency 2 each, work a job; the signal is raised
// mid-run. Once both have recorded their hold, no worker of either
// starts another chunk however many checks follow; lowered, the run
// completes. (Which chunks and how many ran is not asserted: no timing.)
func TestRaisedSignalHoldsEveryWorkerOfEveryProcess(t *testing.T) {
	t.Parallel()
	url := pgtest.NewURL(t)
	open := func() *sqlx.DB {
		db, err := sqlx.Open("postgres", url)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	db := open()
	_, err := db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	sig := &fakeSignal{}
	var started atomic.Int64
	job := liveJob(func(Chunk) {
		started.Add(1)
		time.Sleep(2 * time.Millisecond)
	})
	job.Chunker = IntRange(0, 2000, 10) // 200 chunks
	var rs []<-chan runResult
	for i := range 2 {
		r := throttleRunner(t, open(), fmt.Sprint("p", i), func(c *Config) {
			c.Concurrency = 2
			c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 10, Low: 5}}
		})
		rs = append(rs, goRun(t.Context(), r, job))
	}
	waitFor(t, "work", func() bool { return started.Load() >= 5 })
	sig.set(20)
	waitFor(t, "both processes' holds", func() bool {
		var n int
		return db.Get(&n, `SELECT count(DISTINCT worker_key) FROM backfill.throttle_periods WHERE ended_at IS NULL`) == nil && n == 2
	})
	afterChecks := func(n int64) {
		from := sig.reads.Load()
		waitFor(t, "more checks", func() bool { return sig.reads.Load() >= from+n })
	}
	afterChecks(4) // chunks that passed the check before the hold have begun
	held := started.Load()
	afterChecks(10)
	require.Equal(t, held, started.Load(), "a chunk began while every process held")
	require.Less(t, held, int64(200), "the run ended before the signal was raised")
	sig.set(0)
	for _, ch := range rs {
		out := <-ch
		require.NoError(t, out.err)
	}
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 2000, n)
}

// TestAdaptiveThrottleSlowsWithoutHolding: an adaptive throttle whose
// signal stays above High never holds the run: it cuts the rate, the run
// completes at the cut rate, and its waits are throttle periods of that
// signal (not of rows_per_second) naming the cut. Without a cap, the
// ceiling is the rate the call read before the first cut.
func TestAdaptiveThrottleSlowsWithoutHolding(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, r *Runner, batch int64, wantReason string) {
		ps, err := r.caps.throttlePeriods.ThrottlePeriods(t.Context(), r.db, batch)
		require.NoError(t, err)
		require.NotEmpty(t, ps, "the cut rate made no claim wait")
		for _, p := range ps {
			require.Equal(t, "fake", p.Signal, "reason %q", p.Reason)
			require.Contains(t, p.Reason, wantReason)
			require.NotNil(t, p.EndedAt)
		}
		ts, err := r.TimeSplit(t.Context(), batch)
		require.NoError(t, err)
		require.Positive(t, ts.Throttled["fake"])
		require.Equal(t, ts.Total, ts.Working+ts.Paused+ts.Idle+ts.Throttled["fake"])
	}
	t.Run("cap", func(t *testing.T) {
		t.Parallel()
		db := liveDB(t)
		sig := &fakeSignal{}
		sig.set(5) // above High from the first reading to the end
		r := throttleRunner(t, db, "w1", func(c *Config) {
			c.RowsPerSecond = 40 // 60 rows: unthrottled, 20 past the one-second burst
			c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3, Low: 1, MinHold: time.Hour, Adapt: true}}
		})
		rep, err := r.Run(t.Context(), liveJob(nil))
		require.NoError(t, err, "an adaptive throttle held the run")
		require.Equal(t, RunCompleted, rep.Status)
		require.EqualValues(t, 10*liveChunks, rep.Counts.Read)
		check(t, r, rep.BatchID, "rate cut to 20 rows/s (50 % of 40)")
	})
	t.Run("no cap", func(t *testing.T) {
		t.Parallel()
		db := liveDB(t)
		sig := &fakeSignal{}
		sig.set(0)
		r := throttleRunner(t, db, "w1", func(c *Config) {
			c.Concurrency = 1
			c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3, Low: 1, MinHold: time.Hour, Adapt: true}}
		})
		job := liveJob(func(c Chunk) {
			if c.Lo == 30 { // half the run read at full speed
				sig.set(5)
				// A few readings (as many as 50 ms make on an idle machine).
				seen, deadline := sig.reads.Load(), time.Now().Add(testwait.Timeout)
				for sig.reads.Load() < seen+5 && time.Now().Before(deadline) {
					time.Sleep(testwait.Poll)
				}
			}
		})
		rep, err := r.Run(t.Context(), job)
		require.NoError(t, err)
		require.Equal(t, RunCompleted, rep.Status)
		check(t, r, rep.BatchID, "rate cut to ")
	})
	t.Run("high from the start, no cap", func(t *testing.T) {
		t.Parallel()
		db := liveDB(t)
		sig := &fakeSignal{}
		sig.set(5) // the first cut finds nothing read: the first chunk sets the ceiling
		r := throttleRunner(t, db, "w1", func(c *Config) {
			c.Concurrency = 1
			c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3, Low: 1, MinHold: time.Hour, Adapt: true}}
		})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		res := goRun(ctx, r, liveJob(nil))
		waitFor(t, "a wait of the cut rate", func() bool {
			var n int
			return db.Get(&n, `SELECT count(*) FROM backfill.throttle_periods WHERE signal = 'fake'`) == nil && n >= 1
		})
		cancel()
		<-res
	})
}

// flakySignal reads v, or fails while broken.
type flakySignal struct {
	fakeSignal
	broken atomic.Bool
}

func (f *flakySignal) Read(ctx context.Context, db sqlx.ExtContext, s backfillthrottle.SignalScope) (float64, error) {
	if f.broken.Load() {
		f.reads.Add(1)
		return 0, fmt.Errorf("permission denied for view pg_stat_replication")
	}
	return f.fakeSignal.Read(ctx, db, s)
}

// TestUnreadableSignalFailsClosed: a signal that cannot be read at the
// start (a typo in its query, a bad setting) fails the run before any
// claim with ErrInvalidConfig naming the signal; one that stops being
// readable later holds the run (after a few failed readings) until it
// reads again, instead of letting the backfill run unthrottled.
func TestUnreadableSignalFailsClosed(t *testing.T) {
	t.Parallel()
	t.Run("at the start", func(t *testing.T) {
		t.Parallel()
		for _, sig := range []backfillthrottle.Signal{backfillthrottle.SQLSignal("replica_guard", "SELEC 1"), backfillthrottle.ProbeLatencySignal("SELECT 1", 950, time.Second),
			backfillthrottle.ProbeLatencySignal("SELECT 1", 99, 0)} {
			db := liveDB(t)
			r := throttleRunner(t, db, "w1", func(c *Config) {
				c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 1, Critical: 2}}
				// A reading's timeout is the interval, and only a reading
				// that fails, not one cut at its timeout, fails the run
				// at the start: at 10 ms a loaded machine cut the typo's
				// reading, and the run went on (then held for good).
				c.ThrottleInterval = time.Minute
			})
			rep, err := r.Run(testwait.Context(t, "the run with the unreadable signal "+sig.Name()), liveJob(nil))
			require.ErrorIs(t, err, ErrInvalidConfig, "%s", sig.Name())
			require.ErrorContains(t, err, "throttle signal "+sig.Name()+" cannot be read")
			require.Zero(t, rep.ChunksDone, "%s: chunks were claimed", sig.Name())
			requireRunFailedWith(t, db, rep, "throttle signal "+sig.Name()+" cannot be read")
		}
	})
	t.Run("never read", func(t *testing.T) {
		// The first reading is cut at its deadline (a slow server), and
		// the later ones fail: the signal has never read, so the run
		// fails as a deployment error instead of holding for good.
		t.Parallel()
		db := liveDB(t)
		sig := &cutThenBrokenSignal{}
		r := throttleRunner(t, db, "w1", func(c *Config) {
			c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 1}}
		})
		// Each chunk waits for the second reading, so the run cannot end
		// before the signal has failed.
		job := liveJob(func(Chunk) {
			for deadline := time.Now().Add(testwait.Timeout); sig.reads.Load() < 2 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		})
		rep, err := r.Run(testwait.Context(t, "the run with a signal that never read"), job)
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.ErrorContains(t, err, "throttle signal cut_then_broken cannot be read")
		require.ErrorContains(t, err, "relation \"missing\" does not exist")
		// Chunks may be claimed between the cut first reading and the
		// failed second one; none after it.
		require.Less(t, rep.ChunksDone, 6, "the run went on after the signal failed")
		require.GreaterOrEqual(t, sig.reads.Load(), int64(2))
		requireRunFailedWith(t, db, rep, "throttle signal cut_then_broken cannot be read")
	})
	t.Run("later", func(t *testing.T) {
		t.Parallel()
		db := liveDB(t)
		sig := &flakySignal{}
		sig.set(0)
		var read atomic.Int64
		job := liveJob(func(c Chunk) {
			if read.Add(1) == 2 {
				sig.broken.Store(true)
				before, deadline := sig.reads.Load(), time.Now().Add(testwait.Timeout)
				for sig.reads.Load() < before+hysteresis.UnreadableAfter+2 && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
		r := throttleRunner(t, db, "w1", func(c *Config) {
			c.Concurrency = 1
			c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3, Low: 1}}
		})
		res := goRun(testwait.Context(t, "the run whose signal stops being readable"), r, job)
		waitFor(t, "the unreadable signal's hold", func() bool {
			var n int
			return db.Get(&n, `SELECT count(*) FROM backfill.throttle_periods WHERE ended_at IS NULL`) == nil && n == 1
		})
		// The period says the signal is unreadable and keeps the last
		// value read, not a stand-in for infinity.
		var period struct {
			Value  float64 `db:"value"`
			Reason string  `db:"reason"`
		}
		require.NoError(t, db.Get(&period, `SELECT value, reason FROM backfill.throttle_periods WHERE ended_at IS NULL`))
		require.Zero(t, period.Value, "the last value read")
		require.Contains(t, period.Reason, "unreadable")
		// Held: a few more (failed) readings, and still no claim.
		held := sig.reads.Load()
		waitFor(t, "readings of the signal during the hold", func() bool { return sig.reads.Load() >= held+3 })
		require.EqualValues(t, 2, read.Load(), "a chunk was claimed while the signal could not be read")
		sig.broken.Store(false)
		out := testwait.Recv(t, "the run once the signal reads again", res)
		require.NoError(t, out.err)
		require.Equal(t, RunCompleted, out.rep.Status)
	})
}

// requireRunFailedWith checks that the run of rep is failed in the
// manifest, not left running, with a last_error containing msg.
func requireRunFailedWith(t *testing.T, db *sqlx.DB, rep Report, msg string) {
	t.Helper()
	require.NotZero(t, rep.BatchID)
	require.Equal(t, RunFailed, rep.Status)
	var run struct {
		Status    string `db:"status"`
		LastError string `db:"last_error"`
	}
	require.NoError(t, db.Get(&run, `SELECT status, last_error FROM backfill.runs WHERE batch_id = $1`, rep.BatchID))
	require.Equal(t, string(RunFailed), run.Status)
	require.Contains(t, run.LastError, msg)
}

// cutThenBrokenSignal's first reading lasts until its deadline; every
// later one fails at once.
type cutThenBrokenSignal struct{ reads atomic.Int64 }

func (s *cutThenBrokenSignal) Name() string { return "cut_then_broken" }
func (s *cutThenBrokenSignal) Read(ctx context.Context, _ sqlx.ExtContext, _ backfillthrottle.SignalScope) (float64, error) {
	if s.reads.Add(1) == 1 {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return 0, errors.New(`pq: relation "missing" does not exist`)
}

// TestSignalReadingCutByTheServerIsNotAConfigError: a first reading cut
// at its deadline comes back from lib/pq as the server's 57014 (the
// statement it cancelled), not as the context's error; it is a slow
// reading, not a deployment error, so the run goes on and completes once
// the signal reads.
func TestSignalReadingCutByTheServerIsNotAConfigError(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	_, err := db.Exec(`CREATE SEQUENCE signal_reads`)
	require.NoError(t, err)
	sig := backfillthrottle.SQLSignal("slow_first", `SELECT CASE WHEN nextval('signal_reads') = 1 THEN (SELECT 0 FROM pg_sleep(60)) ELSE 0 END`)
	r := throttleRunner(t, db, "w1", func(c *Config) {
		c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 1}}
		c.ThrottleInterval = 200 * time.Millisecond
	})
	rep, err := r.Run(testwait.Context(t, "the run whose first signal reading is cut"), liveJob(nil))
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	var reads int64
	require.NoError(t, db.Get(&reads, `SELECT last_value FROM signal_reads`))
	require.GreaterOrEqual(t, reads, int64(1), "the signal was read")
}

// calibratingSignal is a fakeSignal that says it calibrates
// (backfillthrottle.Calibrator) while cal is set.
type calibratingSignal struct {
	fakeSignal
	cal atomic.Bool
}

func (c *calibratingSignal) Calibrating() bool { return c.cal.Load() }

// TestCalibratingSignalHoldsTheCall: a signal that calibrates
// (backfillthrottle.Calibrator) holds the call from its first reading,
// before anything is claimed, whatever its value (here far above High,
// and the throttle adaptive: a calibration is a hold, not a rate cut);
// the hold is a throttle period of the signal saying so. Once the
// calibration ends, readings below Low let the run complete, and the
// watermarks apply again.
func TestCalibratingSignalHoldsTheCall(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	sig := &calibratingSignal{}
	sig.set(100)
	sig.cal.Store(true)
	var read atomic.Int64
	job := liveJob(func(Chunk) { read.Add(1) })
	r := throttleRunner(t, db, "w1", func(c *Config) {
		c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 1.3, Low: 1.1, Adapt: true}}
	})
	res := goRun(t.Context(), r, job)
	waitFor(t, "the calibration's period", func() bool {
		var n int
		return db.Get(&n, `SELECT count(*) FROM backfill.throttle_periods WHERE ended_at IS NULL AND reason LIKE '%calibrating%'`) == nil && n == 1
	})
	seen := sig.reads.Load()
	waitFor(t, "more readings while calibrating", func() bool { return sig.reads.Load() >= seen+3 })
	require.Zero(t, read.Load(), "a chunk was read while the signal calibrated")
	sig.set(1)
	sig.cal.Store(false)
	out := testwait.Recv(t, "the run after the calibration", res)
	require.NoError(t, out.err)
	require.Equal(t, RunCompleted, out.rep.Status)
	require.EqualValues(t, liveChunks, read.Load())

	ps, err := r.caps.throttlePeriods.ThrottlePeriods(t.Context(), r.db, out.rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ps, 1, "the calibration only: 1 is below Low")
	require.Equal(t, "fake", ps[0].Signal)
	require.Contains(t, ps[0].Reason, "calibrating")
	require.NotNil(t, ps[0].EndedAt)
	ts, err := r.TimeSplit(t.Context(), out.rep.BatchID)
	require.NoError(t, err)
	require.Positive(t, ts.Throttled["fake"], "the calibration counts as throttled time")
}

// TestAdaptiveCeilingLearntAgain: without a cap, the rate an adaptive
// throttle's cut applies to is the best the call read while no cut was
// in force, learnt again after each release: a first cut while the call
// read slowly (its chunks still growing) does not bound its later cuts.
func TestAdaptiveCeilingLearntAgain(t *testing.T) {
	t.Parallel()
	clock := time.Unix(1_000_000, 0)
	const interval = 250 * time.Millisecond
	h := &hysteresis.State{Throttle: backfillthrottle.Throttle{Signal: constSignal{"lag"}, High: 3, Low: 1, Adapt: true}, ConfigHigh: 3, ConfigLow: 1}
	th := &throttler{ex: &execution{log: discardLogger()}, interval: interval, now: func() time.Time { return clock },
		states: []*hysteresis.State{h}, pace: pacer.New(math.Inf(1)), changed: make(chan struct{})}
	// read reads rate rows per second for d, the signal at v at each
	// interval.
	read := func(d time.Duration, rate, v float64) {
		for end := clock.Add(d); clock.Before(end); clock = clock.Add(interval) {
			th.pace.Charge(clock, int64(rate*interval.Seconds()))
			th.adapt(h, v)
		}
	}
	read(10*time.Second, 1000, 0)
	th.adapt(h, 5)
	require.InDelta(t, 500, th.pace.Limit(), 60, "the first cut halves the rate read so far")
	read(11*time.Second, 500, 0)
	require.Equal(t, 1.0, h.Factor, "readings below Low gave the rate back")
	require.Greater(t, th.pace.Limit(), 1e12, "released: no limit")
	read(10*time.Second, 4000, 0)
	th.adapt(h, 5)
	require.InDelta(t, 2000, th.pace.Limit(), 240, "the cut after the release halves the rate read since, not the first ceiling")
	// A cut while one is in force does not learn from the cut rate.
	read(5*time.Second, 2000, 0)
	th.adapt(h, 5)
	require.Less(t, th.pace.Limit(), 2000.0)
}
