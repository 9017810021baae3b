package backfill_test

import (
	"context"
	"database/sql/driver"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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

// directURL is the URL of the database of pooled (a URL through the
// pooler) on the server itself.
func directURL(t *testing.T, pooled string) string {
	t.Helper()
	pu, err := neturl.Parse(pooled)
	require.NoError(t, err)
	au, err := neturl.Parse(pgtest.AdminURL())
	require.NoError(t, err)
	pu.Host = au.Host
	return pu.String()
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

// TestThroughPoolerKillDashNine is TestKillDashNine through the pooler:
// the child process runs the crash job with the pooler's URL and is killed
// with SIGKILL twice, at chunk boundaries it does not know of; the resumed
// run completes with every chunk counted once and the target equal to an
// uninterrupted run's.
func TestThroughPoolerKillDashNine(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()
	pooled := pgtest.NewPoolerURL(t)
	// The test's own checks go to the server directly.
	db := sqlx.MustOpen("postgres", directURL(t, pooled))
	t.Cleanup(func() { db.Close() })
	createItems(t, db)

	for _, doneBeforeKill := range []int{4, 15} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "BACKFILL_CRASH_CHILD="+pooled)
		require.NoError(t, cmd.Start())
		for deadline := time.Now().Add(60 * time.Second); ; {
			var got int
			if err := db.Get(&got, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`); err == nil && got >= doneBeforeKill {
				break
			}
			require.True(t, time.Now().Before(deadline), "child made no progress")
			time.Sleep(2 * time.Millisecond)
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		// The pooler's server connections outlive the child: wait until
		// none of them works on the database (a COMMIT sent before the
		// kill finishes), so that what the test reads is what the crash
		// left.
		for deadline := time.Now().Add(30 * time.Second); ; {
			var busy int
			require.NoError(t, db.Get(&busy, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND state NOT IN ('idle')`))
			if busy == 0 {
				break
			}
			require.True(t, time.Now().Before(deadline), "the child's transactions did not end")
			time.Sleep(2 * time.Millisecond)
		}
	}
	var done int
	require.NoError(t, db.Get(&done, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`))
	require.Less(t, done, 40, "the child was killed before the end")

	pdb := sqlx.MustOpen("postgres", pooled)
	t.Cleanup(func() { pdb.Close() })
	r, err := backfill.New(pdb, &backfill.Config{Concurrency: 3})
	require.NoError(t, err)
	rep, err := r.Run(ctx, crashJob(&itemsSetup{db: pdb}))
	require.NoError(t, err)
	require.True(t, rep.Resumed)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 40-done, rep.ChunksRun, "resume ran only the chunks not done")
	require.Equal(t, backfill.Counts{Read: 10000, Inserted: 10000}, rep.Counts, "no chunk counted twice")
	var bad int
	require.NoError(t, db.Get(&bad, `SELECT count(*) FROM backfill.chunks WHERE status <> 'done'
		OR rows_read <> rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated OR rows_read <> 250`))
	require.Zero(t, bad)
	// An uninterrupted run writes these rows (itemsSetup's generator).
	var mismatched int
	require.NoError(t, db.Get(&mismatched, `SELECT count(*) FROM generate_series(0, 9999) g(id)
		FULL JOIN items i ON i.id = g.id AND i.tenant = 'acme'
		WHERE i.id IS NULL OR g.id IS NULL OR i.name <> 'item-' || g.id OR i.amount <> (g.id::text || '.' || lpad((g.id % 100)::text, 2, '0'))::numeric`))
	require.Zero(t, mismatched)
	var runs int
	require.NoError(t, db.Get(&runs, `SELECT count(*) FROM backfill.runs`))
	require.Equal(t, 1, runs, "every restart resumed the same batch")
}

// TestThroughPoolerPublishModes runs each publish mode through the
// pooler with two processes on one job, then rolls the batch back: the
// view switch, the partition swap and the publish at the end take their
// locks and settings in transactions of their own.
func TestThroughPoolerPublishModes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	runTwo := func(t *testing.T, u string, job backfill.Job) int64 {
		t.Helper()
		var (
			wg      sync.WaitGroup
			batches [2]int64
			errs    [2]error
		)
		for i := range 2 {
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
				rep, err := r.Run(ctx, job)
				batches[i], errs[i] = rep.BatchID, err
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				require.ErrorIs(t, err, backfill.ErrAlreadyCompleted, "worker %d", i)
			}
		}
		require.Equal(t, batches[0], batches[1])
		return batches[0]
	}
	rollBack := func(t *testing.T, db *sqlx.DB, job backfill.Job, batch int64) {
		t.Helper()
		r, err := backfill.New(db, nil)
		require.NoError(t, err)
		rb, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: batch, Actor: "t", Why: "test"})
		require.NoError(t, err)
		require.Equal(t, backfill.RunRolledBack, rb.Status)
	}
	balanced := func(t *testing.T, db *sqlx.DB, batch int64) {
		t.Helper()
		var bad int
		require.NoError(t, db.Get(&bad, `SELECT count(*) FROM backfill.chunks WHERE batch_id = $1 AND (status <> 'done'
			OR rows_read <> rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated)`, batch))
		require.Zero(t, bad)
	}

	t.Run("versioned_view", func(t *testing.T) {
		t.Parallel()
		u := pgtest.NewPoolerURL(t)
		db := sqlx.MustOpen("postgres", u)
		t.Cleanup(func() { db.Close() })
		_, err := db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint)`)
		require.NoError(t, err)
		batch := runTwo(t, u, viewJob(false))
		balanced(t, db, batch)
		var s string
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || sum(amount) FROM orders_current`))
		require.Equal(t, fmt.Sprintf("400/%d", 3*399*400/2), s)
		rollBack(t, db, viewJob(false), batch)
	})
	t.Run("partition_swap", func(t *testing.T) {
		t.Parallel()
		u := pgtest.NewPoolerURL(t)
		db := sqlx.MustOpen("postgres", u)
		t.Cleanup(func() { db.Close() })
		_, err := db.Exec(`CREATE TABLE sales (day timestamptz NOT NULL, id int NOT NULL, amount int NOT NULL, PRIMARY KEY (day, id))
				PARTITION BY RANGE (day);
			CREATE TABLE sales_d1 PARTITION OF sales FOR VALUES FROM ('2024-01-01 00:00Z') TO ('2024-01-02 00:00Z');
			CREATE TABLE sales_d2 PARTITION OF sales FOR VALUES FROM ('2024-01-02 00:00Z') TO ('2024-01-03 00:00Z');
			INSERT INTO sales SELECT '2024-01-01 00:00Z'::timestamptz + g * interval '1 minute', g, 1 FROM generate_series(0, 99) g;`)
		require.NoError(t, err)
		job := backfill.Job{Name: "sales", ChunkColumn: "day",
			Chunker: backfill.Days(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2024, 1, 3, 0, 0, 0, 0, time.UTC), time.UTC),
			Publish: backfill.Publish{Mode: backfill.PublishPartitionSwap},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				for i := range 150 {
					if err := w.Write(ctx, c.Start.Add(time.Duration(i)*time.Minute), int64(i), int64(2)); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: backfill.Target{Table: "sales", Key: []string{"day", "id"}, Columns: []string{"day", "id", "amount"}}}
		batch := runTwo(t, u, job)
		balanced(t, db, batch)
		var s string
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || sum(amount) FROM sales`))
		require.Equal(t, "300/600", s)
		rollBack(t, db, job, batch)
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || sum(amount) FROM sales`))
		require.Equal(t, "100/100", s, "the old partitions are back")
	})
	t.Run("at_end", func(t *testing.T) {
		t.Parallel()
		u := pgtest.NewPoolerURL(t)
		db := sqlx.MustOpen("postgres", u)
		t.Cleanup(func() { db.Close() })
		_, err := db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint);
			INSERT INTO orders (id, amount) SELECT g, 0 FROM generate_series(0, 9) g;`)
		require.NoError(t, err)
		batch := runTwo(t, u, atEndJob(false))
		balanced(t, db, batch)
		var s string
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || count(*) FILTER (WHERE amount = id * 3) FROM orders`))
		require.Equal(t, "393/392", s, "8 rejected rows not loaded; row 7, there before, kept at 0")
		require.Len(t, exceptionsOf(t, db, batch), 8)
		rollBack(t, db, atEndJob(false), batch)
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || sum(amount) FROM orders`))
		require.Equal(t, "10/0", s)
	})
}

// TestStatementPoolerIsNamed: a pooler in statement mode refuses
// transactions by dropping the connection, and lib/pq loses its message;
// the library's error says what to set.
func TestStatementPoolerIsNamed(t *testing.T) {
	t.Parallel()
	db := sqlx.MustOpen("postgres", pgtest.NewStatementPoolerURL(t))
	t.Cleanup(func() { db.Close() })
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(context.Background(), (&itemsSetup{}).job(1))
	require.ErrorIs(t, err, driver.ErrBadConn)
	require.ErrorContains(t, err, "pool_mode = transaction")
}
