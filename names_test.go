package backfill_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestTypoColumnNamesTheColumnAndSuggests: every column name a Target
// gives that the table lacks is refused with ErrTargetNotFound naming the
// column and its role, listing the table's columns and suggesting the
// closest one.
func TestTypoColumnNamesTheColumnAndSuggests(t *testing.T) {
	t.Parallel()
	key := [][]string{{"id"}}
	for _, c := range []struct {
		name    string
		target  backfill.Target
		msg     string
		closest string
	}{
		{"written", backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "nmae"}}, `written column "nmae"`, "name"},
		{"key", backfill.Target{Table: "t", Key: []string{"idd"}}, `key column "idd"`, "id"},
		{"hash", backfill.Target{Table: "t", Key: []string{"id"}, HashColumn: "row_hsah"}, `hash column "row_hsah"`, "row_hash"},
		{"ingested", backfill.Target{Table: "t", Key: []string{"id"}, IngestedAt: "laoded_at"}, `ingested_at column "laoded_at"`, "loaded_at"},
		{"lineage", backfill.Target{Table: "t", Key: []string{"id"}, Lineage: backfill.Lineage{InsertedBy: "backfill_insertd_by"}}, `lineage inserted_by column "backfill_insertd_by"`, "backfill_inserted_by"},
		{"valid_from", backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History, ValidFrom: "valid_frm"}, `valid_from column "valid_frm"`, "valid_from"},
		{"valid_to", backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History, ValidTo: "valid_t"}, `valid_to column "valid_t"`, "valid_to"},
		{"version", backfill.Target{Table: "t", Key: []string{"id"}, Conflict: backfill.NewerVersionWins, Version: "verison"}, `version column "verison"`, "version"},
		{"derive source", backfill.Target{Table: "t", Key: []string{"name_key"}, Mode: backfill.Keyless, Columns: []string{"name"}, Derive: []backfill.KeyRule{{Column: "name_key", From: "nam"}}},
			`Derive source column "nam"`, "name"},
		{"derive key", backfill.Target{Table: "t", Key: []string{"name_key"}, Mode: backfill.Keyless, Columns: []string{"name"}, Derive: []backfill.KeyRule{{Column: "name_kye", From: "name"}}},
			`Derive rule's key column "name_kye"`, "name_key"},
	} {
		_, err := pgstore.ResolveTarget(c.target, targetTable(), key)
		require.ErrorIs(t, err, backfill.ErrTargetNotFound, c.name)
		require.ErrorContains(t, err, c.msg, c.name)
		require.ErrorContains(t, err, `"id", "name", "name_key", "version"`, c.name)
		require.ErrorContains(t, err, `did you mean "`+c.closest+`"?`, c.name)
	}
}

// TestTypoTableNamesTheSearchPath: a table name that names no table is
// refused with ErrTargetNotFound naming it, the session's search_path and
// its schemas, and the closest table there; a qualified one names its
// schema.
func TestTypoTableNamesTheSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE events (id bigint PRIMARY KEY, v text)`)
	db.MustExec(`CREATE SCHEMA other; CREATE TABLE other.orders (id bigint PRIMARY KEY)`)
	m := pgstore.NewMerger()
	_, err := m.Prepare(ctx, db, backfill.Target{Table: "evnets", Key: []string{"id"}})
	require.ErrorIs(t, err, backfill.ErrTargetNotFound)
	require.ErrorContains(t, err, `table "evnets"`)
	require.ErrorContains(t, err, `search_path ("$user", public: schemas public)`)
	require.ErrorContains(t, err, `did you mean "events"?`)

	_, err = m.Prepare(ctx, db, backfill.Target{Table: "other.ordres", Key: []string{"id"}})
	require.ErrorIs(t, err, backfill.ErrTargetNotFound)
	require.ErrorContains(t, err, `no such table in schema "other"`)
	require.ErrorContains(t, err, `did you mean "other.orders"?`)

	// A column typo against the real table lists its columns.
	_, err = m.Prepare(ctx, db, backfill.Target{Table: "events", Key: []string{"id"}, Columns: []string{"id", "vv"}})
	require.ErrorIs(t, err, backfill.ErrTargetNotFound)
	require.ErrorContains(t, err, `written column "vv" of table "public.events"`)
	require.ErrorContains(t, err, `"id", "v"; did you mean "v"?`)
}

// TestTypoOnTheFakes: the fake merger names a missing table with the
// tables it has, and a missing column with the table's columns.
func TestTypoOnTheFakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := backfilltest.NewMerger()
	m.AddTable("events", []string{"id"}, "id", "v")
	_, err := m.Prepare(ctx, nil, backfill.Target{Table: "evnets", Key: []string{"id"}})
	require.ErrorIs(t, err, backfill.ErrTargetNotFound)
	require.ErrorContains(t, err, `its tables are "events"; did you mean "events"?`)
	_, err = m.Prepare(ctx, nil, backfill.Target{Table: "events", Key: []string{"id"}, Columns: []string{"id", "vv"}})
	require.ErrorIs(t, err, backfill.ErrTargetNotFound)
	require.ErrorContains(t, err, `written column "vv"`)
	require.ErrorContains(t, err, `"id", "v"; did you mean "v"?`)
}

// TestManifestInitHintsSSLMode: a server without SSL, asked for it (lib/pq's
// default sslmode is require), is told to be asked with sslmode=disable.
func TestManifestInitHintsSSLMode(t *testing.T) {
	t.Parallel()
	u := pgtest.NewURL(t)
	ssl := strings.Replace(u, "sslmode=disable", "sslmode=require", 1)
	require.NotEqual(t, u, ssl, "the test server's URL names sslmode=disable")
	db := sqlx.MustOpen("postgres", ssl)
	defer db.Close()
	err := backfill.NewPGManifest("backfill").Init(context.Background(), db)
	require.ErrorContains(t, err, "manifest init: pq: SSL is not enabled on the server")
	require.ErrorContains(t, err, "add sslmode=disable")
}
