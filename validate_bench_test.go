package backfill_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// BenchmarkValidateMillionRowChunk answers: what does validating a chunk of
// 1,000,000 rows with Completeness, Aggregates and ReplayChangesNothing
// cost, as a fraction of the chunk's merge? Each iteration stages the
// chunk with PGMerger (COPY), merges it, runs the three checks in the
// chunk's transaction as the runner does, and rolls back.
//
//   - load: the target is empty; the merge takes the general upsert path
//     (a lookup per row, then the insert) and inserts every row.
//   - restatement: the target already holds the chunk's keys with another
//     amount; the merge updates every row.
//   - load-exact, restatement-exact: the same with Exact set on each
//     check: its joins run although the fingerprints are equal (what
//     every check cost before fingerprints).
//
// The first check computes the chunk's fingerprints (one scan of staging,
// one of the chunk's target rows); the others reuse them, so
// completeness-s holds nearly all of validate-s.
//
// Metrics, in seconds per chunk: stage-s (COPY into staging), merge-s,
// validate-s and one per check; validate/merge and validate/(stage+merge)
// are the fractions. Run it once (about a minute and a half):
//
//	go test -run '^$' -bench ValidateMillionRowChunk -benchtime 1x .
func BenchmarkValidateMillionRowChunk(b *testing.B) {
	const rows = 1_000_000
	ctx := context.Background()
	db := pgtest.New(b)
	if _, err := db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY, sold_at timestamptz NOT NULL, region text NOT NULL,
		amount numeric(12,2), qty int)`); err != nil {
		b.Fatal(err)
	}
	checksOf := func(exact bool) []backfill.Validator {
		return []backfill.Validator{
			backfill.Completeness{Exact: exact},
			backfill.Aggregates{Day: "sold_at", Dimensions: []string{"region"},
				Measures: []backfill.Measure{{Column: "amount"}, {Column: "qty"}}, Exact: exact},
			backfill.ReplayChangesNothing{Exact: exact},
		}
	}
	names := []string{"completeness-s", "aggregates-s", "replay-s"}
	regions := []string{"EU", "US", "APAC", "LATAM"}
	start := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	chunk := backfill.Chunk{ID: fmt.Sprintf("int:0/%d", rows), Kind: backfilltype.KindInt, Lo: 0, Hi: rows}

	restate := []string{`TRUNCATE orders`,
		`INSERT INTO orders SELECT i, '2024-03-01'::timestamptz + i * interval '83333 microseconds', (ARRAY['EU','US','APAC','LATAM'])[i % 4 + 1], -1, i % 50
			FROM generate_series(0, 999999) i`,
		`VACUUM ANALYZE orders`}
	for _, bc := range []struct {
		name    string
		prepare []string
		exact   bool
	}{
		{name: "load", prepare: []string{`TRUNCATE orders`}},
		{name: "restatement", prepare: restate},
		{name: "load-exact", prepare: []string{`TRUNCATE orders`}, exact: true},
		{name: "restatement-exact", prepare: restate, exact: true},
	} {
		checks := checksOf(bc.exact)
		b.Run(bc.name, func(b *testing.B) {
			for _, q := range bc.prepare {
				if _, err := db.Exec(q); err != nil {
					b.Fatal(err)
				}
			}
			var stage, merge, validate time.Duration
			per := make([]time.Duration, len(checks))
			for b.Loop() {
				t0 := time.Now()
				m := pgstore.NewMerger() // fresh: the general merge path
				info, err := m.Prepare(ctx, db, backfill.Target{Table: "orders", Key: []string{"id"}})
				if err != nil {
					b.Fatal(err)
				}
				tx, err := db.Beginx()
				if err != nil {
					b.Fatal(err)
				}
				st, err := m.Stage(ctx, tx, info)
				if err != nil {
					b.Fatal(err)
				}
				vals := make([]any, 5)
				for i := range int64(rows) {
					vals[0], vals[1], vals[2] = i, start.Add(time.Duration(i)*time.Second/12), regions[i%4]
					vals[3], vals[4] = fmt.Sprintf("%d.%02d", i%1000, i%100), i%50
					if err := st.Add(ctx, i+1, vals); err != nil {
						b.Fatal(err)
					}
				}
				t1 := time.Now()
				stage += t1.Sub(t0)
				mr, err := st.Merge(ctx)
				if err != nil {
					b.Fatal(err)
				}
				merge += time.Since(t1)
				if mr.Inserted+mr.Updated != rows {
					b.Fatalf("merged %+v", mr)
				}
				scope := backfill.ValidationScope{Chunk: chunk, Info: info, ChunkColumn: "id", Zone: time.UTC,
					Counts:  backfill.Counts{Read: rows, Inserted: mr.Inserted, Updated: mr.Updated},
					Staging: st.(backfilldriver.StagingTabler).StagingTable(), Stager: st}
				for i, v := range checks {
					t0 := time.Now()
					res, err := v.Validate(ctx, tx, scope)
					if err != nil {
						b.Fatal(err)
					}
					if !res.Passed {
						b.Fatalf("%s: %s", res.Check, res.Actual)
					}
					d := time.Since(t0)
					per[i] += d
					validate += d
				}
				rollback(b, st, tx)
			}
			n := float64(b.N)
			b.ReportMetric(stage.Seconds()/n, "stage-s")
			b.ReportMetric(merge.Seconds()/n, "merge-s")
			b.ReportMetric(validate.Seconds()/n, "validate-s")
			for i, name := range names {
				b.ReportMetric(per[i].Seconds()/n, name)
			}
			b.ReportMetric(validate.Seconds()/merge.Seconds(), "validate/merge")
			b.ReportMetric(validate.Seconds()/(stage+merge).Seconds(), "validate/(stage+merge)")
		})
	}
}

func rollback(b *testing.B, st backfilldriver.Stager, tx *sqlx.Tx) {
	b.Helper()
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		b.Fatal(err)
	}
}
