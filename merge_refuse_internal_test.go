package backfill

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestMergeRefusalPrechecks: the set-based pre-checks name exactly the
// staged rows that another unique index (against the target, or an
// earlier staged row), a CHECK, or the btree limit would refuse, under
// the merge's planner settings, and not a row whose unique value belongs
// to a target row the chunk itself changes.
func TestMergeRefusalPrechecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE t (id int PRIMARY KEY, code text UNIQUE, qty int CHECK (qty >= 0), note text);
		CREATE INDEX t_note_idx ON t (note);
		INSERT INTO t VALUES (1000, 'taken', 0, 'x'), (1001, 'moving', 0, 'x')`)
	require.NoError(t, err)
	big := make([]byte, 1500)
	_, _ = rand.Read(big)
	tx, err := db.Beginx()
	require.NoError(t, err)
	defer tx.Rollback()
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, tx, Target{Table: "t", Key: []string{"id"}})
	require.NoError(t, err)
	st, err := m.Stage(ctx, tx, info)
	require.NoError(t, err)
	for i, r := range [][]any{
		{int64(1), "c1", int64(1), "n"},
		{int64(2), "taken", int64(2), "n"},                  // 1000's code
		{int64(3), "c1", int64(3), "n"},                     // row 1's code
		{int64(4), "c4", int64(-1), "n"},                    // CHECK
		{int64(5), "c5", int64(5), hex.EncodeToString(big)}, // 3,000 bytes in t_note_idx
		{int64(6), "moving", int64(6), "n"},                 // 1001's code, but 1001 is staged too
		{int64(1001), "moved", int64(0), "n"},
		{int64(7), nil, nil, nil},
	} {
		require.NoError(t, st.Add(ctx, int64(i+1), r))
	}
	s := st.(*pgstore.PGStager)
	require.NoError(t, s.EndCopy(ctx))
	_, err = s.PlannerSettings(ctx)
	require.NoError(t, err)
	iso := &pgstore.Isolation{S: s}
	require.Equal(t, []int64{2, 3, 4, 5}, iso.Suspects(ctx))
	var ok bool
	require.NoError(t, tx.Get(&ok, `SELECT true`), "the transaction is healthy")
	require.True(t, ok)
}

// TestMergeRefusalsBisect: rows no pre-check can name (a foreign key) are
// found by bisection, in O(k log n) merges of parts of the chunk, not one
// merge per row: each merge stages its part from the held rows with one
// scan of them, which the transaction's statistics count.
func TestMergeRefusalsBisect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(0, 9);
		CREATE TABLE t (id int PRIMARY KEY, ref int REFERENCES parent)`)
	require.NoError(t, err)
	tx, err := db.Beginx()
	require.NoError(t, err)
	defer tx.Rollback()
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, tx, Target{Table: "t", Key: []string{"id"}})
	require.NoError(t, err)
	info.Chunk.MaxRefused = 10
	st, err := m.Stage(ctx, tx, info)
	require.NoError(t, err)
	const n = 4000
	bad := []int64{1, 1234, 3000, n}
	for i := int64(1); i <= n; i++ {
		ref := i % 10
		if slices.Contains(bad, i) {
			ref = 99
		}
		require.NoError(t, st.Add(ctx, i, []any{i, ref}))
	}
	res, err := st.Merge(ctx)
	require.NoError(t, err)
	require.EqualValues(t, n-len(bad), res.Inserted)
	var rows []int64
	for _, e := range res.Rejected {
		rows = append(rows, e.Row)
		require.Contains(t, e.Reason, `violates foreign key constraint "t_ref_fkey"`)
	}
	require.Equal(t, bad, rows)
	var scans int64
	require.NoError(t, tx.Get(&scans, `SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables WHERE relname LIKE 'backfill_held_%'`))
	// 4 rows in 4,000: about 4 * 2 * log2(4000) = 96 merges; one per row
	// would be 4,000.
	require.Positive(t, scans)
	require.Less(t, scans, int64(200), "merges of parts: %d", scans)
	var count int
	require.NoError(t, tx.Get(&count, `SELECT count(*) FROM t`))
	require.Equal(t, n-len(bad), count)
}
