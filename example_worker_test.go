package backfill_test

import (
	"context"
	"fmt"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
)

// A worker process for a scheduler: every host runs the same program,
// which calls Work and exits with its code. 0: the run is completed (by
// this worker or others); 1: it failed (see last_error in the manifest,
// fix the cause before restarting); 64: bad configuration; 75: not
// finished (cancelled, paused, chunks open, database away): restart later
// and it resumes. This example runs on the in-memory fakes of package
// backfilltest; with backfill.New(db, nil) the same code runs on
// PostgreSQL, where the workers heartbeat and fence frozen peers.
func ExampleWork() {
	ctx := context.Background()
	merger := backfilltest.NewMerger()
	merger.AddTable("events", []string{"id"}, "id", "kind")
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{
		Manifest: backfilltest.NewManifest(),
		Merger:   merger,
		WorkerID: "host-1",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	job := backfill.Job{
		Name:    "events",
		Chunker: backfill.IntRange(0, 100, 25),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, "click"); err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "events", Key: []string{"id"}},
	}
	code := backfill.Work(ctx, r, job)
	fmt.Println("exit code:", code)
	// A second worker started later finds the run completed.
	fmt.Println("exit code of a late worker:", backfill.Work(ctx, r, job))
	// In main: os.Exit(int(code))

	// Output:
	// exit code: 0
	// exit code of a late worker: 0
}
