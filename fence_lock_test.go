package backfill

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/testwait"
)

// fenceLockRunner is a runner on a fresh database (its URL returned)
// with table live, LockTimeout 50 ms and retry table retries, logging
// JSON to logs.
func fenceLockRunner(t *testing.T, retries []LockRetry, logs *syncBuffer) (*Runner, *sqlx.DB, string) {
	t.Helper()
	u := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { _ = db.Close() })
	_, err := db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	r, err := New(db, &Config{WorkerID: "fenced", HeartbeatInterval: time.Second, StaleAfter: 10 * time.Second, RetryBackoff: 10 * time.Millisecond,
		LockTimeout: 50 * time.Millisecond, LockRetries: retries, MaxAttempts: 1, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	require.NoError(t, err)
	return r, db, u
}

// TestChunkFenceWaitForLockedChunksTableBounded: an operator's session
// takes LOCK TABLE backfill.chunks IN ACCESS EXCLUSIVE MODE while a
// chunk is extracted (leased, its transaction not begun). The chunk's
// first statement, the fence, waits for the table at most the try's
// lock_timeout: each wait is a wait of the chunk, logged with the
// holder (the table and application_name) and retried with LockRetries.
// Released, the run completes; held past the retry table, the chunk's
// attempt fails with an error naming the manifest table.
func TestChunkFenceWaitForLockedChunksTableBounded(t *testing.T) {
	t.Parallel()
	t.Run("released", func(t *testing.T) {
		t.Parallel()
		logs := &syncBuffer{}
		// Enough tries that the release, once the wait is logged, comes
		// before they are used up.
		r, db, u := fenceLockRunner(t, lockRetries(400, 50*time.Millisecond, 50*time.Millisecond), logs)
		var release func()
		locked := make(chan struct{})
		var once sync.Once
		done := goRun(context.Background(), r, liveJob(func(c Chunk) {
			once.Do(func() {
				release = lockManifestTable(t, u, "chunks")
				close(locked)
			})
		}))
		testwait.Recv(t, "the lock of backfill.chunks", locked)
		testwait.Until(t, "the chunk to log its wait for backfill.chunks", func() bool {
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, `"msg":"backfill: chunk waited; rolled back, retrying after a pause"`) &&
					strings.Contains(line, "AccessExclusiveLock on backfill.chunks") && strings.Contains(line, `application_name \"locker\"`) &&
					strings.Contains(line, `"sqlstate":"55P03"`) {
					return true
				}
			}
			return false
		})
		release()
		res := testwait.Recv(t, "the run", done)
		if testing.Verbose() {
			t.Logf("logs:\n%s", logs.String())
		}
		require.NoError(t, res.err)
		require.Equal(t, RunCompleted, res.rep.Status)
		require.Equal(t, liveChunks, res.rep.ChunksDone)
		var recorded int
		require.NoError(t, db.Get(&recorded, `SELECT count(*) FROM backfill.waits WHERE sqlstate = '55P03' AND blockers::text LIKE '%backfill.chunks%'`))
		require.NotZero(t, recorded, "the fence's waits are recorded with their blocker")
	})
	t.Run("held past the retries", func(t *testing.T) {
		t.Parallel()
		logs := &syncBuffer{}
		r, _, u := fenceLockRunner(t, lockRetries(3, 50*time.Millisecond, 10*time.Millisecond), logs)
		var once sync.Once
		done := goRun(context.Background(), r, liveJob(func(c Chunk) {
			once.Do(func() { lockManifestTable(t, u, "chunks") })
		}))
		res := testwait.Recv(t, "the run", done)
		require.Error(t, res.err)
		t.Logf("error: %v", res.err)
		require.Contains(t, res.err.Error(), "backfill.chunks")
		require.True(t, IsRetryable(res.err), "retryable: %v", res.err)
		require.Contains(t, logs.String(), "AccessExclusiveLock on backfill.chunks")
	})
}

// TestWaitInFlightLockedChunksTableLogged: the barrier after a run stops
// (WaitInFlight) behind an operator's LOCK TABLE backfill.chunks logs
// the wait with the table's holder at each poll, rather than waiting
// silently for the lock, and returns once the lock is released.
func TestWaitInFlightLockedChunksTableLogged(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	r, _, u := fenceLockRunner(t, lockRetries(3, 50*time.Millisecond, 10*time.Millisecond), logs)
	rep, err := r.Run(context.Background(), liveJob(nil))
	require.NoError(t, err)
	release := lockManifestTable(t, u, "chunks")
	done := make(chan error, 1)
	go func() {
		done <- NewPGManifest("").WaitInFlight(testwait.Context(t, "the barrier"), r.db, rep.BatchID, backfilldriver.FenceWait{
			StaleAfter: 10 * time.Second, Poll: 50 * time.Millisecond, Log: slog.New(slog.NewJSONHandler(logs, nil)), What: "barrier test"})
	}()
	testwait.Until(t, "the barrier to log the locked table", func() bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, `"what":"barrier test"`) && strings.Contains(line, "AccessExclusiveLock on backfill.chunks") &&
				strings.Contains(line, `application_name \"locker\"`) {
				return true
			}
		}
		return false
	})
	release()
	require.NoError(t, testwait.Recv(t, "the barrier", done))
}
