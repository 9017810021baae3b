package backfill_test

import (
	"context"
	"fmt"
	"strings"
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
// Each kind runs twice on fresh copies, alternating (none, undo log, none,
// undo log), and the faster run counts: the server may be shared. The
// last run is the one measured and rolled back.
//
// Metrics: load1-s (batch 1), merge-s (batch 2, wall time of Runner.Run),
// merge-noundo-s (the same with RollbackNone), undo-overhead (merge-s / merge-noundo-s), rollback-s
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
		"  target: growth during batch 2 %s (undo/growth %.2f); rows written %s of data (undo/data %.2f); total after %s\n"+
		"  every batch 2 run, in order: %s",
		res.inserted, res.updated, rbbStep, rbbBase, res.load1.Seconds(),
		res.merge.Seconds(), res.split.upd.Seconds(), res.split.ins.Seconds(),
		res.mergeNone.Seconds(), res.splitNone.upd.Seconds(), res.splitNone.ins.Seconds(),
		x(res.merge, res.mergeNone), x(res.split.upd, res.splitNone.upd), x(res.split.ins, res.splitNone.ins),
		res.rollback.Seconds(), res.restored, res.deleted, x(res.rollback, res.merge),
		mb(res.undoBytes), mb(res.undoHeap), mb(res.undoIndex), res.undoRows, res.undoUpdates, float64(res.undoBytes)/float64(res.changed), mb(res.keyBytes), mb(res.beforeBytes),
		mb(res.targetGrowth), float64(res.undoBytes)/float64(res.targetGrowth),
		mb(res.changedRowBytes), float64(res.undoBytes)/float64(res.changedRowBytes), mb(res.targetAfter),
		strings.Join(res.runs, ", "))
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
	runs                              []string // every timed batch 2, in order
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

// rbbBatch2 is one copy: batch 1 on a new database, then batch 2 with
// the rollback mechanism given, timed.
type rbbBatch2 struct {
	db          *sqlx.DB
	r           *backfill.Runner
	job         backfill.Job
	rep         backfill.Report
	load1, took time.Duration
	split       *rbbSplit
	after1      string // state after batch 1 (with keep)
	// Sizes before batch 2.
	undo0, undoHeap0, undoIndex0, target0 int64
}

func rbbCopy(b *testing.B, ctx context.Context, mech backfill.RollbackMechanism, keep bool) rbbBatch2 {
	b.Helper()
	c := rbbBatch2{split: &rbbSplit{}, job: rbbJob(rbbTotal, 2, mech)}
	c.db, c.r, c.load1 = rbbLoad(b, ctx, c.split)
	c.split.reset() // batch 2 only
	if keep {
		c.after1 = rbbState(b, c.db)
		c.undo0 = rbbInt(b, c.db, `SELECT pg_total_relation_size('backfill.undo')`)
		c.undoHeap0 = rbbInt(b, c.db, `SELECT pg_relation_size('backfill.undo')`)
		c.undoIndex0 = rbbInt(b, c.db, `SELECT pg_indexes_size('backfill.undo')`)
		c.target0 = rbbInt(b, c.db, `SELECT pg_total_relation_size('orders')`)
	}
	t0 := time.Now()
	rep, err := c.r.Run(ctx, c.job)
	if err != nil {
		b.Fatal(err)
	}
	c.took, c.rep = time.Since(t0), rep
	if rep.Counts.Inserted != rbbTotal-rbbBase || rep.Counts.Updated != rbbBase || rep.Status != backfill.RunCompleted {
		b.Fatalf("batch 2 (rollback %q): %+v", mech, rep)
	}
	if !keep {
		// Free the server of it before the next copy.
		rbbExec(b, c.db, `DROP TABLE orders; DROP SCHEMA backfill CASCADE`)
	}
	return c
}

func rbbRun(b *testing.B) rbbResult {
	ctx := context.Background()
	var res rbbResult

	// Batch 2 runs four times, each on a fresh copy, alternating without
	// and with the undo log; the faster run of each kind counts (the
	// machine may be shared). The last one is measured and rolled back.
	var c rbbBatch2
	for i := range 2 {
		none := rbbCopy(b, ctx, backfill.RollbackNone, false)
		res.runs = append(res.runs, fmt.Sprintf("none %.2f s", none.took.Seconds()))
		if i == 0 || none.took < res.mergeNone {
			res.mergeNone, res.splitNone = none.took, none.split
		}
		c = rbbCopy(b, ctx, "", i == 1)
		res.runs = append(res.runs, fmt.Sprintf("undo log %.2f s", c.took.Seconds()))
		if i == 0 || c.took < res.merge {
			res.merge, res.split = c.took, c.split
		}
		if i == 0 || c.load1 < res.load1 {
			res.load1 = c.load1
		}
	}
	db, rep := c.db, c.rep
	res.inserted, res.updated = rep.Counts.Inserted, rep.Counts.Updated
	res.changed = res.inserted + res.updated
	res.undoBytes = rbbInt(b, db, `SELECT pg_total_relation_size('backfill.undo')`) - c.undo0
	res.undoHeap = rbbInt(b, db, `SELECT pg_relation_size('backfill.undo')`) - c.undoHeap0
	res.undoIndex = rbbInt(b, db, `SELECT pg_indexes_size('backfill.undo')`) - c.undoIndex0
	res.targetAfter = rbbInt(b, db, `SELECT pg_total_relation_size('orders')`)
	res.targetGrowth = res.targetAfter - c.target0
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
	// Only updates are logged (prior images); inserts are found by lineage.
	if u.Rows != res.updated || u.Updates != res.updated {
		b.Fatalf("undo log of batch 2: %+v, want %d rows, all updates", u, res.updated)
	}
	res.changedRowBytes = rbbInt(b, db, `SELECT sum(pg_column_size(o.*)) FROM orders o WHERE backfill_updated_by = $1`, rep.BatchID)

	// As autovacuum would within a minute of the batch: statistics of
	// the target and of the undo log, which grew by 1,000,000 rows.
	rbbExec(b, db, `ANALYZE orders`)
	rbbExec(b, db, `ANALYZE backfill.undo`)

	t0 := time.Now()
	rb, err := c.r.Rollback(ctx, c.job, backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "bench", Why: "benchmark: withdraw batch 2"})
	if err != nil {
		b.Fatal(err)
	}
	res.rollback = time.Since(t0)
	res.deleted, res.restored = rb.Deleted, rb.Restored
	if rb.Deleted != res.inserted || rb.Restored != res.updated || rb.Status != backfill.RunRolledBack {
		b.Fatalf("rollback: %+v", rb)
	}
	if got := rbbState(b, db); got != c.after1 {
		b.Fatalf("after the rollback the table is %s, want the state after batch 1, %s", got, c.after1)
	}
	return res
}
