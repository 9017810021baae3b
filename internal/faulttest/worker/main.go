// Command worker runs the fault suite's job (faulttest.Spec) against one
// database until it finds no chunk left to claim, as one of many worker
// processes of the suite (see package faulttest). It logs JSON records
// (log/slog) to stderr: the library's, plus "extract" when an extraction
// starts and "worker exit" with the exit code.
//
// Exit codes: 0 when this worker found nothing left to claim (the run is
// completed, or the chunks left are held by other workers), 2 when the run
// is paused, 1 on any other error (an orchestrator restarts the worker).
//
//	worker -url URL -job NAME -table TABLE -chunks 60 -rows 3000 -sleep 400ms -id host1/w1
package main

import (
	"context"
	"errors"
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
)

// Exit codes of work.
const (
	exitDone   = 0
	exitFailed = 1
	exitPaused = 2
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
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("worker", *id, "pid", os.Getpid())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	code := run(ctx, *url, spec, *id, *concurrency, log)
	log.Info("worker exit", "code", code)
	os.Exit(code)
}

func run(ctx context.Context, url string, spec faulttest.Spec, id string, concurrency int, log *slog.Logger) int {
	if url == "" {
		log.Error("worker: -url is required")
		return exitFailed
	}
	db, err := sqlx.Open("postgres", url)
	if err != nil {
		log.Error("worker: open", "error", err)
		return exitFailed
	}
	defer db.Close()
	r, err := backfill.New(db, &backfill.Config{Concurrency: concurrency, WorkerID: id, Logger: log, RetryBackoff: 200 * time.Millisecond})
	if err != nil {
		log.Error("worker: config", "error", err)
		return exitFailed
	}
	job := spec.Job(func(c backfill.Chunk) {
		log.Info("extract", "seq", c.Seq, "lo", c.Lo, "hi", c.Hi)
	})
	return work(ctx, r, job, log)
}

// work runs job on r until nothing is left to claim and returns the exit
// code. It stands for the library's coming worker entry point
// (backfill.Work(ctx, runner, job) int, issue 12 item 6): once that lands,
// its body becomes a call to it.
func work(ctx context.Context, r *backfill.Runner, job backfill.Job, log *slog.Logger) int {
	rep, err := r.Run(ctx, job)
	switch {
	case err == nil, errors.Is(err, backfill.ErrAlreadyCompleted):
		log.Info("worker done", "status", rep.Status, "chunks_run", rep.ChunksRun, "chunks_done", rep.ChunksDone)
		return exitDone
	case errors.Is(err, backfill.ErrRunPaused):
		log.Warn("worker: run paused", "error", err)
		return exitPaused
	default:
		log.Error("worker failed", "error", err, "chunks_run", rep.ChunksRun)
		return exitFailed
	}
}
