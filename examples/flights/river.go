package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/pgbackfill/backfill"
	backfillriver "github.com/pgbackfill/backfill/contrib/river"
)

// -river: the flights job as River jobs (contrib/river), one per day,
// into its own table flights_river, so that a plain run (into flights)
// and a River run of the same days compare row for row. Each process
// started with -river enqueues the run (once: the jobs are unique) and
// works River's queue with -concurrency workers until the run is done;
// start it in two terminals, kill -9 one of them, and the other finishes
// the run once River rescues the killed worker's jobs (-river-timeout).

// riverJobName is the flights job's name under River.
const riverJobName = "flights-3m-river"

// riverDDL creates the River run's target, shaped as flights.
const riverDDL = `CREATE TABLE IF NOT EXISTS flights_river (LIKE flights INCLUDING ALL)`

// riverFlightsJob is the flights job of days into flights_river, read by
// ex (the flights file, or a test's wrapper of it).
func riverFlightsJob(days backfill.Chunker, ex backfill.Extractor) backfill.Job {
	return backfill.Job{
		Name:        riverJobName,
		Source:      flightsSrc,
		CodeVersion: codeVersion,
		Chunker:     days,
		Extractor:   ex,
		Target:      backfill.Target{Table: "flights_river", Key: flightKey, Columns: flightColumns},
	}
}

// riverLoad creates the tables (unless o.noCreate) and River's (its
// migrations), enqueues the River run of days read by ex, and works
// River's queue with o.concurrency workers until the run is no longer
// running or ctx is done. It returns the run's status.
func riverLoad(ctx context.Context, out io.Writer, db *sqlx.DB, logger *slog.Logger, days backfill.Chunker, ex backfill.Extractor, o options) (backfill.Status, error) {
	if !o.noCreate {
		if _, err := db.ExecContext(ctx, schemaDDL+";"+riverDDL); err != nil {
			return backfill.Status{}, fmt.Errorf("create tables: %w", err)
		}
		m, err := rivermigrate.New(riverdatabasesql.New(db.DB), nil)
		if err != nil {
			return backfill.Status{}, err
		}
		if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
			return backfill.Status{}, fmt.Errorf("river migrations: %w", err)
		}
	}
	r, err := backfill.New(db, &backfill.Config{Logger: logger})
	if err != nil {
		return backfill.Status{}, err
	}
	job := riverFlightsJob(days, ex)
	w, err := backfillriver.NewWorker(r, &backfillriver.Options{BusySnooze: time.Second, PausedSnooze: 5 * time.Second}, job)
	if err != nil {
		return backfill.Status{}, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	timeout := o.riverTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	riverLog := logger
	if riverLog == nil {
		riverLog = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	client, err := river.NewClient(riverdatabasesql.New(db.DB), &river.Config{
		Queues:               map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: o.concurrency}},
		Workers:              workers,
		JobTimeout:           timeout,
		RescueStuckJobsAfter: timeout,
		FetchPollInterval:    200 * time.Millisecond,
		Logger:               riverLog,
	})
	if err != nil {
		return backfill.Status{}, err
	}

	// The run and its River jobs, in one transaction.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return backfill.Status{}, err
	}
	res, err := backfillriver.Enqueue(ctx, client, tx, r, job, nil)
	if err != nil {
		_ = tx.Rollback()
		return backfill.Status{}, err
	}
	if err := tx.Commit(); err != nil {
		return backfill.Status{}, err
	}
	fmt.Fprintf(out, "flights via River: batch %d (%s), %d chunks, %d River jobs inserted, %d already there or done\n",
		res.Run.BatchID, res.Run.Status, len(res.Run.Chunks), res.Inserted, res.Skipped)

	if err := client.Start(ctx); err != nil {
		return backfill.Status{}, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = client.Stop(sctx)
	}()
	last := -1
	for {
		st, err := r.StatusOf(ctx, res.Run.BatchID)
		if err != nil {
			return st, err
		}
		if st.Chunks.Done != last {
			last = st.Chunks.Done
			fmt.Fprintf(out, "flights via River: %d/%d chunks done, %d in flight, %d rows read\n", st.Chunks.Done, st.Chunks.Total, st.Chunks.InFlight, st.Rows.Read)
		}
		if st.Status != backfill.RunRunning {
			fmt.Fprintf(out, "flights via River: run %d %s: read %d, inserted %d, updated %d, unchanged %d, rejected %d, deduplicated %d\n",
				st.BatchID, st.Status, st.Rows.Read, st.Rows.Inserted, st.Rows.Updated, st.Rows.Unchanged, st.Rows.Rejected, st.Rows.Deduplicated)
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// riverJobsLeft counts the River jobs of batch that are not completed.
func riverJobsLeft(ctx context.Context, db *sql.DB, batch int64) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT count(*) FROM river_job WHERE kind = $1 AND (args->>'batch_id')::bigint = $2 AND state <> 'completed'`,
		backfillriver.Kind, batch).Scan(&n)
	return n, err
}
