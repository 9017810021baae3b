package backfill_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// TestRestatementUpdatesExactly: a restatement whose changed chunk has
// changed rows at its start, middle and end (the upsert finds and locks
// them by the ctid its comparison read), and a rejected row, updates
// exactly those rows, skips the other chunks, queues the reject, and its
// rollback restores the target exactly as it was.
func TestRestatementUpdatesExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	hooks := &skipHooks{}
	r, err := backfill.New(s.db, &backfill.Config{Hooks: hooks})
	require.NoError(t, err)
	job := skipJob(src)
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	hooks.merged()
	before := snapshot(t, s.db)

	src.set(300, "first", "1.00")
	src.set(350, "middle", "2.00")
	src.set(399, "last", "3.00")
	src.set(360, "bad", "not a number")
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, []string{"int:300/400"}, hooks.merged())
	require.Equal(t, 9, rep.ChunksSkipped)
	require.Equal(t, backfill.Counts{Read: 1000, Updated: 3, Unchanged: 996, Rejected: 1}, rep.Counts)
	requireBalanced(t, s.db, rep.BatchID)
	ex, err := backfill.NewPGManifest("").Exceptions(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ex, 1)
	require.Equal(t, "amount", ex[0].Column)
	var updated []int64
	require.NoError(t, s.db.Select(&updated, `SELECT id FROM items WHERE backfill_updated_by = $1 ORDER BY id`, rep.BatchID))
	require.Equal(t, []int64{300, 350, 399}, updated)
	got := map[int64]string{}
	for _, row := range contentOf(snapshot(t, s.db)) {
		got[row.ID] = row.Name + " " + row.Amount
	}
	require.Equal(t, "first 1.00", got[300])
	require.Equal(t, "middle 2.00", got[350])
	require.Equal(t, "last 3.00", got[399])
	require.Equal(t, "item-360 360.60", got[360], "the rejected row keeps its target row")

	_, err = r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "ann", Why: "test"})
	require.NoError(t, err)
	if d := cmp.Diff(contentOf(before), contentOf(snapshot(t, s.db))); d != "" {
		t.Fatalf("rollback of the restatement (-want +got):\n%s", d)
	}
}

// TestRestatementWaitsForAConcurrentWriter: another session holds, with
// an uncommitted UPDATE, a row the restatement changes. The restatement
// waits for it, then writes the source's row over the committed version
// (found again through the ctid of the version it read first), and its
// undo log holds that committed version: the rollback restores it.
func TestRestatementWaitsForAConcurrentWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	job := skipJob(src)
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	committed := contentOf(snapshot(t, s.db))
	for i := range committed {
		if committed[i].ID == 350 {
			committed[i].Name = "other"
		}
	}

	src.set(350, "restated", "9.99")
	src.set(351, "restated", "9.98")
	tx, err := s.db.Beginx()
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = tx.Exec(`UPDATE items SET name = 'other' WHERE id = 350`)
	require.NoError(t, err)

	type result struct {
		rep backfill.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := r.Run(ctx, job)
		done <- result{rep, err}
	}()
	// Wait until the restatement waits for the row lock.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		require.NoError(t, s.db.Get(&waiting, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())`))
		if waiting {
			break
		}
		select {
		case res := <-done:
			t.Fatalf("the restatement ended without waiting for the row: %+v, %v", res.rep, res.err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "the restatement never waited for the row lock")
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, tx.Commit())
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, backfill.Counts{Read: 1000, Updated: 2, Unchanged: 998}, res.rep.Counts)
	got := map[int64]string{}
	for _, row := range contentOf(snapshot(t, s.db)) {
		got[row.ID] = row.Name + " " + row.Amount
	}
	require.Equal(t, "restated 9.99", got[350])
	require.Equal(t, "restated 9.98", got[351])

	// The undo log holds the committed version the restatement overwrote.
	_, err = r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: res.rep.BatchID, Actor: "ann", Why: "test"})
	require.NoError(t, err)
	if d := cmp.Diff(committed, contentOf(snapshot(t, s.db))); d != "" {
		t.Fatalf("rollback of the restatement (-want +got):\n%s", d)
	}
}
