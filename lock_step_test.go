package backfill

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestLockWaitStepBoundedByLockTimeout: a try of WaitLock waits its step,
// or the transaction's own lock_timeout when that is shorter and not 0,
// whatever the unit the setting was given in; the transaction's
// lock_timeout is put back afterwards.
func TestLockWaitStepBoundedByLockTimeout(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, tc := range []struct {
		lockTimeout string
		step        time.Duration
		want        string // the lock_timeout of the try
	}{
		{"0", time.Second, "1s"},
		{"250ms", time.Second, "250ms"},
		{"250", time.Second, "250ms"},
		{"2s", time.Second, "1s"},
		{"1500ms", 2 * time.Second, "1500ms"},
		{"1min", 100 * time.Millisecond, "100ms"},
		{"2min", 90 * time.Second, "90s"},
		{"1h", time.Minute, "1min"},
		{"1d", 2 * time.Hour, "2h"},
		{"3s", 5 * time.Second, "3s"},
	} {
		ctx := pgstore.WithLockWaiting(context.Background(), pgstore.LockWaiting{Step: tc.step})
		tx, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, `SELECT set_config('lock_timeout', $1, true)`, tc.lockTimeout)
		require.NoError(t, err)
		var was string
		require.NoError(t, tx.GetContext(ctx, &was, `SHOW lock_timeout`))
		// The statement notes the lock_timeout its condition set (a
		// condition without columns: evaluated before the target list).
		err = pgstore.WaitLock(ctx, tx, "test", pgstore.LockSpec{Name: "step"}, func(cond string) string {
			return `SELECT set_config('backfill_test.step', current_setting('lock_timeout'), true), pg_advisory_xact_lock(hashtextextended('step', 0)) WHERE ` + cond
		})
		require.NoError(t, err)
		var got, after string
		require.NoError(t, sqlx.GetContext(ctx, tx, &got, `SELECT current_setting('backfill_test.step')`))
		require.NoError(t, sqlx.GetContext(ctx, tx, &after, `SHOW lock_timeout`))
		require.NoError(t, tx.Rollback())
		require.Equal(t, tc.want, got, "lock_timeout %s, step %v", tc.lockTimeout, tc.step)
		require.Equal(t, was, after, "lock_timeout %s: not put back", tc.lockTimeout)
	}
}
