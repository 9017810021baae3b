package backfill_test

import (
	"context"
	"fmt"

	"github.com/pgbackfill/backfill"
)

// A replay of an unchanged range with Job.SkipUnchanged compares
// fingerprints instead of staging and merging: every chunk is extracted,
// and the chunks whose source and target rows did not change since their
// last load are checkpointed unchanged; a chunk whose target row another
// session changed is merged, and its row restored.
func ExampleJob_skipUnchanged() {
	ctx := context.Background()
	db := exampleDB("skip_unchanged")
	defer db.Close()
	db.MustExec(`CREATE TABLE prices (sku bigint PRIMARY KEY, price numeric(10,2) NOT NULL,
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	r, err := backfill.New(db, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	job := backfill.Job{
		Name:    "prices",
		Chunker: backfill.IntRange(0, 400, 100), // skus [0, 400) in chunks of 100
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for sku := c.Lo; sku < c.Hi; sku++ {
				if err := w.Write(ctx, sku, fmt.Sprintf("%d.99", sku)); err != nil {
					return err
				}
			}
			return nil
		}),
		Target:        backfill.Target{Table: "prices", Key: []string{"sku"}, Columns: []string{"sku", "price"}},
		ChunkColumn:   "sku", // bounds each chunk's target rows
		SkipUnchanged: true,
		NewRun:        true, // each call restates the range
	}
	for i, edit := range []string{"", "", `UPDATE prices SET price = 0 WHERE sku = 250`} {
		if edit != "" {
			db.MustExec(edit)
		}
		rep, err := r.Run(ctx, job)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("call %d: %d chunks, %d skipped; read=%d inserted=%d updated=%d unchanged=%d\n",
			i+1, rep.ChunksRun, rep.ChunksSkipped, rep.Counts.Read, rep.Counts.Inserted, rep.Counts.Updated, rep.Counts.Unchanged)
	}
	// Output:
	// call 1: 4 chunks, 0 skipped; read=400 inserted=400 updated=0 unchanged=0
	// call 2: 4 chunks, 4 skipped; read=400 inserted=0 updated=0 unchanged=400
	// call 3: 4 chunks, 3 skipped; read=400 inserted=0 updated=1 unchanged=399
}
