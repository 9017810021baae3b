// Command benchrollback measures Runner.Rollback against the load it
// withdraws, on the order-line table of cmd/bench/load (with lineage
// columns, so that jobs keep the undo log by default):
//
//   - first: a first load of -rows rows (inserts only), rolled back;
//   - update: a restatement (Job.NewRun) that changes every row of a
//     loaded range (an update-heavy batch), rolled back;
//   - mixed: a batch over half the loaded range and as many new rows
//     (half updates, half inserts), rolled back.
//
// For each batch it reports the load's wall time, the sum of its chunks'
// durations (finished_at - started_at in the manifest: extract and merge),
// the rollback's wall time, and the WAL each wrote
// (pg_current_wal_lsn before and after), plus client CPU. Each scenario
// runs -runs times (one round = the three scenarios on a fresh table);
// medians and per-round ranges are printed. It makes no assertions, except
// that every rollback restores the table's exact pre-batch content (a
// checksum of the table before the batch and after its rollback).
//
// The database is DATABASE_URL's server, or a throwaway server
// (pgtest.StartWith; -durable keeps fsync, full_page_writes and
// synchronous_commit on). See README.md in this directory.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

type options struct {
	rows, chunk int64
	runs        int
	durable     bool
	profile     string
	scenarios   string
	statements  bool
}

func main() {
	var o options
	flag.Int64Var(&o.rows, "rows", 1_000_000, "rows per batch")
	flag.Int64Var(&o.chunk, "chunk", 10_000, "rows per chunk (IntRange step)")
	flag.IntVar(&o.runs, "runs", 3, "rounds (each: the scenarios on a fresh table)")
	flag.BoolVar(&o.durable, "durable", false, "throwaway server only: keep production durability (fsync, full_page_writes, synchronous_commit on)")
	flag.StringVar(&o.profile, "profile", "", "directory: write a CPU profile of each rollback of the first round there")
	flag.BoolVar(&o.statements, "statements", false, "print the rollbacks' statements by total time (pg_stat_statements: DATABASE_URL's server must preload it; the extension is created)")
	flag.StringVar(&o.scenarios, "scenarios", "first,update,mixed", "scenarios to run, comma-separated: first, update, mixed")
	flag.Parse()
	if o.rows <= 0 || o.chunk <= 0 || o.runs <= 0 {
		fmt.Fprintln(os.Stderr, "benchrollback: -rows, -chunk and -runs must be positive")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "benchrollback:", err)
		os.Exit(1)
	}
}

// measure is one batch and its rollback.
type measure struct {
	scenario       string
	load, chunkSum time.Duration
	loadWAL        int64
	loadCPU        time.Duration
	rollback       time.Duration
	rollbackWAL    int64
	rollbackCPU    time.Duration
	rows           backfill.Counts
	deleted        int64
	restored       int64
}

func run(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	url := os.Getenv("DATABASE_URL")
	server := "DATABASE_URL"
	var srv *pgtest.Server
	if url == "" {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		var err error
		srv, err = pgtest.StartWith(sctx, pgtest.Options{Durable: o.durable})
		cancel()
		if err != nil {
			return err
		}
		defer func() {
			if err := srv.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "benchrollback:", err)
			}
		}()
		url = srv.URL()
		server = "throwaway (pgtest.Start: fsync=off, synchronous_commit=off, full_page_writes=off)"
		if o.durable {
			server = "throwaway, durable (pgtest.StartWith Durable: fsync, full_page_writes, synchronous_commit on)"
		}
	}
	db, err := sqlx.Open("postgres", url)
	if err != nil {
		return err
	}
	defer db.Close()
	if o.statements {
		if _, err := db.ExecContext(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
			return err
		}
	}
	var version string
	if err := db.GetContext(ctx, &version, `SHOW server_version`); err != nil {
		return err
	}
	fmt.Printf("# Rollback benchmark\n\nserver: %s, PostgreSQL %s; %d rows per batch, chunks of %d, %d rounds; %s\n\n",
		server, version, o.rows, o.chunk, o.runs, time.Now().UTC().Format(time.RFC3339))
	scen := map[string]bool{}
	for _, s := range strings.Split(o.scenarios, ",") {
		scen[strings.TrimSpace(s)] = true
	}
	var all []measure
	for round := 0; round < o.runs; round++ {
		ms, err := runRound(ctx, db, o, round, scen)
		if err != nil {
			return err
		}
		for _, m := range ms {
			fmt.Fprintf(os.Stderr, "round %d %-6s load %6.2fs (chunks %6.2fs, WAL %s, cpu %5.2fs)  rollback %6.2fs (WAL %s, cpu %5.2fs) deleted %d restored %d\n",
				round+1, m.scenario, m.load.Seconds(), m.chunkSum.Seconds(), mib(m.loadWAL), m.loadCPU.Seconds(),
				m.rollback.Seconds(), mib(m.rollbackWAL), m.rollbackCPU.Seconds(), m.deleted, m.restored)
		}
		all = append(all, ms...)
	}
	report(all)
	return nil
}

// runRound runs the scenarios on a fresh table.
func runRound(ctx context.Context, db *sqlx.DB, o options, round int, scen map[string]bool) ([]measure, error) {
	table := fmt.Sprintf("public.bench_rollback_%d", round+1)
	if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+table); err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, createTargetSQL(table)); err != nil {
		return nil, err
	}
	defer db.ExecContext(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS `+table) //nolint:errcheck
	cfg := &backfill.Config{}
	r, err := backfill.New(db, cfg)
	if err != nil {
		return nil, err
	}
	profiled := round == 0
	b := &bench{db: db, r: r, o: o, table: table, round: round + 1, started: time.Now().Unix(), profile: profiled && o.profile != ""}
	var out []measure
	if scen["first"] {
		m, err := b.batch(ctx, "first", "a", 0, o.rows, 0, false)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if scen["update"] || scen["mixed"] {
		// The range the update and mixed batches restate.
		if _, err := b.load(ctx, "b", 0, o.rows, 0, false); err != nil {
			return nil, err
		}
	}
	if scen["update"] {
		m, err := b.batch(ctx, "update", "b", 0, o.rows, 1, true)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if scen["mixed"] {
		m, err := b.batch(ctx, "mixed", "c", o.rows/2, o.rows, 2, false)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

type bench struct {
	db      *sqlx.DB
	r       *backfill.Runner
	o       options
	table   string
	round   int
	profile bool
	started int64 // job names are unique to this invocation
}

// batch loads rows [lo, lo+n) with quantities shifted by delta, measures
// it, rolls it back, measures that, and checks that the table is as
// before the batch.
func (b *bench) batch(ctx context.Context, scenario, job string, lo, n int64, delta int, newRun bool) (measure, error) {
	m := measure{scenario: scenario}
	before, err := b.checksum(ctx)
	if err != nil {
		return m, err
	}
	if _, err := b.db.ExecContext(ctx, `CHECKPOINT`); err != nil {
		return m, err
	}
	wal0, err := b.lsn(ctx)
	if err != nil {
		return m, err
	}
	cpu0 := cpuTime()
	start := time.Now()
	rep, err := b.load(ctx, job, lo, n, delta, newRun)
	if err != nil {
		return m, err
	}
	m.load, m.loadCPU, m.rows = time.Since(start), cpuTime()-cpu0, rep.Counts
	wal1, err := b.lsn(ctx)
	if err != nil {
		return m, err
	}
	m.loadWAL = wal1 - wal0
	var sum float64
	if err := b.db.GetContext(ctx, &sum, `SELECT coalesce(sum(extract(epoch FROM finished_at - started_at)), 0) FROM backfill.chunks WHERE batch_id = $1`, rep.BatchID); err != nil {
		return m, err
	}
	m.chunkSum = time.Duration(sum * float64(time.Second))
	if _, err := b.db.ExecContext(ctx, `CHECKPOINT`); err != nil {
		return m, err
	}
	stopProfile, err := b.startProfile(scenario)
	if err != nil {
		return m, err
	}
	wal1, err = b.lsn(ctx)
	if err != nil {
		return m, err
	}
	if b.o.statements {
		if _, err := b.db.ExecContext(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
			return m, err
		}
	}
	cpu0 = cpuTime()
	start = time.Now()
	rb, err := b.r.Rollback(ctx, b.jobOf(job, lo, n, delta, false), backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "benchrollback", Why: "benchmark"})
	m.rollback, m.rollbackCPU = time.Since(start), cpuTime()-cpu0
	stopProfile()
	if err != nil {
		return m, fmt.Errorf("rollback of %s (batch %d): %w", scenario, rep.BatchID, err)
	}
	wal2, err := b.lsn(ctx)
	if err != nil {
		return m, err
	}
	m.rollbackWAL, m.deleted, m.restored = wal2-wal1, rb.Deleted, rb.Restored
	if b.o.statements {
		if err := b.printStatements(ctx, scenario); err != nil {
			return m, err
		}
	}
	after, err := b.checksum(ctx)
	if err != nil {
		return m, err
	}
	if after != before {
		return m, fmt.Errorf("rollback of %s (batch %d): the table is not as before the batch (checksum %s, was %s)", scenario, rep.BatchID, after, before)
	}
	if _, err := b.db.ExecContext(ctx, `CHECKPOINT`); err != nil {
		return m, err
	}
	return m, nil
}

// printStatements prints the statements since the last reset of
// pg_stat_statements by total time, to stderr.
func (b *bench) printStatements(ctx context.Context, scenario string) error {
	var rows []struct {
		Calls int64   `db:"calls"`
		MS    float64 `db:"ms"`
		Rows  int64   `db:"rows"`
		WAL   int64   `db:"wal"`
		Query string  `db:"query"`
	}
	if err := b.db.SelectContext(ctx, &rows, `SELECT calls, total_exec_time AS ms, rows, wal_bytes::bigint AS wal, query FROM pg_stat_statements
		WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC LIMIT 12`); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "-- round %d %s rollback: statements by total time\n", b.round, scenario)
	for _, r := range rows {
		q := strings.Join(strings.Fields(r.Query), " ")
		if len(q) > 300 {
			q = q[:300] + "..."
		}
		fmt.Fprintf(os.Stderr, "%9.1f ms %6d calls %9d rows %8.1f MiB WAL  %s\n", r.MS, r.Calls, r.Rows, float64(r.WAL)/(1<<20), q)
	}
	return nil
}

func (b *bench) startProfile(scenario string) (func(), error) {
	if !b.profile {
		return func() {}, nil
	}
	if err := os.MkdirAll(b.o.profile, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(fmt.Sprintf("%s/rollback-%s.pprof", b.o.profile, scenario))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func (b *bench) jobOf(job string, lo, n int64, delta int, newRun bool) backfill.Job {
	return backfill.Job{
		Name:        fmt.Sprintf("benchrollback-%d-%d-%s", b.started, b.round, job),
		Source:      "benchrollback",
		CodeVersion: "benchrollback-1",
		Chunker:     backfill.IntRange(lo, lo+n, b.o.chunk),
		Extractor:   generator{delta: delta},
		Target:      backfill.Target{Table: b.table, Key: keyColumns, Columns: allColumns},
		NewRun:      newRun,
	}
}

func (b *bench) load(ctx context.Context, job string, lo, n int64, delta int, newRun bool) (backfill.Report, error) {
	rep, err := b.r.Run(ctx, b.jobOf(job, lo, n, delta, newRun))
	if err != nil {
		return rep, err
	}
	if rep.Status != backfill.RunCompleted {
		return rep, fmt.Errorf("batch %d: status %s", rep.BatchID, rep.Status)
	}
	return rep, nil
}

// checksum is an order-independent digest of the table's rows, lineage
// included.
func (b *bench) checksum(ctx context.Context) (string, error) {
	var s string
	err := b.db.GetContext(ctx, &s, `SELECT count(*) || ':' || coalesce(sum(hashtext(t::text)::numeric), 0) FROM `+b.table+` t`)
	return s, err
}

func (b *bench) lsn(ctx context.Context) (int64, error) {
	var n int64
	err := b.db.GetContext(ctx, &n, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`)
	return n, err
}

// generator is the Extractor: the rows of ids [c.Lo, c.Hi), quantity
// shifted by delta.
type generator struct{ delta int }

func (g generator) Extract(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	vals := make([]any, len(allColumns))
	var buf []byte
	for id := c.Lo; id < c.Hi; id++ {
		buf = genRow(id, vals, buf)
		vals[5] = vals[5].(int) + g.delta
		if err := w.Write(ctx, vals...); err != nil {
			return err
		}
	}
	return nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// report prints, per scenario, medians and ranges.
func report(ms []measure) {
	fmt.Println("| batch | load s | chunks s | rollback s | rollback/chunks | rollback/load | load WAL MiB | rollback WAL MiB | rows deleted / restored |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, s := range []string{"first", "update", "mixed"} {
		var load, chunks, rb, rc, rl, lw, rw []float64
		var last measure
		for _, m := range ms {
			if m.scenario != s {
				continue
			}
			last = m
			load = append(load, m.load.Seconds())
			chunks = append(chunks, m.chunkSum.Seconds())
			rb = append(rb, m.rollback.Seconds())
			rc = append(rc, m.rollback.Seconds()/m.chunkSum.Seconds())
			rl = append(rl, m.rollback.Seconds()/m.load.Seconds())
			lw = append(lw, float64(m.loadWAL)/(1<<20))
			rw = append(rw, float64(m.rollbackWAL)/(1<<20))
		}
		if len(load) == 0 {
			continue
		}
		fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s | %d / %d |\n", s, mr(load, "%.2f"), mr(chunks, "%.2f"), mr(rb, "%.2f"),
			mr(rc, "%.2f"), mr(rl, "%.2f"), mr(lw, "%.0f"), mr(rw, "%.0f"), last.deleted, last.restored)
	}
	fmt.Println("\nmedian [min–max] over the rounds; chunks s: the sum of the batch's chunk durations in the manifest (extract and merge)")
}

// mr renders the median and the range of xs.
func mr(xs []float64, f string) string {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	if len(s) == 1 {
		return fmt.Sprintf(f, med)
	}
	return fmt.Sprintf(f+" ["+f+"–"+f+"]", med, s[0], s[len(s)-1])
}
