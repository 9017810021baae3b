package backfill_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
)

// workJob is a job of 3 chunks on the fakes; fail makes its extractor
// fail for good.
func workJob(fail bool) (*backfill.Runner, backfill.Job) {
	merger := backfilltest.NewMerger()
	merger.AddTable("t", []string{"id"}, "id")
	r, _ := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: backfilltest.NewManifest(), Merger: merger})
	job := backfill.Job{
		Name:    "work",
		Chunker: backfill.IntRange(0, 30, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if fail {
				return errors.New("source says no")
			}
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id); err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "t", Key: []string{"id"}},
	}
	return r, job
}

// TestWorkExitCodes: Work's exit-code contract: 0 for a completed run
// (and for one completed before, by this or another worker), 1 for a
// failed run, 64 for a bad job, 75 for a run to resume later (cancelled,
// chunks open).
func TestWorkExitCodes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	r, job := workJob(false)
	require.Equal(t, backfill.ExitDone, backfill.Work(ctx, r, job))
	require.Equal(t, backfill.ExitDone, backfill.Work(ctx, r, job), "completed before: done, nothing to restart")

	r, job = workJob(true)
	require.Equal(t, backfill.ExitFailed, backfill.Work(ctx, r, job))

	r, job = workJob(false)
	job.Name = ""
	require.Equal(t, backfill.ExitUsage, backfill.Work(ctx, r, job))
	require.Equal(t, backfill.ExitUsage, backfill.Work(ctx, nil, job))

	r, job = workJob(false)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.Equal(t, backfill.ExitTempFail, backfill.Work(cctx, r, job))

	// Chunks that end after now are loaded but open: resume later.
	r, job = workJob(false)
	now := time.Now().UTC().Truncate(time.Hour)
	job.Chunker = backfill.Hours(now.Add(-time.Hour), now.Add(time.Hour), time.UTC)
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		return w.Write(ctx, c.Start.Unix())
	})
	require.Equal(t, backfill.ExitTempFail, backfill.Work(ctx, r, job))
}
