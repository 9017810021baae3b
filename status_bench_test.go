package backfill

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

// BenchmarkStatus100k: PGManifest.Status of a run of 100,000 chunks, half
// of them checkpointed (over the last hour), with 10,000 exceptions of 5
// reasons and a worker. Reports only (ns/op).
//
//	go test -run '^$' -bench BenchmarkStatus100k -benchtime 20x .
func BenchmarkStatus100k(b *testing.B) {
	ctx := context.Background()
	db := pgtest.New(b)
	pm := NewPGManifest("")
	if err := pm.Init(ctx, db); err != nil {
		b.Fatal(err)
	}
	const n = 100_000
	ch := IntRange(0, 10*n, 10)
	chunks, err := ch.Chunks(ctx)
	if err != nil {
		b.Fatal(err)
	}
	job := Job{Name: "big", Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
	run, _, err := pm.StartRun(ctx, db, NewPlan(job, TableInfo{Target: job.Target}, chunks), "w", false)
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE backfill.runs SET created_at = now() - interval '1 hour' WHERE batch_id = $1`,
		`UPDATE backfill.chunks SET status = 'done', rows_read = 10, rows_inserted = 10, rows_processed = 10, reads = 1,
			checkpointed_at = now() - (n_half - seq) * interval '72 ms' FROM (SELECT 50000 AS n_half) h WHERE batch_id = $1 AND seq < 50000`,
		`INSERT INTO backfill.workers (worker_key, worker_id, batch_id, job_name, stale_after, started_at)
			VALUES ('k', 'w', $1, 'big', interval '30 s', now() - interval '1 hour')`,
		`INSERT INTO backfill.exceptions (batch_id, chunk_id, row_number, column_name, reason)
			SELECT $1, 'int:' || (g * 10) || '/' || (g * 10 + 10), 1, 'c', 'reason ' || (g % 5) FROM generate_series(0, 9999) g`,
		`ANALYZE backfill.chunks`, `ANALYZE backfill.exceptions`,
	} {
		args := []any{run.BatchID}
		if q[:7] == "ANALYZE" {
			args = nil
		}
		if _, err := db.Exec(q, args...); err != nil {
			b.Fatal(err)
		}
	}
	if os.Getenv("STATUS_EXPLAIN") != "" {
		for _, q := range []string{`SELECT * FROM backfill.run_progress WHERE batch_id = $1`, `SELECT * FROM backfill.chunks_in_flight WHERE batch_id = $1`} {
			var plan []string
			if err := db.Select(&plan, `EXPLAIN (ANALYZE, COSTS OFF) `+q, run.BatchID); err != nil {
				b.Fatal(err)
			}
			b.Log(strings.Join(plan, "\n"))
		}
	}
	// The floor, for scale on a loaded machine: one pass over the run's
	// chunks (a count and a sum), as ms per op.
	begin := time.Now()
	for i := 0; i < 5; i++ {
		var n, sum int64
		if err := db.QueryRow(`SELECT count(*), sum(rows_read) FROM backfill.chunks WHERE batch_id = $1`, run.BatchID).Scan(&n, &sum); err != nil {
			b.Fatal(err)
		}
	}
	scan := float64(time.Since(begin).Microseconds()) / 5000
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, err := pm.Status(ctx, db, run.BatchID)
		if err != nil {
			b.Fatal(err)
		}
		if s.Chunks.Done != n/2 || s.ETASeconds == nil {
			b.Fatalf("status: %+v", s.Chunks)
		}
	}
	b.ReportMetric(scan, "scan-ms")
}
