// Command benchstatus measures the accuracy of the ETA that Status
// derives from the manifest: it runs a generic job over generated data
// whose chunks vary in size (a smooth seasonal swing of ±40% plus noise
// around -rows rows per chunk, read at a cost proportional to their rows,
// as a source query would), holds it with a custom SQL throttle
// (SQLSignal on a flag this program raises) for -throttle-for once
// -throttle-at of the rows are done, and records PGManifest.Status's ETA
// when 25%, 50% and 75% of the rows are done. At the end it compares each
// ETA with the time that actually remained and prints the errors, for the
// ETA as Status gives it (remaining planned rows / recent working rate)
// and, for comparison, for a naive ETA of the same remaining rows at the
// run's wall rate so far (throttled time included). It asserts nothing.
// make bench-status runs it.
//
// It is not the flights example (a module of its own, with its data
// downloaded): the job here is generic, with realistic chunk sizes.
//
//	go run ./cmd/bench/status [-chunks 120 -rows 3000 -concurrency 2 -throttle-at 0.1 -throttle-for 15s]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math"
	"os"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/pgurl"
)

func main() {
	chunks := flag.Int("chunks", 120, "chunks in the plan")
	rows := flag.Int("rows", 3000, "mean rows per chunk")
	rowCost := flag.Duration("row-cost", 150*time.Microsecond, "the source's read time per row")
	conc := flag.Int("concurrency", 2, "Config.Concurrency")
	throttleAt := flag.Float64("throttle-at", 0.10, "fraction of the rows done at which the throttle is raised")
	throttleFor := flag.Duration("throttle-for", 15*time.Second, "how long the throttle is held")
	verbose := flag.Bool("v", false, "print every status read")
	flag.Parse()

	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if err := pgurl.Check(url); url != "" && err != nil {
		log.Fatalf("DATABASE_URL: %v", err)
	}
	if url == "" {
		srv, err := pgtest.Start(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer func() { _ = srv.Stop() }()
		url = srv.URL()
	}
	db := sqlx.MustOpen("postgres", url)
	defer db.Close()
	db.MustExec(`DROP TABLE IF EXISTS bench_status_target, bench_status_ctl`)
	db.MustExec(`CREATE TABLE bench_status_target (id bigint PRIMARY KEY, v text NOT NULL, n int NOT NULL)`)
	db.MustExec(`CREATE TABLE bench_status_ctl (v float8 NOT NULL)`)
	db.MustExec(`INSERT INTO bench_status_ctl VALUES (0)`)
	pm := backfill.NewPGManifest("")
	if err := pm.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}

	// Chunk i covers keys [i*span, (i+1)*span); a key is a row when its
	// hash falls under the chunk's density.
	span := int64(2 * *rows)
	density := func(seq int) float64 {
		noise := math.Mod(float64(seq)*0.618034, 1) - 0.5 // deterministic, in [-0.5, 0.5)
		return 0.5 * (1 + 0.4*math.Sin(float64(seq)*0.45) + 0.2*noise)
	}
	isRow := func(id int64, d float64) bool {
		h := uint64(id) * 0x9E3779B97F4A7C15
		return float64(h>>11)/float64(1<<53) < d
	}
	var total int64
	for seq := 0; seq < *chunks; seq++ {
		d := density(seq)
		for id := int64(seq) * span; id < int64(seq+1)*span; id++ {
			if isRow(id, d) {
				total++
			}
		}
	}
	job := backfill.Job{
		Name:     "bench_status",
		Chunker:  backfill.IntRange(0, int64(*chunks)*span, span),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "bench_status_target", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			d := density(c.Seq)
			n := 0
			for id := c.Lo; id < c.Hi; id++ {
				if !isRow(id, d) {
					continue
				}
				if err := w.Write(ctx, id, fmt.Sprint("v", id), int(id%1000)); err != nil {
					return err
				}
				n++
			}
			time.Sleep(time.Duration(n) * *rowCost)
			return nil
		}),
	}
	r, err := backfill.New(db, &backfill.Config{
		WorkerID: "benchstatus", Concurrency: *conc, ThrottleInterval: 200 * time.Millisecond,
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Throttles: []backfillthrottle.Throttle{{Signal: backfillthrottle.SQLSignal("bench_flag", `SELECT v FROM bench_status_ctl`), High: 1, Low: 0.5}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("## Status ETA: %d chunks, %d rows (mean %d per chunk, ±40%% seasonal + noise), Concurrency %d, throttle held %v from %.0f%% of the rows\n\n",
		*chunks, total, total/int64(*chunks), *conc, *throttleFor, 100**throttleAt)

	type mark struct {
		at      float64
		when    time.Time
		eta     float64
		known   bool
		thr     float64
		rate    float64
		recent  bool
		naive   float64
		elapsed time.Duration
	}
	marks := []*mark{{at: 0.25}, {at: 0.50}, {at: 0.75}}
	begin := time.Now()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		raised, lowered := false, false
		var raisedAt time.Time
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			s, err := pm.JobStatus(ctx, db, job.Name)
			if err != nil {
				continue // the run does not exist yet
			}
			frac := float64(s.RowsProcessed) / float64(total)
			if *verbose {
				eta := "-"
				if d, ok := s.ETA(); ok {
					eta = d.Round(100 * time.Millisecond).String()
				}
				fmt.Printf("%6.1fs %5.1f%% eta %s throttled %.0f%%\n", time.Since(begin).Seconds(), 100*frac, eta, 100*s.Time.ThrottledFraction)
			}
			if !raised && frac >= *throttleAt {
				db.MustExec(`UPDATE bench_status_ctl SET v = 2`)
				raised, raisedAt = true, time.Now()
			}
			if raised && !lowered && time.Since(raisedAt) >= *throttleFor {
				db.MustExec(`UPDATE bench_status_ctl SET v = 0`)
				lowered = true
			}
			for _, m := range marks {
				if m.when.IsZero() && frac >= m.at {
					m.when, m.elapsed, m.thr = time.Now(), time.Since(begin), s.Time.ThrottledFraction
					if s.ETASeconds != nil {
						m.eta, m.known = *s.ETASeconds, true
					}
					if s.RemainingRows != nil && s.WallRate != nil && *s.WallRate > 0 {
						m.naive = *s.RemainingRows / *s.WallRate
					}
					if s.RecentRate != nil {
						m.rate, m.recent = *s.RecentRate, true
					} else if s.OverallRate != nil {
						m.rate = *s.OverallRate
					}
				}
			}
		}
	}()
	rep, err := r.Run(ctx, job)
	end := time.Now()
	close(done)
	wg.Wait()
	if err != nil {
		log.Fatal(err)
	}
	s, err := pm.Status(ctx, db, rep.BatchID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("run: %v, %d rows read; time split: working %.1fs, throttled %.1fs (%.0f%%), paused %.1fs, idle %.1fs; overall %.0f rows/s per working second, %.0f wall\n\n",
		end.Sub(begin).Round(100*time.Millisecond), s.Rows.Read, s.Time.WorkingSeconds, s.Time.ThrottledSeconds, 100*s.Time.ThrottledFraction,
		s.Time.PausedSeconds, s.Time.IdleSeconds, deref(s.OverallRate), deref(s.WallRate))
	fmt.Println("| rows done | at | rate (rows/s) | ETA | actual remaining | error | throttled so far | naive ETA (wall rate) | error |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, m := range marks {
		if m.when.IsZero() || !m.known {
			fmt.Printf("| %.0f%% | - | - | - | - | - | - | - | - |\n", 100*m.at)
			continue
		}
		actual := end.Sub(m.when).Seconds()
		adj := m.naive
		basis := "recent"
		if !m.recent {
			basis = "overall"
		}
		fmt.Printf("| %.0f%% | %.1fs | %.0f %s | %.1fs | %.1fs | %+.1f%% | %.0f%% | %.1fs | %+.1f%% |\n", 100*m.at, m.elapsed.Seconds(), m.rate, basis,
			m.eta, actual, 100*(m.eta-actual)/actual, 100*m.thr, adj, 100*(adj-actual)/actual)
	}
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}
