package backfill_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// Through PgBouncer in transaction pooling mode (pgtest.NewPoolerURL: a
// pool of a few server connections shared by all clients, an ordinary
// connection string without binary_parameters). A parameterised statement
// that lib/pq sends outside a transaction takes two round trips, between
// which the pooler may hand the server connection to another client: the
// statements of clients get mixed up ("bind message has 13 result formats
// but query has 1 columns", a false "target has no unique index"). Every
// statement of the library with parameters must run in a transaction, and
// none may rely on session state.

// pooledItems is itemsSetup on a database reached through the pooler; db
// is a direct connection to the same database, for the test's own checks.
func pooledItems(t *testing.T) (s *itemsSetup, pooledURL string) {
	t.Helper()
	pooledURL = pgtest.NewPoolerURL(t)
	db, err := sqlx.Open("postgres", pooledURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE items (
		tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2),
		seen_at timestamptz, backfill_inserted_by bigint, backfill_updated_by bigint,
		PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
	return &itemsSetup{db: db}, pooledURL
}

// TestThroughPoolerConcurrentRunners: four processes (each its own pool
// of client connections and Runner, Concurrency 3) run one job, with a
// validator, through the pooler; then a second version of the job is run
// and validated, and rolled back. Every chunk is merged exactly once, the
// manifest balances and nothing fails.
func TestThroughPoolerConcurrentRunners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, u := pooledItems(t)
	const n = 4
	var (
		wg   sync.WaitGroup
		reps = make([]backfill.Report, n)
		errs = make([]error, n)
	)
	job := s.job(1)
	job.Validators = []backfill.Validator{backfill.DuplicateKeys{}, backfill.Completeness{CompareContent: true},
		backfill.ReplayChangesNothing{}, backfill.Aggregates{Measures: []backfill.Measure{{Column: "amount"}}}}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := sqlx.Open("postgres", u)
			if err != nil {
				errs[i] = err
				return
			}
			defer db.Close()
			r, err := backfill.New(db, &backfill.Config{Concurrency: 3, WorkerID: fmt.Sprintf("w%d", i)})
			if err != nil {
				errs[i] = err
				return
			}
			reps[i], errs[i] = r.Run(ctx, job)
		}()
	}
	wg.Wait()
	total := 0
	for i := range n {
		if errs[i] != nil {
			require.ErrorIs(t, errs[i], backfill.ErrAlreadyCompleted, "worker %d", i)
			require.Zero(t, reps[i].ChunksRun)
		}
		total += reps[i].ChunksRun
		require.Equal(t, reps[0].BatchID, reps[i].BatchID, "worker %d", i)
	}
	require.Equal(t, 10, total)
	s.calls.Range(func(k, v any) bool {
		require.Equal(t, int64(1), v.(*atomic.Int64).Load(), k)
		return true
	})
	var bad int
	require.NoError(t, s.db.Get(&bad, `SELECT count(*) FROM backfill.chunks WHERE status <> 'done'
		OR rows_read <> rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated OR rows_read <> 100`))
	require.Zero(t, bad)

	// Version 2, validated, then rolled back, still through the pooler.
	r, err := backfill.New(s.db, &backfill.Config{Concurrency: 4})
	require.NoError(t, err)
	job2 := s.job(2)
	job2.Validators = job.Validators
	job2.NewRun = true
	rep2, err := r.Run(ctx, job2)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep2.Status)
	var changed int
	require.NoError(t, s.db.Get(&changed, `SELECT count(*) FROM items WHERE name LIKE 'v2-%'`))
	require.Equal(t, 100, changed)
	for _, batch := range []int64{reps[0].BatchID, rep2.BatchID} {
		vs, err := backfill.NewPGManifest("").Validations(ctx, s.db, batch)
		require.NoError(t, err)
		require.Len(t, vs, 4*10)
		for _, v := range vs {
			require.True(t, v.Passed, "%s %s: expected %s, got %s", v.ChunkID, v.Check, v.Expected, v.Actual)
		}
	}
	_, err = r.Rollback(ctx, job2, backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "t", Why: "test"})
	require.NoError(t, err)
	require.NoError(t, s.db.Get(&changed, `SELECT count(*) FROM items WHERE name LIKE 'v2-%'`))
	require.Zero(t, changed)
	// No lock outlives the transaction that took it: the pooler would
	// leave it on a server connection that other clients then use.
	var locks int
	require.NoError(t, s.db.Get(&locks, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`))
	require.Zero(t, locks)
}
