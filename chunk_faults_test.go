package backfill

import (
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/testwait"
)

// terminatingValidator returns a validator that, while cut says so for
// the chunk, terminates the backend of the chunk's transaction from
// another connection of db and waits until it is gone: the chunk's next
// statement (the validation's record, after the queued savepoints) finds
// its connection lost. Each cut is counted in cuts.
func terminatingValidator(t *testing.T, db *sqlx.DB, cut func(c Chunk) bool, cuts *atomic.Int64) Validator {
	return ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		ok := CheckResult{Check: "cut", Severity: SeverityError, Passed: true, Expected: "ok", Actual: "ok"}
		if !cut(s.Chunk) {
			return ok, nil
		}
		var pid int
		if err := sqlx.GetContext(ctx, tx, &pid, `SELECT pg_backend_pid()`); err != nil {
			return CheckResult{}, err
		}
		if _, err := db.ExecContext(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			return CheckResult{}, err
		}
		testwait.Until(t, "the chunk's backend terminated", func() bool {
			var n int
			return db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) == nil && n == 0
		})
		cuts.Add(1)
		return ok, nil
	})
}

// faultLines returns the log records (JSON) whose msg is msg.
func faultLines(t *testing.T, logs, msg string) []map[string]any {
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

const chunkFaultMsg = "backfill: chunk's connection to the server was lost; rolled back, retrying after a pause (not counted toward MaxAttempts)"

// TestChunkConnectionFaultsAreNotAttempts: a chunk whose transaction
// loses its backend more times than MaxAttempts (terminated while its
// validator runs) is retried after each fault, under the same attempt,
// and completes: every row once, balanced counts, one attempt recorded;
// each fault is logged at WARN with the chunk, attempt, SQLSTATE and
// sleep, and its error says the connection was lost without the queued
// statements' SQL.
func TestChunkConnectionFaultsAreNotAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	var logs syncBuffer
	r, err := New(db, &Config{WorkerID: "w", HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 30 * time.Second,
		RetryBackoff: 10 * time.Millisecond, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, err)
	const faults = 5 // more than MaxAttempts (3)
	var cuts atomic.Int64
	job := liveJob(nil)
	job.Validators = []Validator{terminatingValidator(t, db, func(c Chunk) bool { return c.Seq == 1 && cuts.Load() < faults }, &cuts)}

	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, int64(faults), cuts.Load())

	var n, distinct int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.NoError(t, db.Get(&distinct, `SELECT count(DISTINCT id) FROM live`))
	require.Equal(t, 10*liveChunks, n)
	require.Equal(t, n, distinct)
	var c1 struct {
		Status   string `db:"status"`
		Attempts int    `db:"attempts"`
		Read     int64  `db:"rows_read"`
		Inserted int64  `db:"rows_inserted"`
	}
	require.NoError(t, db.Get(&c1, `SELECT status, attempts, rows_read, rows_inserted FROM backfill.chunks WHERE batch_id = $1 AND seq = 1`, rep.BatchID))
	require.Equal(t, "done", c1.Status)
	require.Equal(t, 1, c1.Attempts, "the faults are not attempts")
	require.Equal(t, int64(10), c1.Read)
	require.Equal(t, c1.Read, c1.Inserted)
	require.Equal(t, int64(10*liveChunks), rep.Counts.Read)
	require.Equal(t, rep.Counts.Read, rep.Counts.Inserted)

	warns := faultLines(t, logs.String(), chunkFaultMsg)
	require.Len(t, warns, faults, logs.String())
	for i, w := range warns {
		require.Equal(t, "WARN", w["level"])
		require.EqualValues(t, 1, w["seq"])
		require.EqualValues(t, 1, w["attempt"])
		require.EqualValues(t, i+1, w["fault"])
		require.NotEmpty(t, w["sqlstate"])
		require.Contains(t, w, "sleep")
		msg, _ := w["error"].(string)
		require.Contains(t, msg, "the connection to the server was lost")
		require.NotContains(t, msg, "SAVEPOINT")
		require.NotContains(t, msg, "set_config")
		require.NotContains(t, msg, "INSERT")
	}
	require.NotContains(t, logs.String(), `"msg":"chunk failed"`)
}

// TestChunkConnectionFaultsBounded: a chunk whose transaction keeps
// losing its connection for longer than 2 × StaleAfter ends the call
// with a retryable error; the run is not failed (Work would exit 75),
// and the next call completes it. The faults are retried under the same
// attempt (MaxAttempts 1: a second fault would fail the run were it an
// attempt), each within the bound of the chunk's first fault, the last
// one past it. How many faults fit in the bound depends on the machine's
// speed, so the test reads the bound's decisions from the log rather
// than counting them.
func TestChunkConnectionFaultsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	var logs syncBuffer
	const staleAfter = 300 * time.Millisecond
	r, err := New(db, &Config{WorkerID: "w", HeartbeatInterval: 100 * time.Millisecond, StaleAfter: staleAfter,
		RetryBackoff: 10 * time.Millisecond, MaxAttempts: 1, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, err)
	var cutting atomic.Bool
	cutting.Store(true)
	var cuts atomic.Int64
	job := liveJob(nil)
	job.Validators = []Validator{terminatingValidator(t, db, func(c Chunk) bool { return c.Seq == 1 && cutting.Load() }, &cuts)}

	rep, err := r.Run(ctx, job)
	require.Error(t, err)
	require.True(t, IsRetryable(err), "%v", err)
	require.Contains(t, err.Error(), "the connection to the server was lost")
	require.NotContains(t, err.Error(), "SAVEPOINT")
	require.Equal(t, RunRunning, rep.Status, "%v", err)
	require.Equal(t, ExitTempFail, exitCode(ctx, rep, err))
	var status string
	require.NoError(t, db.Get(&status, `SELECT status FROM backfill.runs WHERE batch_id = $1`, rep.BatchID))
	require.Equal(t, "running", status)

	// The first fault is within the bound (0 after itself): at least one
	// retry, more tries than MaxAttempts allows attempts.
	retried := faultLines(t, logs.String(), "backfill: chunk's connection to the server was lost; rolled back, retrying after a pause (not counted toward MaxAttempts)")
	final := faultLines(t, logs.String(), "backfill: chunk's connection faults outlasted their bound; stopping, the run stays resumable")
	require.NotEmpty(t, retried)
	require.Len(t, final, 1)
	require.EqualValues(t, len(retried)+1, cuts.Load(), "every cut is a fault of the chunk, retried or final")
	bound := 2 * staleAfter
	for i, rec := range append(retried, final...) {
		require.EqualValues(t, 1, rec["seq"], "%v", rec)
		require.EqualValues(t, 1, rec["attempt"], "a fault is retried under the same attempt: %v", rec)
		require.EqualValues(t, i+1, rec["fault"], "%v", rec)
		faulty := time.Duration(rec["faulty_for"].(float64)) // slog's JSON: nanoseconds
		if i < len(retried) {
			require.Less(t, faulty, bound, "a fault within the bound is retried: %v", rec)
		} else {
			require.GreaterOrEqual(t, faulty, bound-time.Millisecond, "only a fault past the bound stops the call (faulty_for is rounded): %v", rec)
		}
	}
	var attempts int
	var chunkStatus string
	require.NoError(t, db.QueryRow(`SELECT attempts, status FROM backfill.chunks WHERE batch_id = $1 AND seq = 1`, rep.BatchID).Scan(&attempts, &chunkStatus))
	require.NotEqual(t, "failed", chunkStatus)
	require.LessOrEqual(t, attempts, 1, "the faults are not attempts")

	cutting.Store(false)
	rep2, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep2.Status)
	require.Equal(t, rep.BatchID, rep2.BatchID)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 10*liveChunks, n)
}

// TestBatchedStatementsCutNameNoSQL: a chunk transaction whose queued
// statements are sent when its connection is gone fails with an error
// that says what they were for, not their SQL, and wraps the driver's.
func TestBatchedStatementsCutNameNoSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	tx, err := pgstore.PGDB{DB: db}.Begin(ctx)
	require.NoError(t, err)
	b := batched(tx)
	defer func() { _ = b.Rollback() }()
	var pid int
	require.NoError(t, sqlx.GetContext(ctx, b, &pid, `SELECT pg_backend_pid()`))
	require.NoError(t, pgstore.Later(ctx, b, `SAVEPOINT backfill_cut`))
	require.NoError(t, pgstore.Later(ctx, b, `RELEASE SAVEPOINT backfill_cut`))
	_, err = db.ExecContext(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	testwait.Until(t, "the transaction's backend terminated", func() bool {
		var n int
		return db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) == nil && n == 0
	})
	_, err = b.ExecContext(ctx, `SELECT $1::int`, 1)
	require.Error(t, err)
	require.True(t, backfilltype.IsConnectionError(err), "%v", err)
	require.Contains(t, err.Error(), "sending the chunk transaction's queued savepoints")
	require.NotContains(t, err.Error(), "SAVEPOINT")
	require.NotContains(t, err.Error(), "backfill_cut")
}

// TestFencedWorkerDoesNotFailTakenOverChunk: a worker frozen inside its
// chunk's transaction is fenced by another worker of the same job (its
// backend terminated, its lease taken over); thawed, it finds its
// connection lost: a fault, not a failed attempt. It records nothing
// against the chunk, which the fencer completed on attempt 1, and moves
// on.
func TestFencedWorkerDoesNotFailTakenOverChunk(t *testing.T) {
	// Not parallel: it sets the heartbeat hook of the package.
	ctx := context.Background()
	db := liveDB(t)
	freeze, _ := heartbeatsOff(t, "frozen")
	merged, thawed := make(chan struct{}), make(chan struct{})
	var thawOnce sync.Once
	var first atomic.Bool
	thaw := func() { thawOnce.Do(func() { close(thawed) }) }
	defer thaw()
	job := liveJob(nil)
	job.Chunker = IntRange(0, 10, 10)
	job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		if first.CompareAndSwap(false, true) {
			freeze(true)
			close(merged)
			<-thawed
		}
		return CheckResult{Check: "frozen", Severity: SeverityError, Passed: true, Expected: "ok", Actual: "ok"}, nil
	})}
	var logsA syncBuffer
	aDone := goRun(ctx, liveRunner(t, db, "frozen", &logsA), job)
	testwait.Recv(t, "the frozen worker's merge", merged)

	var logsB syncBuffer
	bCtx, bCancel := context.WithTimeout(ctx, 20*time.Second)
	defer bCancel()
	rb := testwait.Recv(t, "the healthy worker's run", goRun(bCtx, liveRunner(t, db, "healthy", &logsB), job))
	require.NoError(t, rb.err)
	require.Equal(t, RunCompleted, rb.rep.Status)

	freeze(false)
	thaw()
	ra := testwait.Recv(t, "the fenced worker's run", aDone)
	require.Zero(t, ra.rep.ChunksRun, "the fenced worker committed nothing: %v", ra.err)
	require.NotEqual(t, RunFailed, ra.rep.Status, "%v", ra.err)
	require.NotContains(t, logsA.String(), `"msg":"chunk failed"`)
	warns := faultLines(t, logsA.String(), chunkFaultMsg)
	require.NotEmpty(t, warns, logsA.String())
	require.EqualValues(t, 0, warns[0]["seq"])

	var c0 struct {
		Status    string         `db:"status"`
		Attempts  int            `db:"attempts"`
		Worker    string         `db:"worker"`
		LastError sql.NullString `db:"last_error"`
	}
	require.NoError(t, db.Get(&c0, `SELECT status, attempts, worker, last_error FROM backfill.chunks WHERE batch_id = $1 AND seq = 0`, rb.rep.BatchID))
	require.Equal(t, "done", c0.Status)
	require.Equal(t, "healthy", c0.Worker)
	require.Equal(t, 1, c0.Attempts, "the fenced worker's try is no attempt")
	var runStatus string
	require.NoError(t, db.Get(&runStatus, `SELECT status FROM backfill.runs WHERE batch_id = $1`, rb.rep.BatchID))
	require.Equal(t, "completed", runStatus)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 10, n)
}
