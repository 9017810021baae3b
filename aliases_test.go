package backfill_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// generatedNames are the names the SQL builders (merge_pg.go,
// merge_keyless.go, validate_pg.go, validate_fingerprint.go,
// rollback_pg.go, backfill_publish*.go) give to table aliases, CTEs,
// subquery columns and result columns, collected from their SQL text,
// plus reserved words, mixed case, quotes, spaces and dots. A user's
// column or table may carry any of them.
var generatedNames = []string{
	// table aliases and CTE names
	"a", "b", "c", "d", "e", "f", "i", "j", "k", "m", "n", "o", "p", "r", "s", "t", "u", "uu", "v", "x", "y", "z", "one", "w",
	// result and subquery columns
	"rn", "cnt", "row", "rows", "raw", "key", "op", "id", "grp", "ss", "ts", "diffs", "missing", "first_row", "existing",
	"next_from", "inserted", "updated", "unchanged", "deleted", "restored", "before", "hash_sum", "groups", "differing",
	"staging", "target", "kind", "name", "oid", "batch_id", "seq", "status", "_row", "_order", "_g0", "_g1", "_sn", "_tn",
	"_ss0", "_ts0", "_sz0", "_tz0", "_sz", "_tz", "_mbad", "backfill_rollback_keys", "undo",
	// reserved words and awkward spellings
	"select", "order", "group", "user", "table", "from", "where", "all", "Mixed Case", `q"uote`, "sp ace", "dot.ted", "ÄÖ",
}

// aliasRoles are the columns of the generated target with a role; every
// other name becomes a text column of content.
var aliasRoles = []string{"key", "chunk", "day", "dim", "measure", "ref", "content", "ins", "upd", "version", "vfrom", "vto", "src", "hash", "ingested"}

type aliasMode struct {
	name     string
	mode     backfill.Mode
	conflict backfill.ConflictPolicy
	publish  backfill.PublishMode
}

var aliasModes = []aliasMode{
	{"upsert_source_wins", backfill.Upsert, backfill.SourceWins, ""},
	{"upsert_target_wins", backfill.Upsert, backfill.TargetWins, ""},
	{"upsert_newer_version_wins", backfill.Upsert, backfill.NewerVersionWins, ""},
	{"append_only", backfill.AppendOnly, "", ""},
	{"history", backfill.History, "", ""},
	{"keyless", backfill.Keyless, "", ""},
	{"upsert_publish_at_end", backfill.Upsert, backfill.SourceWins, backfill.PublishAtEnd},
	{"upsert_versioned_view", backfill.Upsert, backfill.SourceWins, backfill.PublishVersionedView},
}

// aliasOutcome is what a scenario did, in terms that do not name columns.
type aliasOutcome struct {
	Errors     []string
	Counts     []backfill.Counts
	Checks     [][]string
	Tables     []string
	Exceptions []int
	Rollback   string
}

// runAliasScenario loads a target whose schema, table and columns are
// named by names (role -> name; extra: the other content columns) in
// two batches with every check, rolls back the second batch and returns
// what happened. Unexpected errors are part of the outcome, not fatal.
func runAliasScenario(t require.TestingT, db *sqlx.DB, schema string, m aliasMode, tableName, parentName, parentCol string, role map[string]string, extra []string) aliasOutcome {
	ctx := context.Background()
	var out aliasOutcome
	cols := []string{}
	defs := []string{}
	types := map[string]string{"key": "text", "chunk": "int", "day": "timestamptz", "dim": "text", "measure": "numeric(12,2)",
		"ref": "int", "content": "text", "ins": "bigint", "upd": "bigint", "version": "int", "vfrom": "date", "vto": "date", "src": "text",
		"hash": "bytea", "ingested": "timestamptz"}
	var compared []string // the table's columns but the ingestion time, in order
	for _, r := range aliasRoles {
		if (r == "version" && m.conflict != backfill.NewerVersionWins) || ((r == "vfrom" || r == "vto") && m.mode != backfill.History) ||
			(r == "src" && m.mode != backfill.Keyless) {
			continue
		}
		defs = append(defs, sqlgen.Ident(role[r])+" "+types[r])
		if r != "ingested" {
			compared = append(compared, role[r])
		}
		if r != "ins" && r != "upd" && r != "vto" && r != "hash" && r != "ingested" && !(r == "key" && m.mode == backfill.Keyless) {
			cols = append(cols, role[r])
		}
	}
	for _, e := range extra {
		defs = append(defs, sqlgen.Ident(e)+" text")
		cols = append(cols, e)
		compared = append(compared, e)
	}
	unique := sqlgen.Ident(role["key"])
	if m.mode == backfill.History {
		unique += ", " + sqlgen.Ident(role["vfrom"])
	}
	table := sqlgen.Qualified(schema, tableName)
	parent := sqlgen.Qualified(schema, parentName)
	_, err := db.Exec(fmt.Sprintf(`CREATE SCHEMA %[1]s; CREATE TABLE %[2]s (%[3]s, UNIQUE (%[4]s));
		CREATE TABLE %[5]s (%[6]s int PRIMARY KEY); INSERT INTO %[5]s SELECT generate_series(1, 4)`,
		sqlgen.Ident(schema), sqlgen.Table(table), strings.Join(defs, ", "), unique, sqlgen.Table(parent), sqlgen.Ident(parentCol)))
	require.NoError(t, err)

	row := func(i, batch int) []any {
		vals := map[string]any{
			"key": fmt.Sprintf("k%d", i), "chunk": i * 3, "day": time.Date(2024, 3, 1+i%2, i, 0, 0, 0, time.UTC),
			"dim": []string{"EU", "US"}[i%2], "measure": fmt.Sprintf("%d.50", i), "ref": i%5 + 1, "content": fmt.Sprintf("a%d", i),
			"version": batch, "vfrom": "2024-01-01", "src": fmt.Sprintf(" K%d ", i),
		}
		if batch == 2 && i%2 == 0 {
			vals["content"] = fmt.Sprintf("b%d", i)
			vals["vfrom"] = "2024-02-01"
		}
		var r []any
		for _, c := range cols {
			found := false
			for rl, n := range role {
				if n == c {
					r, found = append(r, vals[rl]), true
				}
			}
			if !found {
				r = append(r, fmt.Sprintf("e%d", i))
			}
		}
		return r
	}
	rowsOf := func(batch int) backfill.Extractor {
		return backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for i := 1; i <= 5+batch; i++ {
				if c.Lo <= int64(i*3) && int64(i*3) < c.Hi {
					if err := w.Write(ctx, row(i, batch)...); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	warn := backfill.SeverityWarn
	measures := []backfill.Measure{{Column: role["measure"]}}
	target := backfill.Target{Table: table, Key: []string{role["key"]}, Columns: cols, Mode: m.mode, Conflict: m.conflict,
		Lineage: backfill.Lineage{InsertedBy: role["ins"], UpdatedBy: role["upd"]}, HashColumn: role["hash"], IngestedAt: role["ingested"]}
	switch m.mode {
	case backfill.History:
		target.ValidFrom, target.ValidTo = role["vfrom"], role["vto"]
	case backfill.Keyless:
		target.Derive = []backfill.KeyRule{{Column: role["key"], From: role["src"], Rules: []backfill.Normalizer{backfill.Trim, backfill.CaseFold}}}
	}
	if m.conflict == backfill.NewerVersionWins {
		target.Version = role["version"]
	}
	job := backfill.Job{Name: "aliases", NewRun: true, MaxRunRejectRate: -1, // the scenario rejects rows on purpose
		Chunker: backfill.IntRange(0, 30, 10), ChunkColumn: role["chunk"], Target: target,
		Publish: backfill.Publish{Mode: m.publish, View: sqlgen.Qualified(schema, tableName+" view")},
		Validators: []backfill.Validator{
			backfill.DuplicateKeys{Severity: warn},
			backfill.DuplicateKeys{Severity: warn, Name: "duplicate_across", Columns: []string{role["dim"], role["content"]}, AcrossTarget: true},
			backfill.Completeness{Severity: warn, CompareContent: true},
			backfill.Completeness{Severity: warn, Name: "completeness_exact", CompareContent: true, Exact: true},
			backfill.ReferentialIntegrity{Severity: warn, Columns: []string{role["ref"]}, ParentTable: parent, ParentColumns: []string{parentCol}},
			backfill.Aggregates{Severity: warn, Day: role["day"], Dimensions: []string{role["dim"]}, Measures: measures},
			backfill.Aggregates{Severity: warn, Name: "aggregates_exact", Day: role["day"], Dimensions: []string{role["dim"], role["content"]}, Measures: measures, Exact: true},
			backfill.ReplayChangesNothing{Severity: warn},
			backfill.ReplayChangesNothing{Severity: warn, Name: "replay_exact", Exact: true},
			backfill.Sample{Severity: warn},
			backfill.CheckExceptionRate{Severity: warn, MaxRate: 1},
		}}
	manifest := backfill.NewPGManifest("m " + schema)
	r, err := backfill.New(db, &backfill.Config{Manifest: manifest})
	require.NoError(t, err)
	errText := func(err error) string {
		if err == nil {
			return ""
		}
		return "error" // compared by presence; the text names columns
	}
	snapshot := func() string {
		var rows []string
		read := table
		if m.publish == backfill.PublishVersionedView {
			read = job.Publish.View
		}
		require.NoError(t, db.Select(&rows, fmt.Sprintf(`SELECT ROW(%s)::text FROM %s t ORDER BY 1`, sqlgen.List("t.", compared), sqlgen.Table(read))))
		return strings.Join(rows, "\n")
	}
	for batch := 1; batch <= 2; batch++ {
		job.Extractor = rowsOf(batch)
		rep, err := r.Run(ctx, job)
		if err != nil {
			out.Errors = append(out.Errors, fmt.Sprintf("batch %d: %v", batch, err))
		}
		out.Counts = append(out.Counts, rep.Counts)
		vs, err := manifest.Validations(ctx, db, rep.BatchID)
		require.NoError(t, err)
		var checks []string
		for _, v := range vs {
			checks = append(checks, fmt.Sprintf("%s %s passed=%t %s", v.ChunkID, v.Check, v.Passed, v.Actual))
		}
		slices.Sort(checks)
		out.Checks = append(out.Checks, checks)
		ex, err := manifest.Exceptions(ctx, db, rep.BatchID)
		require.NoError(t, err)
		out.Exceptions = append(out.Exceptions, len(ex))
		out.Tables = append(out.Tables, snapshot())
	}
	rb, err := r.Rollback(ctx, job, backfill.RollbackOptions{Actor: "test", Why: "aliases"})
	out.Rollback = fmt.Sprintf("%s deleted %d restored %d conflicts %d", errText(err), rb.Deleted, rb.Restored, rb.Conflicts)
	if err != nil {
		out.Errors = append(out.Errors, fmt.Sprintf("rollback: %v", err))
	}
	out.Tables = append(out.Tables, snapshot())
	return out
}

// aliasExamplesPerMode is how many random namings per mode
// TestGeneratedSQLNeverCollidesWithUserNames runs.
const aliasExamplesPerMode = 1

// TestGeneratedSQLNeverCollidesWithUserNames runs every mode and every
// check on targets whose schema, table and columns are named like the
// aliases and result columns the generated SQL uses (and reserved words,
// mixed case, quotes, spaces, dots), and compares what happened with the
// same scenario under plain names: the same errors (none), counts,
// check verdicts, exceptions, table contents and rollback. A name
// resolving to the user's column instead of the generated one fails the
// statement ("column reference "n" is ambiguous") or, worse, silently
// reads the wrong value: both show up as a difference.
func TestGeneratedSQLNeverCollidesWithUserNames(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	baseline := map[string]aliasOutcome{}
	examples := map[string]int{}
	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		m := rapid.SampledFrom(aliasModes).Draw(rt, "mode")
		names := rapid.Permutation(generatedNames).Draw(rt, "names")
		// A scenario takes about half a second: aliasExamplesPerMode per
		// mode keep the test to seconds; the other draws end here. Over
		// runs (rapid draws a new seed each time) every name meets every
		// role.
		if examples[m.name] >= aliasExamplesPerMode {
			return
		}
		examples[m.name]++
		role := map[string]string{}
		plain := map[string]string{}
		for i, r := range aliasRoles {
			role[r] = names[i]
			plain[r] = "c_" + r
		}
		rest := names[len(aliasRoles):]
		tableName, parentName, parentCol := rest[0], rest[1], rest[2]
		extra := rest[3:]
		want, ok := baseline[m.name]
		if !ok {
			var plainExtra []string
			for i := range extra {
				plainExtra = append(plainExtra, fmt.Sprintf("x%d", i))
			}
			want = runAliasScenario(rt, db, "plain_"+m.name, m, "items", "parents", "pid", plain, plainExtra)
			if len(want.Errors) > 0 {
				rt.Fatalf("the plain scenario runs cleanly: %s", strings.Join(want.Errors, "\n"))
			}
			baseline[m.name] = want
		}
		got := runAliasScenario(rt, db, fmt.Sprintf("%s.%d", rest[4], iteration), m, tableName, parentName, parentCol, role, extra)
		if diff := cmp.Diff(want, got); diff != "" {
			rt.Fatalf("mode %s, roles %v, table %q, parent %q.%q: errors %s; outcome differs from plain names (-plain +aliases):\n%s",
				m.name, role, tableName, parentName, parentCol, strings.Join(got.Errors, "\n"), diff)
		}
	})
}

// TestKeyColumnNamedN is the reported case: DuplicateKeys on a key column
// named n failed with `column reference "n" is ambiguous`.
func TestKeyColumnNamedN(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE nums (n int PRIMARY KEY, k text, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, backfill.Job{Name: "nums", Chunker: backfill.List("one"),
		Extractor:  rowsFunc([]any{1, "a"}, []any{2, "a"}),
		Validators: []backfill.Validator{backfill.DuplicateKeys{}, backfill.DuplicateKeys{Name: "k", Columns: []string{"k"}, Severity: backfill.SeverityWarn}},
		Target:     backfill.Target{Table: "nums", Key: []string{"n"}}})
	require.NoError(t, err)
	require.Equal(t, []string{"list:one: k: expected 0 duplicate keys, got 1 duplicate keys"}, rep.FailedChecks)
}

// TestReservedColumnNamesRefused: a staged column named with the prefix
// the generated SQL reserves is refused by name, before anything runs.
func TestReservedColumnNamesRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE r (id int PRIMARY KEY, _backfill_row bigint)`)
	require.NoError(t, err)
	_, err = pgstore.NewMerger().Prepare(ctx, db, backfill.Target{Table: "r", Key: []string{"id"}})
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	require.ErrorContains(t, err, `"_backfill_row"`)
	// Not staged, not refused.
	_, err = pgstore.NewMerger().Prepare(ctx, db, backfill.Target{Table: "r", Key: []string{"id"}, Columns: []string{"id"}})
	require.NoError(t, err)
}
