// Command worker is the Kubernetes example's worker: one pod of an
// Indexed Job (../manifests/03-worker-job.yaml) that runs the demo job with
// backfill.Work and exits with its code, which the Job's podFailurePolicy
// maps to an action (see ../README.md).
//
// It is configured from the environment only, as a pod is: DATABASE_URL
// (the loader's credentials, from a Secret) and the job's parameters
// (from a ConfigMap):
//
//	BACKFILL_JOB            the job's name (default k8s-demo)
//	BACKFILL_TABLE          the target table (default demo_events)
//	BACKFILL_IDS            ids to load, [0, BACKFILL_IDS) (default 1000000)
//	BACKFILL_CHUNK_ROWS     ids per chunk (default 10000)
//	BACKFILL_CONCURRENCY    Config.Concurrency, chunks at once (default 2)
//	BACKFILL_EXTRACT_DELAY  a pause per chunk in the extractor, a slow source (default 0)
//
// The demo job writes one row per id, computed from the id, so that any
// number of workers converge on the same table. The connection pool is
// capped at 2 × Concurrency + 2 connections (a chunk's transaction and
// the lease of the chunk extracted ahead per worker, the heartbeat and
// the manifest's short transactions), which is what a pod needs from the
// server or from PgBouncer.
//
// SIGTERM (the kubelet's, when the pod is deleted, evicted or the Job
// suspended) drains the worker (Runner.Drain): it claims no more chunks,
// the chunks it claimed finish (merged and checkpointed), the worker is
// marked finished and Work returns ExitTempFail (75). Past
// BACKFILL_DRAIN_GRACE (default 30s, below the pod's
// terminationGracePeriodSeconds), or at a second signal, it cancels the
// context: the chunks still in flight roll back and stay pending. This pod
// alone stops; the run goes on with the other pods. It deliberately does
// not use Runner.PauseOnSignal, whose first signal pauses the run for
// every worker of every pod.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the "postgres" database/sql driver

	"github.com/pgbackfill/backfill"
)

// The environment variables the worker reads; the ConfigMap and the Secret
// of ../manifests set them.
const (
	envDatabaseURL  = "DATABASE_URL"
	envJob          = "BACKFILL_JOB"
	envTable        = "BACKFILL_TABLE"
	envIDs          = "BACKFILL_IDS"
	envChunkRows    = "BACKFILL_CHUNK_ROWS"
	envConcurrency  = "BACKFILL_CONCURRENCY"
	envExtractDelay = "BACKFILL_EXTRACT_DELAY"
	envDrainGrace   = "BACKFILL_DRAIN_GRACE"
)

// defaultDrainGrace is how long a worker told to stop lets its chunks in
// flight finish before it rolls them back.
const defaultDrainGrace = 30 * time.Second

// codeVersion is the version of the demo job's transformation, part of
// its plan fingerprint: bump it when the rows a chunk produces change.
const codeVersion = "k8s-demo/1"

func main() { os.Exit(int(runMain())) }

// runMain runs the worker as the process it is: settings from the
// environment, JSON logs on stderr, SIGTERM and SIGINT cancelling the
// context.
func runMain() backfill.ExitCode {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	grace := defaultDrainGrace
	if v := os.Getenv(envDrainGrace); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			log.Error("backfill worker: bad setting", "error", fmt.Sprintf("%s=%q: want a duration such as 30s", envDrainGrace, v), "exit_code", int(backfill.ExitUsage))
			return backfill.ExitUsage
		}
		grace = d
	}
	var runner atomic.Pointer[backfill.Runner]
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(sigs)
	go func() {
		sig := <-sigs
		r := runner.Load()
		if r == nil {
			cancel()
			return
		}
		// Stop claiming; let the chunks in flight finish within the grace.
		log.Info("backfill worker: stopping: draining", "signal", sig.String(), "grace", grace)
		r.Drain()
		select {
		case sig := <-sigs:
			log.Warn("backfill worker: second signal: cancelling; the chunks still in flight roll back", "signal", sig.String())
		case <-time.After(grace):
			log.Warn("backfill worker: drain grace over: cancelling; the chunks still in flight roll back", "grace", grace)
		case <-ctx.Done():
		}
		cancel()
	}()
	return work(ctx, os.Getenv, log, runner.Store)
}

// settings are the worker's parameters, read from the environment.
type settings struct {
	url          string
	job          string
	table        string
	ids          int64
	chunkRows    int64
	concurrency  int
	extractDelay time.Duration
}

// readSettings reads the parameters with getenv; a missing DATABASE_URL or
// a malformed number is an error.
func readSettings(getenv func(string) string) (settings, error) {
	s := settings{url: getenv(envDatabaseURL), job: getenv(envJob), table: getenv(envTable)}
	if s.url == "" {
		return s, fmt.Errorf("%s is not set (the loader's credentials, from a Secret)", envDatabaseURL)
	}
	if s.job == "" {
		s.job = "k8s-demo"
	}
	if s.table == "" {
		s.table = "demo_events"
	}
	var errs []error
	num := func(name string, def int64) int64 {
		v := getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("%s=%q: want a whole number of at least 1", name, v))
		}
		return n
	}
	s.ids = num(envIDs, 1_000_000)
	s.chunkRows = num(envChunkRows, 10_000)
	s.concurrency = int(num(envConcurrency, 2))
	if v := getenv(envExtractDelay); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			errs = append(errs, fmt.Errorf("%s=%q: want a duration such as 200ms", envExtractDelay, v))
		}
		s.extractDelay = d
	}
	return s, errors.Join(errs...)
}

// poolSize is the most connections a worker of the given concurrency
// opens: a chunk's transaction and a lease per chunk worked at once (so
// that each extracts ahead), plus the heartbeat and the manifest's short
// transactions.
func poolSize(concurrency int) int { return 2*concurrency + 2 }

// work runs the demo job as one worker and returns backfill.Work's exit
// code; a bad setting is ExitUsage, like a bad job. started, if not nil,
// gets the Runner before Work starts (to drain it on a signal).
func work(ctx context.Context, getenv func(string) string, log *slog.Logger, started func(*backfill.Runner)) backfill.ExitCode {
	s, err := readSettings(getenv)
	if err != nil {
		log.Error("backfill worker: bad setting", "error", err, "exit_code", int(backfill.ExitUsage))
		return backfill.ExitUsage
	}
	db, err := sqlx.Open("postgres", s.url)
	if err != nil {
		log.Error("backfill worker: "+envDatabaseURL, "error", err, "exit_code", int(backfill.ExitUsage))
		return backfill.ExitUsage
	}
	defer db.Close()
	db.SetMaxOpenConns(poolSize(s.concurrency))
	runner, err := backfill.New(db, &backfill.Config{Concurrency: s.concurrency, Logger: log})
	if err != nil {
		log.Error("backfill worker: configuration", "error", err, "exit_code", int(backfill.ExitUsage))
		return backfill.ExitUsage
	}
	if started != nil {
		started(runner)
	}
	return backfill.Work(ctx, runner, demoJob(s))
}

// demoJob is the job every pod runs: the ids [0, s.ids) in chunks of
// s.chunkRows, one row per id. The target has lineage columns, so a batch
// can be rolled back (undo log). NewRun stays false: the pods converge on
// one run.
func demoJob(s settings) backfill.Job {
	return backfill.Job{
		Name:        s.job,
		Source:      "k8s-demo/generated",
		CodeVersion: codeVersion,
		Chunker:     backfill.IntRange(0, s.ids, s.chunkRows),
		ChunkColumn: "id",
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if s.extractDelay > 0 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(s.extractDelay):
				}
			}
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, fmt.Sprintf("event %d", id), fmt.Sprintf("%d.%02d", id%1000, id%100)); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: s.table, Key: []string{"id"}, Columns: []string{"id", "name", "amount"}},
	}
}
