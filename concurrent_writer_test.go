package backfill_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
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

// Rollback vs a run delivering the same rows: batch 2 delivers batch 1's
// rows unchanged and, while its chunk is between merge and commit, batch 1
// is rolled back. The rollback must wait for the merge (the target's merge
// lock), then see batch 2's delivery and refuse; it must never delete rows
// a completed, still-applied batch delivered.
//
// The same through PgBouncer in transaction mode: the rollback's lock is a
// transaction lock in each of its transactions (rollback_lock.go), never a
// session lock that the pooler would leave on a shared server connection.
func TestRollbackWaitsForMergeOfSameTarget(t *testing.T) {
	t.Parallel()
	t.Run("direct", func(t *testing.T) {
		t.Parallel()
		rollbackWaitsForMerge(t, pgtest.New(t))
	})
	t.Run("pooler", func(t *testing.T) {
		t.Parallel()
		db, err := sqlx.Open("postgres", pgtest.NewPoolerURL(t))
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		rollbackWaitsForMerge(t, db)
	})
}

func rollbackWaitsForMerge(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	rbSetup(t, db)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rows := [][]any{{int64(1), "same", int64(1)}, {int64(2), "same", int64(2)}}
	rep1, err := r.Run(ctx, itemsJob("items", rows))
	require.NoError(t, err)

	job2 := itemsJob("items2", rows)
	merged, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	job2.Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
		once.Do(func() { close(merged) })
		<-release // the chunk's transaction stays open, its merge done
		return backfill.CheckResult{Check: "pause", Passed: true}, nil
	})}
	runDone := make(chan error, 1)
	var rep2 backfill.Report
	go func() {
		var err error
		rep2, err = r.Run(ctx, job2)
		runDone <- err
	}()
	<-merged
	rbDone := make(chan struct{})
	var rbErr error
	go func() {
		defer close(rbDone)
		_, rbErr = r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "t", Why: "test"})
	}()
	waited := untilLockWait(t, db, rbDone)
	close(release)
	require.NoError(t, <-runDone)
	<-rbDone
	require.Equal(t, backfill.RunCompleted, rep2.Status)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM items`))
	require.Equal(t, 2, n, "the rollback deleted the rows batch 2 delivered (rollback error: %v)", rbErr)
	require.True(t, waited, "the rollback did not wait for the merge")
	require.ErrorIs(t, rbErr, backfill.ErrRollbackConflict)
}

// TargetWins: chunks of one run that disagree on a new key's content leave
// the row of the first to commit, which depends on commit order. On a
// target with lineage columns, the merge sees that the row another chunk
// of the same batch wrote differs and the run warns, naming the fix.
func TestTargetWinsWarnsWhenChunksOfRunDisagree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	var log bytes.Buffer
	var mu sync.Mutex
	r, err := backfill.New(db, &backfill.Config{Logger: slog.New(slog.NewTextHandler(syncWriter{&log, &mu}, nil))})
	require.NoError(t, err)
	job := backfill.Job{Name: "tw", Chunker: backfill.IntRange(0, 30, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			name := fmt.Sprintf("chunk%d", c.Lo/10)
			if c.Lo == 20 {
				name = "chunk0" // the name of chunk 0, but another qty: still a disagreement
			}
			return w.Write(ctx, int64(1000), name, c.Lo)
		}),
		Target: backfill.Target{Table: "items", Key: []string{"id"}, Columns: []string{"id", "name", "qty"}, Conflict: backfill.TargetWins}}
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(1), rep.Counts.Inserted)
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, log.String(), "chunks of this run disagree on keys")
	require.Equal(t, 2, strings.Count(log.String(), "chunks of this run disagree on keys"), "chunks 1 and 2 differ from chunk 0's row")

	// Chunks that agree do not warn.
	db.MustExec(`TRUNCATE items`)
	log.Reset()
	mu.Unlock()
	job.Name, job.NewRun = "tw2", true
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		return w.Write(ctx, int64(1000), "same", int64(7))
	})
	_, err = r.Run(ctx, job)
	mu.Lock()
	require.NoError(t, err)
	require.NotContains(t, log.String(), "disagree")
}
