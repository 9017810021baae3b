package backfill_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// BenchmarkMergeRestatement measures the merge of a 100,000-row Upsert
// chunk into a table holding its keys: replaying it unchanged, and
// restating every row (each op writes other values), the case the lock
// of the rows to change (merge_decide.go) costs most in.
func BenchmarkMergeRestatement(b *testing.B) {
	const rows = 100_000
	ctx := context.Background()
	db := pgtest.New(b)
	db.MustExec(`CREATE TABLE r (id bigint PRIMARY KEY, name text, amount numeric(12,2), n int)`)
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, backfill.Target{Table: "r", Key: []string{"id"}})
	require.NoError(b, err)
	merge := func(v int) backfilltype.MergeResult {
		tx, err := db.BeginTxx(ctx, nil)
		require.NoError(b, err)
		defer tx.Rollback()
		st, err := m.Stage(ctx, tx, info)
		require.NoError(b, err)
		defer st.Close()
		for i := range int64(rows) {
			require.NoError(b, st.Add(ctx, i+1, []any{i, fmt.Sprintf("name %d/%d", i, v), fmt.Sprintf("%d.%02d", i, v%100), int64(v)}))
		}
		res, err := st.Merge(ctx)
		require.NoError(b, err)
		require.NoError(b, tx.Commit())
		return res
	}
	merge(0)
	merge(0) // past the fresh-insert path
	db.MustExec(`VACUUM ANALYZE r`)
	b.Run("replay", func(b *testing.B) {
		for b.Loop() {
			if r := merge(0); r.Unchanged != rows {
				b.Fatalf("replay: %+v", r)
			}
		}
	})
	b.Run("restate", func(b *testing.B) {
		for v := 1; b.Loop(); v++ {
			if r := merge(v); r.Updated != rows {
				b.Fatalf("restatement: %+v", r)
			}
			b.StopTimer()
			db.MustExec(`VACUUM r`)
			b.StartTimer()
		}
	})
}
