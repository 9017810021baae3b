package backfill_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestConcurrentStartsUnderAnyDefaultIsolation starts one job from six
// processes at once (each its own pool and Runner) on a fresh manifest
// schema, with the database's default_transaction_isolation set to each
// level: Init, StartRun and every other transaction must set their own
// level or retry 40001/40P01, so all starts converge on one batch and
// every chunk is merged exactly once. The same through PgBouncer in
// transaction mode ("pooler/"), whose server connections the six processes
// share.
func TestConcurrentStartsUnderAnyDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"direct", "pooler"} {
		for _, level := range []string{"read committed", "repeatable read", "serializable"} {
			t.Run(via+"/"+level, func(t *testing.T) {
				t.Parallel()
				concurrentStarts(t, via, level)
			})
		}
	}
}

func concurrentStarts(t *testing.T, via, level string) {
	ctx := context.Background()
	var u, adminURL string
	if via == "pooler" {
		u = pgtest.NewPoolerURL(t)
		adminURL = directURL(t, u)
	} else {
		u = pgtest.NewURL(t)
		adminURL = u
	}
	admin, err := sqlx.Open("postgres", adminURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	_, err = admin.Exec(`CREATE TABLE items (
				tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2),
				seen_at timestamptz, backfill_inserted_by bigint, backfill_updated_by bigint,
				PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
	_, err = admin.Exec(fmt.Sprintf(`DO $$ BEGIN EXECUTE format('ALTER DATABASE %%I SET default_transaction_isolation = %%L', current_database(), '%s'); END $$`, level))
	require.NoError(t, err)

	s := &itemsSetup{}
	const n = 6
	dbs := make([]*sqlx.DB, n)
	for i := range n {
		dbs[i], err = sqlx.Open("postgres", u)
		require.NoError(t, err)
		db := dbs[i]
		t.Cleanup(func() { _ = db.Close() })
		var got string
		require.NoError(t, db.Get(&got, `SHOW default_transaction_isolation`))
		require.Equal(t, level, got)
	}
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		reps  = make([]backfill.Report, n)
		errs  = make([]error, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := backfill.New(dbs[i], &backfill.Config{Concurrency: 2, WorkerID: fmt.Sprintf("w%d", i)})
			if err != nil {
				errs[i] = err
				return
			}
			reps[i], errs[i] = r.Run(ctx, s.job(1))
		}()
	}
	close(start)
	wg.Wait()
	total := 0
	for i := range n {
		if errs[i] != nil {
			// A start after the others completed the run did
			// nothing and says so; any other error is a failure.
			require.ErrorIs(t, errs[i], backfill.ErrAlreadyCompleted, "worker %d", i)
			require.Zero(t, reps[i].ChunksRun)
		}
		total += reps[i].ChunksRun
		require.Equal(t, reps[0].BatchID, reps[i].BatchID, "worker %d", i)
	}
	require.Equal(t, 10, total)
	var batches int
	require.NoError(t, admin.Get(&batches, `SELECT count(*) FROM backfill.runs`))
	require.Equal(t, 1, batches)
	calls := 0
	s.calls.Range(func(k, v any) bool {
		calls++
		require.Equal(t, int64(1), v.(*atomic.Int64).Load(), k)
		return true
	})
	require.Equal(t, 10, calls)
	var bad int
	require.NoError(t, admin.Get(&bad, `SELECT count(*) FROM backfill.chunks WHERE status <> 'done'
				OR rows_read <> rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated
				OR rows_read <> 100`))
	require.Zero(t, bad)
	var status string
	require.NoError(t, admin.Get(&status, `SELECT status FROM backfill.runs`))
	require.Equal(t, "completed", status)
	var rows int
	require.NoError(t, admin.Get(&rows, `SELECT count(*) FROM items`))
	require.Equal(t, 1000, rows)
}

// TestChunkRetriesSerializationFailureAndDeadlock: a chunk's transaction
// that PostgreSQL aborts with serialization_failure (40001) or
// deadlock_detected (40P01) is retried as a wait (Config.LockRetries),
// without counting toward MaxAttempts (1 here), the retry commits the
// chunk once, and each wait is recorded in the manifest. A trigger on the
// target raises each error once, counted by a sequence (which a rollback
// does not undo).
func TestChunkRetriesSerializationFailureAndDeadlock(t *testing.T) {
	t.Parallel()
	for _, code := range []pqerror.Code{"40001", "40P01"} {
		require.True(t, backfill.IsRetryable(&pq.Error{Code: code}), code)
	}
	ctx := context.Background()
	s := newItems(t)
	_, err := s.db.Exec(`CREATE SEQUENCE merges;
		CREATE FUNCTION fail_twice() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			CASE nextval('merges')
			WHEN 1 THEN RAISE EXCEPTION 'simulated serialization failure' USING ERRCODE = '40001';
			WHEN 2 THEN RAISE EXCEPTION 'simulated deadlock' USING ERRCODE = '40P01';
			ELSE NULL;
			END CASE;
			RETURN NULL;
		END $$;
		CREATE TRIGGER fail_twice AFTER INSERT ON items FOR EACH STATEMENT EXECUTE FUNCTION fail_twice()`)
	require.NoError(t, err)
	r, err := backfill.New(s.db, &backfill.Config{MaxAttempts: 1, RetryBackoff: time.Millisecond,
		LockRetries: []backfill.LockRetry{{Timeout: time.Second, Sleep: time.Millisecond}, {Timeout: time.Second, Sleep: time.Millisecond}, {Timeout: time.Second}}})
	require.NoError(t, err)
	job := s.job(1)
	job.Chunker = backfill.IntRange(0, 200, 100)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, backfill.Counts{Read: 200, Inserted: 200}, rep.Counts)
	var merges int
	require.NoError(t, s.db.Get(&merges, `SELECT last_value FROM merges`))
	require.GreaterOrEqual(t, merges, 4, "the two failed merges ran again")
	var attempts int
	require.NoError(t, s.db.Get(&attempts, `SELECT sum(attempts) FROM backfill.chunks WHERE rows_read = 100 AND status = 'done'`))
	require.Equal(t, 2, attempts, "two chunks, each committed once; the waits are not failed attempts")
	waits, err := backfill.NewPGManifest("").Waits(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	var codes []string
	for _, w := range waits {
		codes = append(codes, w.SQLState)
		require.False(t, w.Final)
	}
	require.Equal(t, []string{"40001", "40P01"}, codes, "each wait recorded")
	var rows int
	require.NoError(t, s.db.Get(&rows, `SELECT count(*) FROM items`))
	require.Equal(t, 200, rows)
}
