// Command flights backfills the 3,000,000 flights of flights-3m.parquet
// (npm package vega-datasets 3.2.1) into PostgreSQL, one calendar day per
// chunk, together with the airports of airports.csv. See README.md.
//
//	DATABASE_URL=postgres://... go run ./flights [-concurrency 2] [-limit-days N] [-new-run]
//	go run ./flights -dry-run    # extract every chunk without a database
//	go run ./flights -baseline   # the same rows by hand, into flights_baseline (compare.sh)
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the "postgres" database/sql driver

	"github.com/pgbackfill/backfill"
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

// schemaDDL creates the target tables; it is idempotent.
//
// There is deliberately no foreign key from flights to airports: a flight
// whose airport is missing from airports.csv must still load (the summary
// counts such rows instead).
const schemaDDL = `
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
		os.Exit(1)
	}
}

type options struct {
	dataDir     string
	concurrency int
	newRun      bool
	limitDays   int
	dryRun      bool
	verbose     bool
	baseline    bool
}

func run() error {
	var o options
	flag.StringVar(&o.dataDir, "data", "", "directory holding flights-3m.parquet and airports.csv (default: flights/data, examples/flights/data or data, whichever exists)")
	flag.IntVar(&o.concurrency, "concurrency", 2, "chunks (days) loaded at once")
	flag.BoolVar(&o.newRun, "new-run", false, "start a new run even if an incomplete one exists (needed after changing -limit-days)")
	flag.IntVar(&o.limitDays, "limit-days", 0, "load only the first N days (0: all)")
	flag.BoolVar(&o.dryRun, "dry-run", false, "extract every chunk without a database; print data facts and extractor cost")
	flag.BoolVar(&o.verbose, "v", false, "log the runner's events to stderr")
	flag.BoolVar(&o.baseline, "baseline", false, "instead of the library, load the same rows by hand (temp table, COPY, INSERT ... ON CONFLICT per day) into flights_baseline; see baseline.go")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if o.concurrency < 1 {
		return errors.New("-concurrency must be at least 1")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	dir, err := findDataDir(o.dataDir)
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

	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		return errors.New("DATABASE_URL is not set (or use -dry-run); `make demo` at the repository root starts a throwaway server")
	}
	db, err := sqlx.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(o.concurrency + 2)
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if o.baseline {
		return baseline(ctx, os.Stdout, db, src, days, o.concurrency)
	}
	var logger *slog.Logger
	if o.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	_, err = load(ctx, os.Stdout, db, logger, src, days, filepath.Join(dir, airportsFile), o)
	return err
}

// load creates the tables, runs the airports job and then the flights job
// over days, and prints a summary read from the manifest. It returns the
// flights job's report.
func load(ctx context.Context, out io.Writer, db *sqlx.DB, logger *slog.Logger, src *Flights, days backfill.Chunker, airportsPath string, o options) (backfill.Report, error) {
	if _, err := db.ExecContext(ctx, schemaDDL); err != nil {
		return backfill.Report{}, fmt.Errorf("create tables: %w", err)
	}
	manifest := backfill.NewPGManifest("")
	newRunner := func(p *progress) (*backfill.Runner, error) {
		return backfill.New(db, &backfill.Config{
			Concurrency: o.concurrency,
			Manifest:    manifest,
			Logger:      logger,
			Hooks:       p,
		})
	}

	// Airports: one chunk, the whole file.
	runner, err := newRunner(&progress{out: out, total: 1})
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
	if err != nil {
		return rep, runError(airportsJob, err)
	}
	fmt.Fprintf(out, "airports: batch %d %s, %d rows: %d inserted, %d updated, %d unchanged, %d rejected\n",
		rep.BatchID, rep.Status, rep.Counts.Read, rep.Counts.Inserted, rep.Counts.Updated, rep.Counts.Unchanged, rep.Counts.Rejected)

	// Flights: one chunk per civil day.
	chunks, err := days.Chunks(ctx)
	if err != nil {
		return backfill.Report{}, err
	}
	fp := &progress{out: out, total: len(chunks)}
	runner, err = newRunner(fp)
	if err != nil {
		return backfill.Report{}, err
	}
	fmt.Fprintf(out, "flights: %s, %d chunks, concurrency %d\n", days.Scope(), len(chunks), o.concurrency)
	scanned0 := src.Scanned()
	rep, runErr := runner.Run(ctx, backfill.Job{
		Name:        flightsJob,
		Source:      flightsSrc,
		CodeVersion: codeVersion,
		Chunker:     days,
		Extractor:   src,
		Target:      backfill.Target{Table: "flights", Key: flightKey, Columns: flightColumns},
		NewRun:      o.newRun,
	})
	if rep.BatchID != 0 {
		// The run exists in the manifest: summarise it even after a
		// failure, then report the failure.
		if err := summary(ctx, out, db, manifest, rep, fp, src.Scanned()-scanned0); err != nil {
			return rep, errors.Join(runError(flightsJob, runErr), err)
		}
	}
	return rep, runError(flightsJob, runErr)
}

func runError(job string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, backfill.ErrPlanChanged) {
		return fmt.Errorf("job %s: %w\n(the job's existing run has a different plan, e.g. another -limit-days or code version: rerun with the old flags, or pass -new-run to start a new run)", job, err)
	}
	var pe *backfill.PartialError
	if errors.As(err, &pe) {
		return fmt.Errorf("job %s: %w\n(completed chunks are checkpointed: run the same command again to resume)", job, err)
	}
	return fmt.Errorf("job %s: %w", job, err)
}

// findDataDir returns dir, or the first of the usual places holding the
// data, depending on where the command runs from.
func findDataDir(dir string) (string, error) {
	cands := []string{dir}
	if dir == "" {
		cands = []string{"flights/data", "examples/flights/data", "data"}
	}
	for _, d := range cands {
		if _, err := os.Stat(filepath.Join(d, flightsFile)); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s: run examples/flights/fetch-data.sh first", flightsFile, strings.Join(cands, ", "))
}

const civilLayout = "2006-01-02 15:04"

// progress prints one line per completed chunk. ChunkDone is called
// concurrently when Concurrency > 1.
type progress struct {
	out   io.Writer
	total int

	mu   sync.Mutex
	done int
	sum  backfill.Counts
}

var _ backfill.Hooks = (*progress)(nil)

// ChunkDone implements [backfill.Hooks].
func (p *progress) ChunkDone(ctx context.Context, batchID int64, r backfill.ChunkResult) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	p.sum = p.sum.Add(r.Counts)
	label := r.Chunk.ID
	if r.Chunk.Kind == backfill.KindTime {
		label = r.Chunk.Start.Format("2006-01-02")
	}
	fmt.Fprintf(p.out, "  batch %d chunk %3d/%d %-12s rows %6d  inserted %6d  updated %5d  unchanged %6d  rejected %3d  dedup %d  %6.2fs",
		batchID, r.Chunk.Seq+1, p.total, label, r.Read, r.Inserted, r.Updated, r.Unchanged, r.Rejected, r.Deduplicated,
		r.FinishedAt.Sub(r.StartedAt).Seconds())
	if r.Attempt > 1 {
		fmt.Fprintf(p.out, "  (attempt %d)", r.Attempt)
	}
	fmt.Fprintln(p.out)
}

func (p *progress) counts() (int, backfill.Counts) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done, p.sum
}

// summary prints the run as the manifest recorded it, the extractor's
// cost, two checks on the target and the process's peak memory.
func summary(ctx context.Context, out io.Writer, db *sqlx.DB, m *backfill.PGManifest, rep backfill.Report, p *progress, scanned int64) error {
	run, err := m.Run(ctx, db, rep.BatchID)
	if err != nil {
		return err
	}
	states, err := m.Chunks(ctx, db, rep.BatchID)
	if err != nil {
		return err
	}
	exc, err := m.Exceptions(ctx, db, rep.BatchID)
	if err != nil {
		return err
	}
	byStatus := map[backfill.ChunkStatus]int{}
	var total backfill.Counts
	retried := 0
	for _, s := range states {
		byStatus[s.Status]++
		if s.Status == backfill.ChunkDone {
			total = total.Add(s.Counts)
		}
		if s.Attempts > 1 {
			retried++
		}
	}
	fmt.Fprintf(out, "\nsummary (from the manifest, schema %s)\n", m.Schema())
	fmt.Fprintf(out, "  run        batch %d, job %s, status %s, resumed %t, created %s\n",
		run.BatchID, run.Job, run.Status, rep.Resumed, run.CreatedAt.Format(time.RFC3339))
	fmt.Fprintf(out, "  chunks     %d total: %d done, %d pending, %d failed; %d needed more than one attempt\n",
		len(states), byStatus[backfill.ChunkDone], byStatus[backfill.ChunkPending], byStatus[backfill.ChunkFailed], retried)
	fmt.Fprintf(out, "  rows       %d read: %d inserted, %d updated, %d unchanged, %d rejected, %d deduplicated (balanced: %t)\n",
		total.Read, total.Inserted, total.Updated, total.Unchanged, total.Rejected, total.Deduplicated, total.Balanced())
	fmt.Fprintf(out, "  exceptions %d in the queue", len(exc))
	reasons := map[string]int{}
	for _, e := range exc {
		reasons[e.Reason]++
	}
	for r, n := range reasons {
		fmt.Fprintf(out, "; %d x %q", n, r)
	}
	fmt.Fprintln(out)

	ran, this := p.counts()
	if ran == 0 {
		fmt.Fprintf(out, "  this call  nothing to do: the run was complete (-new-run replays it)\n")
	} else {
		fmt.Fprintf(out, "  this call  %d chunks, %d rows in %s = %.0f rows/s\n",
			ran, this.Read, rep.Elapsed.Round(time.Millisecond), float64(this.Read)/max(rep.Elapsed.Seconds(), 1e-3))
	}
	if this.Read > 0 {
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
	fmt.Fprintf(out, "  memory     peak RSS %s\n", peakRSS())
	return nil
}

// peakRSS returns VmHWM from /proc/self/status (Linux), or "unknown".
func peakRSS() string {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
