package backfill_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// TestExtractorBugFailsTheChunk: a row no data can make valid (a wrong
// number of values; a Go type no conversion accepts for its column) is an
// extractor bug: the chunk fails at once, without retry, with an error
// wrapping ErrExtractor that names the chunk, the row, the columns
// expected and what was passed; nothing is queued or loaded. Before, the
// rows were queued as bad data and the run completed with a nil error and
// nothing loaded.
func TestExtractorBugFailsTheChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		name   string
		row    []any
		ignore bool // the extractor ignores Write's error
		want   []string
	}{
		{"one value too many", []any{"acme", int64(5), "n", "1.00", nil, "extra"}, false,
			[]string{"wrong number of values: got 6, want 5", "tenant, id, name, amount, seen_at", "extra (string)"}},
		{"one value too few, error ignored", []any{"acme", int64(5), "n", "1.00"}, true,
			[]string{"wrong number of values: got 4, want 5"}},
		{"struct into bigint", []any{"acme", struct{ ID int }{5}, "n", "1.00", nil}, false,
			[]string{`column "id" (bigint, value 2 of 5)`, "wrong type struct { ID int }", "{5} (struct { ID int })"}},
		{"chan into bigint, error ignored", []any{"acme", make(chan int), "n", "1.00", nil}, true,
			[]string{`column "id"`, "wrong type chan int"}},
		{"bool into timestamptz", []any{"acme", int64(5), "n", "1.00", true}, false,
			[]string{`column "seen_at"`, "wrong type bool"}},
		{"int into text", []any{"acme", int64(5), 42, "1.00", nil}, false,
			[]string{`column "name"`, "wrong type int"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newItems(t)
			var calls atomic.Int64
			job := s.job(1)
			job.Chunker = backfill.IntRange(0, 20, 10)
			job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
				calls.Add(1)
				for id := ch.Lo; id < ch.Hi; id++ {
					row := []any{"acme", id, "x", "1.00", nil}
					if id == 13 {
						row = c.row
					}
					if err := w.Write(ctx, row...); err != nil && !c.ignore {
						return err
					}
				}
				return nil
			})
			r, err := backfill.New(s.db, &backfill.Config{RetryBackoff: 1})
			require.NoError(t, err)
			rep, err := r.Run(ctx, job)
			require.ErrorIs(t, err, backfill.ErrExtractor)
			require.False(t, backfill.IsRetryable(err))
			var ce *backfill.ChunkError
			require.True(t, errors.As(err, &ce))
			require.Equal(t, "int:10/20", ce.Chunk.ID)
			msg := ce.Error()
			for _, want := range append(c.want, "int:10/20 row 4", "columns tenant, id, name, amount, seen_at") {
				require.Contains(t, msg, want)
			}
			require.Equal(t, backfill.RunFailed, rep.Status)
			require.EqualValues(t, 2, calls.Load(), "the failed chunk is not retried")
			require.Equal(t, backfill.Counts{Read: 10, Inserted: 10}, rep.Counts, "only the first chunk")
			ex, err := backfill.NewPGManifest("").Exceptions(ctx, s.db, rep.BatchID)
			require.NoError(t, err)
			require.Empty(t, ex)
		})
	}
}

// TestBadDataIsNotAnExtractorBug: a value of a type the column takes that
// the column cannot hold is queued, and the chunk goes on.
func TestBadDataIsNotAnExtractorBug(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	job := s.job(1)
	job.Chunker = backfill.IntRange(0, 1, 1)
	job.MaxRunRejectRate = -1
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
		for _, row := range [][]any{
			{"acme", "x", "text for bigint", "1.00", nil},
			{"acme", uint64(1 << 63), "uint64 out of range", "1.00", nil},
			{"acme", 1.5, "fraction", "1.00", nil},
			{"acme", int64(1), "numeric overflow", 1e12, nil},
			{"acme", int64(2), "not a time", "1.00", "yesterday-ish"},
			{"acme", int64(3), "ok", "1.00", nil},
		} {
			if err := w.Write(ctx, row...); err != nil {
				return err
			}
		}
		return nil
	})
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, backfill.Counts{Read: 6, Inserted: 1, Rejected: 5}, rep.Counts)
}

// TestRunRejectGateIsOnByDefault: without Job.MaxRunRejectRate a run that
// rejects more than DefaultMaxRunRejectRate of its rows pauses; a rate
// can be set, and a negative one turns the gate off. A run that loaded
// none of the rows it read never completes with a nil error, even with
// the gate off: it pauses, and completes once resumed.
func TestRunRejectGateIsOnByDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// rejectEvery rejects every n-th row (n 1: all of them).
	run := func(t *testing.T, s *itemsSetup, rate float64, n int64) (backfill.Report, error) {
		job := s.job(1)
		job.Chunker = backfill.IntRange(0, 100, 50)
		job.MaxRunRejectRate = rate
		job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
			for id := ch.Lo; id < ch.Hi; id++ {
				amount := "1.00"
				if id%n == 0 {
					amount = "1e20" // numeric(10,2) overflow: queued
				}
				if err := w.Write(ctx, "acme", id, "x", amount, nil); err != nil {
					return err
				}
			}
			return nil
		})
		r, err := backfill.New(s.db, nil)
		require.NoError(t, err)
		return r.Run(ctx, job)
	}
	t.Run("default pauses above 10%", func(t *testing.T) {
		t.Parallel()
		rep, err := run(t, newItems(t), 0, 5) // 20%
		require.ErrorIs(t, err, backfill.ErrGateFailed)
		require.Contains(t, err.Error(), "run reject rate 10/50")
		require.Equal(t, backfill.RunPaused, rep.Status)
	})
	t.Run("default passes at 10%", func(t *testing.T) {
		t.Parallel()
		rep, err := run(t, newItems(t), 0, 10)
		require.NoError(t, err)
		require.Equal(t, backfill.RunCompleted, rep.Status)
	})
	t.Run("overridden", func(t *testing.T) {
		t.Parallel()
		rep, err := run(t, newItems(t), 0.25, 5)
		require.NoError(t, err)
		require.Equal(t, backfill.RunCompleted, rep.Status)
	})
	t.Run("off", func(t *testing.T) {
		t.Parallel()
		rep, err := run(t, newItems(t), -1, 2)
		require.NoError(t, err)
		require.Equal(t, backfill.RunCompleted, rep.Status)
	})
	for _, rate := range []float64{0, 1, -1} {
		t.Run("all rejected", func(t *testing.T) {
			t.Parallel()
			s := newItems(t)
			rep, err := run(t, s, rate, 1)
			require.ErrorIs(t, err, backfill.ErrGateFailed, "rate %v", rate)
			require.NotEqual(t, backfill.RunCompleted, rep.Status)
			require.Zero(t, rep.Counts.Inserted)
			if rate < 0 || rate >= 1 {
				require.Contains(t, err.Error(), "no row loaded: all 100 rows read were rejected")
				require.Equal(t, 2, rep.ChunksDone)
			}
			r, err := backfill.New(s.db, nil)
			require.NoError(t, err)
			job := s.job(1)
			job.Chunker = backfill.IntRange(0, 100, 50)
			job.MaxRunRejectRate = rate
			if rate == 0 {
				return // paused after the first chunk; resuming runs the second
			}
			rep, err = r.Resume(ctx, job, "tester", "the source is empty on purpose")
			require.NoError(t, err)
			require.Equal(t, backfill.RunCompleted, rep.Status)
		})
	}
}
