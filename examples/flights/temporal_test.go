package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/pgbackfill/backfill"
	backfilltemporal "github.com/pgbackfill/backfill/contrib/temporal"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// The flights demo through the Temporal adapter (contrib/temporal): the
// workflow with 2 worker slots, the first attempt of slot 0 a worker
// process killed with SIGKILL in the middle of a day; Temporal retries the
// slot, the killed worker's day is taken over once its lease is stale, and
// the target equals a plain run's. Temporal's Go test suite runs the
// workflow and the activities in this process (no Temporal server).
//
// It loads synthetic flights by default; FLIGHTS_TEMPORAL_DATA names
// flights-3m.parquet to load its first FLIGHTS_TEMPORAL_DAYS days (default
// 7) instead.
const (
	flightsChildEnv  = "FLIGHTS_TEMPORAL_CHILD"
	flightsChildURL  = "FLIGHTS_TEMPORAL_CHILD_URL"
	flightsChildData = "FLIGHTS_TEMPORAL_CHILD_DATA"
	flightsChildDays = "FLIGHTS_TEMPORAL_CHILD_DAYS"
)

// flightsTemporalJob is the flights job over the first days of the file
// at path (all when days is 0), with extract as its extractor (src's
// when nil).
func flightsTemporalJob(src *Flights, days int, extract backfill.Extractor) (backfill.Job, error) {
	first, end, ok := src.Scope()
	if !ok {
		return backfill.Job{}, errors.New("no dated row")
	}
	if days > 0 && first.AddDate(0, 0, days).Before(end) {
		end = first.AddDate(0, 0, days)
	}
	if extract == nil {
		extract = src
	}
	return backfill.Job{
		Name:        flightsJob,
		Source:      flightsSrc,
		CodeVersion: codeVersion,
		Chunker:     backfill.Days(first, end, time.UTC),
		Extractor:   extract,
		Target:      backfill.Target{Table: "flights", Key: flightKey, Columns: flightColumns},
	}, nil
}

// flightsTarget returns the flights table as one text, in key order.
func flightsTarget(t *testing.T, db *sqlx.DB) (n int64, text string) {
	t.Helper()
	var r struct {
		N   int64  `db:"n"`
		Sum string `db:"sum"`
	}
	if err := db.Get(&r, `SELECT count(*) AS n, coalesce(md5(string_agg(
			format('%s|%s|%s|%s|%s|%s', dep_local, origin, destination, seq, delay, distance), E'\n'
			ORDER BY dep_local, origin, destination, seq)), '') AS sum FROM flights`); err != nil {
		t.Fatal(err)
	}
	return r.N, r.Sum
}

func TestFlightsThroughTemporal(t *testing.T) {
	ctx := context.Background()
	path, days := os.Getenv("FLIGHTS_TEMPORAL_DATA"), 0
	if path != "" {
		days = 7
		if s := os.Getenv("FLIGHTS_TEMPORAL_DAYS"); s != "" {
			var err error
			if days, err = strconv.Atoi(s); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		path = writeParquet(t, synthetic(17, 6000, 12), 500)
	}
	src := open(t, path, 64)

	// A plain run, for comparison.
	plainDB := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { plainDB.Close() })
	if _, err := plainDB.Exec(schemaDDL); err != nil {
		t.Fatal(err)
	}
	job, err := flightsTemporalJob(src, days, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := backfill.New(plainDB, &backfill.Config{Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := r.Run(ctx, job)
	if err != nil {
		t.Fatal(err)
	}

	// Through the workflow.
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(schemaDDL); err != nil {
		t.Fatal(err)
	}
	acts := &backfilltemporal.Activities{
		DB:     db,
		Config: backfill.Config{Concurrency: 2, HeartbeatInterval: 200 * time.Millisecond, StaleAfter: 2 * time.Second},
		Job: func(context.Context, backfilltemporal.Input) (backfill.Job, error) {
			return flightsTemporalJob(src, days, nil)
		},
	}
	var (
		cmd    *exec.Cmd
		killed = -1
	)
	t.Cleanup(func() {
		if cmd != nil && cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	work := func(ctx context.Context, in backfilltemporal.SlotInput) (backfilltemporal.SlotResult, error) {
		if in.Slot != 0 || activity.GetInfo(ctx).Attempt != 1 {
			return acts.Work(ctx, in)
		}
		cmd = exec.Command(os.Args[0], "-test.run=^TestFlightsTemporalWorkerProcess$")
		cmd.Env = append(os.Environ(), flightsChildEnv+"=1", flightsChildURL+"="+url, "DATABASE_URL="+url,
			flightsChildData+"="+path, flightsChildDays+"="+strconv.Itoa(days))
		cmd.Stderr = os.Stderr
		fail := func(msg string) (backfilltemporal.SlotResult, error) {
			if cmd.Process != nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
			return backfilltemporal.SlotResult{}, temporal.NewNonRetryableApplicationError(msg, "test", nil)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return fail(err.Error())
		}
		if err := cmd.Start(); err != nil {
			return fail(err.Error())
		}
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "MIDCHUNK "); ok {
				if killed, err = strconv.Atoi(s); err != nil {
					killed = -1
				}
				break
			}
		}
		if killed < 0 {
			return fail("the worker process never reached a day")
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			return fail(err.Error())
		}
		_ = cmd.Wait()
		return backfilltemporal.SlotResult{}, fmt.Errorf("worker process %d killed in the middle of day %d", cmd.Process.Pid, killed)
	}
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.SetTestTimeout(4 * time.Minute)
	// The workflow's code yields within the SDK's default 1 s, unless a
	// loaded machine does not schedule it for longer ("potential deadlock
	// detected").
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: time.Minute})
	env.RegisterWorkflowWithOptions(backfilltemporal.BackfillWorkflow, workflow.RegisterOptions{Name: backfilltemporal.WorkflowName})
	env.RegisterActivityWithOptions(work, activity.RegisterOptions{Name: backfilltemporal.ActivityWork})
	env.RegisterActivityWithOptions(acts.Control, activity.RegisterOptions{Name: backfilltemporal.ActivityControl})
	env.RegisterActivityWithOptions(acts.Status, activity.RegisterOptions{Name: backfilltemporal.ActivityStatus})
	env.ExecuteWorkflow(backfilltemporal.WorkflowName, backfilltemporal.Input{Job: flightsJob, Workers: 2,
		HeartbeatTimeout: time.Minute, StatusEvery: -1})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res backfilltemporal.Result
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}

	p := res.Progress
	if p.Status != backfill.RunCompleted || p.ChunksDone != plain.ChunksTotal {
		t.Fatalf("progress %+v, want completed with %d days", p, plain.ChunksTotal)
	}
	c := p.Rows
	if c != plain.Counts {
		t.Errorf("counts %+v, want a plain run's %+v", c, plain.Counts)
	}
	if c.Read != c.Inserted+c.Updated+c.Unchanged+c.Rejected+c.Deduplicated || c.Updated != 0 || c.Unchanged != 0 {
		t.Errorf("counts %+v: unbalanced, or rows merged twice", c)
	}
	var epoch int64
	if err := db.Get(&epoch, `SELECT lease_epoch FROM backfill.chunks WHERE batch_id = $1 AND seq = $2`, p.BatchID, killed); err != nil {
		t.Fatal(err)
	}
	if epoch < 2 {
		t.Errorf("day %d: lease_epoch %d, want it taken over from the killed worker", killed, epoch)
	}
	n, sum := flightsTarget(t, db)
	pn, psum := flightsTarget(t, plainDB)
	if n != pn || sum != psum {
		t.Errorf("target: %d rows (md5 %s), want a plain run's %d (md5 %s)", n, sum, pn, psum)
	}
	t.Logf("%d days, %d rows read, %d in the target, equal to a plain run's; day %d taken over from the killed worker (epoch %d)",
		p.ChunksDone, c.Read, n, killed, epoch)
}

// midChunkWriter passes rows on, and after half a chunk's worth prints
// MIDCHUNK and waits to be killed.
type midChunkWriter struct {
	backfill.RowWriter
	seq, n int
}

func (w *midChunkWriter) Write(ctx context.Context, values ...any) error {
	if w.n++; w.n == 100 {
		fmt.Printf("MIDCHUNK %d\n", w.seq)
		<-ctx.Done()
		return ctx.Err()
	}
	return w.RowWriter.Write(ctx, values...)
}

// TestFlightsTemporalWorkerProcess is the worker process that
// TestFlightsThroughTemporal kills: slot 0 of the workflow, through the
// adapter's activity in Temporal's activity test environment; in its first
// day it stops after 100 rows until it is killed.
func TestFlightsTemporalWorkerProcess(t *testing.T) {
	if os.Getenv(flightsChildEnv) == "" {
		t.Skip("the worker process of TestFlightsThroughTemporal")
	}
	days, _ := strconv.Atoi(os.Getenv(flightsChildDays))
	src := open(t, os.Getenv(flightsChildData), 64)
	db := sqlx.MustOpen("postgres", os.Getenv(flightsChildURL))
	defer db.Close()
	first := true
	extract := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if first {
			first = false
			w = &midChunkWriter{RowWriter: w, seq: c.Seq}
		}
		return src.Extract(ctx, c, w)
	})
	acts := &backfilltemporal.Activities{
		DB:     db,
		Config: backfill.Config{SerialExtract: true, HeartbeatInterval: 200 * time.Millisecond, StaleAfter: 2 * time.Second},
		Job: func(context.Context, backfilltemporal.Input) (backfill.Job, error) {
			return flightsTemporalJob(src, days, extract)
		},
	}
	var s testsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	env.SetTestTimeout(4 * time.Minute)
	acts.RegisterActivities(env)
	_, err := env.ExecuteActivity(backfilltemporal.ActivityWork, backfilltemporal.SlotInput{
		Input: backfilltemporal.Input{Job: flightsJob, Workers: 2}})
	t.Fatalf("the worker process ended (%v) instead of being killed", err)
}
