package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pgbackfill/backfill"
)

// The suite: rounds of whole-process loads. A variant is one child
// process; a chain is the variants that run one after the other on one
// fresh table (a replay needs the load before it). Round r runs every
// chain once, the chains in an order rotated by r-1, so that drift on a
// shared machine falls on every variant alike.

// variant describes one measured load.
type variant struct {
	key   string
	label string
}

// The variants, in report order.
var suiteVariants = []variant{
	{"lib", "library defaults: first load (main variant)"},
	{"base", "baseline (hand-written chunked load): first load"},
	{"once", "one COPY + merge of all rows: first load"},
	{"ahead", "library, ExtractAhead %s: first load"},
	{"skip", "library, SkipUnchanged on: first load"},
	{"skip-replay", "library, SkipUnchanged on: unchanged replay"},
	{"skip-restate", "library, SkipUnchanged on: restatement, 5% of chunks changed"},
	{"replay", "library, SkipUnchanged off: unchanged replay"},
	{"reload", "library, SkipUnchanged off: restatement, 5% of chunks changed (full reload)"},
	{"base-replay", "baseline: unchanged replay"},
	{"small", "library defaults, %s-row chunks: first load"},
	{"small-base", "baseline, %s-row chunks: first load"},
}

func (b *bench) variantLabel(key string) string {
	for _, v := range suiteVariants {
		if v.key != key {
			continue
		}
		switch key {
		case "ahead":
			return fmt.Sprintf(v.label, b.o.aheadVariant)
		case "small", "small-base":
			return fmt.Sprintf(v.label, thousands(b.o.smallChunk))
		case "skip", "skip-replay", "skip-restate":
			if b.o.skipChunkColumn {
				return strings.Replace(v.label, "SkipUnchanged on", "SkipUnchanged on, ChunkColumn order_no", 1)
			}
		}
		return v.label
	}
	return key
}

// step is one variant of a chain.
type step struct {
	key    string
	c      childOpts
	vacuum bool // VACUUM (ANALYZE) the table first, untimed (a replay)
	want   func(n backfill.Counts) bool
}

type chain struct {
	name  string
	steps []step
}

// result is one measured load.
type result struct {
	Server  string      `json:"server"`
	Round   int         `json:"round"`
	Order   int         `json:"order"` // position in its round, from 1
	Variant string      `json:"variant"`
	R       childResult `json:"result"`
	WAL     int64       `json:"wal_bytes"`
	// Autovac is the autovacuum and autoanalyze runs in the benchmark
	// database during the load (their WAL is in its figure).
	Autovac int64 `json:"autovacuum_runs"`
}

// changedRows is how many rows a restatement of rows in chunks of chunk
// changes: every row of every restateEvery-th chunk.
func changedRows(rows, chunk int64) int64 {
	var n int64
	for lo := int64(0); lo < rows; lo += chunk * restateEvery {
		n += min(chunk, rows-lo)
	}
	return n
}

// chains are the chains of round r, not yet rotated.
func (b *bench) chains(r int) []chain {
	rows, chunk := b.o.rows, b.o.chunk
	job := func(name string) string { return fmt.Sprintf("benchload-%s-%d", name, r) }
	lib := func(name string, ahead, skip optIn) childOpts {
		return childOpts{variant: "lib", job: job(name), rows: rows, chunk: chunk, ahead: ahead, skip: skip}
	}
	base := func(name string) childOpts {
		return childOpts{variant: "base", job: job(name), rows: rows, chunk: chunk}
	}
	firstLoad := func(n backfill.Counts) bool { return n.Read == rows && n.Inserted == rows }
	unchanged := func(n backfill.Counts) bool { return n.Read == rows && n.Unchanged == rows }
	changed := changedRows(rows, chunk)
	restated := func(n backfill.Counts) bool {
		return n.Read == rows && n.Updated == changed && n.Unchanged == rows-changed
	}
	replayOf := func(c childOpts, skip optIn, restate int) childOpts {
		c.newRun, c.skip, c.restate = true, skip, restate
		return c
	}
	o := b.o
	mainLib := lib("lib", o.mainAhead, o.mainSkip)
	skipLib := lib("skip", o.mainAhead, optOn)
	// With -skip-chunk-column the SkipUnchanged chain chunks by order_no
	// (the same rows per chunk) and declares ChunkColumn order_no, so
	// that a chunk's target fingerprint is a range scan of the index on
	// order_no that every table of the suite then has.
	skipLib.byOrder = o.skipChunkColumn
	baseReplay := base("base")
	baseReplay.newRun, baseReplay.job = true, baseReplay.job+"-replay"
	cs := []chain{
		{"lib", []step{
			{key: "lib", c: mainLib, want: firstLoad},
			{key: "replay", c: replayOf(mainLib, optOff, 0), vacuum: true, want: unchanged},
			{key: "reload", c: replayOf(mainLib, optOff, 1), want: restated},
		}},
		{"base", []step{{key: "base", c: base("base"), want: firstLoad}}},
		{"once", []step{{key: "once", c: childOpts{variant: "base", job: job("once"), rows: rows, chunk: rows}, want: firstLoad}}},
		{"skip", []step{
			{key: "skip", c: skipLib, want: firstLoad},
			{key: "skip-replay", c: replayOf(skipLib, optOn, 0), vacuum: true, want: unchanged},
			{key: "skip-restate", c: replayOf(skipLib, optOn, 1), want: restated},
		}},
	}
	if o.baseReplay {
		cs[1].steps = append(cs[1].steps, step{key: "base-replay", c: baseReplay, vacuum: true, want: unchanged})
	}
	if o.aheadVariant != "none" {
		cs = append(cs, chain{"ahead", []step{{key: "ahead", c: lib("ahead", optIn(o.aheadVariant), o.mainSkip), want: firstLoad}}})
	}
	if o.smallChunk > 0 {
		small := lib("small", o.mainAhead, o.mainSkip)
		small.chunk = o.smallChunk
		smallBase := base("small-base")
		smallBase.chunk = o.smallChunk
		cs = append(cs,
			chain{"small", []step{{key: "small", c: small, want: firstLoad}}},
			chain{"small_base", []step{{key: "small-base", c: smallBase, want: firstLoad}}})
	}
	if o.only != nil {
		var kept []chain
		for _, ch := range cs {
			if o.only[ch.name] {
				kept = append(kept, ch)
			}
		}
		cs = kept
	}
	return cs
}

// suite runs b.o.runs rounds of every chain and returns every load.
func (b *bench) suite(ctx context.Context) ([]result, error) {
	var rs []result
	// Round 1 checks that every first load, and every restatement, left
	// the same rows: a multiset hash of the table per kind of load.
	sums := map[string]string{}
	for r := 1; r <= b.o.runs; r++ {
		cs := b.chains(r)
		k := (r - 1) % len(cs)
		cs = append(cs[k:], cs[:k]...)
		order := 0
		var names []string
		for _, ch := range cs {
			names = append(names, ch.name)
		}
		progress("%s server, round %d of %d: %s", b.server, r, b.o.runs, strings.Join(names, ", "))
		for _, ch := range cs {
			table := fmt.Sprintf("%s.%s_%d", benchSchema, ch.name, r)
			if err := b.freshTable(ctx, table); err != nil {
				return nil, err
			}
			if b.o.skipChunkColumn {
				if _, err := b.db.ExecContext(ctx, `CREATE INDEX ON `+table+` (order_no)`); err != nil {
					return nil, err
				}
			}
			for _, st := range ch.steps {
				order++
				if st.vacuum {
					// The replay measures what the merge writes, not
					// maintenance owed by the load before it (hint bits,
					// visibility map), as autovacuum would have done by
					// the time a backfill is replayed.
					if _, err := b.db.ExecContext(ctx, `VACUUM (ANALYZE) `+table); err != nil {
						return nil, err
					}
				}
				c := st.c
				c.table = table
				b.quiesce(ctx)
				b.checkpoint(ctx)
				lsn0, av0 := b.lsn(ctx), b.autovac(ctx)
				res, err := b.child(ctx, c)
				if err != nil {
					return nil, err
				}
				x := result{Server: b.server, Round: r, Order: order, Variant: st.key, R: res, WAL: b.walSince(ctx, lsn0), Autovac: b.autovac(ctx) - av0}
				if !st.want(res.Counts) {
					return nil, fmt.Errorf("round %d: %s: unexpected counts %+v (%d chunks skipped)", r, b.variantLabel(st.key), res.Counts, res.ChunksSkipped)
				}
				progress("round %d: %-12s %6.2f s whole process (load %.2f s), %s rows/s, WAL %s, peak RSS %.1f MiB, %d chunks skipped",
					r, st.key, res.ProcSeconds, res.Seconds, fmtRate(float64(res.Rows)/res.ProcSeconds), mib(x.WAL), float64(res.VmHWMKiB)/1024, res.ChunksSkipped)
				rs = append(rs, x)
				if r == 1 {
					kind := "first load"
					if c.restate != 0 {
						kind = "restatement"
					} else if c.newRun {
						continue
					}
					sum, err := b.tableSum(ctx, table)
					if err != nil {
						return nil, err
					}
					if want, ok := sums[kind]; ok && sum != want {
						return nil, fmt.Errorf("round 1: %s after %s holds other rows than the other variants' %s: %s, want %s", table, st.key, kind, sum, want)
					}
					sums[kind] = sum
				}
			}
			if _, err := b.db.ExecContext(ctx, `DROP TABLE `+table); err != nil {
				return nil, err
			}
		}
		if r == 1 {
			progress("round 1: every variant's first load left the same rows, and every restatement")
		}
	}
	return rs, nil
}

// tableSum is a multiset hash of a table's rows and their count.
func (b *bench) tableSum(ctx context.Context, table string) (string, error) {
	var s string
	err := b.db.GetContext(ctx, &s, `SELECT count(*) || ':' || coalesce(sum(hashtextextended((`+strings.Join(allColumns, ", ")+`)::text, 0)::numeric), 0) FROM `+table+` t`)
	return s, err
}

// ratio is a speed ratio: the whole-process time of den over num's, per
// round, so above 1 means num is faster.
type ratio struct {
	label    string
	num, den string
	goal     string // the goal's text, if any
	met      func(median float64) bool
}

func (b *bench) ratios() []ratio {
	small := thousands(b.o.smallChunk)
	return []ratio{
		{label: "library defaults / baseline", num: "lib", den: "base", goal: "≥ 1.0×", met: func(x float64) bool { return x >= 1 }},
		{label: "library defaults / one COPY + merge", num: "lib", den: "once"},
		{label: "ExtractAhead " + b.o.aheadVariant + " / baseline", num: "ahead", den: "base"},
		{label: "ExtractAhead " + b.o.aheadVariant + " / library defaults", num: "ahead", den: "lib"},
		{label: "SkipUnchanged first load / baseline", num: "skip", den: "base"},
		{label: "SkipUnchanged first load / library defaults first load (cost = 1/ratio - 1)", num: "skip", den: "lib",
			goal: "cost ≤ 5%: ratio ≥ 0.952", met: func(x float64) bool { return 1/x-1 <= 0.05 }},
		{label: "unchanged replay, SkipUnchanged / library defaults first load", num: "skip-replay", den: "lib", goal: "≥ 3×", met: func(x float64) bool { return x >= 3 }},
		{label: "unchanged replay, SkipUnchanged / its own first load", num: "skip-replay", den: "skip"},
		{label: "unchanged replay without SkipUnchanged / library defaults first load", num: "replay", den: "lib"},
		{label: "restatement 5%, SkipUnchanged / full reload (the same without SkipUnchanged)", num: "skip-restate", den: "reload", goal: "≥ 5×", met: func(x float64) bool { return x >= 5 }},
		{label: "full reload / library defaults first load", num: "reload", den: "lib"},
		{label: "baseline replay / baseline first load", num: "base-replay", den: "base"},
		{label: small + "-row chunks: library defaults / baseline", num: "small", den: "small-base", goal: "≥ 1.0×", met: func(x float64) bool { return x >= 1 }},
		{label: small + "-row chunks / " + thousands(b.o.chunk) + "-row chunks, library defaults", num: "small", den: "lib"},
		{label: small + "-row chunks / " + thousands(b.o.chunk) + "-row chunks, baseline", num: "small-base", den: "base"},
	}
}

// byRound returns each round's result of variant v.
func byRound(rs []result, v string) map[int]result {
	m := map[int]result{}
	for _, r := range rs {
		if r.Variant == v {
			m[r.Round] = r
		}
	}
	return m
}

// perRound is the series, one per round, of f(num's result, den's).
func perRound(rs []result, num, den string, f func(n, d childResult) float64) []float64 {
	ns, ds := byRound(rs, num), byRound(rs, den)
	var xs []float64
	for r := 1; r <= len(ns); r++ {
		n, ok1 := ns[r]
		d, ok2 := ds[r]
		if ok1 && ok2 {
			xs = append(xs, f(n.R, d.R))
		}
	}
	return xs
}

func values(rs []result, v string, f func(result) float64) []float64 {
	var xs []float64
	for _, r := range rs {
		if r.Variant == v {
			xs = append(xs, f(r))
		}
	}
	return xs
}

func rangeOf(s summary, format func(float64) string) string {
	return fmt.Sprintf("%s – %s", format(s.Min), format(s.Max))
}

func (b *bench) printSuite(rs []result) {
	w := b.out
	n := b.o.runs
	rows := float64(b.o.rows)
	fmtX := func(x float64) string { return fmt.Sprintf("%.2f", x) }
	fmt.Fprintf(w, "## Variants: whole processes (exec to exit), median and per-round range of %d rounds\n\n", n)
	fmt.Fprintf(w, "Whole process: from exec to exit of the child (process start, connecting, the plan, run setup, the load, the finish). Load: the same timed inside the child from after connecting (secondary). Rows/s: %s rows / whole-process time.\n\n", thousands(b.o.rows))
	fmt.Fprintf(w, "| variant | whole process s | range | rows/s | load s | peak RSS | WAL | other CPU (avg cores) |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, v := range suiteVariants {
		proc := summarize(values(rs, v.key, func(r result) float64 { return r.R.ProcSeconds }))
		if len(values(rs, v.key, func(r result) float64 { return 0 })) == 0 {
			continue
		}
		inner := summarize(values(rs, v.key, func(r result) float64 { return r.R.Seconds }))
		rss := summarize(values(rs, v.key, func(r result) float64 { return float64(r.R.VmHWMKiB) * 1024 }))
		wal := summarize(values(rs, v.key, func(r result) float64 { return float64(r.WAL) }))
		other := summarize(values(rs, v.key, func(r result) float64 { return r.R.OtherCPU / r.R.ProcSeconds }))
		fmt.Fprintf(w, "| %s | %.2f | %s | %s | %.2f | %s | %s | %.2f |\n", b.variantLabel(v.key), proc.Median, rangeOf(proc, fmtX),
			fmtRate(rows/proc.Median), inner.Median, fmtMiB(rss.Max), fmtMiB(wal.Median), other.Median)
	}
	fmt.Fprintf(w, "\nPeak RSS is the worst round's; WAL the median (pg_wal_lsn_diff around the process, cluster-wide).\n\n")

	fmt.Fprintf(w, "## Ratios, computed per round (speed: the other's time / this one's; above 1 is faster)\n\n")
	fmt.Fprintf(w, "| ratio | whole process: median of rounds | per-round range | load only (secondary): median | range | goal |\n|---|---:|---:|---:|---:|---|\n")
	proc := func(n, d childResult) float64 { return d.ProcSeconds / n.ProcSeconds }
	inner := func(n, d childResult) float64 { return d.Seconds / n.Seconds }
	type verdict struct {
		label, goal string
		s           summary
		met         bool
	}
	var goals []verdict
	for _, q := range b.ratios() {
		ps := perRound(rs, q.num, q.den, proc)
		if len(ps) == 0 {
			continue
		}
		p, in := summarize(ps), summarize(perRound(rs, q.num, q.den, inner))
		g := ""
		if q.met != nil {
			ok := q.met(p.Median)
			g = q.goal + ": " + yesNo(ok)
			goals = append(goals, verdict{q.label, q.goal, p, ok})
		}
		fmt.Fprintf(w, "| %s | %.2f | %s | %.2f | %s | %s |\n", q.label, p.Median, rangeOf(p, fmtX), in.Median, rangeOf(in, fmtX), g)
	}
	walRatio := func(num, den string) summary {
		ns, ds := byRound(rs, num), byRound(rs, den)
		var xs []float64
		for r, x := range ns {
			if d, ok := ds[r]; ok && d.WAL > 0 {
				xs = append(xs, float64(x.WAL)/float64(d.WAL))
			}
		}
		return summarize(xs)
	}
	fmt.Fprintf(w, "\nWAL per round: ")
	var wl []string
	for _, q := range [][3]string{{"unchanged replay without SkipUnchanged / library defaults first load", "replay", "lib"},
		{"unchanged replay with SkipUnchanged / its first load", "skip-replay", "skip"},
		{"baseline replay / baseline first load", "base-replay", "base"}} {
		if s := walRatio(q[1], q[2]); s.Max > 0 || s.Median > 0 {
			wl = append(wl, fmt.Sprintf("%s %s (%s)", q[0], fmtPct(s.Median), rangeOf(s, fmtPct)))
		}
	}
	fmt.Fprintf(w, "%s.\n\n", strings.Join(wl, "; "))

	fmt.Fprintf(w, "## Goals (reported, not asserted; medians of the per-round ratios, whole processes)\n\n")
	for _, g := range goals {
		fmt.Fprintf(w, "- %s: %.2f (rounds %s), goal %s: %s\n", g.label, g.s.Median, rangeOf(g.s, fmtX), g.goal, yesNo(g.met))
	}
	var libRSS float64
	for _, r := range rs {
		if r.R.Variant == "lib" {
			libRSS = max(libRSS, float64(r.R.VmHWMKiB)*1024)
		}
	}
	fmt.Fprintf(w, "- library peak RSS, worst of every library load: %s, goal ≤ 64 MiB: %s\n\n", fmtMiB(libRSS), yesNo(libRSS <= 64<<20))

	fmt.Fprintf(w, "### Every load, in the order run\n\n| round | # | variant | whole process s | load s | rows/s | WAL | peak RSS | chunks skipped | autovacuum runs | other CPU (avg cores) |\n|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	sorted := slices.Clone(rs)
	slices.SortStableFunc(sorted, func(a, c result) int { return (a.Round*1000 + a.Order) - (c.Round*1000 + c.Order) })
	for _, r := range sorted {
		fmt.Fprintf(w, "| %d | %d | %s | %.2f | %.2f | %s | %s | %.1f MiB | %d | %d | %.2f |\n", r.Round, r.Order, r.Variant, r.R.ProcSeconds, r.R.Seconds,
			fmtRate(rows/r.R.ProcSeconds), mib(r.WAL), float64(r.R.VmHWMKiB)/1024, r.R.ChunksSkipped, r.Autovac, r.R.OtherCPU/r.R.ProcSeconds)
	}
	fmt.Fprintln(w)
}
