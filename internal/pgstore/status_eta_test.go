package pgstore

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfilltype"
)

// TestETABasisScaledToOneChunk: an ETA scaled down by a concurrency knob
// of 1 says "1 chunk at once", in the singular.
func TestETABasisScaledToOneChunk(t *testing.T) {
	m := NewManifest("")
	rate, rows, busy := 100.0, 1000.0, 20.0
	for _, c := range []struct {
		knob float64
		want string
	}{{1, "scaled to 1 chunk at once"}, {2, "scaled to 2 chunks at once"}} {
		s := backfilltype.Status{BatchID: 1, Status: backfilltype.RunRunning, Liveness: LivenessRunning, LiveWorkers: 1}
		r := statusRow{RecentRate: &rate, RemainingRows: &rows, RemainingChunks: 10, WindowWorking: 5}
		m.applyETA(&s, r, etaInputs{Busy: &busy, knobs: map[string]float64{KnobConcurrency: c.knob}})
		if !strings.Contains(s.ETABasis, c.want) {
			t.Errorf("basis %q, want it to contain %q", s.ETABasis, c.want)
		}
	}
}

// TestETAAfterKnobChange: a knob set within the recent window (here a
// throttle's watermark) makes the ETA use the rate since the change,
// throttle holds included, once it ran a second and committed rows;
// before that the recent rate, with the basis saying it is the rate
// before the change; a change before the window leaves the recent rate.
func TestETAAfterKnobChange(t *testing.T) {
	m := NewManifest("")
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	recent, remaining := 100.0, 1000.0
	row := statusRow{RecentRate: &recent, RemainingRows: &remaining, RemainingChunks: 10, WindowStart: t0, AsOf: t0.Add(20 * time.Second), WindowWorking: 20}
	key := KnobThrottleHigh("lag")
	eta := func(at time.Time, rows, subRows int64) backfilltype.Status {
		s := backfilltype.Status{BatchID: 1, Status: backfilltype.RunRunning, Liveness: LivenessRunning, LiveWorkers: 1}
		in := etaInputs{KnobAt: &at, KnobKey: &key, KnobRows: &rows, knobs: map[string]float64{}}
		in.sub.KnobRead = subRows
		m.applyETA(&s, row, in)
		return s
	}
	s := eta(t0.Add(10*time.Second), 40, 10) // 50 rows in the 10 s since
	require.InDelta(t, 5, *s.ETARate, 1e-9)
	require.InDelta(t, 200, *s.ETASeconds, 1e-9)
	require.Contains(t, s.ETABasis, "since knob throttle.lag.high was set at 2026-01-02 03:04:15Z, throttle holds included")

	s = eta(t0.Add(19500*time.Millisecond), 0, 0) // half a second ago, nothing committed since
	require.InDelta(t, 100, *s.ETARate, 1e-9)
	require.Contains(t, s.ETABasis, "the recent working rate before knob throttle.lag.high was set at 2026-01-02 03:04:24Z: too recent to measure its effect")
	require.Contains(t, s.String(), "too recent to measure its effect", "the status text says so")

	s = backfilltype.Status{BatchID: 1, Status: backfilltype.RunRunning, Liveness: LivenessRunning, LiveWorkers: 1}
	m.applyETA(&s, row, etaInputs{knobs: map[string]float64{}}) // no change in the window
	require.InDelta(t, 100, *s.ETARate, 1e-9)
	require.Equal(t, "the recent working rate", s.ETABasis)
}
