// Command example runs a backfill job through River: it creates a small
// source table and its target, applies River's migrations, enqueues the
// job's run (one River job per chunk, in the run's transaction) and works
// River's queue with two workers until the run is completed.
//
//	DATABASE_URL=postgres://... go run ./example
//
// Run it again: the run is complete, nothing is enqueued or loaded.
// Start it in two terminals with a bigger source to see two processes
// share the chunks; kill -9 one of them and the other finishes once
// River rescues the killed worker's jobs (after JobTimeout).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/pgbackfill/backfill"
	backfillriver "github.com/pgbackfill/backfill/contrib/river"
)

func main() {
	if err := run(context.Background(), os.Getenv("DATABASE_URL"), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

// schema is the example's source (legacy_orders, 10,000 rows) and
// target (orders).
const schema = `
CREATE TABLE IF NOT EXISTS legacy_orders (order_no bigint, amount numeric);
INSERT INTO legacy_orders SELECT i, i % 100 + 0.5 FROM generate_series(0, 9999) i
	WHERE NOT EXISTS (SELECT FROM legacy_orders);
CREATE TABLE IF NOT EXISTS orders (order_no bigint PRIMARY KEY, amount numeric,
	backfill_inserted_by bigint, backfill_updated_by bigint)`

// ordersJob copies legacy_orders into orders, 1,000 order numbers a chunk.
func ordersJob(db *sqlx.DB) backfill.Job {
	return backfill.Job{
		Name:    "orders-through-river",
		Chunker: backfill.IntRange(0, 10000, 1000),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			rows, err := db.QueryContext(ctx, `SELECT order_no, amount FROM legacy_orders WHERE order_no >= $1 AND order_no < $2`, c.Lo, c.Hi)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var no int64
				var amount string
				if err := rows.Scan(&no, &amount); err != nil {
					return err
				}
				if err := w.Write(ctx, no, amount); err != nil {
					return err
				}
			}
			return rows.Err()
		}),
		Target: backfill.Target{Table: "orders", Key: []string{"order_no"}, Columns: []string{"order_no", "amount"}},
	}
}

func run(ctx context.Context, dsn string, out io.Writer) error {
	if dsn == "" {
		return errors.New("set DATABASE_URL")
	}
	db, err := sqlx.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return err
	}
	// River's tables: an application applies River's migrations once.
	migrator, err := rivermigrate.New(riverdatabasesql.New(db.DB), nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := backfill.New(db, &backfill.Config{Logger: quiet})
	if err != nil {
		return err
	}
	job := ordersJob(db)
	worker, err := backfillriver.NewWorker(r, nil, job)
	if err != nil {
		return err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	client, err := river.NewClient(riverdatabasesql.New(db.DB), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}},
		Workers: workers,
		// A chunk's job times out after a minute; River rescues the job
		// of a worker that died once it is that old.
		JobTimeout:           time.Minute,
		RescueStuckJobsAfter: time.Minute,
		Logger:               quiet,
	})
	if err != nil {
		return err
	}

	// The run and its River jobs, in one transaction.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	res, err := backfillriver.Enqueue(ctx, client, tx, r, job, nil)
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	fmt.Fprintf(out, "run %s with %d chunks: %d River jobs enqueued\n", res.Run.Status, len(res.Run.Chunks), res.Inserted)

	if err := client.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = client.Stop(sctx)
	}()
	for {
		st, err := r.StatusOf(ctx, res.Run.BatchID)
		if err != nil {
			return err
		}
		if st.Status != backfill.RunRunning {
			fmt.Fprintf(out, "run %s: %d of %d chunks done, %d rows read, %d inserted\n", st.Status, st.Chunks.Done, st.Chunks.Total, st.Rows.Read, st.Rows.Inserted)
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	var completed int
	if err := db.GetContext(ctx, &completed, `SELECT count(*) FROM river_job WHERE kind = $1 AND state = 'completed' AND (args->>'batch_id')::bigint = $2`,
		backfillriver.Kind, res.Run.BatchID); err != nil {
		return err
	}
	fmt.Fprintf(out, "River jobs completed: %d\n", completed)
	return nil
}
