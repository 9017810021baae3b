package backfill_test

import (
	"testing"

	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// targetTable is a table with every kind of column ResolveTarget looks
// at, in table order.
func targetTable() []backfill.Column {
	return []backfill.Column{
		{Name: "id", Type: "bigint", BaseType: "int8", NotNull: true},
		{Name: "name", Type: "text", BaseType: "text"},
		{Name: "name_key", Type: "text", BaseType: "text"},
		{Name: "version", Type: "integer", BaseType: "int4"},
		{Name: "valid_from", Type: "date", BaseType: "date"},
		{Name: "valid_to", Type: "date", BaseType: "date"},
		{Name: "row_hash", Type: "bytea", BaseType: "bytea"},
		{Name: "loaded_at", Type: "timestamp with time zone", BaseType: "timestamptz"},
		{Name: "backfill_inserted_by", Type: "bigint", BaseType: "int8"},
		{Name: "backfill_updated_by", Type: "bigint", BaseType: "int8"},
	}
}

// TestResolveTargetColumns: the written columns (by default every column
// the library does not fill) come first, then the derived keys, hash,
// ingestion time and lineage columns, each marked; defaults are filled
// in; History's ValidFrom becomes NOT NULL.
func TestResolveTargetColumns(t *testing.T) {
	t.Parallel()
	type col struct {
		Name, Computed string
		Key, NotNull   bool
	}
	cols := func(info backfill.TableInfo) []col {
		var out []col
		for _, c := range info.Columns {
			out = append(out, col{c.Name, c.Computed, c.Key, c.NotNull})
		}
		return out
	}
	info, err := pgstore.ResolveTarget(backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History, HashColumn: "row_hash", IngestedAt: "loaded_at"},
		targetTable(), [][]string{{"name"}, {"valid_from", "id"}})
	require.NoError(t, err)
	require.Equal(t, backfill.KeepLast, info.Target.Duplicates)
	require.Equal(t, "valid_to", info.Target.ValidTo)
	require.Equal(t, backfill.Lineage{InsertedBy: "backfill_inserted_by", UpdatedBy: "backfill_updated_by"}, info.Target.Lineage)
	require.Equal(t, []string{"id", "name", "name_key", "version", "valid_from"}, info.Target.Columns)
	require.Equal(t, 5, info.Written)
	if d := cmp.Diff([]col{
		{"id", "", true, true}, {"name", "", false, false}, {"name_key", "", false, false}, {"version", "", false, false}, {"valid_from", "", false, true},
		{"row_hash", "hash", false, false}, {"loaded_at", "ingested", false, false},
		{"backfill_inserted_by", "inserted_by", false, false}, {"backfill_updated_by", "updated_by", false, false},
	}, cols(info)); d != "" {
		t.Errorf("columns (-want +got):\n%s", d)
	}

	info, err = pgstore.ResolveTarget(backfill.Target{Table: "t", Key: []string{"name_key"}, Mode: backfill.Keyless, Columns: []string{"name", "version"},
		Derive: []backfill.KeyRule{{Column: "name_key", From: "name"}}, Lineage: backfill.Lineage{Off: true}},
		targetTable(), [][]string{{"name_key"}})
	require.NoError(t, err)
	require.Equal(t, backfill.Lineage{Off: true}, info.Target.Lineage)
	if d := cmp.Diff([]col{{"name", "", false, false}, {"version", "", false, false}, {"name_key", "derive", true, false}}, cols(info)); d != "" {
		t.Errorf("keyless columns (-want +got):\n%s", d)
	}
	info, err = pgstore.ResolveTarget(backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "name"}}, targetTable(), [][]string{{"id"}})
	require.NoError(t, err)
	require.Equal(t, backfill.Upsert, info.Target.Mode)
	require.Equal(t, backfill.SourceWins, info.Target.Conflict)
}

// TestResolveTargetRefuses: each inconsistency is refused with its own
// error, checked in phase order (the first that applies wins).
func TestResolveTargetRefuses(t *testing.T) {
	t.Parallel()
	key := [][]string{{"id"}}
	for _, c := range []struct {
		name   string
		target backfill.Target
		unique [][]string
		is     error
		msg    string
	}{
		{"no table", backfill.Target{Key: []string{"id"}}, key, backfill.ErrInvalidConfig, "Target.Table is required"},
		{"no key", backfill.Target{Table: "t"}, key, backfill.ErrInvalidConfig, "Target.Key is required"},
		{"bad mode", backfill.Target{Table: "t", Key: []string{"id"}, Mode: "x"}, key, backfill.ErrInvalidConfig, `Target.Mode "x" is not supported`},
		{"two rules", backfill.Target{Table: "t", Key: []string{"name_key"}, Mode: backfill.Keyless, Derive: []backfill.KeyRule{{Column: "name_key", From: "name"}, {Column: "name_key", From: "name"}}}, key,
			backfill.ErrInvalidConfig, `two Derive rules for key column "name_key"`},
		{"rule of no key", backfill.Target{Table: "t", Key: []string{"name_key"}, Mode: backfill.Keyless, Derive: []backfill.KeyRule{{Column: "name", From: "name"}}}, key,
			backfill.ErrInvalidConfig, `Derive rule for "name", which is not a Key column`},
		{"keyless without rule", backfill.Target{Table: "t", Key: []string{"name_key"}, Mode: backfill.Keyless}, key,
			backfill.ErrInvalidConfig, `Keyless mode needs a Derive rule for key column "name_key"`},
		{"computed written", backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "row_hash"}, HashColumn: "row_hash"}, key,
			backfill.ErrInvalidConfig, `column "row_hash" is filled by the library`},
		{"missing written", backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "nope"}}, key, backfill.ErrTargetNotFound, `written column "nope"`},
		{"key not written", backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"name"}}, key, backfill.ErrInvalidConfig, `key column "id" is not in Target.Columns`},
		{"derive source not written", backfill.Target{Table: "t", Key: []string{"name_key"}, Mode: backfill.Keyless, Columns: []string{"version"}, Derive: []backfill.KeyRule{{Column: "name_key", From: "name"}}}, key,
			backfill.ErrInvalidConfig, `Derive source "name" of key column "name_key" is not in Target.Columns`},
		{"derived key missing", backfill.Target{Table: "t", Key: []string{"nope"}, Mode: backfill.Keyless, Columns: []string{"name"}, Derive: []backfill.KeyRule{{Column: "nope", From: "name"}}}, key,
			backfill.ErrTargetNotFound, `derived key column "nope"`},
		{"hash missing", backfill.Target{Table: "t", Key: []string{"id"}, HashColumn: "nope"}, key, backfill.ErrTargetNotFound, `hash column "nope"`},
		{"hash type", backfill.Target{Table: "t", Key: []string{"id"}, HashColumn: "version"}, key, backfill.ErrInvalidConfig, `HashColumn "version" must be bytea or text, not integer`},
		{"ingested type", backfill.Target{Table: "t", Key: []string{"id"}, IngestedAt: "valid_from"}, key, backfill.ErrInvalidConfig, `IngestedAt "valid_from" must be timestamptz, not date`},
		{"lineage missing", backfill.Target{Table: "t", Key: []string{"id"}, Lineage: backfill.Lineage{UpdatedBy: "nope"}}, key, backfill.ErrTargetNotFound, `lineage updated_by column "nope"`},
		{"lineage type", backfill.Target{Table: "t", Key: []string{"id"}, Lineage: backfill.Lineage{InsertedBy: "name"}}, key, backfill.ErrInvalidConfig, `lineage column "name" must be bigint, not text`},
		{"valid_from in key", backfill.Target{Table: "t", Key: []string{"id", "valid_from"}, Mode: backfill.History}, key, backfill.ErrInvalidConfig, `ValidFrom "valid_from" must not be in Key`},
		{"valid_from not written", backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History, Columns: []string{"id"}}, key, backfill.ErrInvalidConfig, `ValidFrom "valid_from" must be in Target.Columns`},
		{"valid_to missing", backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History, ValidTo: "nope"}, key, backfill.ErrTargetNotFound, `valid_to column "nope"`},
		{"valid_to type", backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History, ValidTo: "loaded_at"}, key, backfill.ErrInvalidConfig, `must have the same type`},
		{"version is key", backfill.Target{Table: "t", Key: []string{"id"}, Conflict: backfill.NewerVersionWins, Version: "id"}, key, backfill.ErrInvalidConfig, `Version "id" must be a non-key column`},
		{"no unique index", backfill.Target{Table: "t", Key: []string{"id"}}, [][]string{{"id", "name"}}, backfill.ErrNoUniqueKey, `table "t" key (id)`},
		{"history identity", backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History}, key, backfill.ErrNoUniqueKey, `key (id, valid_from)`},
	} {
		_, err := pgstore.ResolveTarget(c.target, targetTable(), c.unique)
		require.ErrorIs(t, err, c.is, c.name)
		require.ErrorContains(t, err, c.msg, c.name)
	}
	table := append(targetTable(), backfill.Column{Name: pgstore.ReservedPrefix + "x", BaseType: "text"})
	_, err := pgstore.ResolveTarget(backfill.Target{Table: "t", Key: []string{"id"}}, table, key)
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	require.ErrorContains(t, err, "are reserved")
	table = targetTable()
	table[5].NotNull = true
	_, err = pgstore.ResolveTarget(backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History}, table, key)
	require.ErrorContains(t, err, `ValidTo "valid_to" must be nullable`)
}
