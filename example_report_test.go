package backfill_test

import (
	"context"
	"fmt"
	"math"

	"github.com/pgbackfill/backfill"
)

// The report of a run, read back from the manifest alone: what another
// machine with only the database's URL sees, without the job's code.
// contrib/report renders it as one HTML file; its JSON form is the twin.
func ExampleLoadRunReport() {
	ctx := context.Background()
	db := exampleDB("report")
	defer db.Close()
	db.MustExec(`CREATE TABLE squares (n int PRIMARY KEY, sq int NOT NULL)`)

	r, err := backfill.New(db, &backfill.Config{WorkerID: "loader-1"})
	if err != nil {
		fmt.Println(err)
		return
	}
	job := backfill.Job{
		Name:        "squares",
		CodeVersion: "v7",
		Chunker:     backfill.IntRange(0, 100, 25),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for n := c.Lo; n < c.Hi; n++ {
				if n == 13 {
					if err := w.Reject(ctx, map[string]any{"n": n}, "n", "unlucky"); err != nil {
						return err
					}
					continue
				}
				if err := w.Write(ctx, n, n*n); err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "squares", Key: []string{"n"}},
	}
	rep, err := r.Run(ctx, job)
	if err != nil {
		fmt.Println(err)
		return
	}

	// Elsewhere, later: only the database and the batch ID.
	report, err := backfill.LoadRunReport(ctx, db, backfill.NewPGManifest(""), rep.BatchID)
	if err != nil {
		fmt.Println(err)
		return
	}
	p := report.Plan
	fmt.Printf("%s %s: %s, rollback %s, started by %s\n", p.Job, p.CodeVersion, p.Scope, p.Rollback, p.StartedBy)
	fmt.Println("chunks:", report.Totals.ChunksByStatus, "rows read:", report.Totals.Rows.Read, "inserted:", report.Totals.Rows.Inserted)
	for _, b := range report.Buckets.Buckets {
		fmt.Printf("chunks %d to %d: %d chunks, %d rows\n", b.FirstSeq, b.LastSeq, b.Chunks, b.Rows.Read)
	}
	for _, w := range report.ChunkWorkers {
		fmt.Printf("%s completed %d chunks, %d rows\n", w.Worker, w.Chunks, w.Rows.Read)
	}
	for _, g := range report.Exceptions.Groups {
		fmt.Printf("exceptions %q on column %s: %d, e.g. row %d of chunk %s\n", g.Reason, g.Column, g.Count, g.Examples[0].Row, g.Examples[0].ChunkID)
	}
	t := report.Time
	fmt.Println("time parts add up:", math.Abs(t.WorkingSeconds+t.PausedSeconds+t.IdleSeconds-t.TotalSeconds) < 1e-6)
	// Output:
	// squares v7: int [0, 100) step 25, rollback none, started by loader-1
	// chunks: map[done:4] rows read: 100 inserted: 99
	// chunks 0 to 0: 1 chunks, 25 rows
	// chunks 1 to 1: 1 chunks, 25 rows
	// chunks 2 to 2: 1 chunks, 25 rows
	// chunks 3 to 3: 1 chunks, 25 rows
	// loader-1 completed 4 chunks, 100 rows
	// exceptions "unlucky" on column n: 1, e.g. row 14 of chunk int:0/25
	// time parts add up: true
}
