package backfill

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/internal/testwait"
	"github.com/stretchr/testify/require"
)

// waitingRunner is a Runner with the default Config (Run waits while its
// run is paused), polling its control state every 50 ms and logging to
// logs.
func waitingRunner(t *testing.T, db *sqlx.DB, logs *syncBuffer) *Runner {
	r := liveRunner(t, db, "w1", logs)
	r.cfg.ThrottleInterval = 50 * time.Millisecond
	return r
}

// waitWaiting waits until the call on ch logs that it waits, with every
// text of says in the log; a call that returns meanwhile fails the test.
func waitWaiting(t *testing.T, logs *syncBuffer, ch <-chan runResult, says ...string) {
	t.Helper()
	testwait.Until(t, fmt.Sprintf("the call logs that it waits, with %q", says), func() bool {
		select {
		case res := <-ch:
			t.Fatalf("Run returned instead of waiting: %v", res.err)
		default:
		}
		out := logs.String()
		for _, s := range says {
			if !strings.Contains(out, s) {
				return false
			}
		}
		return true
	})
}

// requireLiveLoadedOnce checks that the call's run completed with every
// chunk done, each id of [0, 60) in table live once (but rejected), and
// the call's counts balanced.
func requireLiveLoadedOnce(t *testing.T, db *sqlx.DB, res runResult, rejected int64) {
	t.Helper()
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)
	require.Equal(t, map[string]int{"done": liveChunks}, chunkStatuses(t, db))
	var rows struct {
		N        int64 `db:"n"`
		Distinct int64 `db:"d"`
	}
	require.NoError(t, db.Get(&rows, `SELECT count(*) AS n, count(DISTINCT id) AS d FROM live`))
	require.Equal(t, 10*liveChunks-rejected, rows.N)
	require.Equal(t, rows.N, rows.Distinct)
	c := res.rep.Counts
	require.True(t, c.Balanced(), "counts balanced: %+v", c)
	require.EqualValues(t, 10*liveChunks, c.Read, "every row read once: %+v", c)
	require.Equal(t, 10*liveChunks-rejected, c.Inserted)
	require.Equal(t, rejected, c.Rejected)
}

// TestRunWaitsWhilePausedFromSQL: Run with the default Config, whose run
// is paused from SQL while a chunk is in flight, does not return: it
// stays a registered worker of the run and logs once who paused it, why,
// and the SQL that resumes it; resumed from SQL, it works the run to the
// end, every row loaded once.
func TestRunWaitsWhilePausedFromSQL(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	logs := &syncBuffer{}
	r := waitingRunner(t, db, logs)
	var once sync.Once
	ch := goRun(context.Background(), r, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			once.Do(func() {
				_, err := db.Exec(`SELECT backfill.pause('live', 'ann', 'replica lag')`)
				require.NoError(t, err)
			})
		}
	}))
	batch := waitPausedIdle(t, db, 1, ch)
	waitWaiting(t, logs, ch, "this worker waits for it to be resumed", "paused by ann: replica lag",
		fmt.Sprintf("SELECT backfill.resume(%d, 'ACTOR', 'WHY')", batch))
	require.Equal(t, 1, strings.Count(logs.String(), "this worker waits for it to be resumed"), "logged once")
	testwait.Until(t, "the waiting call is a registered worker", func() bool {
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.workers WHERE worker_id = 'w1' AND finished_at IS NULL`))
		return n == 1
	})

	_, err := db.Exec(`SELECT backfill.resume($1::bigint, 'ann', 'lag is fine')`, batch)
	require.NoError(t, err)
	requireLiveLoadedOnce(t, db, testwait.Recv(t, "the run's end after the resume", ch), 0)
}

// TestRunWaitingCancelledFromSQL: a Run waiting while its run is paused
// returns an error wrapping ErrRunCancelled when the run is cancelled from
// SQL; no chunk is left leased.
func TestRunWaitingCancelledFromSQL(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	logs := &syncBuffer{}
	r := waitingRunner(t, db, logs)
	var once sync.Once
	ch := goRun(context.Background(), r, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			once.Do(func() {
				_, err := db.Exec(`SELECT backfill.pause('live', 'ann', 'maintenance')`)
				require.NoError(t, err)
			})
		}
	}))
	batch := waitPausedIdle(t, db, 1, ch)
	waitWaiting(t, logs, ch, "this worker waits for it to be resumed")

	_, err := db.Exec(`SELECT backfill.cancel($1::bigint, 'ann', 'wrong scope')`, batch)
	require.NoError(t, err)
	res := testwait.Recv(t, "the waiting call's end after the cancel", ch)
	require.ErrorIs(t, res.err, ErrRunCancelled)
	require.Equal(t, RunCancelled, res.rep.Status)
	var leased int
	require.NoError(t, db.Get(&leased, `SELECT count(*) FROM backfill.chunks WHERE lease_key IS NOT NULL`))
	require.Zero(t, leased)
}

// TestRunWaitsOnItsOwnGates: Run with the default Config whose own chunk
// fails a gate (the run reject gate; a quality gate) waits, logging the
// gate's reason and how to resume, rather than return ErrGateFailed; the
// SQL function resume accepts the rejects so far (the reject gate) or
// lets the failed chunk be tried again (the quality gate), and the same
// call works the run to the end.
func TestRunWaitsOnItsOwnGates(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		says     string // in the log of the wait
		rejected int64
		job      func() Job
	}{
		{"run_reject_gate", "rejected", 10, func() Job {
			job := liveJob(nil)
			job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
				for id := c.Lo; id < c.Hi; id++ {
					var err error
					if c.Seq == 1 {
						err = w.Reject(ctx, map[string]any{"id": id}, "v", "unreadable v")
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
		}},
		{"quality_gate", "no_chunk_2_yet", 0, func() Job {
			job := liveJob(nil)
			var failed atomic.Bool
			job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
				pass := s.Chunk.Lo != 20 || !failed.CompareAndSwap(false, true)
				return CheckResult{Check: "no_chunk_2_yet", Severity: SeverityError, Passed: pass, Expected: "pass", Actual: fmt.Sprint(pass)}, nil
			})}
			return job
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := liveDB(t)
			logs := &syncBuffer{}
			r := waitingRunner(t, db, logs)
			ch := goRun(context.Background(), r, tc.job())
			batch := waitPausedIdle(t, db, 1, ch)
			waitWaiting(t, logs, ch, "this worker waits for it to be resumed", tc.says,
				fmt.Sprintf("SELECT backfill.resume(%d, 'ACTOR', 'WHY')", batch))

			_, err := db.Exec(`SELECT backfill.resume($1::bigint, 'ann', 'accepted')`, batch)
			require.NoError(t, err)
			requireLiveLoadedOnce(t, db, testwait.Recv(t, "the run's end after the resume", ch), tc.rejected)
		})
	}
}

// TestRunWaitsForApproval: Run with the default Config on a run awaiting
// approval waits, logging what is missing and the SQL that approves;
// approved from SQL, the same call works the run to the end.
func TestRunWaitsForApproval(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	logs := &syncBuffer{}
	r := waitingRunner(t, db, logs)
	job := liveJob(nil)
	job.Approval = ApprovalPolicy{Approvers: 1, AuthorMayApprove: true}
	ch := goRun(context.Background(), r, job)
	waitWaiting(t, logs, ch, "run awaits approval: this call waits for it", "0 of 1 approvals", "backfill.approve(")
	var run struct {
		Batch       int64  `db:"batch_id"`
		Fingerprint string `db:"plan_fingerprint"`
		Status      string `db:"status"`
	}
	require.NoError(t, db.Get(&run, `SELECT batch_id, plan_fingerprint, status FROM backfill.runs WHERE job_name = 'live'`))
	require.Equal(t, string(RunAwaitingApproval), run.Status)
	require.Equal(t, map[string]int{"pending": liveChunks}, chunkStatuses(t, db), "nothing leased")

	_, err := db.Exec(`SELECT backfill.approve($1::bigint, $2, 'alice', 'blueprint reviewed')`, run.Batch, run.Fingerprint)
	require.NoError(t, err)
	requireLiveLoadedOnce(t, db, testwait.Recv(t, "the run's end after the approval", ch), 0)
}
