package backfill_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/internal/testwait"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestVersionedViewReadersNeverSeeAMix: while a run loads a new version,
// a concurrent reader of the view sees the old version or the new one,
// never a mix; rollback switches the view back.
func TestVersionedViewReadersNeverSeeAMix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL,
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	job := func(version int64, slow bool) backfill.Job {
		return backfill.Job{Name: "orders", NewRun: true, Chunker: backfill.IntRange(0, 200, 20), ChunkColumn: "id",
			Publish: backfill.Publish{Mode: backfill.PublishVersionedView, View: "orders_current"},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				if slow {
					time.Sleep(20 * time.Millisecond)
				}
				for id := c.Lo; id < c.Hi; id++ {
					if err := w.Write(ctx, id, id*version); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: backfill.Target{Table: "orders", Key: []string{"id"}, Columns: []string{"id", "amount"}}}
	}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 2})
	require.NoError(t, err)
	rep1, err := r.Run(ctx, job(1, false))
	require.NoError(t, err)
	state := func() string {
		var s string
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || sum(amount) FROM orders_current`))
		return s
	}
	v1 := state()
	require.Equal(t, fmt.Sprintf("200/%d", 199*200/2), v1)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM orders`))
	require.Zero(t, n, "the base table is untouched: versions hold the data")

	var stop atomic.Bool
	seen := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			var s string
			if err := db.Get(&s, `SELECT count(*) || '/' || sum(amount) FROM orders_current`); err == nil {
				mu.Lock()
				seen[s]++
				mu.Unlock()
			}
		}
	}()
	rep2, err := r.Run(ctx, job(2, true))
	require.NoError(t, err)
	v2 := fmt.Sprintf("200/%d", 199*200)
	testwait.Until(t, "the reader seeing the published version", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen[v2] > 0
	})
	stop.Store(true)
	wg.Wait()
	require.Equal(t, v2, state())
	for s := range seen {
		require.Contains(t, []string{v1, v2}, s, "a reader saw a mix of versions")
	}
	require.Greater(t, seen[v1], 0, "the reader saw the old version during the load")

	rb, err := r.Rollback(ctx, job(2, false), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "ann", Why: "bad amounts"})
	require.NoError(t, err)
	require.Equal(t, backfill.RunRolledBack, rb.Status)
	require.Equal(t, v1, state(), "switched back to the previous version")
	_, err = r.Rollback(ctx, job(1, false), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "ann", Why: "first"})
	require.NoError(t, err, "the first publish created the view: switching back points it at the base table")
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM orders_current`))
	require.Zero(t, n)
}

func viewJob(slow bool) backfill.Job {
	return backfill.Job{Name: "orders", Chunker: backfill.IntRange(0, 400, 20), ChunkColumn: "id",
		Publish: backfill.Publish{Mode: backfill.PublishVersionedView, View: "orders_current"},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if slow {
				time.Sleep(30 * time.Millisecond)
			}
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, id*3); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "orders", Key: []string{"id"}, Columns: []string{"id", "amount"}}}
}

func init() {
	// The child process of TestKillDashNineBeforePublish.
	childProcess("BACKFILL_VIEW_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, quickFencing(backfill.Config{}))
		if err != nil {
			return err
		}
		_, err = r.Run(context.Background(), viewJob(true))
		return err
	})
}

// TestKillDashNineBeforePublish: kill -9 while a versioned-view run loads;
// nothing is visible before the publish, and the rerun's result equals an
// uninterrupted run.
func TestKillDashNineBeforePublish(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns a process")
	}
	ctx := context.Background()
	create := `CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint);
		INSERT INTO orders (id, amount) SELECT g, 0 FROM generate_series(0, 9) g;
		CREATE VIEW orders_current AS SELECT * FROM orders;`
	ref := pgtest.New(t)
	_, err := ref.Exec(create)
	require.NoError(t, err)
	r, err := backfill.New(ref, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, viewJob(false))
	require.NoError(t, err)
	var want []string
	require.NoError(t, ref.Select(&want, `SELECT row(id, amount)::text FROM orders_current ORDER BY id`))

	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	_, err = db.Exec(create)
	require.NoError(t, err)
	killChildWhen(t, db, "BACKFILL_VIEW_CHILD", url, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`, 5)
	var visible string
	require.NoError(t, db.Get(&visible, `SELECT count(*) || '/' || sum(amount) FROM orders_current`))
	require.Equal(t, "10/0", visible, "nothing of the interrupted run is visible before the publish")

	r, err = backfill.New(db, quickFencing(backfill.Config{}))
	require.NoError(t, err)
	rep, err := r.Run(ctx, viewJob(false))
	require.NoError(t, err)
	require.True(t, rep.Resumed)
	var got []string
	require.NoError(t, db.Select(&got, `SELECT row(id, amount)::text FROM orders_current ORDER BY id`))
	require.Equal(t, want, got)
}

// TestPartitionSwap: each chunk's partition is rebuilt beside the old one
// and swapped in; a reader of one day sees the old partition or the new
// one, never a mix; rollback swaps the old partitions back.
func TestPartitionSwap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE sales (day timestamptz NOT NULL, id int NOT NULL, amount int NOT NULL, PRIMARY KEY (day, id))
			PARTITION BY RANGE (day);
		CREATE TABLE sales_d1 PARTITION OF sales FOR VALUES FROM ('2024-01-01 00:00Z') TO ('2024-01-02 00:00Z');
		CREATE TABLE sales_d2 PARTITION OF sales FOR VALUES FROM ('2024-01-02 00:00Z') TO ('2024-01-03 00:00Z');
		INSERT INTO sales SELECT '2024-01-01 00:00Z'::timestamptz + g * interval '1 minute', g, 1 FROM generate_series(0, 99) g;`)
	require.NoError(t, err)
	job := func(rows int) backfill.Job {
		return backfill.Job{Name: "sales", NewRun: true, ChunkColumn: "day",
			Chunker: backfill.Days(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2024, 1, 3, 0, 0, 0, 0, time.UTC), time.UTC),
			Publish: backfill.Publish{Mode: backfill.PublishPartitionSwap},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				time.Sleep(30 * time.Millisecond)
				for i := range rows {
					if err := w.Write(ctx, c.Start.Add(time.Duration(i)*time.Minute), int64(i), int64(2)); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: backfill.Target{Table: "sales", Key: []string{"day", "id"}, Columns: []string{"day", "id", "amount"}}}
	}
	count := func() string {
		var s string
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || coalesce(sum(amount), 0) FROM sales WHERE day >= '2024-01-01Z' AND day < '2024-01-02Z'`))
		return s
	}
	before := count()
	require.Equal(t, "100/100", before)

	var stop atomic.Bool
	seen := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			var s string
			if err := db.Get(&s, `SELECT count(*) || '/' || coalesce(sum(amount), 0) FROM sales WHERE day >= '2024-01-01Z' AND day < '2024-01-02Z'`); err == nil {
				mu.Lock()
				seen[s]++
				mu.Unlock()
			}
		}
	}()
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job(150))
	require.NoError(t, err)
	stop.Store(true)
	wg.Wait()
	after := count()
	require.Equal(t, "150/300", after, "100 rows updated to 2, 50 inserted")
	for s := range seen {
		require.Contains(t, []string{before, after}, s, "a reader saw a mix of partitions")
	}
	var parts []string
	require.NoError(t, db.Select(&parts, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'sales'::regclass ORDER BY 1`))
	require.Equal(t, []string{fmt.Sprintf("sales_d1__v%d", rep.BatchID), fmt.Sprintf("sales_d2__v%d", rep.BatchID)}, parts)
	var kept int
	require.NoError(t, db.Get(&kept, `SELECT count(*) FROM sales_d1`))
	require.Equal(t, 100, kept, "the old partition is kept, detached")

	rb, err := r.Rollback(ctx, job(0), backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "ann", Why: "wrong amounts"})
	require.NoError(t, err)
	require.Equal(t, 2, rb.Chunks)
	require.Equal(t, backfill.RunRolledBack, rb.Status)
	require.Equal(t, before, count(), "the old partitions are back")
	again, err := r.Rollback(ctx, job(0), backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "ann", Why: "twice"})
	require.NoError(t, err)
	require.Zero(t, again.Chunks)
}

func atEndJob(slow bool) backfill.Job {
	return backfill.Job{Name: "orders-at-end", Chunker: backfill.IntRange(0, 400, 20), ChunkColumn: "id",
		Publish: backfill.Publish{Mode: backfill.PublishAtEnd},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if slow {
				time.Sleep(30 * time.Millisecond)
			}
			for id := c.Lo; id < c.Hi; id++ {
				var amount any = id * 3
				if id%50 == 7 {
					amount = "not a number" // rejected, kept in the exception queue
				}
				if err := w.Write(ctx, id, amount); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "orders", Key: []string{"id"}, Columns: []string{"id", "amount"}}}
}

func init() {
	// The child process of TestKillDashNineDuringStaging.
	childProcess("BACKFILL_ATEND_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, quickFencing(backfill.Config{}))
		if err != nil {
			return err
		}
		_, err = r.Run(context.Background(), atEndJob(true))
		return err
	})
}

// TestKillDashNineDuringStaging: a run published at its end is killed
// while staging; nothing is visible, and the rerun publishes a result equal
// to an uninterrupted run, every chunk balanced, every reject queued once.
func TestKillDashNineDuringStaging(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns a process")
	}
	ctx := context.Background()
	create := `CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint);
		INSERT INTO orders (id, amount) SELECT g, 0 FROM generate_series(0, 9) g;`
	ref := pgtest.New(t)
	_, err := ref.Exec(create)
	require.NoError(t, err)
	r, err := backfill.New(ref, nil)
	require.NoError(t, err)
	refRep, err := r.Run(ctx, atEndJob(false))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 400, Inserted: 383, Updated: 8, Unchanged: 1, Rejected: 8}, refRep.Counts)
	var want []string
	require.NoError(t, ref.Select(&want, `SELECT row(id, amount)::text FROM orders ORDER BY id`))

	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	_, err = db.Exec(create)
	require.NoError(t, err)
	killChildWhen(t, db, "BACKFILL_ATEND_CHILD", url, `SELECT count(*) FROM backfill.chunks WHERE status = 'staged'`, 5)
	var visible string
	require.NoError(t, db.Get(&visible, `SELECT count(*) || '/' || sum(amount) FROM orders`))
	require.Equal(t, "10/0", visible, "nothing is visible before the publish")

	r, err = backfill.New(db, quickFencing(backfill.Config{}))
	require.NoError(t, err)
	rep, err := r.Run(ctx, atEndJob(false))
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, refRep.Counts, rep.Counts)
	var got []string
	require.NoError(t, db.Select(&got, `SELECT row(id, amount)::text FROM orders ORDER BY id`))
	require.Equal(t, want, got)
	ex := exceptionsOf(t, db, rep.BatchID)
	require.Len(t, ex, 8, "each reject queued once, across the kill")
	for _, c := range manifestChunks(t, db, rep.BatchID) {
		require.Equal(t, backfill.ChunkDone, c.Status)
		require.True(t, c.Balanced(), "%s: %+v", c.Chunk.ID, c.Counts)
	}
	var stage int
	require.NoError(t, db.Get(&stage, `SELECT count(*) FROM pg_tables WHERE schemaname = 'backfill' AND tablename LIKE 'stage_%'`))
	require.Zero(t, stage, "the staging table is dropped after the publish")
}
