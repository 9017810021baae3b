package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

// -rehearse N: before the flights run, N days of its plan are rehearsed
// (backfill.Runner.Rehearse: loaded in transactions that roll back),
// chosen by their estimated rows (EstimateRows: the smallest, the
// largest and evenly spaced ranks between); the rehearsal's forecast of
// the whole run is printed, and after the run, beside what the run took:
// its duration, the WAL the server wrote during it and the growth of the
// flights table and its indexes, measured by this program around the
// run.

// EstimateRows estimates the rows of day c from the index OpenFlights
// built: the samples (one every stride rows) whose effective date falls
// in c, times the stride. It needs a file whose dates never decrease.
func (f *Flights) EstimateRows(_ context.Context, c backfill.Chunk) (int64, error) {
	ix := &f.idx
	if !ix.sorted {
		return 0, errors.New("flights: row estimates need a file sorted by date")
	}
	lo, err := civilMicros(c.Start)
	if err != nil {
		return 0, err
	}
	hi, err := civilMicros(c.End)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, d := range ix.samples {
		if d >= lo && d < hi {
			n++
		}
	}
	return n * ix.stride, nil
}

// rehearse rehearses days of job and prints the forecast.
func rehearse(ctx context.Context, out io.Writer, runner *backfill.Runner, job backfill.Job, src *Flights, o options) (backfill.Rehearsal, error) {
	// WarmExtract: a run reads consecutive days, which share the row
	// group the extractor decoded (about 16 days a row group, rowGroups
	// keeps it); a rehearsed day, far from the others, would pay the
	// decoding of a whole row group (about 270,000 rows) for its own.
	opts := backfill.RehearseOptions{Sample: o.rehearse, Concurrency: o.concurrency, WarmExtract: true}
	if src.idx.sorted {
		opts.Estimate = src.EstimateRows
	}
	begin := time.Now()
	rh, err := runner.Rehearse(ctx, job, opts)
	if err != nil {
		return rh, fmt.Errorf("rehearse: %w", err)
	}
	fmt.Fprintf(out, "rehearsal %d: %d of %d days in %s, rolled back:\n", rh.ID, len(rh.Chunks), rh.ChunksTotal, time.Since(begin).Round(time.Millisecond))
	for _, c := range rh.Chunks {
		p := c.Phases
		fmt.Fprintf(out, "  %s est %6d read %6d  %6.2fs (extract %.2fs stage %.2fs merge %.2fs validate %.2fs checkpoint %.2fs; beside others %.2fs)  WAL %s  table +%s  indexes +%s  undo +%s  staging %s  heap %s\n",
			c.Chunk.Start.Format("2006-01-02"), c.EstimatedRows, c.Counts.Read, c.Duration.Seconds(), p.Extract.Seconds(), p.Stage.Seconds(),
			p.Merge.Seconds(), p.Validate.Seconds(), p.Checkpoint.Seconds(), c.ConcurrentDuration.Seconds(), mib(c.WALBytes), mib(c.TargetBytes), mib(c.IndexBytes),
			mib(c.UndoBytes), mib(c.TempBytes), mib(c.HeapBytes))
	}
	f := rh.Forecast
	fmt.Fprintf(out, "  forecast (by %s, concurrency %d): %s (%s to %s), %d rows, WAL %s, table +%s, indexes +%s, undo log +%s, heap %s\n",
		f.Basis, f.Concurrency, f.Duration.Round(time.Millisecond), f.DurationLow.Round(time.Millisecond), f.DurationHigh.Round(time.Millisecond), f.Rows, mib(f.WALBytes),
		mib(f.TargetBytes), mib(f.IndexBytes), mib(f.UndoBytes), mib(f.HeapBytes))
	fmt.Fprintf(out, "  overhead   %s of it beyond the chunks' transactions (a commit %s on a server with %s; the run's creation %s)\n",
		f.Overhead.Round(time.Millisecond), f.CommitTime.Round(10*time.Microsecond), f.Durability, f.RunStart.Round(time.Millisecond))
	return rh, nil
}

// runMark is what the program measures before and after the flights run.
type runMark struct {
	WAL     string `db:"wal"`
	Table   int64  `db:"table_bytes"`
	Indexes int64  `db:"index_bytes"`
}

func markRun(ctx context.Context, db *sqlx.DB) (runMark, error) {
	var m runMark
	err := sqlx.GetContext(ctx, db, &m, `SELECT pg_current_wal_insert_lsn()::text AS wal,
		pg_table_size('flights'::regclass) AS table_bytes, pg_indexes_size('flights'::regclass) AS index_bytes`)
	return m, err
}

// compareForecast prints what the run took beside rh's forecast.
func compareForecast(ctx context.Context, out io.Writer, db *sqlx.DB, rh backfill.Rehearsal, before runMark, took time.Duration, rows int64) error {
	after, err := markRun(ctx, db)
	if err != nil {
		return err
	}
	var wal int64
	if err := db.GetContext(ctx, &wal, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, after.WAL, before.WAL); err != nil {
		return err
	}
	f := rh.Forecast
	fmt.Fprintf(out, "  forecast   rehearsal %d against the run: duration %s (forecast %s: %+.0f%%, range %s to %s), rows %d (forecast %d: %+.1f%%)\n",
		rh.ID, took.Round(time.Millisecond), f.Duration.Round(time.Millisecond), pct(float64(f.Duration), float64(took)),
		f.DurationLow.Round(time.Millisecond), f.DurationHigh.Round(time.Millisecond), rows, f.Rows, pct(float64(f.Rows), float64(rows)))
	fmt.Fprintf(out, "             WAL %s (forecast %s: %+.0f%%), table +%s (forecast +%s: %+.0f%%), indexes +%s (forecast +%s: %+.0f%%)\n",
		mib(wal), mib(f.WALBytes), pct(float64(f.WALBytes), float64(wal)),
		mib(after.Table-before.Table), mib(f.TargetBytes), pct(float64(f.TargetBytes), float64(after.Table-before.Table)),
		mib(after.Indexes-before.Indexes), mib(f.IndexBytes), pct(float64(f.IndexBytes), float64(after.Indexes-before.Indexes)))
	return nil
}

// pct is how far forecast is from actual, in percent of actual.
func pct(forecast, actual float64) float64 {
	if actual == 0 {
		return 0
	}
	return 100 * (forecast - actual) / actual
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
