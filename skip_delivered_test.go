package backfill_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pgbackfill/backfill"
	"github.com/stretchr/testify/require"
)

// deliveredRow is a row of the manifest's delivered table, without its
// batch.
type deliveredRow struct {
	Seq   int    `db:"seq"`
	Owner int64  `db:"owner"`
	Keys  string `db:"key_columns"`
	Lo    string `db:"lo"`
	Hi    string `db:"hi"`
	Count int64  `db:"row_count"`
}

func deliveredOf(t *testing.T, s *itemsSetup, batch int64) []deliveredRow {
	t.Helper()
	var rows []deliveredRow
	require.NoError(t, s.db.Select(&rows, `SELECT seq, owner, key_columns::text AS key_columns, lo::text AS lo, hi::text AS hi, row_count
		FROM backfill.delivered WHERE batch_id = $1 ORDER BY seq, owner`, batch))
	return rows
}

// A replay that skips a chunk its base skipped too copies the base's
// delivered summary, and reads the rows again when that summary does not
// account for every one of them.
func TestSkipCopiesASkippedBasesDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	job := skipJob(src)
	rep1, err := r.Run(ctx, job)
	require.NoError(t, err)

	// Batch 2 skips on batch 1, a merge: it reads its summaries. Batch 3
	// skips on batch 2, skipped: the same summaries.
	rep2, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep2.ChunksSkipped)
	want := deliveredOf(t, s, rep2.BatchID)
	require.Len(t, want, 10)
	for _, d := range want {
		require.Equal(t, rep1.BatchID, d.Owner)
		require.Equal(t, int64(100), d.Count)
	}
	rep3, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep3.ChunksSkipped)
	if d := cmp.Diff(want, deliveredOf(t, s, rep3.BatchID)); d != "" {
		t.Fatalf("batch 3's delivered summaries (-batch 2's +got):\n%s", d)
	}

	// Copied, not read: a mark put in batch 3's summary of the first
	// chunk (its counts intact) shows in batch 4's.
	_, err = s.db.Exec(`UPDATE backfill.delivered SET lo = lo || '{"mark": 1}' WHERE batch_id = $1 AND seq = 0`, rep3.BatchID)
	require.NoError(t, err)
	rep4, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep4.ChunksSkipped)
	got := deliveredOf(t, s, rep4.BatchID)
	require.Contains(t, got[0].Lo, `"mark": 1`)
	got[0].Lo = want[0].Lo
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("batch 4's delivered summaries (-batch 2's +got):\n%s", d)
	}

	// A base summary that accounts for fewer rows than the chunk holds
	// (here one owner's row deleted; a base whose own batch owned rows,
	// which it left out, looks the same), or none: the rows are read.
	_, err = s.db.Exec(`UPDATE backfill.delivered SET row_count = 99 WHERE batch_id = $1 AND seq = 1`, rep4.BatchID)
	require.NoError(t, err)
	_, err = s.db.Exec(`DELETE FROM backfill.delivered WHERE batch_id = $1 AND seq = 2`, rep4.BatchID)
	require.NoError(t, err)
	rep5, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep5.ChunksSkipped)
	got = deliveredOf(t, s, rep5.BatchID)
	require.Contains(t, got[0].Lo, `"mark": 1`)
	got[0].Lo = want[0].Lo
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("batch 5's delivered summaries (-batch 2's +got):\n%s", d)
	}

	// A row of the target written by another session: the chunk's rows
	// changed, it merges; its next skip reads, the others copy.
	_, err = s.db.Exec(`UPDATE items SET name = 'tampered' WHERE id = 450`)
	require.NoError(t, err)
	rep6, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 9, rep6.ChunksSkipped)
	rep7, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep7.ChunksSkipped)
	got = deliveredOf(t, s, rep7.BatchID)
	require.Len(t, got, 11)
	require.Equal(t, deliveredRow{Seq: 4, Owner: rep1.BatchID, Keys: want[4].Keys, Lo: want[4].Lo, Hi: `{"id": 499, "tenant": "acme"}`, Count: 99}, got[4])
	require.Equal(t, deliveredRow{Seq: 4, Owner: rep6.BatchID, Keys: want[4].Keys, Lo: `{"id": 450, "tenant": "acme"}`, Hi: `{"id": 450, "tenant": "acme"}`, Count: 1}, got[5])

	// A rollback of batch 1 sees its rows delivered unchanged by the
	// later batches, copies included.
	pv, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep1.BatchID, Preview: true})
	require.NoError(t, err)
	require.Equal(t, int64(999), pv.ConflictsDelivered)
}
