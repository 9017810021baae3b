package backfill_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// untilLockWait polls until some backend of db's database other than
// those of ignore waits for a lock (advisory, row or transaction), or done
// yields (the waiter it expected finished without waiting). It reports
// whether a waiter was seen. The deadline only keeps a broken build from
// hanging; nothing is asserted about time.
func untilLockWait(t *testing.T, db *sqlx.DB, done <-chan struct{}) bool {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		var waiting bool
		require.NoError(t, db.Get(&waiting, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE NOT l.granted AND a.datname = current_database() AND a.pid <> pg_backend_pid())`))
		if waiting {
			return true
		}
		select {
		case <-done:
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatal("no backend waited for a lock")
	return false
}

// History: closing an interval of a row that an application is updating
// (uncommitted) must log, as the undo image, the row the merge actually
// overwrote (the application's committed update), so that rolling the
// batch back keeps the application's change. The family: every statement
// that writes the target and logs a prior image locks its rows first.
func TestHistoryCloseLogsRowItOverwrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, addrJob("addr", [][]any{{"a1", d(1), "Oslo"}}))
	require.NoError(t, err)

	app, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer app.Rollback() //nolint:errcheck
	app.MustExec(`UPDATE addr SET city = 'AppCity' WHERE customer = 'a1'`)
	done := make(chan struct{})
	var rep backfill.Report
	var runErr error
	go func() {
		defer close(done)
		rep, runErr = r.Run(ctx, addrJob("addr", [][]any{{"a1", d(10), "Rome"}}))
	}()
	require.True(t, untilLockWait(t, db, done), "run 2 must wait for the application's row")
	require.NoError(t, app.Commit())
	<-done
	require.NoError(t, runErr)
	var rows []string
	require.NoError(t, db.Select(&rows, `SELECT row(customer, valid_from::date, valid_to::date, city)::text FROM addr ORDER BY valid_from`))
	require.Equal(t, []string{"(a1,2024-01-01,2024-01-10,AppCity)", "(a1,2024-01-10,,Rome)"}, rows)

	_, err = r.Rollback(ctx, addrJob("addr", nil), backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "t", Why: "test"})
	require.NoError(t, err)
	rows = nil
	require.NoError(t, db.Select(&rows, `SELECT row(customer, valid_from::date, valid_to::date, city)::text FROM addr ORDER BY valid_from`))
	require.Equal(t, []string{"(a1,2024-01-01,,AppCity)"}, rows, "the rollback restored a stale image over the application's committed update")
}
