package backfill

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/internal/testwait"
	"github.com/stretchr/testify/require"
)

// workUntilPausedByItself runs Work on job in the background, waits for
// the run to be paused by the library itself (a gate of the worker's own
// chunk) with no chunk in flight, checks that Work keeps running as an
// unfinished worker of the run, resumes it from SQL as an operator and
// returns Work's exit code.
func workUntilPausedByItself(t *testing.T, db *sqlx.DB, r *Runner, job Job, done int) ExitCode {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	codes := make(chan ExitCode, 1)
	go func() { codes <- Work(ctx, r, job) }()
	batch := waitPausedIdle(t, db, done, codes)
	// The pausing worker waits as a registered worker of the run, without
	// returning.
	testwait.Until(t, "the worker whose chunk paused the run waits as a registered worker", func() bool {
		select {
		case code := <-codes:
			t.Fatalf("Work returned %d when its own chunk paused the run, instead of waiting for the resume", code)
		default:
		}
		var unfinished int
		require.NoError(t, db.Get(&unfinished, `SELECT count(*) FROM backfill.workers WHERE batch_id = $1 AND finished_at IS NULL`, batch))
		return unfinished == 1
	})
	_, err := db.Exec(`SELECT backfill.resume($1::bigint, 'ann', 'ok')`, batch)
	require.NoError(t, err)
	return testwait.Recv(t, "Work's exit code after the resume", codes)
}

// requireOwnPauseLogged checks that the worker logged that it waits for
// the resume of the pause its own chunk made, not a pause found meanwhile.
func requireOwnPauseLogged(t *testing.T, logs *syncBuffer) {
	t.Helper()
	out := logs.String()
	require.Contains(t, out, "run paused while this call worked: this worker waits for it to be resumed")
	require.NotContains(t, out, `"reason":"paused meanwhile"`)
}

// TestWorkWaitsAfterItsOwnQualityGate: the worker (Work) whose chunk fails
// a quality gate pauses the run and waits for the resume in the same call;
// resumed from SQL, it works the run to the end and returns ExitDone.
func TestWorkWaitsAfterItsOwnQualityGate(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	logs := &syncBuffer{}
	r := liveRunner(t, db, "w1", logs)
	r.cfg.ThrottleInterval = 50 * time.Millisecond
	r.cfg.Concurrency = 1
	job := liveJob(nil)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker log:\n%s", logs.String())
		}
	})
	var tripped atomic.Bool
	job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc ValidationScope) (CheckResult, error) {
		failed := sc.Chunk.Seq == 2 && tripped.CompareAndSwap(false, true)
		return CheckResult{Check: "once", Severity: SeverityError, Passed: !failed, Expected: "pass", Actual: fmt.Sprint("failed: ", failed)}, nil
	})}
	require.Equal(t, ExitDone, workUntilPausedByItself(t, db, r, job, 2))
	require.Equal(t, map[string]int{"done": liveChunks}, chunkStatuses(t, db))
	requireOwnPauseLogged(t, logs)
}

// TestWorkWaitsAfterItsOwnRejectGate: the worker (Work) whose chunk
// trips the run reject gate (Job.MaxRunRejectRate) pauses the run and
// waits for the resume in the same call; resumed from SQL, it works the
// run to the end and returns ExitDone.
func TestWorkWaitsAfterItsOwnRejectGate(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	logs := &syncBuffer{}
	r := liveRunner(t, db, "w1", logs)
	r.cfg.ThrottleInterval = 50 * time.Millisecond
	r.cfg.Concurrency = 1
	job := liveJob(nil)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker log:\n%s", logs.String())
		}
	})
	inner := job.Extractor
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		if c.Seq != 0 {
			return inner.Extract(ctx, c, w)
		}
		// The first chunk rejects every row but one.
		for id := c.Lo; id < c.Hi; id++ {
			var err error
			if id == c.Lo {
				err = w.Write(ctx, id, fmt.Sprint("v", id))
			} else {
				err = w.Reject(ctx, id, "v", "bad source row")
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	require.Equal(t, ExitDone, workUntilPausedByItself(t, db, r, job, 1))
	require.Equal(t, map[string]int{"done": liveChunks}, chunkStatuses(t, db))
	requireOwnPauseLogged(t, logs)
}

// TestStoppedWhilePausedSaysSo: a call that waits while its run is paused
// (Run's default, as Work does) and whose context then ends
// returns ErrRunPaused with the context's error, saying that it stopped
// while the run was paused and how to resume the run; not a hint to wait,
// which it did.
func TestStoppedWhilePausedSaysSo(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	logs := &syncBuffer{}
	r, err := New(db, &Config{WorkerID: "w", HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var paused atomic.Bool
	done := goRun(ctx, r, liveJob(func(c Chunk) {
		if c.Seq == 2 && paused.CompareAndSwap(false, true) {
			_, err := db.Exec(`SELECT backfill.pause((SELECT max(batch_id) FROM backfill.runs), 'ann', 'maintenance')`)
			require.NoError(t, err)
		}
	}))
	testwait.Until(t, "the call waits while the run is paused", func() bool {
		return strings.Contains(logs.String(), "backfill: run paused: this worker waits for it to be resumed")
	})
	cancel()
	res := testwait.Recv(t, "the call's result once its context ended", done)
	require.ErrorIs(t, res.err, ErrRunPaused)
	require.ErrorIs(t, res.err, context.Canceled)
	require.Contains(t, res.err.Error(), "this call waited while the run was paused and stopped as its context ended (context canceled); the run stays paused: resume it with SELECT")
	require.NotContains(t, res.err.Error(), "ReturnOnPause")
}

// TestDrainFinishesChunksInFlight: Drain stops a worker from claiming
// chunks; the chunk in flight (held in its extraction when Drain is
// called) is merged and checkpointed, nothing else is leased, and Work
// returns ExitTempFail with the run running, which another worker then
// completes. A worker that waits while the run is paused returns at once.
func TestDrainFinishesChunksInFlight(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	codes := make(chan ExitCode, 1)
	go func() {
		codes <- Work(context.Background(), r, liveJob(func(c Chunk) {
			if c.Seq == 2 {
				once.Do(func() { close(inFlight); <-release })
			}
		}))
	}()
	testwait.Recv(t, "chunk 2 in flight", inFlight)
	r.Drain()
	r.Drain() // idempotent
	close(release)
	require.Equal(t, ExitTempFail, testwait.Recv(t, "Work's exit code after Drain", codes))
	st := chunkStatuses(t, db)
	require.Equal(t, 3, st["done"], "the chunk in flight finished: %v", st)
	require.Equal(t, liveChunks-3, st["pending"], "%v", st)
	var leased int
	require.NoError(t, db.Get(&leased, `SELECT count(*) FROM backfill.chunks WHERE lease_key IS NOT NULL`))
	require.Zero(t, leased, "nothing stays leased")
	var status string
	require.NoError(t, db.Get(&status, `SELECT status FROM backfill.runs`))
	require.Equal(t, "running", status)

	// Another worker completes the run; a drained one claims nothing.
	rep, err := r.Run(context.Background(), liveJob(nil))
	require.ErrorIs(t, err, ErrRunIncomplete)
	require.Zero(t, rep.ChunksRun)
	r2 := liveRunner(t, db, "w2", nil)
	require.Equal(t, ExitDone, Work(context.Background(), r2, liveJob(nil)))

	// A worker waiting while a run is paused returns when drained.
	db2 := liveDB(t)
	r3 := liveRunner(t, db2, "w3", nil)
	var paused sync.Once
	var pausedDone atomic.Bool
	go func() {
		codes <- Work(context.Background(), r3, liveJob(func(c Chunk) {
			if c.Seq == 1 {
				paused.Do(func() {
					_, err := db2.Exec(`SELECT backfill.pause((SELECT max(batch_id) FROM backfill.runs), 'ann', 'maintenance')`)
					require.NoError(t, err)
					pausedDone.Store(true)
				})
			}
		}))
	}()
	testwait.Until(t, "the run is paused", pausedDone.Load)
	testwait.Until(t, "the worker waits while the run is paused", func() bool {
		var n int
		require.NoError(t, db2.Get(&n, `SELECT count(*) FROM backfill.runs r WHERE r.status = 'paused'
			AND NOT EXISTS (SELECT 1 FROM backfill.chunks c WHERE c.batch_id = r.batch_id AND c.lease_key IS NOT NULL)`))
		return n == 1
	})
	r3.Drain()
	require.Equal(t, ExitTempFail, testwait.Recv(t, "the paused worker's exit code after Drain", codes))
}
