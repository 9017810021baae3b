package backfill

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// fingerprintTypes are column types with values that their own hash
// functions, or a careless chain of them, would not tell apart: numeric 1
// and -1 (hash_numeric ignores the sign), NaN and the infinities, jsonb
// '{}' and '[]', empty arrays and arrays of NULLs (hash_array ignores the
// seed for them), bigints and times whose 32-bit halves fold alike (0 and
// 4294967297 µs), float zero (whose hash is the seed), NULL next to each
// type's stand-in value, and equal values spelled otherwise (1.0 and 1.00,
// -0 and 0, 'ab' and 'ab  ' in char(4), '1 day' and '24 hours').
var fingerprintTypes = []struct {
	sqlType, base string
	values        []string // "" is NULL
}{
	{"smallint", "int2", []string{"", "0", "1", "-1"}},
	{"int", "int4", []string{"", "0", "1", "-1", "2147483647"}},
	{"bigint", "int8", []string{"", "0", "1", "-1", "4294967297", "-4294967296", "4294967296"}},
	{"numeric", "numeric", []string{"", "0", "1", "-1", "1.0", "1.00", "NaN", "Infinity", "-Infinity", "0.5", "-0.5"}},
	{"float8", "float8", []string{"", "0", "-0", "1.5", "-1.5", "NaN", "Infinity", "-Infinity"}},
	{"real", "float4", []string{"", "0", "-0", "2.5", "NaN"}},
	{"text", "text", []string{"", "''", "a", "A", "a b"}},
	{"varchar(5)", "varchar", []string{"", "''", "a", "b"}},
	{"char(4)", "bpchar", []string{"", "''", "ab", "ab  ", "abc"}},
	{"timestamp", "timestamp", []string{"", "epoch", "2024-03-01 00:00", "2024-03-01 01:00", "infinity", "-infinity"}},
	{"timestamptz", "timestamptz", []string{"", "epoch", "2024-03-01 00:00+00", "2024-03-01 01:00+01", "2024-03-01 00:00+01", "infinity"}},
	{"date", "date", []string{"", "2024-03-01", "2024-03-02", "infinity", "-infinity"}},
	{"time", "time", []string{"", "00:00", "12:00", "01:11:34.967297"}},
	{"bool", "bool", []string{"", "true", "false"}},
	{"uuid", "uuid", []string{"", "00000000-0000-0000-0000-000000000000", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"}},
	{"jsonb", "jsonb", []string{"", `{"a":1}`, `{"a": 1}`, `{"a":2}`, "null", "{}", "[]", "[null]", "0", `""`}},
	{"json", "json", []string{"", `{"a":1}`, `{"a": 1}`, "{}", "[]"}},
	{"interval", "interval", []string{"", "1 day", "24 hours", "0", "-1 day", "4294967297 microseconds"}},
	{"inet", "inet", []string{"", "10.0.0.1", "10.0.0.1/32", "10.0.0.0/8", "0.0.0.0", "::"}},
	{"int[]", "_int4", []string{"", "{}", "{1,2}", "{2,1}", "{NULL}", "{NULL,NULL}"}},
	{"text[]", "_text", []string{"", "{}", "{a}", "{a,b}", `{""}`, "{NULL}"}},
	{"point", "point", []string{"", "(1,2)", "(2,1)"}},
	// A nondeterministic collation that ignores punctuation: array syntax
	// must not be read through it.
	{`text[] COLLATE ign`, "_text", []string{"", "{}", "{a,b}", `{"a,b"}`, "{NULL}", `{"NULL"}`, "{ab}"}},
	{`text COLLATE ign`, "text", []string{"", "a,b", "ab", "a", "A"}},
}

// TestFingerprintHashTellsValuesApart: for every pair of values of every
// type, a row hash that is equal means the values are equal as the merge
// compares them (IS NOT DISTINCT FROM, or their text for types without
// equality): the fingerprint never proves a difference away. For the types
// hashed by their own hash function, equal values also hash equal: no
// false alarm. Then the same over two-column rows, where a value moved to
// the other column, or a NULL moved next to a zero, must change the hash.
func TestFingerprintHashTellsValuesApart(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.MustExec(`CREATE COLLATION ign (provider = icu, locale = 'und-u-ka-shifted', deterministic = false)`)
	literal := func(v, typ string) string {
		if v == "" {
			return "NULL::" + typ
		}
		if v == "''" {
			return "''::" + typ
		}
		return pq.QuoteLiteral(v) + "::" + typ
	}
	// Equal as the merge compares: byte for byte.
	distinct := func(base, a, b string) string {
		c := Column{BaseType: base}
		return pgstore.ExactCompare(c, a) + " IS DISTINCT FROM " + pgstore.ExactCompare(c, b)
	}
	type verdict struct {
		A        int  `db:"a"`
		B        int  `db:"b"`
		SameHash bool `db:"same_hash"`
		Equal    bool `db:"equal"`
	}
	check := func(cols []Column, rows [][]string, sqlTypes []string) {
		t.Helper()
		info := TableInfo{Columns: cols}
		names := make([]string, len(cols))
		for i, c := range cols {
			names[i] = c.Name
		}
		var values []string
		for i, r := range rows {
			parts := []string{fmt.Sprint(i)}
			for j, v := range r {
				parts = append(parts, literal(v, sqlTypes[j]))
			}
			values = append(values, "("+strings.Join(parts, ", ")+")")
		}
		var eq []string
		for _, c := range cols {
			eq = append(eq, "NOT ("+distinct(c.BaseType, "a."+c.Name, "b."+c.Name)+")")
		}
		q := fmt.Sprintf(`WITH v(i, %[1]s) AS (VALUES %[2]s)
			SELECT a.i AS a, b.i AS b, (%[3]s) = (%[4]s) AS same_hash, %[5]s AS equal
			FROM v a, v b WHERE a.i < b.i`,
			strings.Join(names, ", "), strings.Join(values, ", "), pgstore.RowHashSQL(info, names, "a"), pgstore.RowHashSQL(info, names, "b"),
			strings.Join(eq, " AND "))
		var got []verdict
		require.NoError(t, db.Select(&got, q))
		require.Len(t, got, len(rows)*(len(rows)-1)/2)
		strong := true
		for _, c := range cols {
			_, ok := pgstore.HashFuncs[c.BaseType]
			strong = strong && ok && !pgstore.TextCompared[c.BaseType] && !pgstore.LooseEquality[c.BaseType]
		}
		for _, g := range got {
			a, b := g.A, g.B
			if g.SameHash && !g.Equal {
				t.Errorf("%v: %q and %q differ but hash alike", sqlTypes, rows[a], rows[b])
			}
			if strong && g.Equal && !g.SameHash {
				t.Errorf("%v: %q and %q are equal but hash differently", sqlTypes, rows[a], rows[b])
			}
		}
	}
	for _, ft := range fingerprintTypes {
		var rows [][]string
		for _, v := range ft.values {
			rows = append(rows, []string{v})
		}
		check([]Column{{Name: "x", BaseType: ft.base}}, rows, []string{ft.sqlType})
	}
	// Two columns: every combination of two types' values, for the pairs
	// whose hashes could cancel or shift: same hash family side by side.
	byType := map[string]int{}
	for i, ft := range fingerprintTypes {
		byType[ft.sqlType] = i
	}
	for _, pair := range [][2]string{{"float8", "real"}, {"real", "float8"}, {"smallint", "int"}, {"int", "bigint"}, {"text", "varchar(5)"},
		{"numeric", "numeric"}, {"int[]", "int[]"}, {"jsonb", "jsonb"}, {"float8", "float8"}, {"timestamp", "timestamptz"}} {
		x, y := fingerprintTypes[byType[pair[0]]], fingerprintTypes[byType[pair[1]]]
		var rows [][]string
		for _, a := range x.values {
			for _, b := range y.values {
				rows = append(rows, []string{a, b})
			}
		}
		check([]Column{{Name: "x", BaseType: x.base}, {Name: "y", BaseType: y.base}}, rows, []string{x.sqlType, y.sqlType})
	}
}

// TestPositionKeysDiffer: the per-position constants of the row hash
// are distinct, for values and for NULLs, over any realistic width.
func TestPositionKeysDiffer(t *testing.T) {
	t.Parallel()
	seen := map[int64]int{}
	for i := range 2000 {
		for _, k := range []int{i, i + 1<<20} {
			v := pgstore.PositionKey(k)
			if j, dup := seen[v]; dup {
				t.Fatalf("positionKey(%d) = positionKey(%d)", k, j)
			}
			seen[v] = k
		}
	}
}

// TestFingerprintHashKinds: which columns, as PGMerger.Prepare reads them
// from the catalogs, get a fingerprint and how: by their type's hash
// function, by their text, or none (their checks run exact).
func TestFingerprintHashKinds(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.MustExec(`
		CREATE SCHEMA u;
		CREATE TYPE u.inet AS ENUM ('a', 'b');
		CREATE TYPE mood AS ENUM ('sad', 'ok');
		CREATE TYPE reading AS (n int, v float8);
		CREATE TYPE floatrange AS RANGE (subtype = float8);
		CREATE DOMAIN posint AS int CHECK (VALUE > 0);
		CREATE DOMAIN tags AS text[];
		CREATE TABLE k (id bigint PRIMARY KEY, i posint, n numeric, ts timestamptz, ip inet, uip u.inet, m mood, ms mood[],
			q tsquery, rp regproc, rps regproc[], r int4range, fr floatrange, c reading, cs reading[], tg tags, j json, js jsonb[])`)
	info, err := pgstore.NewMerger().Prepare(context.Background(), db, Target{Table: "k", Key: []string{"id"},
		Columns: []string{"id", "i", "n", "ts", "ip", "uip", "m", "ms", "q", "rp", "rps", "r", "fr", "c", "cs", "tg", "j", "js"}})
	require.NoError(t, err)
	got := map[string]string{}
	for _, c := range info.Columns {
		got[c.Name] = pgstore.HashKind(c)
	}
	require.Equal(t, map[string]string{
		"id": "func", "i": "func", "n": "text", "ts": "func", "ip": "func", "uip": "text", "m": "text", "ms": "text",
		"q": "", "rp": "func", "rps": "", "r": "text", "fr": "", "c": "", "cs": "", "tg": "text", "j": "text", "js": "text",
	}, got)
}

// goldenScope is the validation scope of a golden case's chunk: a time
// chunk on the version column, staged in the merge's staging table.
func goldenScope(t testing.TB, g goldenTarget, chunkColumn string) ValidationScope {
	t.Helper()
	info := goldenInfo(t, g)
	start := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	return ValidationScope{BatchID: 7, Info: info, Staging: pgstore.BuildMergeSQL(info).Stage, ChunkColumn: chunkColumn, Zone: time.UTC,
		Chunk: Chunk{ID: "2024-03-01", Seq: 3, Kind: backfilltype.KindTime, Start: start, End: start.AddDate(0, 0, 1)}}
}

// withArgs renders a statement followed by its bind parameters.
func withArgs(q string, a pgstore.SQLArgs) string {
	if len(a) == 0 {
		return q
	}
	return fmt.Sprintf("-- args: %v\n%s", []any(a), q)
}

// validateStatements builds every validator statement for scope.
func validateStatements(t *testing.T, scope ValidationScope) [][2]string {
	c, err := pgstore.NewPGCheck("golden", SeverityError, scope)
	require.NoError(t, err)
	var out [][2]string
	add := func(name, q string) { out = append(out, [2]string{name, q}) }

	var a pgstore.SQLArgs
	chunkRows, _, err := c.ChunkRows("c", &a)
	require.NoError(t, err)
	add("duplicate_keys", withArgs(c.DuplicateKeysSQL(scope.Info.Identity(), chunkRows, false), a))
	add("duplicate_keys across target", withArgs(c.DuplicateKeysSQL([]string{"name"}, chunkRows, true), a))

	add("completeness: missing from target", c.MissingFromTargetSQL())
	if wins := c.SourceWins("s", "t"); wins != "false" {
		add("completeness: differing content", c.DifferingContentSQL(wins))
	}
	a = nil
	bounds, err := c.InChunk("t", &a)
	require.NoError(t, err)
	add("completeness: missing from staging", withArgs(c.MissingFromStagingSQL(bounds), a))

	add("referential_integrity", c.OrphansSQL([]string{"name", "k"}, "sales.customers", []string{"name", "code"}))

	a = nil
	v := Aggregates{Day: "version", Dimensions: []string{"name", `Odd "col"`}, Measures: []Measure{{Column: "amount", Tolerance: 0.5}, {Column: "id"}}}
	day, _, err := c.AggregatesDay(v.Day, &a)
	require.NoError(t, err)
	add("aggregates", withArgs(c.AggregatesSQL(day, v.Dimensions, v.Measures, &a), a))
	a = nil
	add("aggregates: zero value", withArgs(c.AggregatesSQL(nil, nil, nil, &a), a))
	a = nil
	keyDims := append(scope.Info.Identity(), `Odd "col"`)
	add("aggregates: key dimensions", withArgs(c.AggregatesSQL(nil, keyDims, []Measure{{Column: "amount"}}, &a), a))

	a = nil
	add("sample", withArgs(c.SampleSQL(DefaultSampleSize, 42, c.SourceWins("s", "t"), &a), a))

	cols := c.FingerprintColumns()
	add("fingerprint: staged rows", c.FingerprintStagingSQL(cols))
	a = nil
	bounds, err = c.InChunk("t", &a)
	require.NoError(t, err)
	add("fingerprint: chunk's target rows", withArgs(c.FingerprintTargetSQL(cols, bounds), a))
	add("fingerprint: target rows of staged identities", c.FingerprintTargetSQL(cols, ""))
	return out
}

// TestValidateSQLGolden pins the SQL of every validator statement per
// mode and policy: testdata/validate_*.golden.sql.
func TestValidateSQLGolden(t *testing.T) {
	for _, g := range goldenTargets() {
		t.Run(g.name, func(t *testing.T) {
			checkGolden(t, "validate_"+g.name, goldenStatements(validateStatements(t, goldenScope(t, g, "version"))))
		})
	}
}
