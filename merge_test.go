package backfill_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgconv"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/sqlgen"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// generatedNames are the names the SQL builders (the merge of every
// mode, keyless included; the built-in checks and their fingerprints; the
// rollback; the publish modes) give to table aliases, CTEs, subquery
// columns and result columns, collected from their SQL text, plus
// reserved words, mixed case, quotes, spaces and dots. A user's column or
// table may carry any of them.
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

// scd2 creates a History target with the single-open-version index that
// SCD2 tables commonly have, and returns its Target.
func scd2(t *testing.T, db *sqlx.DB) backfill.Target {
	t.Helper()
	db.MustExec(`CREATE TABLE scd (customer text NOT NULL, valid_from date NOT NULL, valid_to date, city text,
		UNIQUE (customer, valid_from))`)
	db.MustExec(`CREATE UNIQUE INDEX scd_one_open ON scd (customer) WHERE valid_to IS NULL`)
	return backfill.Target{Table: "scd", Key: []string{"customer"}, Mode: backfill.History, Columns: []string{"customer", "valid_from", "city"}}
}

func ymd(month, day int) time.Time {
	return time.Date(2024, time.Month(month), day, 0, 0, 0, 0, time.UTC)
}

// scdRows returns the table as "customer from-to city" lines, in order.
func scdRows(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var out []string
	require.NoError(t, db.Select(&out, `SELECT customer || ' ' || to_char(valid_from, 'MM-DD') || '-' || coalesce(to_char(valid_to, 'MM-DD'), 'open') || ' ' || coalesce(city, '-')
		FROM scd ORDER BY customer, valid_from`))
	return out
}

// mergeInTx stages rows into a new transaction and merges them; the
// caller commits or rolls back.
func mergeInTx(t *testing.T, db *sqlx.DB, m backfill.Merger, info backfill.TableInfo, rows ...[]any) (*sqlx.Tx, backfilltype.MergeResult, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	st, err := m.Stage(ctx, tx, info)
	require.NoError(t, err)
	defer st.Close()
	for i, r := range rows {
		require.NoError(t, st.Add(ctx, int64(i+1), r))
	}
	res, err := st.Merge(ctx)
	return tx, res, err
}

// TestHistoryWithOneOpenVersionIndex: History mode works on a target with
// UNIQUE (key) WHERE valid_to IS NULL, in every case that changes
// intervals: a version after the open one, a late version in the middle,
// one before the first, several versions of a key in one chunk, and a
// replay or correction of an existing valid_from. Every merge keeps one
// open version per key (the index would refuse a second).
func TestHistoryWithOneOpenVersionIndex(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, scd2(t, db))
	require.NoError(t, err)
	merge := func(rows ...[]any) backfilltype.MergeResult {
		t.Helper()
		tx, res, err := mergeInTx(t, db, m, info, rows...)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		return res
	}
	merge([]any{"a", ymd(1, 1), "Oslo"}, []any{"b", ymd(1, 1), "Rome"})
	res := merge([]any{"a", ymd(4, 1), "Bergen"})
	require.Equal(t, int64(1), res.Inserted, "a version after the open one")
	require.Equal(t, int64(1), res.Closed)
	require.Equal(t, []string{"a 01-01-04-01 Oslo", "a 04-01-open Bergen", "b 01-01-open Rome"}, scdRows(t, db))

	res = merge([]any{"a", ymd(2, 1), "Lima"})
	require.Equal(t, int64(1), res.Inserted, "a late version in the middle")
	require.Equal(t, []string{"a 01-01-02-01 Oslo", "a 02-01-04-01 Lima", "a 04-01-open Bergen", "b 01-01-open Rome"}, scdRows(t, db))

	merge([]any{"a", ymd(1, 1), "Oslo"}, []any{"a", ymd(2, 1), "Lima"})
	require.Equal(t, []string{"a 01-01-02-01 Oslo", "a 02-01-04-01 Lima", "a 04-01-open Bergen", "b 01-01-open Rome"}, scdRows(t, db),
		"a replay changes nothing")
	res = merge([]any{"a", ymd(4, 1), "Bergen!"})
	require.Equal(t, [2]int64{0, 1}, [2]int64{res.Inserted, res.Updated}, "same valid_from, other content: a correction")

	// Before the first version, and several versions of two keys at once
	// (the open one of b moves twice, a new key gets three).
	merge([]any{"a", ymd(0, 1), "Kyiv"}, []any{"b", ymd(3, 1), "Nice"}, []any{"b", ymd(6, 1), "Pisa"},
		[]any{"c", ymd(2, 1), "X"}, []any{"c", ymd(1, 1), "Y"}, []any{"c", ymd(3, 1), "Z"})
	require.Equal(t, []string{
		"a 12-01-01-01 Kyiv", "a 01-01-02-01 Oslo", "a 02-01-04-01 Lima", "a 04-01-open Bergen!",
		"b 01-01-03-01 Rome", "b 03-01-06-01 Nice", "b 06-01-open Pisa",
		"c 01-01-02-01 Y", "c 02-01-03-01 X", "c 03-01-open Z",
	}, scdRows(t, db))
}

// waitForLockWait waits until the backend pid waits for a lock.
func waitForLockWait(t *testing.T, db *sqlx.DB, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		require.NoError(t, db.Get(&waiting, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)`, pid))
		if waiting {
			return
		}
		require.True(t, time.Now().Before(deadline), "backend %d never waited for a lock", pid)
		time.Sleep(time.Millisecond)
	}
}

// TestHistoryConcurrentMergesOfOneKey: two transactions adding different
// versions of one key at the same time, on a target with one open version
// per key. The second merge waits for the first (the key's lock), then
// sees its version: both commit, and the versions tile.
func TestHistoryConcurrentMergesOfOneKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, scd2(t, db))
	require.NoError(t, err)
	tx, _, err := mergeInTx(t, db, m, info, []any{"a", ymd(1, 1), "Oslo"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	for _, second := range []time.Time{ymd(6, 1), ymd(2, 1)} { // after and before the first one's version
		first, _, err := mergeInTx(t, db, m, info, []any{"a", ymd(4, 1), "Bergen"})
		require.NoError(t, err)
		tx2, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		var pid int
		require.NoError(t, tx2.Get(&pid, `SELECT pg_backend_pid()`))
		done := make(chan error, 1)
		go func() {
			st, err := m.Stage(ctx, tx2, info)
			if err == nil {
				defer st.Close()
				err = st.Add(ctx, 1, []any{"a", second, "Pisa"})
			}
			if err == nil {
				_, err = st.Merge(ctx)
			}
			done <- err
		}()
		waitForLockWait(t, db, pid)
		require.NoError(t, first.Commit())
		require.NoError(t, <-done)
		require.NoError(t, tx2.Commit())
		want := []string{"a 01-01-04-01 Oslo", "a 04-01-06-01 Bergen", "a 06-01-open Pisa"}
		if second.Before(ymd(4, 1)) {
			want = []string{"a 01-01-02-01 Oslo", "a 02-01-04-01 Pisa", "a 04-01-open Bergen"}
		}
		require.Equal(t, want, scdRows(t, db), "second version %s", second.Format(time.DateOnly))
		db.MustExec(`DELETE FROM scd WHERE valid_from > '2024-01-01'`)
		db.MustExec(`UPDATE scd SET valid_to = NULL`)
	}
}

// TestHistoryConcurrentRuns: two runs of two jobs, at once, add other
// versions of the same keys to one SCD2 target: both complete, and every
// key's versions tile with one open version.
func TestHistoryConcurrentRuns(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tg := scd2(t, db)
	const keys = 5
	job := func(name string, month int) backfill.Job {
		items := make([]string, keys)
		for i := range items {
			items[i] = fmt.Sprint(i)
		}
		return backfill.Job{Name: name, Chunker: backfill.List(items...), Target: tg, Rollback: backfill.RollbackNone,
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				// Chunk i: versions of keys i and i+1 (so chunks of one run
				// share keys too).
				for _, k := range []int{c.Seq, (c.Seq + 1) % keys} {
					if err := w.Write(ctx, fmt.Sprintf("k%d", k), ymd(month, 1+c.Seq), name); err != nil {
						return err
					}
				}
				return nil
			})}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, month := range []int{3, 7} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := backfill.New(db, &backfill.Config{Concurrency: 3, RetryBackoff: time.Millisecond})
			if err == nil {
				_, err = r.Run(context.Background(), job(fmt.Sprintf("run%d", i), month))
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	var bad []string
	require.NoError(t, db.Select(&bad, `SELECT customer FROM (
			SELECT customer, valid_to, lead(valid_from) OVER (PARTITION BY customer ORDER BY valid_from) AS next FROM scd) x
		WHERE valid_to IS DISTINCT FROM next`))
	require.Empty(t, bad, "keys whose versions do not tile")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM scd`))
	require.Equal(t, 2*2*keys, n, "every version of both runs")
}

// TestHistoryOpenVersionRaceWithAnotherWriter: a writer that does not take
// the merge's key locks adds an open version of a key while a chunk merges
// another version of it. The chunk's insert then violates the one-open-
// version index: the error says so plainly, the chunk is retried, and the
// retry merges after that writer's version. (Since the merge locks the
// versions it closes first, it waits for that writer and merges after its
// version on the first attempt.)
func TestHistoryOpenVersionRaceWithAnotherWriter(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tg := scd2(t, db)
	db.MustExec(`INSERT INTO scd VALUES ('a', '2024-01-01', NULL, 'Oslo')`)
	other, err := db.Beginx()
	require.NoError(t, err)
	other.MustExec(`UPDATE scd SET valid_to = '2024-07-01' WHERE customer = 'a' AND valid_to IS NULL`)
	other.MustExec(`INSERT INTO scd VALUES ('a', '2024-07-01', NULL, 'Other')`)

	var log bytes.Buffer
	var logMu sync.Mutex
	r, err := backfill.New(db, &backfill.Config{RetryBackoff: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(syncWriter{&log, &logMu}, nil))})
	require.NoError(t, err)
	pid := make(chan int, 1)
	job := backfill.Job{Name: "late", Chunker: backfill.List("x"), Target: tg, Rollback: backfill.RollbackNone,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, "a", ymd(9, 1), "Late")
		})}
	// The merge's first statement that waits is the close of a's open
	// version, which the other writer holds.
	go func() {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			var p int
			if db.Get(&p, `SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE NOT l.granted AND l.locktype = 'transactionid' AND a.datname = current_database() LIMIT 1`) == nil {
				pid <- p
				return
			}
			time.Sleep(time.Millisecond)
		}
		pid <- 0
	}()
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), job)
		done <- err
	}()
	require.NotZero(t, <-pid, "the merge never waited for the other writer")
	require.NoError(t, other.Commit())
	require.NoError(t, <-done)
	require.Equal(t, []string{"a 01-01-07-01 Oslo", "a 07-01-09-01 Other", "a 09-01-open Late"}, scdRows(t, db))
	logMu.Lock()
	defer logMu.Unlock()
	// The merge locks the versions it closes before it reads them
	// (lockClosing), so it waits for the other writer and merges after its
	// version on the first attempt; a failed attempt (the other writer
	// acting after that lock) must say plainly what happened. Other
	// warnings (a lock wait past lock_timeout on a loaded machine) are
	// not the merge's error.
	for _, f := range chunkFailures(log.String()) {
		require.Contains(t, f, `allows one version per key WHERE (valid_to IS NULL)`, "a failed attempt's error says what happened")
	}
	require.NotContains(t, log.String(), "do not tile")
}

// TestHistoryRaceWithAnotherWriterWithoutOpenIndex: as above, on a target
// without the one-open-version index: the merge leaves the key's versions
// overlapping, and the error says that another writer changed them (not
// only that intervals do not tile) and is retried.
func TestHistoryRaceWithAnotherWriterWithoutOpenIndex(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	tg := scd2(t, db)
	db.MustExec(`DROP INDEX scd_one_open`)
	db.MustExec(`INSERT INTO scd VALUES ('a', '2024-01-01', NULL, 'Oslo')`)
	other, err := db.Beginx()
	require.NoError(t, err)
	other.MustExec(`UPDATE scd SET valid_to = '2024-07-01' WHERE customer = 'a' AND valid_to IS NULL`)
	other.MustExec(`INSERT INTO scd VALUES ('a', '2024-07-01', NULL, 'Other')`)
	var log bytes.Buffer
	var logMu sync.Mutex
	r, err := backfill.New(db, &backfill.Config{RetryBackoff: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(syncWriter{&log, &logMu}, nil))})
	require.NoError(t, err)
	job := backfill.Job{Name: "late", Chunker: backfill.List("x"), Target: tg, Rollback: backfill.RollbackNone,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, "a", ymd(9, 1), "Late")
		})}
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), job)
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		require.NoError(t, db.Get(&waiting, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE NOT l.granted AND l.locktype = 'transactionid' AND a.datname = current_database())`))
		if waiting {
			break
		}
		require.True(t, time.Now().Before(deadline), "the merge never waited for the other writer")
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, other.Commit())
	require.NoError(t, <-done)
	require.Equal(t, []string{"a 01-01-07-01 Oslo", "a 07-01-09-01 Other", "a 09-01-open Late"}, scdRows(t, db))
	logMu.Lock()
	defer logMu.Unlock()
	for _, f := range chunkFailures(log.String()) {
		require.Contains(t, f, "another transaction, not a merge of this library, added or changed versions of these keys during the merge")
	}
}

// chunkFailures returns the records of failed chunk attempts in log (a
// slog text log): their errors, not any other warning of the run.
func chunkFailures(log string) []string {
	var fs []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `msg="chunk failed"`) {
			fs = append(fs, line)
		}
	}
	return fs
}

type syncWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestDottedTableNames: a table name is split on a dot outside double
// quotes only, a quoted part may hold dots, and a name that could mean
// two tables is refused. The database has both readings of "we.ird.t":
// table "t" of schema "we.ird" and a decoy, table "ird.t" of schema "we".
// Target.Table "we.ird.t" writes into "we.ird"."t", never the decoy.
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

// waitBlocked waits until a backend of db's database waits for a lock
// (the merge under test, behind a row another transaction holds).
func waitBlocked(t *testing.T, db *sqlx.DB, done chan error) {
	t.Helper()
	for range 600 {
		select {
		case err := <-done:
			t.Fatalf("the merge ended without waiting for a lock: %v", err)
		default:
		}
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`))
		if n > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no backend waits for a lock")
}

// TestMergeDecidesUnderTheRowLock: a merge whose target row another
// transaction holds decides from that transaction's committed row, not
// from a snapshot taken before it waited: through a partition and its
// partitioned parent (the key locks are shared), against an application's
// uncommitted UPDATE (NewerVersionWins keeps the higher version), and the
// undo log's "before" image is the row the merge overwrote.
func TestMergeDecidesUnderTheRowLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nvw := backfill.Target{Key: []string{"id"}, Conflict: backfill.NewerVersionWins, Version: "version"}

	t.Run("partition and parent", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		db.MustExec(`CREATE TABLE p (id bigint, name text, version bigint, PRIMARY KEY (id)) PARTITION BY RANGE (id);
			CREATE TABLE p0 PARTITION OF p FOR VALUES FROM (0) TO (1000);
			INSERT INTO p VALUES (1, 'v1', 1)`)
		m := pgstore.NewMerger()
		tg := nvw
		tg.Table = "p"
		infoP, err := m.Prepare(ctx, db, tg)
		require.NoError(t, err)
		tg.Table = "p0"
		infoC, err := m.Prepare(ctx, db, tg)
		require.NoError(t, err)
		tx1, _, err := mergeInTx(t, db, m, infoP, []any{int64(1), "v5", int64(5)})
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			tx2, _, err := mergeInTx(t, db, m, infoC, []any{int64(1), "v3", int64(3)})
			if err == nil {
				err = tx2.Commit()
			} else {
				_ = tx2.Rollback()
			}
			done <- err
		}()
		waitBlocked(t, db, done)
		require.NoError(t, tx1.Commit())
		require.NoError(t, <-done)
		var name string
		require.NoError(t, db.Get(&name, `SELECT name FROM p WHERE id = 1`))
		require.Equal(t, "v5", name, "a lower version overwrote the higher one")
	})

	// run merges rows into p while an application transaction holds key 1
	// with update, and returns the runner and job after both committed.
	run := func(t *testing.T, db *sqlx.DB, update string, tg backfill.Target, rb backfill.RollbackMechanism, row []any) (*backfill.Runner, backfill.Job) {
		app, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		_, err = app.Exec(update)
		require.NoError(t, err)
		r, err := backfill.New(db, nil)
		require.NoError(t, err)
		job := backfill.Job{Name: "j", Chunker: backfill.List("a"), Extractor: rowsFunc(row), Target: tg, Rollback: rb}
		done := make(chan error, 1)
		go func() { _, err := r.Run(ctx, job); done <- err }()
		waitBlocked(t, db, done)
		require.NoError(t, app.Commit())
		require.NoError(t, <-done)
		return r, job
	}
	t.Run("external writer", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		db.MustExec(`CREATE TABLE p (id bigint PRIMARY KEY, name text, version bigint); INSERT INTO p VALUES (1, 'v1', 1)`)
		tg := nvw
		tg.Table = "p"
		run(t, db, `UPDATE p SET name = 'app10', version = 10 WHERE id = 1`, tg, backfill.RollbackNone, []any{int64(1), "v5", int64(5)})
		var name string
		require.NoError(t, db.Get(&name, `SELECT name FROM p WHERE id = 1`))
		require.Equal(t, "app10", name, "version 5 overwrote version 10")
	})
	for _, mode := range []backfill.Mode{backfill.Upsert, backfill.History} {
		t.Run("undo image "+string(mode), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			db.MustExec(`CREATE TABLE p (id bigint, valid_from date NOT NULL DEFAULT '2024-01-01', valid_to date, name text,
				backfill_inserted_by bigint, backfill_updated_by bigint, UNIQUE (id, valid_from), UNIQUE (id));
				INSERT INTO p (id, name) VALUES (1, 'orig')`)
			tg := backfill.Target{Table: "p", Key: []string{"id"}, Columns: []string{"id", "valid_from", "name"}, Mode: mode}
			r, job := run(t, db, `UPDATE p SET name = 'app' WHERE id = 1`, tg, "", []any{int64(1), "2024-01-01", "backfill"})
			var name string
			require.NoError(t, db.Get(&name, `SELECT name FROM p WHERE id = 1`))
			require.Equal(t, "backfill", name)
			_, err := r.Rollback(ctx, job, backfill.RollbackOptions{Actor: "a", Why: "t"})
			require.NoError(t, err)
			require.NoError(t, db.Get(&name, `SELECT name FROM p WHERE id = 1`))
			require.Equal(t, "app", name, "rollback restored an image older than the one the batch overwrote")
		})
	}
}

// refuseRun runs rows (id, ref) into table t created by ddl and returns
// the report, the ids left in t and the run's error.
func refuseRun(t *testing.T, ddl string, rows ...[]any) (backfill.Report, []int, error) {
	db := pgtest.New(t)
	db.MustExec(ddl)
	r, err := backfill.New(db, &backfill.Config{MaxAttempts: 2})
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), backfill.Job{Name: "j", Chunker: backfill.List("a"), Extractor: rowsFunc(rows...),
		Rollback: backfill.RollbackNone, MaxRunRejectRate: -1, Target: backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "ref"}}})
	var ids []int
	require.NoError(t, db.Select(&ids, `SELECT id FROM t ORDER BY id`))
	return rep, ids, err
}

var fiveRefs = [][]any{{1, 1}, {2, 2}, {3, 999}, {4, 4}, {5, 5}}

// TestMergeDeferredConstraintsRefuseTheRow: a deferred foreign key or
// constraint trigger refuses its row at merge time, like an immediate
// one, instead of failing the chunk at COMMIT; so does one referencing
// the target (a deferred foreign key of another table checked on delete
// is out of reach of a merge, which does not delete). Deferred checks a
// merge queues elsewhere, through a trigger writing to another table,
// or of a deferrable foreign key created after Prepare, fire there too.
func TestMergeDeferredConstraintsRefuseTheRow(t *testing.T) {
	t.Parallel()
	for name, ddl := range map[string]string{
		"foreign key": `CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(0, 10);
			CREATE TABLE t (id int PRIMARY KEY, ref int REFERENCES parent DEFERRABLE INITIALLY DEFERRED)`,
		"constraint trigger": `CREATE TABLE t (id int PRIMARY KEY, ref int);
			CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.ref = 999 THEN RAISE EXCEPTION 'bad ref %', NEW.ref; END IF; RETURN NULL; END $$;
			CREATE CONSTRAINT TRIGGER ct AFTER INSERT OR UPDATE ON t DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION f()`,
		"trigger writing another table": `CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(0, 10);
			CREATE TABLE t (id int PRIMARY KEY, ref int);
			CREATE TABLE audit (ref int REFERENCES parent DEFERRABLE INITIALLY DEFERRED);
			CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO audit VALUES (NEW.ref); RETURN NULL; END $$;
			CREATE TRIGGER tg AFTER INSERT OR UPDATE ON t FOR EACH ROW EXECUTE FUNCTION f()`,
		"deferred check on another table": `CREATE TABLE t (id int PRIMARY KEY, ref int);
			CREATE TABLE audit (ref int);
			CREATE FUNCTION g() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.ref = 999 THEN RAISE EXCEPTION 'bad ref %', NEW.ref; END IF; RETURN NULL; END $$;
			CREATE CONSTRAINT TRIGGER ct AFTER INSERT ON audit DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION g();
			CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO audit VALUES (NEW.ref); RETURN NULL; END $$;
			CREATE TRIGGER tg AFTER INSERT OR UPDATE ON t FOR EACH ROW EXECUTE FUNCTION f()`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rep, ids, err := refuseRun(t, ddl, fiveRefs...)
			require.NoError(t, err)
			require.Equal(t, backfill.Counts{Read: 5, Inserted: 4, Rejected: 1}, rep.Counts)
			require.Equal(t, []int{1, 2, 4, 5}, ids)
		})
	}
}

// TestMergeStatementTriggerFailsTheChunk: a statement-level trigger that
// raises refuses the statement, not a row: the chunk fails with an error
// naming the trigger, and no row is queued as refused.
func TestMergeStatementTriggerFailsTheChunk(t *testing.T) {
	t.Parallel()
	rep, ids, err := refuseRun(t, `CREATE TABLE t (id int PRIMARY KEY, ref int);
		CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'table t is frozen for maintenance'; END $$;
		CREATE TRIGGER st BEFORE INSERT OR UPDATE ON t FOR EACH STATEMENT EXECUTE FUNCTION f()`, fiveRefs...)
	require.Error(t, err)
	require.ErrorContains(t, err, `statement-level trigger "st"`)
	require.Zero(t, rep.Counts.Rejected, "rows were queued as refused although no row was at fault")
	require.Empty(t, ids)
}

// TestRollbackNotNullDomain: rollback and its preview work on a target
// with a NOT NULL domain column (the logged key is not read back as a
// whole target row, whose other columns would be NULL).
func TestRollbackNotNullDomain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE DOMAIN nn_text AS text NOT NULL;
		CREATE TABLE t (id bigint PRIMARY KEY, name nn_text, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := func(rows map[int64]string) backfill.Job {
		return backfill.Job{Name: "j", NewRun: true, Chunker: backfill.IntRange(0, 10, 5), ChunkColumn: "id",
			Extractor: dlvExtractor(rows, func(ctx context.Context, w backfill.RowWriter, id int64, n string) error { return w.Write(ctx, id, n) }),
			Target:    backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "name"}}}
	}
	rep1, err := r.Run(ctx, job(map[int64]string{1: "same", 2: "old"}))
	require.NoError(t, err)
	rep2, err := r.Run(ctx, job(map[int64]string{1: "same", 2: "new", 3: "x"}))
	require.NoError(t, err)
	_, err = r.Rollback(ctx, job(nil), backfill.RollbackOptions{BatchID: rep1.BatchID, Preview: true})
	require.NoError(t, err, "preview of batch 1")
	_, err = r.Rollback(ctx, job(nil), backfill.RollbackOptions{BatchID: rep2.BatchID, ChunkID: "int:0/5", Actor: "a", Why: "t"})
	require.NoError(t, err, "rollback of one chunk of batch 2")
	_, err = r.Rollback(ctx, job(nil), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "a", Why: "t"})
	require.NoError(t, err, "rollback of batch 2")
	var got []string
	require.NoError(t, db.Select(&got, `SELECT id || '=' || name FROM t ORDER BY id`))
	require.Equal(t, []string{"1=same", "2=old"}, got)
}

// looseSetup creates the types of looseCases.
const looseSetup = `CREATE COLLATION IF NOT EXISTS ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
	CREATE EXTENSION IF NOT EXISTS citext;
	CREATE DOMAIN nd AS numeric; CREATE DOMAIN nd2 AS nd; CREATE DOMAIN fd AS float8; CREATE DOMAIN jd AS jsonb;
	CREATE DOMAIN jda AS jsonb[]; CREATE DOMAIN idd AS interval; CREATE DOMAIN cit AS text COLLATE ci; CREATE DOMAIN cit2 AS cit`

// looseCases are values equal by their type's equality but stored
// differently: numeric scale, float -0, interval units, jsonb numbers,
// arrays and ranges of them, a nondeterministic collation; domains over
// them (of any depth), arrays of those domains, domains over arrays; an
// extension type (citext) and arrays of it.
var looseCases = []struct{ typ, old, new string }{
	{"nd[]", "{1.0}", "{1.00}"},
	{"nd2", "1.0", "1.00"},
	{"nd2[]", "{1.0}", "{1.00}"},
	{"fd[]", "{0}", "{-0}"},
	{"jd[]", `{"{\"a\": 1.0}"}`, `{"{\"a\": 1.00}"}`},
	{"jda", `{"{\"a\": 1.0}"}`, `{"{\"a\": 1.00}"}`},
	{"idd[]", "{1 day}", "{24 hours}"},
	{"citext", "abc", "ABC"},
	{"citext[]", "{abc}", "{ABC}"},
	{"cit", "abc", "ABC"},
	{"cit[]", "{abc}", "{ABC}"},
	{"cit2[]", "{abc}", "{ABC}"},
	{"text[] COLLATE ci", "{abc}", "{ABC}"},
	{"bpchar", "a", "a "},
	{"bpchar COLLATE ci", "a", "A "},
	{"numeric", "1.0", "1.00"},
	{"double precision", "0", "-0"},
	{"real", "0", "-0"},
	{"interval", "1 day", "24 hours"},
	{"interval", "1 mon", "30 days"},
	{"jsonb", `{"a": 1.0}`, `{"a": 1.00}`},
	{"text COLLATE ci", "abc", "ABC"},
	{"numeric[]", "{1.0}", "{1.00}"},
	{"numrange", "[1.0,2)", "[1.00,2)"},
}

// looseJob writes v as column v of key 0 into table name.
func looseJob(name, v string, checks ...backfill.Validator) backfill.Job {
	return backfill.Job{Name: name, NewRun: true, Chunker: backfill.IntRange(0, 1, 1), Validators: checks, Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: name, Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, _ backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, int64(0), v)
		})}
}

// TestMergeComparesExactly: a restatement that only changes how a value
// is stored (looseCases) updates the row, and a replay after that
// changes nothing.
func TestMergeComparesExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(looseSetup)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	for i, c := range looseCases {
		name := fmt.Sprintf("eq_%d", i)
		db.MustExec(fmt.Sprintf(`CREATE TABLE %s (id bigint PRIMARY KEY, v %s)`, name, c.typ))
		_, err = r.Run(ctx, looseJob(name, c.old))
		require.NoError(t, err)
		rep, err := r.Run(ctx, looseJob(name, c.new))
		require.NoError(t, err)
		require.Equal(t, int64(1), rep.Counts.Updated, "%s: restating %q over %q", c.typ, c.new, c.old)
		var got, want string
		require.NoError(t, db.Get(&got, fmt.Sprintf(`SELECT v::text FROM %s`, name)))
		require.NoError(t, db.Get(&want, fmt.Sprintf(`SELECT $1::%s::text`, c.typ), c.new))
		require.Equal(t, want, got, c.typ)
		rep, err = r.Run(ctx, looseJob(name, c.new))
		require.NoError(t, err)
		require.Equal(t, int64(1), rep.Counts.Unchanged, "%s: replay", c.typ)
	}
}

// TestChecksCompareExactly: every check that compares content (and the
// fingerprints they use) fails when the target holds another form of the
// value written (looseCases; a trigger stores the old form).
func TestChecksCompareExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(looseSetup)
	r, err := backfill.New(db, &backfill.Config{ReturnOnPause: true})
	require.NoError(t, err)
	for i, c := range looseCases {
		name := fmt.Sprintf("eq_%d", i)
		db.MustExec(fmt.Sprintf(`CREATE TABLE %[1]s (id bigint PRIMARY KEY, v %[3]s);
			CREATE FUNCTION %[1]s_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.v := %[2]s::%[3]s; RETURN NEW; END $$;
			CREATE TRIGGER %[1]s_tg BEFORE INSERT OR UPDATE ON %[1]s FOR EACH ROW EXECUTE FUNCTION %[1]s_f()`,
			name, pqLiteral(c.old), c.typ))
		for _, v := range []backfill.Validator{backfill.Sample{}, backfill.Completeness{CompareContent: true}, backfill.ReplayChangesNothing{}} {
			db.MustExec(`TRUNCATE ` + name)
			_, err = r.Run(ctx, looseJob(name, c.new, v))
			require.True(t, errors.Is(err, backfill.ErrGateFailed), "%s: %T passed with %q stored for %q: %v", c.typ, v, c.old, c.new, err)
		}
	}
}

// pqLiteral quotes s as an SQL string literal.
func pqLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// BenchmarkMergeRestatement measures the merge of a 100,000-row Upsert
// chunk into a table holding its keys: replaying it unchanged, and
// restating every row (each op writes other values), the case the lock
// of the rows to change (the merge decision) costs most in.
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

func TestNormalizers(t *testing.T) {
	t.Parallel()
	rule := backfill.KeyRule{Column: "k", From: "name", Rules: []backfill.Normalizer{backfill.Trim, backfill.CollapseSpace, backfill.NFC, backfill.CaseFold}}
	cases := map[string]string{
		"  Zoë   Müller ":          "zoë müller",
		"Zoe\u0308 Mu\u0308ller":   "zoë müller", // decomposed accents compose under NFC
		"STRASSE":                  "strasse",
		"Straße":                   "strasse", // full case folding
		"a\t\n b":                  "a b",
		"ÅNGSTRÖM\u00a0\u2003UNIT": "ångström unit", // no-break and em spaces collapse
	}
	for in, want := range cases {
		got, reason := rule.Derive(in)
		require.Empty(t, reason, in)
		require.Equal(t, want, got, "%q", in)
	}
	_, reason := rule.Derive(nil)
	require.Contains(t, reason, "missing key column")
	_, reason = rule.Derive("   ")
	require.Contains(t, reason, "is empty after trim, collapse_space, nfc, case_fold")
	_, reason = rule.Derive(42)
	require.Contains(t, reason, "wrong type int")
	opt := rule
	opt.NullAsEmpty = true
	got, reason := opt.Derive(nil)
	require.Empty(t, reason)
	require.Equal(t, "", got)
	require.Equal(t, "k <- trim,collapse_space,nfc,case_fold(name) null_as_empty", opt.String())

	p := backfill.KeyRule{Column: "k", From: "n", Rules: []backfill.Normalizer{backfill.NFKC, backfill.RemovePunctuation}}
	got, _ = p.Derive("ＡＢＣ-１２３.")
	require.Equal(t, "ABC123", got)
}

// refusal is one kind of row the target refuses at merge time.
type refusal struct {
	name string
	// ddl adds the constraint (after the table "t" exists).
	ddl string
	// spoil makes good row i (values code, qty, ref, note) refused.
	spoil func(i int, code *string, qty, ref *int, note *string)
	// want: what every refused row's reason contains; column its Column.
	want   []string
	column string
}

// bigText returns n hex characters of random bytes: text that pglz does
// not compress, so that it stays over the btree limit in an index entry.
func bigText(n int) string {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var refusals = []refusal{
	{name: "SecondUnique", ddl: `CREATE UNIQUE INDEX t_code_key ON t (code)`,
		spoil: func(i int, code *string, _, _ *int, _ *string) {
			// The first bad row takes the seeded row's code, the others
			// the code of the row before them.
			*code = fmt.Sprintf("c%d", i-1)
			if i == refusedRowsAt[0] {
				*code = "taken"
			}
		},
		want: []string{`duplicate key value violates unique constraint "t_code_key" (SQLSTATE 23505)`, `constraint "t_code_key"`, "already exists"}, column: "code"},
	{name: "PartialUnique", ddl: `CREATE UNIQUE INDEX t_code_key ON t (code) WHERE qty >= 0`, // no pre-check: bisection
		spoil: func(i int, code *string, _, _ *int, _ *string) {
			*code = fmt.Sprintf("c%d", i-1)
			if i == refusedRowsAt[0] {
				*code = "taken"
			}
		},
		want: []string{`duplicate key value violates unique constraint "t_code_key" (SQLSTATE 23505)`}, column: "code"},
	{name: "Check", ddl: `ALTER TABLE t ADD CONSTRAINT t_qty_check CHECK (qty >= 0)`,
		spoil: func(_ int, _ *string, qty, _ *int, _ *string) { *qty = -1 },
		want:  []string{`violates check constraint "t_qty_check" (SQLSTATE 23514)`, `constraint "t_qty_check"`}, column: "qty"},
	// A CHECK that raises a data error (22012) instead of failing: its
	// pre-check fails and is skipped; bisection finds the rows.
	{name: "CheckThatErrors", ddl: `ALTER TABLE t ADD CONSTRAINT t_qty_check CHECK (100 / (qty + 1) > 0)`,
		spoil: func(_ int, _ *string, qty, _ *int, _ *string) { *qty = -1 },
		want:  []string{`division by zero (SQLSTATE 22012)`}},
	{name: "ForeignKey", ddl: `CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(0, 100);
			ALTER TABLE t ADD CONSTRAINT t_ref_fkey FOREIGN KEY (ref) REFERENCES parent`,
		spoil: func(_ int, _ *string, _, ref *int, _ *string) { *ref = 999 },
		want:  []string{`violates foreign key constraint "t_ref_fkey" (SQLSTATE 23503)`, `constraint "t_ref_fkey"`, `Key (ref)=(999) is not present in table "parent"`}, column: "ref"},
	{name: "Trigger", ddl: `CREATE FUNCTION t_refuse_fn() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF NEW.note = 'boom' THEN RAISE EXCEPTION 'note % is refused', NEW.note; END IF;
				IF NEW.note = 'bang' THEN RAISE EXCEPTION 'note % is refused', NEW.note USING ERRCODE = 'BF001'; END IF;
				RETURN NEW;
			END $$;
			CREATE TRIGGER t_refuse BEFORE INSERT OR UPDATE ON t FOR EACH ROW EXECUTE FUNCTION t_refuse_fn()`,
		spoil: func(i int, _ *string, _, _ *int, note *string) {
			*note = "boom"
			if i%2 == 0 {
				*note = "bang" // a trigger's own SQLSTATE
			}
		},
		want: []string{"is refused (SQLSTATE ", `trigger "t_refuse"`, "PL/pgSQL function t_refuse_fn() line"}},
	{name: "BtreeLimit", ddl: `CREATE INDEX t_note_idx ON t (note)`,
		spoil: func(_ int, _ *string, _, _ *int, note *string) { *note = bigText(3000) },
		want:  []string{`exceeds btree version 4 maximum 2704 for index "t_note_idx" (SQLSTATE 54000)`}, column: "note"},
}

// value is the Value queued for row i refused by r in mode m: the value
// r spoiled in its column, or the row's key when r names no column.
func (r refusal) value(i int, m refusalMode) string {
	code, qty, ref, note := fmt.Sprintf("c%d", i), i, i%50, fmt.Sprintf("n%d", i)
	r.spoil(i, &code, &qty, &ref, &note)
	switch r.column {
	case "code":
		return code
	case "qty":
		return strconv.Itoa(qty)
	case "ref":
		return strconv.Itoa(ref)
	case "note":
		return note
	}
	return m.key(i)
}

func refusalNamed(name string) refusal {
	i := slices.IndexFunc(refusals, func(r refusal) bool { return r.name == name })
	return refusals[i]
}

// refusedRowsAt are the rows of chunk "b" (ids 1..40) that the target
// refuses: the first and the last, and two in between.
var refusedRowsAt = []int{1, 17, 29, 40}

// refusalMode is a target in one mode over the columns code, qty, ref,
// note that the refusals spoil.
type refusalMode struct {
	mode   backfill.Mode
	create string // CREATE TABLE t, with a seeded row of code 'taken'
	seed   string
	target backfill.Target
	// row returns the values of row i; key its identity as queued.
	row func(i int, code string, qty, ref int, note string) []any
	key func(i int) string
}

var refusalModes = []refusalMode{
	{mode: backfill.Upsert,
		create: `CREATE TABLE t (id int PRIMARY KEY, code text, qty int, ref int, note text)`,
		seed:   `INSERT INTO t VALUES (1000, 'taken', 0, 0, 'seed')`,
		target: backfill.Target{Table: "t", Key: []string{"id"}},
		row:    func(i int, code string, qty, ref int, note string) []any { return []any{i, code, qty, ref, note} },
		key:    func(i int) string { return fmt.Sprintf("(%d)", i) }},
	{mode: backfill.AppendOnly,
		create: `CREATE TABLE t (id int PRIMARY KEY, code text, qty int, ref int, note text)`,
		seed:   `INSERT INTO t VALUES (1000, 'taken', 0, 0, 'seed')`,
		target: backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.AppendOnly},
		row:    func(i int, code string, qty, ref int, note string) []any { return []any{i, code, qty, ref, note} },
		key:    func(i int) string { return fmt.Sprintf("(%d)", i) }},
	// Two versions per id: a refused version leaves the other one tiled.
	{mode: backfill.History,
		create: `CREATE TABLE t (id int, valid_from date, valid_to date, code text, qty int, ref int, note text, PRIMARY KEY (id, valid_from))`,
		seed:   `INSERT INTO t VALUES (1000, '2024-01-01', NULL, 'taken', 0, 0, 'seed')`,
		target: backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History, Columns: []string{"id", "valid_from", "code", "qty", "ref", "note"}},
		row: func(i int, code string, qty, ref int, note string) []any {
			return []any{(i + 1) / 2, fmt.Sprintf("2024-0%d-01", 2-i%2), code, qty, ref, note}
		},
		key: func(i int) string { return fmt.Sprintf("(%d, 2024-0%d-01)", (i+1)/2, 2-i%2) }},
	{mode: backfill.Keyless,
		create: `CREATE TABLE t (name_key text PRIMARY KEY, name text, code text, qty int, ref int, note text)`,
		seed:   `INSERT INTO t VALUES ('seed', 'seed', 'taken', 0, 0, 'seed')`,
		target: backfill.Target{Table: "t", Key: []string{"name_key"}, Mode: backfill.Keyless, Columns: []string{"name", "code", "qty", "ref", "note"},
			Derive: []backfill.KeyRule{{Column: "name_key", From: "name", Rules: []backfill.Normalizer{backfill.Trim, backfill.CaseFold}}}},
		row: func(i int, code string, qty, ref int, note string) []any {
			return []any{fmt.Sprintf(" Name%d ", i), code, qty, ref, note}
		},
		key: func(i int) string { return fmt.Sprintf("(name%d)", i) }},
}

// refusalJob: chunk "a" holds 10 good rows (ids 41..50: an all-insert
// chunk, after which Upsert takes its fast path), chunk "b" rows 1..40
// with refusedRowsAt spoiled by r.
func refusalJob(m refusalMode, r refusal) backfill.Job {
	rows := map[string][][]any{}
	for i := 1; i <= 50; i++ {
		code, qty, ref, note := fmt.Sprintf("c%d", i), i, i%50, fmt.Sprintf("n%d", i)
		if slices.Contains(refusedRowsAt, i) {
			r.spoil(i, &code, &qty, &ref, &note)
		}
		c := "b"
		if i > 40 {
			c = "a"
		}
		rows[c] = append(rows[c], m.row(i, code, qty, ref, note))
	}
	return backfill.Job{Name: "refusals", Chunker: backfill.List("a", "b"), Target: m.target, Rollback: backfill.RollbackNone,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for _, row := range rows[c.Item] {
				if err := w.Write(ctx, row...); err != nil {
					return err
				}
			}
			return nil
		})}
}

func refusalSetup(t *testing.T, m refusalMode, r refusal) *sqlx.DB {
	t.Helper()
	db := pgtest.New(t)
	_, err := db.Exec(m.create)
	require.NoError(t, err)
	_, err = db.Exec(r.ddl)
	require.NoError(t, err)
	_, err = db.Exec(m.seed)
	require.NoError(t, err)
	return db
}

// tableDump returns every row of t as text, sorted.
func tableDump(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var rows []string
	require.NoError(t, db.Select(&rows, `SELECT t::text FROM t ORDER BY 1`))
	return rows
}

// TestMergeRefusedRows: for every kind of row the target refuses at
// merge time (a second unique index, found by pre-check, and a partial
// one, found by bisection; a CHECK; a foreign key; a trigger raising
// P0001 or its own SQLSTATE; an index entry over the btree limit) and
// every mode, the refused rows are queued with their row, identity, the
// constraint (or trigger) and PostgreSQL's message; every other row
// merges; the counts balance; the run completes. A replay (a new run)
// changes nothing, and queues the same rows once more, under its own
// batch, once each.
func TestMergeRefusedRows(t *testing.T) {
	t.Parallel()
	for _, m := range refusalModes {
		for _, r := range refusals {
			t.Run(string(m.mode)+"/"+r.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := refusalSetup(t, m, r)
				run, err := backfill.New(db, &backfill.Config{MaxAttempts: 1})
				require.NoError(t, err)
				job := refusalJob(m, r)
				rep, err := run.Run(ctx, job)
				require.NoError(t, err)
				require.Equal(t, backfill.RunCompleted, rep.Status)
				require.Equal(t, backfill.Counts{Read: 50, Inserted: 46, Rejected: 4}, rep.Counts)

				check := func(batch int64) {
					t.Helper()
					ex := exceptionsOf(t, db, batch)
					require.Len(t, ex, len(refusedRowsAt))
					slices.SortFunc(ex, func(a, b backfill.Exception) int { return int(a.Row - b.Row) })
					for i, e := range ex {
						require.Equal(t, "list:b", e.ChunkID)
						require.EqualValues(t, refusedRowsAt[i], e.Row)
						if r.column == "note" { // random text: the row's own
							var raw map[string]any
							require.NoError(t, json.Unmarshal(e.Raw, &raw))
							require.Equal(t, raw["note"], e.Value, "the refused column's value")
							require.Len(t, e.Value, 3000)
						} else {
							require.Equal(t, r.value(refusedRowsAt[i], m), e.Value, "the refused column's value")
						}
						if r.column != "" {
							require.Contains(t, e.Reason, "; key "+m.key(refusedRowsAt[i]), "the key in the reason")
						}
						require.Equal(t, r.column, e.Column)
						require.Contains(t, e.Reason, "refused by the target: ")
						for _, w := range r.want {
							require.Contains(t, e.Reason, w)
						}
						require.NotEmpty(t, e.Raw)
					}
				}
				check(rep.BatchID)
				before := tableDump(t, db)
				require.Len(t, before, 1+46)
				if m.mode == backfill.History {
					// Every id has one open version, and the intervals tile.
					var open, ids, bad int
					require.NoError(t, db.Get(&open, `SELECT count(*) FROM t WHERE valid_to IS NULL`))
					require.NoError(t, db.Get(&ids, `SELECT count(DISTINCT id) FROM t`))
					require.Equal(t, ids, open)
					require.NoError(t, db.Get(&bad, `SELECT count(*) FROM (SELECT valid_to, lead(valid_from) OVER (PARTITION BY id ORDER BY valid_from) AS nxt FROM t) x
						WHERE valid_to IS DISTINCT FROM nxt`))
					require.Zero(t, bad)
				}

				job.NewRun = true
				rep2, err := run.Run(ctx, job)
				require.NoError(t, err)
				require.Equal(t, backfill.RunCompleted, rep2.Status)
				require.Equal(t, backfill.Counts{Read: 50, Unchanged: 46, Rejected: 4}, rep2.Counts)
				require.Equal(t, before, tableDump(t, db), "a replay changes nothing")
				check(rep2.BatchID)
				check(rep.BatchID) // the first run's exceptions are kept, not doubled
			})
		}
	}
}

// TestMergeRefusalsAreBounded: past Config.MaxMergeRefusals refused rows
// the chunk fails, naming the chunk, row, key and constraint, and nothing
// of it is merged; with a negative limit it fails at the first refused
// row, naming it too. A foreign key has no pre-check: bisection finds the
// rows.
func TestMergeRefusalsAreBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit int
		kind  string
		want  string
	}{
		{2, "Check", `chunk 1 list:b (attempt 1): backfill: merge public.t: backfill: too many rejected rows: row 29 key (29) refused by the target: new row for relation "t" violates check constraint "t_qty_check" (SQLSTATE 23514); constraint "t_qty_check"`},
		{2, "ForeignKey", `chunk 1 list:b (attempt 1): backfill: merge public.t: backfill: too many rejected rows: row 29 key (29) refused by the target: insert or update on table "t" violates foreign key constraint "t_ref_fkey" (SQLSTATE 23503)`},
		{-1, "ForeignKey", `chunk 1 list:b (attempt 1): backfill: merge public.t: backfill: too many rejected rows: row 1 key (1) refused by the target: insert or update on table "t" violates foreign key constraint "t_ref_fkey" (SQLSTATE 23503)`},
	} {
		t.Run(fmt.Sprint(tc.limit, tc.kind), func(t *testing.T) {
			t.Parallel()
			db := refusalSetup(t, refusalModes[0], refusalNamed(tc.kind))
			run, err := backfill.New(db, &backfill.Config{MaxMergeRefusals: tc.limit, MaxAttempts: 3, RetryBackoff: time.Millisecond})
			require.NoError(t, err)
			rep, err := run.Run(context.Background(), refusalJob(refusalModes[0], refusalNamed(tc.kind)))
			require.Error(t, err)
			require.ErrorIs(t, err, backfill.ErrTooManyRejects)
			require.Contains(t, err.Error(), tc.want)
			require.Equal(t, backfill.RunFailed, rep.Status)
			require.Equal(t, 1, rep.ChunksDone, "chunk a completed, chunk b not")
			var n int
			require.NoError(t, db.Get(&n, `SELECT count(*) FROM t WHERE id <= 40`))
			require.Zero(t, n, "a failed chunk merges nothing")
			states, err := backfill.NewPGManifest("").Chunks(context.Background(), db, rep.BatchID)
			require.NoError(t, err)
			require.Equal(t, 1, states[1].Attempts, "not retried: retrying cannot help")
		})
	}
}

// TestMaxRejectsPerChunkCountsMergeRejects: Config.MaxRejectsPerChunk
// counts the rows the merge rejects (AppendOnly conflicting replays,
// rows the target refuses) with those the writer rejected: an
// AppendOnly chunk with 5 conflicting replays and a limit of 3 fails.
func TestMaxRejectsPerChunkCountsMergeRejects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE events (event_id text PRIMARY KEY, kind text NOT NULL, amount int CHECK (amount >= 0))`)
	require.NoError(t, err)
	first := [][]any{}
	for i := range 10 {
		first = append(first, []any{fmt.Sprintf("e%d", i), "sale", i})
	}
	job := func(name string, rows [][]any) backfill.Job {
		return backfill.Job{Name: name, Chunker: backfill.List("file-1"), Extractor: rowsFunc(rows...), Rollback: backfill.RollbackNone,
			Target: backfill.Target{Table: "events", Key: []string{"event_id"}, Mode: backfill.AppendOnly}}
	}
	r, err := backfill.New(db, &backfill.Config{MaxRejectsPerChunk: 3, MaxAttempts: 1})
	require.NoError(t, err)
	_, err = r.Run(ctx, job("load", first))
	require.NoError(t, err)

	replay := slices.Clone(first)
	for i := range 5 {
		replay[i] = []any{fmt.Sprintf("e%d", i), "refund", i} // same event ID, other content
	}
	rep, err := r.Run(ctx, job("replay", replay))
	require.ErrorIs(t, err, backfill.ErrTooManyRejects)
	require.Contains(t, err.Error(), "5 in chunk list:file-1, more than 3 (Config.MaxRejectsPerChunk): 0 before the merge, 5 by the merge")
	require.Equal(t, backfill.RunFailed, rep.Status)

	// Rows the target refuses count too: 2 written rejects + 2 refusals.
	mixed := [][]any{{"n1", "sale", -1}, {"n2", "sale", -2}, {"n3", nil, 3}, {"n4", nil, 4}, {"n5", "sale", 5}}
	rep, err = r.Run(ctx, job("mixed", mixed))
	require.ErrorIs(t, err, backfill.ErrTooManyRejects)
	require.Contains(t, err.Error(), "4 in chunk list:file-1, more than 3 (Config.MaxRejectsPerChunk): 2 before the merge, 2 by the merge")
	require.Contains(t, err.Error(), `events_amount_check`)
	require.Equal(t, backfill.RunFailed, rep.Status)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM events WHERE event_id LIKE 'n%'`))
	require.Zero(t, n)
	require.True(t, strings.HasPrefix(fmt.Sprint(err), "backfill: "))
}

// TestMergeTransientErrorsAreNotRefusals: errors that are not about a row
// (serialization failure, deadlock, lock timeout, statement timeout or
// cancellation), even when a trigger raises them for one row, keep
// failing the chunk (retried: with a one-row Config.LockRetries each wait
// ends its attempt) and queue nothing.
func TestMergeTransientErrorsAreNotRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code     string
		attempts int
	}{{"40001", 2}, {"40P01", 2}, {"55P03", 2}, {"57014", 2}} {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			r := refusalNamed("Trigger")
			r.ddl = strings.ReplaceAll(r.ddl, "'BF001'", "'"+tc.code+"'")
			db := refusalSetup(t, refusalModes[0], r)
			run, err := backfill.New(db, &backfill.Config{MaxAttempts: 2, RetryBackoff: time.Millisecond, LockRetries: []backfill.LockRetry{{Timeout: time.Second}}})
			require.NoError(t, err)
			rep, err := run.Run(context.Background(), refusalJob(refusalModes[0], r))
			require.Error(t, err)
			require.Contains(t, err.Error(), "is refused ("+tc.code+")")
			require.NotErrorIs(t, err, backfill.ErrTooManyRejects)
			require.Equal(t, backfill.RunFailed, rep.Status)
			require.Empty(t, exceptionsOf(t, db, rep.BatchID))
			states, err := backfill.NewPGManifest("").Chunks(context.Background(), db, rep.BatchID)
			require.NoError(t, err)
			require.Equal(t, tc.attempts, states[1].Attempts)
			var n int
			require.NoError(t, db.Get(&n, `SELECT count(*) FROM t WHERE id <= 40`))
			require.Zero(t, n)
		})
	}
}

// TestMergeRefusesKeysOverTheBtreeLimit: a business key of 3,000 bytes
// (random, so incompressible) cannot enter the key's own btree index
// (54000): its row is queued naming the index, the rest of the chunk
// merges, in every keyed mode.
func TestMergeRefusesKeysOverTheBtreeLimit(t *testing.T) {
	t.Parallel()
	for _, mode := range []backfill.Mode{backfill.Upsert, backfill.AppendOnly, backfill.History} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			_, err := db.Exec(`CREATE TABLE k (name text, valid_from int NOT NULL DEFAULT 0, valid_to int, v int, PRIMARY KEY (name, valid_from))`)
			require.NoError(t, err)
			target := backfill.Target{Table: "k", Key: []string{"name", "valid_from"}, Columns: []string{"name", "valid_from", "v"}, Mode: mode}
			if mode == backfill.History {
				target.Key = []string{"name"}
			}
			long := bigText(3000)
			var rows [][]any
			for i := range 10 {
				name := fmt.Sprint("k", i)
				if i == 4 {
					name = long
				}
				rows = append(rows, []any{name, 0, i})
			}
			r, err := backfill.New(db, &backfill.Config{MaxAttempts: 1})
			require.NoError(t, err)
			job := backfill.Job{Name: "long", Chunker: backfill.List("a"), Extractor: rowsFunc(rows...), Target: target, Rollback: backfill.RollbackNone}
			rep, err := r.Run(context.Background(), job)
			require.NoError(t, err)
			require.Equal(t, backfill.Counts{Read: 10, Inserted: 9, Rejected: 1}, rep.Counts)
			ex := exceptionsOf(t, db, rep.BatchID)
			require.Len(t, ex, 1)
			require.EqualValues(t, 5, ex[0].Row)
			require.Equal(t, "("+long+", 0)", ex[0].Value, "the key's columns' values")
			require.Contains(t, ex[0].Reason, `exceeds btree version 4 maximum 2704 for index "k_pkey" (SQLSTATE 54000)`)
			require.Equal(t, "name,valid_from", ex[0].Column, "the key's columns")
			var n int
			require.NoError(t, db.Get(&n, `SELECT count(*) FROM k`))
			require.Equal(t, 9, n)
		})
	}
}

// TestMergeRefusesEntriesOverTheIndexLimit: a value of 12 kB (random, so
// incompressible) cannot enter any index (over 8191 bytes, PostgreSQL
// names no index): its row is queued naming the index it was too large
// for and its columns, the business key's for a key value, and saying
// what to do; a value over the btree limit gets the same advice.
func TestMergeRefusesEntriesOverTheIndexLimit(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE big2 (a text, b int, v text, w int CHECK (w > 0), PRIMARY KEY (a, b));
		CREATE INDEX big2_v_idx ON big2 (v)`)
	require.NoError(t, err)
	longKey, longV, midV := bigText(12000), bigText(12000), bigText(3000)
	var rows [][]any
	for i := range 10 {
		a, v := fmt.Sprint("k", i), "v"
		switch i {
		case 2:
			a = longKey
		case 5:
			v = longV
		case 7:
			v = midV
		}
		rows = append(rows, []any{a, i, v, 1})
	}
	r, err := backfill.New(db, &backfill.Config{MaxAttempts: 1})
	require.NoError(t, err)
	job := backfill.Job{Name: "big2", Chunker: backfill.List("a"), Extractor: rowsFunc(rows...), Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
		Target: backfill.Target{Table: "big2", Key: []string{"a", "b"}, Columns: []string{"a", "b", "v", "w"}}}
	rep, err := r.Run(context.Background(), job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 10, Inserted: 7, Rejected: 3}, rep.Counts)
	ex := exceptionsOf(t, db, rep.BatchID)
	require.Len(t, ex, 3)
	require.EqualValues(t, 3, ex[0].Row)
	require.Equal(t, "a,b", ex[0].Column, "the key's columns")
	require.Contains(t, ex[0].Reason, "maximum size is 8191 (SQLSTATE 54000)")
	require.Contains(t, ex[0].Reason, `index "big2_pkey" on (a,b), the business key's index, would get an entry of about`)
	require.Contains(t, ex[0].Reason, "make the key a hash of it")
	require.EqualValues(t, 6, ex[1].Row)
	require.Equal(t, "v", ex[1].Column)
	require.Contains(t, ex[1].Reason, `index "big2_v_idx" on (v) would get an entry of about`)
	require.Contains(t, ex[1].Reason, "shorten the value, or index a hash of it")
	require.EqualValues(t, 8, ex[2].Row)
	require.Equal(t, "v", ex[2].Column)
	require.Contains(t, ex[2].Reason, `maximum 2704 for index "big2_v_idx" (SQLSTATE 54000)`)
	require.Contains(t, ex[2].Reason, `; index "big2_v_idx" on (v) would get an entry over its limit: shorten the value, or index a hash of it`)
}

// TestMergeHistoryOpenVersionIndexIsNotARefusal: in History mode a
// unique violation of an index on business key columns only (the
// single-open-version index UNIQUE (key) WHERE valid_to IS NULL) is the
// merge's own invariant, not a bad row: the new version is not queued as
// refused (the chunk fails, or merges, as the History merge decides).
func TestMergeHistoryOpenVersionIndexIsNotARefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE h (id int, valid_from int, valid_to int, v text, PRIMARY KEY (id, valid_from));
		CREATE UNIQUE INDEX h_open ON h (id) WHERE valid_to IS NULL`)
	require.NoError(t, err)
	r, err := backfill.New(db, &backfill.Config{MaxAttempts: 1})
	require.NoError(t, err)
	job := func(name string, rows ...[]any) backfill.Job {
		return backfill.Job{Name: name, Chunker: backfill.List("a"), Extractor: rowsFunc(rows...), Rollback: backfill.RollbackNone,
			Target: backfill.Target{Table: "h", Key: []string{"id"}, Mode: backfill.History}}
	}
	_, err = r.Run(ctx, job("v1", []any{1, 1, "a"}))
	require.NoError(t, err)
	rep, err := r.Run(ctx, job("v2", []any{1, 2, "b"}))
	if err == nil {
		require.Zero(t, rep.Counts.Rejected)
		require.Equal(t, backfill.Counts{Read: 1, Inserted: 1}, rep.Counts)
	} else {
		require.Contains(t, err.Error(), `"h_open"`)
		require.Empty(t, exceptionsOf(t, db, rep.BatchID))
	}
}

// TestMergeRefusalsRollBack: a batch whose chunk had rows refused (found
// by bisection, so merged in parts, closing History intervals in several
// statements) rolls back to exactly the table before it, in Upsert and
// History mode.
func TestMergeRefusalsRollBack(t *testing.T) {
	t.Parallel()
	for _, mode := range []backfill.Mode{backfill.Upsert, backfill.History} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t)
			_, err := db.Exec(`CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(0, 9);
				CREATE TABLE t (id int, valid_from int NOT NULL, valid_to int, ref int REFERENCES parent,
					backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (id, valid_from))`)
			require.NoError(t, err)
			target := backfill.Target{Table: "t", Key: []string{"id", "valid_from"}, Columns: []string{"id", "valid_from", "ref"}}
			if mode == backfill.History {
				target = backfill.Target{Table: "t", Key: []string{"id"}, Mode: mode, Columns: []string{"id", "valid_from", "ref"}}
			}
			job := func(rows [][]any) backfill.Job {
				return backfill.Job{Name: "rb", Chunker: backfill.List("a"), Extractor: rowsFunc(rows...), Target: target, NewRun: true}
			}
			r, err := backfill.New(db, nil)
			require.NoError(t, err)
			var first, second [][]any
			for id := 1; id <= 20; id++ {
				first = append(first, []any{id, 1, id % 10})
				// Batch 2: a changed version 1 (Upsert) and versions 2 and 3
				// of every id; a foreign key refuses some.
				for vf := 1; vf <= 3; vf++ {
					ref := (id + vf) % 10
					if (id*3+vf)%11 == 0 {
						ref = 99
					}
					second = append(second, []any{id, vf, ref})
				}
			}
			_, err = r.Run(ctx, job(first))
			require.NoError(t, err)
			before := tableDump(t, db)
			rep, err := r.Run(ctx, job(second))
			require.NoError(t, err)
			require.Positive(t, rep.Counts.Rejected)
			require.True(t, rep.Counts.Balanced())
			require.NotEqual(t, before, tableDump(t, db))
			_, err = r.Rollback(ctx, job(second), backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "ann", Why: "test"})
			require.NoError(t, err)
			require.Equal(t, before, tableDump(t, db))
		})
	}
}

// TestMergeRefusalsWithUnchangedDeliveries: a replay by a new batch whose
// chunk the target refuses rows of (a foreign key, found by bisection, so
// the chunk merges in parts) records the rows it delivered unchanged for
// every part, and they still protect the first batch's rows from its
// rollback.
func TestMergeRefusalsWithUnchangedDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(0, 9);
		CREATE TABLE t (id int PRIMARY KEY, ref int REFERENCES parent,
			backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	target := backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "ref"}}
	job := func(rows [][]any) backfill.Job {
		return backfill.Job{Name: "deliv", Chunker: backfill.List("a"), Extractor: rowsFunc(rows...), Target: target,
			NewRun: true, MaxRunRejectRate: -1}
	}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	var first, second [][]any
	for id := 1; id <= 64; id++ {
		first = append(first, []any{id, id % 10})
		second = append(second, []any{id, id % 10}) // unchanged
	}
	for id := 65; id <= 68; id++ {
		second = append(second, []any{id, 99}) // refused by the foreign key
	}
	rep1, err := r.Run(ctx, job(first))
	require.NoError(t, err)
	rep2, err := r.Run(ctx, job(second))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 68, Unchanged: 64, Rejected: 4}, rep2.Counts)
	var parts int
	require.NoError(t, db.Get(&parts, `SELECT count(*) FROM backfill.delivered WHERE owner = $1 AND batch_id = $2`, rep1.BatchID, rep2.BatchID))
	require.Greater(t, parts, 1, "the chunk merged in parts, each recording its deliveries")
	_, err = r.Rollback(ctx, job(first), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "ann", Why: "test"})
	require.ErrorIs(t, err, backfill.ErrRollbackConflict)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM t`))
	require.Equal(t, 64, n)
}

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

func rowsFunc(rows ...[]any) backfill.Extractor {
	return backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		for _, r := range rows {
			if err := w.Write(ctx, r...); err != nil {
				return err
			}
		}
		return nil
	})
}

func exceptionsOf(t *testing.T, db *sqlx.DB, batch int64) []backfill.Exception {
	t.Helper()
	ex, err := backfill.NewPGManifest("").Exceptions(context.Background(), db, batch)
	require.NoError(t, err)
	return ex
}

func TestAppendOnlyConflictingReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE events (event_id text PRIMARY KEY, kind text NOT NULL, amount numeric(10,2))`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := backfill.Job{Name: "events", Chunker: backfill.List("file-1"), MaxRunRejectRate: -1,
		Extractor: rowsFunc([]any{"e1", "sale", "10.00"}, []any{"e2", "refund", "-5.00"}),
		Rollback:  backfill.RollbackNone,
		Target:    backfill.Target{Table: "events", Key: []string{"event_id"}, Mode: backfill.AppendOnly}}
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	var before []string
	require.NoError(t, db.Select(&before, `SELECT row(e.*, xmin)::text FROM events e ORDER BY event_id`))

	// The same file again, but e2 now says something else.
	job.NewRun = true
	job.Extractor = rowsFunc([]any{"e1", "sale", "10.0"}, []any{"e2", "refund", "-7.50"})
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 2, Unchanged: 1, Rejected: 1}, rep.Counts, "10.0 equals 10.00; e2 conflicts")
	var after []string
	require.NoError(t, db.Select(&after, `SELECT row(e.*, xmin)::text FROM events e ORDER BY event_id`))
	require.Equal(t, before, after, "target unchanged")
	ex := exceptionsOf(t, db, rep.BatchID)
	require.Len(t, ex, 1)
	require.Equal(t, "(e2)", ex[0].Value)
	require.Equal(t, "amount", ex[0].Column)
	require.Equal(t, int64(2), ex[0].Row)
	require.Contains(t, ex[0].Reason, "conflicting content for existing event: amount differ")
	require.JSONEq(t, `{"staged": {"event_id": "e2", "kind": "refund", "amount": -7.50}, "existing": {"event_id": "e2", "kind": "refund", "amount": -5.00}}`, string(ex[0].Raw))
}

func TestKeylessDerivesKeysAndQueuesAmbiguity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE customers (customer_key text PRIMARY KEY, name text, city text)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := backfill.Job{Name: "legacy", Chunker: backfill.List("customers.csv"), MaxRunRejectRate: -1,
		Extractor: rowsFunc(
			[]any{"  Zoë  Müller", "Oslo"},
			[]any{"ZOE\u0308 MÜLLER", "Oslo"}, // same person: identical content after normalisation
			[]any{"Bob Stone", "Rome"},
			[]any{"bob  stone ", "Paris"}, // same derived key, other city: ambiguous
			[]any{nil, "Lima"},            // no name: no key
			[]any{"Ann", nil},
		),
		Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "customers", Key: []string{"customer_key"}, Mode: backfill.Keyless,
			Columns: []string{"name", "city"},
			Derive: []backfill.KeyRule{{Column: "customer_key", From: "name",
				Rules: []backfill.Normalizer{backfill.Trim, backfill.CollapseSpace, backfill.NFC, backfill.CaseFold}}}}}
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 6, Inserted: 2, Deduplicated: 1, Rejected: 3}, rep.Counts)
	var got [][2]string
	rows, err := db.Query(`SELECT customer_key, name FROM customers ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var k, n string
		require.NoError(t, rows.Scan(&k, &n))
		got = append(got, [2]string{k, n})
	}
	require.Equal(t, [][2]string{{"ann", "Ann"}, {"zoë müller", "  Zoë  Müller"}}, got)
	ex := exceptionsOf(t, db, rep.BatchID)
	require.Len(t, ex, 3)
	var reasons []string
	for _, e := range ex {
		reasons = append(reasons, fmt.Sprintf("%d %s: %s", e.Row, e.Column, e.Reason))
	}
	require.Equal(t, []string{
		"3 city: ambiguous derived key: rows 3 and others share it with different content",
		"4 city: ambiguous derived key: rows 3 and others share it with different content",
		`5 customer_key: missing key column: NULL in "name", the source of derived key "customer_key"`,
	}, reasons)
}

func TestHashColumnDetectsChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE prices (sku text PRIMARY KEY, price numeric(12,4), note text, row_hash bytea NOT NULL)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := func(price string, newRun bool) backfill.Job {
		return backfill.Job{Name: "prices", Chunker: backfill.List("all"), NewRun: newRun,
			Extractor: rowsFunc([]any{"a", price, nil}, []any{"b", "2", "x"}),
			Rollback:  backfill.RollbackNone,
			Target:    backfill.Target{Table: "prices", Key: []string{"sku"}, HashColumn: "row_hash"}}
	}
	rep, err := r.Run(ctx, job("1.5", false))
	require.NoError(t, err)
	require.Equal(t, int64(2), rep.Counts.Inserted)
	var h1 []byte
	require.NoError(t, db.Get(&h1, `SELECT row_hash FROM prices WHERE sku = 'a'`))
	require.Len(t, h1, 32)
	rep, err = r.Run(ctx, job("1.500", true))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 2, Unchanged: 2}, rep.Counts, "1.5 and 1.500 hash alike")
	rep, err = r.Run(ctx, job("1.6", true))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 2, Updated: 1, Unchanged: 1}, rep.Counts)
	var h2 []byte
	require.NoError(t, db.Get(&h2, `SELECT row_hash FROM prices WHERE sku = 'a'`))
	require.NotEqual(t, h1, h2)
}

// TestHistoryIntervalsTile checks SCD2 after random sequences of versions,
// late ones and exact repeats included: per key the intervals tile its
// history (valid_to = next valid_from, the last open), and the current row
// is the newest version.
func TestHistoryIntervalsTile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE addr (customer text, valid_from timestamptz, valid_to timestamptz, city text,
		PRIMARY KEY (customer, valid_from))`)
	require.NoError(t, err)
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, backfill.Target{Table: "addr", Key: []string{"customer"}, Mode: backfill.History})
	require.NoError(t, err)
	base := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	rapid.Check(t, func(rt *rapid.T) {
		_, err := db.Exec(`TRUNCATE addr`)
		require.NoError(rt, err)
		latest := map[string]time.Time{}
		for b := range rapid.IntRange(1, 6).Draw(rt, "batches") {
			tx, err := db.Beginx()
			require.NoError(rt, err)
			st, err := m.Stage(ctx, tx, info)
			require.NoError(rt, err)
			for i := range rapid.IntRange(0, 5).Draw(rt, "versions") {
				c := fmt.Sprintf("c%d", rapid.IntRange(0, 2).Draw(rt, "customer"))
				vf := base.Add(time.Duration(rapid.IntRange(0, 20).Draw(rt, "hour")) * time.Hour)
				city := fmt.Sprintf("city-%s-%d", c, vf.Hour()) // content is a function of the version
				if vf.After(latest[c]) {
					latest[c] = vf
				}
				require.NoError(rt, st.Add(ctx, int64(b*10+i+1), []any{c, vf.Format(time.RFC3339), city}))
			}
			_, err = st.Merge(ctx)
			require.NoError(rt, err)
			require.NoError(rt, tx.Commit())
		}
		type version struct {
			Customer  string     `db:"customer"`
			ValidFrom time.Time  `db:"valid_from"`
			ValidTo   *time.Time `db:"valid_to"`
		}
		var vs []version
		require.NoError(rt, db.Select(&vs, `SELECT customer, valid_from, valid_to FROM addr ORDER BY customer, valid_from`))
		for i, v := range vs {
			last := i == len(vs)-1 || vs[i+1].Customer != v.Customer
			if last {
				require.Nil(rt, v.ValidTo, "the current version of %s is open", v.Customer)
				require.True(rt, v.ValidFrom.Equal(latest[v.Customer]), "the current version of %s is the newest", v.Customer)
				continue
			}
			require.NotNil(rt, v.ValidTo)
			require.True(rt, v.ValidTo.Equal(vs[i+1].ValidFrom), "%s: [%s, %s) then %s", v.Customer, v.ValidFrom, v.ValidTo, vs[i+1].ValidFrom)
		}
		require.Len(rt, latest, countDistinct(vs, func(v version) string { return v.Customer }))
	})
}

func countDistinct[T any](xs []T, key func(T) string) int {
	m := map[string]bool{}
	for _, x := range xs {
		m[key(x)] = true
	}
	return len(m)
}

// TestHistoryRejectsNullValidFrom: a version without a start is rejected
// (a NULL never matches itself, so it would be inserted again by every
// run), even when the target's valid_from column is nullable; the other
// rows load and a replay writes nothing.
func TestHistoryRejectsNullValidFrom(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE prices (sku text NOT NULL, valid_from date, valid_to date, amount numeric(10,2), UNIQUE (sku, valid_from))`)
	require.NoError(t, err)
	job := backfill.Job{Name: "prices", Chunker: backfill.List("prices.csv"), Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
		Extractor:  rowsFunc([]any{"a", "2024-01-01", "1.00"}, []any{"c", nil, "3.00"}, []any{"a", "2024-02-01", "2.00"}),
		Target:     backfill.Target{Table: "prices", Key: []string{"sku"}, Columns: []string{"sku", "valid_from", "amount"}, Mode: backfill.History},
		Validators: []backfill.Validator{backfill.ReplayChangesNothing{}, backfill.Completeness{CompareContent: true}}}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	for run := range 2 {
		job.NewRun = run > 0
		rep, err := r.Run(context.Background(), job)
		require.NoError(t, err)
		require.Equal(t, backfill.RunCompleted, rep.Status)
		want := backfill.Counts{Read: 3, Inserted: 2, Rejected: 1}
		if run > 0 {
			want = backfill.Counts{Read: 3, Unchanged: 2, Rejected: 1}
		}
		require.Equal(t, want, rep.Counts)
		ex := exceptionsOf(t, db, rep.BatchID)
		require.Len(t, ex, 1)
		require.Equal(t, []any{int64(2), "valid_from", "null value in NOT NULL column"}, []any{ex[0].Row, ex[0].Column, ex[0].Reason})
	}
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM prices`))
	require.Equal(t, 2, n)
}

// equalityChecks are the checks that compare a chunk's staged rows with
// its target rows, each at its strictest.
func equalityChecks() []backfill.Validator {
	return []backfill.Validator{
		backfill.Completeness{CompareContent: true},
		backfill.Completeness{Name: "completeness_exact", CompareContent: true, Exact: true},
		backfill.Sample{N: 1000},
		backfill.ReplayChangesNothing{},
		backfill.ReplayChangesNothing{Name: "replay_exact", Exact: true},
		backfill.Aggregates{Exact: true},
		backfill.DuplicateKeys{},
	}
}

// TestHashColumnFollowsTheEqualityRule: with Target.HashColumn the merge
// judges a replay as it does without one, by the stored form of each
// value: numeric 1.50 for 1.5 in an unconstrained numeric and -0 for 0
// are changes (the merge updates the row, and the checks then pass),
// 1.50 for 15.0e-1 is not. The verdicts are those of the same target
// without a hash column.
func TestHashColumnFollowsTheEqualityRule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE hashed (sku text PRIMARY KEY, price numeric, qty float8, row_hash bytea NOT NULL);
		CREATE TABLE plain (sku text PRIMARY KEY, price numeric, qty float8)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	run := func(table, price string, qty float64) backfill.Counts {
		t.Helper()
		target := backfill.Target{Table: table, Key: []string{"sku"}, Columns: []string{"sku", "price", "qty"}}
		if table == "hashed" {
			target.HashColumn = "row_hash"
		}
		rep, err := r.Run(ctx, backfill.Job{Name: table, Chunker: backfill.List("all"), NewRun: true, Rollback: backfill.RollbackNone,
			Extractor: rowsFunc([]any{"a", price, qty}, []any{"b", "2", 1.0}), Target: target, Validators: equalityChecks()})
		require.NoError(t, err, "%s: price %s, qty %v", table, price, qty)
		return rep.Counts
	}
	negZero := func() float64 { z := 0.0; return -z }()
	for _, table := range []string{"plain", "hashed"} {
		require.Equal(t, backfill.Counts{Read: 2, Inserted: 2}, run(table, "1.5", 0))
		require.Equal(t, backfill.Counts{Read: 2, Updated: 1, Unchanged: 1}, run(table, "1.50", 0), "%s: 1.50 for 1.5", table)
		require.Equal(t, backfill.Counts{Read: 2, Unchanged: 2}, run(table, "15.0e-1", 0), "%s: 15.0e-1 for 1.50", table)
		require.Equal(t, backfill.Counts{Read: 2, Updated: 1, Unchanged: 1}, run(table, "15.0e-1", negZero), "%s: -0 for 0", table)
	}
}

// TestRespelledKeysAreTheSameRow: a replay whose business keys are
// spelled otherwise (numeric 1.00 for 1.0, a timestamptz in another zone,
// an upper-case uuid, another case under a case-insensitive collation)
// finds the rows it loaded: the merge leaves them unchanged, and every
// check agrees that they are present with the same content.
func TestRespelledKeysAreTheSameRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		CREATE TABLE keyed (n numeric, at timestamptz, u uuid, k text COLLATE ci, v text, row_hash bytea,
			PRIMARY KEY (n, at, u, k))`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	for _, hash := range []string{"", "row_hash"} {
		_, err := db.Exec(`TRUNCATE keyed`)
		require.NoError(t, err)
		run := func(rows ...[]any) backfill.Counts {
			t.Helper()
			rep, err := r.Run(ctx, backfill.Job{Name: "keyed" + hash, Chunker: backfill.List("all"), NewRun: true, Rollback: backfill.RollbackNone,
				Extractor: rowsFunc(rows...), Validators: equalityChecks(),
				Target: backfill.Target{Table: "keyed", Key: []string{"n", "at", "u", "k"}, Columns: []string{"n", "at", "u", "k", "v"}, HashColumn: hash}})
			require.NoError(t, err, "hash column %q", hash)
			return rep.Counts
		}
		require.Equal(t, backfill.Counts{Read: 2, Inserted: 2}, run(
			[]any{"1.0", "2024-03-01T10:00:00Z", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "abc", "x"},
			[]any{"2", "2024-03-01T11:00:00Z", "b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12", "Def", "y"}))
		require.Equal(t, backfill.Counts{Read: 2, Unchanged: 2}, run(
			[]any{"1.00", "2024-03-01T12:00:00+02:00", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "ABC", "x"},
			[]any{"2e0", "2024-03-01T06:00:00-05:00", "{b0eebc999c0b4ef8bb6d6bb9bd380a12}", "dEF", "y"}), "hash column %q", hash)
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM keyed`))
		require.Equal(t, 2, n)
	}
}

// TestKeylessHashColumnIgnoresDeriveSources: in Keyless mode the raw
// sources of derived keys are not content (rows that differ only there
// are one record), so the row hash leaves them out: a replay that spells
// a name otherwise (" ACME " for "Acme", one derived key) is unchanged
// with a hash column as without one, never an ambiguous key.
func TestKeylessHashColumnIgnoresDeriveSources(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE legacy (name_key text PRIMARY KEY, name text, city text, row_hash bytea);
		CREATE TABLE legacy_plain (name_key text PRIMARY KEY, name text, city text)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	for _, table := range []string{"legacy_plain", "legacy"} {
		run := func(name, city string) backfill.Counts {
			t.Helper()
			target := backfill.Target{Table: table, Key: []string{"name_key"}, Mode: backfill.Keyless, Columns: []string{"name", "city"},
				Derive: []backfill.KeyRule{{Column: "name_key", From: "name", Rules: []backfill.Normalizer{backfill.Trim, backfill.CaseFold}}}}
			if table == "legacy" {
				target.HashColumn = "row_hash"
			}
			rep, err := r.Run(ctx, backfill.Job{Name: table, Chunker: backfill.List("all"), NewRun: true, Rollback: backfill.RollbackNone,
				Extractor: rowsFunc([]any{name, city}), Target: target, Validators: equalityChecks()})
			require.NoError(t, err, table)
			return rep.Counts
		}
		require.Equal(t, backfill.Counts{Read: 1, Inserted: 1}, run("Acme", "Oslo"), table)
		require.Equal(t, backfill.Counts{Read: 1, Unchanged: 1}, run(" ACME ", "Oslo"), "%s: another spelling of the derived key's source", table)
	}
}

// TestAggregatesGroupsByStoredValue: Aggregates groups its Dimensions by
// the stored value, as the merge compares content: under TargetWins a
// staged row that lost to a target row whose dimension holds another
// stored form of an equal value (numeric 1.50 for 1.5, float -0 for 0,
// interval '24 hours' for '1 day') shows up as a difference, and a
// respelling of the same stored value (15e-1 for 1.5) does not.
func TestAggregatesGroupsByStoredValue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE dims (id int PRIMARY KEY, grp numeric, f float8, iv interval)`)
	require.NoError(t, err)
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, backfill.Target{Table: "dims", Key: []string{"id"}, Conflict: backfill.TargetWins})
	require.NoError(t, err)
	stage := func(tx *sqlx.Tx, row ...any) backfilldriver.Stager {
		st, err := m.Stage(ctx, tx, info)
		require.NoError(t, err)
		require.NoError(t, st.Add(ctx, 1, row))
		_, err = st.Merge(ctx)
		require.NoError(t, err)
		return st
	}
	tx, err := db.Beginx()
	require.NoError(t, err)
	require.NoError(t, stage(tx, 1, "1.5", 0.0, "1 day").Close())
	require.NoError(t, tx.Commit())
	for _, c := range []struct {
		dim    string
		row    []any
		passed bool
	}{
		{"grp", []any{1, "15e-1", 0.0, "1 day"}, true},
		{"grp", []any{1, "1.50", 0.0, "1 day"}, false},
		{"f", []any{1, "1.5", math.Copysign(0, -1), "1 day"}, false},
		{"iv", []any{1, "1.5", 0.0, "24 hours"}, false},
		{"iv", []any{1, "1.5", 0.0, "P1D"}, true},
	} {
		tx, err := db.Beginx()
		require.NoError(t, err)
		st := stage(tx, c.row...)
		res, err := backfill.Aggregates{Dimensions: []string{c.dim}, Exact: true}.Validate(ctx, tx, backfill.ValidationScope{
			Chunk: backfill.Chunk{ID: "list:all", Kind: backfilltype.KindList, Item: "all"}, Info: info,
			Staging: st.(backfilldriver.StagingTabler).StagingTable(), Stager: st})
		require.NoError(t, err)
		require.Equal(t, c.passed, res.Passed, "%s %v: %s %v", c.dim, c.row, res.Actual, res.Sample)
		require.NoError(t, st.Close())
		require.NoError(t, tx.Rollback())
	}
}

// TestHistoryRespelledIdentityIsTheSameVersion: in History mode the
// identity is Key plus ValidFrom; a replay that spells both otherwise (the
// customer in another case under a case-insensitive collation, valid_from
// in another zone, the amount respelled with its scale) finds every
// version: no version is added or closed, nothing changes, and every
// check agrees, with a hash column as without one.
func TestHistoryRespelledIdentityIsTheSameVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		CREATE TABLE addr (customer text COLLATE ci, valid_from timestamptz, valid_to timestamptz, city text, amount numeric,
			row_hash bytea, PRIMARY KEY (customer, valid_from))`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	at := time.Date(2024, 3, 1, 10, 0, 0, 0, time.UTC)
	east := time.FixedZone("", 2*3600)
	for _, hash := range []string{"", "row_hash"} {
		_, err := db.Exec(`TRUNCATE addr`)
		require.NoError(t, err)
		run := func(rows ...[]any) backfill.Counts {
			t.Helper()
			rep, err := r.Run(ctx, backfill.Job{Name: "addr" + hash, Chunker: backfill.List("all"), NewRun: true, Rollback: backfill.RollbackNone,
				Extractor: rowsFunc(rows...), Validators: equalityChecks(),
				Target: backfill.Target{Table: "addr", Key: []string{"customer"}, Mode: backfill.History,
					Columns: []string{"customer", "valid_from", "city", "amount"}, HashColumn: hash}})
			require.NoError(t, err, "hash column %q", hash)
			return rep.Counts
		}
		require.Equal(t, backfill.Counts{Read: 2, Inserted: 2}, run(
			[]any{"acme", at, "Oslo", "1.5"}, []any{"acme", at.AddDate(0, 1, 0), "Bergen", "2.0"}))
		require.Equal(t, backfill.Counts{Read: 2, Unchanged: 2}, run(
			[]any{"ACME", at.In(east), "Oslo", "15e-1"}, []any{"Acme", at.AddDate(0, 1, 0).Format(time.RFC3339), "Bergen", "0.20e1"}),
			"hash column %q", hash)
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM addr`))
		require.Equal(t, 2, n)
	}
}

// TestRollbackFindsRespelledKeys: the undo log records a key as the replay
// spelled it (numeric 1.00, a timestamptz in another zone, an upper-case
// uuid, another case under a case-insensitive collation); rollback looks
// the rows up by the same rule as the merge and restores them.
func TestRollbackFindsRespelledKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		CREATE TABLE keyed (n numeric, at timestamptz, u uuid, k text COLLATE ci, v text,
			backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (n, at, u, k))`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := func(rows ...[]any) backfill.Job {
		return backfill.Job{Name: "keyed", Chunker: backfill.List("all"), NewRun: true, Extractor: rowsFunc(rows...), Validators: equalityChecks(),
			Target: backfill.Target{Table: "keyed", Key: []string{"n", "at", "u", "k"}, Columns: []string{"n", "at", "u", "k", "v"}}}
	}
	at := time.Date(2024, 3, 1, 10, 0, 0, 0, time.UTC)
	_, err = r.Run(ctx, job([]any{"1.0", at, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "abc", "x"}))
	require.NoError(t, err)
	rep, err := r.Run(ctx, job([]any{"1.00", at.In(time.FixedZone("", 3600)), "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "ABC", "changed"}))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1, Updated: 1}, rep.Counts)
	rb, err := r.Rollback(ctx, job(), backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "test", Why: "respelled keys"})
	require.NoError(t, err)
	require.Equal(t, int64(1), rb.Restored)
	var rows []string
	require.NoError(t, db.Select(&rows, `SELECT n || ' ' || k || ' ' || v FROM keyed`))
	require.Equal(t, []string{"1.0 abc x"}, rows)
}

// TestAggregatesGroupsKeysByTheTargetRow: a Dimension that is a key column
// groups a staged row under the key its target row stores (the package
// documentation's "Equality": the target keeps the key as first stored), so
// a replay that spells the key otherwise (numeric 1.00 for 1.0, the instant
// in another zone, an upper-case uuid, another case under a case-insensitive
// collation or in citext) passes, as does a chunk that repeats a row with
// its key spelled otherwise, which the merge deduplicates. The Day of a
// timestamptz key in another zone is the same instant's day.
func TestAggregatesGroupsKeysByTheTargetRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE EXTENSION IF NOT EXISTS citext;
		CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		CREATE TABLE eq_t (k numeric, at timestamptz, id uuid, c text COLLATE ci, ct citext, amt numeric, note text, h bytea,
			UNIQUE (k, at, id, c, ct))`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	at := time.Date(2024, 3, 1, 23, 30, 0, 0, time.UTC)
	east := time.FixedZone("", 5*3600)
	u := "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
	loaded := []any{"1.0", at, u, "abc", "Xyz", "1.5", "n"}
	respelled := []any{"1.00", at.In(east), strings.ToUpper(u), "ABC", "xYZ", "1.5", "n"}
	other := []any{"2", at.Add(-time.Hour), "b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12", "def", "uvw", "2.5", "m"}
	for _, dims := range [][]string{{"note"}, {"k"}, {"k", "id"}, {"c", "ct", "at"}, {"k", "at", "id", "c", "ct", "note"}} {
		for _, hash := range []string{"", "h"} {
			_, err := db.Exec(`TRUNCATE eq_t`)
			require.NoError(t, err)
			run := func(rows ...[]any) backfill.Counts {
				t.Helper()
				rep, err := r.Run(ctx, backfill.Job{Name: "eq_t", NewRun: true, Rollback: backfill.RollbackNone,
					Chunker: backfill.Days(at.Truncate(24*time.Hour), at.Truncate(24*time.Hour).AddDate(0, 0, 1), time.UTC), ChunkColumn: "at",
					Extractor: rowsFunc(rows...),
					Validators: []backfill.Validator{
						backfill.Aggregates{Day: "at", Dimensions: dims, Measures: []backfill.Measure{{Column: "amt"}}},
						backfill.Aggregates{Name: "aggregates_exact", Day: "at", Dimensions: dims, Measures: []backfill.Measure{{Column: "amt"}}, Exact: true},
					},
					Target: backfill.Target{Table: "eq_t", Key: []string{"k", "at", "id", "c", "ct"}, HashColumn: hash,
						Columns: []string{"k", "at", "id", "c", "ct", "amt", "note"}}})
				require.NoError(t, err, "dimensions %v, hash column %q", dims, hash)
				return rep.Counts
			}
			require.Equal(t, backfill.Counts{Read: 2, Inserted: 2}, run(loaded, other))
			require.Equal(t, backfill.Counts{Read: 2, Unchanged: 2}, run(respelled, other), "dimensions %v, hash column %q: the replay", dims, hash)
			require.Equal(t, backfill.Counts{Read: 3, Unchanged: 2, Deduplicated: 1}, run(loaded, respelled, other),
				"dimensions %v, hash column %q: a row repeated with its key spelled otherwise", dims, hash)
			_, err = db.Exec(`TRUNCATE eq_t`)
			require.NoError(t, err)
			require.Equal(t, backfill.Counts{Read: 3, Inserted: 2, Deduplicated: 1}, run(respelled, other, loaded),
				"dimensions %v, hash column %q: a first load that repeats a row with its key spelled otherwise", dims, hash)
		}
	}
}

// spelledColumn is a column of the conformance table: its type, and its
// values as groups of spellings. The spellings of a group are read into
// one stored value; two groups are two stored values (numeric 1.5 and
// 1.50 are two groups: equal by numeric's =, stored apart).
type spelledColumn struct {
	name, typ string
	groups    [][]any
}

var negZero = math.Copysign(0, -1)

// spelledColumns covers every type family the row writer converts, and
// a few it passes to PostgreSQL as text (interval, time, arrays, inet).
var spelledColumns = []spelledColumn{
	{"i2", "int2", [][]any{{int64(7), "7", "+7", "007"}, {int64(-3), "-3"}}},
	{"i8", "int8", [][]any{{int64(1 << 40), "1099511627776"}, {int64(0), "0", "-0", "+0"}}},
	{"f8", "float8", [][]any{{1.5, "1.5", "15e-1", "1.50"}, {0.0, "0", "0.0"}, {negZero, "-0", "-0.0"},
		{math.NaN(), "NaN", "nan"}, {math.Inf(1), "Infinity", "inf"}, {0.1, "0.1", "1e-1"}}},
	{"f4", "real", [][]any{{"0.1", float32(0.1)}, {"-0", "-0.0"}, {"1.5", "15e-1"}}},
	{"n", "numeric", [][]any{{"1.5", "15e-1", "+1.5", "01.5", " 1.5", "0.15e1"}, {"1.50", "15.0e-1", "0.150e1"},
		{"0.0", "-0.0", "-0e-1"}, {"NaN", "nan"}, {"12345.678", "1.2345678e4"}}},
	{"n2", "numeric(12,2)", [][]any{{"1.5", "1.50", "1.500", "1.499999", "15e-1"}, {"0", "-0", "0.001"}, {"2.25"}}},
	{"b", "bool", [][]any{{true, "t", "true", "yes", "on", "1", "TRUE"}, {false, "f", "no", "off", "0"}}},
	{"t", "text", [][]any{{"abc"}, {"Abc"}, {""}, {"abc "}}},
	{"vc", "varchar(20)", [][]any{{"x y"}, {"x  y"}}},
	{"ch", "char(6)", [][]any{{"ab", "ab ", "ab    "}, {"Ab"}}},
	{"c", "text COLLATE ci", [][]any{{"abc"}, {"ABC"}, {"Abc"}}},
	{"ct", "citext", [][]any{{"abc"}, {"ABC"}}},
	{"d", "date", [][]any{{"2024-03-01", "20240301", time.Date(2024, 3, 1, 23, 0, 0, 0, time.FixedZone("", -3600))}, {"2024-02-29"}}},
	{"ts", "timestamp", [][]any{{"2024-03-01 10:00:00", "2024-03-01T10:00:00", "2024-03-01 10:00:00.000",
		time.Date(2024, 3, 1, 10, 0, 0, 0, time.FixedZone("", 3600))}, {"2024-03-01 10:00:00.000001"}}},
	{"tz", "timestamptz", [][]any{{"2024-03-01T10:00:00Z", "2024-03-01T12:00:00+02:00", "2024-03-01 05:00:00-05",
		time.Date(2024, 3, 1, 10, 0, 0, 0, time.UTC), time.Date(2024, 3, 1, 11, 0, 0, 0, time.FixedZone("", 3600))},
		{"2024-03-01T10:00:00.000001Z"}}},
	{"tm", "time", [][]any{{"10:00:00", "10:00", "10:00:00.000"}, {"10:00:01"}}},
	{"u", "uuid", [][]any{{"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "{a0eebc999c0b4ef8bb6d6bb9bd380a11}"},
		{"b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"}}},
	{"js", "json", [][]any{{`{"a":1}`}, {`{"a": 1}`}, {`{"a":1.0}`}}},
	{"jb", "jsonb", [][]any{{`{"a":1,"b":[1,2]}`, `{"b": [1, 2], "a": 1}`, ` {"a" : 1 , "b":[1,2]}`, `{"a":0,"a":1,"b":[1,2]}`},
		{`{"a":1.0,"b":[1,2]}`}, {`"xy"`, `"\u0078y"`}}},
	{"by", "bytea", [][]any{{[]byte("ab"), "ab"}, {[]byte{0, 255}}, {[]byte{}, ""}}},
	{"iv", "interval", [][]any{{"1 day", "1 days", "+1 day", "P1D", "@ 1 day"}, {"24 hours", "24:00:00", "PT24H", 24 * time.Hour},
		{"1 mon", "1 month", "P1M"}}},
	{"arr", "int[]", [][]any{{"{1,2}", "{1, 2}", " {1,2}", []int64{1, 2}}, {"{2,1}"}}},
	{"ip", "inet", [][]any{{"10.0.0.1", "10.0.0.1/32"}, {"10.0.0.1/24"}}},
}

// keySpellings returns the spellings of row i's business key (numeric,
// timestamptz, uuid, text under a case-insensitive collation): each
// spelling names the same row by the target's unique index.
func keySpellings(i int) [4][]any {
	at := time.Date(2024, 3, 1, i, 0, 0, 0, time.UTC)
	u := fmt.Sprintf("c0eebc99-9c0b-4ef8-bb6d-6bb9bd38%04x", i)
	k := fmt.Sprintf("key%dx", i)
	return [4][]any{
		{fmt.Sprint(i), fmt.Sprintf("%d.0", i), fmt.Sprintf("%d.00", i), fmt.Sprintf("%de0", i), fmt.Sprintf("+%d", i)},
		{at, at.In(time.FixedZone("", 7200)), at.In(time.FixedZone("", -5*3600)).Format(time.RFC3339), at.Format("2006-01-02 15:04:05Z07")},
		{u, strings.ToUpper(u), "{" + strings.ReplaceAll(u, "-", "") + "}"},
		{k, strings.ToUpper(k), strings.ToUpper(k[:1]) + k[1:]},
	}
}

// TestEqualityRuleConformance is the conformance property of the
// equality rule (package documentation, "Equality"): for random
// respellings of the keys and values of every supported type, some of
// them other stored values, the merge, the merge through a hash column
// and every check reach the same verdict. The merge of the replay finds
// every row (no insert), updates exactly the rows whose stored content
// changed (compared as PostgreSQL prints the stored values), with or
// without Target.HashColumn; every check then passes (Aggregates also
// with the key columns as its dimensions), the target holds
// what a fresh load of the replay stores, and the replay again changes
// nothing. AppendOnly refuses exactly the changed rows instead, and every
// mode deduplicates a row repeated in the chunk with its key and values
// spelled otherwise.
func TestEqualityRuleConformance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	var cols []string
	for _, c := range spelledColumns {
		cols = append(cols, c.name+" "+c.typ)
	}
	ddl := "(kn numeric, kt timestamptz, ku uuid, kc text COLLATE ci, " + strings.Join(cols, ", ") + ", PRIMARY KEY (kn, kt, ku, kc)"
	_, err := db.Exec(`CREATE EXTENSION IF NOT EXISTS citext;
		CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		CREATE TABLE plain ` + ddl + `);
		CREATE TABLE hashed ` + ddl + `, row_hash bytea);
		CREATE TABLE fresh ` + ddl + `)`)
	require.NoError(t, err)
	names := []string{"kn", "kt", "ku", "kc"}
	for _, c := range spelledColumns {
		names = append(names, c.name)
	}
	m := pgstore.NewMerger()
	prepare := func(table, hash string, mode backfill.Mode) backfilltype.TableInfo {
		info, err := m.Prepare(ctx, db, backfill.Target{Table: table, Key: names[:4], Columns: names, HashColumn: hash, Mode: mode})
		require.NoError(t, err)
		return info
	}
	modes := map[backfill.Mode][2]backfilltype.TableInfo{}
	for _, mode := range []backfill.Mode{backfill.Upsert, backfill.AppendOnly} {
		modes[mode] = [2]backfilltype.TableInfo{prepare("plain", "", mode), prepare("hashed", "row_hash", mode)}
	}
	fresh := prepare("fresh", "", backfill.Upsert)
	// content is a row's content as PostgreSQL prints it, of alias a.
	content := func(a string) string { return "ROW(" + a + "." + strings.Join(names[4:], ", "+a+".") + ")::text" }
	// Aggregates groups content dimensions by stored value, and key
	// dimensions by the key the target row stores: a respelled key falls
	// into the group of the row it merged into, and the Day of a
	// timestamptz key is its instant's, whatever the zone spelled.
	checks := append(equalityChecks(), backfill.Aggregates{Name: "aggregates_groups", Dimensions: []string{"t", "c", "ch", "ts", "by"},
		Measures: []backfill.Measure{{Column: "n"}, {Column: "n2"}, {Column: "f8"}, {Column: "i8"}}, Exact: true},
		backfill.Aggregates{Name: "aggregates_keys", Day: "kt", Dimensions: []string{"kn", "kt", "ku", "kc", "t"},
			Measures: []backfill.Measure{{Column: "n2"}, {Column: "i2"}}, Exact: true})

	rapid.Check(t, func(rt *rapid.T) {
		mode := rapid.SampledFrom([]backfill.Mode{backfill.Upsert, backfill.AppendOnly}).Draw(rt, "mode")
		n := rapid.IntRange(1, 6).Draw(rt, "rows")
		var load, replay [][]any
		var dups int64
		for i := range n {
			keys := keySpellings(i)
			// spell draws a row of key i whose column c holds a spelling
			// of group groups[c].
			spell := func(groups []int) []any {
				var row []any
				for _, k := range keys {
					row = append(row, rapid.SampledFrom(k).Draw(rt, "key"))
				}
				for j, c := range spelledColumns {
					row = append(row, rapid.SampledFrom(append(c.groups, []any{nil})[groups[j]]).Draw(rt, c.name+" spelling"))
				}
				return row
			}
			var loaded, replayed []int
			for _, c := range spelledColumns {
				g := rapid.IntRange(0, len(c.groups)).Draw(rt, c.name)
				loaded = append(loaded, g)
				if rapid.IntRange(0, 3).Draw(rt, c.name+" changes") == 0 {
					g = rapid.IntRange(0, len(c.groups)).Draw(rt, c.name+" replayed")
				}
				replayed = append(replayed, g)
			}
			load = append(load, spell(loaded))
			if rapid.IntRange(0, 3).Draw(rt, "duplicate") == 0 {
				// The same row, spelled otherwise, earlier in the chunk:
				// deduplicated in every mode.
				replay = append(replay, spell(replayed))
				dups++
			}
			replay = append(replay, spell(replayed))
		}
		tx, err := db.Beginx()
		require.NoError(rt, err)
		defer func() { _ = tx.Rollback() }()
		// Floats print exactly, instants in one zone (differing).
		_, err = tx.ExecContext(ctx, `SET LOCAL extra_float_digits = 3; SET LOCAL TimeZone = 'UTC'`)
		require.NoError(rt, err)
		// merge merges rows into info's target as a chunk does and, with
		// check, runs every check after the merge. The example's merges
		// share one transaction, rolled back at its end: each empties
		// its staging table after it, as a chunk's commit does.
		merge := func(info backfilltype.TableInfo, rows [][]any, check bool) backfilltype.MergeResult {
			st, err := m.Stage(ctx, tx, info)
			require.NoError(rt, err)
			defer func() { require.NoError(rt, st.Close()) }()
			hasher := pgstore.NewRowHasher(info)
			for i, r := range rows {
				v := make([]any, len(info.Columns))
				for j, col := range info.Columns[:info.Written] {
					conv := pgconv.For(col.Conv())
					var reason string
					v[j], reason = conv.Convert(r[j])
					require.Empty(rt, reason, "column %s, value %#v", col.Name, r[j])
				}
				if info.Target.HashColumn != "" {
					v[len(v)-1] = hasher.Sum(v)
				}
				require.NoError(rt, st.Add(ctx, int64(i+1), v))
			}
			mr, err := st.Merge(ctx)
			require.NoError(rt, err, "%s %+v", info.Target.Table, mr)
			if check {
				scope := backfill.ValidationScope{Chunk: backfill.Chunk{ID: "list:all", Kind: backfilltype.KindList, Item: "all"}, Info: info,
					Counts: backfill.Counts{Read: int64(len(rows)), Inserted: mr.Inserted, Updated: mr.Updated, Unchanged: mr.Unchanged,
						Deduplicated: mr.Deduplicated, Rejected: int64(len(mr.Rejected))},
					Staging: st.(backfilldriver.StagingTabler).StagingTable(), Stager: st}
				for _, c := range checks {
					res, err := c.Validate(ctx, tx, scope)
					require.NoError(rt, err)
					require.True(rt, res.Passed, "%s on %s: %s; %s %s", res.Check, info.Target.Table, res.Actual, strings.Join(res.Sample, "; "), res.Detail)
				}
			}
			_, err = tx.ExecContext(ctx, "DELETE FROM "+st.(backfilldriver.StagingTabler).StagingTable())
			require.NoError(rt, err)
			return mr
		}
		// differing counts the rows of table whose content prints other
		// than fresh's row of the same key.
		differing := func(table string) int64 {
			var d int64
			require.NoError(rt, sqlx.GetContext(ctx, tx, &d, `SELECT count(*) FROM `+table+` x JOIN fresh f USING (kn, kt, ku, kc)
				WHERE `+content("x")+` IS DISTINCT FROM `+content("f")))
			return d
		}
		// verdict is a merge's counts.
		verdict := func(r backfilltype.MergeResult) [5]int64 {
			return [5]int64{r.Inserted, r.Updated, r.Unchanged, r.Deduplicated, int64(len(r.Rejected))}
		}
		require.Equal(rt, [5]int64{int64(n), 0, 0, dups, 0}, verdict(merge(fresh, replay, false)))
		for _, info := range modes[mode] {
			require.Equal(rt, int64(n), merge(info, load, false).Inserted)
			changed := differing(info.Target.Table)
			// Upsert updates the changed rows; AppendOnly refuses them
			// (an event's content never changes) and keeps the target.
			want, left := [5]int64{0, changed, int64(n) - changed, dups, 0}, int64(0)
			if mode == backfill.AppendOnly {
				want, left = [5]int64{0, 0, int64(n) - changed, dups, changed}, changed
			}
			require.Equal(rt, want, verdict(merge(info, replay, true)), "%s, %s: the replay's verdict", info.Target.Table, mode)
			require.Equal(rt, left, differing(info.Target.Table), "%s, %s: the target against a fresh load of the replay", info.Target.Table, mode)
			if mode == backfill.Upsert {
				want = [5]int64{0, 0, int64(n), dups, 0}
			}
			require.Equal(rt, want, verdict(merge(info, replay, false)), "%s, %s: the replay again", info.Target.Table, mode)
		}
	})
}
