package backfill_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
)

// A backfill whose source fails in the middle resumes where it stopped:
// completed chunks are not extracted again. This example runs on the
// in-memory fakes of package backfilltest; with backfill.New(db, nil) the
// same code runs on PostgreSQL.
func Example_resume() {
	ctx := context.Background()
	merger := backfilltest.NewMerger()
	merger.AddTable("readings", []string{"sensor", "minute"}, "sensor", "minute", "celsius")
	r, _ := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{
		Manifest: backfilltest.NewManifest(),
		Merger:   merger,
	})

	sourceDown := true
	extracted := map[string]int{}
	job := backfill.Job{
		Name:    "readings",
		Chunker: backfill.IntRange(0, 40, 10), // minutes [0, 40) in chunks of 10
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			extracted[c.ID]++
			if c.Lo == 20 && sourceDown {
				return errors.New("source unavailable")
			}
			for minute := c.Lo; minute < c.Hi; minute++ {
				if minute == 25 {
					// A row the source cannot deliver: rejected, never dropped.
					if err := w.Reject(ctx, map[string]any{"minute": minute}, "celsius", "sensor offline"); err != nil {
						return err
					}
					continue
				}
				if err := w.Write(ctx, "s1", minute, 20.5); err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "readings", Key: []string{"sensor", "minute"}},
	}

	report, err := r.Run(ctx, job)
	var partial *backfill.PartialError
	if errors.As(err, &partial) {
		fmt.Printf("first call: %s, %d of %d chunks done, failed at %s\n", report.Status, report.ChunksDone, report.ChunksTotal, partial.Failed.Chunk)
	}

	sourceDown = false
	report, err = r.Run(ctx, job)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("second call: %s, resumed=%t, ran %d chunks\n", report.Status, report.Resumed, report.ChunksRun)
	fmt.Printf("rows: read=%d inserted=%d rejected=%d\n", report.Counts.Read, report.Counts.Inserted, report.Counts.Rejected)
	fmt.Println("extractions of chunk [0, 10):", extracted["int:0/10"])
	fmt.Println("rows in target:", len(merger.Rows("readings")))
	// Output:
	// first call: failed, 2 of 4 chunks done, failed at [20, 30)
	// second call: completed, resumed=true, ran 2 chunks
	// rows: read=40 inserted=39 rejected=1
	// extractions of chunk [0, 10): 1
	// rows in target: 39
}
