package backfill_test

import (
	"context"
	"fmt"
	"time"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
)

// runOnce runs a one-chunk job writing rows into a fake target and prints
// its counts. The fakes behave like PostgreSQL (same conformance suite).
func runOnce(r *backfill.Runner, name string, target backfill.Target, rows ...[]any) backfill.Report {
	// The examples reject rows on purpose: no run-level reject gate.
	job := backfill.Job{Name: name, Chunker: backfill.List("batch"), Target: target, NewRun: true, Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for _, row := range rows {
				if err := w.Write(ctx, row...); err != nil {
					return err
				}
			}
			return nil
		})}
	rep, err := r.Run(context.Background(), job)
	if err != nil {
		fmt.Println(err)
	}
	c := rep.Counts
	fmt.Printf("read %d: inserted %d, updated %d, unchanged %d, rejected %d, deduplicated %d\n",
		c.Read, c.Inserted, c.Updated, c.Unchanged, c.Rejected, c.Deduplicated)
	return rep
}

func newFakeRunner(m *backfilltest.Merger) (*backfill.Runner, *backfilltest.Manifest) {
	man := backfilltest.NewManifest()
	r, _ := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: man, Merger: m})
	return r, man
}

// AppendOnly: a replay resolves to the existing events; an event ID with
// other content goes to the exception queue, naming the differences.
func ExampleAppendOnly() {
	m := backfilltest.NewMerger()
	m.AddTable("events", []string{"event_id"}, "event_id", "kind", "amount")
	r, man := newFakeRunner(m)
	target := backfill.Target{Table: "events", Key: []string{"event_id"}, Mode: backfill.AppendOnly}

	runOnce(r, "events", target, []any{"e1", "sale", int64(10)}, []any{"e2", "refund", int64(-5)})
	runOnce(r, "events", target, []any{"e1", "sale", int64(10)}, []any{"e2", "refund", int64(-5)})
	rep := runOnce(r, "events", target, []any{"e1", "sale", int64(10)}, []any{"e2", "refund", int64(-7)})
	ex, _ := man.Exceptions(context.Background(), nil, rep.BatchID)
	fmt.Println(ex[0].Value, ex[0].Reason)
	fmt.Println(m.Rows("events"))
	// Output:
	// read 2: inserted 2, updated 0, unchanged 0, rejected 0, deduplicated 0
	// read 2: inserted 0, updated 0, unchanged 2, rejected 0, deduplicated 0
	// read 2: inserted 0, updated 0, unchanged 1, rejected 1, deduplicated 0
	// (e2) conflicting content for existing event: amount differ
	// [[e1 sale 10] [e2 refund -5]]
}

// Upsert with NewerVersionWins: versions arriving out of order end in the
// same state as in order.
func ExampleUpsert() {
	m := backfilltest.NewMerger()
	m.AddTable("products", []string{"sku"}, "sku", "name", "version")
	r, _ := newFakeRunner(m)
	target := backfill.Target{Table: "products", Key: []string{"sku"},
		Conflict: backfill.NewerVersionWins, Version: "version"}

	runOnce(r, "products", target, []any{"p1", "Widget v3", int64(3)})
	runOnce(r, "products", target, []any{"p1", "Widget v2", int64(2)}) // late and older: loses
	runOnce(r, "products", target, []any{"p1", "Widget v4", int64(4)})
	fmt.Println(m.Rows("products"))
	// Output:
	// read 1: inserted 1, updated 0, unchanged 0, rejected 0, deduplicated 0
	// read 1: inserted 0, updated 0, unchanged 1, rejected 0, deduplicated 0
	// read 1: inserted 0, updated 1, unchanged 0, rejected 0, deduplicated 0
	// [[p1 Widget v4 4]]
}

// History (SCD2): a late version splits the interval it falls into.
func ExampleHistory() {
	m := backfilltest.NewMerger()
	m.AddTable("addresses", []string{"customer", "valid_from"}, "customer", "valid_from", "valid_to", "city")
	r, _ := newFakeRunner(m)
	target := backfill.Target{Table: "addresses", Key: []string{"customer"}, Mode: backfill.History,
		Columns: []string{"customer", "valid_from", "city"}}
	day := func(d int) time.Time { return time.Date(2024, 1, d, 0, 0, 0, 0, time.UTC) }

	runOnce(r, "addresses", target, []any{"c1", day(1), "Oslo"}, []any{"c1", day(20), "Rome"})
	runOnce(r, "addresses", target, []any{"c1", day(10), "Bergen"}) // arrives late
	runOnce(r, "addresses", target, []any{"c1", day(10), "Bergen"}) // identical replay
	for _, row := range m.Rows("addresses") {
		to := "open"
		if row[2] != nil {
			to = row[2].(time.Time).Format(time.DateOnly)
		}
		fmt.Printf("%s [%s, %s) %s\n", row[0], row[1].(time.Time).Format(time.DateOnly), to, row[3])
	}
	// Output:
	// read 2: inserted 2, updated 0, unchanged 0, rejected 0, deduplicated 0
	// read 1: inserted 1, updated 0, unchanged 0, rejected 0, deduplicated 0
	// read 1: inserted 0, updated 0, unchanged 1, rejected 0, deduplicated 0
	// c1 [2024-01-01, 2024-01-10) Oslo
	// c1 [2024-01-10, 2024-01-20) Bergen
	// c1 [2024-01-20, open) Rome
}

// Keyless: normalisation rules derive the key of legacy rows; rows that
// collide with different content go to the exception queue.
func ExampleKeyless() {
	m := backfilltest.NewMerger()
	m.AddTable("customers", []string{"customer_key"}, "customer_key", "name", "city")
	r, man := newFakeRunner(m)
	target := backfill.Target{Table: "customers", Key: []string{"customer_key"}, Mode: backfill.Keyless,
		Columns: []string{"name", "city"},
		Derive: []backfill.KeyRule{{Column: "customer_key", From: "name",
			Rules: []backfill.Normalizer{backfill.Trim, backfill.CollapseSpace, backfill.NFC, backfill.CaseFold}}}}

	rep := runOnce(r, "customers", target,
		[]any{"Zoë  Müller", "Oslo"},
		[]any{" ZOË MÜLLER ", "Oslo"}, // the same customer
		[]any{"Bob Stone", "Rome"},
		[]any{"BOB STONE", "Paris"}) // the same key, another city: ambiguous
	ex, _ := man.Exceptions(context.Background(), nil, rep.BatchID)
	for _, e := range ex {
		fmt.Println("row", e.Row, e.Reason)
	}
	fmt.Println(m.Rows("customers"))
	// Output:
	// read 4: inserted 1, updated 0, unchanged 0, rejected 2, deduplicated 1
	// row 3 ambiguous derived key: rows 3 and others share it with different content
	// row 4 ambiguous derived key: rows 3 and others share it with different content
	// [[zoë müller Zoë  Müller Oslo]]
}
