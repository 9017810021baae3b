package backfill

import (
	"context"
	"fmt"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// rejectingJob is liveJob over 20 chunks whose chunk of seq s rejects the
// first rejects(s) of its 10 rows, with a run reject gate of 20%.
func rejectingJob(rejects func(seq int) int) Job {
	job := liveJob(nil)
	job.Chunker = IntRange(0, 200, 10)
	job.MaxRunRejectRate = 0.2
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		n := rejects(c.Seq)
		for id := c.Lo; id < c.Hi; id++ {
			var err error
			if id-c.Lo < int64(n) {
				err = w.Reject(ctx, id, "v", "bad source row")
			} else {
				err = w.Write(ctx, id, fmt.Sprint("v", id))
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	return job
}

// pausedByRejects runs job with one worker until the reject gate pauses
// it after its first chunk (9 of 10 rows rejected), checks that the pause
// says what a resume accepts, and resumes it from SQL as an operator.
func pausedByRejects(t *testing.T, db *sqlx.DB, r *Runner, job Job) {
	t.Helper()
	rep, err := r.Run(context.Background(), job)
	require.ErrorIs(t, err, ErrGateFailed)
	require.Equal(t, RunPaused, rep.Status)
	require.Equal(t, 1, rep.ChunksDone)
	require.Contains(t, err.Error(), "resume the run to accept the 9 rejects so far, after which the gate judges only the rows read after the resume")
	_, err = db.Exec(`SELECT backfill.resume($1::bigint, 'ann', 'accept the 9 rejects')`, rep.BatchID)
	require.NoError(t, err)
}

// TestResumeAcceptsTheRejectsSoFar: a run the reject gate paused, resumed
// from SQL, is judged on the rows read after the resume: with those under
// Job.MaxRunRejectRate it completes, although the run's rejects over all
// its rows stay above it.
func TestResumeAcceptsTheRejectsSoFar(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	r.cfg.ReturnOnPause = true
	r.cfg.Concurrency = 1
	job := rejectingJob(func(seq int) int {
		if seq == 0 {
			return 9
		}
		return 1
	})
	pausedByRejects(t, db, r, job)
	rep, err := r.Run(context.Background(), job)
	require.NoError(t, err, "10% of the rows read after the resume are rejected, under the gate's 20%")
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, Counts{Read: 200, Rejected: 28}, Counts{Read: rep.Counts.Read, Rejected: rep.Counts.Rejected})
}

// TestResumeAcceptsOnlyTheRejectsSoFar: after the resume of a run the
// reject gate paused, the gate pauses the run again once the rows read
// after the resume cross Job.MaxRunRejectRate: after enough new rows, not
// at the first chunk.
func TestResumeAcceptsOnlyTheRejectsSoFar(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	r.cfg.ReturnOnPause = true
	r.cfg.Concurrency = 1
	job := rejectingJob(func(seq int) int {
		switch {
		case seq == 0:
			return 9
		case seq >= 5:
			return 5
		}
		return 0
	})
	pausedByRejects(t, db, r, job)
	rep, err := r.Run(context.Background(), job)
	require.ErrorIs(t, err, ErrGateFailed)
	require.Equal(t, RunPaused, rep.Status)
	// After the resume: chunks 1 to 4 clean, then 5 of 10 rejected per
	// chunk: 5/50, 10/60, 15/70 = 21.4% after chunk 7.
	require.Equal(t, 8, rep.ChunksDone, "paused when the rows read after the resume crossed 20%")
	require.Contains(t, err.Error(), "run reject rate 15/70 = 0.2143 exceeds Job.MaxRunRejectRate 0.2000 (rows read since the run was last resumed, at 10 read and 9 rejected)")
	require.Contains(t, err.Error(), "resume the run to accept the 24 rejects so far")
}
