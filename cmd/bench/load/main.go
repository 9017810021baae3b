// Command benchload measures the library against a hand-written chunked
// load on the same PostgreSQL server, in one run:
//
//  1. end to end: N generated rows in fixed-size IntRange chunks, library
//     (backfill.New, Concurrency 1, Run) versus a hand-written loop (temp
//     staging table, COPY, INSERT ... ON CONFLICT DO UPDATE ... WHERE IS
//     DISTINCT FROM, one manifest row, commit per chunk); each variant runs
//     -runs times, alternating, into fresh identical tables; median,
//     min and max of rows/s;
//  2. WAL: bytes of WAL (pg_wal_lsn_diff) of each first load and of a
//     replay of the same range (library: a new run, Job.NewRun);
//  3. peak RSS (VmHWM) of each load, measured in a child process of its
//     own; with -rss also at -rss-rows sizes (flat memory check).
//
// It prints a Markdown report and benchstat-compatible lines, and makes no
// assertions: it reports. See README.md in this directory.
//
// Every load runs in a child process (this binary re-executed with
// -child=lib|base), so that each measurement has its own heap and its own
// peak RSS. The database is DATABASE_URL's server (a new database is
// created there and dropped at the end) or a throwaway server started with
// pgtest.Start.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
)

type options struct {
	rows    int64
	chunk   int64
	runs    int
	rss     bool
	rssRows []int64
	profile string
	keep    bool
	// libOptions are PostgreSQL session settings for the library's
	// connections only (experiments: what would a planner setting do?).
	libOptions string
	// libConcurrency is the library's Config.Concurrency.
	libConcurrency int
	// extractAhead: the library extracts ahead (its default); false sets Config.SerialExtract.
	extractAhead bool
	// durable starts the throwaway server with production durability
	// (fsync, full_page_writes, synchronous_commit on).
	durable bool
	// skip also measures replays with Job.SkipUnchanged (skip.go).
	skip bool
	// skipOnly runs only the -skip loads (not the end-to-end variants).
	skipOnly bool
	// skipProfile, with skip: a directory where the first run's
	// SkipUnchanged replay and restatement write CPU profiles, and an
	// extra unchanged replay writes
	// auto_explain plans (that run's timings are not comparable).
	skipProfile string
}

func main() {
	var o options
	var c childOpts
	var rssRows string
	flag.Int64Var(&o.rows, "rows", 1_000_000, "rows per load")
	flag.Int64Var(&o.chunk, "chunk", 10_000, "rows per chunk (IntRange step)")
	flag.IntVar(&o.runs, "runs", 3, "runs of each variant, alternating (median, min, max reported)")
	flag.BoolVar(&o.rss, "rss", false, "also compare peak RSS at the -rss-rows sizes (slower)")
	flag.StringVar(&rssRows, "rss-rows", "300000,3000000", "row counts of the -rss comparison, comma-separated")
	flag.StringVar(&o.profile, "profile", "", "directory: also run one profiled load of each variant (CPU profile, time breakdown, auto_explain plans, EXPLAIN ANALYZE of the merge statements) and write the files there")
	flag.BoolVar(&o.keep, "keep", false, "keep the benchmark database (DATABASE_URL only) instead of dropping it")
	flag.StringVar(&o.libOptions, "lib-options", "", "experiment: PostgreSQL session settings for the library's connections only, e.g. '-c enable_hashjoin=off -c enable_mergejoin=off' (the startup \"options\" parameter)")

	// Child mode (internal): one load in a process of its own.
	flag.StringVar(&c.variant, "child", "", "internal: run one load in this process: lib or base")
	flag.StringVar(&c.table, "table", "", "internal (child): target table")
	flag.StringVar(&c.job, "job", "", "internal (child): job name / run label")
	flag.Int64Var(&c.lo, "lo", 0, "internal (child): first id")
	flag.BoolVar(&c.newRun, "newrun", false, "internal (child): library Job.NewRun (replay)")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "internal (child): write a CPU profile of the load to this file")
	flag.StringVar(&c.breakdown, "breakdown", "", "internal (child): write a per-phase time breakdown to this file")
	flag.StringVar(&c.explain, "explain", "", "internal (child): write auto_explain plans of every statement to this file")
	flag.StringVar(&c.sqlOut, "sqlout", "", "internal (child): write the SQL statements issued to this file (JSON)")
	flag.IntVar(&o.libConcurrency, "lib-concurrency", 1, "the library's Config.Concurrency (chunks in flight, each on its own connection); the baseline is always sequential")
	flag.IntVar(&c.concurrency, "concurrency", 1, "internal (child): library Config.Concurrency")
	flag.BoolVar(&o.extractAhead, "extract-ahead", true, "the library extracts ahead, its default (each worker extracts its next chunk while its current chunk's transaction runs); -extract-ahead=false sets Config.SerialExtract")
	flag.BoolVar(&c.extractAhead, "ahead", false, "internal (child): library extracts ahead (false: Config.SerialExtract)")
	flag.StringVar(&c.pgOptions, "pgoptions", "", "internal (child): PostgreSQL startup options of the load's connections")
	flag.BoolVar(&o.durable, "durable", false, "throwaway server only: keep production durability (fsync, full_page_writes, synchronous_commit on) instead of trading it for speed")
	flag.BoolVar(&o.skip, "skip", false, "also measure replays with Job.SkipUnchanged, chunked by order_no: an unchanged replay against its first load, and a restatement with 5% of the chunks changed against a full reload")
	flag.BoolVar(&o.skipOnly, "skip-only", false, "with -skip: skip the end-to-end variants")
	flag.StringVar(&o.skipProfile, "skip-profile", "", "with -skip: directory: the first run's SkipUnchanged replay and restatement write CPU profiles there, and one more unchanged replay its auto_explain plans (profiled timings are not comparable)")
	flag.BoolVar(&c.byOrder, "byorder", false, "internal (child): chunk by order_no, ChunkColumn order_no")
	flag.BoolVar(&c.skipUnchanged, "skipunchanged", false, "internal (child): Job.SkipUnchanged")
	flag.BoolVar(&c.versioned, "versioned", false, "internal (child): with -byorder, the extractor implements backfill.ChunkVersioner")
	flag.IntVar(&c.restate, "restate", 0, "internal (child): add this to the quantity of every 20th chunk's rows")
	flag.IntVar(&c.correct, "correct", 0, "internal (child): add this to the quantity of every 100th row of every 20th chunk, after -restate")
	flag.Parse()

	if c.variant != "" {
		c.rows, c.chunk = o.rows, o.chunk
		if err := runChild(c); err != nil {
			fmt.Fprintln(os.Stderr, "benchload:", err)
			os.Exit(1)
		}
		return
	}
	for _, s := range strings.Split(rssRows, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(strings.ReplaceAll(s, "_", "")), 10, 64)
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "benchload: -rss-rows: bad row count %q\n", s)
			os.Exit(2)
		}
		o.rssRows = append(o.rssRows, n)
	}
	if o.rows <= 0 || o.chunk <= 0 || o.runs <= 0 {
		fmt.Fprintln(os.Stderr, "benchload: -rows, -chunk and -runs must be positive")
		os.Exit(2)
	}
	if err := runParent(o); err != nil {
		fmt.Fprintln(os.Stderr, "benchload:", err)
		os.Exit(1)
	}
}
