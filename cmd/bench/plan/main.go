// Command benchplan measures a very long plan: a job of -chunks IntRange
// chunks (one key each, the extractor writes one row per chunk) is
// planned and run until -claims chunks are done, then cancelled; a new
// Runner (as a new process would) resumes it for -claims more chunks, and
// is cancelled again. For each phase it prints the wall time to the first
// extraction (planning, or the resume's start), the wall time of the
// phase, the time per claimed chunk, and the peak Go heap
// (runtime/metrics, sampled every 2 ms) and peak RSS (VmHWM, reset at the
// phase's start) of the process. It asserts nothing.
//
//	go run ./cmd/bench/plan [-chunks 1000000 -claims 200 -fast]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/cmd/bench/internal/benchpg"
)

func main() {
	chunks := flag.Int64("chunks", 1_000_000, "chunks in the plan")
	claims := flag.Int("claims", 200, "chunks done per phase before it is cancelled")
	fast := flag.Bool("fast", false, "fsync off on the throwaway server")
	conc := flag.Int("concurrency", 1, "Config.Concurrency")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	serverProf := flag.Bool("server-profile", false, "sample pg_stat_activity and print the statements the server was busy with")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}

	ctx := context.Background()
	db, _, settings, stop, err := benchpg.Open(ctx, *fast, *conc+4, "fsync", "synchronous_commit", "shared_buffers")
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	db.MustExec(`DROP TABLE IF EXISTS bench_plan_target`)
	db.MustExec(`CREATE TABLE bench_plan_target (id bigint PRIMARY KEY, v text NOT NULL)`)
	pm := backfill.NewPGManifest("")
	if err := pm.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("## benchplan: %d chunks, %d claims per phase, Concurrency %d, %s\n\n", *chunks, *claims, *conc, settingsText(settings))
	fmt.Println("| phase | to first extraction | phase wall | per claimed chunk | peak Go heap | peak RSS |")
	fmt.Println("|---|---|---|---|---|---|")

	for _, phase := range []string{"plan + first claims", "resume in a new Runner"} {
		var done atomic.Int64
		var first atomic.Int64 // unix nanos of the first extraction
		pctx, cancel := context.WithCancel(ctx)
		job := backfill.Job{
			Name:     "bench_plan",
			Chunker:  backfill.IntRange(0, *chunks, 1),
			Rollback: backfill.RollbackNone,
			Target:   backfill.Target{Table: "bench_plan_target", Key: []string{"id"}},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				first.CompareAndSwap(0, time.Now().UnixNano())
				if err := w.Write(ctx, c.Lo, "v"); err != nil {
					return err
				}
				if done.Add(1) >= int64(*claims) {
					cancel()
				}
				return nil
			}),
		}
		r, err := backfill.New(db, &backfill.Config{
			WorkerID: "benchplan", Concurrency: *conc,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		})
		if err != nil {
			log.Fatal(err)
		}
		var prof *serverProfile
		if *serverProf {
			prof = startServerProfile(ctx, db)
		}
		runtime.GC()
		resetHWM()
		s := startSampler()
		begin := time.Now()
		_, err = r.Run(pctx, job)
		end := time.Now()
		heap := s.stop()
		if prof != nil {
			defer prof.stop(phase)
		}
		cancel()
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Printf("%s: %v", phase, err)
			return
		}
		f := time.Unix(0, first.Load())
		fmt.Printf("| %s | %v | %v | %v | %.1f MiB | %.1f MiB |\n", phase, f.Sub(begin).Round(time.Millisecond), end.Sub(begin).Round(time.Millisecond),
			(end.Sub(f) / time.Duration(max(done.Load(), 1))).Round(10*time.Microsecond), float64(heap)/(1<<20), float64(hwm())/(1<<20))
	}
}

func settingsText(s []benchpg.Setting) string {
	var parts []string
	for _, x := range s {
		parts = append(parts, x.Name+"="+x.Value)
	}
	return strings.Join(parts, " ")
}

// sampler records the peak of the Go heap's live and unswept objects.
type sampler struct {
	done chan struct{}
	wg   sync.WaitGroup
	peak uint64
}

func startSampler() *sampler {
	s := &sampler{done: make(chan struct{})}
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(sample)
			s.peak = max(s.peak, sample[0].Value.Uint64())
			select {
			case <-s.done:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) stop() uint64 {
	close(s.done)
	s.wg.Wait()
	return s.peak
}

// resetHWM resets the process's peak RSS (VmHWM) to its current RSS.
func resetHWM() {
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// hwm returns the process's peak RSS in bytes (0 if unknown).
func hwm() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// serverProfile samples the active statements of the other backends.
type serverProfile struct {
	done   chan struct{}
	wg     sync.WaitGroup
	counts map[string]int
	n      int
}

func startServerProfile(ctx context.Context, db *sqlx.DB) *serverProfile {
	p := &serverProfile{done: make(chan struct{}), counts: map[string]int{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			select {
			case <-p.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			var qs []string
			_ = db.SelectContext(ctx, &qs, `SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 160) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() AND backend_type = 'client backend'`)
			p.n++
			for _, q := range qs {
				p.counts[q]++
			}
		}
	}()
	return p
}

func (p *serverProfile) stop(phase string) {
	close(p.done)
	p.wg.Wait()
	type kv struct {
		q string
		n int
	}
	var l []kv
	for q, n := range p.counts {
		l = append(l, kv{q, n})
	}
	slices.SortFunc(l, func(a, b kv) int { return b.n - a.n })
	fmt.Printf("\n%s: %d samples\n", phase, p.n)
	for _, x := range l[:min(len(l), 8)] {
		fmt.Printf("%6d %s\n", x.n, x.q)
	}
}
