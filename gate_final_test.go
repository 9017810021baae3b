package backfill_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// The run reject-rate gate at the end of a call (finalGate): a chunk
// without rejects reads no totals once its call has, so a run must not
// complete before one more check of the batch's totals.

// TestRunGateWhenTheRejectingWorkerDies: worker A commits a chunk whose
// rejects push the run over MaxRunRejectRate and dies (here: hangs)
// before its own rate check. Worker B, which already checked the rate
// once, runs the remaining clean chunks: its call checks the batch's
// totals once more before the run can complete (finalGate), and pauses
// the run on the gate instead of completing it.
func TestRunGateWhenTheRejectingWorkerDies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	aHolds, aGo, aCommitted, hang := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(hang) })
	job := func(hold func(c backfill.Chunk)) backfill.Job {
		return backfill.Job{Name: "live", Chunker: backfill.IntRange(0, 60, 10), Rollback: backfill.RollbackNone,
			Target: backfill.Target{Table: "live", Key: []string{"id"}},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				hold(c)
				for id := c.Lo; id < c.Hi; id++ {
					if c.Seq == 0 {
						if err := w.Reject(ctx, map[string]any{"id": id}, "v", "bad"); err != nil {
							return err
						}
						continue
					}
					if err := w.Write(ctx, id, fmt.Sprint("v", id)); err != nil {
						return err
					}
				}
				return nil
			})}
	}
	runner := func(id string, hooks backfill.Hooks) *backfill.Runner {
		r, err := backfill.New(db, &backfill.Config{WorkerID: id, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second,
			RetryBackoff: 10 * time.Millisecond, MaxRejectsPerChunk: -1, Hooks: hooks})
		require.NoError(t, err)
		return r
	}
	a := runner("worker-a", backfill.HooksFunc(func(ctx context.Context, _ int64, r backfill.ChunkResult) {
		if r.Chunk.Seq == 0 {
			close(aCommitted)
			<-hang // the process "dies" between the commit and the rate check
		}
	}))
	go func() {
		_, _ = a.Run(ctx, job(func(c backfill.Chunk) {
			if c.Seq == 0 {
				close(aHolds)
				<-aGo
			}
		}))
	}()
	<-aHolds
	b := runner("worker-b", nil)
	bDone := make(chan error, 1)
	var rep backfill.Report
	go func() {
		var err error
		rep, err = b.Run(ctx, job(func(c backfill.Chunk) {
			if c.Seq == 2 { // B has done chunk 1 (and checked the rate once)
				close(aGo)
				<-aCommitted
			}
		}))
		bDone <- err
	}()
	err = <-bDone
	var rejected, read int64
	require.NoError(t, db.QueryRow(`SELECT sum(rows_rejected), sum(rows_read) FROM backfill.chunks`).Scan(&rejected, &read))
	t.Logf("B: status %s err %v; run totals: %d rejected of %d read", rep.Status, err, rejected, read)
	require.NotEqual(t, backfill.RunCompleted, rep.Status, "run completed with reject rate %d/%d above the 10%% default", rejected, read)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	var status string
	require.NoError(t, db.Get(&status, `SELECT status FROM backfill.runs`))
	require.Equal(t, "paused", status)
}

func gateCrashJob() backfill.Job {
	return backfill.Job{Name: "crashrate", Chunker: backfill.IntRange(0, 30, 10), Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "crashrate", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if c.Seq == 2 { // the last chunk rejects every row: 10/30 > 10%
					if err := w.Reject(ctx, map[string]any{"id": id}, "v", "bad"); err != nil {
						return err
					}
					continue
				}
				if err := w.Write(ctx, id, fmt.Sprint("v", id)); err != nil {
					return err
				}
			}
			return nil
		})}
}

// TestRunGateAfterACrashAfterTheLastChunk: the process dies between the
// last chunk's commit and its rate check; the resumed call finds no chunk
// to run, checks the batch's totals (finalGate) and pauses the run on the
// gate instead of completing it above MaxRunRejectRate.
func TestRunGateAfterACrashAfterTheLastChunk(t *testing.T) {
	if url := os.Getenv("BACKFILL_GATE_CRASH_CHILD"); url != "" {
		db := sqlx.MustOpen("postgres", url)
		r, err := backfill.New(db, &backfill.Config{Concurrency: 1, MaxRejectsPerChunk: -1,
			Hooks: backfill.HooksFunc(func(ctx context.Context, _ int64, res backfill.ChunkResult) {
				if res.Chunk.Seq == 2 {
					os.Exit(7) // kill -9 between the commit and the check
				}
			})})
		require.NoError(t, err)
		_, _ = r.Run(context.Background(), gateCrashJob())
		t.Fatal("child not killed")
	}
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	defer db.Close()
	db.MustExec(`CREATE TABLE crashrate (id bigint PRIMARY KEY, v text NOT NULL)`)
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunGateAfterACrashAfterTheLastChunk$")
	cmd.Env = append(os.Environ(), "BACKFILL_GATE_CRASH_CHILD="+url)
	out, err := cmd.CombinedOutput()
	require.Error(t, err, string(out))
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, MaxRejectsPerChunk: -1})
	require.NoError(t, err)
	rep, err := r.Run(ctx, gateCrashJob())
	t.Logf("resumed: status %s resumed %v err %v", rep.Status, rep.Resumed, err)
	require.NotEqual(t, backfill.RunCompleted, rep.Status, "completed at a run reject rate of 10/30")
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Equal(t, backfill.RunPaused, rep.Status)
}
