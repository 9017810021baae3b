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

func fmtRate(x float64) string { return thousands(int64(x + 0.5)) }
func fmtMiB(x float64) string  { return fmt.Sprintf("%.1f MiB", x/(1<<20)) }
func fmtPct(x float64) string  { return fmt.Sprintf("%.3f%%", 100*x) }

func (s summary) render(format func(float64) string, n int) string {
	if n == 1 {
		return format(s.Median)
	}
	return fmt.Sprintf("%s (%s – %s)", format(s.Median), format(s.Min), format(s.Max))
}

func yesNo(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func (b *bench) printRSS(rs []childResult, suite []result) {
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
		if xs := values(suite, v, func(r result) float64 { return float64(r.R.VmHWMKiB) }); len(xs) > 0 {
			fmt.Fprintf(w, "| %s (suite's first loads, median) | %s | %.1f MiB | | | | |\n", variantName(v), thousands(b.o.rows), summarize(xs).Median/1024)
		}
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
func (b *bench) printMachine(rs []result, rss []childResult) {
	w := b.out
	procs := b.facts.GOMAXPROCS
	fmt.Fprintf(w, "## Machine-readable (%s server)\n\nbenchstat-compatible lines (one per load; ns/op is the whole process, load-ns the load timed inside it), then one JSON line.\n\n```text\n", b.server)
	fmt.Fprintf(w, "goos: linux\ngoarch: %s\npkg: github.com/pgbackfill/backfill/cmd/bench/load\ncpu: %s\n", runtime.GOARCH, b.facts.CPU)
	line := func(name string, r childResult, wal int64) {
		proc := r.ProcSeconds
		fmt.Fprintf(w, "%s-%d\t1\t%d ns/op\t%d load-ns\t%.0f rows/s\t%.0f client-cpu-ms\t%.0f server-cpu-ms\t%d peak-RSS-B\t%.0f other-cpu-ms",
			name, procs, int64(proc*1e9), int64(r.Seconds*1e9), float64(r.Rows)/proc, 1000*(r.UserCPU+r.SysCPU), 1000*r.ServerCPU, r.VmHWMKiB*1024, 1000*r.OtherCPU)
		if wal >= 0 {
			fmt.Fprintf(w, "\t%d WAL-B", wal)
		}
		fmt.Fprintln(w)
	}
	for _, r := range rs {
		line(fmt.Sprintf("BenchmarkProcess/server=%s/variant=%s/rows=%d/chunk=%d", b.server, r.Variant, b.o.rows, b.o.chunk), r.R, r.WAL)
	}
	for _, r := range rss {
		line(fmt.Sprintf("BenchmarkPeakRSS/server=%s/variant=%s/rows=%d/chunk=%d", b.server, variantName(r.Variant), r.Rows, b.o.chunk), r, -1)
	}
	j, _ := json.Marshal(map[string]any{"server": b.server, "args": b.o.args, "facts": b.facts, "rows": b.o.rows, "chunk": b.o.chunk,
		"small_chunk": b.o.smallChunk, "rounds": b.o.runs, "library_defaults": libDefaults(), "loads": rs, "rss": rss})
	fmt.Fprintf(w, "BENCHLOAD_JSON %s\n```\n", j)
}
