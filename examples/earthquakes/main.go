// Command earthquakes backfills the 1,707 USGS events of earthquakes.json
// (npm package vega-datasets 3.2.1: one week of the USGS "all earthquakes"
// feed, 2018-01-31 to 2018-02-07) into PostgreSQL, one UTC day of event
// time per chunk, keyed by the event id, where the newer source version
// (USGS's "updated" time) wins. See README.md.
//
//	DATABASE_URL=postgres://... go run ./earthquakes [-replay] [-correction] [-hours] [-concurrency 2] [-new-run]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgurl"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the "postgres" database/sql driver

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/examples/internal/cli"
)

// codeVersion is the version of the transformation (extract.go). It is part
// of the plan fingerprint: bump it by hand when the rows a chunk produces
// change, and only then.
const codeVersion = "earthquakes-example/1"

const (
	quakesJob   = "earthquakes"
	quakesSrc   = "vega-datasets@3.2.1/earthquakes.json"
	quakesFile  = "earthquakes.json"
	quakesTable = "earthquakes"
)

// schemaDDL creates the target table; it is idempotent.
const schemaDDL = `
CREATE TABLE IF NOT EXISTS earthquakes (
	id                text             PRIMARY KEY,
	event_time        timestamptz      NOT NULL,
	source_updated_at timestamptz      NOT NULL,
	mag               double precision,
	mag_type          text,
	place             text,
	status            text,
	type              text,
	tz_offset_min     smallint,
	lon               double precision,
	lat               double precision,
	depth_km          double precision,
	ingested_at       timestamptz,
	backfill_inserted_by bigint,
	backfill_updated_by  bigint
);
CREATE INDEX IF NOT EXISTS earthquakes_event_time ON earthquakes (event_time);
COMMENT ON TABLE earthquakes IS 'USGS earthquake feed (all_week.geojson of 2018-02-07, from vega-datasets@3.2.1 earthquakes.json)';
COMMENT ON COLUMN earthquakes.id IS 'USGS event id (feature id), e.g. ci37868143';
COMMENT ON COLUMN earthquakes.event_time IS 'event (origin) time: properties.time; the chunking dimension';
COMMENT ON COLUMN earthquakes.source_updated_at IS 'when USGS last modified the event: properties.updated; the version compared by newer-version-wins';
COMMENT ON COLUMN earthquakes.tz_offset_min IS 'properties.tz: UTC offset in minutes at the epicentre, as the source gave it';
COMMENT ON COLUMN earthquakes.depth_km IS 'third coordinate of the Point geometry, km below sea level';
`

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "earthquakes:", err)
		os.Exit(cli.ExitCode(err))
	}
}

type options struct {
	dataDir     string
	concurrency int
	newRun      bool
	hours       bool
	replay      bool
	correction  bool
	corrections int
	verbose     bool
}

func run() error {
	var o options
	flag.StringVar(&o.dataDir, "data", "", "directory holding earthquakes.json (default: earthquakes/data, examples/earthquakes/data or data, whichever exists)")
	flag.IntVar(&o.concurrency, "concurrency", 2, "chunks loaded at once")
	flag.BoolVar(&o.newRun, "new-run", false, "start a new run of the load even if one exists (needed after changing -hours)")
	flag.BoolVar(&o.hours, "hours", false, "chunk by UTC hour of event time instead of by UTC day")
	flag.BoolVar(&o.replay, "replay", false, "after the load, run it again as a new run (Job.NewRun): nothing is written")
	flag.BoolVar(&o.correction, "correction", false, "after the load, simulate corrections arriving before, after and with the original versions, in scratch tables")
	flag.IntVar(&o.corrections, "corrections", 20, "how many events -correction corrects")
	flag.BoolVar(&o.verbose, "v", false, "log the runner's events to stderr")
	cli.SetUsage(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		return cli.Usage(fmt.Errorf("unexpected arguments %q (the flags are listed by -h)", flag.Args()))
	}
	if o.concurrency < 1 {
		return cli.Usage(errors.New("-concurrency must be at least 1"))
	}
	if o.corrections < 1 {
		return cli.Usage(errors.New("-corrections must be at least 1"))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	dir, err := cli.FindDataDir(o.dataDir, "earthquakes", quakesFile)
	if err != nil {
		return err
	}
	src, err := OpenQuakes(filepath.Join(dir, quakesFile))
	if err != nil {
		return err
	}
	first, end, ok := src.Scope()
	if !ok {
		return fmt.Errorf("%s has no feature with an event time", quakesFile)
	}
	fmt.Printf("earthquakes: pid %d; source %s: %d features, event times %s .. %s, %d without a usable time\n",
		os.Getpid(), quakesFile, src.Len(), src.feats[0].Quake.Time.Format(time.RFC3339Nano),
		src.feats[len(src.feats)-1].Quake.Time.Format(time.RFC3339Nano), len(src.untimed))

	dsn, err := cli.DatabaseURL("see README.md: bash internal/pgtest/with-postgres.sh sh -c 'cd examples && go run ./earthquakes'")
	if err != nil {
		return err
	}
	db, err := pgurl.Open(ctx, dsn)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()
	db.SetMaxOpenConns(2*o.concurrency + 2)
	var logger *slog.Logger
	if o.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	chunker := chunkerFor(first, end, o.hours)
	if _, err := load(ctx, os.Stdout, db, logger, src, chunker, o); err != nil {
		return err
	}
	if o.replay {
		if _, _, err := replay(ctx, os.Stdout, db, logger, src, chunker, o); err != nil {
			return err
		}
	}
	if o.correction {
		res, err := correction(ctx, os.Stdout, db, logger, src, chunker, o)
		if err != nil {
			return err
		}
		if !res.Same() {
			return errors.New("correction: the arrangements ended in different states")
		}
	}
	return nil
}

// chunkerFor chunks [first, end) by UTC day or UTC hour of event time.
func chunkerFor(first, end time.Time, hours bool) backfill.Chunker {
	if hours {
		return backfill.Hours(first, end, time.UTC)
	}
	return backfill.Days(first, end, time.UTC)
}

// maxRunRejectRate is the jobs' Job.MaxRunRejectRate: 0, the library's
// default gate (a run that rejects more than 10% of the events it reads
// pauses; the feed's malformed events are rare). The tests' synthetic
// source, a few events of which most are malformed on purpose, turns it
// off.
var maxRunRejectRate = 0.0

// quakeJob is a job that merges the events of src into table: keyed by
// id, Upsert where the greater source_updated_at wins.
func quakeJob(name, source string, src backfill.Extractor, chunker backfill.Chunker, table string, newRun bool) backfill.Job {
	return backfill.Job{
		Name:        name,
		Source:      source,
		CodeVersion: codeVersion,
		Chunker:     chunker,
		Extractor:   src,
		Target: backfill.Target{
			Table:    table,
			Key:      quakeKey,
			Columns:  quakeColumns,
			Mode:     backfill.Upsert,
			Conflict: backfill.NewerVersionWins,
			Version:  versionColumn,
		},
		NewRun:           newRun,
		MaxRunRejectRate: maxRunRejectRate,
	}
}

func newRunner(db *sqlx.DB, logger *slog.Logger, hooks backfill.Hooks, o options) (*backfill.Runner, error) {
	return backfill.New(db, &backfill.Config{
		Concurrency: o.concurrency,
		Manifest:    backfill.NewPGManifest(""),
		Logger:      logger,
		Hooks:       hooks,
	})
}

// load creates the table, runs the earthquakes job over chunker and prints
// one line per chunk and a summary read from the manifest.
func load(ctx context.Context, out io.Writer, db *sqlx.DB, logger *slog.Logger, src *Quakes, chunker backfill.Chunker, o options) (backfill.Report, error) {
	if _, err := db.ExecContext(ctx, schemaDDL); err != nil {
		return backfill.Report{}, fmt.Errorf("create table: %w", err)
	}
	fmt.Fprintf(out, "load: job %s, %s, concurrency %d\n", quakesJob, chunker.Scope(), o.concurrency)
	return runJob(ctx, out, db, logger, quakeJob(quakesJob, quakesSrc, src, chunker, quakesTable, o.newRun), o)
}

// replay runs the earthquakes job again as a new run and reports how many
// target rows it rewrote, by comparing every row's xmin and ctid before
// and after: a replay must write none.
func replay(ctx context.Context, out io.Writer, db *sqlx.DB, logger *slog.Logger, src *Quakes, chunker backfill.Chunker, o options) (backfill.Report, int, error) {
	before, err := rowVersions(ctx, db, quakesTable)
	if err != nil {
		return backfill.Report{}, 0, err
	}
	fmt.Fprintf(out, "\nreplay: job %s again with Job.NewRun (a new batch over the same file)\n", quakesJob)
	rep, err := runJob(ctx, out, db, logger, quakeJob(quakesJob, quakesSrc, src, chunker, quakesTable, true), o)
	if err != nil {
		return rep, 0, err
	}
	after, err := rowVersions(ctx, db, quakesTable)
	if err != nil {
		return rep, 0, err
	}
	rewritten := 0 // rows written, inserted or deleted
	for id, v := range after {
		if before[id] != v {
			rewritten++
		}
	}
	for id := range before {
		if _, ok := after[id]; !ok {
			rewritten++
		}
	}
	fmt.Fprintf(out, "  target     %d of %d rows rewritten by the replay (xmin and ctid compared before and after)\n", rewritten, len(after))
	return rep, rewritten, nil
}

// rowVersions returns each row's "xmin ctid": both change whenever the row
// is written, even with identical content.
func rowVersions(ctx context.Context, db *sqlx.DB, table string) (map[string]string, error) {
	var rows []struct {
		ID string `db:"id"`
		V  string `db:"v"`
	}
	if err := db.SelectContext(ctx, &rows, `SELECT id, xmin::text || ' ' || ctid::text AS v FROM `+table); err != nil {
		return nil, fmt.Errorf("row versions of %s: %w", table, err)
	}
	m := make(map[string]string, len(rows))
	for _, r := range rows {
		m[r.ID] = r.V
	}
	return m, nil
}

// runJob runs job with a progress line per chunk, then prints the summary.
func runJob(ctx context.Context, out io.Writer, db *sqlx.DB, logger *slog.Logger, job backfill.Job, o options) (backfill.Report, error) {
	chunks, err := job.Chunker.Chunks(ctx)
	if err != nil {
		return backfill.Report{}, err
	}
	p := newProgress(out, len(chunks))
	runner, err := newRunner(db, logger, p, o)
	if err != nil {
		return backfill.Report{}, err
	}
	// Ctrl-C pauses the run (the chunk in flight finishes), a second one
	// cancels it: through the manifest's control, not the context.
	stopSignals := runner.PauseOnSignal(job.Name, out)
	ctx = context.WithoutCancel(ctx)
	rep, runErr := runner.Run(ctx, job)
	stopSignals()
	if rep.BatchID != 0 {
		// The run exists in the manifest: summarise it even after a
		// failure, then report the failure.
		if err := summary(ctx, out, db, backfill.NewPGManifest(""), job.Target.Table, rep, p); err != nil {
			return rep, errors.Join(cli.RunError(job.Name, planFlag, runErr), err)
		}
	}
	if errors.Is(runErr, backfill.ErrAlreadyCompleted) {
		// A complete run is a success: the summary said that this call
		// had nothing to do, and how to run the job again.
		return rep, nil
	}
	return rep, cli.RunError(job.Name, planFlag, runErr)
}

// planFlag is the flag named by the hint when a job's plan changed.
const planFlag = "-hours"

// newProgress returns the per-chunk printer of a job of total chunks: a
// time chunk is labelled with its UTC day, or its UTC hour if shorter.
func newProgress(out io.Writer, total int) *cli.Progress {
	return &cli.Progress{
		Out:    out,
		Total:  total,
		Format: "  batch %d chunk %3d/%d %-14s rows %4d  inserted %4d  updated %3d  unchanged %4d  rejected %2d  dedup %2d  %5.3fs",
		Label: func(c backfill.Chunk) string {
			if c.Kind != backfilltype.KindTime {
				return c.ID
			}
			if c.Duration() < 24*time.Hour {
				return c.Start.UTC().Format("2006-01-02T15Z")
			}
			return c.Start.UTC().Format("2006-01-02")
		},
	}
}

// summary prints the run as the manifest recorded it and checks the
// target against the ledger.
func summary(ctx context.Context, out io.Writer, db *sqlx.DB, m *backfill.PGManifest, table string, rep backfill.Report, p *cli.Progress) error {
	l, err := cli.ReadLedger(ctx, db, m, rep.BatchID)
	if err != nil {
		return err
	}
	l.Summarize(out, rep, p, cli.SummaryFormat{
		UTC:          true,
		ExceptionKey: func(e backfill.Exception) string { return e.Column + ": " + e.Reason },
		Rerun:        "-new-run or -replay runs it again",
	})

	// Every chunk's surviving rows (inserted + updated + unchanged) are
	// the distinct events of its time range; the target must hold as
	// many rows in that range. (True for this file; a correction that
	// moves an event's time across a chunk boundary would break it.)
	mismatch := 0
	var rows int64
	for _, s := range l.States {
		if s.Status != backfill.ChunkDone {
			continue
		}
		var n int64
		if err := db.GetContext(ctx, &n, `SELECT count(*) FROM `+table+` WHERE event_time >= $1 AND event_time < $2`,
			s.Chunk.Start, s.Chunk.End); err != nil {
			return fmt.Errorf("check target: %w", err)
		}
		rows += n
		if n != s.Inserted+s.Updated+s.Unchanged {
			mismatch++
		}
	}
	var st struct {
		Rows      int64 `db:"n"`
		Reviewed  int64 `db:"reviewed"`
		Automatic int64 `db:"automatic"`
	}
	if err := db.GetContext(ctx, &st, `SELECT count(*) AS n, count(*) FILTER (WHERE status = 'reviewed') AS reviewed,
		count(*) FILTER (WHERE status = 'automatic') AS automatic FROM `+table); err != nil {
		return fmt.Errorf("check target: %w", err)
	}
	fmt.Fprintf(out, "  target     %s holds %d rows (%d reviewed, %d automatic); %d in the run's chunks; chunks whose ledger disagrees with the target: %d\n",
		table, st.Rows, st.Reviewed, st.Automatic, rows, mismatch)
	return nil
}
