package backfill_test

import (
	"context"
	"fmt"

	"github.com/pgbackfill/backfill"
)

// progressBar is a ProgressHooks: it prints where the run stands when a
// call starts (counting earlier calls) and when it ends.
type progressBar struct{}

func (progressBar) ChunkDone(context.Context, int64, backfill.ChunkResult) {}

func (progressBar) ChunkFailed(_ context.Context, _ int64, f backfill.ChunkFailure) {
	fmt.Println("chunk failed:", f.Chunk.ID, "final:", f.Final)
}

func (progressBar) Progress(_ context.Context, s backfill.Status) {
	if s.Status != backfill.RunRunning || s.Chunks.Done == 0 {
		fmt.Printf("progress: %d/%d chunks, %d rows\n", s.Chunks.Done, s.Chunks.Total, s.Rows.Read)
	}
}

// Status reads a run's progress from the manifest, from any process: the
// job's latest run, or by job name without its code
// (PGManifest.JobStatus), or in SQL from backfill.run_progress. A
// ProgressHooks gets snapshots that count the work of earlier calls.
func Example_status() {
	ctx := context.Background()
	db := exampleDB("status")
	defer db.Close()
	db.MustExec(`CREATE TABLE sums (id int PRIMARY KEY, v int NOT NULL)`)
	r, err := backfill.New(db, &backfill.Config{Hooks: progressBar{}})
	if err != nil {
		fmt.Println(err)
		return
	}
	job := backfill.Job{
		Name:    "sums",
		Chunker: backfill.IntRange(0, 40, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, id*2); err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "sums", Key: []string{"id"}},
	}
	if _, err := r.Run(ctx, job); err != nil {
		fmt.Println(err)
		return
	}
	st, err := backfill.NewPGManifest("").JobStatus(ctx, db, "sums")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(st.Status, st.Chunks.Done, "of", st.Chunks.Total, "chunks,", st.Rows.Inserted, "rows inserted, ETA", *st.ETASeconds)
	var eta *float64 // the same in SQL
	if err := db.Get(&eta, `SELECT eta_seconds FROM backfill.run_progress WHERE job_name = 'sums' ORDER BY batch_id DESC LIMIT 1`); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("run_progress eta_seconds:", *eta)
	// Output:
	// progress: 0/4 chunks, 0 rows
	// progress: 4/4 chunks, 40 rows
	// completed 4 of 4 chunks, 40 rows inserted, ETA 0
	// run_progress eta_seconds: 0
}
