package backfill_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// exactDDL is the table of TestChecksSeeTheSmallestStep: a key with a
// case-insensitive (nondeterministic) collation, and a column per kind
// of value a lossy comparison would blur: floats (rounded by a cast to
// numeric, lost in a float sum, masked by a NaN in the sum), numeric,
// timestamps, text under a nondeterministic collation, bytea.
const exactDDL = `CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
	CREATE TABLE ex (id int NOT NULL, kci text COLLATE ci NOT NULL, at timestamptz NOT NULL,
		f8 float8, f4 real, num numeric(30,4), ts timestamp, tz timestamptz, txt text, ci text COLLATE ci, by bytea,
		PRIMARY KEY (id, kci));
	CREATE INDEX ON ex (at);
	CREATE TABLE parent (f8 float8, num numeric(30,4), tz timestamptz, by bytea)`

// exactColumns are ex's columns in order.
var exactColumns = []string{"id", "kci", "at", "f8", "f4", "num", "ts", "tz", "txt", "ci", "by"}

// TestChecksSeeTheSmallestStep is the property of every check that
// compares values: after a chunk is staged and merged, changing one
// target value by the smallest step the type can represent (the next
// float, 1 microsecond, one unit of the last numeric digit, one byte of
// text or bytea, the case of a letter under a case-insensitive
// collation), as a defect would (an UPDATE after the merge), fails the
// check at zero tolerance, and the untouched chunk passes. The other
// rows hold the values that hide a step from a lossy comparison: NaN and
// infinities (a float sum is NaN), magnitudes far apart (a float sum
// drops the small one), NULLs, -0.
//
// Each check lists the columns it compares. Not listed: Aggregates does
// not compare the key and Day columns it only groups by (by day);
// ReplayChangesNothing sees what the merge would write, and the merge
// matches keys by the target's unique index, under which 'a' and 'A' of a
// case-insensitive collation are one key (it compares other columns byte
// for byte);
// ReferentialIntegrity matches parents by equality, as a foreign key
// does.
func TestChecksSeeTheSmallestStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(exactDDL)
	require.NoError(t, err)
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, backfill.Target{Table: "ex", Key: []string{"id", "kci"}, Columns: exactColumns})
	require.NoError(t, err)
	day := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	chunk := backfill.Chunk{ID: "time:2024-03-01T00:00:00Z/2024-03-02T00:00:00Z", Kind: backfilltype.KindTime, Start: day, End: day.AddDate(0, 0, 1)}

	content := []string{"f8", "f4", "num", "ts", "tz", "txt", "ci", "by"}
	measures := []backfill.Measure{{Column: "f8"}, {Column: "f4"}, {Column: "num"}}
	dims := []string{"txt", "ci", "ts", "tz", "by"}
	checks := []struct {
		check   backfill.Validator
		compare []string // the columns whose smallest step it must see
	}{
		{backfill.Completeness{CompareContent: true}, append([]string{"kci"}, content...)},
		{backfill.Completeness{Name: "completeness_exact", CompareContent: true, Exact: true}, append([]string{"kci"}, content...)},
		{backfill.Sample{N: 1000}, append([]string{"kci"}, content...)},
		{backfill.Aggregates{Day: "at", Dimensions: dims, Measures: measures}, []string{"kci", "f8", "f4", "num", "ts", "tz", "txt", "ci", "by"}},
		{backfill.Aggregates{Name: "aggregates_exact", Day: "at", Dimensions: dims, Measures: measures, Exact: true}, []string{"kci", "f8", "f4", "num", "ts", "tz", "txt", "ci", "by"}},
		{backfill.Aggregates{Name: "aggregates_measures", Measures: measures, Exact: true}, []string{"kci", "f8", "f4", "num"}},
		{backfill.ReplayChangesNothing{}, []string{"f8", "f4", "num", "ts", "tz", "txt", "ci", "by"}},
		{backfill.ReplayChangesNothing{Name: "replay_exact", Exact: true}, []string{"f8", "f4", "num", "ts", "tz", "txt", "ci", "by"}},
		{backfill.ReferentialIntegrity{Columns: []string{"f8", "num", "tz", "by"}, ParentTable: "parent"}, []string{"f8", "num", "tz", "by"}},
	}

	specialF8 := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 1e300, -1e300, 5e-324, math.MaxFloat64, 0.1, 1}
	specialF4 := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0, 1e38, 1e-45, 0.1}
	letters := rapid.StringOfN(rapid.RuneFrom([]rune("abcxyz")), 1, 4, -1)
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 5).Draw(rt, "rows")
		rows := make([][]any, n)
		for i := range rows {
			// Row 0 is the one a defect changes: finite, not NULL.
			special := i > 0 && rapid.Bool().Draw(rt, "special")
			f8 := any(rapid.Float64Range(-1e300, 1e300).Draw(rt, "f8"))
			f4 := any(rapid.Float32Range(-1e30, 1e30).Draw(rt, "f4"))
			num := any(fmt.Sprintf("%d.%04d", rapid.Int64Range(-1e12, 1e12).Draw(rt, "int"), rapid.IntRange(0, 9999).Draw(rt, "frac")))
			var ts, tz any = time.Unix(rapid.Int64Range(-1e10, 1e10).Draw(rt, "ts"), int64(rapid.IntRange(0, 999999).Draw(rt, "us"))*1000).UTC(),
				time.Unix(rapid.Int64Range(-1e10, 1e10).Draw(rt, "tz"), int64(rapid.IntRange(0, 999999).Draw(rt, "us"))*1000)
			var txt, ci, by any = letters.Draw(rt, "txt"), letters.Draw(rt, "ci"), []byte(letters.Draw(rt, "by"))
			if special {
				f8, f4 = rapid.SampledFrom(specialF8).Draw(rt, "f8"), rapid.SampledFrom(specialF4).Draw(rt, "f4")
				num = rapid.SampledFrom([]any{"NaN", nil, "0.0000"}).Draw(rt, "num")
				ts = rapid.SampledFrom([]any{nil, "infinity", "-infinity"}).Draw(rt, "ts")
				tz = rapid.SampledFrom([]any{nil, "infinity", "-infinity"}).Draw(rt, "tz")
				txt, ci, by = nil, nil, nil
			}
			at := day.Add(time.Duration(rapid.IntRange(0, 86399).Draw(rt, "at")) * time.Second)
			rows[i] = []any{i + 1, letters.Draw(rt, "kci"), at, f8, f4, num, ts, tz, txt, ci, by}
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
		_, err = tx.ExecContext(ctx, `INSERT INTO parent SELECT f8, num, tz, by FROM ex`)
		require.NoError(rt, err)

		// The defect: row 0's value of one column, one step away.
		col := rapid.SampledFrom(append([]string{"", "kci"}, content...)).Draw(rt, "perturbed")
		var set string
		var arg any
		switch col {
		case "f8":
			v := rows[0][3].(float64)
			set, arg = "f8 = $1", math.Nextafter(v, math.Inf(int(rapid.SampledFrom([]int{1, -1}).Draw(rt, "dir"))))
		case "f4":
			v := rows[0][4].(float32)
			set, arg = "f4 = $1", float64(math.Nextafter32(v, float32(math.Inf(int(rapid.SampledFrom([]int{1, -1}).Draw(rt, "dir"))))))
		case "num":
			set = "num = num + 0.0001"
		case "ts", "tz":
			set = col + " = " + col + " + interval '1 microsecond'"
		case "txt":
			set = "txt = txt || 'a'"
		case "ci", "kci":
			set = col + " = upper(left(" + col + ", 1)) || substr(" + col + ", 2)"
		case "by":
			set = "by = set_byte(by, 0, get_byte(by, 0) # 1)"
		}
		if set != "" {
			args := []any{}
			if arg != nil {
				args = append(args, arg)
			}
			res, err := tx.ExecContext(ctx, "UPDATE ex SET "+set+fmt.Sprintf(" WHERE id = 1 AND kci = %s", "'"+rows[0][1].(string)+"'"), args...)
			require.NoError(rt, err)
			k, _ := res.RowsAffected()
			require.Equal(rt, int64(1), k)
		}
		scope := backfill.ValidationScope{Chunk: chunk, Info: info, ChunkColumn: "at", Zone: time.UTC,
			Counts: backfill.Counts{Read: int64(n), Inserted: int64(n)}, Staging: st.(backfilldriver.StagingTabler).StagingTable(), Stager: st}
		for _, c := range checks {
			res, err := c.check.Validate(ctx, tx, scope)
			require.NoError(rt, err)
			want := !slices.Contains(c.compare, col)
			require.Equal(rt, want, res.Passed, "%s after a step in %q: %s %s %s", res.Check, col, res.Actual, strings.Join(res.Sample, "; "), res.Detail)
		}
	})
}

// TestAggregatesFloatSums: the cases a float sum hides, each of which
// Aggregates passed before its sums were exact: a step lost in rounding
// float8::numeric to 15 digits, in a real sum, next to a large value, and
// behind a NaN or an infinity in another row. Each perturbation fails
// the check at zero tolerance, and the unperturbed rows pass whatever
// order PostgreSQL adds them in.
func TestAggregatesFloatSums(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE fl (id int PRIMARY KEY, f8 float8, f4 real, num numeric)`)
	require.NoError(t, err)
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, backfill.Target{Table: "fl", Key: []string{"id"}})
	require.NoError(t, err)
	check := backfill.Aggregates{Measures: []backfill.Measure{{Column: "f8"}, {Column: "f4"}, {Column: "num"}}, Exact: true}
	cases := []struct {
		name string
		rows [][]any
		set  string
		arg  any
	}{
		{"float8 rounded to 15 digits", [][]any{{1, 0.1, nil, nil}}, "f8 = $1", math.Nextafter(0.1, 1)},
		{"real sum", [][]any{{1, nil, float32(1), nil}}, "f4 = $1", float64(math.Nextafter32(1, 2))},
		{"float8 next to a large value", [][]any{{1, 1.0, nil, nil}, {2, 1e300, nil, nil}}, "f8 = $1", math.Nextafter(1, 2)},
		{"float8 behind a NaN", [][]any{{1, 1.0, nil, nil}, {2, math.NaN(), nil, nil}}, "f8 = $1", math.Nextafter(1, 2)},
		{"float8 behind infinities", [][]any{{1, 1.0, nil, nil}, {2, math.Inf(1), nil, nil}, {3, math.Inf(-1), nil, nil}}, "f8 = $1", math.Nextafter(1, 2)},
		{"real behind a NaN", [][]any{{1, nil, float32(1), nil}, {2, nil, float32(math.NaN()), nil}}, "f4 = $1", float64(math.Nextafter32(1, 2))},
		{"numeric behind a NaN", [][]any{{1, nil, nil, "1.0001"}, {2, nil, nil, "NaN"}}, "num = $1", "1.0002"},
		{"the smallest float8 next to -0", [][]any{{1, math.Copysign(0, -1), nil, nil}}, "f8 = $1", math.SmallestNonzeroFloat64},
	}
	for _, c := range cases {
		for _, perturb := range []bool{false, true} {
			tx, err := db.Beginx()
			require.NoError(t, err)
			st, err := m.Stage(ctx, tx, info)
			require.NoError(t, err)
			for i, r := range c.rows {
				require.NoError(t, st.Add(ctx, int64(i+1), r))
			}
			_, err = st.Merge(ctx)
			require.NoError(t, err)
			if perturb {
				_, err = tx.ExecContext(ctx, "UPDATE fl SET "+c.set+" WHERE id = 1", c.arg)
				require.NoError(t, err)
			}
			// A session that prints floats rounded must not change the
			// verdict.
			_, err = tx.ExecContext(ctx, `SET LOCAL extra_float_digits = -15`)
			require.NoError(t, err)
			res, err := check.Validate(ctx, tx, backfill.ValidationScope{Chunk: backfill.Chunk{ID: "list:one", Kind: backfilltype.KindList, Item: "one"},
				Info: info, Staging: st.(backfilldriver.StagingTabler).StagingTable(), Stager: st})
			require.NoError(t, err)
			require.Equal(t, !perturb, res.Passed, "%s, perturbed %t: %s %v", c.name, perturb, res.Actual, res.Sample)
			require.NoError(t, st.Close())
			require.NoError(t, tx.Rollback())
		}
	}
}

// TestDuplicateKeysSeesTheSmallestStep: DuplicateKeys groups candidate
// keys by equality, never by a rounded form: two rows whose key differs
// by the smallest step of its type (the next float, 1 microsecond, one
// unit of the last numeric digit, one byte of text or bytea) are not
// duplicates, two equal ones are. (Under a nondeterministic collation,
// values it equates are duplicates, as in a unique index; not tested.)
func TestDuplicateKeysSeesTheSmallestStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE dk (id int PRIMARY KEY, at timestamptz NOT NULL,
		f8 float8, f4 real, num numeric(30,4), ts timestamp, tz timestamptz, txt text, by bytea)`)
	require.NoError(t, err)
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, backfill.Target{Table: "dk", Key: []string{"id"}})
	require.NoError(t, err)
	day := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	chunk := backfill.Chunk{ID: "time:2024-03-01T00:00:00Z/2024-03-02T00:00:00Z", Kind: backfilltype.KindTime, Start: day, End: day.AddDate(0, 0, 1)}
	letters := rapid.StringOfN(rapid.RuneFrom([]rune("abcxyz")), 1, 4, -1)
	rapid.Check(t, func(rt *rapid.T) {
		us := time.Duration(rapid.IntRange(0, 999999).Draw(rt, "us")) * time.Microsecond
		base := map[string]any{
			"f8":  rapid.Float64Range(-1e300, 1e300).Draw(rt, "f8"),
			"f4":  rapid.Float32Range(-1e30, 1e30).Draw(rt, "f4"),
			"num": fmt.Sprintf("%d.%04d", rapid.Int64Range(-1e12, 1e12).Draw(rt, "int"), rapid.IntRange(0, 9999).Draw(rt, "frac")),
			"ts":  time.Unix(rapid.Int64Range(-1e10, 1e10).Draw(rt, "ts"), 0).UTC().Add(us),
			"tz":  time.Unix(rapid.Int64Range(-1e10, 1e10).Draw(rt, "tz"), 0).Add(us),
			"txt": letters.Draw(rt, "txt"),
			"by":  []byte(letters.Draw(rt, "by")),
		}
		col := rapid.SampledFrom([]string{"f8", "f4", "num", "ts", "tz", "txt", "by"}).Draw(rt, "column")
		step := rapid.Bool().Draw(rt, "step")
		other := base[col]
		if step {
			switch v := other.(type) {
			case float64:
				other = math.Nextafter(v, math.Inf(1))
			case float32:
				other = math.Nextafter32(v, float32(math.Inf(1)))
			case string: // numeric, or text
				if col == "num" {
					// One unit of the last of the 4 scale digits, up or down.
					last := v[len(v)-1]
					if last == '9' {
						last -= 2
					}
					other = v[:len(v)-1] + string(last+1)
				} else {
					other = v + "a"
				}
			case time.Time:
				other = v.Add(time.Microsecond)
			case []byte:
				other = append([]byte{v[0] ^ 1}, v[1:]...)
			}
		}
		tx, err := db.Beginx()
		require.NoError(rt, err)
		defer func() { _ = tx.Rollback() }()
		st, err := m.Stage(ctx, tx, info)
		require.NoError(rt, err)
		defer func() { _ = st.Close() }()
		for i, v := range []any{base[col], other} {
			row := []any{i + 1, day.Add(time.Duration(i) * time.Hour), nil, nil, nil, nil, nil, nil, nil}
			row[slices.Index([]string{"id", "at", "f8", "f4", "num", "ts", "tz", "txt", "by"}, col)] = v
			require.NoError(rt, st.Add(ctx, int64(i+1), row))
		}
		_, err = st.Merge(ctx)
		require.NoError(rt, err)
		scope := backfill.ValidationScope{Chunk: chunk, Info: info, ChunkColumn: "at", Zone: time.UTC,
			Counts: backfill.Counts{Read: 2, Inserted: 2}, Staging: st.(backfilldriver.StagingTabler).StagingTable(), Stager: st}
		for _, check := range []backfill.Validator{backfill.DuplicateKeys{Columns: []string{col}},
			backfill.DuplicateKeys{Columns: []string{col}, AcrossTarget: true}} {
			res, err := check.Validate(ctx, tx, scope)
			require.NoError(rt, err)
			require.Equal(rt, step, res.Passed, "%s %v and %v: %s %v", col, base[col], other, res.Actual, res.Sample)
		}
	})
}
