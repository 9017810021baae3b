package backfill_test

import (
	"context"
	"errors"
	"testing"

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

	// A validator's parent table is parsed the same way.
	err = run(`"we.ird".t`, "again", backfill.ReferentialIntegrity{Columns: []string{"id"}, ParentTable: `we.ird.t`})
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	require.False(t, errors.Is(err, backfill.ErrTargetNotFound))

	// The canonical name Prepare returns parses back to the same table.
	info, err := backfill.NewPGMerger().Prepare(ctx, db, backfill.Target{Table: `"a""b"."c.d"`, Key: []string{"id"}})
	require.NoError(t, err)
	require.Equal(t, `"a""b"."c.d"`, info.Target.Table)
	info, err = backfill.NewPGMerger().Prepare(ctx, db, backfill.Target{Table: info.Target.Table, Key: []string{"id"}})
	require.NoError(t, err)
	require.Equal(t, `"a""b"."c.d"`, info.Target.Table)
}
