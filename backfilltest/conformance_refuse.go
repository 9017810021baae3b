package backfilltest

import (
	"context"
	"fmt"
	"testing"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// testRefusals is the part of [TestMerger] about rows the target refuses
// at merge time (see TableInfo.Chunk.MaxRefused): a row that violates a
// unique constraint other than the key (against the target or an
// earlier row of the chunk) or a CHECK is returned as rejected, with its
// row, identity and a reason naming the constraint with PostgreSQL's
// message and SQLSTATE; the other rows merge; a replay refuses the same
// rows and changes nothing; past MaxRefused the merge fails with
// [backfill.ErrTooManyRejects] naming the row, key and constraint.
func testRefusals(t *testing.T, newHarness func(t *testing.T) MergerHarness) {
	ctx := context.Background()
	type run struct {
		res backfilltype.MergeResult
		err error
	}
	merge := func(t *testing.T, h MergerHarness, info backfill.TableInfo, rows ...[]any) run {
		t.Helper()
		tx, err := h.DB.Begin(ctx)
		require.NoError(t, err)
		st, err := h.Merger.Stage(ctx, tx, info)
		require.NoError(t, err)
		defer st.Close()
		for i, r := range rows {
			require.NoError(t, st.Add(ctx, int64(i+1), r))
		}
		res, err := st.Merge(ctx)
		if err != nil {
			require.NoError(t, tx.Rollback())
			return run{err: err}
		}
		require.NoError(t, tx.Commit())
		return run{res: res}
	}
	// refused lists the rejected rows as "row key: reason prefix".
	refused := func(r backfilltype.MergeResult, prefixLen map[int64]int) []string {
		var out []string
		for _, e := range r.Rejected {
			reason := e.Reason
			if n := prefixLen[e.Row]; n > 0 && len(reason) > n {
				reason = reason[:n]
			}
			out = append(out, fmt.Sprintf("%d %s %s: %s", e.Row, e.Column, e.Value, reason))
		}
		return out
	}
	// History and Keyless: a unique constraint on city, against the
	// target and an earlier row of the chunk.
	for _, tc := range []struct {
		name   string
		def    []ColumnDef
		unique []string
		target backfill.Target
		seed   []any
		chunk  [][]any
		keys   []string // the refused rows' identities start so
		values []string // the refused rows' city
		rows   [][]any  // the table after the merge
	}{
		{"history", historyDef, []string{"customer", "valid_from"},
			backfill.Target{Key: []string{"customer"}, Mode: backfill.History, Columns: []string{"customer", "valid_from", "city"}},
			[]any{"c1", day(1), "paris"},
			[][]any{{"c2", day(1), "rome"}, {"c3", day(1), "paris"}, {"c2", day(2), "rome"}, {"c2", day(3), "oslo"}},
			[]string{"(c3, 2024-01-01", "(c2, 2024-01-02"}, []string{"paris", "rome"},
			[][]any{{"c1", day(1), nil, "paris"}, {"c2", day(1), day(3), "rome"}, {"c2", day(3), nil, "oslo"}}},
		{"keyless", legacyDef, []string{"name_key"},
			backfill.Target{Key: []string{"name_key"}, Mode: backfill.Keyless, Columns: []string{"name", "city"},
				Derive: []backfill.KeyRule{{Column: "name_key", From: "name", Rules: []backfill.Normalizer{backfill.CaseFold}}}},
			[]any{"A", "paris", "a"},
			[][]any{{"B", "rome", "b"}, {"C", "paris", "c"}, {"D", "rome", "d"}, {"E", "oslo", "e"}},
			[]string{"(c)", "(d)"}, []string{"paris", "rome"},
			[][]any{{"a", "A", "paris"}, {"b", "B", "rome"}, {"e", "E", "oslo"}}},
	} {
		t.Run("Refusals/"+tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.AddUnique == nil {
				t.Skip("the harness cannot add constraints")
			}
			table := "refuse_" + tc.name
			h.CreateTable(t, table, tc.def, tc.unique)
			h.AddUnique(t, table, table+"_city_key", []string{"city"})
			tc.target.Table = table
			info, err := h.Merger.Prepare(ctx, h.DB, tc.target)
			require.NoError(t, err)
			info.Chunk.MaxRefused = 10
			require.Empty(t, merge(t, h, info, tc.seed).res.Rejected)
			for range 2 { // the load, then a replay
				got := merge(t, h, info, tc.chunk...)
				require.NoError(t, got.err)
				require.Len(t, got.res.Rejected, 2)
				for i, e := range got.res.Rejected {
					require.EqualValues(t, i+2, e.Row)
					require.Equal(t, tc.values[i], e.Value, "the refused column's value")
					require.Contains(t, e.Reason, "; key "+tc.keys[i], "the row's key in the reason")
					require.Equal(t, "city", e.Column)
					require.Contains(t, e.Reason, fmt.Sprintf(`refused by the target: duplicate key value violates unique constraint "%[1]s_city_key" (SQLSTATE 23505); constraint "%[1]s_city_key"`, table))
				}
				require.Equal(t, sortRows(tc.rows), sortRows(h.Rows(t, table)))
			}
		})
	}
	for _, mode := range []backfill.Mode{backfill.Upsert, backfill.AppendOnly} {
		setup := func(t *testing.T, table string) (MergerHarness, backfill.TableInfo) {
			h := newHarness(t)
			if h.AddUnique == nil || h.AddCheck == nil {
				t.Skip("the harness cannot add constraints")
			}
			h.CreateTable(t, table, eventsDef, []string{"event_id"})
			h.AddUnique(t, table, table+"_kind_key", []string{"kind"})
			h.AddCheck(t, table, table+"_amount_check", "amount", 0)
			info, err := h.Merger.Prepare(ctx, h.DB, backfill.Target{Table: table, Key: []string{"event_id"}, Mode: mode})
			require.NoError(t, err)
			info.Chunk.MaxRefused = 10
			require.Empty(t, merge(t, h, info, []any{"e1", "k1", int64(1)}).res.Rejected)
			return h, info
		}
		chunk := [][]any{
			{"e2", "k2", int64(2)},
			{"e3", "k1", int64(3)}, // k1 is e1's in the target
			{"e4", "k4", int64(4)},
			{"e5", "k4", int64(5)}, // k4 is e4's, an earlier row of the chunk
			{"e6", nil, int64(6)},  // NULLs are distinct
			{"e7", nil, int64(-7)}, // CHECK (amount >= 0)
			{"e8", nil, nil},       // a NULL passes a CHECK
		}
		t.Run("Refusals/"+string(mode), func(t *testing.T) {
			t.Parallel()
			table := "refuse_" + string(mode)
			h, info := setup(t, table)
			first := merge(t, h, info, chunk...)
			require.NoError(t, first.err)
			want := []string{
				fmt.Sprintf(`2 kind k1: refused by the target: duplicate key value violates unique constraint "%[1]s_kind_key" (SQLSTATE 23505); constraint "%[1]s_kind_key"; Key (kind)=(k1) already exists.; key (e3)`, table),
				fmt.Sprintf(`4 kind k4: refused by the target: duplicate key value violates unique constraint "%[1]s_kind_key" (SQLSTATE 23505); constraint "%[1]s_kind_key"; Key (kind)=(k4) already exists.; key (e5)`, table),
				fmt.Sprintf(`6 amount -7: refused by the target: new row for relation "%[1]s" violates check constraint "%[1]s_amount_check" (SQLSTATE 23514); constraint "%[1]s_amount_check"`, table),
			}
			// PostgreSQL adds a "Failing row contains" detail to a CHECK's.
			check := len(want[2]) - len("6 amount -7: ")
			require.Equal(t, want, refused(first.res, map[int64]int{6: check}))
			require.Equal(t, [4]int64{4, 0, 0, 0}, [4]int64{first.res.Inserted, first.res.Updated, first.res.Unchanged, first.res.Deduplicated})
			require.Equal(t, sortRows([][]any{{"e1", "k1", int64(1)}, {"e2", "k2", int64(2)}, {"e4", "k4", int64(4)}, {"e6", nil, int64(6)}, {"e8", nil, nil}}),
				sortRows(h.Rows(t, table)))
			for _, e := range first.res.Rejected {
				require.NotEmpty(t, e.Raw)
			}

			replay := merge(t, h, info, chunk...)
			require.NoError(t, replay.err)
			require.Equal(t, want, refused(replay.res, map[int64]int{6: check}), "a replay refuses the same rows")
			require.Equal(t, [4]int64{0, 0, 4, 0}, [4]int64{replay.res.Inserted, replay.res.Updated, replay.res.Unchanged, replay.res.Deduplicated})
			require.Len(t, h.Rows(t, table), 5)
		})
		t.Run("RefusalsBounded/"+string(mode), func(t *testing.T) {
			t.Parallel()
			table := "bound_" + string(mode)
			h, info := setup(t, table)
			for _, tc := range []struct {
				max  int
				want string
			}{
				{2, fmt.Sprintf(`row 6 key (e7) refused by the target: new row for relation "%[1]s" violates check constraint "%[1]s_amount_check" (SQLSTATE 23514); constraint "%[1]s_amount_check"`, table)},
				{0, fmt.Sprintf(`row 2 key (e3) refused by the target: duplicate key value violates unique constraint "%[1]s_kind_key" (SQLSTATE 23505)`, table)},
			} {
				info.Chunk.MaxRefused = tc.max
				got := merge(t, h, info, chunk...)
				require.ErrorIs(t, got.err, backfill.ErrTooManyRejects)
				require.Contains(t, got.err.Error(), tc.want)
				require.Contains(t, got.err.Error(), fmt.Sprintf("%d rows of this chunk were refused already (Config.MaxMergeRefusals)", tc.max))
				require.Len(t, h.Rows(t, table), 1, "a failed merge writes nothing")
			}
		})
	}
}
