package backfill

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

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
	m := NewPGMerger()
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
	s := st.(*pgStager)
	require.NoError(t, s.endCopy(ctx))
	_, err = s.plannerSettings(ctx)
	require.NoError(t, err)
	iso := &isolation{s: s}
	require.Equal(t, []int64{2, 3, 4, 5}, iso.suspects(ctx))
	var ok bool
	require.NoError(t, tx.Get(&ok, `SELECT true`), "the transaction is healthy")
	require.True(t, ok)
}
