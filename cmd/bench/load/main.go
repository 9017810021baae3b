// Command benchload measures the library against a hand-written chunked
// load on the same PostgreSQL servers, in one invocation: by default a
// throwaway fast server (fsync off) and a throwaway durable one (fsync,
// full_page_writes, synchronous_commit on), each with the whole suite.
//
// Every variant is a whole process timed from exec to exit (process start,
// connecting, the plan, run setup, the load and the finish), as an
// independent benchmark times it; the load alone, timed inside the child,
// is a secondary column. Each round runs every variant once, in an order
// rotated per round; the report gives medians of the rounds, per-round
// ranges, and ratios computed per round. The library with its defaults is
// the main variant (options.go says what it is given); the others are the
// hand-written chunked load, one COPY + merge, ExtractAhead, SkipUnchanged
// on a first load, an unchanged replay and a 5% restatement with and
// without SkipUnchanged, and small chunks against the hand-written load's
// small chunks. It also reports each load's WAL and peak RSS (VmHWM).
//
// It prints a Markdown report and benchstat-compatible lines, and makes no
// assertions: it reports, including whether the goals are met. See
// README.md in this directory.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
)

type options struct {
	rows       int64
	chunk      int64
	smallChunk int64
	runs       int
	// servers are the servers the suite runs on, in order: fast, durable
	// (throwaway servers) or url (DATABASE_URL).
	servers []string
	// args is the command line, printed in the report header.
	args    []string
	rss     bool
	rssRows []int64
	profile string
	keep    bool
	// libOptions are PostgreSQL session settings for the library's
	// connections only (experiments: what would a planner setting do?).
	libOptions string
	// libConcurrency is the library's Config.Concurrency (0: its default).
	libConcurrency int
	// mainAhead and mainSkip are the main variant's ExtractAhead and
	// SkipUnchanged (optDefault: the library's defaults); aheadVariant is
	// the ExtractAhead variant's setting, or "none" to leave it out.
	mainAhead, mainSkip optIn
	aheadVariant        string
	// skipChunkColumn: the SkipUnchanged variants chunk by order_no with
	// ChunkColumn order_no, and every table of the suite has an index on
	// order_no.
	skipChunkColumn bool
	// baseReplay adds the baseline's replay (its WAL against the
	// library's).
	baseReplay bool
	// skip also measures the order_no-chunked SkipUnchanged loads of
	// skip.go (ChunkColumn, ChunkVersioner, corrections).
	skip bool
	// skipOnly runs only the -skip loads (not the suite).
	skipOnly bool
	// skipProfile, with skip: a directory where the first run's
	// SkipUnchanged replay and restatement write CPU profiles, and an
	// extra unchanged replay writes
	// auto_explain plans (that run's timings are not comparable).
	skipProfile string
	// only, when not empty, are the chains the suite runs (by chain name:
	// lib, base, once, skip, ahead, small, small_base); the others are
	// left out.
	only map[string]bool
}

func main() {
	var o options
	var c childOpts
	var rssRows, servers, mainAhead, mainSkip, childAhead, childSkip, only string
	var durable bool
	flag.Int64Var(&o.rows, "rows", 1_000_000, "rows per load")
	flag.Int64Var(&o.chunk, "chunk", 10_000, "rows per chunk (IntRange step)")
	flag.Int64Var(&o.smallChunk, "small-chunk", 1_000, "rows per chunk of the small-chunk variants (library defaults and baseline); 0 leaves them out")
	flag.IntVar(&o.runs, "runs", 3, "rounds: each runs every variant once, in an order rotated per round (medians and per-round ranges reported)")
	flag.StringVar(&servers, "servers", "", "comma-separated servers to run the whole suite on, in order: fast (throwaway, fsync off), durable (throwaway, fsync, full_page_writes, synchronous_commit on), url (DATABASE_URL); default fast,durable, or url when DATABASE_URL is set")
	flag.BoolVar(&durable, "durable", false, "same as -servers durable")
	flag.StringVar(&mainAhead, "main-ahead", "", "the main variant's extract-ahead (off sets Config.SerialExtract): on, off, or empty for the library's default")
	flag.StringVar(&mainSkip, "main-skip", "", "the main variant's Job.SkipUnchanged: on, off, or empty for the library's default")
	flag.StringVar(&o.aheadVariant, "ahead-variant", "on", "the extra ExtractAhead variant's setting: on, off, or none to leave it out")
	flag.BoolVar(&o.skipChunkColumn, "skip-chunk-column", true, "the SkipUnchanged variants chunk by order_no (the same rows per chunk) with Job.ChunkColumn order_no, and every table of the suite gets an index on order_no; false: they run the main variant's job (no ChunkColumn: fingerprints by key) and no table has the index")
	flag.BoolVar(&o.baseReplay, "base-replay", false, "also replay the baseline's load (its loop again over the loaded rows), to compare its WAL with the library's replay")
	flag.BoolVar(&o.rss, "rss", false, "also compare peak RSS at the -rss-rows sizes (slower)")
	flag.StringVar(&rssRows, "rss-rows", "300000,3000000", "row counts of the -rss comparison, comma-separated")
	flag.StringVar(&o.profile, "profile", "", "directory: also run one profiled load of each variant (CPU profile, time breakdown, auto_explain plans, EXPLAIN ANALYZE of the merge statements) and write the files there (a subdirectory per server)")
	flag.BoolVar(&o.keep, "keep", false, "keep the benchmark database (DATABASE_URL only) instead of dropping it")
	flag.StringVar(&o.libOptions, "lib-options", "", "experiment: PostgreSQL session settings for the library's connections only, e.g. '-c enable_hashjoin=off -c enable_mergejoin=off' (the startup \"options\" parameter)")
	flag.IntVar(&o.libConcurrency, "lib-concurrency", 0, "the library's Config.Concurrency (0: the library's default); the baseline is always sequential")
	flag.BoolVar(&o.skip, "skip", false, "also run the order_no-chunked SkipUnchanged loads (ChunkColumn order_no, with and without a ChunkVersioner, restatements and corrections)")
	flag.BoolVar(&o.skipOnly, "skip-only", false, "with -skip: leave out the suite")
	flag.StringVar(&only, "only", "", "comma-separated chains of the suite to run, leaving out the others: lib, base, once, skip, ahead, small, small_base (small = small,small_base); empty runs every chain")
	flag.StringVar(&o.skipProfile, "skip-profile", "", "with -skip: directory: the first run's SkipUnchanged replay and restatement write CPU profiles there, and one more unchanged replay and restatement their auto_explain plans (profiled timings are not comparable)")

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
	flag.IntVar(&c.concurrency, "concurrency", 0, "internal (child): library Config.Concurrency (0: default)")
	flag.StringVar(&childAhead, "ahead", "", "internal (child): library extract-ahead: on, off (Config.SerialExtract) or empty (default)")
	flag.StringVar(&childSkip, "skipunchanged", "", "internal (child): Job.SkipUnchanged: on, off or empty (default)")
	flag.StringVar(&c.pgOptions, "pgoptions", "", "internal (child): PostgreSQL startup options of the load's connections")
	flag.BoolVar(&c.byOrder, "byorder", false, "internal (child): chunk by order_no, ChunkColumn order_no")
	flag.BoolVar(&c.versioned, "versioned", false, "internal (child): with -byorder, the extractor implements backfill.ChunkVersioner")
	flag.IntVar(&c.restate, "restate", 0, "internal (child): add this to the quantity of every 20th chunk's rows")
	flag.IntVar(&c.correct, "correct", 0, "internal (child): add this to the quantity of every 100th row of every 20th chunk, after -restate (with -byorder)")
	flag.Parse()

	if c.variant != "" {
		c.rows, c.chunk = o.rows, o.chunk
		var err error
		if c.ahead, err = parseOptIn(childAhead); err == nil {
			c.skip, err = parseOptIn(childSkip)
		}
		if err == nil {
			err = runChild(c)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchload:", err)
			os.Exit(1)
		}
		return
	}
	usage := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "benchload: "+format+"\n", args...)
		os.Exit(2)
	}
	for _, s := range strings.Split(rssRows, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(strings.ReplaceAll(s, "_", "")), 10, 64)
		if err != nil || n <= 0 {
			usage("-rss-rows: bad row count %q", s)
		}
		o.rssRows = append(o.rssRows, n)
	}
	if o.rows <= 0 || o.chunk <= 0 || o.runs <= 0 || o.smallChunk < 0 {
		usage("-rows, -chunk and -runs must be positive, -small-chunk not negative")
	}
	if o.skipChunkColumn && (o.chunk%8 != 0 || o.rows%8 != 0) {
		usage("-skip-chunk-column chunks by order (8 rows each): -rows and -chunk must be multiples of 8")
	}
	var err error
	if o.mainAhead, err = parseOptIn(mainAhead); err != nil {
		usage("-main-ahead: %v", err)
	}
	if o.mainSkip, err = parseOptIn(mainSkip); err != nil {
		usage("-main-skip: %v", err)
	}
	for _, s := range strings.Split(only, ",") {
		switch s = strings.TrimSpace(s); s {
		case "":
		case "lib", "base", "once", "skip", "ahead", "small_base":
			addOnly(&o, s)
		case "small":
			addOnly(&o, "small")
			addOnly(&o, "small_base")
		default:
			usage("-only: unknown chain %q (want lib, base, once, skip, ahead, small or small_base)", s)
		}
	}
	switch o.aheadVariant {
	case "on", "off", "none":
	default:
		usage("-ahead-variant: want on, off or none, not %q", o.aheadVariant)
	}
	switch {
	case servers != "" && durable:
		usage("-durable is -servers durable: give one of them")
	case durable:
		servers = "durable"
	case servers == "" && os.Getenv("DATABASE_URL") != "":
		servers = "url"
	case servers == "":
		servers = "fast,durable"
	}
	for _, s := range strings.Split(servers, ",") {
		switch s = strings.TrimSpace(s); s {
		case "fast", "durable":
		case "url":
			if os.Getenv("DATABASE_URL") == "" {
				usage("-servers url needs DATABASE_URL")
			}
		default:
			usage("-servers: unknown server %q (want fast, durable or url)", s)
		}
		o.servers = append(o.servers, s)
	}
	o.args = os.Args[1:]
	if err := runParent(o); err != nil {
		fmt.Fprintln(os.Stderr, "benchload:", err)
		os.Exit(1)
	}
}

// addOnly adds chain to the chains -only selects.
func addOnly(o *options, chain string) {
	if o.only == nil {
		o.only = map[string]bool{}
	}
	o.only[chain] = true
}
