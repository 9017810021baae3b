package backfill_test

import (
	"context"
	"fmt"

	"github.com/pgbackfill/backfill"
)

// A batch is withdrawn with the undo log its merge kept: rows it inserted
// are deleted, rows it updated get their prior image back.
func ExampleRunner_Rollback() {
	ctx := context.Background()
	db := exampleDB("rollback")
	defer db.Close()
	// Lineage columns make the undo log the job's rollback mechanism.
	db.MustExec(`CREATE TABLE prices (sku text PRIMARY KEY, price numeric(10,2),
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	r, _ := backfill.New(db, nil)
	job := func(rows ...[]any) backfill.Job {
		return backfill.Job{Name: "prices", NewRun: true, Chunker: backfill.List("price-list"),
			Target: backfill.Target{Table: "prices", Key: []string{"sku"}, Columns: []string{"sku", "price"}},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				for _, row := range rows {
					if err := w.Write(ctx, row...); err != nil {
						return err
					}
				}
				return nil
			})}
	}
	show := func(when string) {
		var rows []string
		_ = db.Select(&rows, `SELECT sku || ' ' || price || ' (batch ' || backfill_updated_by || ')' FROM prices ORDER BY sku`)
		fmt.Println(when, rows)
	}

	_, _ = r.Run(ctx, job([]any{"apple", "1.00"}, []any{"pear", "2.00"}))
	show("after batch 1:")
	bad, _ := r.Run(ctx, job([]any{"apple", "100.00"}, []any{"plum", "3.00"})) // a wrong price list
	show("after batch 2:")

	preview, _ := r.Rollback(ctx, job(), backfill.RollbackOptions{BatchID: bad.BatchID, Preview: true})
	fmt.Printf("preview: delete %d, restore %d, conflicts %d\n", preview.Deleted, preview.Restored, preview.Conflicts)
	rep, err := r.Rollback(ctx, job(), backfill.RollbackOptions{BatchID: bad.BatchID, Actor: "ann", Why: "wrong price list"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("rolled back batch %d: %s\n", rep.BatchID, rep.Status)
	show("after rollback:")
	// Output:
	// after batch 1: [apple 1.00 (batch 1) pear 2.00 (batch 1)]
	// after batch 2: [apple 100.00 (batch 2) pear 2.00 (batch 1) plum 3.00 (batch 2)]
	// preview: delete 1, restore 1, conflicts 0
	// rolled back batch 2: rolled_back
	// after rollback: [apple 1.00 (batch 1) pear 2.00 (batch 1)]
}

// Without the job's code (an operator's shell, the backfill command), a
// batch is withdrawn by its ID alone: the rollback is rebuilt from the
// plan the manifest recorded when the run started.
func ExampleRunner_RollbackBatch() {
	ctx := context.Background()
	db := exampleDB("rollback_batch")
	defer db.Close()
	db.MustExec(`CREATE TABLE prices (sku text PRIMARY KEY, price numeric(10,2),
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	r, _ := backfill.New(db, nil)
	rep, _ := r.Run(ctx, backfill.Job{Name: "prices", Chunker: backfill.List("price-list"),
		Target: backfill.Target{Table: "prices", Key: []string{"sku"}, Columns: []string{"sku", "price"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, "apple", "1.00")
		})})

	// Later, elsewhere: only the database and the batch ID.
	preview, _ := r.RollbackBatch(ctx, rep.BatchID, backfill.RollbackOptions{Preview: true})
	fmt.Printf("preview: delete %d, restore %d\n", preview.Deleted, preview.Restored)
	done, err := r.RollbackBatch(ctx, rep.BatchID, backfill.RollbackOptions{Actor: "ann", Why: "wrong price list"})
	if err != nil {
		fmt.Println(err)
		return
	}
	var n int
	_ = db.Get(&n, `SELECT count(*) FROM prices`)
	fmt.Printf("batch %d %s; %d rows left\n", done.BatchID, done.Status, n)
	// Output:
	// preview: delete 1, restore 0
	// batch 1 rolled_back; 0 rows left
}
