package backfill_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// BenchmarkRollback answers: what does withdrawing a large batch with
// Runner.Rollback cost, next to the batch's own merge, and how big is the
// undo log the batch wrote?
//
// The target is an order-line table with a composite key (region,
// order_no), six content columns (text, numeric(12,2), int, timestamptz,
// bool, varchar(20)) and the lineage columns, so jobs get the undo log by
// default. Batch 1 loads 500,000 rows (order_no 0..499,999); batch 2
// (NewRun) writes 1,000,000 rows over order_no 0..999,999: the first
// 500,000 with other content (updates, whose prior images go to the undo
// log), the rest new (inserts, whose keys go to the undo log). Both use
// IntRange chunks of 10,000 rows, one at a time. Then batch 2 is rolled
// back and the table must equal the state after batch 1, lineage columns
// included (md5 of the ordered rows).
//
// The same batch 2 runs with RollbackNone on a fresh copy (another
// database loaded the same way), for the undo log's overhead on the load.
//
// Metrics: load1-s (batch 1), merge-s (batch 2, wall time of Runner.Run),
// merge-noundo-s, undo-overhead (merge-s / merge-noundo-s), rollback-s
// (wall time of Runner.Rollback), rollback/merge (goal: at most 2),
// undo-bytes (growth of pg_total_relation_size('backfill.undo') during
// batch 2), undo-rows, undo-B/changed-row (undo bytes per row batch 2
// inserted or updated), undo/target-growth (undo bytes / growth of the
// target's total size during batch 2) and undo/changed-row-bytes (undo
// bytes / pg_column_size of the rows batch 2 wrote). Run it once (a few
// minutes on 2 cores):
//
//	go test -run '^$' -bench Rollback -benchtime 1x .
func BenchmarkRollback(b *testing.B) {
	var res rbbResult
	for b.Loop() {
		res = rbbRun(b)
	}
	b.ReportMetric(res.load1.Seconds(), "load1-s")
	b.ReportMetric(res.merge.Seconds(), "merge-s")
	b.ReportMetric(res.mergeNone.Seconds(), "merge-noundo-s")
	b.ReportMetric(res.merge.Seconds()/res.mergeNone.Seconds(), "undo-overhead")
	b.ReportMetric(res.rollback.Seconds(), "rollback-s")
	b.ReportMetric(res.rollback.Seconds()/res.merge.Seconds(), "rollback/merge")
	b.ReportMetric(float64(res.undoBytes), "undo-bytes")
	b.ReportMetric(float64(res.undoRows), "undo-rows")
	b.ReportMetric(float64(res.undoBytes)/float64(res.changed), "undo-B/changed-row")
	b.ReportMetric(float64(res.undoBytes)/float64(res.targetGrowth), "undo/target-growth")
	b.ReportMetric(float64(res.undoBytes)/float64(res.changedRowBytes), "undo/changed-row-bytes")

	mb := func(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }
	x := func(a, b time.Duration) float64 { return a.Seconds() / b.Seconds() }
	b.Logf("batch 2: %d inserts + %d updates, chunks of %d; batch 1 load (%d inserts) %.2f s\n"+
		"                      total   update chunks   insert chunks\n"+
		"  merge, undo log     %6.2f s  %6.2f s        %6.2f s\n"+
		"  merge, RollbackNone %6.2f s  %6.2f s        %6.2f s\n"+
		"  undo log overhead   x%5.2f   x%5.2f         x%5.2f\n"+
		"  rollback            %6.2f s  (%d restored, %d deleted): rollback/merge %.2f (goal <= 2)\n"+
		"  undo log of batch 2: %s (heap %s, index %s), %d rows, %d prior images: %.0f B per changed row; key jsonb %s, before jsonb %s\n"+
		"  target: growth during batch 2 %s (undo/growth %.2f); rows written %s of data (undo/data %.2f); total after %s",
		res.inserted, res.updated, rbbStep, rbbBase, res.load1.Seconds(),
		res.merge.Seconds(), res.split.upd.Seconds(), res.split.ins.Seconds(),
		res.mergeNone.Seconds(), res.splitNone.upd.Seconds(), res.splitNone.ins.Seconds(),
		x(res.merge, res.mergeNone), x(res.split.upd, res.splitNone.upd), x(res.split.ins, res.splitNone.ins),
		res.rollback.Seconds(), res.restored, res.deleted, x(res.rollback, res.merge),
		mb(res.undoBytes), mb(res.undoHeap), mb(res.undoIndex), res.undoRows, res.undoUpdates, float64(res.undoBytes)/float64(res.changed), mb(res.keyBytes), mb(res.beforeBytes),
		mb(res.targetGrowth), float64(res.undoBytes)/float64(res.targetGrowth),
		mb(res.changedRowBytes), float64(res.undoBytes)/float64(res.changedRowBytes), mb(res.targetAfter))
}

// rbbSplit sums the chunks' durations (from ChunkDone) by kind: chunks
// that updated rows, chunks that only inserted.
type rbbSplit struct {
	mu       sync.Mutex
	upd, ins time.Duration
}

func (s *rbbSplit) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.upd, s.ins = 0, 0
}

func (s *rbbSplit) ChunkDone(ctx context.Context, batchID int64, r backfill.ChunkResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Updated > 0 {
		s.upd += r.FinishedAt.Sub(r.StartedAt)
	} else {
		s.ins += r.FinishedAt.Sub(r.StartedAt)
	}
}

type rbbResult struct {
	load1, merge, mergeNone, rollback time.Duration
	inserted, updated, changed        int64
	deleted, restored                 int64
	undoBytes, undoRows, undoUpdates  int64
	keyBytes, beforeBytes             int64
	undoHeap, undoIndex               int64
	targetGrowth, targetAfter         int64
	changedRowBytes                   int64
	split, splitNone                  *rbbSplit
}

const (
	rbbBase  = 500_000   // batch 1: order_no 0..499,999
	rbbTotal = 1_000_000 // batch 2: order_no 0..999,999
	rbbStep  = 10_000    // rows per chunk
)

var rbbRegions = []string{"EU", "US", "APAC", "LATAM"}

// rbbJob writes order_no [0, hi) in chunks of rbbStep; version 2 changes
// every content column of the rows version 1 wrote.
func rbbJob(hi int64, version int64, rollback backfill.RollbackMechanism) backfill.Job {
	start := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	return backfill.Job{Name: "orders", NewRun: true, Rollback: rollback,
		Chunker: backfill.IntRange(0, hi, rbbStep),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, rbbRegions[id%4], id,
					fmt.Sprintf("v%d order line %d: a description of the product", version, id),
					fmt.Sprintf("%d.%02d", (id*7+version)%100_000, id%100),
					(id+version)%50,
					start.Add(time.Duration(id)*time.Second+time.Duration(version)*time.Hour),
					(id+version)%10 == 0,
					fmt.Sprintf("SKU-%06d-%d", id%100_000, version),
				); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "orders", Key: []string{"region", "order_no"},
			Columns: []string{"region", "order_no", "description", "unit_price", "quantity", "ordered_at", "is_returned", "product_code"}}}
}

// rbbLoad creates the target in a new database and runs batch 1 on it.
func rbbLoad(b *testing.B, ctx context.Context, split *rbbSplit) (*sqlx.DB, *backfill.Runner, time.Duration) {
	b.Helper()
	db := pgtest.New(b)
	rbbExec(b, db, `CREATE TABLE orders (
		region text NOT NULL, order_no bigint NOT NULL,
		description text, unit_price numeric(12,2), quantity int, ordered_at timestamptz, is_returned bool, product_code varchar(20),
		backfill_inserted_by bigint, backfill_updated_by bigint,
		PRIMARY KEY (region, order_no))`)
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, Hooks: split})
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	rep, err := r.Run(ctx, rbbJob(rbbBase, 1, ""))
	if err != nil {
		b.Fatal(err)
	}
	d := time.Since(t0)
	if rep.Counts.Inserted != rbbBase || rep.Status != backfill.RunCompleted {
		b.Fatalf("batch 1: %+v", rep)
	}
	// As autovacuum would soon after a load: hint bits, visibility map,
	// statistics; both copies start batch 2 from the same state.
	rbbExec(b, db, `VACUUM ANALYZE orders`)
	rbbExec(b, db, `VACUUM ANALYZE backfill.undo`)
	return db, r, d
}

func rbbExec(b *testing.B, db *sqlx.DB, q string) {
	b.Helper()
	if _, err := db.Exec(q); err != nil {
		b.Fatalf("%s: %v", q, err)
	}
}

func rbbInt(b *testing.B, db *sqlx.DB, q string, args ...any) int64 {
	b.Helper()
	var n int64
	if err := db.Get(&n, q, args...); err != nil {
		b.Fatalf("%s: %v", q, err)
	}
	return n
}

// rbbState is the md5 of every row, every column, in key order.
func rbbState(b *testing.B, db *sqlx.DB) string {
	b.Helper()
	var s string
	if err := db.Get(&s, `SELECT count(*) || ' ' || md5(string_agg(o::text, E'\n' ORDER BY region, order_no)) FROM orders o`); err != nil {
		b.Fatal(err)
	}
	return s
}

func rbbRun(b *testing.B) rbbResult {
	ctx := context.Background()
	var res rbbResult

	// Batch 2 without undo log, on a fresh copy; dropped before the
	// measured run so that both runs have the server to themselves.
	{
		split := &rbbSplit{}
		db, r, _ := rbbLoad(b, ctx, split)
		split.reset() // batch 2 only
		res.splitNone = split
		t0 := time.Now()
		rep, err := r.Run(ctx, rbbJob(rbbTotal, 2, backfill.RollbackNone))
		if err != nil {
			b.Fatal(err)
		}
		res.mergeNone = time.Since(t0)
		if rep.Counts.Inserted != rbbTotal-rbbBase || rep.Counts.Updated != rbbBase {
			b.Fatalf("batch 2 without undo log: %+v", rep.Counts)
		}
		rbbExec(b, db, `DROP TABLE orders`)
	}

	split := &rbbSplit{}
	db, r, load1 := rbbLoad(b, ctx, split)
	split.reset()
	res.load1, res.split = load1, split
	after1 := rbbState(b, db)
	undo0 := rbbInt(b, db, `SELECT pg_total_relation_size('backfill.undo')`)
	undoHeap0 := rbbInt(b, db, `SELECT pg_relation_size('backfill.undo')`)
	undoIndex0 := rbbInt(b, db, `SELECT pg_indexes_size('backfill.undo')`)
	target0 := rbbInt(b, db, `SELECT pg_total_relation_size('orders')`)

	job := rbbJob(rbbTotal, 2, "")
	t0 := time.Now()
	rep, err := r.Run(ctx, job)
	if err != nil {
		b.Fatal(err)
	}
	res.merge = time.Since(t0)
	if rep.Counts.Inserted != rbbTotal-rbbBase || rep.Counts.Updated != rbbBase {
		b.Fatalf("batch 2: %+v", rep.Counts)
	}
	res.inserted, res.updated = rep.Counts.Inserted, rep.Counts.Updated
	res.changed = res.inserted + res.updated
	res.undoBytes = rbbInt(b, db, `SELECT pg_total_relation_size('backfill.undo')`) - undo0
	res.undoHeap = rbbInt(b, db, `SELECT pg_relation_size('backfill.undo')`) - undoHeap0
	res.undoIndex = rbbInt(b, db, `SELECT pg_indexes_size('backfill.undo')`) - undoIndex0
	res.targetAfter = rbbInt(b, db, `SELECT pg_total_relation_size('orders')`)
	res.targetGrowth = res.targetAfter - target0
	var u struct {
		Rows    int64 `db:"n"`
		Updates int64 `db:"updates"`
		Key     int64 `db:"key"`
		Before  int64 `db:"before"`
	}
	if err := db.Get(&u, `SELECT count(*) AS n, count(*) FILTER (WHERE op = 'update') AS updates,
			coalesce(sum(pg_column_size(key)), 0) AS key, coalesce(sum(pg_column_size(before)), 0) AS before
		FROM backfill.undo WHERE batch_id = $1`, rep.BatchID); err != nil {
		b.Fatal(err)
	}
	res.undoRows, res.undoUpdates, res.keyBytes, res.beforeBytes = u.Rows, u.Updates, u.Key, u.Before
	if u.Rows != res.changed || u.Updates != res.updated {
		b.Fatalf("undo log of batch 2: %+v, want %d rows, %d updates", u, res.changed, res.updated)
	}
	res.changedRowBytes = rbbInt(b, db, `SELECT sum(pg_column_size(o.*)) FROM orders o WHERE backfill_updated_by = $1`, rep.BatchID)

	// As autovacuum would within a minute of the batch: statistics of
	// the target and of the undo log, which grew by 1,000,000 rows.
	rbbExec(b, db, `ANALYZE orders`)
	rbbExec(b, db, `ANALYZE backfill.undo`)

	t0 = time.Now()
	rb, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "bench", Why: "benchmark: withdraw batch 2"})
	if err != nil {
		b.Fatal(err)
	}
	res.rollback = time.Since(t0)
	res.deleted, res.restored = rb.Deleted, rb.Restored
	if rb.Deleted != res.inserted || rb.Restored != res.updated || rb.Status != backfill.RunRolledBack {
		b.Fatalf("rollback: %+v", rb)
	}
	if got := rbbState(b, db); got != after1 {
		b.Fatalf("after the rollback the table is %s, want the state after batch 1, %s", got, after1)
	}
	return res
}
