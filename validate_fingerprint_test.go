package backfill_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// wideColumns are the columns of the table "wide" of
// TestFingerprintAgreesWithExactChecks, one per type family the
// fingerprint hashes, each with values that a mutation picks from: equal
// values of different spelling (1.0 and 1.00, -0 and 0, '1 day' and '24
// hours', the same instant in two zones), NULL next to a stand-in value
// (0, ”, 'null'), bigints whose 32-bit halves fold alike (0 and
// 4294967297), and plain different values.
var wideColumns = []struct {
	name, typ string
	values    []any // nil is NULL
}{
	{"i2", "smallint", []any{nil, "0", "1", "-1"}},
	{"i4", "int", []any{nil, "0", "7", "2147483647"}},
	{"i8", "bigint", []any{nil, "0", "1", "4294967297", "-4294967296"}},
	{"n", "numeric", []any{nil, "1.0", "1.00", "-1", "-0.5", "NaN", "Infinity", "-Infinity", "0"}},
	{"f8", "float8", []any{nil, "0", "-0", "1.5", "NaN", "Infinity"}},
	{"f4", "real", []any{nil, "0", "2.5"}},
	{"t", "text", []any{nil, "", "a", "A", "a b"}},
	{"vc", "varchar(20)", []any{nil, "", "a", "b"}},
	{"bc", "char(4)", []any{nil, "ab", "ab  ", "abc"}},
	{"ts", "timestamp", []any{nil, "2024-03-01 00:00", "2024-03-01 01:00", "infinity", "epoch"}},
	{"tz", "timestamptz", []any{nil, "2024-03-01 00:00+00", "2024-03-01 01:00+01", "2024-03-01 00:00+01", "epoch"}},
	{"d", "date", []any{nil, "2024-03-01", "2024-03-02", "infinity"}},
	{"tm", "time", []any{nil, "00:00", "12:00", "01:11:34.967297"}},
	{"b", "bool", []any{nil, "true", "false"}},
	{"u", "uuid", []any{nil, "00000000-0000-0000-0000-000000000000", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"}},
	{"jb", "jsonb", []any{nil, `{"a":1}`, `{"a": 1}`, `{"a":2}`, "null", "{}", "[]", "[null]"}},
	{"j", "json", []any{nil, `{"a":1}`, `{"a": 1}`}},
	{"iv", "interval", []any{nil, "1 day", "24 hours", "0", "-1 day"}},
	{"ip", "inet", []any{nil, "10.0.0.1", "10.0.0.1/32", "10.0.0.0/8", "0.0.0.0"}},
	{"ai", "int[]", []any{nil, "{}", "{1,2}", "{2,1}", "{NULL}"}},
	{"ta", "text[]", []any{nil, "{a}", "{a,b}", `{""}`}},
	{"pt", "point", []any{nil, "(1,2)", "(2,1)"}},
	{"fa", "float8[]", []any{nil, "{}", "{0.1}", "{0.30000000000000004}", "{-0}", "{0}"}},
	{"rp", "regprocedure", []any{nil, "ff(integer)", "ff(text)"}},
	{"m", "mood", []any{nil, "sad", "ok"}},
	{"pi", "posint", []any{nil, "1", "2"}},
	{"nda", "nd[]", []any{nil, "{1.0}", "{1.00}"}},
	{"fda", "fd[]", []any{nil, "{0}", "{-0}"}},
	{"cia", "cit[]", []any{nil, "{abc}", "{ABC}"}},
	{"cx", "citext[]", []any{nil, "{abc}", "{ABC}"}},
	{"ub", "bpchar", []any{nil, "a", "a ", ""}},
}

// TestFingerprintAgreesWithExactChecks is the property behind the
// fingerprint shortcut: for any staged rows and any defect seeded into
// the target after the merge, the shortcut's verdict equals the exact
// comparison's, and the shortcut proves the rows equal (method
// "fingerprint") exactly when the exact comparison finds no difference.
// Defects: a value changed (possibly to an equal value spelled otherwise,
// or to NULL), a column's values swapped between two rows, two columns'
// values swapped within a row, a row deleted, a row added, a row moved
// out of the chunk.
func TestFingerprintAgreesWithExactChecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	ddl := `CREATE TYPE mood AS ENUM ('sad', 'ok');
		CREATE FUNCTION ff(int) RETURNS int LANGUAGE sql AS 'SELECT 1';
		CREATE FUNCTION ff(text) RETURNS int LANGUAGE sql AS 'SELECT 2';
		CREATE DOMAIN posint AS int CHECK (VALUE > 0);
		CREATE DOMAIN nd AS numeric; CREATE DOMAIN fd AS float8; CREATE EXTENSION IF NOT EXISTS citext;
		CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		CREATE DOMAIN cit AS text COLLATE ci;
		CREATE TABLE wide (id bigint PRIMARY KEY, at timestamptz NOT NULL`
	cols := []string{"id", "at"}
	for _, c := range wideColumns {
		ddl += fmt.Sprintf(", %s %s", c.name, c.typ)
		cols = append(cols, c.name)
	}
	_, err := db.Exec(ddl + `); CREATE INDEX ON wide (at)`)
	require.NoError(t, err)
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, backfill.Target{Table: "wide", Key: []string{"id"}, Columns: cols})
	require.NoError(t, err)
	day := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	chunk := backfill.Chunk{ID: "time:2024-03-01T00:00:00Z/2024-03-02T00:00:00Z", Kind: backfilltype.KindTime, Start: day, End: day.AddDate(0, 0, 1)}
	ats := []any{"2024-03-01 00:00+00", "2024-03-01 13:30+00", "2024-03-01 23:59:59.999999+00"}

	type pair struct{ fast, exact backfill.Validator }
	checks := []pair{
		{backfill.Completeness{CompareContent: true}, backfill.Completeness{CompareContent: true, Exact: true}},
		{backfill.ReplayChangesNothing{}, backfill.ReplayChangesNothing{Exact: true}},
		{backfill.Aggregates{Day: "at", Dimensions: []string{"t"}, Measures: []backfill.Measure{{Column: "n"}, {Column: "i4"}}},
			backfill.Aggregates{Day: "at", Dimensions: []string{"t"}, Measures: []backfill.Measure{{Column: "n"}, {Column: "i4"}}, Exact: true}},
	}

	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 5).Draw(rt, "rows")
		rows := make([][]any, n)
		for i := range rows {
			rows[i] = []any{int64(i + 1), rapid.SampledFrom(ats).Draw(rt, "at")}
			for _, c := range wideColumns {
				rows[i] = append(rows[i], rapid.SampledFrom(c.values).Draw(rt, c.name))
			}
		}
		tx, err := db.Beginx()
		require.NoError(rt, err)
		defer func() { _ = tx.Rollback() }()
		st, err := m.Stage(ctx, tx, info)
		require.NoError(rt, err)
		defer func() { _ = st.Close() }()
		for i, r := range rows {
			require.NoError(rt, st.Add(ctx, int64(i+1), r))
		}
		mr, err := st.Merge(ctx)
		require.NoError(rt, err)
		require.Equal(rt, int64(n), mr.Inserted)

		var defect string
		var args []any
		row := func(label string) int64 { return int64(rapid.IntRange(1, n).Draw(rt, label)) }
		switch rapid.IntRange(0, 6).Draw(rt, "defect") {
		case 0: // none
		case 1, 2: // a value changed, maybe to an equal one
			c := rapid.SampledFrom(wideColumns).Draw(rt, "column")
			defect = fmt.Sprintf(`UPDATE wide SET %s = $1 WHERE id = $2`, c.name)
			args = []any{rapid.SampledFrom(c.values).Draw(rt, "value"), row("row")}
		case 3: // a column's values swapped between two rows
			c := rapid.SampledFrom(wideColumns).Draw(rt, "column")
			defect = fmt.Sprintf(`UPDATE wide w SET %[1]s = o.%[1]s FROM wide o WHERE (w.id, o.id) IN (($1, $2), ($2, $1))`, c.name)
			args = []any{row("row1"), row("row2")}
		case 4: // two columns swapped within a row
			pairs := [][2]string{{"t", "vc"}, {"i2", "i4"}, {"ts", "d"}, {"f8", "f4"}, {"ai", "ai"}}
			p := rapid.SampledFrom(pairs).Draw(rt, "columns")
			defect = fmt.Sprintf(`UPDATE wide SET %[1]s = %[2]s, %[2]s = %[1]s WHERE id = $1`, p[0], p[1])
			args = []any{row("row")}
		case 5: // a row deleted, or moved out of the chunk
			defect = rapid.SampledFrom([]string{`DELETE FROM wide WHERE id = $1`, `UPDATE wide SET at = '2024-03-02 00:00+00' WHERE id = $1`}).Draw(rt, "how")
			args = []any{row("row")}
		case 6: // a row added to the chunk
			defect = `INSERT INTO wide (id, at) VALUES (100, '2024-03-01 12:00+00')`
		}
		if defect != "" {
			_, err := tx.ExecContext(ctx, defect, args...)
			if err != nil {
				// A swap the types cannot hold (a varchar too long, a
				// date from a timestamp "infinity" is fine; a char(4)
				// from text is not): no such defect.
				rt.Skipf("defect %q %v: %v", defect, args, err)
			}
		}
		scope := backfill.ValidationScope{Chunk: chunk, Info: info, ChunkColumn: "at", Zone: time.UTC,
			Counts: backfill.Counts{Read: int64(n), Inserted: int64(n)}, Staging: st.(backfilldriver.StagingTabler).StagingTable(), Stager: st}
		for _, c := range checks {
			exact, err := c.exact.Validate(ctx, tx, scope)
			require.NoError(rt, err)
			fast, err := c.fast.Validate(ctx, tx, scope)
			require.NoError(rt, err)
			require.Equal(rt, exact.Passed, fast.Passed, "%s after %q %v: exact %s %v, fast %s %s", exact.Check, defect, args, exact.Actual, exact.Sample, fast.Actual, fast.Detail)
			var d struct {
				Method      string `json:"method"`
				Fingerprint struct {
					Error string `json:"error"`
				} `json:"fingerprint"`
			}
			require.NoError(rt, json.Unmarshal(fast.Detail, &d))
			require.Empty(rt, d.Fingerprint.Error)
			if exact.Check == "completeness" {
				// Completeness with CompareContent passes exactly when the
				// rows are equal: only then may the fingerprints be, and
				// without a defect they are. (With a defect that changes a
				// value to an equal one spelled otherwise, the fingerprint
				// of a type hashed by its text differs: a false alarm,
				// which the exact comparison then clears.)
				if !exact.Passed {
					require.Equal(rt, "exact", d.Method, "after %q %v: exact %s %v", defect, args, exact.Actual, exact.Sample)
				}
				if defect == "" {
					require.Equal(rt, "fingerprint", d.Method)
				}
			}
		}
	})
}

// TestFingerprintIsComputedOncePerChunk: the checks of one chunk share
// the fingerprints: a second check reads them from the stager, so it
// sees the rows as they were when the first check ran.
func TestFingerprintIsComputedOncePerChunk(t *testing.T) {
	t.Parallel()
	s := newSales(t)
	rep, vs, err := s.run(t, s.job(backfill.Completeness{}, sabotage(`DELETE FROM sales WHERE id = 3`), backfill.Aggregates{Name: "after"},
		backfill.Completeness{Name: "after_exact", Exact: true, Severity: backfill.SeverityWarn}))
	requireCompleted(t, rep, err)
	fp := func(check string) any { return detailOf(t, vs, check, chunkDay1)["fingerprint"] }
	require.Equal(t, fp("completeness"), fp("after"), "the second check reuses the first one's fingerprints")
	// Computed once: the check after the sabotage still reads the
	// fingerprints from before it, while an exact check sees the deletion.
	// (Checks must not write, see Validator; only tests' sabotage does.)
	require.False(t, evidenceOf(vs, "after_exact")[0].Passed)
}

// TestFingerprintIgnoresSessionSettings: values hashed by their text
// print the same whatever the session's settings, so a defect that only
// the settings would hide (floats rounded by extra_float_digits 0, two
// instants that DateStyle SQL prints alike in a zone whose abbreviation
// repeats, overloaded functions that regproc prints alike) still makes
// the fingerprints differ; and a merge under extra_float_digits 0 still
// sees a change in a composite's float.
func TestFingerprintIgnoresSessionSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	setup := sqlx.MustOpen("postgres", u)
	_, err := setup.Exec(`
		CREATE FUNCTION ff(int) RETURNS int LANGUAGE sql AS 'SELECT 1';
		CREATE FUNCTION ff(text) RETURNS int LANGUAGE sql AS 'SELECT 2';
		CREATE TYPE reading AS (n int, v float8);
		CREATE TABLE m (id bigint PRIMARY KEY, at timestamptz NOT NULL, readings float8[], stamps timestamptz[], fn regprocedure);
		CREATE TABLE c (id bigint PRIMARY KEY, at timestamptz NOT NULL, r reading);
		CREATE INDEX ON m (at);
		DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET extra_float_digits = 0', current_database());
			EXECUTE format('ALTER DATABASE %I SET DateStyle = %L', current_database(), 'SQL, DMY');
			EXECUTE format('ALTER DATABASE %I SET TimeZone = %L', current_database(), 'Europe/Moscow'); END $$`)
	require.NoError(t, err)
	require.NoError(t, setup.Close())
	db := sqlx.MustOpen("postgres", u) // new sessions: the database's settings
	t.Cleanup(func() { _ = db.Close() })

	job := func(validators ...backfill.Validator) backfill.Job {
		day := time.Date(2014, 10, 25, 0, 0, 0, 0, time.UTC)
		return backfill.Job{Name: "m", NewRun: true, Chunker: backfill.Days(day, day.AddDate(0, 0, 1), time.UTC), ChunkColumn: "at",
			Extractor: rowsFunc(
				[]any{int64(1), "2014-10-25T10:00:00Z", "{0.1,0.30000000000000004}", "{2014-10-25 21:30:00+00}", "ff(integer)"},
				[]any{int64(2), "2014-10-25T11:00:00Z", "{1.0000000000000002}", "{2014-10-25 22:30:00+00}", "ff(text)"}),
			Target:     backfill.Target{Table: "m", Key: []string{"id"}, Columns: []string{"id", "at", "readings", "stamps", "fn"}},
			Rollback:   backfill.RollbackNone,
			Validators: validators}
	}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)

	// Clean: proven by fingerprint.
	rep, err := r.Run(ctx, job(backfill.Completeness{CompareContent: true}))
	require.NoError(t, err)
	vs, err := backfill.NewPGManifest("").Validations(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, vs, 1)
	require.Contains(t, string(vs[0].Detail), `"method": "fingerprint"`)

	// Each defect, seeded after the merge, is found: the fingerprints
	// differ and the exact comparison names the row.
	for _, defect := range []string{
		`SET LOCAL extra_float_digits = 0; UPDATE m SET readings = readings::text::float8[] WHERE id = 1`,
		`UPDATE m SET stamps = '{2014-10-25 22:30:00+00}' WHERE id = 1`,
		`UPDATE m SET fn = 'ff(text)'::regprocedure WHERE id = 1`,
	} {
		rep, err := r.Run(ctx, job(sabotageIn("", defect), backfill.Completeness{CompareContent: true, Severity: backfill.SeverityWarn}))
		require.NoError(t, err, defect)
		vs, err := backfill.NewPGManifest("").Validations(ctx, db, rep.BatchID)
		require.NoError(t, err)
		ev := evidenceOf(vs, "completeness")
		require.Len(t, ev, 1, defect)
		require.False(t, ev[0].Passed, "%s: %s", defect, ev[0].Actual)
		require.Equal(t, []string{"differs: (1): " + map[bool]string{true: "readings", false: ""}[strings.Contains(defect, "readings")] +
			map[bool]string{true: "stamps", false: ""}[strings.Contains(defect, "stamps")] + map[bool]string{true: "fn", false: ""}[strings.Contains(defect, "fn =")]}, ev[0].Sample)
	}

	// The merge compares composites as text: a float in one that prints
	// alike under extra_float_digits 0 is still a change. (Composites have
	// no fingerprint: the check runs its exact comparison and says why.)
	composite := job(backfill.Completeness{})
	composite.Name, composite.Target = "c", backfill.Target{Table: "c", Key: []string{"id"}, Columns: []string{"id", "at", "r"}}
	composite.Extractor = rowsFunc([]any{int64(1), "2014-10-25T10:00:00Z", "(1,0.30000000000000004)"})
	rep, err = r.Run(ctx, composite)
	require.NoError(t, err)
	vs, err = backfill.NewPGManifest("").Validations(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Contains(t, string(vs[0].Detail), `no fingerprint for type`)
	_, err = db.Exec(`UPDATE c SET r = '(1,0.3)' WHERE id = 1`)
	require.NoError(t, err)
	rep, err = r.Run(ctx, composite)
	require.NoError(t, err)
	require.Equal(t, int64(1), rep.Counts.Updated)
	var exact bool // compared in SQL: this session prints floats rounded
	require.NoError(t, db.Get(&exact, `SELECT (r).v = '0.30000000000000004'::float8 FROM c WHERE id = 1`))
	require.True(t, exact)
}
