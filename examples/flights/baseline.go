package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

// baselineDDL creates the hand-written baseline's tables: flights without
// the lineage columns, same primary key, and a one-row-per-day manifest.
const baselineDDL = `
CREATE TABLE IF NOT EXISTS flights_baseline (
	dep_local   timestamp  NOT NULL,
	origin      varchar(3) NOT NULL,
	destination varchar(3) NOT NULL,
	seq         integer    NOT NULL CHECK (seq >= 1),
	delay       integer,
	distance    integer,
	PRIMARY KEY (dep_local, origin, destination, seq)
);
CREATE TABLE IF NOT EXISTS baseline_manifest (
	day         date        PRIMARY KEY,
	rows        bigint      NOT NULL,
	finished_at timestamptz NOT NULL
);
`

const baselineMerge = `
INSERT INTO flights_baseline SELECT * FROM stage
ON CONFLICT (dep_local, origin, destination, seq) DO UPDATE
SET delay = EXCLUDED.delay, distance = EXCLUDED.distance
WHERE (flights_baseline.delay, flights_baseline.distance) IS DISTINCT FROM (EXCLUDED.delay, EXCLUDED.distance)`

// copyWriter is a backfill.RowWriter that forwards every row to a COPY
// statement; rejected rows are only counted.
type copyWriter struct {
	stmt    *sql.Stmt
	rows    int64
	rejects int64
}

var _ backfill.RowWriter = (*copyWriter)(nil)

func (w *copyWriter) Write(ctx context.Context, values ...any) error {
	if _, err := w.stmt.ExecContext(ctx, values...); err != nil {
		return err
	}
	w.rows++
	return nil
}

func (w *copyWriter) Reject(ctx context.Context, raw any, column, reason string) error {
	w.rejects++
	return nil
}

// baseline loads the same rows as the library's flights job (same
// extractor, same day chunks, same concurrency) into flights_baseline by
// hand: per day one transaction of temp table, COPY, INSERT ... ON
// CONFLICT and a manifest row. Every day is loaded on every call (no
// resume); a replay changes nothing.
func baseline(ctx context.Context, out io.Writer, db *sqlx.DB, src *Flights, days backfill.Chunker, concurrency int) error {
	if _, err := db.ExecContext(ctx, baselineDDL); err != nil {
		return fmt.Errorf("create baseline tables: %w", err)
	}
	chunks, err := days.Chunks(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "baseline: %s, %d chunks, concurrency %d\n", days.Scope(), len(chunks), concurrency)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		rows, rejects atomic.Int64
		done          atomic.Int64
		mu            sync.Mutex
		firstErr      error
		wg            sync.WaitGroup
	)
	next := make(chan backfill.Chunk)
	start := time.Now()
	for range concurrency {
		wg.Go(func() {
			for c := range next {
				if ctx.Err() != nil {
					continue
				}
				t := time.Now()
				w, err := baselineChunk(ctx, db, src, c)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("chunk %s: %w", c.ID, err)
					}
					mu.Unlock()
					cancel()
					continue
				}
				rows.Add(w.rows)
				rejects.Add(w.rejects)
				n := done.Add(1)
				mu.Lock()
				fmt.Fprintf(out, "  baseline chunk %3d/%d %-12s rows %6d  rejected %3d  %6.2fs\n",
					n, len(chunks), c.Start.Format("2006-01-02"), w.rows, w.rejects, time.Since(t).Seconds())
				mu.Unlock()
			}
		})
	}
	for _, c := range chunks {
		next <- c
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return firstErr
	}

	var n int64
	if err := db.GetContext(ctx, &n, `SELECT count(*) FROM flights_baseline`); err != nil {
		return fmt.Errorf("check target: %w", err)
	}
	fmt.Fprintf(out, "\nsummary (baseline: temp table + COPY + INSERT ... ON CONFLICT per day)\n")
	fmt.Fprintf(out, "  rows       %d read: %d written, %d rejected\n", rows.Load()+rejects.Load(), rows.Load(), rejects.Load())
	fmt.Fprintf(out, "  this call  %d chunks, %d rows in %s = %.0f rows/s\n",
		done.Load(), rows.Load(), elapsed.Round(time.Millisecond), float64(rows.Load())/max(elapsed.Seconds(), 1e-3))
	fmt.Fprintf(out, "  target     flights_baseline holds %d rows\n", n)
	fmt.Fprintf(out, "  memory     %s\n", memoryLine())
	return nil
}

// baselineChunk loads one day in one transaction.
func baselineChunk(ctx context.Context, db *sqlx.DB, src *Flights, c backfill.Chunk) (w *copyWriter, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	if _, err := tx.ExecContext(ctx, `CREATE TEMP TABLE stage (LIKE flights_baseline) ON COMMIT DROP`); err != nil {
		return nil, err
	}
	stmt, err := tx.PrepareContext(ctx, `COPY stage (dep_local, origin, destination, seq, delay, distance) FROM STDIN`)
	if err != nil {
		return nil, err
	}
	w = &copyWriter{stmt: stmt}
	if err := src.Extract(ctx, c, w); err != nil {
		stmt.Close()
		return nil, err
	}
	if _, err := stmt.ExecContext(ctx); err != nil { // flush the COPY
		stmt.Close()
		return nil, err
	}
	if err := stmt.Close(); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, baselineMerge); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO baseline_manifest (day, rows, finished_at) VALUES ($1, $2, now())
		ON CONFLICT (day) DO UPDATE SET rows = EXCLUDED.rows, finished_at = EXCLUDED.finished_at`,
		c.Start.Format("2006-01-02"), w.rows); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return w, nil
}
