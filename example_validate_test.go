package backfill_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

// CheckExceptionRate needs no database: it judges a chunk by its counts.
// A check is called with the chunk's scope; the runner does this after
// the merge of every chunk (see [backfill.Job.Validators]).
func ExampleCheckExceptionRate() {
	gate := backfill.CheckExceptionRate{MaxRate: 0.01} // at most 1% of a chunk's rows rejected
	for _, counts := range []backfill.Counts{
		{Read: 10_000, Inserted: 9_950, Rejected: 50},
		{Read: 10_000, Inserted: 9_700, Rejected: 300},
	} {
		res, err := gate.Validate(context.Background(), nil, backfill.ValidationScope{Counts: counts})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s %s: passed=%t, expected %s, got %s\n", res.Severity, res.Check, res.Passed, res.Expected, res.Actual)
	}
	// Output:
	// error exception_rate: passed=true, expected rejected/read <= 0.01, got 0.005 (50 of 10000 rows rejected)
	// error exception_rate: passed=false, expected rejected/read <= 0.01, got 0.03 (300 of 10000 rows rejected)
}

// The built-in checks as quality gates of a PostgreSQL backfill: a chunk
// that fails one of severity error rolls back and pauses the run, with the
// evidence in the manifest; [backfill.Runner.Resume] continues it once
// someone has looked. This example needs a database (DATABASE_URL), so it
// is compiled but not run.
func ExampleCompleteness() {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if url == "" { // never fall back to libpq's defaults
		log.Fatal("DATABASE_URL is not set: the PostgreSQL URL to load into")
	}
	db := sqlx.MustOpen("postgres", url)
	defer db.Close()

	var extractor backfill.Extractor // reads the orders of one range of ids from the source
	job := backfill.Job{
		Name:        "orders-2024",
		Chunker:     backfill.IntRange(0, 10_000_000, 100_000),
		Extractor:   extractor,
		ChunkColumn: "order_id", // bounds the chunk's rows in the target, for Completeness
		Target:      backfill.Target{Table: "sales.orders", Key: []string{"order_id"}},
		Validators: []backfill.Validator{
			backfill.Completeness{CompareContent: true},
			backfill.DuplicateKeys{Columns: []string{"source_system", "order_no"}},
			backfill.ReferentialIntegrity{Columns: []string{"customer_id"}, ParentTable: "sales.customers", ParentColumns: []string{"id"}},
			backfill.Aggregates{Day: "ordered_at", Dimensions: []string{"region"},
				Measures: []backfill.Measure{{Column: "amount", Tolerance: 0.005}, {Column: "quantity"}}},
			backfill.ReplayChangesNothing{},
			backfill.Sample{N: 200, Seed: 2024, Severity: backfill.SeverityWarn},
			backfill.CheckExceptionRate{MaxRate: 0.001},
		},
	}
	r, err := backfill.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	rep, err := r.Run(ctx, job)
	if err != nil {
		log.Print(err) // wraps backfill.ErrGateFailed when a gate stopped the run
	}
	results, err := backfill.NewPGManifest("").Validations(ctx, db, rep.BatchID)
	if err != nil {
		log.Fatal(err)
	}
	for _, v := range results {
		if !v.Passed {
			fmt.Printf("chunk %s: %s: expected %s, got %s; e.g. %v\n", v.ChunkID, v.Check, v.Expected, v.Actual, v.Sample)
		}
	}
}
