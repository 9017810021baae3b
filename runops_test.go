package backfill_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestRunCompletedJobAgainIsNotSuccess: running a completed plan again
// does nothing and says so (a sentinel error and a log record), and the
// report does not claim a resume; the same holds after a rollback.
func TestRunCompletedJobAgainIsNotSuccess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	var logs bytes.Buffer
	r, err := backfill.New(s.db, &backfill.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	rep, err := r.Run(ctx, s.job(1))
	require.NoError(t, err)
	require.False(t, rep.Resumed, "a new run is not a resume")

	rep2, err := r.Run(ctx, s.job(1))
	require.ErrorIs(t, err, backfill.ErrAlreadyCompleted)
	require.Contains(t, err.Error(), "already completed; nothing done; use Job.NewRun to restate")
	require.False(t, rep2.Resumed, "nothing was resumed")
	require.Equal(t, backfill.RunCompleted, rep2.Status)
	require.Equal(t, rep.BatchID, rep2.BatchID)
	require.Zero(t, rep2.ChunksRun)
	require.Equal(t, int64(1), s.count("int:0/100"), "nothing extracted again")
	require.Contains(t, logs.String(), "nothing done")

	rb, err := r.Rollback(ctx, s.job(1), backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "ann", Why: "test"})
	require.NoError(t, err)
	require.Equal(t, backfill.RunRolledBack, rb.Status)
	rep3, err := r.Run(ctx, s.job(1))
	require.ErrorIs(t, err, backfill.ErrAlreadyCompleted, "a rolled back plan is not run again silently either")
	require.False(t, rep3.Resumed)

	job := s.job(1)
	job.NewRun = true
	rep4, err := r.Run(ctx, job)
	require.NoError(t, err, "NewRun restates")
	require.NotEqual(t, rep.BatchID, rep4.BatchID)
	require.False(t, rep4.Resumed)
}

// TestPublishVersionWaitsBoundedBehindReader: a reader holding a
// transaction open on the view does not block the switch forever, nor the
// new readers: each try of the switch gives up after lock_timeout, new
// readers read the old version meanwhile, and after the last try the run
// fails with an error naming the blocking session; once the reader is gone,
// running the job again publishes.
func TestPublishVersionWaitsBoundedBehindReader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL,
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := viewJob(false)
	job.Publish.LockTimeout = "50ms"
	job.Publish.LockRetries = 2
	_, err = r.Run(ctx, job)
	require.NoError(t, err)

	// A long reader of version 1.
	reader, err := db.Connx(ctx)
	require.NoError(t, err)
	defer reader.Close()
	_, err = reader.ExecContext(ctx, `SET application_name = 'long_report'`)
	require.NoError(t, err)
	rtx, err := reader.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer rtx.Rollback()
	var n int
	require.NoError(t, rtx.Get(&n, `SELECT count(*) FROM orders_current`))
	require.Equal(t, 400, n)

	job2 := viewJob(false)
	job2.NewRun = true
	job2.Publish = job.Publish
	job2.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		for id := c.Lo; id < c.Hi; id++ {
			if err := w.Write(ctx, id, id*5); err != nil {
				return err
			}
		}
		return nil
	})
	rep, err := r.Run(ctx, job2)
	require.ErrorIs(t, err, backfill.ErrPublishBlocked)
	require.Contains(t, err.Error(), "long_report", "the error names the blocking session")
	require.Contains(t, err.Error(), "SELECT count(*) FROM orders_current")
	require.Contains(t, err.Error(), "after 2 tries")
	require.Equal(t, backfill.RunCompleted, rep.Status)

	// New readers were not queued behind the switch: they read version 1.
	var sum int64
	require.NoError(t, db.Get(&sum, `SELECT sum(amount) FROM orders_current`))
	require.Equal(t, int64(3*399*400/2), sum)

	require.NoError(t, rtx.Rollback())
	job2.NewRun = false
	rep2, err := r.Run(ctx, job2)
	require.NoError(t, err, "the next call publishes the completed run")
	require.Equal(t, rep.BatchID, rep2.BatchID)
	require.NoError(t, db.Get(&sum, `SELECT sum(amount) FROM orders_current`))
	require.Equal(t, int64(5*399*400/2), sum)
	_, err = r.Run(ctx, job2)
	require.ErrorIs(t, err, backfill.ErrAlreadyCompleted, "published and complete: nothing left to do")
}
