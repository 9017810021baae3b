package backfill

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfilltype"
)

// TestAdaptRateShrinksFastGrowsSlowly: while transactions are short
// the rate is the last reading (at most adaptGrowth times the one
// before); then a moving average of the logarithm of the readings that
// falls fast and rises slowly; the rows wanted stay within the bounds.
func TestAdaptRateShrinksFastGrowsSlowly(t *testing.T) {
	var a adaptState
	target := time.Second
	lim := adaptLimits{target: target, minRows: 100, maxRows: 5000}
	require.Equal(t, float64(adaptBootstrapRows), a.wantRows(lim), "no rate yet: the bootstrap")
	a.observe(100, 100, 100*time.Millisecond, target) // 1000 rows/s in a short transaction
	require.InDelta(t, 1000, a.wantRows(lim), 1e-9)
	a.observe(1000, 100, 100*time.Millisecond, target) // 10000 rows/s, short: at most 4× up
	require.InDelta(t, 4000, a.rate, 1e-9)
	a.observe(3000, 100, time.Second, target) // 3000 rows/s over half the target: warm
	require.InDelta(t, 3000, a.rate, 1e-9)
	require.True(t, a.warm)
	a.observe(750, 100, time.Second, target) // a quarter: down half the way (in the logarithm)
	require.InDelta(t, 1500, a.rate, 1e-9)
	a.observe(3000, 100, time.Second, target) // twice: up a fifth of the way
	require.InDelta(t, 1500*math.Pow(2, 0.2), a.rate, 1e-9)
	for range 40 {
		a.observe(2000, 100, time.Second, target)
	}
	require.InDelta(t, 2000, a.rate, 1, "steady readings: the estimate reaches them")
	a.rate = 1e9
	require.InDelta(t, 5000/adaptOversize, a.wantRows(lim), 1e-9, "capped by maxRows: a sub-chunk of the oversize margin over it stays within it")
	a.rate = 1
	require.Equal(t, float64(100), a.wantRows(lim), "at least minRows")

	// A timeout caps the rows at half of what timed out, raised by a
	// quarter by each commit near the cap.
	a.rate = 1e6
	a.timedOut(800, time.Second)
	require.Equal(t, float64(400), a.wantRows(adaptLimits{target: time.Hour, minRows: 1}))
	a.observe(390, 10, time.Millisecond, time.Hour)
	require.Equal(t, float64(500), a.wantRows(adaptLimits{target: time.Hour, minRows: 1}))
	a.observe(490, 10, time.Millisecond, time.Hour)
	require.Equal(t, float64(625), a.wantRows(adaptLimits{target: time.Hour, minRows: 1}))
	a.observe(620, 10, time.Millisecond, time.Hour)
	require.Equal(t, float64(640), a.wantRows(adaptLimits{target: time.Hour, minRows: 1}), "never above 0.8 × the rows that timed out")
}

// TestAdaptSpanFor: the span of the rows wanted at a density, at least
// the least span, the rest divided into equal sub-chunks.
func TestAdaptSpanFor(t *testing.T) {
	require.Equal(t, uint64(100), spanFor(100, 0, 1, 100), "unknown density: the rest")
	require.Equal(t, uint64(100), spanFor(1000, 1, 1, 100), "fits: the rest")
	require.Equal(t, uint64(2), spanFor(100, 50, 1, 100))
	require.Equal(t, uint64(84), spanFor(100, 1, 1, 250), "250 in 3 equal spans, not 100+100+50")
	require.Equal(t, uint64(120), spanFor(100, 1, 1, 120), "at most 1.2 × the rows wanted: whole")
	require.Equal(t, uint64(61), spanFor(100, 1, 1, 121), "over 1.2 ×: two halves")
	require.Equal(t, uint64(100), spanFor(100, 1, 1, 200))
	require.Equal(t, uint64(1), spanFor(1, 1000, 1, 100), "at least the least span")
}

// TestAdaptSubchunkOf: sub-chunks are half-open sub-intervals of their
// plan chunk with its Seq and ID; the last ends at the plan chunk's end;
// offsets parse back from the manifest's bounds.
func TestAdaptSubchunkOf(t *testing.T) {
	c := Chunk{ID: "int:-5/95", Seq: 7, Kind: backfilltype.KindInt, Lo: -5, Hi: 95}
	s := subchunkOf(c, 10, 20)
	require.Equal(t, Chunk{ID: c.ID, Seq: 7, Kind: backfilltype.KindInt, Lo: 5, Hi: 25}, s)
	require.Equal(t, "int:5/25", subchunkID(s))
	require.Equal(t, int64(95), subchunkOf(c, 90, 50).Hi, "clipped")
	off, err := subOffset(c, "25")
	require.NoError(t, err)
	require.Equal(t, uint64(30), off)
	_, err = subOffset(c, "96")
	require.Error(t, err)

	loc, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	start := time.Date(2024, 3, 10, 0, 0, 0, 0, loc)
	tc := Chunk{ID: "time:x", Seq: 1, Kind: backfilltype.KindTime, Start: start, End: start.AddDate(0, 0, 1)}
	w, m := chunkWidth(tc)
	require.Equal(t, uint64(23*time.Hour), w, "the day of the change to daylight saving time")
	require.Equal(t, uint64(time.Millisecond), m)
	ts := subchunkOf(tc, uint64(time.Hour), uint64(2*time.Hour))
	require.Equal(t, start.Add(time.Hour), ts.Start)
	require.Equal(t, start.Add(3*time.Hour), ts.End)
	require.Equal(t, loc, ts.Start.Location())
	_, hi := ts.Bounds()
	off, err = subOffset(tc, hi)
	require.NoError(t, err)
	require.Equal(t, uint64(3*time.Hour), off)
	require.True(t, subchunkOf(tc, uint64(22*time.Hour), uint64(5*time.Hour)).End.Equal(tc.End))
}

// TestAdaptAlignSpan: a time chunk's sub-chunk spans are whole
// microseconds (at least one), short of the rest; an int chunk's are
// left as they are.
func TestAdaptAlignSpan(t *testing.T) {
	day := time.Date(2024, 3, 10, 0, 0, 0, 0, time.UTC)
	tc := Chunk{Kind: backfilltype.KindTime, Start: day, End: day.Add(time.Hour)}
	rest := uint64(time.Hour)
	for _, span := range []uint64{714286, 999, 1, 156250, 2_500_000} {
		got := alignSpan(tc, span, rest)
		require.Zero(t, got%uint64(time.Microsecond), "span %d", span)
		require.LessOrEqual(t, got, max(span, uint64(time.Microsecond)))
		require.Greater(t, got, uint64(0))
	}
	require.Equal(t, uint64(1234567), alignSpan(tc, 1234567, 1234567), "the rest as it is")
	ic := Chunk{Kind: backfilltype.KindInt, Lo: 0, Hi: 1000}
	require.Equal(t, uint64(333), alignSpan(ic, 333, 1000))
}
