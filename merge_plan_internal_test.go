package backfill

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestMergeNeverScansTheTargetSequentially: the merge's statements look
// rows up in the target through its unique index, also when the planner
// believes the target empty (vacuumed while empty). With a sequential
// scan as the inner side of a lookup, a statement that also inserts into
// the target reads the rows it has inserted so far once per staged row:
// n²/2 tuples for a chunk of n (a 1,000,000-row chunk ran for hours).
// History's statements also read the versions of the chunk's keys by one
// lookup per key (a 20,000-row chunk took 13 s when the planner, without
// statistics on staging, read the whole target per staged key).
func TestMergeNeverScansTheTargetSequentially(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for _, tc := range []struct {
		name, ddl string
		target    Target
		rows      func(i int) []any
	}{
		{"upsert", `CREATE TABLE tgt (id bigint PRIMARY KEY, v int)`,
			Target{Table: "tgt", Key: []string{"id"}, Columns: []string{"id", "v"}},
			func(i int) []any { return []any{int64(i), int64(i)} }},
		{"append_only", `CREATE TABLE tgt (id bigint PRIMARY KEY, v int)`,
			Target{Table: "tgt", Key: []string{"id"}, Columns: []string{"id", "v"}, Mode: AppendOnly},
			func(i int) []any { return []any{int64(i), int64(i)} }},
		{"history", `CREATE TABLE tgt (k text, valid_from int, valid_to int, v int, PRIMARY KEY (k, valid_from))`,
			Target{Table: "tgt", Key: []string{"k"}, Columns: []string{"k", "valid_from", "v"}, Mode: History},
			func(i int) []any { return []any{fmt.Sprint("k", i%100), int64(i), int64(i)} }},
	} {
		_, err := db.Exec(`DROP TABLE IF EXISTS tgt; ` + tc.ddl)
		require.NoError(t, err)
		_, err = db.Exec(`VACUUM ANALYZE tgt`) // empty: reltuples 0
		require.NoError(t, err)
		tx, err := db.Beginx()
		require.NoError(t, err)
		m := pgstore.NewMerger()
		info, err := m.Prepare(ctx, tx, tc.target)
		require.NoError(t, err, tc.name)
		st, err := m.Stage(ctx, tx, info)
		require.NoError(t, err)
		for i := range 2000 {
			require.NoError(t, st.Add(ctx, int64(i+1), tc.rows(i)))
		}
		s := st.(*pgstore.PGStager)
		require.NoError(t, s.EndCopy(ctx))
		_, err = tx.Exec(`ANALYZE ` + s.Q.Stage)
		require.NoError(t, err)
		_, err = s.PlannerSettings(ctx)
		require.NoError(t, err)
		for name, q := range map[string]string{"upsert": s.Q.Upsert, "insert": s.Q.Insert, "update": s.Q.Update,
			"close intervals": s.Q.CloseIntervals, "check intervals": s.Q.CheckIntervals, "target conflicts": s.Q.TargetConflicts} {
			if q == "" {
				continue
			}
			var plan []string
			require.NoError(t, tx.Select(&plan, `EXPLAIN `+q, s.Args(q)...), "%s %s", tc.name, name)
			text := strings.Join(plan, "\n")
			require.NotContains(t, text, "Seq Scan on tgt", "%s %s:\n%s", tc.name, name, text)
			if name == "close intervals" {
				require.Contains(t, text, "Index Cond", "close intervals reads the chunk's keys by lookups:\n%s", text)
			}
			if name == "insert" || name == "check intervals" {
				// Inserts look for the staged identity, History reads the
				// versions of the chunk's keys: each read of the target is
				// a lookup (an Index Cond), never the whole index against
				// every staged key. (The updates' joins are left to the
				// planner, which orders them by the target's estimated
				// size: a target it believes empty is read whole once.)
				for i, line := range plan {
					if strings.Contains(line, " on tgt") && strings.Contains(line, "Scan") {
						next := strings.Join(plan[i+1:min(i+3, len(plan))], "\n")
						require.Contains(t, next, "Index Cond", "%s %s: a read of the whole target:\n%s", tc.name, name, text)
					}
				}
			}
		}
		require.NoError(t, st.Close())
		require.NoError(t, tx.Rollback())
	}
}
