package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestAbandonedRunStopsWriting: a worker of a run that a newer run
// abandoned (Job.NewRun, code v2) must not write over the newer run.
func TestAbandonedRunStopsWriting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	started := make(chan struct{})
	var once atomic.Bool
	slow := s.job(1)
	slow.Chunker = backfill.IntRange(0, 400, 10)
	inner := slow.Extractor
	slow.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if once.CompareAndSwap(false, true) {
			close(started)
		}
		time.Sleep(5 * time.Millisecond)
		return inner.Extract(ctx, c, w)
	})
	r1, err := backfill.New(s.db, &backfill.Config{Concurrency: 2, WorkerID: "old"})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := r1.Run(ctx, slow)
		done <- err
	}()
	<-started
	fresh := s.job(2) // other names for every tenth id
	fresh.Chunker = slow.Chunker
	fresh.CodeVersion = "v2"
	fresh.NewRun = true
	r2, err := backfill.New(s.db, &backfill.Config{WorkerID: "new"})
	require.NoError(t, err)
	rep, err := r2.Run(ctx, fresh)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.ErrorIs(t, <-done, backfill.ErrRunAbandoned)

	var stale int
	require.NoError(t, s.db.Get(&stale, `SELECT count(*) FROM items WHERE id % 10 = 0 AND name NOT LIKE 'v2-%'`))
	require.Zero(t, stale, "no row of the abandoned run written after the new run")
	var late int
	require.NoError(t, s.db.Get(&late, `SELECT count(*) FROM backfill.chunks c JOIN backfill.chunks n ON n.chunk_id = c.chunk_id
		WHERE c.batch_id = 1 AND n.batch_id = $1 AND c.status = 'done' AND c.finished_at > n.started_at`, rep.BatchID))
	require.Zero(t, late, "the old run completed no chunk after the new run started it")
}

func TestTriggerThatDropsRowsFailsTheChunk(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text);
		CREATE FUNCTION drop_odd() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN IF NEW.id % 2 = 1 THEN RETURN NULL; END IF; RETURN NEW; END $$;
		CREATE TRIGGER drop_odd BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION drop_odd();`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(context.Background(), backfill.Job{Name: "t", Chunker: backfill.IntRange(0, 20, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for i := c.Lo; i < c.Hi; i++ {
				if err := w.Write(ctx, i, "x"); err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "t", Key: []string{"id"}}})
	require.ErrorIs(t, err, backfill.ErrAccounting)
	require.Contains(t, err.Error(), "trigger")
}

func TestExtractorPanicFailsOnlyTheChunk(t *testing.T) {
	t.Parallel()
	s := newItems(t)
	job := s.job(1)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Lo == 300 {
			var m []int
			_ = m[c.Lo] // index out of range: a bug in the extractor
		}
		return inner.Extract(ctx, c, w)
	})
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), job)
	require.ErrorIs(t, err, backfill.ErrExtractorPanic)
	require.Contains(t, err.Error(), "index out of range")
	require.False(t, backfill.IsRetryable(err))
	require.Equal(t, 3, rep.ChunksDone)
	cs := manifestChunks(t, s.db, rep.BatchID)
	require.Equal(t, 1, cs[3].Attempts, "a panic is not retried")
}

// TestOtherUniqueViolationsAreNotRetried: a row that violates a unique
// constraint other than the business key's is refused (queued, the rest
// of the chunk merges), never retried; when no refusal is allowed
// (MaxMergeRefusals < 0) the chunk fails at once, naming the row and the
// constraint, without a retry.
func TestOtherUniqueViolationsAreNotRetried(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{0, -1} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			// The key index has INCLUDE columns (still the key); email is another unique constraint.
			_, err := db.Exec(`CREATE TABLE users (id int NOT NULL, email text UNIQUE, name text);
				CREATE UNIQUE INDEX users_key ON users (id) INCLUDE (name);`)
			require.NoError(t, err)
			var calls atomic.Int32
			r, err := backfill.New(db, &backfill.Config{MaxAttempts: 5, RetryBackoff: time.Millisecond, MaxMergeRefusals: limit})
			require.NoError(t, err)
			rep, err := r.Run(context.Background(), backfill.Job{Name: "users", Chunker: backfill.List("a"),
				Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
					calls.Add(1)
					for i := range 3 {
						if err := w.Write(ctx, int64(i), "same@example.com", fmt.Sprint(i)); err != nil {
							return err
						}
					}
					return nil
				}),
				Rollback:         backfill.RollbackNone,
				MaxRunRejectRate: -1, // two of three rows are refused on purpose
				Target:           backfill.Target{Table: "users", Key: []string{"id"}}})
			require.Equal(t, int32(1), calls.Load(), "not retried")
			if limit < 0 {
				var pe *backfill.PartialError
				require.True(t, errors.As(err, &pe), "%v", err)
				require.ErrorIs(t, err, backfill.ErrTooManyRejects)
				require.Contains(t, err.Error(), `row 2 key (1) refused by the target: duplicate key value violates unique constraint "users_email_key" (SQLSTATE 23505)`)
				return
			}
			require.NoError(t, err)
			require.Equal(t, backfill.Counts{Read: 3, Inserted: 1, Rejected: 2}, rep.Counts)
			var ids []int
			require.NoError(t, db.Select(&ids, `SELECT id FROM users`))
			require.Equal(t, []int{0}, ids)
		})
	}
}

func TestTypesWithoutEqualityReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TYPE pair AS (doc json, n int);
		CREATE TABLE docs (id int PRIMARY KEY, tags json[], p pair, pt point)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := func(newRun bool, tag string) backfill.Job {
		return backfill.Job{Name: "docs", NewRun: newRun, Chunker: backfill.List("a"),
			Extractor: rowsFunc([]any{int64(1), `{"{\"a\": 1}","` + tag + `"}`, `("{\"x\": 2}",3)`, "(1,2)"}),
			Rollback:  backfill.RollbackNone,
			Target:    backfill.Target{Table: "docs", Key: []string{"id"}}}
	}
	_, err = r.Run(ctx, job(false, "{}"))
	require.NoError(t, err)
	rep, err := r.Run(ctx, job(true, "{}"))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1, Unchanged: 1}, rep.Counts)
	rep, err = r.Run(ctx, job(true, "[]"))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1, Updated: 1}, rep.Counts)
}

func TestNondeterministicCollationKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		CREATE TABLE fruit (name text COLLATE ci PRIMARY KEY, n int)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), backfill.Job{Name: "fruit", Chunker: backfill.List("a"),
		Extractor: rowsFunc([]any{"Apple", int64(1)}, []any{"APPLE", int64(2)}, []any{"pear", int64(3)}),
		Rollback:  backfill.RollbackNone,
		Target:    backfill.Target{Table: "fruit", Key: []string{"name"}}})
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 3, Inserted: 2, Deduplicated: 1}, rep.Counts, "Apple and APPLE are one key under the collation")
}
