package backfill

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/testwait"
	"github.com/stretchr/testify/require"
)

// logRecords returns the JSON log records of logs whose msg is msg.
func logRecords(t *testing.T, logs, msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(logs, "\n") {
		var rec map[string]any
		if line == "" || json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// TestFrozenKeyLockHolderIsFenced: a worker frozen between its chunk's
// merge and its commit (its validator blocks in the process, its
// heartbeats stop) holds the merge's key locks. Another worker, whose
// chunk (of another job) merges the same keys, logs its wait with the
// holder, fences the holder once its heartbeat is stale (terminates its
// backend), records the wait, and completes.
func TestFrozenKeyLockHolderIsFenced(t *testing.T) {
	// Not parallel: it sets the heartbeat hook of the package.
	ctx := context.Background()
	db := liveDB(t)
	thawFrozen := freezeBetweenMergeAndCommit(t, db)
	defer thawFrozen()

	var logs syncBuffer
	b := liveRunner(t, db, "healthy", &logs)
	jb := liveJob(nil)
	jb.Name, jb.Chunker = "healthy-keys", IntRange(0, 10, 10)
	rb := <-goRun(ctx, b, jb)
	require.NoError(t, rb.err)
	require.Equal(t, RunCompleted, rb.rep.Status)
	require.Equal(t, 1, rb.rep.ChunksRun)
	t.Logf("longest wait of the healthy worker behind the frozen key lock holder: %v (StaleAfter %v, HeartbeatInterval %v)",
		longestWait(t, logs.String()), b.cfg.StaleAfter, b.cfg.HeartbeatInterval)

	fenced := logRecords(t, logs.String(), "backfill: fenced a stale worker: terminated the backend holding a lock this transaction waits for; its transaction rolls back")
	require.Len(t, fenced, 1, "the healthy worker fenced the frozen one once: %s", logs.String())
	require.Equal(t, "frozen", fenced[0]["holder"])
	require.Equal(t, "key locks of public.live", fenced[0]["what"])
	require.Contains(t, fenced[0], "holder_heartbeat_age")
	require.NotEmpty(t, logRecords(t, logs.String(), "backfill: lock granted after waiting"))

	var waits []struct {
		Message  string `db:"message"`
		Blockers string `db:"blockers"`
	}
	require.NoError(t, db.Select(&waits, `SELECT message, blockers::text AS blockers FROM backfill.waits WHERE batch_id = $1`, rb.rep.BatchID))
	require.Len(t, waits, 1, "the wait is recorded")
	require.Equal(t, "waited for the key locks of public.live; granted", waits[0].Message)
	require.Contains(t, waits[0].Blockers, `"stale worker, fenced"`)

	var vs []string
	require.NoError(t, db.Select(&vs, `SELECT DISTINCT w.worker_id FROM backfill.chunks c JOIN backfill.workers w ON w.batch_id = c.batch_id
		WHERE c.batch_id = $1 AND c.status = 'done'`, rb.rep.BatchID))
	require.Equal(t, []string{"healthy"}, vs)

	// The frozen worker, thawed, finds its chunk's transaction gone.
	thawFrozen()
}

// freezeBetweenMergeAndCommit runs worker "frozen" on job frozen-keys,
// which loads ids [0, 10) into table live, and returns once the worker
// is frozen between its chunk's merge and its commit: its validator
// blocks in the process and its heartbeats stop, so its chunk's
// transaction holds the merge's key locks, idle. thaw (idempotent)
// lets it go on and waits for its run to return. Not for parallel
// tests: it sets the heartbeat hook of the package.
func freezeBetweenMergeAndCommit(t *testing.T, db *sqlx.DB) (thaw func()) {
	freeze, _ := heartbeatsOff(t, "frozen")
	merged, thawed := make(chan struct{}), make(chan struct{})
	var mergedOnce sync.Once
	j := liveJob(nil)
	j.Name, j.Chunker = "frozen-keys", IntRange(0, 10, 10)
	j.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		mergedOnce.Do(func() {
			freeze(true)
			close(merged)
			<-thawed
		})
		return CheckResult{Check: "frozen", Severity: SeverityError, Passed: true, Expected: "ok", Actual: "ok"}, nil
	})}
	done := goRun(context.Background(), liveRunner(t, db, "frozen", nil), j)
	testwait.Recv(t, "the frozen worker's merge", merged)
	var once sync.Once
	return func() {
		once.Do(func() {
			freeze(false)
			close(thawed)
			<-done
			testHeartbeatsOff.Store(nil)
		})
	}
}

// TestRollbackFencesFrozenMergeLockHolder: a rollback waits for the
// merges into its target (the whole-target merge lock); one frozen
// between its merge and its commit is fenced once its worker is stale,
// with a log line naming it, and the rollback completes.
func TestRollbackFencesFrozenMergeLockHolder(t *testing.T) {
	// Not parallel: freezeBetweenMergeAndCommit.
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	var logs syncBuffer
	r := liveRunner(t, db, "rb", &logs)
	job := liveJob(nil)
	job.Rollback = RollbackUndoLog
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)

	thaw := freezeBetweenMergeAndCommit(t, db)
	defer thaw()
	rctx, cancel := context.WithTimeout(ctx, testwait.Timeout)
	defer cancel()
	_, err = r.Rollback(rctx, job, RollbackOptions{BatchID: rep.BatchID, Actor: "t", Why: "fence the frozen merge"})
	require.NoError(t, err)
	fenced := logRecords(t, logs.String(), "backfill: fenced a stale worker: terminated the backend holding a lock this transaction waits for; its transaction rolls back")
	require.Len(t, fenced, 1, "the rollback fenced the frozen worker once: %s", logs.String())
	require.Equal(t, "frozen", fenced[0]["holder"])
	require.Equal(t, "merge lock of public.live (rollback)", fenced[0]["what"])
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Zero(t, n, "the rollback deleted the batch's rows, and the frozen merge did not commit")
}

// TestKeyLockHeldByOperatorIsALockWait: a session that is no worker
// (an operator's) holding the merge's whole-target lock is a lock wait
// like any other: the chunk's try ends at its lock_timeout, rolls back,
// is recorded and retried by Config.LockRetries, and the chunk merges
// once the session lets go.
func TestKeyLockHeldByOperatorIsALockWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	op, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = op.Rollback() }()
	_, err = op.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1::int, $2::int)`, pgstore.LockNamespace("public.live"), pgstore.WholeTarget)
	require.NoError(t, err)

	var logs syncBuffer
	r := liveRunner(t, db, "w", &logs)
	r.cfg.LockRetries = []LockRetry{{Timeout: 200e6, Sleep: 10e6}, {Timeout: 200e6, Sleep: 10e6}, {Timeout: 200e6, Sleep: 10e6},
		{Timeout: 200e6, Sleep: 10e6}, {Timeout: 200e6, Sleep: 10e6}, {Timeout: 200e6, Sleep: 10e6}}
	j := liveJob(nil)
	j.Chunker = IntRange(0, 10, 10)
	done := goRun(ctx, r, j)
	testwait.Until(t, "a recorded wait of the chunk behind the operator's lock", func() bool {
		var n int
		// An error: the manifest not created yet.
		return db.Get(&n, `SELECT count(*) FROM backfill.waits WHERE sqlstate = '55P03' AND NOT final`) == nil && n > 0
	})
	require.NotEmpty(t, logRecords(t, logs.String(), "backfill: waiting for a lock held by a session that is not a backfill worker"))
	require.NoError(t, op.Rollback())
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)
}

// TestNamedLockWaitNamesItsHolder: a named advisory lock of the library
// (here the stage lock of a publish at the end) is waited for in steps,
// each reported to the context's LockWaiting with the session that holds
// it (LockHolders finds it by the lock's name), and taken once that
// session lets go.
func TestNamedLockWaitNamesItsHolder(t *testing.T) {
	t.Parallel()
	ctx := testwait.Context(t, "the stage lock")
	db := pgtest.New(t)
	m := NewPGManifest("")
	require.NoError(t, m.Migrate(ctx, db))
	const table = `"public"."stage_9"`
	holder, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback() }()
	var holderPID int
	require.NoError(t, holder.Get(&holderPID, `SELECT pg_backend_pid() FROM (SELECT pg_advisory_xact_lock(hashtextextended('backfill.stage:' || $1, 0))) x`, table))

	var steps []pgstore.LockWait
	var seen [][]int
	lw := pgstore.LockWaiting{Step: 50 * time.Millisecond, Wait: func(ctx context.Context, w pgstore.LockWait) bool {
		steps = append(steps, w)
		if w.Done {
			return true
		}
		hs, err := m.LockHolders(ctx, db, w, "", time.Second, true)
		require.NoError(t, err)
		var pids []int
		for _, h := range hs {
			pids = append(pids, h.PID)
			require.False(t, h.Terminated, "a session that is no worker is not fenced")
		}
		seen = append(seen, pids)
		if len(pids) > 0 {
			require.NoError(t, holder.Rollback())
		}
		return true
	}}
	info := TableInfo{Columns: []Column{{Name: "id", Type: "bigint"}}}
	require.NoError(t, (&pgstore.Merger{}).CreateStaging(pgstore.WithLockWaiting(ctx, lw), pgstore.PGDB{DB: db}, table, info))
	require.NotEmpty(t, seen, "the wait was reported")
	require.Equal(t, []int{holderPID}, seen[0], "the holder of the stage lock, found by its name")
	require.True(t, steps[len(steps)-1].Done, "the last report: the lock was granted")
	require.Equal(t, "stage lock of "+table, steps[0].What)
}
