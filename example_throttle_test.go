package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfillthrottle"
)

// Throttles hold a backfill beside production, and a critical level
// pauses it until a person resumes it. Here a custom signal reads the
// application's pressure from a table; at 150, above its critical level
// 100, the run pauses before its first chunk. Once the pressure is back
// to normal, Resume continues the run, and TimeSplit shows where its time
// went.
func Example_throttle() {
	ctx := context.Background()
	db := exampleDB("throttle")
	defer db.Close()
	db.MustExec(`CREATE TABLE pressure (v int NOT NULL)`)
	db.MustExec(`INSERT INTO pressure VALUES (150)`)
	db.MustExec(`CREATE TABLE totals (day int PRIMARY KEY, amount int NOT NULL)`)

	// Windows in an IANA zone; the night of Friday runs into Saturday.
	night, _ := backfillthrottle.ParseSchedule("Mon-Fri 22:00-06:00 Europe/Berlin")
	sat := time.Date(2026, 12, 5, 5, 30, 0, 0, time.UTC) // Saturday 06:30 in Berlin
	fmt.Println("Saturday 06:30 Berlin in the window:", night.Contains(sat))

	r, err := backfill.New(db, &backfill.Config{
		JobConcurrency: 2,    // across every process running the job
		ReturnOnPause:  true, // Run returns on the critical pause below, rather than wait for a resume
		RowsPerSecond:  100_000,
		Throttles: []backfillthrottle.Throttle{
			{Signal: backfillthrottle.SQLSignal("pressure", `SELECT v FROM pressure`), High: 80, Low: 50, MinHold: time.Second, Critical: 100},
			{Signal: backfillthrottle.ReplicaLagSignal(), High: 10, Low: 2},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	job := backfill.Job{
		Name:    "totals",
		Chunker: backfill.IntRange(1, 31, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for day := c.Lo; day < c.Hi; day++ {
				if err := w.Write(ctx, day, day*10); err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "totals", Key: []string{"day"}},
	}

	rep, err := r.Run(ctx, job)
	fmt.Println("paused:", errors.Is(err, backfill.ErrRunPaused), rep.Status, "chunks done:", rep.ChunksDone)

	db.MustExec(`UPDATE pressure SET v = 10`)
	rep, err = r.Resume(ctx, job, "oncall", "the application is quiet again")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("after resume:", rep.Status, "chunks done:", rep.ChunksDone)

	split, err := r.TimeSplit(ctx, rep.BatchID)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("time paused:", split.Paused > 0, "parts sum to total:",
		split.Working+split.Paused+split.Idle+split.Throttled["pressure"]+split.Throttled[backfill.RateSignalName] == split.Total)
	// Output:
	// Saturday 06:30 Berlin in the window: false
	// paused: true paused chunks done: 0
	// after resume: completed chunks done: 3
	// time paused: true parts sum to total: true
}
