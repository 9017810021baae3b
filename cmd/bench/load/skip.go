package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pgbackfill/backfill"
)

// Replays that skip unchanged chunks (-skip; backfill.Job.SkipUnchanged).
//
// SkipUnchanged needs a ChunkColumn to bound a chunk's target rows, which
// the end-to-end job (IntRange over the row id, a number the target does
// not store) lacks. These loads chunk by order_no instead (order_no =
// 1e9 + id/8, eight lines per order): chunks of -chunk/8 orders, so of
// -chunk rows, ChunkColumn "order_no", and an index on order_no (the
// target fingerprint's range scan). Both tables of a run get the index;
// the end-to-end variants are left as they are.
//
// Per run, two fresh tables:
//
//   - on: first load with SkipUnchanged (it records the fingerprints), an
//     unchanged replay (every chunk skipped), then a restatement in which
//     every 20th chunk (5%) changed in every row, with SkipUnchanged, then
//     a correction of the restated data in which the same 5% of the
//     chunks changed in 1% of their rows (every correctEvery-th row): a
//     late fix of a few rows, where the restatement is the worst case;
//   - off: first load without it, then the same restatement and
//     correction without it, which stage and merge every chunk: the full
//     reloads;
//   - version: as on, with an extractor that is a backfill.ChunkVersioner
//     (versionedOrders): the unchanged chunks of a replay are not
//     extracted at all. Its ChunkVersion costs nothing (the generator is
//     a pure function of the row id and -restate, so the version is what
//     makes a chunk's rows differ); a real one is a source query (a
//     max(updated_at) and count(*) of the chunk's rows), which these
//     figures leave out.

// restateEvery: a restatement changes every restateEvery-th chunk.
const restateEvery = 20

// correctEvery: a correction changes every correctEvery-th row (by row
// id) of the chunks a restatement changes.
const correctEvery = 100

// byOrderJob returns the job of -byorder loads: [lo, lo+rows) as order
// chunks of o.chunk rows.
func byOrderJob(o childOpts) (backfill.Chunker, backfill.Extractor) {
	perChunk := max(o.chunk/8, 1)
	first := 1_000_000_000 + o.lo/8
	return backfill.IntRange(first, 1_000_000_000+(o.lo+o.rows)/8, perChunk),
		orderGenerator{first: first, perChunk: perChunk, restate: o.restate, correct: o.correct}
}

// orderGenerator is the Extractor of order chunks: the eight lines of
// each order of [c.Lo, c.Hi) (genRow's rows of ids 8*(order-1e9)...), with
// restate added to the quantity of every line of every restateEvery-th
// chunk when restate > 0, and correct to every correctEvery-th of those
// lines.
type orderGenerator struct {
	first, perChunk  int64
	restate, correct int
}

func (g orderGenerator) Extract(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	vals := make([]any, len(allColumns))
	var buf []byte
	changed := g.restate > 0 && ((c.Lo-g.first)/g.perChunk)%restateEvery == 0
	for order := c.Lo; order < c.Hi; order++ {
		for line := range int64(8) {
			id := (order-1_000_000_000)*8 + line
			buf = genRow(id, vals, buf)
			if changed {
				vals[5] = vals[5].(int) + g.restate
				if id%correctEvery == 0 {
					vals[5] = vals[5].(int) + g.correct
				}
			}
			if err := w.Write(ctx, vals...); err != nil {
				return err
			}
		}
	}
	return nil
}

// versionedOrders is orderGenerator with a ChunkVersion: the quantity
// added to the chunk's lines (0 for a chunk the restatement leaves as it
// is), which is all that makes one load's rows of a chunk differ from
// another's.
type versionedOrders struct{ orderGenerator }

// ChunkVersion implements backfill.ChunkVersioner.
func (g versionedOrders) ChunkVersion(_ context.Context, c backfill.Chunk) (string, error) {
	add, fix := 0, 0
	if g.restate > 0 && ((c.Lo-g.first)/g.perChunk)%restateEvery == 0 {
		add, fix = g.restate, g.correct
	}
	return fmt.Sprintf("quantity+%d,+%d", add, fix), nil
}

// skipMeasurement is one run of the -skip loads.
type skipMeasurement struct {
	Run int `json:"run"`
	// On: first load, unchanged replay, restatement with SkipUnchanged;
	// Off: first load and restatement (the full reload) without it.
	OnLoad, OnReplay, OnRestate childResult
	OffLoad, OffRestate         childResult
	OnLoadWAL, OnReplayWAL      int64
	OnRestateWAL, OffLoadWAL    int64
	OffRestateWAL               int64
	// Ver: the same as On with a ChunkVersioner (versionedOrders).
	VerLoad, VerReplay, VerRestate       childResult
	VerLoadWAL, VerReplayWAL, VerRestWAL int64
	// The corrections after each restatement.
	OnCorrect, OffCorrect, VerCorrect          childResult
	OnCorrectWAL, OffCorrectWAL, VerCorrectWAL int64
}

// skipBench runs the -skip loads b.o.runs times.
func (b *bench) skipBench(ctx context.Context) ([]skipMeasurement, error) {
	var ms []skipMeasurement
	for i := 1; i <= b.o.runs; i++ {
		m := skipMeasurement{Run: i}
		for _, v := range []string{"skip_on", "skip_version", "skip_off"} {
			on, versioned := v != "skip_off", v == "skip_version"
			table := tableName(v, i)
			if err := b.freshTable(ctx, table); err != nil {
				return nil, err
			}
			if _, err := b.db.ExecContext(ctx, `CREATE INDEX ON `+table+` (order_no)`); err != nil {
				return nil, err
			}
			c := childOpts{variant: "lib", table: table, job: fmt.Sprintf("benchload-%s-%d", v, i), rows: b.o.rows, chunk: b.o.chunk,
				byOrder: true, skip: onOff(on), versioned: versioned}
			step := func(what string, c childOpts, want func(backfill.Counts) bool) (childResult, int64, error) {
				b.quiesce(ctx)
				b.checkpoint(ctx)
				lsn0 := b.lsn(ctx)
				progress("run %d: %s: %s", i, v, what)
				r, err := b.child(ctx, c)
				if err != nil {
					return r, 0, err
				}
				wal := b.walSince(ctx, lsn0)
				if !want(r.Counts) {
					return r, wal, fmt.Errorf("%s %s: unexpected counts %+v", table, what, r.Counts)
				}
				progress("run %d: %s: %s: %.0f rows/s, WAL %s, %d chunks skipped", i, v, what, float64(r.Rows)/r.ProcSeconds, mib(wal), r.ChunksSkipped)
				return r, wal, nil
			}
			rows := b.o.rows
			chunks := (rows + b.o.chunk - 1) / b.o.chunk
			changedRows := ((chunks + restateEvery - 1) / restateEvery) * b.o.chunk
			changedRows = min(changedRows, rows)
			load, loadWAL, err := step("first load", c, func(n backfill.Counts) bool { return n.Read == rows && n.Inserted == rows })
			if err != nil {
				return nil, err
			}
			if _, err := b.db.ExecContext(ctx, `VACUUM (ANALYZE) `+table); err != nil {
				return nil, err
			}
			c.newRun = true
			if versioned {
				m.VerLoad, m.VerLoadWAL = load, loadWAL
				if m.VerReplay, m.VerReplayWAL, err = step("unchanged replay", c, func(n backfill.Counts) bool { return n.Read == rows && n.Unchanged == rows }); err != nil {
					return nil, err
				}
			} else if on {
				m.OnLoad, m.OnLoadWAL = load, loadWAL
				if m.OnReplay, m.OnReplayWAL, err = step("unchanged replay", b.skipProfiled(c, i, "replay", false), func(n backfill.Counts) bool { return n.Read == rows && n.Unchanged == rows }); err != nil {
					return nil, err
				}
				if pc := b.skipProfiled(c, i, "replay", true); pc.explain != "" {
					if _, _, err := step("unchanged replay with auto_explain (not measured)", pc, func(n backfill.Counts) bool { return n.Unchanged == rows }); err != nil {
						return nil, err
					}
				}
			} else {
				m.OffLoad, m.OffLoadWAL = load, loadWAL
			}
			c.restate = 1
			rc := c
			if on && !versioned {
				rc = b.skipProfiled(c, i, "restate", false)
			}
			restate, restateWAL, err := step("restatement (5% of chunks changed)", rc, func(n backfill.Counts) bool {
				return n.Read == rows && n.Updated <= changedRows && n.Updated > 0 && n.Unchanged == rows-n.Updated
			})
			if err != nil {
				return nil, err
			}
			if versioned {
				m.VerRestate, m.VerRestWAL = restate, restateWAL
			} else if on {
				m.OnRestate, m.OnRestateWAL = restate, restateWAL
			} else {
				m.OffRestate, m.OffRestateWAL = restate, restateWAL
			}
			c.correct = 1
			correct, correctWAL, err := step("correction (5% of chunks changed in 1% of their rows)", c, func(n backfill.Counts) bool {
				return n.Read == rows && n.Updated <= (changedRows+correctEvery-1)/correctEvery && n.Updated > 0 && n.Unchanged == rows-n.Updated
			})
			if err != nil {
				return nil, err
			}
			switch {
			case versioned:
				m.VerCorrect, m.VerCorrectWAL = correct, correctWAL
			case on:
				m.OnCorrect, m.OnCorrectWAL = correct, correctWAL
			default:
				m.OffCorrect, m.OffCorrectWAL = correct, correctWAL
			}
			if pc := b.skipProfiled(c, i, "restate", true); pc.explain != "" && on && !versioned {
				// One more restatement of the same chunks (another
				// quantity), not measured, for its plans.
				pc.restate, pc.correct = 2, 0
				if _, _, err := step("restatement with auto_explain (not measured)", pc, func(n backfill.Counts) bool { return n.Read == rows && n.Updated > 0 }); err != nil {
					return nil, err
				}
			}
			if _, err := b.db.ExecContext(ctx, `DROP TABLE `+table); err != nil {
				return nil, err
			}
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// skipProfiled returns c with the -skip-profile outputs of load what
// ("replay", "restate") of run i set: a CPU profile, or with explain
// auto_explain plans. Only run 1 is profiled.
func (b *bench) skipProfiled(c childOpts, i int, what string, explain bool) childOpts {
	if b.o.skipProfile == "" || i != 1 {
		return c
	}
	dir, err := filepath.Abs(filepath.Join(b.o.skipProfile, b.server))
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		progress("-skip-profile: %v", err)
		return c
	}
	if explain {
		c.explain = filepath.Join(dir, "skip-"+what+".plans.txt")
		return c
	}
	// No breakdown: its timed merger is not a PGMerger, which
	// SkipUnchanged needs.
	c.cpuProfile = filepath.Join(dir, "skip-"+what+".cpu.pprof")
	return c
}

// printSkip prints the -skip loads' figures and whether they meet their
// goals (an unchanged replay at least 3× the first load's rows/s with at
// most 0.1% of its WAL, a 5% restatement at least 5× a full reload's).
func (b *bench) printSkip(ms []skipMeasurement) {
	w := b.out
	rate := func(f func(skipMeasurement) childResult) summary {
		var xs []float64
		for _, m := range ms {
			r := f(m)
			xs = append(xs, float64(r.Rows)/r.ProcSeconds)
		}
		return summarize(xs)
	}
	wal := func(f func(skipMeasurement) int64) summary {
		var xs []float64
		for _, m := range ms {
			xs = append(xs, float64(f(m)))
		}
		return summarize(xs)
	}
	n := len(ms)
	fmt.Fprintf(w, "## Replays that skip unchanged chunks (Job.SkipUnchanged; chunks of %s rows by order_no, ChunkColumn order_no, index on it; rows/s of whole processes, exec to exit)\n\n", thousands(b.o.chunk))
	fmt.Fprintf(w, "| load | rows/s (median [min, max]) | WAL (median) |\n|---|---:|---:|\n")
	rows := []struct {
		name string
		r    summary
		wal  summary
	}{
		{"first load, SkipUnchanged on (records the fingerprints)", rate(func(m skipMeasurement) childResult { return m.OnLoad }), wal(func(m skipMeasurement) int64 { return m.OnLoadWAL })},
		{"first load, SkipUnchanged off", rate(func(m skipMeasurement) childResult { return m.OffLoad }), wal(func(m skipMeasurement) int64 { return m.OffLoadWAL })},
		{"unchanged replay, SkipUnchanged on", rate(func(m skipMeasurement) childResult { return m.OnReplay }), wal(func(m skipMeasurement) int64 { return m.OnReplayWAL })},
		{"restatement, 5% of chunks changed, SkipUnchanged on", rate(func(m skipMeasurement) childResult { return m.OnRestate }), wal(func(m skipMeasurement) int64 { return m.OnRestateWAL })},
		{"restatement, 5% of chunks changed, SkipUnchanged off (full reload)", rate(func(m skipMeasurement) childResult { return m.OffRestate }), wal(func(m skipMeasurement) int64 { return m.OffRestateWAL })},
		{"first load, SkipUnchanged on, ChunkVersioner", rate(func(m skipMeasurement) childResult { return m.VerLoad }), wal(func(m skipMeasurement) int64 { return m.VerLoadWAL })},
		{"unchanged replay, SkipUnchanged on, ChunkVersioner", rate(func(m skipMeasurement) childResult { return m.VerReplay }), wal(func(m skipMeasurement) int64 { return m.VerReplayWAL })},
		{"restatement, 5% of chunks changed, SkipUnchanged on, ChunkVersioner", rate(func(m skipMeasurement) childResult { return m.VerRestate }), wal(func(m skipMeasurement) int64 { return m.VerRestWAL })},
		{"correction, 5% of chunks changed in 1% of their rows, SkipUnchanged on", rate(func(m skipMeasurement) childResult { return m.OnCorrect }), wal(func(m skipMeasurement) int64 { return m.OnCorrectWAL })},
		{"correction, 5% of chunks changed in 1% of their rows, SkipUnchanged off (full reload)", rate(func(m skipMeasurement) childResult { return m.OffCorrect }), wal(func(m skipMeasurement) int64 { return m.OffCorrectWAL })},
		{"correction, 5% of chunks changed in 1% of their rows, SkipUnchanged on, ChunkVersioner", rate(func(m skipMeasurement) childResult { return m.VerCorrect }), wal(func(m skipMeasurement) int64 { return m.VerCorrectWAL })},
	}
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s |\n", r.name, r.r.render(fmtRate, n), fmtMiB(r.wal.Median))
	}
	replay := rows[2].r.Median / rows[0].r.Median
	replayWAL := rows[2].wal.Median / rows[0].wal.Median
	restate := rows[3].r.Median / rows[4].r.Median
	// Per run, the two loads compared ran minutes apart at most: their
	// ratio is steadier than the ratio of medians on a busy machine.
	var replayRuns, restateRuns []float64
	for _, m := range ms {
		replayRuns = append(replayRuns, m.OnLoad.ProcSeconds/m.OnReplay.ProcSeconds)
		restateRuns = append(restateRuns, m.OffRestate.ProcSeconds/m.OnRestate.ProcSeconds)
	}
	rr, rs := summarize(replayRuns), summarize(restateRuns)
	var verReplayRuns, verRestateRuns []float64
	for _, m := range ms {
		verReplayRuns = append(verReplayRuns, m.VerLoad.ProcSeconds/m.VerReplay.ProcSeconds)
		verRestateRuns = append(verRestateRuns, m.OffRestate.ProcSeconds/m.VerRestate.ProcSeconds)
	}
	vr, vs := summarize(verReplayRuns), summarize(verRestateRuns)
	fmt.Fprintf(w, "\nUnchanged replay: %.2f× the first load's rows/s (per run %.2f – %.2f, median %.2f; goal ≥ 3×: %s); its WAL %s of the first load's (goal ≤ 0.1%%: %s; that WAL is the manifest's: no target row is written).\n",
		replay, rr.Min, rr.Max, rr.Median, yesNo(replay >= 3), fmtPct(replayWAL), yesNo(replayWAL <= 0.001))
	fmt.Fprintf(w, "Restatement with 5%% of the chunks changed: %.2f× the full reload's rows/s (per run %.2f – %.2f, median %.2f; goal ≥ 5×: %s).\n\n",
		restate, rs.Min, rs.Max, rs.Median, yesNo(restate >= 5))
	verReplay, verRestate := rows[6].r.Median/rows[5].r.Median, rows[7].r.Median/rows[4].r.Median
	fmt.Fprintf(w, "| with a ChunkVersioner (its ChunkVersion costs nothing here; a real one is a source query per chunk) | without | with |\n|---|---:|---:|\n")
	fmt.Fprintf(w, "| unchanged replay / its first load (rows/s; per run median) | %.2f× (%.2f) | %.2f× (%.2f) |\n", replay, rr.Median, verReplay, vr.Median)
	fmt.Fprintf(w, "| restatement 5%% / full reload (rows/s; per run median) | %.2f× (%.2f) | %.2f× (%.2f) |\n", restate, rs.Median, verRestate, vs.Median)
	fmt.Fprintf(w, "| unchanged replay's WAL / its first load's | %s | %s |\n\n", fmtPct(replayWAL), fmtPct(rows[6].wal.Median/rows[5].wal.Median))

	// The same goal for a correction (few rows of the changed chunks),
	// and both against a load of every row into an empty table (the
	// first load without SkipUnchanged), the other meaning of "a full
	// reload".
	perRun := func(num, den func(skipMeasurement) childResult) summary {
		var xs []float64
		for _, m := range ms {
			xs = append(xs, den(m).ProcSeconds/num(m).ProcSeconds)
		}
		return summarize(xs)
	}
	onC := perRun(func(m skipMeasurement) childResult { return m.OnCorrect }, func(m skipMeasurement) childResult { return m.OffCorrect })
	verC := perRun(func(m skipMeasurement) childResult { return m.VerCorrect }, func(m skipMeasurement) childResult { return m.OffCorrect })
	onL := perRun(func(m skipMeasurement) childResult { return m.OnRestate }, func(m skipMeasurement) childResult { return m.OffLoad })
	verL := perRun(func(m skipMeasurement) childResult { return m.VerRestate }, func(m skipMeasurement) childResult { return m.OffLoad })
	onCL := perRun(func(m skipMeasurement) childResult { return m.OnCorrect }, func(m skipMeasurement) childResult { return m.OffLoad })
	verCL := perRun(func(m skipMeasurement) childResult { return m.VerCorrect }, func(m skipMeasurement) childResult { return m.OffLoad })
	fmt.Fprintf(w, "| 5%% of the chunks changed: SkipUnchanged on / the full reload (goal ≥ 5×; rows/s, medians; per run median) | without a ChunkVersioner | with |\n|---|---:|---:|\n")
	fmt.Fprintf(w, "| restatement (every row of the changed chunks) / its replay without SkipUnchanged | %.2f× (%.2f) | %.2f× (%.2f) |\n", restate, rs.Median, verRestate, vs.Median)
	fmt.Fprintf(w, "| correction (1%% of the changed chunks' rows) / its replay without SkipUnchanged | %.2f× (%.2f) | %.2f× (%.2f) |\n",
		rows[8].r.Median/rows[9].r.Median, onC.Median, rows[10].r.Median/rows[9].r.Median, verC.Median)
	fmt.Fprintf(w, "| restatement / a load of every row into an empty table | %.2f× (%.2f) | %.2f× (%.2f) |\n",
		rows[3].r.Median/rows[1].r.Median, onL.Median, rows[7].r.Median/rows[1].r.Median, verL.Median)
	fmt.Fprintf(w, "| correction / a load of every row into an empty table | %.2f× (%.2f) | %.2f× (%.2f) |\n\n",
		rows[8].r.Median/rows[1].r.Median, onCL.Median, rows[10].r.Median/rows[1].r.Median, verCL.Median)

	// The same ratios in CPU (the child's user and system time and its
	// backends'), per run: what the loads cost, less sensitive than
	// wall time to other processes on the machine (not a goal, which
	// is whole-process time).
	cpu := func(r childResult) float64 { return r.UserCPU + r.SysCPU + max(r.ServerCPU, 0) }
	cpuRun := func(num, den func(skipMeasurement) childResult) summary {
		var xs []float64
		for _, m := range ms {
			xs = append(xs, cpu(den(m))/cpu(num(m)))
		}
		return summarize(xs)
	}
	cpuMedian := func(f func(skipMeasurement) childResult) float64 {
		var xs []float64
		for _, m := range ms {
			xs = append(xs, cpu(f(m)))
		}
		return summarize(xs).Median
	}
	rsC := cpuRun(func(m skipMeasurement) childResult { return m.OnRestate }, func(m skipMeasurement) childResult { return m.OffRestate })
	coC := cpuRun(func(m skipMeasurement) childResult { return m.OnCorrect }, func(m skipMeasurement) childResult { return m.OffCorrect })
	fmt.Fprintf(w, "CPU (client and its backends, median of the runs): restatement %.2f s with SkipUnchanged, %.2f s the full reload: %.2f× per run (%.2f – %.2f); correction %.2f s, %.2f s: %.2f× (%.2f – %.2f).\n\n",
		cpuMedian(func(m skipMeasurement) childResult { return m.OnRestate }), cpuMedian(func(m skipMeasurement) childResult { return m.OffRestate }), rsC.Median, rsC.Min, rsC.Max,
		cpuMedian(func(m skipMeasurement) childResult { return m.OnCorrect }), cpuMedian(func(m skipMeasurement) childResult { return m.OffCorrect }), coC.Median, coC.Min, coC.Max)
}

func tableName(v string, run int) string { return fmt.Sprintf("%s.%s_%d", benchSchema, v, run) }
