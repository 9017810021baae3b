// Command benchprobe measures the latency throttles beside a live load:
// how much a backfill costs pgbench's latency and throughput with and
// without a throttle, and what the throttle costs the backfill's rate. On
// a server with production durability (fsync, full_page_writes and
// synchronous_commit on) it runs the same pgbench (TPC-B-like,
// per-transaction logs) in phases, measured over the same window of each:
//
//  1. alone, before and after the others: pgbench's p99 latency and TPS
//     (the reference is the mean of the two), and the goal signal's own
//     readings beside it, for its noise;
//  2. free: beside a backfill with no throttle (a synthetic job that
//     outlasts the window, upserting into a table of the pgbench
//     database, ChunkTarget -chunk-target);
//  3. goal: beside the same backfill throttled by the recommended
//     setting, backfillthrottle.LatencyGoal(probe, -rise), no hand-tuning,
//     started early enough that its first calibration is over before the
//     window (goal90, goal95, goal99: the same with that percentile);
//  4. probe (on request): a ProbeLatencySignal throttle with High =
//     pgbench's p99 alone × -high.
//
// Every other run reverses the order of the backfill phases. With -runs N
// it runs the phases N times and reports, per run, pgbench's p99 alone,
// free and throttled and the backfill's rows/s throttled over free,
// against the bars (p99 at most 1.3× alone, at least 25 % of the free
// rate). It asserts nothing. See README.md here; make bench-probe runs it.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/cmd/bench/internal/benchpg"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

type options struct {
	scale       int
	clients     int
	duration    time.Duration
	warmup      time.Duration
	rows        int64
	chunk       int64
	chunkSleep  time.Duration
	concurrency int
	probeConc   int
	probeRate   float64
	probe       string
	pct         float64
	window      time.Duration
	interval    time.Duration
	high, low   float64
	minHold     time.Duration
	adapt       bool
	phases      string
	verbose     bool
	// The goal phase (backfillthrottle.LatencyGoal).
	runs    int
	lead    time.Duration
	rise    float64
	goalPct float64
	samples int
	source  string
	// calStart is how long after pgbench the goal phase's backfill
	// starts (its first calibration runs then, before the window).
	calStart    time.Duration
	chunkTarget time.Duration
	alternate   bool
	warm        bool
}

// probes are the -probe presets; anything else is taken as the query.
// %[1]d is the number of pgbench_accounts rows, %[2]d of branches, %[3]d
// of tellers; the random key is a scalar subquery, computed once (a
// volatile expression in the WHERE clause would scan the table).
var probes = map[string]string{
	// One random account read: CPU and buffer contention only.
	"select": `SELECT abalance FROM pgbench_accounts WHERE aid = (SELECT 1 + mod((random() * %[1]d)::int, %[1]d))`,
	// pgbench's TPC-B-like transaction, with a zero delta: the same row
	// locks (a branch among %[2]d), the same WAL and, timed to its
	// commit, the same WAL flush as pgbench's transactions.
	"tpcb": `UPDATE pgbench_accounts SET abalance = abalance + 0 WHERE aid = (SELECT 1 + mod((random() * %[1]d)::int, %[1]d));
UPDATE pgbench_tellers SET tbalance = tbalance + 0 WHERE tid = (SELECT 1 + mod((random() * %[3]d)::int, %[3]d));
UPDATE pgbench_branches SET bbalance = bbalance + 0 WHERE bid = (SELECT 1 + mod((random() * %[2]d)::int, %[2]d));
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 0, CURRENT_TIMESTAMP)`,
	// A one-row insert into a table of its own: the WAL flush of a commit
	// (timed to its commit), no row lock shared with pgbench.
	"commit": `INSERT INTO bench_probe_commits (at) VALUES (clock_timestamp())`,
}

// fast runs the throwaway server with the test harness's settings
// (fsync and synchronous_commit off) instead of production durability.
var fast = flag.Bool("fast", false, "the throwaway server with fsync and synchronous_commit off (the test server), not production durability")

func main() {
	var o options
	flag.IntVar(&o.scale, "scale", 10, "pgbench scale")
	flag.IntVar(&o.clients, "clients", 4, "pgbench TPC-B-like clients (-j 2)")
	flag.DurationVar(&o.duration, "duration", 40*time.Second, "pgbench's run per phase (-T)")
	flag.DurationVar(&o.warmup, "warmup", 5*time.Second, "how long the backfill runs before pgbench starts")
	flag.Int64Var(&o.rows, "rows", 20_000_000, "rows of the backfill's plan (it is cancelled when pgbench ends)")
	flag.Int64Var(&o.chunk, "chunk", 2_000, "rows per chunk")
	flag.DurationVar(&o.chunkSleep, "chunk-sleep", 0, "the extractor's time per chunk (0: a source as fast as the merge)")
	flag.IntVar(&o.concurrency, "concurrency", 2, "the backfill's Config.Concurrency")
	flag.IntVar(&o.probeConc, "probe-concurrency", 0, "Config.Concurrency of the throttled phase (0: -concurrency)")
	flag.Float64Var(&o.probeRate, "probe-rate", 0, "Config.RowsPerSecond of the throttled phase (0: no cap)")
	flag.StringVar(&o.probe, "probe", "tpcb", "the probe: select, tpcb, commit, or a query")
	flag.Float64Var(&o.pct, "pct", 99, "the probe's percentile")
	flag.DurationVar(&o.window, "window", 5*time.Second, "the probe's window")
	flag.DurationVar(&o.interval, "interval", 250*time.Millisecond, "Config.ThrottleInterval (one probe per interval)")
	flag.Float64Var(&o.high, "high", 1.3, "High = pgbench's p99 alone × this")
	flag.Float64Var(&o.low, "low", 1.1, "Low = pgbench's p99 alone × this")
	flag.DurationVar(&o.minHold, "min-hold", 3*time.Second, "Throttle.MinHold")
	flag.BoolVar(&o.adapt, "adapt", true, "Throttle.Adapt: steer the rows per second (AIMD) instead of holding")
	flag.StringVar(&o.phases, "phases", "alone,free,goal,alone", "the phases to run, in order (alone is needed for the others' High and ratios; with several, the reference is their mean p99)")
	flag.BoolVar(&o.warm, "prime", true, "one free phase before the runs, not reported (a new server creates and zero-fills its WAL segments until it can recycle them: pgbench's p99 fell run after run without it)")
	flag.BoolVar(&o.alternate, "alternate", true, "swap the free and goal phases in every other run (neither is always the later one)")
	flag.BoolVar(&o.verbose, "v", false, "the backfill's throttle log (holds and releases) on stderr")
	flag.IntVar(&o.runs, "runs", 1, "how many times to run the phases (each run from its own alone phase)")
	flag.DurationVar(&o.lead, "lead", 20*time.Second, "how long pgbench runs before the backfill starts (the goal throttle calibrates then)")
	flag.Float64Var(&o.rise, "rise", 0.3, "the goal phase: LatencyGoal's rise (0.3: pgbench's latency may rise 30%)")
	flag.Float64Var(&o.goalPct, "goal-pct", 0, "the goal phase: GoalOptions.Percentile (0: its default)")
	flag.IntVar(&o.samples, "samples", 0, "the goal phase: GoalOptions.Samples (0: its default)")
	flag.StringVar(&o.source, "source", "auto", "the goal phase: GoalOptions.Source (auto, statements, probe)")
	flag.DurationVar(&o.calStart, "cal-start", 2*time.Second, "the goal phase: how long after pgbench its backfill starts (and calibrates, before the window)")
	flag.DurationVar(&o.chunkTarget, "chunk-target", 50*time.Millisecond, "Config.ChunkTarget of the backfill phases (adaptive chunks; 0: whole chunks)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "benchprobe:", err)
		os.Exit(1)
	}
}

// phase is the outcome of one pgbench run.
type phase struct {
	name      string
	tx        int
	secs      float64
	p99, p50  time.Duration
	max       time.Duration
	rows      int64 // backfill rows committed within pgbench's window
	probeVals []float64
	probeLat  []time.Duration // the probe's own latencies (phase alone)
	split     *backfilltype.TimeSplit
	holds     int
	// pgbench's p99 and transactions while the throttle held the
	// backfill, and while it did not.
	heldP99, workP99 time.Duration
	heldTx, workTx   int
	baseline         time.Duration   // the goal signal's calibrated baseline
	aloneP99s        []time.Duration // the alone phases' p99s, for their mean
	calEnded         time.Duration   // the goal's first calibration ended this long before the window (negative: after)
	calHeld          time.Duration   // the goal's calibration holds within the window
	source           string          // the goal signal's source
	backfillOK       bool            // the backfill ran through pgbench's window
	err              error
}

func (p phase) tps() float64 { return float64(p.tx) / math.Max(p.secs, 0.001) }
func (p phase) rps() float64 { return float64(p.rows) / math.Max(p.secs, 0.001) }

func run(o options) error {
	ctx := context.Background()
	bin, err := pgtest.BinDir()
	if err != nil {
		return err
	}
	if os.Getenv("DATABASE_URL") == "" {
		// A throwaway server that loads pg_stat_statements, for the goal
		// throttle's statements source.
		srv, err := pgtest.StartWith(ctx, pgtest.Options{Durable: !*fast})
		if err != nil {
			return err
		}
		defer func() { _ = srv.Stop() }()
		sdb, err := sqlx.Open("postgres", srv.URL())
		if err != nil {
			return err
		}
		_, err = sdb.Exec(`ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'`)
		sdb.Close()
		if err != nil {
			return err
		}
		if err := srv.RestartImmediate(ctx, nil); err != nil {
			return err
		}
		os.Setenv("DATABASE_URL", srv.URL())
	}
	db, url, settings, stop, err := benchpg.Open(ctx, *fast, o.concurrency+8, "fsync", "synchronous_commit", "full_page_writes", "shared_buffers", "max_wal_size", "shared_preload_libraries")
	defer stop()
	if err != nil {
		return err
	}
	// pgbench runs as a role of its own, so that the goal throttle's
	// statements source tells its statements from the backfill's.
	if _, err := db.Exec(`CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
		DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'benchprobe_app') THEN CREATE ROLE benchprobe_app LOGIN; END IF; END $$;
		GRANT CREATE ON SCHEMA public TO benchprobe_app;
		DROP TABLE IF EXISTS pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history`); err != nil {
		log.Printf("pg_stat_statements (the goal's statements source) is not available: %v", err)
	}
	if _, err := db.Exec(`DROP SCHEMA IF EXISTS backfill CASCADE; DROP TABLE IF EXISTS bench_probe_commits;
		CREATE TABLE bench_probe_commits (at timestamptz)`); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "benchprobe")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	pgb := filepath.Join(bin, "pgbench")
	conn := benchpg.Conn(url)
	if i := slices.Index(conn, "-U"); i >= 0 && i+1 < len(conn) {
		conn[i+1] = "benchprobe_app"
	}
	if out, err := exec.CommandContext(ctx, pgb, append(conn, "-i", "-q", "-s", strconv.Itoa(o.scale))...).CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %w\n%s", err, out)
	}
	query := o.probe
	if q, ok := probes[o.probe]; ok {
		query = fmt.Sprintf(q, 100_000*o.scale, o.scale, 10*o.scale)
	}

	if o.warm {
		// A new server writes new WAL segments (each zero-filled and
		// fsynced) until max_wal_size worth of them can be recycled: its
		// commits wait on that in the first runs, and pgbench's p99 alone
		// fell by 2-3x from the first run to the fifth. One unreported
		// free phase writes them.
		began := time.Now()
		if _, err := runPhase(ctx, o, db, pgb, conn, work, "prime", query, &backfillthrottle.Throttle{}); err != nil {
			return fmt.Errorf("priming phase: %w", err)
		}
		fmt.Printf("- priming: one free phase, not reported (%s)\n\n", time.Since(began).Round(time.Second))
	}
	var sums []summary
	for run := 1; run <= o.runs; run++ {
		var alone *phase
		var alones []phase
		var results []phase
		names := strings.Split(o.phases, ",")
		if o.alternate && run%2 == 0 {
			// Every other run reverses the order of the backfill phases
			// (free, goal, its variants), the alone phases staying in
			// place: the load drifts, and no phase should always be
			// measured later than another.
			var idx []int
			for i, n := range names {
				if n != "alone" {
					idx = append(idx, i)
				}
			}
			for i, j := 0, len(idx)-1; i < j; i, j = i+1, j-1 {
				names[idx[i]], names[idx[j]] = names[idx[j]], names[idx[i]]
			}
		}
		for i, name := range names {
			var p phase
			switch name {
			case "alone":
				p, err = runPhase(ctx, o, db, pgb, conn, work, name, query, nil)
				if alone == nil {
					alone = &p
				}
				alones = append(alones, p)
			case "free":
				// No throttle: the backfill's unthrottled rate, and what
				// it costs pgbench, over the same window.
				p, err = runPhase(ctx, o, db, pgb, conn, work, fmt.Sprint(name, i), query, &backfillthrottle.Throttle{})
			case "goal", "goal90", "goal95", "goal99", "goalstmt":
				// goal, or a variant with another percentile, or reading
				// pgbench's statements in pg_stat_statements.
				oo := o
				if v, _ := strings.CutPrefix(name, "goal"); v == "stmt" {
					oo.source = "statements"
				} else if v != "" {
					oo.goalPct, _ = strconv.ParseFloat(v, 64)
				}
				th, gerr := goalThrottle(oo, query)
				if gerr != nil {
					return gerr
				}
				p, err = runPhase(ctx, o, db, pgb, conn, work, fmt.Sprint(name, i), query, &th)
			case "cap10", "cap25", "cap50":
				// No throttle, RowsPerSecond at that share of this run's
				// free rate: what the application pays at a fixed rate,
				// the trade-off any throttle chooses a point of.
				i := slices.IndexFunc(results, func(p phase) bool { return p.name == "free" })
				if i < 0 {
					return fmt.Errorf("phase %s needs phase free before it in the run (-alternate=false)", name)
				}
				pct, _ := strconv.ParseFloat(strings.TrimPrefix(name, "cap"), 64)
				oo := o
				oo.probeRate = pct / 100 * results[i].rps()
				p, err = runPhase(ctx, oo, db, pgb, conn, work, fmt.Sprint(name, "_", i), query, &backfillthrottle.Throttle{})
			case "probe":
				if alone == nil {
					return fmt.Errorf("phase probe needs phase alone first (its High)")
				}
				ms := float64(alone.p99) / float64(time.Millisecond)
				p, err = runPhase(ctx, o, db, pgb, conn, work, fmt.Sprint(name, i), query,
					&backfillthrottle.Throttle{Signal: backfillthrottle.ProbeLatencySignal(query, o.pct, o.window),
						High: ms * o.high, Low: ms * o.low, MinHold: o.minHold, Adapt: o.adapt})
			default:
				return fmt.Errorf("unknown phase %q (alone, free, goal, goal90, goal95, goal99, goalstmt, cap10, cap25, cap50, probe)", name)
			}
			if err != nil {
				return fmt.Errorf("run %d phase %s: %w", run, name, err)
			}
			p.name = name
			results = append(results, p)
		}
		if len(alones) > 1 {
			// pgbench alone before and after the backfill phases: the
			// reference is their mean p99 (the machine's load moves
			// between phases; one side alone would favour or
			// penalise the phase next to it).
			ref := phase{name: "alone (mean)"}
			for _, a := range alones {
				ref.p99 += a.p99 / time.Duration(len(alones))
				ref.p50 += a.p50 / time.Duration(len(alones))
				ref.tx += a.tx
				ref.secs += a.secs
				ref.probeLat = append(ref.probeLat, a.probeLat...)
				ref.baseline = a.baseline
				ref.aloneP99s = append(ref.aloneP99s, a.p99)
			}
			alone = &ref
		}
		if o.runs > 1 {
			fmt.Printf("## run %d of %d (load average %s)\n\n", run, o.runs, loadAvg())
		}
		report(o, settings, query, alone, results)
		fmt.Println()
		sums = append(sums, summarize(run, alone, results)...)
	}
	if o.runs > 1 {
		reportRuns(o, sums)
	}
	return nil
}

// goalThrottle is the recommended setting: LatencyGoal(query, -rise)
// with GoalOptions from -goal-pct and -samples (0: the defaults).
func goalThrottle(o options, query string) (backfillthrottle.Throttle, error) {
	src := map[string]backfillthrottle.GoalSource{"auto": backfillthrottle.SourceAuto, "statements": backfillthrottle.SourceStatements,
		"probe": backfillthrottle.SourceProbe}
	s, ok := src[o.source]
	if !ok {
		return backfillthrottle.Throttle{}, fmt.Errorf("-source %q: auto, statements or probe", o.source)
	}
	return backfillthrottle.LatencyGoal(query, o.rise, backfillthrottle.GoalOptions{Source: s, Percentile: o.goalPct, Samples: o.samples})
}

// summary is one run's outcome against the bars.
type summary struct {
	run                    int
	load                   string
	alone, free, throttled time.Duration // pgbench's p99
	rowsRatio              float64
	baseline               time.Duration
	name                   string // the throttled phase
	aloneP99s              []time.Duration
	calEnded, calHeld      time.Duration
	freeRPS, goalRPS       float64
}

// summarize takes each throttled phase (goal, its variants, probe) of a
// run.
func summarize(run int, alone *phase, ps []phase) []summary {
	var free *phase
	for i := range ps {
		if ps[i].name == "free" {
			free = &ps[i]
		}
	}
	var out []summary
	for i := range ps {
		p := &ps[i]
		if !throttled(p.name) {
			continue
		}
		s := summary{run: run, load: loadAvg(), rowsRatio: math.NaN()}
		if alone != nil {
			s.alone = alone.p99
			s.aloneP99s = alone.aloneP99s
		}
		if free != nil {
			s.free, s.freeRPS = free.p99, free.rps()
			if free.rows > 0 {
				s.rowsRatio = p.rps() / free.rps()
			}
		}
		s.name, s.throttled, s.baseline = p.name, p.p99, p.baseline
		s.calEnded, s.calHeld, s.goalRPS = p.calEnded, p.calHeld, p.rps()
		out = append(out, s)
	}
	return out
}

// throttled reports whether phase name runs a throttled backfill.
func throttled(name string) bool {
	return name == "probe" || strings.HasPrefix(name, "goal") || strings.HasPrefix(name, "cap")
}

func reportRuns(o options, sums []summary) {
	fmt.Printf("## %d runs: pgbench's p99 alone, beside the free backfill and beside the throttled one; the backfill's rows/s throttled / free\n\n", len(sums))
	fmt.Println("| run | load avg (1/5/15 min) | p99 alone (each) | p99 free (ratio) | throttled phase | baseline | first calibration ended before the window | calibrating in the window | p99 throttled | p99 ratio | rows/s free, throttled | rows/s ratio | both bars |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	met, of := map[string]int{}, map[string]int{}
	var names []string
	for _, s := range sums {
		r := float64(s.throttled) / math.Max(float64(s.alone), 1)
		ok := r <= 1.3 && s.rowsRatio >= 0.25
		if of[s.name] == 0 {
			names = append(names, s.name)
		}
		of[s.name]++
		if ok {
			met[s.name]++
		}
		each := make([]string, len(s.aloneP99s))
		for i, d := range s.aloneP99s {
			each[i] = fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
		}
		fmt.Printf("| %d | %s | %s (%s) | %s (%.2f) | %s | %s | %.1f s | %.1f s | %s | **%.2f** | %.0f, %.0f | **%.2f** | %v |\n", s.run, s.load, ms(s.alone), strings.Join(each, ", "), ms(s.free),
			float64(s.free)/math.Max(float64(s.alone), 1), s.name, ms(s.baseline), s.calEnded.Seconds(), s.calHeld.Seconds(), ms(s.throttled), r, s.freeRPS, s.goalRPS, s.rowsRatio, ok)
	}
	for _, n := range names {
		fmt.Printf("\n%s: both bars (p99 at most 1.3x alone, at least 25%% of the free rows/s) met in %d of %d runs\n", n, met[n], of[n])
	}
}

// loadAvg is the machine's load average (Linux), "?" elsewhere.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// recorder wraps a Signal and keeps its readings.
type recorder struct {
	backfillthrottle.Signal
	mu   sync.Mutex
	vals []reading
	// calEnd is when the goal signal's first calibration ended (zero:
	// not yet); wasCal whether it calibrated at the last question.
	calEnd time.Time
	wasCal bool
}

type reading struct {
	at time.Time
	v  float64
}

func (r *recorder) Read(ctx context.Context, db sqlx.ExtContext, s backfillthrottle.SignalScope) (float64, error) {
	v, err := r.Signal.Read(ctx, db, s)
	if err == nil {
		r.mu.Lock()
		r.vals = append(r.vals, reading{time.Now(), v})
		r.mu.Unlock()
	}
	return v, err
}

// Calibrating forwards backfillthrottle.Calibrator: the wrapped goal
// signal still holds the backfill while it calibrates.
func (r *recorder) Calibrating() bool {
	c, ok := r.Signal.(backfillthrottle.Calibrator)
	on := ok && c.Calibrating()
	r.mu.Lock()
	if r.wasCal && !on && r.calEnd.IsZero() {
		r.calEnd = time.Now()
	}
	r.wasCal = on
	r.mu.Unlock()
	return on
}

// source is the goal signal's source, "" for another.
func (r *recorder) source() string {
	if b, ok := r.Signal.(interface {
		Source() backfillthrottle.GoalSource
	}); ok {
		return b.Source().String()
	}
	return ""
}

// baseline is the goal signal's calibrated baseline, 0 for another.
func (r *recorder) baseline() time.Duration {
	if b, ok := r.Signal.(interface{ Baseline() time.Duration }); ok {
		return b.Baseline()
	}
	return 0
}

func (r *recorder) within(from, to time.Time) []float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []float64
	for _, x := range r.vals {
		if !x.at.Before(from) && x.at.Before(to) {
			out = append(out, x.v)
		}
	}
	slices.Sort(out)
	return out
}

// runPhase runs pgbench for o.duration; with th != nil, beside a
// backfill whose Config.Throttles is th on the probe.
func runPhase(ctx context.Context, o options, db *sqlx.DB, pgb string, conn []string, work, name, query string, th *backfillthrottle.Throttle) (phase, error) {
	var p phase
	table := "bench_probe_" + name
	// The same start for every phase: a fresh target, pgbench's tables
	// vacuumed as pgbench does, and a checkpoint (each statement on its
	// own: VACUUM refuses a transaction block).
	for _, q := range []string{fmt.Sprintf(`DROP TABLE IF EXISTS %[1]s; CREATE TABLE %[1]s (id bigint PRIMARY KEY, v text NOT NULL, n int NOT NULL)`, table),
		`TRUNCATE pgbench_history`, `VACUUM ANALYZE pgbench_branches, pgbench_tellers, pgbench_history`, `CHECKPOINT`} {
		if _, err := db.Exec(q); err != nil {
			return p, err
		}
	}
	var rec *recorder
	if th != nil && th.Signal != nil {
		rec = &recorder{Signal: th.Signal}
	} else if th == nil {
		// Beside pgbench alone: the goal signal, its readings (ratios to
		// its own baseline, which it measures here too) show its noise.
		g, err := goalThrottle(o, query)
		if err != nil {
			return p, err
		}
		rec = &recorder{Signal: g.Signal}
	}

	type done struct {
		at   time.Time
		rows int64
	}
	var mu sync.Mutex
	var chunks []done
	var batchID int64
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	bfDone := make(chan error, 1)
	var r *backfill.Runner
	var startBackfill func()
	if th != nil {
		level := slog.LevelError
		if o.verbose {
			level = slog.LevelWarn // holds and unreadable signals
		}
		var ths []backfillthrottle.Throttle
		if th.Signal != nil {
			t := *th
			t.Signal = rec
			ths = append(ths, t)
		}
		conc, rate := o.concurrency, 0.0
		if strings.HasPrefix(name, "probe") || strings.HasPrefix(name, "cap") {
			conc, rate = cmp.Or(o.probeConc, o.concurrency), o.probeRate
		}
		var err error
		r, err = backfill.New(db, &backfill.Config{Concurrency: conc, WorkerID: "benchprobe-" + name, RowsPerSecond: rate,
			Throttles: ths, ThrottleInterval: o.interval, ChunkTarget: o.chunkTarget,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
			Hooks: backfill.HooksFunc(func(_ context.Context, b int64, c backfill.ChunkResult) {
				mu.Lock()
				chunks = append(chunks, done{time.Now(), c.Counts.Read})
				batchID = b
				mu.Unlock()
			})})
		if err != nil {
			return p, err
		}
		job := backfill.Job{
			Name:    "benchprobe-" + name,
			NewRun:  true,
			Chunker: backfill.IntRange(0, o.rows, o.chunk),
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				if o.chunkSleep > 0 {
					time.Sleep(o.chunkSleep)
				}
				for id := c.Lo; id < c.Hi; id++ {
					if err := w.Write(ctx, id, fmt.Sprint("v", id), int(id%1000)); err != nil {
						return err
					}
				}
				return nil
			}),
			Rollback: backfill.RollbackNone,
			Target:   backfill.Target{Table: table, Key: []string{"id"}},
		}
		startBackfill = func() {
			go func() {
				_, err := r.Run(bctx, job)
				bfDone <- err
			}()
		}
	} else {
		// The probe's own latency beside pgbench alone, one reading
		// per interval as a throttle would.
		startBackfill = func() {
			go func() {
				tk := time.NewTicker(o.interval)
				defer tk.Stop()
				for {
					select {
					case <-bctx.Done():
						bfDone <- nil
						return
					case <-tk.C:
					}
					rctx, c := context.WithTimeout(bctx, o.interval)
					start := time.Now()
					_, err := rec.Read(rctx, db, backfillthrottle.SignalScope{})
					c()
					if err == nil {
						mu.Lock()
						p.probeLat = append(p.probeLat, time.Since(start))
						mu.Unlock()
					}
				}
			}()
		}
	}

	prefix := filepath.Join(work, name)
	// pgbench first (the application runs before the backfill starts,
	// and the goal throttle calibrates beside it), the backfill o.lead
	// later; pgbench's window is its last o.duration, o.warmup after the
	// backfill started.
	total := o.lead + o.warmup + o.duration
	args := append(slices.Clone(conn), "-n", "-T", strconv.Itoa(int(total/time.Second)), "-c", strconv.Itoa(o.clients), "-j", "2",
		"-b", "tpcb-like", "-l", "--log-prefix", prefix)
	cmd := exec.CommandContext(ctx, pgb, args...)
	cmd.Env = append(os.Environ(), "PGAPPNAME=pgbench")
	cmd.Dir = work
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return p, fmt.Errorf("pgbench: %w", err)
	}
	// The goal's backfill starts early, o.calStart after pgbench: its
	// first calibration (the backfill held) is over before the window,
	// as it is over before the steady state of a long run. The free
	// backfill starts o.lead after pgbench.
	lead := o.lead
	if _, cal := recSignal(rec).(backfillthrottle.Calibrator); cal && o.calStart < o.lead {
		// The goal signal beside pgbench alone starts then too.
		lead = o.calStart
	}
	time.Sleep(lead)
	startBackfill()
	start := began.Add(o.lead + o.warmup)
	err := cmd.Wait()
	end := time.Now()
	if err != nil {
		return p, fmt.Errorf("pgbench: %w\n%s", err, out.String())
	}
	// Did the backfill outlast pgbench?
	select {
	case err := <-bfDone:
		if th != nil {
			p.err = fmt.Errorf("the backfill ended before pgbench: %v", err)
		}
	default:
		p.backfillOK = true
		cancel()
		<-bfDone
	}
	cancel()

	lat, err := benchpg.ReadLogs(prefix)
	if err != nil {
		return p, err
	}
	w := benchpg.Window(lat, start, end.Add(time.Second))
	p.tx, p.secs = len(w), end.Sub(start).Seconds()
	p.p99, p.p50, p.max = benchpg.Quantile(w, 0.99), benchpg.Quantile(w, 0.5), benchpg.Quantile(w, 1)
	if rec != nil {
		rec.mu.Lock()
		if !rec.calEnd.IsZero() {
			p.calEnded = start.Sub(rec.calEnd)
		}
		rec.mu.Unlock()
		p.probeVals = rec.within(start, end)
		p.baseline = rec.baseline()
		p.source = rec.source()
	}
	mu.Lock()
	for _, c := range chunks {
		if !c.at.Before(start) && c.at.Before(end) {
			p.rows += c.rows
		}
	}
	b := batchID
	mu.Unlock()
	if r != nil && b != 0 {
		if ts, err := r.TimeSplit(ctx, b); err == nil {
			p.split = &ts
		} else {
			p.err = err
		}
		if ps, err := backfill.NewPGManifest("").ThrottlePeriods(ctx, db, b); err == nil {
			p.holds = len(ps)
			// The calibrations' holds within the window.
			for _, q := range ps {
				if !strings.Contains(q.Reason, "calibrating") {
					continue
				}
				from, to := q.StartedAt, q.Ended
				if to.IsZero() || to.After(end) {
					to = end
				}
				if from.Before(start) {
					from = start
				}
				if to.After(from) {
					p.calHeld += to.Sub(from)
				}
			}
			// pgbench's latencies while the backfill was held, and
			// while it worked.
			var held, working []benchpg.Tx
			for _, t := range lat {
				if t.End.Before(start) || !t.End.Before(end) {
					continue
				}
				if slices.ContainsFunc(ps, func(q backfilltype.ThrottlePeriod) bool { return !t.End.Before(q.StartedAt) && t.End.Before(q.Ended) }) {
					held = append(held, t)
				} else {
					working = append(working, t)
				}
			}
			p.heldP99 = benchpg.Quantile(benchpg.Window(held, start, end), 0.99)
			p.workP99 = benchpg.Quantile(benchpg.Window(working, start, end), 0.99)
			p.heldTx, p.workTx = len(held), len(working)
		}
	}
	return p, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

func report(o options, settings []benchpg.Setting, query string, alone *phase, ps []phase) {
	fmt.Printf("# benchprobe: pgbench beside a backfill, with and without a latency-probe throttle\n\n")
	for _, s := range settings {
		fmt.Printf("- %s = %s\n", s.Name, s.Value)
	}
	fmt.Printf("- pgbench: scale %d, %d TPC-B-like clients (-j 2), %v per phase\n", o.scale, o.clients, o.duration)
	fmt.Printf("- backfill: upsert, chunks of %d rows, Concurrency %d, extractor sleep %v per chunk, %v ahead of pgbench\n",
		o.chunk, o.concurrency, o.chunkSleep, o.warmup)
	if o.probeConc != 0 || o.probeRate != 0 {
		fmt.Printf("- the throttled phase only: Concurrency %d, RowsPerSecond %g\n", cmp.Or(o.probeConc, o.concurrency), o.probeRate)
	}
	fmt.Printf("- probe: p%g over %v, read every %v: %q\n", o.pct, o.window, o.interval, oneLine(query))
	if alone != nil {
		a := float64(alone.p99) / float64(time.Millisecond)
		fmt.Printf("- throttle: High %.2f ms (p99 alone × %g), Low %.2f ms (× %g), MinHold %v\n", a*o.high, o.high, a*o.low, o.low, o.minHold)
		sort := slices.Clone(alone.probeLat)
		slices.Sort(sort)
		fmt.Printf("- the goal signal's readings beside pgbench alone (%d readings of up to %d probes): time per reading p50 %s, p99 %s; its calibrated baseline %s\n",
			len(sort), max(o.samples, 8), ms(benchpg.Quantile(sort, 0.5)), ms(benchpg.Quantile(sort, 0.99)), ms(alone.baseline))
	}
	if strings.Contains(o.phases, "goal") {
		fmt.Printf("- goal: LatencyGoal(probe, %g, GoalOptions{Percentile: %g, Samples: %d}) (0: default), ThrottleInterval %v, ChunkTarget %v; its backfill starts %v after pgbench (the free one %v), the window %v after pgbench\n",
			o.rise, o.goalPct, o.samples, o.interval, o.chunkTarget, o.calStart, o.lead, o.lead+o.warmup)
	}
	fmt.Println()
	fmt.Println("| phase | pgbench tx | TPS | TPS ratio | p50 | p99 | p99 ratio | max | probe reading p50 / max | backfill rows/s | rows/s ratio | holds | time split |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	var free *phase
	for i := range ps {
		if ps[i].name == "free" {
			free = &ps[i]
		}
	}
	for i := range ps {
		p := &ps[i]
		tpsR, p99R, rR := "-", "-", "-"
		if alone != nil && alone.tx > 0 {
			tpsR = fmt.Sprintf("%.2f", p.tps()/alone.tps())
			p99R = fmt.Sprintf("%.2f", float64(p.p99)/float64(alone.p99))
		}
		rows := "-"
		if p.name != "alone" {
			rows = fmt.Sprintf("%.0f", p.rps())
			if throttled(p.name) && free != nil && free.rows > 0 {
				rR = fmt.Sprintf("%.2f", p.rps()/free.rps())
			}
		}
		probe := "-"
		if len(p.probeVals) > 0 {
			unit := " ms"
			if p.name != "probe" {
				unit = " (ratio to baseline " + ms(p.baseline) + ", " + p.source + ")"
			}
			probe = fmt.Sprintf("%.2f / %.2f%s", p.probeVals[len(p.probeVals)/2], p.probeVals[len(p.probeVals)-1], unit)
		}
		split := "-"
		if p.split != nil && throttled(p.name) {
			var th time.Duration
			for _, d := range p.split.Throttled {
				th += d
			}
			split = fmt.Sprintf("working %v, throttled %v (%.0f%%)", p.split.Working.Round(100*time.Millisecond),
				th.Round(100*time.Millisecond), 100*th.Seconds()/math.Max(p.split.Total.Seconds(), 0.001))
		}
		fmt.Printf("| %s | %d | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |\n", p.name, p.tx, p.tps(), tpsR,
			ms(p.p50), ms(p.p99), p99R, ms(p.max), probe, rows, rR, p.holds, split)
		if throttled(p.name) && p.holds > 0 {
			defer fmt.Printf("\n- %s phase: pgbench p99 %s over %d tx while the backfill was held, %s over %d tx while it worked\n",
				p.name, ms(p.heldP99), p.heldTx, ms(p.workP99), p.workTx)
		}
		if p.err != nil {
			fmt.Printf("\n(phase %s: %v)\n", p.name, p.err)
		}
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// recSignal is the signal rec records, nil without one.
func recSignal(rec *recorder) backfillthrottle.Signal {
	if rec == nil {
		return nil
	}
	return rec.Signal
}
