// Command benchadapt measures adaptive chunks (Config.ChunkTarget) on a
// skewed key range, on a throwaway server with production durability
// (fsync, full_page_writes and synchronous_commit on; DATABASE_URL to use
// a server of yours):
//
//   - skew: -chunks plan chunks of -width keys, one key one order line,
//     except one chunk (the middle one) whose keys have -heavy lines each
//     (50: a chunk 50 times the others), loaded into an empty order-lines
//     table with ChunkTarget -target. It reports the p50, p90, p99 and
//     maximum of the chunk transactions' durations (the sub-chunks'
//     recorded durations, from begin to checkpoint, and each plan chunk
//     run whole, its stage, merge, validate and checkpoint phases as a
//     Tracer sees them) against the target, the sub-chunks
//     of the heavy chunk, and the same load without ChunkTarget for
//     comparison (the heavy chunk's one transaction).
//   - timeout: the heavy chunk alone with StatementTimeout -timeout and a
//     trigger that sleeps in any transaction inserting more than
//     -timeout-rows rows: whether the chunk finishes by splitting.
//
// Each variant runs -runs times, alternating; the report gives each
// run's figures and the medians. It asserts nothing.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/cmd/bench/internal/benchpg"
	"github.com/pgbackfill/backfill/cmd/bench/internal/orderlines"
)

type options struct {
	chunks, width, heavy int64
	target               time.Duration
	timeout              time.Duration
	timeoutRows          int
	runs                 int
	fast                 bool
	concurrency          int
	variants             string
	detail               int
	detailAll            bool
}

func main() {
	var o options
	flag.Int64Var(&o.chunks, "chunks", 21, "plan chunks")
	flag.Int64Var(&o.width, "width", 5000, "keys per plan chunk (one row per key)")
	flag.Int64Var(&o.heavy, "heavy", 50, "rows per key of the heavy chunk")
	flag.DurationVar(&o.target, "target", 200*time.Millisecond, "Config.ChunkTarget")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Second, "StatementTimeout of the timeout variant")
	flag.IntVar(&o.timeoutRows, "timeout-rows", 20000, "the timeout variant's trigger sleeps in a transaction inserting more rows than this")
	flag.IntVar(&o.runs, "runs", 3, "rounds")
	flag.IntVar(&o.concurrency, "concurrency", 1, "Config.Concurrency")
	flag.BoolVar(&o.fast, "fast", false, "the test server (fsync off), not production durability")
	flag.StringVar(&o.variants, "variants", "adapt,plain,timeout", "the variants to run, comma-separated")
	flag.IntVar(&o.detail, "detail", 0, "print each adapt run's longest n transactions (phases, rows, the one before) to stderr")
	flag.BoolVar(&o.detailAll, "detail-all", false, "with -detail, print every transaction of each adapt run in order too")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "benchadapt:", err)
		os.Exit(1)
	}
}

// rowsPerKey is the lines of key k.
func (o options) rowsPerKey(k int64) int64 {
	if k/o.width == o.chunks/2 {
		return o.heavy
	}
	return 1
}

func (o options) job(name string, lo, hi int64) backfill.Job {
	return backfill.Job{Name: name, NewRun: true, Chunker: backfill.IntRange(lo, hi, o.width),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			vals := make([]any, len(orderlines.AllColumns))
			var buf []byte
			for k := c.Lo; k < c.Hi; k++ {
				for j := range o.rowsPerKey(k) {
					buf = orderlines.Row(k*64+j, vals, buf)
					if err := w.Write(ctx, vals...); err != nil {
						return err
					}
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "lines", Key: orderlines.KeyColumns, Columns: orderlines.AllColumns}}
}

type result struct {
	wall         time.Duration
	txs          []time.Duration // sorted
	heavySubs    int
	heavyMax     time.Duration
	wholeChunks  int
	rows         int64
	split        int
	finished     bool
	err          error
	heavyWholeTx time.Duration
}

// txTracer sums the phases of each chunk's transaction but its commit
// (stage, merge, validate, checkpoint), by Seq: a whole chunk's
// transaction from its begin to its checkpoint, as a sub-chunk records
// its own.
type txTracer struct {
	mu sync.Mutex
	tx map[int]time.Duration
	// txs are every chunk transaction's phases in the order they began
	// (-detail).
	txs []*txPhases
	cur map[string]*txPhases
}

// txPhases is one chunk transaction's phases (a sub-chunk's or a whole
// chunk's), for -detail.
type txPhases struct {
	n      int
	seq    int
	bounds string
	rows   int64
	phases map[backfilltrace.Phase]time.Duration
}

// tx is the sum of t's phases from stage to checkpoint.
func (t *txPhases) tx() time.Duration {
	return t.phases[backfilltrace.PhaseStage] + t.phases[backfilltrace.PhaseMerge] + t.phases[backfilltrace.PhaseValidate] + t.phases[backfilltrace.PhaseCheckpoint]
}

func (t *txTracer) TraceChunkStart(ctx context.Context, _ backfilltrace.ChunkStartData) context.Context {
	return ctx
}

func (t *txTracer) TraceChunkEnd(context.Context, backfilltrace.ChunkEndData) {}

func (t *txTracer) TracePhaseStart(ctx context.Context, _ backfilltrace.PhaseStartData) context.Context {
	return ctx
}

func (t *txTracer) TracePhaseEnd(_ context.Context, d backfilltrace.PhaseEndData) {
	switch d.Phase {
	case backfilltrace.PhaseStage, backfilltrace.PhaseMerge, backfilltrace.PhaseValidate, backfilltrace.PhaseCheckpoint, backfilltrace.PhaseCommit:
		t.mu.Lock()
		if d.Phase != backfilltrace.PhaseCommit {
			t.tx[d.Chunk.Seq] += d.Duration
		}
		lo, hi := d.Chunk.Bounds()
		key := fmt.Sprintf("%d %d [%s, %s)", d.Chunk.Seq, d.Attempt, lo, hi)
		p := t.cur[key]
		if p == nil || d.Phase == backfilltrace.PhaseStage {
			p = &txPhases{n: len(t.txs), seq: d.Chunk.Seq, bounds: "[" + lo + ", " + hi + ")", phases: map[backfilltrace.Phase]time.Duration{}}
			t.txs = append(t.txs, p)
			t.cur[key] = p
		}
		p.phases[d.Phase] += d.Duration
		if d.Phase == backfilltrace.PhaseMerge {
			p.rows = d.Rows
		}
		t.mu.Unlock()
	}
}

func run(o options) error {
	ctx := context.Background()
	db, url, settings, stop, err := benchpg.Open(ctx, o.fast, 3*o.concurrency+4, "fsync", "synchronous_commit", "full_page_writes", "shared_buffers")
	defer stop()
	if err != nil {
		return err
	}
	_ = url
	fmt.Printf("# benchadapt\n\n`%s`\n\n", strings.Join(os.Args, " "))
	for _, s := range settings {
		fmt.Printf("- %s = %s\n", s.Name, s.Value)
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("- load average at start: %s\n", strings.TrimSpace(string(b)))
	}
	fmt.Printf("- %d chunks of %d keys, heavy chunk %d (%d rows), target %v, concurrency %d\n\n", o.chunks, o.width, o.chunks/2, o.width*o.heavy, o.target, o.concurrency)

	var adapt, plain, tmo []result
	for i := range o.runs {
		variants := strings.Split(o.variants, ",")
		if i%2 == 1 {
			slices.Reverse(variants)
		}
		for _, v := range variants {
			var r result
			switch v {
			case "adapt":
				r, err = o.skew(ctx, db, o.target)
				adapt = append(adapt, r)
			case "plain":
				r, err = o.skew(ctx, db, 0)
				plain = append(plain, r)
			case "timeout":
				r, err = o.timeoutRun(ctx, db)
				tmo = append(tmo, r)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", v, err)
			}
		}
	}
	fmt.Printf("## Skewed range, ChunkTarget %v\n\n", o.target)
	fmt.Println("| run | wall | transactions | p50 | p90 | p99 | max | p50/target | p99/target | heavy chunk's sub-chunks | heavy max | plan chunks whole |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	var p50s, p99s []float64
	for i, r := range adapt {
		p50, p99 := q(r.txs, 0.5), q(r.txs, 0.99)
		p50s, p99s = append(p50s, ratio(p50, o.target)), append(p99s, ratio(p99, o.target))
		fmt.Printf("| %d | %v | %d | %v | %v | %v | %v | %.2f | %.2f | %d | %v | %d |\n", i+1, r.wall.Round(time.Millisecond), len(r.txs),
			ms(p50), ms(q(r.txs, 0.9)), ms(p99), ms(q(r.txs, 1)), ratio(p50, o.target), ratio(p99, o.target), r.heavySubs, ms(r.heavyMax), r.wholeChunks)
	}
	m50, m99 := median(p50s), median(p99s)
	fmt.Printf("\nMedian of runs: p50 %.2f× target (bar: 0.80–1.20: %s), p99 %.2f× target (bar: under 2: %s).\n\n", m50, yes(m50 >= 0.8 && m50 <= 1.2), m99, yes(m99 < 2))
	fmt.Println("## The same load without ChunkTarget")
	fmt.Println()
	fmt.Println("| run | wall | heavy chunk's transaction |")
	fmt.Println("|---|---|---|")
	for i, r := range plain {
		fmt.Printf("| %d | %v | %v |\n", i+1, r.wall.Round(time.Millisecond), ms(r.heavyWholeTx))
	}
	fmt.Printf("\n## Heavy chunk alone, StatementTimeout %v, a transaction of more than %d rows sleeps\n\n", o.timeout, o.timeoutRows)
	fmt.Println("| run | finished | wall | sub-chunks | cut after a timeout | max transaction | error |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for i, r := range tmo {
		e := ""
		if r.err != nil {
			e = r.err.Error()
		}
		fmt.Printf("| %d | %v | %v | %d | %d | %v | %s |\n", i+1, r.finished, r.wall.Round(time.Millisecond), r.heavySubs, r.split, ms(q(r.txs, 1)), e)
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("\n- load average at end: %s\n", strings.TrimSpace(string(b)))
	}
	return nil
}

// printDetail prints the longest o.detail transactions tr saw, with
// their phases, rows and the transaction before each, to stderr.
func (o options) printDetail(tr *txTracer, target time.Duration) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := slices.Clone(tr.txs)
	slices.SortFunc(s, func(a, b *txPhases) int { return int(b.tx() - a.tx()) })
	line := func(p *txPhases) string {
		return fmt.Sprintf("#%d seq %d %s rows %d tx %v (%.2f×) stage %v merge %v validate %v checkpoint %v commit %v", p.n, p.seq, p.bounds, p.rows,
			ms(p.tx()), ratio(p.tx(), target), ms(p.phases[backfilltrace.PhaseStage]), ms(p.phases[backfilltrace.PhaseMerge]),
			ms(p.phases[backfilltrace.PhaseValidate]), ms(p.phases[backfilltrace.PhaseCheckpoint]), ms(p.phases[backfilltrace.PhaseCommit]))
	}
	if o.detailAll {
		fmt.Fprintf(os.Stderr, "all %d transactions in order:\n", len(s))
		for _, p := range tr.txs {
			fmt.Fprintf(os.Stderr, "  #%d seq %d rows %d tx %v (%.2f×) rate %.0f rows/s commit %v\n", p.n, p.seq, p.rows, ms(p.tx()), ratio(p.tx(), target),
				float64(p.rows)/p.tx().Seconds(), ms(p.phases[backfilltrace.PhaseCommit]))
		}
	}
	fmt.Fprintf(os.Stderr, "longest of %d transactions:\n", len(s))
	for _, p := range s[:min(o.detail, len(s))] {
		fmt.Fprintln(os.Stderr, "  "+line(p))
		if p.n > 0 {
			fmt.Fprintln(os.Stderr, "    after "+line(tr.txs[p.n-1]))
		}
	}
}

func yes(b bool) string {
	if b {
		return "met"
	}
	return "NOT met"
}

func ms(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }

func ratio(d, t time.Duration) float64 { return float64(d) / float64(t) }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func q(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)-1) + 0.5)
	return sorted[i]
}

func reset(ctx context.Context, db *sqlx.DB) error {
	_, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS lines; `+orderlines.CreateTargetSQL("lines"))
	return err
}

func (o options) skew(ctx context.Context, db *sqlx.DB, target time.Duration) (result, error) {
	if err := reset(ctx, db); err != nil {
		return result{}, err
	}
	tr := &txTracer{tx: map[int]time.Duration{}, cur: map[string]*txPhases{}}
	r, err := backfill.New(db, &backfill.Config{Concurrency: o.concurrency, ChunkTarget: target, Tracer: tr,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return result{}, err
	}
	begin := time.Now()
	rep, err := r.Run(ctx, o.job(fmt.Sprintf("skew-%d", target), 0, o.chunks*o.width))
	res := result{wall: time.Since(begin)}
	if err != nil {
		return res, err
	}
	if target > 0 && o.detail > 0 {
		o.printDetail(tr, target)
	}
	return res, collect(ctx, db, rep.BatchID, o.chunks/2, tr, &res)
}

// collect reads the run's transactions: each sub-chunk's, and each plan
// chunk's that ran whole (tr's).
func collect(ctx context.Context, db *sqlx.DB, batch, heavy int64, tr *txTracer, res *result) error {
	var subs []struct {
		Seq   int64   `db:"seq"`
		MS    float64 `db:"duration_ms"`
		Split bool    `db:"split"`
	}
	if err := db.SelectContext(ctx, &subs, `SELECT seq, duration_ms, split FROM backfill.subchunks WHERE batch_id = $1`, batch); err != nil {
		return err
	}
	for _, s := range subs {
		d := time.Duration(s.MS * float64(time.Millisecond))
		res.txs = append(res.txs, d)
		if s.Seq == heavy {
			res.heavySubs++
			res.heavyMax = max(res.heavyMax, d)
		}
		if s.Split {
			res.split++
		}
	}
	var whole []int
	if err := db.SelectContext(ctx, &whole, `SELECT seq FROM backfill.chunks c
		WHERE batch_id = $1 AND NOT EXISTS (SELECT 1 FROM backfill.subchunks s WHERE s.batch_id = c.batch_id AND s.seq = c.seq)`, batch); err != nil {
		return err
	}
	for _, seq := range whole {
		tr.mu.Lock()
		d := tr.tx[seq]
		tr.mu.Unlock()
		res.txs = append(res.txs, d)
		res.wholeChunks++
		if int64(seq) == heavy {
			res.heavyWholeTx = d
		}
	}
	slices.Sort(res.txs)
	return db.GetContext(ctx, &res.rows, `SELECT coalesce(sum(rows_read), 0) FROM backfill.chunks WHERE batch_id = $1`, batch)
}

func (o options) timeoutRun(ctx context.Context, db *sqlx.DB) (result, error) {
	if err := reset(ctx, db); err != nil {
		return result{}, err
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`CREATE OR REPLACE FUNCTION slow_bulk() RETURNS trigger LANGUAGE plpgsql AS $$
		DECLARE n int := coalesce(nullif(current_setting('bench.n', true), ''), '0')::int + 1;
		BEGIN
			PERFORM set_config('bench.n', n::text, true);
			IF n = %d THEN PERFORM pg_sleep(600); END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER slow_bulk BEFORE INSERT ON lines FOR EACH ROW EXECUTE FUNCTION slow_bulk();`, o.timeoutRows+1)); err != nil {
		return result{}, err
	}
	tr := &txTracer{tx: map[int]time.Duration{}, cur: map[string]*txPhases{}}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, ChunkTarget: time.Hour, StatementTimeout: o.timeout, MaxAttempts: 1, Tracer: tr,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return result{}, err
	}
	heavy := o.chunks / 2
	begin := time.Now()
	rep, err := r.Run(ctx, o.job("timeout", heavy*o.width, (heavy+1)*o.width))
	res := result{wall: time.Since(begin), err: err, finished: err == nil}
	if err != nil {
		return res, nil
	}
	return res, collect(ctx, db, rep.BatchID, 0, tr, &res)
}
