// Command worker runs the fault suite's job (faulttest.Spec) against one
// database with backfill.Work, as one of many worker
// processes of the suite (see package faulttest). It logs JSON records
// (log/slog) to stderr: the library's, plus "extract" when an extraction
// starts, "merged" when a chunk's merge is done (with -merged-pause), and
// "worker exit" with the exit code.
//
// It runs the job with backfill.Work and exits with its code (the
// library's contract): 0 the run is completed, 1 it failed, 64 bad job or
// configuration, 75 not finished (restart later to resume it). The suite
// supervises it like an orchestrator: it restarts the worker on 1 and 75
// and leaves it alone once it exits 0.
//
//	worker -url URL -job NAME -table TABLE -chunks 60 -rows 3000 -sleep 400ms -id host1/w1
//
// With -merged-pause D, each chunk's transaction logs "merged" after its
// merge and pauses D before it goes on to its commit (a validator that
// sleeps in the process): the suite freezes a worker there, holding the
// merge's key locks.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the "postgres" database/sql driver

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/faulttest"
	"github.com/pgbackfill/backfill/internal/pgurl"
)

func main() {
	url := flag.String("url", "", "PostgreSQL URL of the target database")
	spec := faulttest.Spec{}
	flag.StringVar(&spec.Name, "job", "faults", "job name")
	flag.StringVar(&spec.Table, "table", "target", "target table")
	flag.IntVar(&spec.Chunks, "chunks", 60, "number of chunks")
	flag.IntVar(&spec.RowsPerChunk, "rows", 3000, "ids per chunk")
	flag.DurationVar(&spec.Sleep, "sleep", 0, "extractor sleep per chunk")
	id := flag.String("id", "", "worker ID in the manifest (default hostname:pid)")
	concurrency := flag.Int("concurrency", 1, "chunks at once")
	heartbeat := flag.Duration("heartbeat", 0, "Config.HeartbeatInterval (0: the library's default)")
	staleAfter := flag.Duration("stale-after", 0, "Config.StaleAfter (0: the library's default)")
	ahead := flag.Bool("extract-ahead", true, "extract ahead, the default (false: Config.SerialExtract)")
	mergedPause := flag.Duration("merged-pause", 0, "log \"merged\" after each chunk's merge and pause this long before its commit")
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("worker", *id, "pid", os.Getpid())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg := backfill.Config{Concurrency: *concurrency, WorkerID: *id, Logger: log, RetryBackoff: 200 * time.Millisecond,
		HeartbeatInterval: *heartbeat, StaleAfter: *staleAfter, SerialExtract: !*ahead}
	code := run(ctx, *url, spec, cfg, *mergedPause)
	log.Info("worker exit", "code", int(code))
	os.Exit(int(code))
}

func run(ctx context.Context, url string, spec faulttest.Spec, cfg backfill.Config, mergedPause time.Duration) backfill.ExitCode {
	if url == "" {
		cfg.Logger.Error("worker: -url is required")
		return backfill.ExitUsage
	}
	if err := pgurl.Check(url); err != nil {
		cfg.Logger.Error("worker: -url", "error", err)
		return backfill.ExitUsage
	}
	db, err := sqlx.Open("postgres", url)
	if err != nil {
		cfg.Logger.Error("worker: open", "error", err)
		return backfill.ExitUsage
	}
	defer db.Close()
	r, err := backfill.New(db, &cfg)
	if err != nil {
		cfg.Logger.Error("worker: config", "error", err)
		return backfill.ExitUsage
	}
	job := spec.Job(func(c backfill.Chunk) {
		cfg.Logger.Info("extract", "seq", c.Seq, "lo", c.Lo, "hi", c.Hi)
	})
	if mergedPause > 0 {
		job.Validators = append(job.Validators, backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s backfill.ValidationScope) (backfill.CheckResult, error) {
			cfg.Logger.Info("merged", "seq", s.Chunk.Seq)
			select {
			case <-ctx.Done():
				return backfill.CheckResult{}, ctx.Err()
			case <-time.After(mergedPause):
			}
			return backfill.CheckResult{Check: "merged_pause", Severity: backfill.SeverityError, Passed: true, Expected: "ok", Actual: "ok"}, nil
		}))
	}
	return backfill.Work(ctx, r, job)
}
