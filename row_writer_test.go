package backfill_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// specialColumns are the columns of TestSpecialValuesRoundTrip's target:
// one per base type the row writer converts, constrained variants
// included.
var specialColumns = []struct{ name, typ string }{
	{"c_int2", "smallint"}, {"c_int4", "integer"}, {"c_int8", "bigint"},
	{"c_float4", "real"}, {"c_float8", "double precision"},
	{"c_num", "numeric"}, {"c_num52", "numeric(5,2)"}, {"c_num3m1", "numeric(3,-1)"},
	{"c_bool", "boolean"}, {"c_text", "text"}, {"c_vc", "varchar(5)"}, {"c_bp", "char(3)"},
	{"c_date", "date"}, {"c_ts", "timestamp"}, {"c_tstz", "timestamptz"},
	{"c_time", "time"}, {"c_timetz", "timetz"},
	{"c_uuid", "uuid"}, {"c_bytea", "bytea"}, {"c_interval", "interval"}, {"c_jsonb", "jsonb"},
}

// probe is one value written into one column, and the text PostgreSQL
// reads for it (the text itself for text values; for Go values, a text
// form of the Go value that the test renders on its own).
type probe struct {
	col    int
	in     any
	oracle string
}

// TestSpecialValuesRoundTrip is a property: for
// every base type the row writer converts, values written as Go values
// and as text, edge values included (non-finite numbers and times, every
// year a time type holds and the years just outside, BC years, years
// beyond 9999, integer and numeric limits, long text, interval limits),
// a value PostgreSQL accepts for the column (an INSERT into a column of
// the same type, assignment as COPY does it) is accepted by Write and
// reads back, after a real chunk load, exactly as PostgreSQL reads it; a
// value PostgreSQL refuses is queued with its column, and when the
// column's range or length is what refuses it, with a reason naming the
// column and its limit.
func TestSpecialValuesRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	var defs []string
	for _, c := range specialColumns {
		defs = append(defs, c.name+" "+c.typ)
	}
	_, err := db.Exec(`SET TimeZone = 'UTC';
		CREATE TABLE special (id bigint PRIMARY KEY, ` + strings.Join(defs, ", ") + `);
		CREATE TABLE oracle (` + strings.Join(defs, ", ") + `)`)
	require.NoError(t, err)
	names := []string{"id"}
	for _, c := range specialColumns {
		names = append(names, c.name)
	}
	r, err := backfill.New(db, &backfill.Config{MaxStagingRejects: 100})
	require.NoError(t, err)
	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		probes := rapid.SliceOfN(probeGen(), 1, 12).Draw(rt, "probes")
		// What PostgreSQL makes of each value, assigned to a column of the
		// column's type.
		type verdict struct {
			text string
			err  *pq.Error
		}
		verdicts := make([]verdict, len(probes))
		for i, p := range probes {
			c := specialColumns[p.col]
			var out sql.NullString
			param := "$1"
			if c.name == "c_bytea" {
				param = "decode($1, 'hex')" // lib/pq sends a string as the bytes of a bytea parameter
			}
			err := db.Get(&out, `INSERT INTO oracle (`+c.name+`) VALUES (`+param+`) RETURNING `+c.name+`::text`, p.oracle)
			if err != nil {
				var pe *pq.Error
				require.True(rt, errors.As(err, &pe), "%v", err)
				verdicts[i].err = pe
				continue
			}
			verdicts[i].text = out.String
		}
		_, err := db.Exec(`TRUNCATE special, oracle`)
		require.NoError(rt, err)
		rep, err := r.Run(ctx, backfill.Job{
			Name: fmt.Sprintf("special-%d", iteration), Chunker: backfill.List("all"), Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
			Target: backfill.Target{Table: "special", Key: []string{"id"}, Columns: names},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				row := make([]any, len(names))
				row[0] = int64(0)
				if err := w.Write(ctx, row...); err != nil { // a row that loads
					return err
				}
				for i, p := range probes {
					clear(row)
					row[0], row[p.col+1] = int64(i+1), p.in
					if err := w.Write(ctx, row...); err != nil {
						return err
					}
				}
				return nil
			}),
		})
		require.NoError(rt, err)
		require.Equal(rt, backfill.RunCompleted, rep.Status)
		ex, err := backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
		require.NoError(rt, err)
		queued := map[int64]backfill.Exception{}
		for _, e := range ex {
			queued[e.Row-1] = e // row 1 is the NULL row
		}
		for i, p := range probes {
			c := specialColumns[p.col]
			id := int64(i + 1)
			e, isQueued := queued[id]
			if v := verdicts[i]; v.err != nil {
				require.True(rt, isQueued, "%s: PostgreSQL refuses %#v (as %q: %v) but Write accepted it", c.typ, p.in, p.oracle, v.err)
				require.Equal(rt, c.name, e.Column, "%s %#v", c.typ, p.in)
				switch v.err.Code {
				case "22003", "22008", "22015", "22001":
					// Out of range or too long: the reason names the limit.
					require.Contains(rt, e.Reason, `column "`+c.name+`"`, "%s %#v (%v)", c.typ, p.in, v.err)
					require.Contains(rt, e.Reason, "holds", "%s %#v (%v)", c.typ, p.in, v.err)
				}
				continue
			}
			require.False(rt, isQueued, "%s: PostgreSQL accepts %#v (as %q = %s) but Write queued it: %s", c.typ, p.in, p.oracle, verdicts[i].text, e.Reason)
			var got sql.NullString
			require.NoError(rt, db.Get(&got, `SELECT `+c.name+`::text FROM special WHERE id = $1`, id))
			require.Equal(rt, verdicts[i].text, got.String, "%s %#v (as %q)", c.typ, p.in, p.oracle)
		}
	})
}

// probeGen draws a column and a value for it.
func probeGen() *rapid.Generator[probe] {
	return rapid.Custom(func(t *rapid.T) probe {
		col := rapid.IntRange(0, len(specialColumns)-1).Draw(t, "col")
		in, oracle := valueGen(t, specialColumns[col].name)
		return probe{col: col, in: in, oracle: oracle}
	})
}

// ws draws whitespace PostgreSQL's input functions skip.
func ws(t *rapid.T, label string) string {
	return rapid.SampledFrom([]string{"", "", "", " ", "\t", " \n"}).Draw(t, label)
}

// mixCase draws an upper/lower-case variant of s.
func mixCase(t *rapid.T, s string) string {
	b := []byte(s)
	for i := range b {
		if rapid.Bool().Draw(t, "upper") {
			b[i] = strings.ToUpper(string(b[i]))[0]
		}
	}
	return string(b)
}

func floatText(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// valueGen draws a value for column name: a Go value or text, and the
// text PostgreSQL reads for it.
func valueGen(t *rapid.T, name string) (any, string) {
	switch name {
	case "c_int2", "c_int4", "c_int8":
		bits := map[string]int{"c_int2": 16, "c_int4": 32, "c_int8": 64}[name]
		hi := int64(1)<<(bits-1) - 1
		lo := -hi - 1
		edges := []int64{lo, lo + 1, -1, 0, 1, hi - 1, hi}
		if bits < 64 {
			edges = append(edges, lo-1, hi+1)
		}
		n := rapid.OneOf(rapid.SampledFrom(edges), rapid.Int64()).Draw(t, "n")
		switch rapid.IntRange(0, 4).Draw(t, "form") {
		case 0:
			return n, strconv.FormatInt(n, 10)
		case 1:
			u := uint64(math.MaxInt64) + rapid.Uint64Range(0, 10).Draw(t, "over")
			return u, strconv.FormatUint(u, 10)
		case 2:
			f := float64(n)
			if rapid.Bool().Draw(t, "fraction") {
				f += 0.5
			}
			if f == math.Trunc(f) {
				// The float's exact integer: above 2^53 the shortest
				// text ("18014398511491750") is not the value
				// (18014398511491752).
				return f, new(big.Float).SetFloat64(f).Text('f', 0)
			}
			return f, strconv.FormatFloat(f, 'f', -1, 64) // PostgreSQL refuses a fraction; so must Write
		case 3:
			s := strconv.FormatInt(n, 10)
			if n >= 0 && rapid.Bool().Draw(t, "plus") {
				s = "+" + s
			}
			s = ws(t, "before") + s + ws(t, "after")
			return s, s
		}
		s := rapid.SampledFrom([]string{"99999999999999999999", "-99999999999999999999", "1.0", "1e3", "", " ", "+", "0x10", "12 3"}).Draw(t, "bad")
		return s, s
	case "c_float4", "c_float8":
		switch rapid.IntRange(0, 3).Draw(t, "form") {
		case 0:
			f := rapid.OneOf(rapid.SampledFrom([]float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1),
				math.MaxFloat64, math.SmallestNonzeroFloat64, math.MaxFloat32, math.SmallestNonzeroFloat32, 1e-46, 3.5e38, 0.1}),
				rapid.Float64()).Draw(t, "f")
			return f, floatText(f)
		case 1:
			f := rapid.Float32().Draw(t, "f32")
			return f, floatText(float64(f))
		case 2:
			s := mixCase(t, rapid.SampledFrom([]string{"nan", "infinity", "-infinity", "+infinity", "inf", "+inf", "-inf"}).Draw(t, "special"))
			s = ws(t, "before") + s + ws(t, "after")
			return s, s
		}
		s := fmt.Sprintf("%s%d.%de%d", rapid.SampledFrom([]string{"", "-", "+"}).Draw(t, "sign"), rapid.IntRange(0, 99).Draw(t, "i"),
			rapid.IntRange(0, 999).Draw(t, "frac"), rapid.SampledFrom([]int{0, 37, 38, 39, -37, -38, -45, -46, -50, 307, 308, 309, -323, -324, -330}).Draw(t, "e"))
		s = ws(t, "before") + s + ws(t, "after")
		return s, s
	case "c_num", "c_num52", "c_num3m1":
		switch rapid.IntRange(0, 3).Draw(t, "form") {
		case 0:
			f := rapid.OneOf(rapid.SampledFrom([]float64{math.NaN(), math.Inf(1), math.Inf(-1), 999.99, 999.995, 999.994, -999.99, 1000, 9994, 9995, 99949, 99950, 0.001}),
				rapid.Float64()).Draw(t, "f")
			if math.IsInf(f, 0) || math.IsNaN(f) {
				return f, floatText(f)
			}
			return f, strconv.FormatFloat(f, 'f', -1, 64)
		case 1:
			n := rapid.Int64().Draw(t, "n")
			return n, strconv.FormatInt(n, 10)
		case 2:
			s := mixCase(t, rapid.SampledFrom([]string{"nan", "infinity", "-infinity", "+infinity", "inf", "+inf", "-inf"}).Draw(t, "special"))
			s = ws(t, "before") + s + ws(t, "after")
			return s, s
		}
		s := fmt.Sprintf("%s%d.%d", rapid.SampledFrom([]string{"", "-", "+"}).Draw(t, "sign"), rapid.SampledFrom([]int{0, 9, 99, 999, 1000, 9999, 99949, 99950, 123456}).Draw(t, "i"),
			rapid.SampledFrom([]int{0, 4, 5, 9, 99, 994, 995, 999}).Draw(t, "frac"))
		if rapid.Bool().Draw(t, "exp") {
			s += fmt.Sprintf("e%d", rapid.IntRange(-3, 3).Draw(t, "e"))
		}
		s = ws(t, "before") + s + ws(t, "after")
		return s, s
	case "c_bool":
		if rapid.Bool().Draw(t, "go") {
			b := rapid.Bool().Draw(t, "b")
			return b, strconv.FormatBool(b)
		}
		s := ws(t, "before") + mixCase(t, rapid.SampledFrom([]string{"t", "true", "yes", "on", "1", "f", "false", "no", "off", "0", "maybe"}).Draw(t, "word")) + ws(t, "after")
		return s, s
	case "c_text", "c_vc", "c_bp":
		s := rapid.StringOfN(rapid.SampledFrom([]rune{'a', 'é', '😀', ' ', '\x00'}), 0, 8, -1).Draw(t, "s")
		return s, s
	case "c_date", "c_ts", "c_tstz":
		return timeGen(t, name)
	case "c_time", "c_timetz":
		h, m, sec := rapid.IntRange(0, 24).Draw(t, "hour"), rapid.IntRange(0, 59).Draw(t, "minute"), rapid.IntRange(0, 60).Draw(t, "second")
		us := rapid.OneOf(rapid.Just(0), rapid.IntRange(0, 999999)).Draw(t, "us")
		offset := rapid.SampledFrom([]int{0, 3600, -(5*3600 + 1800), 14*3600 + 59*60 + 30, -15*3600 - 59*60 - 59}).Draw(t, "offset")
		zone := ""
		if name == "c_timetz" {
			sign, o := "+", offset
			if o < 0 {
				sign, o = "-", -o
			}
			zone = fmt.Sprintf("%s%02d:%02d:%02d", sign, o/3600, o%3600/60, o%60)
		}
		if rapid.Bool().Draw(t, "go") {
			at := time.Date(0, 1, 1, h%24, m, sec%60, us*1000, time.FixedZone("", offset))
			return at, fmt.Sprintf("%02d:%02d:%02d.%06d%s", at.Hour(), at.Minute(), at.Second(), us, zone)
		}
		s := fmt.Sprintf("%02d:%02d:%02d.%06d%s", h, m, sec, us, zone)
		return s, s
	case "c_uuid":
		var u [16]byte
		copy(u[:], rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "u"))
		text := fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:])
		if rapid.Bool().Draw(t, "go") {
			return u, text
		}
		s := "{" + strings.ToUpper(text) + "}"
		return s, s
	case "c_bytea":
		b := rapid.SliceOfN(rapid.Byte(), 0, 8).Draw(t, "b")
		return b, hex.EncodeToString(b)
	case "c_interval":
		if rapid.Bool().Draw(t, "go") {
			d := time.Duration(rapid.OneOf(rapid.SampledFrom([]int64{math.MinInt64, math.MaxInt64, 0, -1, 1, 1500, -1500}), rapid.Int64()).Draw(t, "d"))
			us := int64(d / time.Microsecond)
			if d%time.Microsecond < 0 {
				us-- // truncated toward the past, as documented
			}
			return d, strconv.FormatInt(us, 10) + " microseconds"
		}
		n := rapid.OneOf(rapid.SampledFrom([]int64{178000000, -178000000, 2147483647, -2147483648, 2147483648, -2147483649, math.MaxInt64, 0}),
			rapid.Int64Range(-1e6, 1e6)).Draw(t, "n")
		s := fmt.Sprintf("%d %s", n, rapid.SampledFrom([]string{"years", "months", "days", "hours", "microseconds"}).Draw(t, "unit"))
		return s, s
	}
	// jsonb
	s := rapid.SampledFrom([]string{`{"a": 1}`, `[1e131071]`, `[1e131072]`, `"\u0000"`, `NaN`, `null`, `{"x": "\\u0000"}`}).Draw(t, "json")
	return s, s
}

// timeGen draws a date, timestamp or timestamptz: a time.Time (in UTC or
// another fixed zone), one of the infinity sentinels, or ISO text with
// four or more year digits, AD/BC, infinity, -infinity or epoch, over
// and just beyond each type's range.
func timeGen(t *rapid.T, name string) (any, string) {
	year := rapid.OneOf(
		rapid.SampledFrom([]int{-4714, -4713, -4712, -1, 0, 1, 1969, 1970, 9999, 10000, 294276, 294277, 5874897, 5874898}),
		rapid.IntRange(-4800, 5874900), rapid.IntRange(1, 9999), rapid.IntRange(-4713, 294277)).Draw(t, "year")
	month := rapid.IntRange(1, 12).Draw(t, "month")
	day := rapid.OneOf(rapid.IntRange(1, 28), rapid.SampledFrom([]int{1, 24, 29, 30, 31})).Draw(t, "day")
	if year == -4713 && rapid.Bool().Draw(t, "edge") {
		month, day = 11, rapid.SampledFrom([]int{23, 24}).Draw(t, "edge day")
	}
	hour, minute, sec := rapid.IntRange(0, 23).Draw(t, "hour"), rapid.IntRange(0, 59).Draw(t, "minute"), rapid.IntRange(0, 59).Draw(t, "second")
	us := rapid.OneOf(rapid.Just(0), rapid.Just(999999), rapid.IntRange(0, 999999)).Draw(t, "us")
	offset := rapid.SampledFrom([]int{0, 0, 3600, -3600, 5*3600 + 1800, -8 * 3600, 14 * 3600}).Draw(t, "offset")
	if name != "c_tstz" && rapid.IntRange(0, 3).Draw(t, "24:00") == 0 {
		hour, minute, sec, us = 23, 59, 59, 999999
	}
	switch rapid.IntRange(0, 5).Draw(t, "form") {
	case 0, 1:
		loc := time.UTC
		if offset != 0 {
			loc = time.FixedZone("", offset)
		}
		at := time.Date(year, time.Month(month), day, hour, minute, sec, us*1000, loc)
		// What the row writer stores: the civil date in at's zone
		// (date), the wall clock in Job.Zone, UTC here (timestamp), the
		// instant (timestamptz).
		switch name {
		case "c_date":
			return at, isoText(at.Year(), int(at.Month()), at.Day(), -1, 0, 0, 0, "")
		case "c_ts":
			u := at.UTC()
			return at, isoText(u.Year(), int(u.Month()), u.Day(), u.Hour(), u.Minute(), u.Second(), u.Nanosecond()/1000, "")
		}
		return at, isoText(at.Year(), int(at.Month()), at.Day(), at.Hour(), at.Minute(), at.Second(), at.Nanosecond()/1000, zoneText(offset))
	case 2:
		if rapid.Bool().Draw(t, "positive") {
			return backfill.TimeInfinity, "infinity"
		}
		return backfill.TimeNegInfinity, "-infinity"
	case 3:
		s := ws(t, "before") + mixCase(t, rapid.SampledFrom([]string{"infinity", "-infinity", "epoch"}).Draw(t, "special")) + ws(t, "after")
		return s, s
	}
	var s string
	switch name {
	case "c_date":
		s = isoText(year, month, day, -1, 0, 0, 0, "")
		if rapid.IntRange(0, 3).Draw(t, "with time") == 0 {
			s = isoText(year, month, day, hour, minute, sec, us, rapid.SampledFrom([]string{"", "Z", zoneText(offset)}).Draw(t, "zone"))
		}
	case "c_ts":
		if rapid.IntRange(0, 5).Draw(t, "midnight 24") == 0 {
			hour, minute, sec, us = 24, 0, 0, 0
		}
		s = isoText(year, month, day, hour, minute, sec, us, "")
	default:
		s = isoText(year, month, day, hour, minute, sec, us, zoneText(offset))
	}
	if year > 0 && rapid.IntRange(0, 4).Draw(t, "AD") == 0 {
		s += " AD"
	}
	if rapid.Bool().Draw(t, "T") {
		s = strings.Replace(s, " ", "T", 1)
	}
	if us != 0 && rapid.Bool().Draw(t, "short fraction") {
		// .120000 as .12
		if j := strings.Index(s, fmt.Sprintf(".%06d", us)); j >= 0 {
			s = s[:j] + strings.TrimRight(s[j:j+7], "0") + s[j+7:]
		}
	}
	s = eraVariant(t, s)
	return s, s
}

// isoText renders a civil date and time (astronomical year: 0 is 1 BC)
// as ISO text with a BC suffix; hour -1 leaves out the time, us its
// microseconds when 0.
func isoText(year, month, day, hour, minute, sec, us int, zone string) string {
	bc := year <= 0
	if bc {
		year = 1 - year
	}
	s := fmt.Sprintf("%04d-%02d-%02d", year, month, day)
	if hour >= 0 {
		s += fmt.Sprintf(" %02d:%02d:%02d", hour, minute, sec)
		if us != 0 {
			s += fmt.Sprintf(".%06d", us)
		}
	}
	s += zone
	if bc {
		s += " BC"
	}
	return s
}

// eraVariant rewrites the " BC" or " AD" that ends s in another spelling
// PostgreSQL reads.
func eraVariant(t *rapid.T, s string) string {
	for _, era := range []string{" BC", " AD"} {
		if strings.HasSuffix(s, era) {
			sep := rapid.SampledFrom([]string{" ", "", "  ", "\t"}).Draw(t, "era space")
			return strings.TrimSuffix(s, era) + sep + mixCase(t, era[1:])
		}
	}
	return s
}

func zoneText(offset int) string {
	sign := "+"
	if offset < 0 {
		sign, offset = "-", -offset
	}
	return fmt.Sprintf("%s%02d:%02d", sign, offset/3600, offset%3600/60)
}

// Go values PostgreSQL can store are taken: slices into arrays of the
// matching type (quoted, with NULLs, nested), *big.Rat with a finite
// decimal expansion into numeric exactly. A Rat without one (1/3) is
// queued naming why; a slice of a type no element can be (a struct into
// int8[]) stays an extractor bug.
func TestWriteGoSlicesAndBigNumbers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE ga (id bigint PRIMARY KEY, i int8[], s text[], f float8[], b bool[], m int4[], n numeric, by bytea[])`)
	require.NoError(t, err)
	str := "x"
	rows := [][]any{
		{int64(0), []int64{1, -2}, []string{`a "b"`, `c\d`, "NULL", "", "é,{}"}, []float64{0.1, math.Inf(-1), math.NaN()}, []bool{true, false},
			[][]int32{{1, 2}, {3, 4}}, big.NewRat(1, 8), [][]byte{{0, 1}, nil}},
		{int64(1), []int64{}, []*string{&str, nil}, []any{1.5, nil}, []bool(nil), []int{7}, big.NewRat(-123456789, 1000), [][]byte{}},
		{int64(2), []int64{1}, []string{"x"}, []float64{1}, []bool{true}, []int64{math.MaxInt32 + 1}, big.NewRat(1, 3), nil},
	}
	job := backfill.Job{Name: "ga", Chunker: backfill.IntRange(0, 1, 1), Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
		Target: backfill.Target{Table: "ga", Key: []string{"id"}, Columns: []string{"id", "i", "s", "f", "b", "m", "n", "by"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
			for _, r := range rows {
				if err := w.Write(ctx, r...); err != nil {
					return err
				}
			}
			return nil
		})}
	r, err := backfill.New(db, &backfill.Config{ReturnOnPause: true}) // ends on its gate below
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	var got []string
	require.NoError(t, db.Select(&got, `SELECT concat_ws(' | ', i, s, f, b, m, n, by) FROM ga ORDER BY id`))
	require.Equal(t, []string{
		`{1,-2} | {"a \"b\"","c\\d","NULL","","é,{}"} | {0.1,-Infinity,NaN} | {t,f} | {{1,2},{3,4}} | 0.125 | {"\\x0001",NULL}`,
		`{} | {x,NULL} | {1.5,NULL} | {7} | -123456.789 | {}`,
	}, got)
	ex, err := backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ex, 1, "row 3: an int4 element out of range, and 1/3")
	require.Contains(t, ex[0].Reason, "array element 1: out of range")

	job.Name, job.NewRun = "ga2", true
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
		return w.Write(ctx, int64(3), []struct{}{{}}, nil, nil, nil, nil, big.NewRat(1, 3), nil)
	})
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrExtractor, "a struct is no int8 element")
	job.Name = "ga3"
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
		return w.Write(ctx, int64(3), nil, nil, nil, nil, nil, big.NewRat(1, 3), nil)
	})
	rep, err = r.Run(ctx, job)
	require.Error(t, err, "the run loaded none of its rows")
	ex, err = backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ex, 1)
	require.Contains(t, ex[0].Reason, "1/3 has no finite decimal expansion")
}

// Date/time text with more than six fractional digits is stored as
// PostgreSQL stores it: rounded to the microsecond (half to even on the
// double PostgreSQL reads, carried into the next second, minute, day,
// year), never truncated. Property: for random timestamps with 1 to 12
// fractional digits (biased to 9s, 5s and 0s, where rounding carries or
// ties), Write stores in timestamp, timestamptz and date columns what a
// cast of the same text stores.
func TestTimeTextRoundsAsPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	const table = "tround"
	_, err := db.Exec(`CREATE TABLE ` + table + ` (id bigint PRIMARY KEY, ts timestamp, tz timestamptz, d date)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rapid.Check(t, func(rt *rapid.T) {
		frac := rapid.StringOfN(rapid.SampledFrom([]rune("0123455999999")), 1, 12, -1)
		texts := rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) string {
			s := fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d.%s",
				rapid.SampledFrom([]int{1, 1999, 2024, 9999}).Draw(rt, "year"), rapid.SampledFrom([]int{1, 2, 12}).Draw(rt, "month"),
				rapid.SampledFrom([]int{1, 28, 31}).Draw(rt, "day"), rapid.SampledFrom([]int{0, 12, 23}).Draw(rt, "hour"),
				rapid.SampledFrom([]int{0, 59}).Draw(rt, "minute"), rapid.SampledFrom([]int{0, 30, 59}).Draw(rt, "second"), frac.Draw(rt, "frac"))
			if strings.HasPrefix(s, "0001-01-01 00:00:00.") && rapid.Bool().Draw(rt, "bc") {
				s += " BC"
			}
			return s
		}), 1, 40).Draw(rt, "texts")
		// Keep the calendar valid: February 31st is no test of rounding.
		for i, s := range texts {
			texts[i] = strings.Replace(strings.Replace(s, "-02-31", "-02-28", 1), "-12-28", "-12-31", 1)
		}
		_, err := db.Exec(`TRUNCATE ` + table)
		require.NoError(rt, err)
		job := backfill.Job{Name: table, NewRun: true, Chunker: backfill.IntRange(0, 1, 1), Rollback: backfill.RollbackNone,
			Target: backfill.Target{Table: table, Key: []string{"id"}, Columns: []string{"id", "ts", "tz", "d"}},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
				for i, s := range texts {
					if err := w.Write(ctx, int64(i), s, withOffset(s), s); err != nil {
						return err
					}
				}
				return nil
			})}
		_, err = r.Run(ctx, job)
		require.NoError(rt, err)
		tzs := make([]string, len(texts))
		for i, s := range texts {
			tzs[i] = withOffset(s)
		}
		var got, want []string
		require.NoError(rt, db.Select(&got, `SELECT concat_ws(' | ', ts, tz, d) FROM `+table+` ORDER BY id`))
		require.NoError(rt, db.Select(&want, `SELECT concat_ws(' | ', s::timestamp, tz::timestamptz, s::date)
			FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(s, tz, i) ORDER BY i`, pq.Array(texts), pq.Array(tzs)))
		require.Equal(rt, want, got, "texts %q", texts)
	})
}

// withOffset is s with the zone offset +00 after its time, before an era.
func withOffset(s string) string {
	if t, ok := strings.CutSuffix(s, " BC"); ok {
		return t + "+00 BC"
	}
	return s + "+00"
}

// Date/time text PostgreSQL reads the same whatever the session's
// settings is taken and stored as a cast stores it: IANA zone names
// (including times in a DST gap or overlap, resolved as PostgreSQL
// resolves them), YYYYMMDD, Julian days. Forms that depend on DateStyle,
// timezone_abbreviations or the clock are queued with a reason listing
// the accepted forms.
func TestTimeTextFormsAsPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	tz := []string{"2024-01-01 12:00:00 America/New_York", "2024-03-10 02:30:00 America/New_York", "2024-11-03 01:30:00 America/New_York",
		"2024-10-06 02:15:00 Australia/Lord_Howe", "2024-04-07 01:45:00 Australia/Lord_Howe", "2024-03-31 01:30:00 Europe/London",
		"2024-10-27 01:30:00.9999995 Europe/London", "1999-12-31T23:59:59 Asia/Kolkata", "2024-06-01 12:00 Europe/Amsterdam"}
	dates := []string{"20240101", "J2451187", "J0", "20240229", "0001-01-01 BC"}
	refused := []string{"January 8, 99 BC", "01/02/2024", "today", "20230229", "2024-01-01 12:00:00 PST", "2024-01-01 12:00:00 Nowhere/Land"}
	_, err := db.Exec(`CREATE TABLE tforms (id bigint PRIMARY KEY, tz timestamptz, d date, ts timestamp)`)
	require.NoError(t, err)
	var rows [][]any
	for _, s := range tz {
		rows = append(rows, []any{int64(len(rows)), s, nil, nil})
	}
	for _, s := range dates {
		rows = append(rows, []any{int64(len(rows)), nil, s, s})
	}
	firstRefused := len(rows)
	for _, s := range refused {
		rows = append(rows, []any{int64(len(rows)), s, s, nil})
	}
	job := backfill.Job{Name: "tforms", Chunker: backfill.IntRange(0, 1, 1), Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
		Target: backfill.Target{Table: "tforms", Key: []string{"id"}, Columns: []string{"id", "tz", "d", "ts"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
			for _, r := range rows {
				if err := w.Write(ctx, r...); err != nil {
					return err
				}
			}
			return nil
		})}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	for i, row := range rows[:firstRefused] {
		var got, want string
		require.NoError(t, db.Get(&got, `SELECT concat_ws(' | ', tz, d, ts) FROM tforms WHERE id = $1`, i))
		require.NoError(t, db.Get(&want, `SELECT concat_ws(' | ', $1::timestamptz, $2::date, $3::timestamp)`, row[1], row[2], row[3]))
		require.Equal(t, want, got, "%q", row[1:])
	}
	ex, err := backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ex, len(refused))
	for _, e := range ex[:len(refused)-1] {
		require.Regexp(t, "accepted forms are|out of range", e.Reason, "%q", e.Value)
	}
	require.Contains(t, ex[len(refused)-1].Reason, `unknown time zone "Nowhere/Land"`)
}

type namedTime time.Time

// timeValuer is a driver.Valuer that returns a time.Time.
type timeValuer struct{ t time.Time }

func (v timeValuer) Value() (driver.Value, error) { return v.t, nil }

// Job.Zone applies to a time.Time written to a timestamp column whatever
// wrapper delivers it, and the ChunkColumn check sees the instant stored:
// noon in New York, Zone UTC, is stored as 17:00 and lies in the chunk
// [16:00, 18:00) UTC, not in [12:00, 13:00).
func TestTimestampZoneThroughWrappers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	noon := time.Date(2024, 1, 1, 12, 0, 0, 0, ny)
	wrapped := []any{noon, &noon, sql.NullTime{Time: noon, Valid: true}, sql.Null[time.Time]{V: noon, Valid: true},
		namedTime(noon), (*namedTime)(&noon), timeValuer{noon}, &sql.NullTime{Time: noon, Valid: true}}
	utc := func(h int) time.Time { return time.Date(2024, 1, 1, h, 0, 0, 0, time.UTC) }
	for _, tc := range []struct {
		name    string
		lo, hi  time.Time
		inChunk bool
	}{{"in", utc(16), utc(18), true}, {"out", utc(12), utc(13), false}} {
		name := "tz_" + tc.name
		_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %s (id bigint PRIMARY KEY, ts timestamp)`, name))
		require.NoError(t, err)
		job := backfill.Job{Name: name, Chunker: backfill.Every(tc.lo, tc.hi, tc.hi.Sub(tc.lo), time.UTC), ChunkColumn: "ts",
			Zone: time.UTC, Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
			Target: backfill.Target{Table: name, Key: []string{"id"}, Columns: []string{"id", "ts"}},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
				for i, v := range wrapped {
					if err := w.Write(ctx, int64(i), v); err != nil {
						return err
					}
				}
				return nil
			})}
		r, err := backfill.New(db, &backfill.Config{MaxStagingRejects: 100, ReturnOnPause: true})
		require.NoError(t, err)
		rep, err := r.Run(ctx, job)
		if !tc.inChunk {
			require.Equal(t, int64(len(wrapped)), rep.Counts.Rejected, "every wrapper is outside [12:00, 13:00): %v", err)
			ex, err := backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
			require.NoError(t, err)
			for _, e := range ex {
				require.Contains(t, e.Reason, "outside chunk", "row %d (%T)", e.Row, wrapped[e.Row-1])
			}
			continue
		}
		require.NoError(t, err)
		var got []string
		require.NoError(t, db.Select(&got, fmt.Sprintf(`SELECT ts::text FROM %s ORDER BY id`, name)))
		want := make([]string, len(wrapped))
		for i := range want {
			want[i] = "2024-01-01 17:00:00"
		}
		require.Equal(t, want, got, "wrappers: %T", wrapped)
	}
}

// centsValuer is a custom driver.Valuer: a decimal amount in cents.
type centsValuer int64

func (c centsValuer) Value() (driver.Value, error) {
	return fmt.Sprintf("%d.%02d", int64(c)/100, int64(c)%100), nil
}

// TestExceptionValuesAreValuesNotAddresses: values written through a
// pointer (of any depth), sql.Null* or a custom driver.Valuer, and
// refused, show in the exception queue, in the reason text and in the
// report as the value they deliver (a nil pointer as NULL), never a Go
// address; an extractor bug's error shows the value too.
func TestExceptionValuesAreValuesNotAddresses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE vals (id bigint PRIMARY KEY, small smallint, code varchar(3), amount numeric(4,2), must text NOT NULL)`)
	n70k := 70000
	long := "abcdef"
	plong := &long
	rows := [][]any{
		{int64(1), &n70k, "a", "1.00", "x"},
		{int64(2), int16(1), &plong, "1.00", "x"},
		{int64(3), sql.NullInt64{Int64: 70000, Valid: true}, "a", "1.00", "x"},
		{int64(4), int16(1), "a", centsValuer(123456), "x"},
		{int64(5), int16(1), "a", "1.00", (*string)(nil)},
		{int64(6), int16(1), "a", "1.00", "ok"},
	}
	job := backfill.Job{Name: "vals", Chunker: backfill.List("all"), MaxRunRejectRate: -1, Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "vals", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for _, r := range rows {
				if err := w.Write(ctx, r...); err != nil {
					return err
				}
			}
			return nil
		})}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(5), rep.Counts.Rejected)
	want := map[int64][2]string{ // row: value, a part of the reason
		1: {"70000", "value 70000"},
		2: {"abcdef", "value abcdef"},
		3: {"70000", "value 70000"},
		4: {"1234.56", "value 1234.56"},
		5: {"NULL", "null"},
	}
	for _, e := range exceptionsOf(t, db, rep.BatchID) {
		w, ok := want[e.Row]
		require.True(t, ok, "row %d: %+v", e.Row, e)
		require.Equal(t, w[0], e.Value, "row %d", e.Row)
		require.Contains(t, strings.ToLower(e.Reason), w[1], "row %d", e.Row)
		require.NotContains(t, e.Value+e.Reason+string(e.Raw), "0x", "row %d", e.Row)
	}
	report, err := backfill.LoadRunReport(ctx, db, backfill.NewPGManifest(""), rep.BatchID)
	require.NoError(t, err)
	var shown []string
	for _, g := range report.Exceptions.Groups {
		for _, x := range g.Examples {
			shown = append(shown, x.Value+" "+x.Reason)
		}
	}
	require.NotEmpty(t, shown)
	require.NotContains(t, strings.Join(shown, "\n"), "0x")
	require.Contains(t, strings.Join(shown, "\n"), "70000")

	// An extractor bug (a bool for a timestamp) names the value, not an
	// address.
	db.MustExec(`CREATE TABLE times (id bigint PRIMARY KEY, at timestamptz)`)
	yes := true
	pyes := &yes
	job = backfill.Job{Name: "times", Chunker: backfill.List("all"), Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "times", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, &n70k, &pyes)
		})}
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrExtractor)
	require.Contains(t, err.Error(), "70000 (*int)")
	require.Contains(t, err.Error(), "true (**bool)")
	require.NotContains(t, err.Error(), "0x")
}
