package backfill

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/testwait"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// lockRetries is a retry table of n rows of (timeout, sleep).
func lockRetries(n int, timeout, sleep time.Duration) []LockRetry {
	rs := make([]LockRetry, n)
	for i := range rs {
		rs[i] = LockRetry{Timeout: timeout, Sleep: sleep}
	}
	return rs
}

// lockerConn is a session of its own, named application_name, with an
// open transaction that took lock on table live.
func lockerConn(t *testing.T, db *sqlx.DB, name, mode string) (*sqlx.Conn, int, func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Connx(ctx)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, `SELECT set_config('application_name', $1, false)`, name)
	require.NoError(t, err)
	var pid int
	require.NoError(t, conn.GetContext(ctx, &pid, `SELECT pg_backend_pid()`))
	_, err = conn.ExecContext(ctx, `BEGIN; LOCK TABLE live IN `+mode+` MODE`)
	require.NoError(t, err)
	var once sync.Once
	release := func() {
		once.Do(func() {
			_, _ = conn.ExecContext(ctx, `COMMIT`)
			_ = conn.Close()
		})
	}
	t.Cleanup(release)
	return conn, pid, release
}

// TestLockedTargetWaitsAreBoundedRecordedAndRetried: while a session
// holds ACCESS EXCLUSIVE on the target, each try of the blocked chunk
// ends at its lock_timeout (55P03) and is rolled back; the wait and its
// blocker (pid, application_name, query) are logged and recorded in the
// manifest's waits table; the waits do not count toward MaxAttempts (1
// here: a single failed attempt would fail the run), and the run
// completes once the lock is released.
func TestLockedTargetWaitsAreBoundedRecordedAndRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	var logs syncBuffer
	r := liveRunner(t, db, "w", &logs)
	r.cfg.MaxAttempts = 1
	r.cfg.LockRetries = lockRetries(50, 300*time.Millisecond, 20*time.Millisecond)

	var lockerPID int
	var release func()
	var once sync.Once
	done := goRun(ctx, r, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			// The chunk's merge comes after its extraction: the target
			// is locked when it gets there.
			once.Do(func() { _, lockerPID, release = lockerConn(t, db, "the-locker", "ACCESS EXCLUSIVE") })
		}
	}))
	require.Eventually(t, func() bool {
		var n int
		return db.Get(&n, `SELECT count(*) FROM backfill.waits WHERE blockers <> '[]'`) == nil && n >= 2
	}, 30*time.Second, 20*time.Millisecond, "the blocked chunk's tries are recorded with their blocker")
	release()
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)
	require.Equal(t, liveChunks, res.rep.ChunksDone)

	var attempts []int
	require.NoError(t, db.Select(&attempts, `SELECT attempts FROM backfill.chunks ORDER BY seq`))
	require.Equal(t, []int{1, 1, 1, 1, 1, 1}, attempts, "waits are not failed attempts")

	waits, err := r.caps.waits.Waits(ctx, db, res.rep.BatchID)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(waits), 2)
	// Chunk 0 is locked out first; the chunk its worker extracted ahead
	// (chunk 1) reaches the target while the lock is held too, and its
	// waits are its own: each chunk's tries are numbered from 1.
	named := 0
	tries := map[int]int{}
	for _, w := range waits {
		require.Equal(t, "55P03", w.SQLState, "a lock timeout")
		require.Equal(t, "300", w.LockTimeout, "each try waits at most its lock_timeout")
		require.LessOrEqual(t, w.Seq, 1, "chunk 0, or the chunk extracted ahead of it")
		require.Equal(t, 1, w.Attempt)
		tries[w.Seq]++
		require.Equal(t, tries[w.Seq], w.Try, "chunk %d's tries in order", w.Seq)
		require.False(t, w.Final)
		require.GreaterOrEqual(t, w.Waited, 250*time.Millisecond, "a wait recorded is a wait waited, about its lock_timeout")
		for _, b := range w.Blockers {
			if b.PID == lockerPID && b.ApplicationName == "the-locker" && strings.Contains(b.Query, "LOCK TABLE live IN ACCESS EXCLUSIVE MODE") {
				named++
			}
		}
	}
	require.GreaterOrEqual(t, named, 2, "the blocker is named: pid, application_name, query")
	var raw []byte
	require.NoError(t, db.Get(&raw, `SELECT blockers FROM backfill.waits WHERE blockers <> '[]' ORDER BY id LIMIT 1`))
	var bs []map[string]any
	require.NoError(t, json.Unmarshal(raw, &bs))
	require.Equal(t, "the-locker", bs[0]["application_name"])
	require.Contains(t, logs.String(), `"msg":"backfill: chunk waited; rolled back, retrying after a pause"`)
	require.Contains(t, logs.String(), `application_name \"the-locker\"`)
	require.Contains(t, logs.String(), `"sqlstate":"55P03"`)
}

// TestShortLockTimeoutStillNamesTheBlocker: a lock_timeout shorter than
// the watcher's first sample (it samples after half the timeout, and its
// query takes longer than that) still records and logs the session that
// holds the target's conflicting lock, for every wait.
func TestShortLockTimeoutStillNamesTheBlocker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	var logs syncBuffer
	r := liveRunner(t, db, "w", &logs)
	r.cfg.MaxAttempts = 1
	r.cfg.LockRetries = lockRetries(50, time.Millisecond, 10*time.Millisecond)

	var lockerPID int
	var release func()
	var once sync.Once
	done := goRun(ctx, r, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			once.Do(func() { _, lockerPID, release = lockerConn(t, db, "the-locker", "EXCLUSIVE") })
		}
	}))
	require.Eventually(t, func() bool {
		var n int
		return db.Get(&n, `SELECT count(*) FROM backfill.waits`) == nil && n >= 5
	}, 30*time.Second, 10*time.Millisecond, "the blocked chunk's tries are recorded")
	release()
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)

	waits, err := r.caps.waits.Waits(ctx, db, res.rep.BatchID)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(waits), 5)
	// The last wait may have ended as the lock was released.
	for _, w := range waits[:len(waits)-1] {
		require.Equal(t, "55P03", w.SQLState)
		// Named by the watcher (pg_blocking_pids, no mode) or, when the
		// wait ended before its sample, by the holder of the conflicting
		// lock (with its mode).
		var names []string
		for _, b := range w.Blockers {
			names = append(names, fmt.Sprintf("%d %s", b.PID, b.ApplicationName))
			if b.Mode != "" {
				require.Equal(t, "ExclusiveLock", b.Mode)
			}
		}
		require.Contains(t, names, fmt.Sprintf("%d the-locker", lockerPID), "try %d names no blocker: %+v", w.Try, w.Blockers)
	}
}

// TestApplicationQueuedBehindBackfillWaitsOnlyItsLockTimeout: a session
// holds SHARE on the target, so the chunk's merge (ROW EXCLUSIVE) waits;
// an application session that asks for SHARE too queues behind the
// backfill's waiting request (pg_blocking_pids names the backfill), and
// is granted while the first session still holds its lock: the
// backfill's request gave up at its lock_timeout instead of waiting for
// the holder. The run completes after the holder commits.
func TestApplicationQueuedBehindBackfillWaitsOnlyItsLockTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w", nil)
	r.cfg.MaxAttempts = 1
	r.cfg.LockRetries = lockRetries(200, time.Second, 20*time.Millisecond)

	var holderPID int
	var releaseHolder func()
	var once sync.Once
	locked := make(chan struct{})
	done := goRun(ctx, r, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			once.Do(func() {
				_, holderPID, releaseHolder = lockerConn(t, db, "holder", "SHARE")
				close(locked)
			})
		}
	}))
	<-locked

	queued := false
	for try := 0; try < 20 && !queued; try++ {
		// Wait until the backfill waits for its lock, then queue the
		// application's request.
		require.Eventually(t, func() bool {
			var n int
			return db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'backfill %' AND wait_event_type = 'Lock'`) == nil && n > 0
		}, 30*time.Second, 5*time.Millisecond)
		app, err := db.Connx(ctx)
		require.NoError(t, err)
		var appPID int
		require.NoError(t, app.GetContext(ctx, &appPID, `SELECT pg_backend_pid()`))
		granted := make(chan error, 1)
		go func() {
			_, err := app.ExecContext(ctx, `BEGIN; LOCK TABLE live IN SHARE MODE`)
			granted <- err
		}()
		// The application's request waits behind the backfill's.
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) && !queued {
			var blockedByBackfill bool
			err := db.Get(&blockedByBackfill, `SELECT EXISTS (SELECT 1 FROM unnest(pg_blocking_pids($1)) b(pid)
				JOIN pg_stat_activity a ON a.pid = b.pid WHERE a.application_name LIKE 'backfill %')`, appPID)
			require.NoError(t, err)
			queued = blockedByBackfill
			if len(granted) > 0 {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		// Granted (now or at the backfill's lock_timeout) while the
		// holder still holds SHARE.
		require.NoError(t, <-granted)
		var holderHolds bool
		require.NoError(t, db.Get(&holderHolds, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND relation = 'live'::regclass
			AND mode = 'ShareLock' AND granted)`, holderPID))
		require.True(t, holderHolds, "the application was granted before the holder let go")
		_, err = app.ExecContext(ctx, `COMMIT`)
		require.NoError(t, err)
		require.NoError(t, app.Close())
	}
	require.True(t, queued, "the application's request queued behind the backfill's")
	releaseHolder()
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)
}

// TestStatementTimeoutOfMergeRetried: Config.StatementTimeout bounds the
// merge's statements (a trigger that sleeps past it, twice), not the
// extractor (which sleeps past it too); each timed-out try is retried as
// a wait (57014) without counting toward MaxAttempts (1) and recorded,
// and the run completes.
func TestStatementTimeoutOfMergeRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	_, err := db.Exec(`CREATE SEQUENCE slow;
		CREATE FUNCTION slow_twice() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('slow') <= 2 THEN PERFORM pg_sleep(2); END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER slow_twice AFTER INSERT ON live FOR EACH STATEMENT EXECUTE FUNCTION slow_twice()`)
	require.NoError(t, err)
	r := liveRunner(t, db, "w", nil)
	r.cfg.MaxAttempts = 1
	r.cfg.StatementTimeout = 300 * time.Millisecond
	r.cfg.LockRetries = lockRetries(5, time.Second, 10*time.Millisecond)
	job := liveJob(func(c Chunk) {
		if c.Seq == 0 {
			time.Sleep(600 * time.Millisecond) // twice the statement_timeout
		}
	})
	job.Chunker = IntRange(0, 20, 10)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	waits, err := r.caps.waits.Waits(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, waits, 2)
	for _, w := range waits {
		require.Equal(t, "57014", w.SQLState)
		require.Equal(t, "300", w.StatementTimeout)
	}
	var attempts []int
	require.NoError(t, db.Select(&attempts, `SELECT attempts FROM backfill.chunks ORDER BY seq`))
	require.Equal(t, []int{1, 1}, attempts)
}

// TestLockRetriesExhaustedFailsTheAttempt: a wait on the retry table's
// last row ends the attempt as failed (recorded final); with MaxAttempts
// 1 the chunk fails for good, naming the lock timeout.
func TestLockRetriesExhaustedFailsTheAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w", nil)
	r.cfg.MaxAttempts = 1
	r.cfg.LockRetries = lockRetries(2, 100*time.Millisecond, 10*time.Millisecond)
	var once sync.Once
	rep, err := r.Run(ctx, liveJob(func(c Chunk) {
		once.Do(func() { lockerConn(t, db, "locker", "ACCESS EXCLUSIVE") })
	}))
	require.Error(t, err)
	require.Contains(t, err.Error(), "lock timeout")
	require.Equal(t, RunFailed, rep.Status)
	waits, err := r.caps.waits.Waits(ctx, db, rep.BatchID)
	require.NoError(t, err)
	// Chunk 0's attempt: two tries, the last final. The chunk its worker
	// extracted ahead (chunk 1) reaches the target between them, while
	// the lock is still held: one wait of its own, not final, as the run
	// stops at chunk 0's failure before chunk 1 is tried again.
	var first []backfilltype.Wait
	for _, w := range waits {
		require.LessOrEqual(t, w.Seq, 1, "chunk 0, or the chunk extracted ahead of it")
		require.GreaterOrEqual(t, w.Waited, 80*time.Millisecond, "a wait recorded is a wait waited, about its lock_timeout")
		if w.Seq == 0 {
			first = append(first, w)
		} else {
			require.Equal(t, 1, w.Try)
			require.False(t, w.Final)
		}
	}
	require.LessOrEqual(t, len(waits), 3)
	require.Len(t, first, 2)
	require.Equal(t, []int{1, 2}, []int{first[0].Try, first[1].Try})
	require.False(t, first[0].Final)
	require.True(t, first[1].Final)
}

// TestManifestTxSetsTimeouts: the short manifest transactions run under
// the Runner's lock_timeout and statement_timeout, set locally.
func TestManifestTxSetsTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r, err := New(db, &Config{LockTimeout: 1500 * time.Millisecond, StatementTimeout: 7 * time.Second})
	require.NoError(t, err)
	var got struct {
		Lock string `db:"lock"`
		Stmt string `db:"stmt"`
	}
	require.NoError(t, pgstore.InShortTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		return sqlx.GetContext(ctx, tx, &got, `SELECT current_setting('lock_timeout') AS lock, current_setting('statement_timeout') AS stmt`)
	}))
	require.Equal(t, "1500ms", got.Lock)
	require.Equal(t, "7s", got.Stmt)
	var after string
	require.NoError(t, db.Get(&after, `SELECT current_setting('lock_timeout')`))
	require.Equal(t, "0", after, "local to the transaction")
	_, err = New(db, &Config{LockRetries: []LockRetry{}})
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = New(db, &Config{LockRetries: []LockRetry{{Timeout: -1}}})
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// TestLockRetryWithoutTimeoutIsBoundedByLockTimeout: a LockRetries row
// without a Timeout waits at most Config.LockTimeout (it does not turn
// lock_timeout off).
func TestLockRetryWithoutTimeoutIsBoundedByLockTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r, err := New(db, &Config{WorkerID: "w", MaxAttempts: 1, LockTimeout: 300 * time.Millisecond,
		LockRetries: []LockRetry{{Sleep: 20 * time.Millisecond}, {Sleep: 20 * time.Millisecond}, {Sleep: 20 * time.Millisecond}}})
	require.NoError(t, err)
	_, _, release := lockerConn(t, db, "the-locker", "ACCESS EXCLUSIVE")
	done := goRun(ctx, r, liveJob(nil))
	require.Eventually(t, func() bool {
		var n int
		return db.Get(&n, `SELECT count(*) FROM backfill.waits`) == nil && n >= 1
	}, 30*time.Second, 10*time.Millisecond, "no try timed out: a row without Timeout waited without a bound")
	release()
	<-done
	var timeouts []string
	require.NoError(t, db.Select(&timeouts, `SELECT DISTINCT lock_timeout FROM backfill.waits`))
	require.Equal(t, []string{"300"}, timeouts)
}

// TestRollbackLockWaitsAreBoundedAndNamed: a rollback while another
// session holds ACCESS EXCLUSIVE on the target waits at most
// LockTimeout per try (pg_locks.waitstart, sampled), logs each wait with
// the session holding the lock, and completes once the lock is released.
func TestRollbackLockWaitsAreBoundedAndNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	var logs syncBuffer
	r, err := New(db, &Config{WorkerID: "w", Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		LockTimeout: 200 * time.Millisecond, LockRetries: lockRetries(50, 200*time.Millisecond, 20*time.Millisecond)})
	require.NoError(t, err)
	job := liveJob(nil)
	job.Rollback = RollbackUndoLog
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)

	_, lockerPID, release := lockerConn(t, db, "the-locker", "ACCESS EXCLUSIVE")
	var worst atomic.Int64 // ms
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			// The waits in this test's database: the server is shared
			// with parallel tests, whose sessions may wait longer.
			var ms int64
			if db.Get(&ms, `SELECT coalesce(max(extract(epoch FROM now() - waitstart) * 1000), 0)::bigint FROM pg_locks
				WHERE NOT granted AND pid <> $1 AND waitstart IS NOT NULL
				AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, lockerPID) == nil && ms > worst.Load() {
				worst.Store(ms)
			}
		}
	}()
	done := make(chan error, 1)
	go func() {
		_, err := r.Rollback(ctx, job, RollbackOptions{BatchID: rep.BatchID, Actor: "t", Why: "bounded waits"})
		done <- err
	}()
	// Several tries, each logged.
	testwait.Until(t, "three logged waits of the rollback behind the locker", func() bool {
		return strings.Count(logs.String(), "a transaction of the library waited") >= 3
	})
	release()
	require.NoError(t, <-done)
	close(stop)
	<-sampled
	require.Less(t, worst.Load(), int64(1000), "a rollback statement waited far longer than LockTimeout (200 ms)")
	require.Contains(t, logs.String(), `application_name \"the-locker\"`)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Zero(t, n, "the rollback did not complete")
}
