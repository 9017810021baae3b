package backfill

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/internal/testwait"
)

// heavyLiveJob loads 2000 rows into table live (liveDB) from one plan
// chunk of keys [0, 100), 20 rows a key, which a ChunkMaxRows of 100
// works in about 20 sub-chunks. at, if not nil, is called in the
// validation of each sub-chunk with the sub-chunks committed before it.
func heavyLiveJob(db *sqlx.DB, at func(ctx context.Context, batch int64, committed int) error) Job {
	job := Job{Name: "heavy", Chunker: IntRange(0, 100, 100),
		Extractor: ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
			for k := c.Lo; k < c.Hi; k++ {
				for j := range int64(20) {
					if err := w.Write(ctx, k*20+j, fmt.Sprint("v", k)); err != nil {
						return err
					}
				}
			}
			return nil
		}),
		Target: Target{Table: "live", Key: []string{"id"}, Columns: []string{"id", "v"}}, Rollback: RollbackNone}
	if at != nil {
		job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, _ sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
			var n int
			if err := db.GetContext(ctx, &n, `SELECT count(*) FROM backfill.subchunks WHERE batch_id = $1`, s.BatchID); err != nil {
				return CheckResult{}, err
			}
			return CheckResult{Check: "at", Severity: SeverityError, Passed: true}, at(ctx, s.BatchID, n)
		})}
	}
	return job
}

// subchunkCount is how many sub-chunks of batch are committed, and the
// plan chunk's status and whether it is leased.
func subchunkState(t *testing.T, db *sqlx.DB, batch int64) (n int, status string, leased bool) {
	t.Helper()
	require.NoError(t, db.QueryRow(`SELECT (SELECT count(*) FROM backfill.subchunks WHERE batch_id = $1), status, lease_key IS NOT NULL
		FROM backfill.chunks WHERE batch_id = $1 AND seq = 0`, batch).Scan(&n, &status, &leased))
	return n, status, leased
}

// requireHeavyLoaded checks the heavy job's rows are in live once and
// its plan chunk is done with the sums of its sub-chunks.
func requireHeavyLoaded(t *testing.T, db *sqlx.DB, batch int64) {
	t.Helper()
	var n, distinct int
	require.NoError(t, db.QueryRow(`SELECT count(*), count(DISTINCT id) FROM live`).Scan(&n, &distinct))
	require.Equal(t, 2000, n)
	require.Equal(t, n, distinct)
	var read, subRead int64
	var status string
	require.NoError(t, db.QueryRow(`SELECT status, rows_read, (SELECT sum(rows_read) FROM backfill.subchunks WHERE batch_id = $1)
		FROM backfill.chunks WHERE batch_id = $1 AND seq = 0`, batch).Scan(&status, &read, &subRead))
	require.Equal(t, "done", status)
	require.Equal(t, int64(2000), read)
	require.Equal(t, read, subRead)
}

// TestAdaptThrottleHoldsBetweenSubchunks: a throttle that begins to hold
// while a plan chunk is worked in sub-chunks stops the worker after the
// sub-chunk in flight commits: no sub-chunk more commits while it holds,
// and the worker keeps the plan chunk's lease; once the throttle
// releases, the same call goes on to the end of the chunk.
func TestAdaptThrottleHoldsBetweenSubchunks(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	sig := &fakeSignal{}
	var once sync.Once
	job := heavyLiveJob(db, func(ctx context.Context, batch int64, committed int) error {
		var err error
		if committed == 2 {
			once.Do(func() {
				// Raised while the third sub-chunk's transaction runs: it
				// commits, then the worker holds.
				sig.set(5)
				err = untilCtx(ctx, func() (bool, error) {
					var open int
					err := db.GetContext(ctx, &open, `SELECT count(*) FROM backfill.throttle_periods WHERE batch_id = $1 AND ended_at IS NULL`, batch)
					return open > 0, err
				})
			})
		}
		return err
	})
	r := throttleRunner(t, db, "w1", func(c *Config) {
		c.Concurrency, c.ChunkTarget, c.ChunkMaxRows = 1, time.Hour, 100
		c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3, Low: 1}}
	})
	res := goRun(t.Context(), r, job)
	var batch int64
	waitFor(t, "the hold after the third sub-chunk", func() bool {
		if db.Get(&batch, `SELECT batch_id FROM backfill.throttle_periods WHERE ended_at IS NULL`) != nil {
			return false
		}
		n, _, _ := subchunkState(t, db, batch)
		return n == 3
	})
	seen := sig.reads.Load()
	waitFor(t, "readings of the signal while it holds", func() bool { return sig.reads.Load() >= seen+5 })
	n, status, leased := subchunkState(t, db, batch)
	require.Equal(t, 3, n, "a sub-chunk committed while the throttle held")
	require.Equal(t, "pending", status)
	require.True(t, leased, "the worker keeps the plan chunk's lease while it holds")

	sig.set(0)
	out := testwait.Recv(t, "the run after the release", res)
	require.NoError(t, out.err)
	require.Equal(t, RunCompleted, out.rep.Status)
	requireHeavyLoaded(t, db, batch)
	n, _, _ = subchunkState(t, db, batch)
	require.Greater(t, n, 3)
	ps, err := r.caps.throttlePeriods.ThrottlePeriods(t.Context(), r.db, batch)
	require.NoError(t, err)
	require.Len(t, ps, 1)
	require.NotNil(t, ps[0].EndedAt)
}

// TestAdaptPauseFromSQLBetweenSubchunks: a pause from SQL while a plan
// chunk is worked in sub-chunks (with no throttle, whose monitor would
// read the control state too) stops the worker after the sub-chunk in
// flight commits: Run (ReturnOnPause) returns ErrRunPaused with the plan chunk pending
// and its three sub-chunks committed, and a resume finishes it from the
// fourth.
func TestAdaptPauseFromSQLBetweenSubchunks(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	var once sync.Once
	job := heavyLiveJob(db, func(ctx context.Context, batch int64, committed int) error {
		var err error
		if committed == 2 {
			once.Do(func() {
				_, err = db.ExecContext(ctx, `SELECT backfill.pause($1::bigint, 'ann', 'between sub-chunks')`, batch)
			})
		}
		return err
	})
	r := liveRunner(t, db, "w1", nil)
	r.cfg.Concurrency, r.cfg.ChunkTarget, r.cfg.ChunkMaxRows = 1, time.Hour, 100
	r.cfg.ReturnOnPause = true
	out := testwait.Recv(t, "the paused run", goRun(t.Context(), r, job))
	require.ErrorIs(t, out.err, ErrRunPaused)
	n, status, leased := subchunkState(t, db, out.rep.BatchID)
	require.Equal(t, 3, n, "the worker went on after the pause")
	require.Equal(t, "pending", status)
	require.False(t, leased)

	rep, err := r.Resume(t.Context(), job, "ann", "go on")
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	requireHeavyLoaded(t, db, rep.BatchID)
}

// untilCtx polls f every few milliseconds until it reports true, fails,
// or testwait.Timeout passes (an error then).
func untilCtx(ctx context.Context, f func() (bool, error)) error {
	deadline := time.Now().Add(testwait.Timeout)
	for {
		ok, err := f()
		if ok || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return errors.New("untilCtx: timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestAdaptStatusCountsCommittedSubchunks: while a plan chunk is worked
// in sub-chunks, and once it is left pending midway (the run paused),
// Status counts the rows of its committed sub-chunks (they are in the
// target), not only the chunks done; once the chunk is done its rows
// count once.
func TestAdaptStatusCountsCommittedSubchunks(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	var r *Runner
	var during Status
	var subRead int64
	var once sync.Once
	job := heavyLiveJob(db, func(ctx context.Context, batch int64, committed int) error {
		var err error
		switch committed {
		case 3:
			once.Do(func() {
				// From another session: the fourth sub-chunk's
				// transaction is not committed.
				if err = db.GetContext(ctx, &subRead, `SELECT sum(rows_read) FROM backfill.subchunks WHERE batch_id = $1`, batch); err != nil {
					return
				}
				during, err = r.StatusOf(ctx, batch)
			})
		case 5:
			_, err = db.ExecContext(ctx, `SELECT backfill.pause($1::bigint, 'ann', 'look at the status')`, batch)
		}
		return err
	})
	r = liveRunner(t, db, "w1", nil)
	r.cfg.Concurrency, r.cfg.ChunkTarget, r.cfg.ChunkMaxRows = 1, time.Hour, 100
	r.cfg.ReturnOnPause = true
	out := testwait.Recv(t, "the paused run", goRun(t.Context(), r, job))
	require.ErrorIs(t, out.err, ErrRunPaused)

	require.Positive(t, subRead)
	require.Zero(t, during.Chunks.Done)
	require.Equal(t, Counts{Read: subRead, Inserted: subRead}, during.Rows, "the committed sub-chunks of the chunk in progress")
	require.Equal(t, subRead, during.RowsProcessed)

	n, status, _ := subchunkState(t, db, out.rep.BatchID)
	require.Equal(t, 6, n)
	require.Equal(t, "pending", status)
	var read int64
	require.NoError(t, db.Get(&read, `SELECT sum(rows_read) FROM backfill.subchunks WHERE batch_id = $1`, out.rep.BatchID))
	paused, err := r.StatusOf(t.Context(), out.rep.BatchID)
	require.NoError(t, err)
	require.Equal(t, Counts{Read: read, Inserted: read}, paused.Rows, "the chunk left pending midway")
	require.Equal(t, read, paused.RowsProcessed)

	rep, err := r.Resume(t.Context(), job, "ann", "go on")
	require.NoError(t, err)
	requireHeavyLoaded(t, db, rep.BatchID)
	done, err := r.StatusOf(t.Context(), rep.BatchID)
	require.NoError(t, err)
	require.Equal(t, Counts{Read: 2000, Inserted: 2000}, done.Rows, "once done, counted once")
	require.Equal(t, int64(2000), done.RowsProcessed)
}
