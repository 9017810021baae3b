// Command flights backfills the 3,000,000 flights of flights-3m.parquet
// (npm package vega-datasets 3.2.1) into PostgreSQL, one calendar day per
// chunk, together with the airports of airports.csv. See README.md.
//
//	DATABASE_URL=postgres://... go run ./flights [-concurrency 2] [-limit-days N] [-new-run] [-replay] [-report FILE]
//	go run ./flights -dry-run    # extract every chunk without a database
//	go run ./flights -baseline   # the same rows by hand, into flights_baseline (compare.sh)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgurl"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the "postgres" database/sql driver

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/examples/internal/cli"
)

// codeVersion is the version of the transformation (extract.go,
// airports.go). It is part of the plan fingerprint: bump it by hand when
// the rows a chunk produces change, and only then, so that an interrupted
// run can be resumed by a rebuilt binary.
const codeVersion = "flights-example/1"

const (
	flightsJob   = "flights-3m"
	flightsSrc   = "vega-datasets@3.2.1/flights-3m.parquet"
	airportsJob  = "airports"
	airportsSrc  = "vega-datasets@3.2.1/airports.csv"
	flightsFile  = "flights-3m.parquet"
	airportsFile = "airports.csv"
)

// schemaDDL creates the target tables; it is idempotent, and safe in two
// processes started at once: sent as one simple query it runs in one
// transaction, which first takes a transaction-level advisory lock (CREATE
// TABLE IF NOT EXISTS alone races on the catalog's unique index).
//
// There is deliberately no foreign key from flights to airports: a flight
// whose airport is missing from airports.csv must still load (the summary
// counts such rows instead).
const schemaDDL = `
SELECT pg_advisory_xact_lock(hashtext('backfill flights demo DDL'));
CREATE TABLE IF NOT EXISTS airports (
	iata      varchar(4)       PRIMARY KEY,
	name      text             NOT NULL,
	city      text,
	state     varchar(2),
	country   text             NOT NULL,
	latitude  double precision NOT NULL,
	longitude double precision NOT NULL,
	backfill_inserted_by bigint,
	backfill_updated_by  bigint
);
COMMENT ON TABLE airports IS 'vega-datasets@3.2.1 airports.csv; iata holds FAA location identifiers (3-4 characters)';

CREATE TABLE IF NOT EXISTS flights (
	dep_local   timestamp  NOT NULL,
	origin      varchar(3) NOT NULL,
	destination varchar(3) NOT NULL,
	seq         integer    NOT NULL CHECK (seq >= 1),
	delay       integer,
	distance    integer,
	backfill_inserted_by bigint,
	backfill_updated_by  bigint,
	PRIMARY KEY (dep_local, origin, destination, seq)
);
COMMENT ON TABLE flights IS 'vega-datasets@3.2.1 flights-3m.parquet (BTS on-time data, Jan-Jun 2001)';
COMMENT ON COLUMN flights.dep_local IS 'actual departure (FlightDate + CRSDepTime + DepDelay), wall-clock time of the origin airport, no zone';
COMMENT ON COLUMN flights.seq IS '1-based occurrence of (dep_local, origin, destination) in file order';
COMMENT ON COLUMN flights.delay IS 'arrival delay in minutes (negative: early)';
COMMENT ON COLUMN flights.distance IS 'miles';
`

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "flights:", err)
		os.Exit(cli.ExitCode(err))
	}
}

type options struct {
	dataDir     string
	concurrency int
	newRun      bool
	replay      bool // after the load, load again as a new run
	limitDays   int
	dryRun      bool
	verbose     bool
	baseline    bool
	// noCreate: the tables exist, created by an administrator; the
	// command runs no DDL (a runtime role with least privilege).
	noCreate bool
	// report is the HTML run report's file; empty: none.
	report string
	// chunkLines prints one line per chunk besides the progress display.
	chunkLines bool
	// progress receives the progress display (nil: none); terminal
	// draws a bar on it instead of lines every progressEvery.
	progress      io.Writer
	terminal      bool
	progressEvery time.Duration
	// holdAt and holdFor inject a throttle (the ETA's acceptance test):
	// once holdAt of the flights' chunks are done, the run is held for
	// holdFor. etaMarks prints the ETA shown at 25%, 50% and 75% of the
	// chunks against the time that actually remained.
	holdAt   float64
	holdFor  time.Duration
	etaMarks bool
	// where is the database's description printed first (database.go).
	where string
	// memoryLimit is the soft limit on the Go runtime's memory, in MiB
	// (0: none).
	memoryLimit int
	// river runs the flights job as River jobs (river.go); riverTimeout
	// is their timeout, after which River rescues a dead worker's job.
	river        bool
	riverTimeout time.Duration
	// rehearse: rehearse this many days of the flights job before its
	// run, and compare the run with the forecast (rehearse.go).
	rehearse int
	// graph runs the three modules airports, flights and route_stats as
	// one graph (graph.go); approvers is its approval policy, and
	// waitApproval makes the call wait for the approvals (the command
	// does) rather than return.
	graph        bool
	approvers    int
	waitApproval bool
	// benchPriority runs the priority benchmark this many rounds
	// (benchprio.go).
	benchPriority int
	// workerID, staleAfter and throttleEvery set the Runner's Config of a
	// graph's run (tests: 0 keeps the defaults).
	workerID      string
	staleAfter    time.Duration
	throttleEvery time.Duration
}

func run() error {
	var o options
	flag.StringVar(&o.dataDir, "data", "", "directory holding flights-3m.parquet and airports.csv (default: flights/data, examples/flights/data or data, whichever exists)")
	flag.IntVar(&o.concurrency, "concurrency", 2, "chunks (days) loaded at once")
	flag.BoolVar(&o.newRun, "new-run", false, "start a new run even if an incomplete one exists (needed after changing -limit-days)")
	flag.BoolVar(&o.replay, "replay", false, "after the load (or when it is already complete), run it again as a new run (Job.NewRun): nothing is written")
	flag.IntVar(&o.limitDays, "limit-days", 0, "load only the first N days (0: all)")
	flag.BoolVar(&o.dryRun, "dry-run", false, "extract every chunk without a database; print data facts and extractor cost")
	flag.BoolVar(&o.verbose, "v", false, "log the runner's events to stderr")
	flag.BoolVar(&o.noCreate, "no-create", false, "the tables and the manifest exist (an administrator created them and ran backfill migrate): run no DDL, as a role with least privilege")
	flag.StringVar(&o.report, "report", "flights-report.html", "write the flights run's HTML report to this file (empty: none)")
	flag.BoolVar(&o.chunkLines, "chunk-lines", false, "print one line per chunk (the progress bar or line shows the run either way)")
	flag.DurationVar(&o.progressEvery, "progress-every", 10*time.Second, "when stderr is not a terminal: the least time between two progress lines")
	flag.Float64Var(&o.holdAt, "hold-at", 0, "with -hold-for: the fraction of the flights' chunks done (0..1) at which a throttle holds the run")
	flag.DurationVar(&o.holdFor, "hold-for", 0, "hold the flights run with a throttle (on table demo_throttle) for this long, from -hold-at")
	flag.BoolVar(&o.etaMarks, "eta-marks", false, "print the ETA shown at 25%, 50% and 75% of the chunks against the time that actually remained")
	flag.BoolVar(&o.baseline, "baseline", false, "instead of the library, load the same rows by hand (temp table, COPY, INSERT ... ON CONFLICT per day) into flights_baseline; see baseline.go")
	flag.IntVar(&o.memoryLimit, "memory-limit", defaultMemoryLimit, "soft limit on the Go runtime's memory in MiB (debug.SetMemoryLimit; 0: none); GOMEMLIMIT, when set, takes precedence")
	flag.BoolVar(&o.river, "river", false, "run the flights job as River jobs (contrib/river) into flights_river, working the queue until the run is done; see river.go")
	flag.DurationVar(&o.riverTimeout, "river-timeout", time.Minute, "with -river: a River job's timeout, after which River rescues the job of a worker that died")
	flag.IntVar(&o.rehearse, "rehearse", 0, "before the flights run, rehearse N of its days (loaded in transactions that roll back), print the forecast of the run, and after the run compare it with the forecast; see rehearse.go")
	flag.BoolVar(&o.graph, "graph", false, "run airports, flights and route_stats (daily statistics per route, read from the flights table) as one graph of modules: print its blueprint, then run it; see graph.go")
	flag.IntVar(&o.approvers, "approvers", 0, "with -graph: the graph's run awaits this many approvals of its plan fingerprint (backfill approve, by operators other than this command's role) and waits for them")
	flag.IntVar(&o.benchPriority, "bench-priority", 0, "run the priority benchmark of the graph this many rounds (each: unloaded, then under a throttle's hold) on fresh tables; see benchprio.go")
	cli.SetUsage(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		return cli.Usage(fmt.Errorf("unexpected arguments %q (the flags are listed by -h)", flag.Args()))
	}
	if o.concurrency < 1 {
		return cli.Usage(errors.New("-concurrency must be at least 1"))
	}
	if o.holdAt < 0 || o.holdAt >= 1 || o.holdFor < 0 {
		return cli.Usage(errors.New("-hold-at must be in [0, 1) and -hold-for not negative"))
	}
	if o.rehearse < 0 {
		return cli.Usage(errors.New("-rehearse must not be negative"))
	}
	if o.approvers < 0 || o.benchPriority < 0 {
		return cli.Usage(errors.New("-approvers and -bench-priority must not be negative"))
	}
	if o.approvers > 0 && !o.graph {
		return cli.Usage(errors.New("-approvers needs -graph"))
	}
	o.waitApproval = o.approvers > 0
	if o.memoryLimit < 0 {
		return cli.Usage(errors.New("-memory-limit must not be negative"))
	}
	if o.memoryLimit > 0 && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(int64(o.memoryLimit) << 20)
	}
	o.progress, o.terminal = os.Stderr, cli.IsTerminal(os.Stderr)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// The database first: nothing is read (3,000,000 rows) before the
	// command knows where they go.
	dsn := ""
	if !o.dryRun {
		var err error
		if dsn, err = cli.DatabaseURL("or use -dry-run; `make demo` at the repository root starts a throwaway server"); err != nil {
			return err
		}
		o.where = databaseWhere(dsn, os.Getenv)
		fmt.Printf("flights: database %s\n", o.where)
	}
	dir, err := cli.FindDataDir(o.dataDir, "flights", flightsFile)
	if err != nil {
		return err
	}
	src, err := OpenFlights(filepath.Join(dir, flightsFile))
	if err != nil {
		return err
	}
	defer src.Close()
	first, end, ok := src.Scope()
	if !ok {
		return errors.New("flights-3m.parquet has no dated row")
	}
	if o.limitDays > 0 && first.AddDate(0, 0, o.limitDays).Before(end) {
		end = first.AddDate(0, 0, o.limitDays)
	}
	ix := src.idx
	fmt.Printf("flights: pid %d; source %s: %d rows, %d row groups, dates %s .. %s, sorted=%t; index of %d samples built in %s\n",
		os.Getpid(), flightsFile, ix.rows, len(ix.rgs), civil(ix.min).Format(civilLayout), civil(ix.max).Format(civilLayout),
		ix.sorted, len(ix.samples), ix.built.Round(time.Millisecond))
	days := backfill.Days(first, end, time.UTC)

	if o.dryRun {
		return dryRun(ctx, os.Stdout, src, days, o.concurrency)
	}

	db, err := pgurl.Open(ctx, dsn)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer db.Close()
	db.SetMaxOpenConns(2*o.concurrency + 2)
	if o.graph || o.benchPriority > 0 {
		// route_stats's extractor reads the flights table through the
		// pool as well.
		db.SetMaxOpenConns(3*o.concurrency + 3)
	}
	if o.baseline {
		return baseline(ctx, os.Stdout, db, src, days, o.concurrency)
	}
	var logger *slog.Logger
	if o.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if o.benchPriority > 0 {
		return benchPriority(ctx, os.Stdout, db, logger, src, days, filepath.Join(dir, airportsFile), o)
	}
	if o.graph {
		_, err := graphLoad(ctx, os.Stdout, db, logger, src, days, filepath.Join(dir, airportsFile), o)
		return err
	}
	if o.river {
		_, err := riverLoad(ctx, os.Stdout, db, logger, days, src, o)
		return err
	}
	if _, err := load(ctx, os.Stdout, db, logger, src, days, filepath.Join(dir, airportsFile), o); err != nil || !o.replay {
		return err
	}
	// -replay: the same load again as a new run, whether this call's
	// run loaded the rows or found them complete: it writes nothing.
	fmt.Printf("\nreplay: jobs %s and %s again with Job.NewRun (new batches over the same files)\n", airportsJob, flightsJob)
	o.newRun = true
	_, err = load(ctx, os.Stdout, db, logger, src, days, filepath.Join(dir, airportsFile), o)
	return err
}

// load creates the tables (unless o.noCreate), runs the airports job and then the flights job
// over days, and prints a summary read from the manifest. It returns the
// flights job's report.
func load(ctx context.Context, out io.Writer, db *sqlx.DB, logger *slog.Logger, src *Flights, days backfill.Chunker, airportsPath string, o options) (backfill.Report, error) {
	if !o.noCreate {
		if _, err := db.ExecContext(ctx, schemaDDL); err != nil {
			return backfill.Report{}, fmt.Errorf("create tables: %w", err)
		}
	}
	manifest := backfill.NewPGManifest("")
	newRunner := func(h backfill.Hooks, throttles []backfillthrottle.Throttle) (*backfill.Runner, error) {
		return backfill.New(db, &backfill.Config{
			Concurrency: o.concurrency,
			Manifest:    manifest,
			Logger:      logger,
			Hooks:       h,
			Throttles:   throttles,
		})
	}

	// Airports: one chunk, the whole file.
	runner, err := newRunner(newProgress(out, 1, o.chunkLines), nil)
	if err != nil {
		return backfill.Report{}, err
	}
	rep, err := runner.Run(ctx, backfill.Job{
		Name:        airportsJob,
		Source:      airportsSrc,
		CodeVersion: codeVersion,
		Chunker:     backfill.List(filepath.Base(airportsPath)),
		Extractor:   Airports{Path: airportsPath},
		Target:      backfill.Target{Table: "airports", Key: []string{"iata"}, Columns: airportColumns},
		NewRun:      o.newRun,
	})
	switch {
	case errors.Is(err, backfill.ErrAlreadyCompleted):
		// The airports are loaded; the flights may still need a resume.
		fmt.Fprintf(out, "airports: batch %d already complete; nothing done (pass -new-run to load again)\n", rep.BatchID)
	case err != nil:
		return rep, cli.RunError(airportsJob, planFlag, err)
	}
	fmt.Fprintf(out, "airports: batch %d %s, %d rows: %d inserted, %d updated, %d unchanged, %d rejected\n",
		rep.BatchID, rep.Status, rep.Counts.Read, rep.Counts.Inserted, rep.Counts.Updated, rep.Counts.Unchanged, rep.Counts.Rejected)

	// Flights: one chunk per civil day.
	chunks, err := days.Chunks(ctx)
	if err != nil {
		return backfill.Report{}, err
	}
	fp := newProgress(out, len(chunks), o.chunkLines)
	live := &cli.Live{Chunks: fp, Out: o.progress, Terminal: o.terminal, Every: o.progressEvery}
	var hooks backfill.Hooks = live
	if o.progress == nil {
		hooks = fp
	}
	hold, err := newHold(ctx, db, o, live)
	if err != nil {
		return backfill.Report{}, err
	}
	defer hold.stop()
	runner, err = newRunner(hooks, hold.throttles())
	if err != nil {
		return backfill.Report{}, err
	}
	fmt.Fprintf(out, "flights: %s, %d chunks, concurrency %d\n", days.Scope(), len(chunks), o.concurrency)
	job := backfill.Job{
		Name:        flightsJob,
		Source:      flightsSrc,
		CodeVersion: codeVersion,
		Chunker:     days,
		Extractor:   src,
		Target:      backfill.Target{Table: "flights", Key: flightKey, Columns: flightColumns},
		NewRun:      o.newRun,
	}
	var (
		rh     backfill.Rehearsal
		before runMark
	)
	if o.rehearse > 0 {
		if rh, err = rehearse(ctx, out, runner, job, src, o); err != nil {
			return backfill.Report{}, err
		}
		if !o.noCreate {
			// The rehearsal's rolled back rows leave pages: VACUUM gives
			// back the empty ones at the table's end, for the run's growth
			// to be measured from where it was.
			if _, err := db.ExecContext(ctx, `VACUUM flights`); err != nil {
				return backfill.Report{}, fmt.Errorf("vacuum after the rehearsal: %w", err)
			}
		}
		if before, err = markRun(ctx, db); err != nil {
			return backfill.Report{}, err
		}
	}
	scanned0 := src.Scanned()
	// Ctrl-C pauses the run (the chunk in flight finishes), a second one
	// cancels it: through the manifest's control, not the context.
	stopSignals := runner.PauseOnSignal(flightsJob, out)
	ctx = context.WithoutCancel(ctx)
	runStart := time.Now()
	rep, runErr := runner.Run(ctx, job)
	stopSignals()
	ended := time.Now()
	live.Finish()
	hold.stop()
	if rep.BatchID != 0 {
		// The run exists in the manifest: summarise it even after a
		// failure, then report the failure.
		err := summary(ctx, out, db, manifest, rep, fp, src.Scanned()-scanned0)
		if err == nil && rh.ID != 0 && runErr == nil {
			err = compareForecast(ctx, out, db, rh, before, ended.Sub(runStart), rep.Counts.Read)
			if err == nil {
				// The library's own comparison, from what the run recorded.
				var st backfill.Status
				if st, err = runner.StatusOf(ctx, rep.BatchID); err == nil && st.Forecast != nil {
					fmt.Fprintf(out, "  status     %s\n", st.Forecast)
				}
			}
		}
		if err == nil && o.etaMarks {
			hold.printMarks(out, ended)
		}
		if err == nil {
			err = inspect(ctx, out, db, manifest, rep.BatchID, o)
		}
		if err != nil {
			return rep, errors.Join(cli.RunError(flightsJob, planFlag, runErr), err)
		}
	}
	if errors.Is(runErr, backfill.ErrAlreadyCompleted) {
		// A complete run is a success: the summary said that this call
		// had nothing to do, and how to run the job again.
		return rep, nil
	}
	return rep, cli.RunError(flightsJob, planFlag, runErr)
}

const civilLayout = "2006-01-02 15:04"

// defaultMemoryLimit is -memory-limit's default, in MiB. The load keeps
// about 20-26 MiB of live heap (the library's spool of rows in flight, at
// most 16 MiB by its own count, and the extractor's decoded row groups);
// the garbage collector's default pacing (GOGC=100) lets the heap grow to
// twice that before collecting, and the executable's own pages take about
// 21 MB of RSS more (text and tables of a 37 MB binary). 40 MiB of Go
// memory keeps the peak RSS of the default load under 64 MiB while
// leaving the collector room enough not to run constantly.
const defaultMemoryLimit = 40

// memoryLine is the summary's memory line: the peak RSS (VmHWM) and the
// soft memory limit in effect.
func memoryLine() string {
	limit := "no soft memory limit"
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
		limit = fmt.Sprintf("soft memory limit %d MiB", l>>20)
	}
	return fmt.Sprintf("peak RSS %s (%s)", cli.PeakRSS(), limit)
}

// planFlag is the flag named by the hint when a job's plan changed.
const planFlag = "-limit-days"

// newProgress returns the per-chunk counter of a job of total chunks,
// which prints a line per chunk when lines is set: a time chunk is
// labelled with its day.
func newProgress(out io.Writer, total int, lines bool) *cli.Progress {
	p := &cli.Progress{
		Out:    out,
		Total:  total,
		Format: "  batch %d chunk %3d/%d %-12s rows %6d  inserted %6d  updated %5d  unchanged %6d  rejected %3d  dedup %d  %6.2fs",
		Label: func(c backfill.Chunk) string {
			if c.Kind == backfilltype.KindTime {
				return c.Start.Format("2006-01-02")
			}
			return c.ID
		},
		Attempts: true,
	}
	if !lines {
		p.Format = ""
	}
	return p
}

// summary prints the run as the manifest recorded it, the extractor's
// cost, two checks on the target and the process's peak memory.
func summary(ctx context.Context, out io.Writer, db *sqlx.DB, m *backfill.PGManifest, rep backfill.Report, p *cli.Progress, scanned int64) error {
	l, err := cli.ReadLedger(ctx, db, m, rep.BatchID)
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	l.Summarize(out, rep, p, cli.SummaryFormat{Retried: true, Rerun: "-replay replays it", Rate: true})
	if _, this := p.Counts(); this.Read > 0 {
		fmt.Fprintf(out, "  extractor  %d rows iterated for %d emitted (%.3fx)\n", scanned, this.Read, float64(scanned)/float64(this.Read))
	}

	var q struct {
		Flights int64  `db:"flights"`
		Orphans int64  `db:"orphans"`
		Codes   string `db:"codes"`
	}
	err = sqlx.GetContext(ctx, db, &q, `
		WITH missing AS (
			SELECT code, count(*) AS n
			FROM flights f, LATERAL (VALUES (f.origin), (f.destination)) v(code)
			WHERE NOT EXISTS (SELECT 1 FROM airports a WHERE a.iata = v.code)
			GROUP BY code)
		SELECT (SELECT count(*) FROM flights) AS flights,
		       coalesce((SELECT sum(n) FROM missing), 0) AS orphans,
		       coalesce((SELECT string_agg(code || ':' || n, ' ' ORDER BY code) FROM missing), '') AS codes`)
	if err != nil {
		return fmt.Errorf("check target: %w", err)
	}
	fmt.Fprintf(out, "  target     flights holds %d rows; %d airport references not in airports %s\n", q.Flights, q.Orphans, q.Codes)
	fmt.Fprintf(out, "  memory     %s\n", memoryLine())
	return nil
}
