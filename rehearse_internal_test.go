package backfill

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProjectRows projects chunks whose cost is exactly 1 s plus 1 ms a
// row, WAL 100 bytes a row, from three rehearsed chunks onto a plan of
// ten chunks with estimates twice the rows read.
func TestProjectRows(t *testing.T) {
	t.Parallel()
	chunk := func(read int64) RehearsalChunk {
		return RehearsalChunk{EstimatedRows: 2 * read, Counts: Counts{Read: read, Inserted: read},
			Duration: time.Second + time.Duration(read)*time.Millisecond, WALBytes: 100 * read, TargetBytes: 10 * read,
			IndexBytes: 5 * read, UndoBytes: 2 * read, HeapBaseBytes: 1000, HeapBytes: 1000 + 3*read}
	}
	rcs := []RehearsalChunk{chunk(100), chunk(400), chunk(1000)}
	est := []int64{200, 200, 400, 400, 800, 800, 1000, 1000, 2000, 2000} // rows: half
	f := project(rcs, est, len(est), 2, 0)
	require.Equal(t, "rows", f.Basis)
	require.Equal(t, 10, f.Chunks)
	require.Equal(t, int64(4400), f.Rows)
	// 10 chunks × 1 s + 4400 rows × 1 ms = 14.4 s of chunks; 7.2 s over
	// two workers, ±10% (the fit is exact); the high end adds the
	// longest chunk (2 s), +10%.
	require.InDelta(t, 7.2, f.Duration.Seconds(), 1e-6)
	require.InDelta(t, 0.9*7.2, f.DurationLow.Seconds(), 1e-6)
	require.InDelta(t, 1.1*7.2+1.1*2, f.DurationHigh.Seconds(), 1e-6)
	require.Equal(t, int64(440_000), f.WALBytes)
	require.Equal(t, int64(44_000), f.TargetBytes)
	require.Equal(t, int64(22_000), f.IndexBytes)
	require.Equal(t, int64(8_800), f.UndoBytes)
	require.Equal(t, int64(1000+2*3000), f.HeapBytes)

	// A chunk twice as slow as the fit widens the range to its ratio.
	slow := rcs[1]
	slow.Duration = 2 * (time.Second + 400*time.Millisecond)
	f = project([]RehearsalChunk{rcs[0], slow, rcs[2]}, est, len(est), 1, 0)
	require.Greater(t, f.DurationHigh, 2*f.DurationLow)
}

// TestProjectChunks projects without estimates: every chunk at the mean
// of the rehearsed ones.
func TestProjectChunks(t *testing.T) {
	t.Parallel()
	rcs := []RehearsalChunk{
		{EstimatedRows: -1, Counts: Counts{Read: 10}, Duration: 1 * time.Second, WALBytes: 1000},
		{EstimatedRows: -1, Counts: Counts{Read: 30}, Duration: 3 * time.Second, WALBytes: 3000},
	}
	f := project(rcs, nil, 8, 1, 0)
	require.Equal(t, "chunks", f.Basis)
	require.Equal(t, int64(160), f.Rows)
	require.Equal(t, int64(16000), f.WALBytes)
	// 8 × 2 s; each chunk at 0.5 and 1.5 times the mean.
	require.InDelta(t, 8.0, f.DurationLow.Seconds(), 1e-6)
	require.InDelta(t, 16*1.5+2*1.5, f.DurationHigh.Seconds(), 1e-6)
}

// TestProjectOverhead: the run's leases, commits, start and end, which
// rehearsed chunks do not pay, are added to each bound of the duration;
// the run's creation's WAL to the WAL.
func TestProjectOverhead(t *testing.T) {
	t.Parallel()
	rcs := []RehearsalChunk{
		{EstimatedRows: -1, Counts: Counts{Read: 10}, Duration: time.Second, WALBytes: 1000, RunStart: 30 * time.Millisecond, RunStartWALBytes: 700},
		{EstimatedRows: -1, Counts: Counts{Read: 10}, Duration: time.Second, WALBytes: 1000, RunStart: 20 * time.Millisecond, RunStartWALBytes: 600},
	}
	bare := project(rcs, nil, 100, 2, 0)
	f := project(rcs, nil, 100, 2, 5*time.Millisecond)
	// 100 chunks × 2 commits × 5 ms over 2 workers = 500 ms, plus the
	// quickest start (20 ms) and 2 commits (10 ms).
	require.Equal(t, 530*time.Millisecond, f.Overhead)
	require.Equal(t, 5*time.Millisecond, f.CommitTime)
	require.Equal(t, 20*time.Millisecond, f.RunStart)
	require.Equal(t, 20*time.Millisecond, bare.Overhead, "no commit time: the start alone")
	require.Equal(t, bare.Duration+510*time.Millisecond, f.Duration)
	require.Equal(t, bare.DurationLow+510*time.Millisecond, f.DurationLow)
	require.Equal(t, bare.DurationHigh+510*time.Millisecond, f.DurationHigh)
	require.Equal(t, int64(100*1000+600), f.WALBytes)
}

// TestFitLine: the least-squares line, through the origin when its
// intercept would be negative or the sizes do not differ.
func TestFitLine(t *testing.T) {
	t.Parallel()
	f := fitLine([]float64{1, 2, 3}, []float64{3, 5, 7})
	require.InDelta(t, 21.0, f(10), 1e-9)
	f = fitLine([]float64{1, 2, 3}, []float64{0, 5, 10}) // intercept -5
	require.InDelta(t, 15.0/6*4, f(4), 1e-9)
	f = fitLine([]float64{5, 5}, []float64{10, 20})
	require.InDelta(t, 3.0*10, f(10), 1e-9)
	f = fitLine([]float64{0, 0}, []float64{4, 6})
	require.InDelta(t, 5.0, f(100), 1e-9)
}

// TestRehearsalSample: the default sample in plan order and by estimate,
// and chunks named by ID or Seq.
func TestRehearsalSample(t *testing.T) {
	t.Parallel()
	chunks := make([]Chunk, 7)
	for i := range chunks {
		chunks[i] = Chunk{Seq: i, ID: "c" + string(rune('a'+i))}
	}
	got, err := rehearsalSample(chunks, nil, RehearseOptions{})
	require.NoError(t, err)
	require.Equal(t, []int{0, 3, 6}, got)
	got, err = rehearsalSample(chunks, nil, RehearseOptions{Sample: 5})
	require.NoError(t, err)
	require.Equal(t, []int{0, 2, 3, 5, 6}, got)
	got, err = rehearsalSample(chunks, nil, RehearseOptions{Sample: 20})
	require.NoError(t, err)
	require.Len(t, got, 7)
	est := []int64{70, 10, 60, 20, 50, 30, 40}
	got, err = rehearsalSample(chunks, est, RehearseOptions{})
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 6}, got, "smallest (1), median (6), largest (0), in plan order")
	got, err = rehearsalSample(chunks, est, RehearseOptions{Chunks: []string{"cc", "5", "cc"}})
	require.NoError(t, err)
	require.Equal(t, []int{2, 5}, got)
	_, err = rehearsalSample(chunks, est, RehearseOptions{Chunks: []string{"nope"}})
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = rehearsalSample(nil, nil, RehearseOptions{})
	require.ErrorIs(t, err, ErrEmptyScope)
}

// TestProjectDurationRobust: one rehearsed chunk of five that stalled
// (three times its time) widens the forecast's range but does not move
// its duration, which a least-squares line through the five would.
func TestProjectDurationRobust(t *testing.T) {
	t.Parallel()
	chunk := func(read int64, stall time.Duration) RehearsalChunk {
		return RehearsalChunk{EstimatedRows: read, Counts: Counts{Read: read}, Duration: time.Second + time.Duration(read)*time.Millisecond + stall}
	}
	est := []int64{100, 200, 400, 800, 1000, 100, 200, 400, 800, 1000}
	even := []RehearsalChunk{chunk(100, 0), chunk(200, 0), chunk(400, 0), chunk(800, 0), chunk(1000, 0)}
	want := project(even, est, len(est), 1, 0)
	require.InDelta(t, 10+2*2.5, want.Duration.Seconds(), 1e-6)
	stalled := slices.Clone(even)
	stalled[2] = chunk(400, 2*(time.Second+400*time.Millisecond))
	f := project(stalled, est, len(est), 1, 0)
	require.InDelta(t, want.Duration.Seconds(), f.Duration.Seconds(), 1e-6, "the stalled chunk moved the forecast")
	require.Greater(t, f.DurationHigh, want.DurationHigh, "the stalled chunk widens the range")
	ls := fitLine([]float64{100, 200, 400, 800, 1000}, []float64{1.1, 1.2, 3 * 1.4, 1.8, 2.0})
	require.Greater(t, math.Abs(ls(500)-1.5)/1.5, 0.1, "least squares through the stall is off by more than 10%")
}
