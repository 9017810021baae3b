package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfillthrottle"
)

// The priority benchmark (-bench-priority N): the graph of graph.go run
// N rounds, each round three times on fresh tables and a fresh
// manifest: unloaded, loaded, and unloaded at concurrency 1 (what the
// essential module's rate under a hold, one chunk at a time, amounts
// to), the order rotating between rounds. Every run carries the same
// throttle, a signal this process sets: unloaded it reads
// 0 throughout; loaded it reads 1 (a hold) from the start until every
// chunk of the flights module is committed, then 0. It reports, from the
// manifest's chunk times, the flights module's duration (its first
// chunk's start to its last chunk's commit) loaded against unloaded (the
// bar: at most 1.3x), and whether route_stats, deferrable, parked while
// the hold lasted (no chunk of it started before the release). It
// asserts nothing: it reports.

// benchSignal is a throttle signal whose value the benchmark sets.
type benchSignal struct{ v atomic.Int64 }

func (s *benchSignal) Name() string { return "bench_hold" }

func (s *benchSignal) Read(context.Context, sqlx.ExtContext, backfillthrottle.SignalScope) (float64, error) {
	return float64(s.v.Load()), nil
}

// benchVariant is one of the benchmark's runs: loaded or not, at what
// concurrency.
type benchVariant struct {
	loaded      bool
	concurrency int
}

func (v benchVariant) String() string {
	if v.loaded {
		return fmt.Sprintf("loaded c%d", v.concurrency)
	}
	return fmt.Sprintf("unloaded c%d", v.concurrency)
}

// benchResult is one run of the benchmark.
type benchResult struct {
	v benchVariant
	// flights is the flights module's duration; total the graph's call;
	// busy the sum of its chunks' own times (first lease to commit), so
	// that flights - busy is, in a run of one chunk at a time, the time
	// between a chunk's commit and the next one's lease.
	flights, total, busy time.Duration
	// rsFirst is when route_stats's first chunk started, after the
	// flights module's last commit (negative: before); rsEarly counts
	// route_stats chunks started before the hold's release (loaded).
	rsFirst time.Duration
	rsEarly int
	rsTotal int
	load    string
}

// benchPriority runs the benchmark; it refuses a database whose manifest
// holds runs of other jobs (it drops the manifest and the tables).
func benchPriority(ctx context.Context, out io.Writer, db *sqlx.DB, logger *slog.Logger, src backfill.Extractor, days backfill.Chunker, airportsPath string, o options) error {
	var others []string
	err := db.SelectContext(ctx, &others, `SELECT DISTINCT job_name FROM backfill.runs WHERE job_name <> ALL ($1) ORDER BY 1`,
		"{"+strings.Join([]string{graphName, airportsJob, flightsJob, routeStatsJob}, ",")+"}")
	if err != nil && !strings.Contains(err.Error(), "does not exist") {
		return fmt.Errorf("bench: %w", err)
	}
	if len(others) > 0 {
		return fmt.Errorf("bench: the manifest holds runs of other jobs (%s): the benchmark drops the manifest and the tables; run it on a database of its own", strings.Join(others, ", "))
	}
	chunks, err := days.Chunks(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "bench-priority: %d rounds, %s (%d days), concurrency %d, CPUs %d\n",
		o.benchPriority, days.Scope(), len(chunks), o.concurrency, runtime.NumCPU())
	fmt.Fprintf(out, "  command: %s\n", strings.Join(os.Args, " "))
	variants := []benchVariant{{false, o.concurrency}, {true, o.concurrency}, {false, 1}}
	byVariant := map[benchVariant][]float64{}
	var ratios, ratiosC1 []float64
	parked := true
	for round := 1; round <= o.benchPriority; round++ {
		k := (round - 1) % len(variants)
		order := append(slices.Clone(variants[k:]), variants[:k]...)
		got := map[benchVariant]benchResult{}
		for _, v := range order {
			r, err := benchRun(ctx, db, logger, src, days, airportsPath, o, v)
			if err != nil {
				return fmt.Errorf("bench round %d (%s): %w", round, v, err)
			}
			got[v] = r
			byVariant[v] = append(byVariant[v], r.flights.Seconds())
			if v.loaded {
				parked = parked && r.rsEarly == 0
			}
			fmt.Fprintf(out, "  round %d %-12s flights %7.2fs (chunks' own time %7.2fs)  graph %7.2fs  route_stats first start %+7.2fs after flights' last commit, %d of %d chunks started before the release  load %s\n",
				round, v, r.flights.Seconds(), r.busy.Seconds(), r.total.Seconds(), r.rsFirst.Seconds(), r.rsEarly, r.rsTotal, r.load)
		}
		ld := got[variants[1]].flights.Seconds()
		ratios = append(ratios, ld/got[variants[0]].flights.Seconds())
		ratiosC1 = append(ratiosC1, ld/got[variants[2]].flights.Seconds())
	}
	for _, v := range variants {
		s := byVariant[v]
		fmt.Fprintf(out, "flights (essential) %-12s median %.2fs (range %.2f..%.2f)\n", v.String()+":", median(s), slices.Min(s), slices.Max(s))
	}
	verdict := "within"
	if median(ratios) > 1.3 {
		verdict = "OVER"
	}
	fmt.Fprintf(out, "loaded/unloaded per round: median %.2fx (range %.2f..%.2f): %s the bar of 1.3x\n", median(ratios), slices.Min(ratios), slices.Max(ratios), verdict)
	fmt.Fprintf(out, "loaded/unloaded at concurrency 1 per round: median %.2fx (range %.2f..%.2f)\n", median(ratiosC1), slices.Min(ratiosC1), slices.Max(ratiosC1))
	fmt.Fprintf(out, "route_stats (deferrable) parked while the hold lasted in every loaded run: %t\n", parked)
	return nil
}

// benchRun runs the graph once on fresh tables and manifest.
func benchRun(ctx context.Context, db *sqlx.DB, logger *slog.Logger, src backfill.Extractor, days backfill.Chunker, airportsPath string, o options, v benchVariant) (benchResult, error) {
	res := benchResult{v: v}
	loaded := v.loaded
	o.concurrency = v.concurrency
	if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS airports, flights, route_stats; DROP SCHEMA IF EXISTS backfill CASCADE`); err != nil {
		return res, err
	}
	if _, err := db.ExecContext(ctx, schemaDDL+routeStatsDDL+`CHECKPOINT`); err != nil {
		return res, err
	}
	sig := &benchSignal{}
	if loaded {
		sig.v.Store(1)
	}
	o.throttleEvery = 100 * time.Millisecond
	runner, err := graphRunner(db, logger, o, []backfillthrottle.Throttle{{Signal: sig, High: 1, Low: 0.5}}, false)
	if err != nil {
		return res, err
	}
	g := flightsGraph(db, src, days, airportsPath, 0)
	// The release: once the flights module's chunks are all committed.
	var released atomic.Value
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			var left struct {
				Runs int `db:"runs"`
				Left int `db:"left"`
			}
			err := db.GetContext(ctx, &left, `SELECT count(DISTINCT r.batch_id) AS runs, count(*) FILTER (WHERE c.status <> 'done') AS left
				FROM backfill.runs r JOIN backfill.chunks c USING (batch_id) WHERE r.job_name = $1`, flightsJob)
			if err == nil && left.Runs > 0 && left.Left == 0 {
				var at time.Time
				if db.GetContext(ctx, &at, `SELECT clock_timestamp()`) == nil {
					released.Store(at)
				}
				sig.v.Store(0)
				return
			}
		}
	}()
	begin := time.Now()
	_, err = runner.RunGraph(ctx, g)
	res.total = time.Since(begin)
	close(stop)
	<-done
	if err != nil {
		return res, err
	}
	res.load = loadAvg()
	var f struct {
		First time.Time `db:"first"`
		Last  time.Time `db:"last"`
		Busy  float64   `db:"busy"`
	}
	if err := db.GetContext(ctx, &f, `SELECT min(c.started_at) AS first, max(c.finished_at) AS last,
			extract(epoch FROM sum(c.finished_at - c.started_at))::float8 AS busy
		FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.job_name = $1 AND c.status = 'done'`, flightsJob); err != nil {
		return res, err
	}
	res.flights = f.Last.Sub(f.First)
	res.busy = time.Duration(f.Busy * float64(time.Second))
	var rs struct {
		First time.Time `db:"first"`
		Total int       `db:"total"`
		Early int       `db:"early"`
	}
	rel, _ := released.Load().(time.Time)
	if err := db.GetContext(ctx, &rs, `SELECT min(c.started_at) AS first, count(*) AS total,
			count(*) FILTER (WHERE c.started_at < $2) AS early
		FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.job_name = $1`, routeStatsJob, rel); err != nil {
		return res, err
	}
	res.rsFirst = rs.First.Sub(f.Last)
	res.rsTotal = rs.Total
	if loaded {
		res.rsEarly = rs.Early
		if rel.IsZero() {
			res.rsEarly = rs.Total
		}
	}
	return res, nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// loadAvg is the machine's 1-, 5- and 15-minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
