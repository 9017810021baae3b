package backfilltest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
)

// Testing an extractor with the fakes, as the README shows: the table is
// declared as the job names it, with its columns' types, so that Write
// converts and checks values as it does against PostgreSQL.
func Example() {
	ctx := context.Background()
	m := backfilltest.NewMerger()
	m.AddTableColumns("sales.order_lines", []string{"source_system", "order_no", "line_no"},
		backfill.Column{Name: "source_system", Type: "text", BaseType: "text", NotNull: true},
		backfill.Column{Name: "order_no", Type: "text", BaseType: "text", NotNull: true},
		backfill.Column{Name: "line_no", Type: "bigint", BaseType: "int8", NotNull: true},
		backfill.Column{Name: "qty", Type: "bigint", BaseType: "int8"},
		backfill.Column{Name: "amount", Type: "numeric(12,2)", BaseType: "numeric", Precision: 12, Scale: 2},
		backfill.Column{Name: "ordered_at", Type: "timestamp with time zone", BaseType: "timestamptz"})
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{
		Manifest: backfilltest.NewManifest(), Merger: m,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	day := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	job := backfill.Job{
		Name:     "orders",
		Chunker:  backfill.Days(day, day.AddDate(0, 0, 1), time.UTC),
		Rollback: backfill.RollbackNone, // no lineage columns: no undo log
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if err := w.Write(ctx, "erp", "A-1", 1, 2, "19.90", c.Start.Add(time.Hour)); err != nil {
				return err
			}
			return w.Write(ctx, "erp", "A-2", 1, "two", "5.00", c.Start.Add(2*time.Hour)) // queued: qty is bigint
		}),
		MaxRunRejectRate: -1, // the bad row is on purpose
		Target: backfill.Target{Table: "sales.order_lines", Key: []string{"source_system", "order_no", "line_no"},
			Columns: []string{"source_system", "order_no", "line_no", "qty", "amount", "ordered_at"}},
	}
	report, err := r.Run(ctx, job)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("read %d, inserted %d, rejected %d\n", report.Counts.Read, report.Counts.Inserted, report.Counts.Rejected)
	fmt.Println(len(m.Rows("sales.order_lines")), "row")
	// Output:
	// read 2, inserted 1, rejected 1
	// 1 row
}
