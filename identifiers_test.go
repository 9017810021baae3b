package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestDottedTableNames: a table name is split on a dot outside double
// quotes only, a quoted part may hold dots, and a name that could mean
// two tables is refused. The database has both readings of "we.ird.t":
// table "t" of schema "we.ird" and a decoy, table "ird.t" of schema "we".
// Before the fix, Target.Table "we.ird.t" wrote into the decoy.
func TestDottedTableNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`
		CREATE SCHEMA "we.ird"; CREATE TABLE "we.ird".t (id int PRIMARY KEY, v text, backfill_inserted_by bigint, backfill_updated_by bigint);
		CREATE SCHEMA we; CREATE TABLE we."ird.t" (id int PRIMARY KEY, v text, backfill_inserted_by bigint, backfill_updated_by bigint);
		CREATE SCHEMA "a""b"; CREATE TABLE "a""b"."c.d" (id int PRIMARY KEY, v text, backfill_inserted_by bigint, backfill_updated_by bigint);
		CREATE TABLE "we.ird.t" (id int PRIMARY KEY, v text, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	run := func(table, v string, validators ...backfill.Validator) error {
		_, err := r.Run(ctx, backfill.Job{Name: "dots " + table + v, Chunker: backfill.List("one"),
			Extractor:  rowsFunc([]any{1, v}),
			Validators: validators,
			Target:     backfill.Target{Table: table, Key: []string{"id"}}})
		return err
	}
	contents := func() map[string]string {
		got := map[string]string{}
		for _, tb := range []string{`"we.ird".t`, `we."ird.t"`, `"a""b"."c.d"`, `"we.ird.t"`} {
			var v []string
			require.NoError(t, db.Select(&v, `SELECT v FROM `+tb))
			if len(v) > 0 {
				got[tb] = v[0]
			}
		}
		return got
	}

	for _, bad := range []string{`we.ird.t`, `we..t`, `.t`, `we.`, `"we.ird.t`, `"we"ird.t`, `we"ird.t`} {
		err := run(bad, "x")
		require.ErrorIs(t, err, backfill.ErrInvalidConfig, "%s", bad)
		require.Empty(t, contents(), "%s wrote somewhere", bad)
	}

	require.NoError(t, run(`"we.ird".t`, "schema we.ird", backfill.Completeness{CompareContent: true, Exact: true}, backfill.Sample{},
		backfill.ReferentialIntegrity{Columns: []string{"id"}, ParentTable: `"we.ird".t`}))
	require.NoError(t, run(`we."ird.t"`, "table ird.t"))
	require.NoError(t, run(`"a""b"."c.d"`, "quotes"))
	require.NoError(t, run(`"we.ird.t"`, "one name"))
	require.Equal(t, map[string]string{`"we.ird".t`: "schema we.ird", `we."ird.t"`: "table ird.t", `"a""b"."c.d"`: "quotes", `"we.ird.t"`: "one name"}, contents())

	// A versioned view of a dotted name over a target of a dotted name:
	// the versions are created next to the target, the view where named.
	for v := range 2 {
		_, err = r.Run(ctx, backfill.Job{Name: "dots view", NewRun: true, Chunker: backfill.List("one"),
			Extractor: rowsFunc([]any{1, []string{"first", "second"}[v]}),
			Publish:   backfill.Publish{Mode: backfill.PublishVersionedView, View: `"we.ird"."v.1"`},
			Target:    backfill.Target{Table: `"we.ird".t`, Key: []string{"id"}, Columns: []string{"id", "v"}}})
		require.NoError(t, err)
		var got string
		require.NoError(t, db.Get(&got, `SELECT v FROM "we.ird"."v.1"`))
		require.Equal(t, []string{"first", "second"}[v], got)
	}
	require.Equal(t, "schema we.ird", contents()[`"we.ird".t`], "the base table keeps its rows")
	_, err = r.Run(ctx, backfill.Job{Name: "dots bad view", Chunker: backfill.List("one"), Extractor: rowsFunc([]any{1, "x"}),
		Publish: backfill.Publish{Mode: backfill.PublishVersionedView, View: `we.ird.v`},
		Target:  backfill.Target{Table: `"we.ird".t`, Key: []string{"id"}}})
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)

	// Partition swap under a parent and partitions with dots in their
	// names: the new partitions are created next to the old ones.
	_, err = db.Exec(`CREATE SCHEMA "p.s";
		CREATE TABLE "p.s"."sa.les" (day timestamptz NOT NULL, id int NOT NULL, v text, PRIMARY KEY (day, id)) PARTITION BY RANGE (day);
		CREATE TABLE "p.s"."d.1" PARTITION OF "p.s"."sa.les" FOR VALUES FROM ('2024-01-01 00:00Z') TO ('2024-01-02 00:00Z');
		CREATE TABLE "p.s"."d.2" PARTITION OF "p.s"."sa.les" FOR VALUES FROM ('2024-01-02 00:00Z') TO ('2024-01-03 00:00Z')`)
	require.NoError(t, err)
	from := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	swap := backfill.Job{Name: "dots swap", ChunkColumn: "day", Chunker: backfill.Days(from, from.AddDate(0, 0, 2), time.UTC),
		Publish: backfill.Publish{Mode: backfill.PublishPartitionSwap},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, c.Start, 1, "swapped")
		}),
		Target: backfill.Target{Table: `"p.s"."sa.les"`, Key: []string{"day", "id"}}}
	rep, err := r.Run(ctx, swap)
	require.NoError(t, err)
	var parts []string
	require.NoError(t, db.Select(&parts, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = '"p.s"."sa.les"'::regclass ORDER BY 1`))
	require.Equal(t, []string{fmt.Sprintf("d.1__v%d", rep.BatchID), fmt.Sprintf("d.2__v%d", rep.BatchID)}, parts)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM "p.s"."sa.les" WHERE v = 'swapped'`))
	require.Equal(t, 2, n)
	_, err = r.Rollback(ctx, swap, backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "test", Why: "dots"})
	require.NoError(t, err)
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM "p.s"."sa.les"`))
	require.Zero(t, n, "the old, empty partitions are back")

	// A validator's parent table is parsed the same way.
	err = run(`"we.ird".t`, "again", backfill.ReferentialIntegrity{Columns: []string{"id"}, ParentTable: `we.ird.t`})
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	require.False(t, errors.Is(err, backfill.ErrTargetNotFound))

	// The canonical name Prepare returns parses back to the same table.
	info, err := pgstore.NewMerger().Prepare(ctx, db, backfill.Target{Table: `"a""b"."c.d"`, Key: []string{"id"}})
	require.NoError(t, err)
	require.Equal(t, `"a""b"."c.d"`, info.Target.Table)
	info, err = pgstore.NewMerger().Prepare(ctx, db, backfill.Target{Table: info.Target.Table, Key: []string{"id"}})
	require.NoError(t, err)
	require.Equal(t, `"a""b"."c.d"`, info.Target.Table)
}
