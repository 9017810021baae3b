package backfill_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgconv"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

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
