package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// summary is median, min and max of a series.
type summary struct{ Median, Min, Max float64 }

func summarize(xs []float64) summary {
	if len(xs) == 0 {
		return summary{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return summary{Median: med, Min: s[0], Max: s[len(s)-1]}
}

func series(ms []measurement, v string, f func(measurement) float64) []float64 {
	var xs []float64
	for _, m := range ms {
		if m.Variant == v {
			xs = append(xs, f(m))
		}
	}
	return xs
}

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func mib(bytes int64) string { return fmt.Sprintf("%.1f MiB", float64(bytes)/(1<<20)) }

type metric struct {
	name   string
	f      func(measurement) float64
	format func(float64) string
	ratio  bool // show library/baseline
}

func fmtRate(x float64) string  { return thousands(int64(x + 0.5)) }
func fmtSec(x float64) string   { return fmt.Sprintf("%.2f s", x) }
func fmtMiB(x float64) string   { return fmt.Sprintf("%.1f MiB", x/(1<<20)) }
func fmtPct(x float64) string   { return fmt.Sprintf("%.3f%%", 100*x) }
func fmtBytes(x float64) string { return fmt.Sprintf("%.0f B", x) }
func fmtCores(x float64) string { return fmt.Sprintf("%.2f", x) }

func (s summary) render(format func(float64) string, n int) string {
	if n == 1 {
		return format(s.Median)
	}
	return fmt.Sprintf("%s (%s – %s)", format(s.Median), format(s.Min), format(s.Max))
}

func (b *bench) printEndToEnd(ms []measurement) {
	w := b.out
	rows := float64(b.o.rows)
	metrics := []metric{
		{"first load: rows/s", func(m measurement) float64 { return rows / m.Load.Seconds }, fmtRate, true},
		{"first load: wall time", func(m measurement) float64 { return m.Load.Seconds }, fmtSec, true},
		{"first load: client CPU (user+sys)", func(m measurement) float64 { return m.Load.UserCPU + m.Load.SysCPU }, fmtSec, true},
		{"first load: server backend CPU", func(m measurement) float64 { return m.Load.ServerCPU }, fmtSec, true},
		{"first load: client + server CPU (robust to contention)", func(m measurement) float64 {
			return m.Load.UserCPU + m.Load.SysCPU + max(m.Load.ServerCPU, 0)
		}, fmtSec, true},
		{"first load: other processes' CPU on the machine, average cores busy", func(m measurement) float64 { return m.Load.OtherCPU / m.Load.Seconds }, fmtCores, false},
		{"first load: Go bytes allocated per row", func(m measurement) float64 { return float64(m.Load.TotalAlloc) / rows }, fmtBytes, true},
		{"first load: peak RSS (VmHWM)", func(m measurement) float64 { return float64(m.Load.VmHWMKiB) * 1024 }, fmtMiB, true},
		{"first load: WAL", func(m measurement) float64 { return float64(m.LoadWAL) }, fmtMiB, true},
		{"replay: rows/s", func(m measurement) float64 { return rows / m.Replay.Seconds }, fmtRate, true},
		{"replay: client + server CPU", func(m measurement) float64 {
			return m.Replay.UserCPU + m.Replay.SysCPU + max(m.Replay.ServerCPU, 0)
		}, fmtSec, true},
		{"replay: WAL", func(m measurement) float64 { return float64(m.ReplayWAL) }, fmtMiB, true},
		{"replay WAL / first-load WAL", func(m measurement) float64 { return float64(m.ReplayWAL) / float64(m.LoadWAL) }, fmtPct, false},
		{"replay: peak RSS (VmHWM)", func(m measurement) float64 { return float64(m.Replay.VmHWMKiB) * 1024 }, fmtMiB, false},
	}
	fmt.Fprintf(w, "## End to end: %s rows, %s-row chunks, median (min – max) of %d runs\n\n", thousands(b.o.rows), thousands(b.o.chunk), b.o.runs)
	fmt.Fprintf(w, "The third variant, one COPY + merge, is the baseline's statements with one chunk of all rows in one transaction: the practical limit of a chunked load.\n\n")
	fmt.Fprintf(w, "| metric | library | baseline | one COPY + merge | library / baseline | library / one COPY + merge |\n|---|---:|---:|---:|---:|---:|\n")
	ratioOf := func(mt metric, other string) string {
		lib, base := series(ms, "lib", mt.f), series(ms, other, mt.f)
		ls, bs := summarize(lib), summarize(base)
		if !mt.ratio || bs.Median == 0 {
			return ""
		}
		var pairs []float64
		for i := range min(len(lib), len(base)) {
			pairs = append(pairs, lib[i]/base[i])
		}
		ps := summarize(pairs)
		ratio := fmt.Sprintf("%.2f", ls.Median/bs.Median)
		if len(pairs) > 1 {
			ratio += fmt.Sprintf(" (per run %.2f – %.2f)", ps.Min, ps.Max)
		}
		return ratio
	}
	for _, mt := range metrics {
		lib, base, once := series(ms, "lib", mt.f), series(ms, "base", mt.f), series(ms, "once", mt.f)
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", mt.name, summarize(lib).render(mt.format, len(lib)), summarize(base).render(mt.format, len(base)),
			summarize(once).render(mt.format, len(once)), ratioOf(mt, "base"), ratioOf(mt, "once"))
	}

	libRate := summarize(series(ms, "lib", metrics[0].f)).Median
	baseRate := summarize(series(ms, "base", metrics[0].f)).Median
	onceRate := summarize(series(ms, "once", metrics[0].f)).Median
	walRatio := summarize(series(ms, "lib", byName(metrics, "replay WAL / first-load WAL").f)).Max
	libRSS := summarize(series(ms, "lib", byName(metrics, "first load: peak RSS (VmHWM)").f)).Max
	fmt.Fprintf(w, "\nGoals (reported, not asserted):\n\n")
	fmt.Fprintf(w, "- first load at least 1.25x the hand-written baseline's rows/s: ratio %.2f, %s\n", libRate/baseRate, yesNo(libRate/baseRate >= 1.25))
	fmt.Fprintf(w, "- first load at least 0.85x one COPY + merge of all rows: ratio %.2f, %s\n", libRate/onceRate, yesNo(libRate/onceRate >= 0.85))
	fmt.Fprintf(w, "- library replay WAL at most 0.1%% of its first load: worst run %s, %s\n", fmtPct(walRatio), yesNo(walRatio <= 0.001))
	fmt.Fprintf(w, "- library peak RSS ≤ 64 MiB: worst run %s, %s\n\n", fmtMiB(libRSS), yesNo(libRSS <= 64<<20))

	fmt.Fprintf(w, "### Every run\n\n| run | variant | load s | load rows/s | load WAL | replay s | replay rows/s | replay WAL | peak RSS load / replay | autovacuum/autoanalyze runs in the database during load / replay | other processes' CPU, avg cores busy, load / replay |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, m := range ms {
		fmt.Fprintf(w, "| %d | %s | %.2f | %s | %s (%s B) | %.2f | %s | %s (%s B) | %.1f / %.1f MiB | %d / %d | %.2f / %.2f |\n",
			m.Run, variantName(m.Variant), m.Load.Seconds, fmtRate(rows/m.Load.Seconds), mib(m.LoadWAL), thousands(m.LoadWAL),
			m.Replay.Seconds, fmtRate(rows/m.Replay.Seconds), mib(m.ReplayWAL), thousands(m.ReplayWAL),
			float64(m.Load.VmHWMKiB)/1024, float64(m.Replay.VmHWMKiB)/1024, m.LoadAutovac, m.ReplayAutovac,
			m.Load.OtherCPU/m.Load.Seconds, m.Replay.OtherCPU/m.Replay.Seconds)
	}
	fmt.Fprintln(w)
}

func byName(ms []metric, name string) metric {
	for _, m := range ms {
		if m.name == name {
			return m
		}
	}
	panic("benchload: no metric " + name)
}

func yesNo(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func (b *bench) printRSS(rs []childResult, ms []measurement) {
	w := b.out
	fmt.Fprintf(w, "## Peak RSS by load size (each load in a fresh child process and a fresh table)\n\n")
	fmt.Fprintf(w, "| variant | rows | peak RSS (VmHWM) | rows/s | Go bytes allocated per row | GCs | other processes' CPU (avg cores) |\n|---|---:|---:|---:|---:|---:|---:|\n")
	var libRSS []float64
	for _, v := range chunkedVariants {
		for _, r := range rs {
			if r.Variant != v {
				continue
			}
			if v == "lib" {
				libRSS = append(libRSS, float64(r.VmHWMKiB))
			}
			fmt.Fprintf(w, "| %s | %s | %.1f MiB | %s | %.0f | %d | %.2f |\n", variantName(v), thousands(r.Rows), float64(r.VmHWMKiB)/1024,
				fmtRate(float64(r.Rows)/r.Seconds), float64(r.TotalAlloc)/float64(r.Rows), r.NumGC, r.OtherCPU/r.Seconds)
		}
		rss := summarize(series(ms, v, func(m measurement) float64 { return float64(m.Load.VmHWMKiB) }))
		fmt.Fprintf(w, "| %s (end-to-end runs, median) | %s | %.1f MiB | | | | |\n", variantName(v), thousands(b.o.rows), rss.Median/1024)
	}
	if len(libRSS) >= 2 {
		s := summarize(libRSS)
		growth := s.Max/s.Min - 1
		fmt.Fprintf(w, "\nLibrary peak RSS from %s to %s rows: %.1f → %.1f MiB (%+.1f%%); goal ≤ 64 MiB and within 10%%: %s\n\n",
			thousands(slices.Min(b.o.rssRows)), thousands(slices.Max(b.o.rssRows)), libRSS[0]/1024, libRSS[len(libRSS)-1]/1024,
			100*(libRSS[len(libRSS)-1]/libRSS[0]-1), yesNo(s.Max <= 64*1024 && growth <= 0.10))
	}
}

// printMachine prints benchstat-compatible lines (one per load) and one
// JSON line with everything.
func (b *bench) printMachine(ms []measurement, rs []childResult) {
	w := b.out
	procs := b.facts.GOMAXPROCS
	fmt.Fprintf(w, "## Machine-readable\n\nbenchstat-compatible lines (one per load; benchstat computes its own medians), then one JSON line.\n\n```text\n")
	fmt.Fprintf(w, "goos: linux\ngoarch: %s\npkg: github.com/pgbackfill/backfill/cmd/bench/load\ncpu: %s\n", runtime.GOARCH, b.facts.CPU)
	line := func(name string, r childResult, wal int64) {
		fmt.Fprintf(w, "%s-%d\t1\t%d ns/op\t%.0f rows/s\t%.0f client-cpu-ms\t%.0f server-cpu-ms\t%d peak-RSS-B\t%.0f other-cpu-ms",
			name, procs, int64(r.Seconds*1e9), float64(r.Rows)/r.Seconds, 1000*(r.UserCPU+r.SysCPU), 1000*r.ServerCPU, r.VmHWMKiB*1024, 1000*r.OtherCPU)
		if wal >= 0 {
			fmt.Fprintf(w, "\t%d WAL-B", wal)
		}
		fmt.Fprintln(w)
	}
	for _, m := range ms {
		line(fmt.Sprintf("BenchmarkLoad/variant=%s/rows=%d/chunk=%d", variantName(m.Variant), b.o.rows, b.o.chunk), m.Load, m.LoadWAL)
		line(fmt.Sprintf("BenchmarkReplay/variant=%s/rows=%d/chunk=%d", variantName(m.Variant), b.o.rows, b.o.chunk), m.Replay, m.ReplayWAL)
	}
	for _, r := range rs {
		line(fmt.Sprintf("BenchmarkPeakRSS/variant=%s/rows=%d/chunk=%d", variantName(r.Variant), r.Rows, b.o.chunk), r, -1)
	}
	j, _ := json.Marshal(map[string]any{"facts": b.facts, "rows": b.o.rows, "chunk": b.o.chunk, "runs": b.o.runs, "measurements": ms, "rss": rs})
	fmt.Fprintf(w, "BENCHLOAD_JSON %s\n```\n", j)
}
