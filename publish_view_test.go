package backfill_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/internal/testwait"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// Tests of the view switch of PublishVersionedView against what holds
// the view: readers, a rollback, PostgreSQL's identifier length.

// viewSetup is an orders table published through orders_current by batch
// 1 (viewJob), with the switch bounded by lockTimeout and tries.
func viewSetup(t *testing.T, lockTimeout string, tries int) (*sqlx.DB, *backfill.Runner, backfill.Job, int64) {
	t.Helper()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL,
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := viewJob(false)
	job.Publish.LockTimeout = lockTimeout
	job.Publish.LockRetries = tries
	rep, err := r.Run(context.Background(), job)
	require.NoError(t, err)
	require.Equal(t, "orders__v1", viewReads(t, db))
	return db, r, job, rep.BatchID
}

// viewReads returns the table orders_current reads.
func viewReads(t *testing.T, db *sqlx.DB) string {
	t.Helper()
	var src string
	require.NoError(t, db.Get(&src, `SELECT DISTINCT c.relname FROM pg_rewrite r
		JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
		JOIN pg_class c ON c.oid = d.refobjid AND c.relkind = 'r'
		WHERE r.ev_class = 'orders_current'::regclass`))
	return src
}

// holdView opens a reader's transaction on orders_current (a long report)
// and returns the function that ends it.
func holdView(t *testing.T, db *sqlx.DB) func() {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Connx(ctx)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, `SET application_name = 'long_report'`)
	require.NoError(t, err)
	tx, err := conn.BeginTxx(ctx, nil)
	require.NoError(t, err)
	var n int
	require.NoError(t, tx.Get(&n, `SELECT count(*) FROM orders_current`))
	done := false
	end := func() {
		if !done {
			done = true
			_ = tx.Rollback()
			_ = conn.Close()
		}
	}
	t.Cleanup(end)
	return end
}

func runStatus(t *testing.T, db *sqlx.DB, batch int64) (status, lastError string) {
	t.Helper()
	require.NoError(t, db.QueryRow(`SELECT status, last_error FROM backfill.runs WHERE batch_id = $1`, batch).Scan(&status, &lastError))
	return status, lastError
}

func eventKinds(t *testing.T, db *sqlx.DB, batch int64) []string {
	t.Helper()
	var kinds []string
	require.NoError(t, db.Select(&kinds, `SELECT kind FROM backfill.events WHERE batch_id = $1 ORDER BY id`, batch))
	return kinds
}

// A rollback of a batch whose publish is still retrying behind a reader
// wins: the publish's next try finds the batch rolled back and never
// switches the view, Run says so, and no later call publishes it.
func TestVersionedViewRollbackWhilePublishRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, r, job, _ := viewSetup(t, "100ms", 8)
	release := holdView(t, db)
	job2 := job
	job2.NewRun, job2.CodeVersion = true, "v2"
	type result struct {
		rep backfill.Report
		err error
	}
	done := make(chan result, 1)
	go func() { rep, err := r.Run(ctx, job2); done <- result{rep, err} }()
	// Wait until batch 2 is completed: its publish is retrying.
	testwait.Until(t, "batch 2 completed, its publish retrying", func() bool {
		var st string
		return db.Get(&st, `SELECT coalesce((SELECT status FROM backfill.runs WHERE batch_id = 2), '')`) == nil && st == "completed"
	})
	job2.NewRun = false
	rb, err := r.Rollback(ctx, job2, backfill.RollbackOptions{BatchID: 2, Actor: "ops", Why: "bad prices"})
	require.NoError(t, err)
	require.Equal(t, backfill.RunRolledBack, rb.Status)
	release()
	out := testwait.Recv(t, "the run of batch 2 after the view's release", done)
	require.ErrorIs(t, out.err, backfill.ErrAlreadyCompleted, "Run must say its batch was rolled back, not published")
	require.Equal(t, backfill.RunRolledBack, out.rep.Status)
	require.Equal(t, "orders__v1", viewReads(t, db), "readers see the rolled back batch 2")
	status, _ := runStatus(t, db, 2)
	require.Equal(t, "rolled_back", status)
	require.NotContains(t, eventKinds(t, db, 2), backfilltype.EventPublished)

	// Forever: a later call of the run publishes nothing either.
	_, err = r.Run(ctx, job2)
	require.ErrorIs(t, err, backfill.ErrAlreadyCompleted)
	require.Equal(t, "orders__v1", viewReads(t, db))
}

// A blocked publish is recorded (event naming the blocker, last_error,
// not in completed_batches); a rollback before the next call makes that
// pending publish a no-op for good; without the rollback the next call
// publishes it and the record says so.
func TestVersionedViewBlockedPublishRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, rollback := range []bool{false, true} {
		db, r, job, _ := viewSetup(t, "50ms", 2)
		release := holdView(t, db)
		job2 := job
		job2.NewRun, job2.CodeVersion = true, "v2"
		rep, err := r.Run(ctx, job2)
		require.ErrorIs(t, err, backfill.ErrPublishBlocked)
		require.ErrorContains(t, err, "long_report", "the error names the blocking reader")
		require.Equal(t, int64(2), rep.BatchID)
		status, lastErr := runStatus(t, db, 2)
		require.Equal(t, "completed", status)
		require.Contains(t, lastErr, "unpublished")
		require.Contains(t, eventKinds(t, db, 2), backfilltype.EventPublishBlocked)
		var detail json.RawMessage
		require.NoError(t, db.Get(&detail, `SELECT detail FROM backfill.events WHERE batch_id = 2 AND kind = $1`, backfilltype.EventPublishBlocked))
		require.Contains(t, string(detail), "long_report")
		var listed int
		require.NoError(t, db.Get(&listed, `SELECT count(*) FROM backfill.completed_batches WHERE batch_id = 2`))
		require.Zero(t, listed, "an unpublished versioned-view batch is not completed for reports")
		require.NoError(t, db.Get(&listed, `SELECT count(*) FROM backfill.completed_batches WHERE batch_id = 1`))
		require.Equal(t, 1, listed, "the published batch 1 is")
		require.Equal(t, "orders__v1", viewReads(t, db))

		job2.NewRun = false
		if rollback {
			_, err := r.Rollback(ctx, job2, backfill.RollbackOptions{BatchID: 2, Actor: "ops", Why: "withdraw"})
			require.NoError(t, err)
			release()
			_, err = r.Run(ctx, job2)
			require.ErrorIs(t, err, backfill.ErrAlreadyCompleted)
			require.Equal(t, "orders__v1", viewReads(t, db), "a rolled back batch was published")
			status, _ := runStatus(t, db, 2)
			require.Equal(t, "rolled_back", status)
			continue
		}
		release()
		rep, err = r.Run(ctx, job2)
		require.NoError(t, err, "the next call publishes the completed run")
		require.Equal(t, backfill.RunCompleted, rep.Status)
		require.Equal(t, "orders__v2", viewReads(t, db))
		status, lastErr = runStatus(t, db, 2)
		require.Equal(t, "completed", status)
		require.Empty(t, lastErr)
		require.Contains(t, eventKinds(t, db, 2), backfilltype.EventPublished)
		require.NoError(t, db.Get(&listed, `SELECT count(*) FROM backfill.completed_batches WHERE batch_id = 2`))
		require.Equal(t, 1, listed)
	}
}

// Rolling back a published batch behind a long reader is bounded like the
// publish: new readers are not queued behind it for longer than a
// lock_timeout, it ends with ErrPublishBlocked naming the reader and
// changing nothing, and succeeds once the reader is gone.
func TestVersionedViewSwitchBackBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, r, job, batch := viewSetup(t, "200ms", 4)
	release := holdView(t, db)
	// Without a bound the rollback would wait for the reader: the test
	// fails on this context instead of hanging.
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := r.Rollback(rctx, job, backfill.RollbackOptions{BatchID: batch, Actor: "ops", Why: "test"})
		done <- err
	}()
	// Once the switch back waits for the view's lock, a new reader reads
	// the old version, waiting at most one lock_timeout (200ms) behind
	// each try; 10s is the bound of "not queued until the long reader
	// ends".
	for {
		var waiting int
		require.NoError(t, db.Get(&waiting, `SELECT count(*) FROM pg_locks WHERE relation = 'orders_current'::regclass AND NOT granted`))
		if waiting > 0 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the rollback ended while a reader holds the view: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	nr, err := db.Connx(ctx)
	require.NoError(t, err)
	defer nr.Close()
	_, err = nr.ExecContext(ctx, `SET statement_timeout = '10s'`)
	require.NoError(t, err)
	var n int
	for i := 0; i < 5; i++ {
		require.NoError(t, nr.GetContext(ctx, &n, `SELECT count(*) FROM orders_current`), "a new reader queued behind the switch back")
	}
	err = <-done
	require.ErrorIs(t, err, backfill.ErrPublishBlocked)
	require.ErrorContains(t, err, "long_report")
	require.Equal(t, "orders__v1", viewReads(t, db), "a blocked switch back changes nothing")
	status, _ := runStatus(t, db, batch)
	require.Equal(t, "completed", status)

	release()
	rb, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: batch, Actor: "ops", Why: "test"})
	require.NoError(t, err)
	require.Equal(t, backfill.RunRolledBack, rb.Status)
	require.Equal(t, "orders", viewReads(t, db), "switched back to the base table")
}

// A versioned view publishes a completed run only; a scope reaching past
// now or past the watermark would leave chunks open and the run never
// published while Run returned nil. It is refused before anything runs.
func TestVersionedViewRefusesOpenScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE ev (id bigint PRIMARY KEY, at timestamptz NOT NULL, amount bigint,
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	today := time.Now().UTC().Truncate(24 * time.Hour)
	past := today.AddDate(0, 0, -10)
	extract := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		return w.Write(ctx, c.Start.Unix(), c.Start, 1)
	})
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	for name, job := range map[string]backfill.Job{
		"after now": {Chunker: backfill.Days(today.Add(-24*time.Hour), today.Add(24*time.Hour), time.UTC)},
		"after the watermark": {Chunker: backfill.Days(past, past.AddDate(0, 0, 3), time.UTC),
			Watermark: backfill.WatermarkFunc(func(context.Context) (time.Time, error) { return past.AddDate(0, 0, 2), nil })},
	} {
		job.Name, job.ChunkColumn, job.Extractor = "ev", "at", extract
		job.Target = backfill.Target{Table: "ev", Key: []string{"id"}, Columns: []string{"id", "at", "amount"}}
		job.Publish = backfill.Publish{Mode: backfill.PublishVersionedView, View: "ev_current"}
		_, err := r.Run(ctx, job)
		require.ErrorIs(t, err, backfill.ErrInvalidScope, name)
		var runs int
		require.NoError(t, db.Get(&runs, `SELECT count(*) FROM backfill.runs`))
		require.Zero(t, runs, "%s: nothing runs", name)
	}
}

// Version tables are named "<table>__v<batch>"; PostgreSQL truncates
// names to 63 bytes, so with a 59-byte table batch 10's version was batch
// 1's table, and batch 10 merged into what readers see. Names are
// shortened with a hash keeping the batch whole, and a table that has the
// name but was not created as that version is never merged into.
func TestVersionTableNamesNeverCollide(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	name := strings.Repeat("o", 59) // "<59>__v1" is 63 bytes; "<59>__v10" is 64
	_, err := db.Exec(`CREATE TABLE ` + name + ` (id bigint PRIMARY KEY, amount bigint NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	job := func(factor, failAt int64) backfill.Job {
		return backfill.Job{Name: "orders", NewRun: true, Chunker: backfill.IntRange(0, 40, 20), ChunkColumn: "id",
			Publish: backfill.Publish{Mode: backfill.PublishVersionedView, View: "orders_current"},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				if c.Lo == failAt {
					return errors.New("source down")
				}
				for id := c.Lo; id < c.Hi; id++ {
					if err := w.Write(ctx, id, id*factor); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: backfill.Target{Table: name, Key: []string{"id"}, Columns: []string{"id", "amount"}}}
	}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, MaxAttempts: 1})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job(1, -1))
	require.NoError(t, err)
	require.Equal(t, int64(1), rep.BatchID)
	sum := func() int64 {
		var s int64
		require.NoError(t, db.Get(&s, `SELECT sum(amount) FROM orders_current`))
		return s
	}
	require.Equal(t, int64(780), sum())
	// The next batch is 10.
	_, err = db.Exec(`ALTER TABLE backfill.runs ALTER COLUMN batch_id RESTART WITH 10`)
	require.NoError(t, err)
	rep, err = r.Run(ctx, job(1000, 20)) // the second chunk fails: nothing may be published
	require.Error(t, err)
	require.Equal(t, int64(10), rep.BatchID)
	require.Equal(t, int64(780), sum(), "readers of the view saw a failed, unpublished batch")
	var names []string
	require.NoError(t, db.Select(&names, `SELECT relname FROM pg_class WHERE relname LIKE 'ooo%' AND relkind = 'r' ORDER BY 1`))
	require.Len(t, names, 3, "base, version 1 and version 10: %v", names)
	for _, n := range names {
		require.LessOrEqual(t, len(n), 63)
	}
	require.True(t, strings.HasSuffix(names[0], "__v10") || strings.HasSuffix(names[1], "__v10"), "the batch ID survives: %v", names)

}

// A table that has a version's name but was not created as that version
// (a user's table) is refused, never merged into.
func TestVersionTableNotOursRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, r, job, _ := viewSetup(t, "", 0)
	_, err := db.Exec(`CREATE TABLE orders__v2 (LIKE orders); INSERT INTO orders__v2 VALUES (1, 42, NULL, NULL)`)
	require.NoError(t, err)
	job.NewRun, job.CodeVersion = true, "v2"
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	require.ErrorContains(t, err, "is not the version")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM orders__v2`))
	require.Equal(t, 1, n, "the user's table is untouched")
	require.Equal(t, "orders__v1", viewReads(t, db))
}

// Partition swap names its new partitions like table versions: with a
// 60-byte partition name, batch 1's partition "<60>__v1" and batch 2's
// "<60>__v1__v2" were truncated by PostgreSQL to one name, so the second
// batch could not create its partition (or took batch 1's). Every batch
// gets its own partition, and rollback swaps back to the right one.
func TestPartitionSwapLongNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	part := strings.Repeat("p", 60)
	_, err := db.Exec(`CREATE TABLE sales (day timestamptz NOT NULL, id int NOT NULL, amount int NOT NULL, PRIMARY KEY (day, id))
			PARTITION BY RANGE (day);
		CREATE TABLE ` + part + ` PARTITION OF sales FOR VALUES FROM ('2024-01-01 00:00Z') TO ('2024-01-02 00:00Z');`)
	require.NoError(t, err)
	job := func(amount int64) backfill.Job {
		return backfill.Job{Name: "sales", NewRun: true, ChunkColumn: "day", Rollback: backfill.RollbackSwitchBack,
			Chunker: backfill.Days(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2024, 1, 2, 0, 0, 0, 0, time.UTC), time.UTC),
			Publish: backfill.Publish{Mode: backfill.PublishPartitionSwap},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				for i := range 10 {
					if err := w.Write(ctx, c.Start.Add(time.Duration(i)*time.Minute), int64(i), amount); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: backfill.Target{Table: "sales", Key: []string{"day", "id"}, Columns: []string{"day", "id", "amount"}}}
	}
	sum := func() int64 {
		var s int64
		require.NoError(t, db.Get(&s, `SELECT coalesce(sum(amount), 0) FROM sales`))
		return s
	}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	for _, amount := range []int64{1, 2, 3} {
		_, err := r.Run(ctx, job(amount))
		require.NoError(t, err, "batch with amount %d", amount)
		require.Equal(t, 10*amount, sum())
	}
	var names []string
	require.NoError(t, db.Select(&names, `SELECT relname FROM pg_class WHERE relname LIKE 'ppp%' AND relkind = 'r' ORDER BY 1`))
	require.Len(t, names, 4, "the original partition and one per batch: %v", names)
	_, err = r.Rollback(ctx, job(3), backfill.RollbackOptions{Actor: "ops", Why: "test"})
	require.NoError(t, err)
	require.Equal(t, int64(20), sum(), "batch 3 swapped back to batch 2's partition")
}
