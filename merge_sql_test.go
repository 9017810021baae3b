package backfill

import (
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/stretchr/testify/require"
)

// update rewrites the golden files of generated SQL:
// go test -run Golden -update.
var update = flag.Bool("update", false, "rewrite testdata/*.golden.sql")

// goldenColumns is a hand-built target table: plain columns of types the
// merge compares by their equality, as text (json, point) and under a
// collation of their own, a column whose name needs quoting, and the
// columns the library fills.
func goldenColumns() []Column {
	return []Column{
		{Name: "id", Type: "bigint", BaseType: "int8", NotNull: true},
		{Name: "name", Type: "text", BaseType: "text", Collation: `pg_catalog."C"`},
		{Name: "amount", Type: "numeric(12,2)", BaseType: "numeric", Precision: 12, Scale: 2},
		{Name: "doc", Type: "json", BaseType: "json", TextCompare: true},
		{Name: "pos", Type: "point", BaseType: "point", TextCompare: true},
		{Name: `Odd "col"`, Type: "text", BaseType: "text"},
		{Name: "version", Type: "timestamp with time zone", BaseType: "timestamptz"},
		{Name: "k", Type: "text", BaseType: "text", NotNull: true},
		{Name: "valid_from", Type: "timestamp with time zone", BaseType: "timestamptz", NotNull: true},
		{Name: "valid_to", Type: "timestamp with time zone", BaseType: "timestamptz"},
		{Name: "ingested_at", Type: "timestamp with time zone", BaseType: "timestamptz"},
		{Name: "row_hash", Type: "bytea", BaseType: "bytea"},
		{Name: "inserted_by", Type: "bigint", BaseType: "int8"},
		{Name: "updated_by", Type: "bigint", BaseType: "int8"},
	}
}

// goldenTarget is one golden case: a target and whether its chunk writes
// an undo log.
type goldenTarget struct {
	name   string
	target Target
	unique [][]string
	undo   bool
}

func goldenTargets() []goldenTarget {
	cols := []string{"id", "name", "amount", "doc", "pos", `Odd "col"`, "version"}
	base := func(m func(*Target)) Target {
		t := Target{Table: "sales.orders", Key: []string{"id"}, Columns: cols, Mode: Upsert}
		m(&t)
		return t
	}
	lineage := func(t *Target) {
		t.Lineage = Lineage{InsertedBy: "inserted_by", UpdatedBy: "updated_by"}
		t.IngestedAt = "ingested_at"
	}
	byID := [][]string{{"id"}}
	history := [][]string{{"id", "valid_from"}}
	histCols := append([]string{"valid_from"}, cols...)
	return []goldenTarget{
		{name: "upsert_source_wins", target: base(func(t *Target) { t.Conflict = SourceWins; t.Columns = cols[:6] }), unique: byID},
		{name: "upsert_source_wins_version", target: base(func(t *Target) { t.Conflict = SourceWins; t.Version = "version" }), unique: byID},
		{name: "upsert_target_wins", target: base(func(t *Target) { t.Conflict = TargetWins }), unique: byID},
		{name: "upsert_newer_version_wins", target: base(func(t *Target) { t.Conflict = NewerVersionWins; t.Version = "version" }), unique: byID},
		{name: "upsert_keep_first", target: base(func(t *Target) { t.Duplicates = KeepFirst }), unique: byID},
		{name: "upsert_hash", target: base(func(t *Target) { t.HashColumn = "row_hash" }), unique: byID},
		{name: "upsert_key_only", target: base(func(t *Target) { t.Columns = []string{"id"} }), unique: byID},
		{name: "upsert_source_wins_lineage", target: base(lineage), unique: byID},
		{name: "upsert_source_wins_lineage_undo", target: base(lineage), unique: byID, undo: true},
		{name: "upsert_target_wins_lineage_undo", target: base(func(t *Target) { lineage(t); t.Conflict = TargetWins }), unique: byID, undo: true},
		{name: "upsert_newer_version_wins_lineage_undo", target: base(func(t *Target) {
			lineage(t)
			t.Conflict, t.Version, t.HashColumn = NewerVersionWins, "version", "row_hash"
		}), unique: byID, undo: true},
		{name: "append_only", target: base(func(t *Target) { t.Mode = AppendOnly }), unique: byID},
		{name: "append_only_lineage", target: base(func(t *Target) { t.Mode = AppendOnly; lineage(t); t.HashColumn = "row_hash" }), unique: byID},
		{name: "history", target: base(func(t *Target) { t.Mode, t.Columns = History, histCols }), unique: history},
		{name: "history_lineage_undo", target: base(func(t *Target) { t.Mode, t.Columns = History, histCols; lineage(t) }), unique: history, undo: true},
		{name: "keyless", target: base(func(t *Target) {
			t.Mode, t.Key = Keyless, []string{"k"}
			t.Derive = []KeyRule{{Column: "k", From: "name", Rules: []Normalizer{Trim}}}
		}), unique: [][]string{{"k"}}},
	}
}

// goldenInfo resolves a golden case as Prepare would, without a server.
func goldenInfo(t testing.TB, g goldenTarget) TableInfo {
	t.Helper()
	info, err := pgstore.ResolveTarget(g.target, goldenColumns(), g.unique)
	require.NoError(t, err, g.name)
	info.Chunk = backfilltype.ChunkRef{BatchID: 7, Seq: 3}
	if g.undo {
		info.Chunk.UndoTable = `"backfill"."undo"`
	}
	if info.Target.Lineage.UpdatedBy != "" {
		info.Chunk.DeliveredTable = `"backfill"."delivered"`
	}
	return info
}

// checkGolden compares got with testdata/name.golden.sql byte for byte,
// or rewrites the file under -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden.sql")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -run Golden -update to create it")
	require.Equal(t, string(want), got, "generated SQL of %s differs from %s (go test -run Golden -update rewrites it)", name, path)
}

// goldenStatements renders named statements, skipping empty ones, in the
// given order.
func goldenStatements(stmts [][2]string) string {
	var b strings.Builder
	for _, s := range stmts {
		if s[1] == "" {
			continue
		}
		b.WriteString("-- " + s[0] + "\n" + strings.TrimSpace(s[1]) + ";\n\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// mergeStatements lists the fields of q in declaration order.
func mergeStatements(q pgstore.PGMergeSQL) [][2]string {
	v := reflect.ValueOf(q)
	var out [][2]string
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		out = append(out, [2]string{strings.ToLower(name[:1]) + name[1:], v.Field(i).String()})
	}
	return out
}

// TestMergeSQLGolden pins the SQL buildMergeSQL generates for each mode
// and policy: a change to it shows in review as a change of
// testdata/merge_*.golden.sql.
func TestMergeSQLGolden(t *testing.T) {
	for _, g := range goldenTargets() {
		t.Run(g.name, func(t *testing.T) {
			checkGolden(t, "merge_"+g.name, goldenStatements(mergeStatements(pgstore.BuildMergeSQL(goldenInfo(t, g)))))
		})
	}
}

// TestComparedColumns pins the one definition of what a merge compares,
// per mode and policy.
func TestComparedColumns(t *testing.T) {
	want := map[string]pgstore.ComparedColumns{
		"upsert_source_wins": {Identity: []string{"id"}, Content: []string{"name", "amount", "doc", "pos", `Odd "col"`},
			Written: []string{"name", "amount", "doc", "pos", `Odd "col"`}, Tracked: []string{"name", "amount", "doc", "pos", `Odd "col"`},
			Compared: []string{"name", "amount", "doc", "pos", `Odd "col"`}, Checked: []string{"name", "amount", "doc", "pos", `Odd "col"`}},
		"upsert_newer_version_wins_lineage_undo": {Identity: []string{"id"},
			Content:  []string{"name", "amount", "doc", "pos", `Odd "col"`, "version", "row_hash", "ingested_at", "inserted_by", "updated_by"},
			Written:  []string{"name", "amount", "doc", "pos", `Odd "col"`, "version", "row_hash", "ingested_at", "updated_by"},
			Tracked:  []string{"name", "amount", "doc", "pos", `Odd "col"`, "version"},
			Compared: []string{"row_hash"},
			Checked:  []string{"name", "amount", "doc", "pos", `Odd "col"`, "version", "row_hash"}},
		"history": {Identity: []string{"id", "valid_from"}, Content: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version"},
			Written: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version"}, Tracked: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version"},
			Compared: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version"}, Checked: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version"}},
		"keyless": {Identity: []string{"k"}, Content: []string{"id", "name", "amount", "doc", "pos", `Odd "col"`, "version"},
			Written: []string{"id", "name", "amount", "doc", "pos", `Odd "col"`, "version"}, Tracked: []string{"id", "amount", "doc", "pos", `Odd "col"`, "version"},
			Compared: []string{"id", "amount", "doc", "pos", `Odd "col"`, "version"}, Checked: []string{"id", "amount", "doc", "pos", `Odd "col"`, "version"}},
	}
	for _, g := range goldenTargets() {
		w, ok := want[g.name]
		if !ok {
			continue
		}
		got := pgstore.CompareColumns(goldenInfo(t, g))
		got.Cols = nil
		require.Equal(t, w, got, g.name)
	}
}

func TestSQLF(t *testing.T) {
	require.Equal(t, `SELECT "{b}" FROM x WHERE {unknown} AND {`, pgstore.SQLf(`SELECT {a} FROM x WHERE {unknown} AND {`, "a", `"{b}"`, "b", "never"))
}
