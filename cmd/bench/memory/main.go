// Command memory measures the peak resident set size (VmHWM) of whole
// processes that each load rows of one width with one
// Config.MemoryBudget, against that budget: the library's buffers
// (spools, tracked identities, held rejects) count their bytes against
// the budget's shares, so that narrow and wide rows alike stay within it.
//
//	go run ./cmd/bench/memory                        # 100 B and 10 KiB rows, budgets 32 and 64 MiB, fast server
//	go run ./cmd/bench/memory -durable -rows 200000
//	DATABASE_URL=postgres://... go run ./cmd/bench/memory
//
// Each variant is its own process (this program run again as a child),
// timed and measured from exec to exit, Concurrency 2, chunks of -chunk
// rows, extract-ahead on (the defaults). With -gomemlimit the child also
// runs with GOMEMLIMIT set to the budget (what Config.MemoryBudget's
// documentation recommends for a process doing only the backfill).
// It makes no assertions; it reports whether each peak is within its
// budget.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/cmd/bench/internal/benchpg"
)

type result struct {
	Width     int     `json:"width"`
	BudgetMiB int     `json:"budget_mib"`
	Rows      int64   `json:"rows"`
	VmHWMKiB  int64   `json:"vmhwm_kib"`
	Seconds   float64 `json:"seconds"`
}

func main() {
	if os.Getenv("BENCHMEM_CHILD") != "" {
		if err := child(); err != nil {
			log.Fatal(err)
		}
		return
	}
	rows := flag.Int("rows", 100000, "rows per load of 100-byte rows (rows over 1,000 bytes: a tenth as many, in chunks of a tenth as many)")
	chunk := flag.Int("chunk", 10000, "rows per chunk")
	durable := flag.Bool("durable", false, "a throwaway server with fsync and synchronous_commit on")
	budgets := flag.String("budgets", "32,64", "budgets in MiB, comma-separated")
	widths := flag.String("widths", "100,10240", "row widths in bytes, comma-separated")
	runs := flag.Int("runs", 3, "rounds")
	memlimit := flag.Bool("gomemlimit", false, "run each child with GOMEMLIMIT set to its budget")
	flag.Parse()
	ctx := context.Background()
	db, url, _, stop, err := benchpg.Open(ctx, !*durable, 4)
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	_ = db
	fmt.Printf("| row width | budget | rows | peak RSS (VmHWM, median of %d) | per-round | within budget | seconds (median) |\n|---:|---:|---:|---:|---|---|---:|\n", *runs)
	for _, ws := range strings.Split(*widths, ",") {
		w, _ := strconv.Atoi(ws)
		// Wide rows: a tenth of the rows in chunks of a tenth as many
		// rows, the same number of chunks, each about 10 MiB.
		n, c := *rows, *chunk
		if w > 1000 {
			n, c = max(*rows/10, 1), max(*chunk/10, 1)
		}
		for _, bs := range strings.Split(*budgets, ",") {
			b, _ := strconv.Atoi(bs)
			var hwm, secs []float64
			var rs []string
			for i := range *runs {
				r, err := runChild(ctx, url, fmt.Sprintf("w%d_b%d_r%d", w, b, i), w, b, n, c, *memlimit)
				if err != nil {
					log.Fatal(err)
				}
				hwm = append(hwm, float64(r.VmHWMKiB)/1024)
				secs = append(secs, r.Seconds)
				rs = append(rs, fmt.Sprintf("%.1f", float64(r.VmHWMKiB)/1024))
			}
			m := median(hwm)
			fmt.Printf("| %d B | %d MiB | %d | %.1f MiB | %s | %t | %.2f |\n", w, b, n, m, strings.Join(rs, ", "), maxOf(hwm) <= float64(b), median(secs))
		}
	}
}

func runChild(ctx context.Context, url, table string, width, budgetMiB, rows, chunk int, memlimit bool) (result, error) {
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), "BENCHMEM_CHILD=1", "BENCHMEM_URL="+url, "BENCHMEM_TABLE="+table,
		fmt.Sprintf("BENCHMEM_WIDTH=%d", width), fmt.Sprintf("BENCHMEM_BUDGET=%d", budgetMiB),
		fmt.Sprintf("BENCHMEM_ROWS=%d", rows), fmt.Sprintf("BENCHMEM_CHUNK=%d", chunk))
	if memlimit {
		cmd.Env = append(cmd.Env, fmt.Sprintf("GOMEMLIMIT=%dMiB", budgetMiB))
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return result{}, fmt.Errorf("child %s: %w", table, err)
	}
	var r result
	return r, json.Unmarshal(out, &r)
}

func child() error {
	ctx := context.Background()
	start := time.Now()
	env := func(k string) int { v, _ := strconv.Atoi(os.Getenv(k)); return v }
	width, budget, rows, chunk := env("BENCHMEM_WIDTH"), env("BENCHMEM_BUDGET"), env("BENCHMEM_ROWS"), env("BENCHMEM_CHUNK")
	table := os.Getenv("BENCHMEM_TABLE")
	db, err := sqlx.Open("postgres", os.Getenv("BENCHMEM_URL"))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+table+`; CREATE TABLE `+table+
		` (id bigint PRIMARY KEY, tag text, pad text, n bigint, backfill_inserted_by bigint, backfill_updated_by bigint)`); err != nil {
		return err
	}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 2, MemoryBudget: int64(budget) << 20})
	if err != nil {
		return err
	}
	pad := strings.Repeat("x", max(width-30, 1))
	job := backfill.Job{Name: "benchmem-" + table, Chunker: backfill.IntRange(0, int64(rows), int64(chunk)),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				// A fresh string per row, as an extractor reading a source would have.
				p := pad[:len(pad)-int(id%8)] + strconv.FormatInt(id%10_000_000, 10)
				if err := w.Write(ctx, id, "t"+strconv.FormatInt(id%97, 10), p, id*3); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: table, Key: []string{"id"}, Columns: []string{"id", "tag", "pad", "n"}}}
	if os.Getenv("BENCHMEM_TRACE") != "" {
		stopTrace := traceHeap()
		defer stopTrace()
	}
	rep, err := r.Run(ctx, job)
	if err != nil {
		return err
	}
	res := result{Width: width, BudgetMiB: budget, Rows: rep.Counts.Read, VmHWMKiB: statusKiB("VmHWM"), Seconds: time.Since(start).Seconds()}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// traceHeap prints the heap's peak live bytes to stderr when stopped
// (BENCHMEM_TRACE=1, for finding what the budget does not count).
func traceHeap() (stop func()) {
	done := make(chan struct{})
	var peakAlloc, peakSys uint64
	go func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-done:
				return
			case <-t.C:
				runtime.ReadMemStats(&ms)
				if ms.HeapAlloc > peakAlloc && os.Getenv("BENCHMEM_PROFILE") != "" {
					runtime.GC()
					if f, err := os.Create(os.Getenv("BENCHMEM_PROFILE")); err == nil {
						_ = pprof.WriteHeapProfile(f)
						_ = f.Close()
					}
				}
				peakAlloc, peakSys = max(peakAlloc, ms.HeapAlloc), max(peakSys, ms.Sys)
			}
		}
	}()
	return func() {
		close(done)
		fmt.Fprintf(os.Stderr, "peak HeapAlloc %.1f MiB, peak Sys %.1f MiB\n", float64(peakAlloc)/(1<<20), float64(peakSys)/(1<<20))
	}
}

func statusKiB(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if ok && name == field {
			v, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return v
		}
	}
	return -1
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}

func maxOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs[1:] {
		m = max(m, x)
	}
	return m
}
