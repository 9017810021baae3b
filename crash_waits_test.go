package backfill_test

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// waitsJob is the job of TestKillDashNineWhileWaiting: 10 chunks of 100
// rows, 20 ms of extraction each.
func waitsJob(s *itemsSetup) backfill.Job {
	job := s.job(1)
	job.Name = "waits"
	job.Chunker = backfill.IntRange(0, 1000, 100)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		time.Sleep(20 * time.Millisecond)
		return inner.Extract(ctx, c, w)
	})
	return job
}

// waitsConfig retries lock waits for long with short tries.
func waitsConfig() *backfill.Config {
	rs := make([]backfill.LockRetry, 1000)
	for i := range rs {
		rs[i] = backfill.LockRetry{Timeout: 100 * time.Millisecond, Sleep: 20 * time.Millisecond}
	}
	return &backfill.Config{MaxAttempts: 1, LockRetries: rs}
}

func init() {
	// The child process of TestKillDashNineWhileWaiting.
	childProcess("BACKFILL_WAITS_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, waitsConfig())
		if err != nil {
			return err
		}
		_, err = r.Run(context.Background(), waitsJob(&itemsSetup{db: db}))
		return err
	})
}

// TestKillDashNineWhileWaiting: a worker killed (SIGKILL) while its chunk
// waits behind a lock on the target (its tries time out, roll back and
// are recorded in the waits table, each in a transaction of its own)
// leaves the waits it recorded, and nothing else: the chunk is pending,
// and a resumed run completes every chunk exactly once.
func TestKillDashNineWhileWaiting(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	createItems(t, db)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BACKFILL_WAITS_CHILD="+url)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	poll := func(query string, n int) {
		t.Helper()
		require.Eventually(t, func() bool {
			var got int
			return db.Get(&got, query) == nil && got >= n
		}, 60*time.Second, 2*time.Millisecond)
	}
	poll(`SELECT count(*) FROM backfill.chunks WHERE status = 'done'`, 2)
	locker, err := db.Connx(ctx)
	require.NoError(t, err)
	defer locker.Close()
	_, err = locker.ExecContext(ctx, `BEGIN; LOCK TABLE items IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	poll(`SELECT count(*) FROM backfill.waits`, 2)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	poll(`SELECT CASE WHEN count(*) = 0 THEN 1 ELSE 0 END FROM pg_stat_activity WHERE application_name LIKE '%backfill_test_child_%'`, 1)
	var recorded int
	require.NoError(t, db.Get(&recorded, `SELECT count(*) FROM backfill.waits WHERE sqlstate = '55P03'`))
	_, err = locker.ExecContext(ctx, `COMMIT`)
	require.NoError(t, err)

	var done int
	require.NoError(t, db.Get(&done, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`))
	require.Less(t, done, 10, "killed while a chunk waited")
	r, err := backfill.New(db, waitsConfig())
	require.NoError(t, err)
	rep, err := r.Run(ctx, waitsJob(&itemsSetup{db: db}))
	require.NoError(t, err)
	require.True(t, rep.Resumed)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 10-done, rep.ChunksRun)
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep.Counts, "no chunk counted twice")
	var after int
	require.NoError(t, db.Get(&after, `SELECT count(*) FROM backfill.waits WHERE sqlstate = '55P03'`))
	require.Equal(t, recorded, after, "the killed worker's waits stay recorded; the resume waited for nothing")
	var rows int
	require.NoError(t, db.Get(&rows, `SELECT count(*) FROM items`))
	require.Equal(t, 1000, rows)
}
