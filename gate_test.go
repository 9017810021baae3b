package backfill_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// TestQualityGatePausesAndResumes: an error-level check that fails stops
// publishing at that chunk; no later chunk is visible; resuming needs who
// and why, and completes once the data is fixed.
func TestQualityGatePausesAndResumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	var broken atomic.Bool
	broken.Store(true)
	noBadNames := backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
		var n int
		if err := sqlx.GetContext(ctx, tx, &n, `SELECT count(*) FROM `+sc.Staging+` WHERE name = 'bad'`); err != nil {
			return backfill.CheckResult{}, err
		}
		return backfill.CheckResult{Check: "no_bad_names", Severity: backfill.SeverityError, Passed: n == 0,
			Expected: "0 bad names", Actual: fmt.Sprintf("%d bad names", n)}, nil
	})
	job := s.job(1)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Lo == 400 && broken.Load() {
			if err := w.Write(ctx, "acme", int64(400), "bad", "1.00", nil); err != nil {
				return err
			}
			c.Lo = 401
		}
		return inner.Extract(ctx, c, w)
	})
	job.Validators = []backfill.Validator{noBadNames}
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Equal(t, backfill.RunPaused, rep.Status)
	require.Equal(t, 4, rep.ChunksDone)
	var max int64
	require.NoError(t, s.db.Get(&max, `SELECT max(id) FROM items`))
	require.Equal(t, int64(399), max, "nothing of the failing chunk or later is visible")

	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrRunPaused, "a paused run does not resume by itself")
	_, err = r.Resume(ctx, job, "", "")
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)

	broken.Store(false)
	rep, err = r.Resume(ctx, job, "ann", "source fixed in ticket 42")
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, int64(1000), rep.Counts.Inserted)

	require.Equal(t, 10, rep.ChecksPassed, "one verdict per chunk and check: the latest")
	require.Zero(t, rep.ChecksFailed)
	require.Empty(t, rep.FailedChecks)
	require.Equal(t, []string{"int:400/500: no_bad_names: expected 0 bad names, got 1 bad names (attempt 1, rolled back)"}, rep.SupersededChecks)
	vs, err := backfill.NewPGManifest("").Validations(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, vs, 11, "10 passing chunks and the failed attempt: evidence is appended, never overwritten")
	failed := 0
	for _, v := range vs {
		if !v.Passed {
			failed++
			require.Equal(t, "int:400/500", v.ChunkID)
			require.Equal(t, "1 bad names", v.Actual)
		}
	}
	require.Equal(t, 1, failed)
	events, err := backfill.NewPGManifest("").Events(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	var resumedBy string
	for _, e := range events {
		if e.Kind == "run_resumed_by_operator" {
			resumedBy = e.Actor + ": " + string(e.Detail)
		}
	}
	require.Equal(t, `ann: {"why": "source fixed in ticket 42"}`, resumedBy)
}

// TestReportsCanExcludeIncompleteBatches: rows of a batch that has not
// completed are hidden by joining the lineage to backfill.completed_batches.
func TestReportsCanExcludeIncompleteBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, s.job(1))
	require.NoError(t, err)
	job := s.job(2)
	job.NewRun = true
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Lo == 500 {
			return fmt.Errorf("source down")
		}
		return inner.Extract(ctx, c, w)
	})
	_, err = r.Run(ctx, job) // batch 2 stops half way
	require.Error(t, err)
	const visible = `SELECT count(*) FROM items i WHERE i.backfill_updated_by IS NULL
		OR EXISTS (SELECT 1 FROM backfill.completed_batches b WHERE b.batch_id = i.backfill_updated_by)`
	var n, changed int
	require.NoError(t, s.db.Get(&n, visible))
	require.NoError(t, s.db.Get(&changed, `SELECT count(*) FROM items WHERE backfill_updated_by = 2`))
	require.Equal(t, 50, changed, "batch 2 changed every tenth row of its 5 done chunks")
	require.Equal(t, 1000-changed, n, "reports do not see the rows of the incomplete batch 2")
}

func TestRunRejectRateGate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	job := s.job(1)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Lo >= 300 {
			// From the fourth chunk on, a third of the rows are bad.
			for id := c.Lo; id < c.Hi; id++ {
				if id%3 == 0 {
					if err := w.Reject(ctx, map[string]any{"id": id}, "", "bad row"); err != nil {
						return err
					}
					continue
				}
				if err := w.Write(ctx, "acme", id, "x", "1.00", nil); err != nil {
					return err
				}
			}
			return nil
		}
		return inner.Extract(ctx, c, w)
	})
	job.MaxRunRejectRate = 0.05
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Contains(t, err.Error(), "run reject rate")
	require.Equal(t, backfill.RunPaused, rep.Status)
	require.Equal(t, 4, rep.ChunksDone, "34/400 = 8.5% after the fourth chunk pauses the run")
}
