package backfill_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// A whole-batch rollback works in slices of chunks, one transaction each,
// and checks for conflicts in the statement that restores a slice: a
// later batch that commits between two slices and changes a row of a
// slice not rolled back yet stops the rollback with ErrRollbackConflict
// before that slice writes anything, the slices before it staying rolled
// back. (Not parallel: the slice bounds and the hook are the process's.)
func TestRollbackSliceRefusesARowChangedMidRollback(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	defer backfill.SetRollbackSlices(1_000, 2)()
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rows := func(v string) [][]any {
		var out [][]any
		for i := range int64(100) {
			out = append(out, []any{i, fmt.Sprintf("%s-%d", v, i), i})
		}
		return out
	}
	_, err = r.Run(ctx, itemsJob("slice-items", rows("v1")))
	require.NoError(t, err)
	rep2, err := r.Run(ctx, itemsJob("slice-items", rows("v2")))
	require.NoError(t, err)
	require.Equal(t, int64(100), rep2.Counts.Updated)

	var later backfill.Report
	var slices [][]int
	backfill.SetBeforeRollbackSlice(func(job string, seqs []int) {
		if job != "slice-items" {
			return
		}
		slices = append(slices, seqs)
		if len(slices) == 2 {
			// Another job changes id 5 (chunk 0, the last slice).
			later, err = r.Run(ctx, itemsJob("slice-other", [][]any{{int64(5), "v3-5", int64(5)}}))
			require.NoError(t, err)
		}
	})
	defer backfill.SetBeforeRollbackSlice(nil)
	_, err = r.Rollback(ctx, itemsJob("slice-items", nil), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "ann", Why: "bad"})
	require.ErrorIs(t, err, backfill.ErrRollbackConflict)
	require.Contains(t, err.Error(), fmt.Sprintf(`{"id": 5} (changed by batch %d)`, later.BatchID))
	require.Equal(t, [][]int{{9, 8}, {7, 6}, {5, 4}, {3, 2}, {1, 0}}, slices)

	// The slices before the last (chunks 9 to 2) are rolled back; the
	// last (chunks 1 and 0) wrote nothing.
	var rolled []int
	require.NoError(t, db.Select(&rolled, `SELECT seq FROM backfill.chunks WHERE batch_id = $1 AND status = 'rolled_back' ORDER BY seq`, rep2.BatchID))
	require.Equal(t, []int{2, 3, 4, 5, 6, 7, 8, 9}, rolled)
	var names []string
	require.NoError(t, db.Select(&names, `SELECT name FROM items WHERE id IN (5, 6, 19, 20, 99) ORDER BY id`))
	require.Equal(t, []string{"v3-5", "v2-6", "v2-19", "v1-20", "v1-99"}, names)
	// The batch's status is still completed: Status says the rollback
	// did not finish, how far it got and how to finish it.
	st, err := r.StatusOf(ctx, rep2.BatchID)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, st.Status)
	require.Equal(t, 8, st.Chunks.RolledBack)
	require.Contains(t, st.Waiting, "a rollback of this batch started ")
	require.Contains(t, st.Waiting, "(ann: bad) did not finish: 8 of 10 chunks marked rolled back")
	require.Contains(t, st.Waiting, fmt.Sprintf("backfill rollback --batch %d", rep2.BatchID))
	// The other job's batch, not rolled back, says nothing of it.
	other, err := r.StatusOf(ctx, later.BatchID)
	require.NoError(t, err)
	require.Empty(t, other.Waiting)
	// A worker started on the job meanwhile does not report it completed
	// (exit 0 would tell a supervisor the batch is in place): it fails,
	// saying how to finish the rollback.
	resume := itemsJob("slice-items", rows("v2"))
	resume.NewRun = false
	_, err = r.Run(ctx, resume)
	require.Error(t, err)
	require.NotErrorIs(t, err, backfill.ErrAlreadyCompleted)
	require.Contains(t, err.Error(), fmt.Sprintf("a rollback of the batch did not finish (2 of its 10 chunks still done): finish it (backfill rollback --batch %d --why WHY", rep2.BatchID))
	require.Equal(t, backfill.ExitFailed, backfill.Work(ctx, r, resume))

	// Rolled back in order, newest first, the batches leave batch 1's rows.
	_, err = r.Rollback(ctx, itemsJob("slice-other", nil), backfill.RollbackOptions{BatchID: later.BatchID, Actor: "ann", Why: "bad"})
	require.NoError(t, err)
	rep, err := r.Rollback(ctx, itemsJob("slice-items", nil), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "ann", Why: "bad"})
	require.NoError(t, err)
	require.Equal(t, 2, rep.Chunks)
	require.Equal(t, int64(20), rep.Restored)
	st, err = r.StatusOf(ctx, rep2.BatchID)
	require.NoError(t, err)
	require.Equal(t, backfill.RunRolledBack, st.Status)
	require.Empty(t, st.Waiting, "a finished rollback leaves nothing to wait for")
	var v1 int
	require.NoError(t, db.Get(&v1, `SELECT count(*) FROM items WHERE name = 'v1-' || id AND backfill_updated_by = 1`))
	require.Equal(t, 100, v1)
}

// Two chunks of one batch that change the same row: rolled back in one
// slice, the row gets the image from before the batch (the earliest prior
// image among the slice's chunks), not the one between the two chunks.
func TestRollbackSliceRestoresTheEarliestImage(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, itemsJob("earliest", [][]any{{int64(1), "before", int64(1)}, {int64(2), "before", int64(2)}}))
	require.NoError(t, err)
	empty := tableState(t, db)
	// Chunks a, b and c each write key 1 with their own content.
	job := backfill.Job{Name: "earliest-list", NewRun: true, Chunker: backfill.List("a", "b", "c"),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, int64(1), "chunk "+c.Item, int64(1))
		}),
		Target: backfill.Target{Table: "items", Key: []string{"id"}, Columns: []string{"id", "name", "qty"}}}
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(3), rep.Counts.Updated)
	rb, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "ann", Why: "bad"})
	require.NoError(t, err)
	require.Equal(t, 3, rb.Chunks)
	require.Equal(t, empty, tableState(t, db))
}
