package backfill

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

type (
	testCode  string
	testQty   int64
	testRatio float64
	testFlag  bool
	testUUID  [16]byte
	testBytes []byte
	testTime  time.Time
)

// testDecimal is a decimal type in the shape of shopspring/decimal
// without its driver.Valuer: only a String method.
type testDecimal struct {
	unscaled int64
	exp      int
}

func (d testDecimal) String() string {
	r := new(big.Rat).SetFrac(big.NewInt(d.unscaled), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(-d.exp)), nil))
	return r.FloatString(-d.exp)
}

// testValuer is a driver.Valuer returning v and err.
type testValuer struct {
	v   driver.Value
	err error
}

func (t testValuer) Value() (driver.Value, error) { return t.v, t.err }

// selfValuer returns itself from Value, forever.
type selfValuer struct{}

func (s selfValuer) Value() (driver.Value, error) { return s, nil }

type ptrValuer struct{ s string }

type panicStringer struct{}

func (panicStringer) String() string { panic("no text") }

type panicValuer struct{}

func (panicValuer) Value() (driver.Value, error) { panic("no value") }

func (p *ptrValuer) Value() (driver.Value, error) { return p.s, nil }

func col(base string) Column {
	return Column{Name: "c", Type: base, BaseType: base}
}

func TestConvertNormalizesGoTypes(t *testing.T) {
	t.Parallel()
	at := time.Date(2024, 3, 10, 12, 0, 0, 0, time.UTC)
	u := testUUID{0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, 0x11}
	code := testCode("ABC")
	pcode := &code
	n := int64(42)
	pn := &n
	var nilInt *int64
	var nilValuer *ptrValuer
	var nilNull *sql.NullString
	cases := []struct {
		name string
		col  Column
		in   any
		want any
	}{
		{"NullString", col("text"), sql.NullString{String: "x", Valid: true}, "x"},
		{"NullString invalid", col("text"), sql.NullString{}, nil},
		{"NullInt64", col("int8"), sql.NullInt64{Int64: 7, Valid: true}, int64(7)},
		{"NullInt32", col("int4"), sql.NullInt32{Int32: 7, Valid: true}, int64(7)},
		{"NullInt16", col("int2"), sql.NullInt16{Int16: 7, Valid: true}, int64(7)},
		{"NullFloat64", col("float8"), sql.NullFloat64{Float64: 1.5, Valid: true}, 1.5},
		{"NullBool", col("bool"), sql.NullBool{Bool: true, Valid: true}, true},
		{"NullTime", col("timestamptz"), sql.NullTime{Time: at, Valid: true}, "2024-03-10T12:00:00Z"},
		{"Null[int64]", col("int8"), sql.Null[int64]{V: 9, Valid: true}, int64(9)},
		{"Null[testUUID]", col("uuid"), sql.Null[testUUID]{V: u, Valid: true}, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"},
		{"Null[string] invalid", col("int8"), sql.Null[string]{}, nil},
		{"named string", col("text"), testCode("ABC"), "ABC"},
		{"named string varchar", Column{Name: "c", Type: "character varying(3)", BaseType: "varchar", MaxLen: 3}, testCode("ABC"), "ABC"},
		{"named int", col("int8"), testQty(12), int64(12)},
		{"named int to numeric", Column{Name: "c", Type: "numeric(4,0)", BaseType: "numeric", Precision: 4}, testQty(12), "12"},
		{"named float", col("float8"), testRatio(0.25), 0.25},
		{"named bool", col("bool"), testFlag(true), true},
		{"named bytes", col("bytea"), testBytes("ab"), []byte("ab")},
		{"named time", col("timestamptz"), testTime(at), "2024-03-10T12:00:00Z"},
		{"int16", col("int2"), int16(5), int64(5)},
		{"uint8", col("int4"), uint8(5), int64(5)},
		{"uint64", col("numeric"), uint64(math.MaxUint64), "18446744073709551615"},
		{"pointer to named", col("text"), pcode, "ABC"},
		{"pointer to pointer", col("int8"), &pn, int64(42)},
		{"nil pointer", col("int8"), nilInt, nil},
		{"nil Valuer pointer", col("text"), nilValuer, nil},
		{"nil pointer to Valuer", col("text"), nilNull, nil},
		{"pointer Valuer", col("text"), &ptrValuer{"v"}, "v"},
		{"pointer to NullString", col("text"), &sql.NullString{String: "p", Valid: true}, "p"},
		{"[16]byte-kind uuid", col("uuid"), u, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"},
		{"pointer to uuid", col("uuid"), &u, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"},
		{"Stringer numeric", Column{Name: "c", Type: "numeric(12,2)", BaseType: "numeric", Precision: 12, Scale: 2}, testDecimal{123456, -2}, "1234.56"},
		{"Stringer int", col("int8"), testDecimal{12, 0}, int64(12)},
		{"Valuer numeric", col("numeric"), testValuer{v: "1.25"}, "1.25"},
		{"big.Int", col("numeric"), new(big.Int).Lsh(big.NewInt(1), 100), "1267650600228229401496703205376"},
		{"big.Float exact", col("numeric"), new(big.Float).SetPrec(200).SetFloat64(1.0 / 3), "0.333333333333333314829616256247390992939472198486328125"},
		{"net.IP into inet", col("inet"), net.ParseIP("192.0.2.1"), "192.0.2.1"},
		{"net.IP into text", col("text"), net.ParseIP("192.0.2.1"), "192.0.2.1"},
		{"named string into enum", col("mood"), testCode("happy"), "happy"},
		{"NullString into enum", col("mood"), sql.NullString{String: "sad", Valid: true}, "sad"},
		{"named string into jsonb is a JSON string", col("jsonb"), testCode("ABC"), `"ABC"`},
		{"NullString into jsonb is JSON text", col("jsonb"), sql.NullString{String: `{"a":1}`, Valid: true}, `{"a":1}`},
		{"json.RawMessage into jsonb", col("jsonb"), json.RawMessage(`[1]`), `[1]`},
		{"json.Number into int8", col("int8"), json.Number("17"), int64(17)},
		{"Duration into interval", col("interval"), time.Hour, "3600000000 microseconds"},
		{"text into interval", col("interval"), "1 day", "1 day"},
		{"Valuer text into array", col("_int4"), pq.Array([]int64{1, 2}), "{1,2}"},
		{"unknown type (fake) passes named values reduced", Column{Name: "c"}, testQty(3), int64(3)},
		{"unknown type (fake) passes other values", Column{Name: "c"}, []int{1}, []int{1}},
	}
	for _, c := range cases {
		got, reason := convertValue(c.col, c.in)
		require.Empty(t, reason, c.name)
		require.Equal(t, c.want, got, c.name)
	}

	rejects := []struct {
		name   string
		col    Column
		in     any
		reason string
	}{
		{"NULL Valuer key", Column{Name: "k", BaseType: "text", Key: true}, sql.NullString{}, "missing key column"},
		{"NULL pointer not null", Column{Name: "k", BaseType: "int8", NotNull: true}, nilInt, "null value in NOT NULL column"},
		{"Valuer error", col("text"), testValuer{err: errors.New("boom")}, "Value failed: boom"},
		{"Valuer loop", col("text"), selfValuer{}, "levels of driver.Valuer or pointer"},
		{"Valuer panics", col("text"), panicValuer{}, "Value failed: panic: no value"},
		{"Stringer panics", col("numeric"), panicStringer{}, "String failed: panic: no text"},
		{"named int into text", col("text"), testQty(1), "wrong type"},
		{"struct into int", col("int8"), struct{ A int }{1}, "wrong type struct"},
		{"Duration into tsrange", col("tsrange"), time.Second, "Go type time.Duration is not supported for column type tsrange; write text"},
		{"int into enum", col("mood"), 1, "Go type int is not supported for column type mood; write text"},
		{"float into inet", col("inet"), 1.5, "Go type float64 is not supported for column type inet; write text"},
		{"int into interval", col("interval"), int64(5), "Go type int64 is not supported for column type interval; write time.Duration or text"},
		{"slice of structs into array", col("_int4"), []struct{}{{}}, "Go type []struct {} is not supported for column type int4[]"},
		{"NUL in enum text", col("mood"), testCode("a\x00"), "NUL byte"},
		{"bad UTF-8 in interval text", col("interval"), "1 \xff", "not valid UTF-8"},
		{"big.Rat without a finite decimal expansion", col("numeric"), big.NewRat(1, 3), "1/3 has no finite decimal expansion"},
	}
	for _, c := range rejects {
		got, reason := convertValue(c.col, c.in)
		require.Contains(t, reason, c.reason, c.name)
		require.Nil(t, got, c.name)
	}

	// The type a column name shows is the declared one when known.
	_, reason := convertValue(Column{Name: "c", Type: "interval day", BaseType: "interval"}, true)
	require.Equal(t, "Go type bool is not supported for column type interval day; write time.Duration or text", reason)
}

// TestConvertIntervalExact: a time.Duration is stored as whole
// microseconds, truncated toward the past like truncMicro, and
// PostgreSQL reads exactly that many microseconds.
func TestConvertIntervalExact(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	check := func(tb require.TestingT, d time.Duration) {
		got, reason := convertValue(col("interval"), d)
		require.Empty(tb, reason)
		want := int64(d) / 1000
		if int64(d)%1000 < 0 {
			want--
		}
		var us int64
		require.NoError(tb, db.Get(&us, "SELECT (extract(epoch FROM $1::interval) * 1000000)::bigint", got))
		require.Equal(tb, want, us, "%v stored as %s", d, got)
		// Consistent with truncMicro: a stored time plus the stored
		// interval is the stored sum.
		if us > math.MinInt64/1000 {
			base := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
			require.Equal(tb, truncMicro(base.Add(d)), base.Add(time.Duration(us)*time.Microsecond), "%v", d)
		}
	}
	for _, d := range []time.Duration{0, 1, -1, 999, -999, 1000, -1000, -1500, time.Hour, -time.Hour, math.MaxInt64, math.MinInt64} {
		check(t, d)
	}
	rapid.Check(t, func(rt *rapid.T) {
		check(rt, time.Duration(rapid.Int64().Draw(rt, "d")))
	})
}

// TestConvertTimestamptzText: text with an explicit offset in the forms
// PostgreSQL prints (and RFC 3339) is read as PostgreSQL reads it;
// without an offset it is refused.
func TestConvertTimestamptzText(t *testing.T) {
	t.Parallel()
	tz := col("timestamptz")
	for in, want := range map[string]string{
		"2024-03-10 12:00:00+00":           "2024-03-10T12:00:00Z",
		"2024-03-10 12:00:00.123456+05:30": "2024-03-10T06:30:00.123456Z",
		"2024-03-10T12:00:00+0100":         "2024-03-10T11:00:00Z",
		"2024-03-10T12:00:00-01":           "2024-03-10T13:00:00Z",
		"2024-03-10 12:00:00 -01:00":       "2024-03-10T13:00:00Z",
		"2024-03-10 12:00+00:19:32":        "2024-03-10T11:40:28Z",
		"2024-03-10t12:00:00z":             "2024-03-10T12:00:00Z",
		"2024-03-10T12:00:00.1234567Z":     "2024-03-10T12:00:00.123457Z", // rounded, as PostgreSQL rounds
		"2024-03-10T12:00:00.9999999999Z":  "2024-03-10T12:00:01Z",        // rounded, as PostgreSQL rounds
		"2024-03-10T12:00:00.5+15:59:59":   "2024-03-09T20:00:01.5Z",
		"0001-01-01T05:00:00+05":           "0001-01-01T00:00:00Z",
		"2024-03-10 24:00:00Z":             "2024-03-11T00:00:00Z",
		" 2024-03-10 23:59:60+00 AD\n":     "2024-03-11T00:00:00Z",
		"0001-01-01T00:00:00+05:00":        "0001-12-31T19:00:00Z BC",
		"9999-12-31T23:00:00-05:00":        "10000-01-01T04:00:00Z",
		"4714-11-24 00:00:00+00 BC":        "4714-11-24T00:00:00Z BC",
		"294276-12-31 23:59:59.999999+00":  "294276-12-31T23:59:59.999999Z",
		"INFINITY":                         "infinity",
		" -infinity":                       "-infinity",
		"epoch":                            "1970-01-01T00:00:00Z",
	} {
		got, reason := convertValue(tz, in)
		require.Empty(t, reason, in)
		require.Equal(t, want, got, in)
	}
	const noOffset = reasonTimestamptzText
	for _, in := range []string{"2024-03-10 12:00:00", "2024-03-10T12:00:00.123", "2024-03-10", "2024-03-10 12:00:00 ", "2024-03-10 12:00:00+16",
		"2024-03-10 12:00:00+0530:00", "2024-03-10 12:00:00+05:3", "2024-03-10 12:00:00.Z",
		"2024-03-10 12:00:00 UTC", "24-03-10 12:00:00Z", "2024-03-10  12:00:00Z", "", "now", "today"} {
		_, reason := convertValue(tz, in)
		require.Equal(t, noOffset, reason, "%q", in)
	}
	for _, in := range []string{"2024-02-30 12:00:00Z", "2023-02-29 12:00:00Z", "2024-03-10 24:00:01Z", "2024-03-10 23:59:60.5Z", "0000-01-01T00:00:00Z", "2024-13-01T00:00:00Z"} {
		_, reason := convertValue(tz, in)
		require.Contains(t, reason, `date/time field value out of range: timestamptz column "c" holds calendar dates`, "%q", in)
	}
	for _, in := range []any{"4714-11-24T00:00:00+01 BC", "294277-01-01T00:00:00Z", "294276-12-31T23:00:00-05:00",
		time.Date(-4713, 11, 23, 23, 0, 0, 0, time.UTC), time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-4713, 11, 24, 0, 0, 0, 0, time.FixedZone("", 3600))} {
		_, reason := convertValue(Column{Name: "at", Type: "timestamp with time zone", BaseType: "timestamptz"}, in)
		require.Equal(t, `timestamp out of range: timestamp with time zone column "at" holds 4714-11-24 00:00:00+00 BC to 294276-12-31 23:59:59.999999+00 AD, and ±infinity`, reason, "%v", in)
	}
	for _, c := range []struct {
		col Column
		in  any
	}{{col("date"), "4714-11-23 BC"}, {col("date"), "5874898-01-01"}, {col("timestamp"), "294277-01-01 00:00:00"}, {col("timestamp"), "4714-11-23 BC"},
		{col("date"), time.Date(-4713, 11, 23, 0, 0, 0, 0, time.UTC)}, {col("timestamp"), time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC)}} {
		_, reason := convertValue(c.col, c.in)
		require.Contains(t, reason, `out of range: `+c.col.BaseType+` column "c" holds 4714-11-24`, "%s %v", c.col.BaseType, c.in)
	}
}

// TestConvertTimestamptzReadsPostgresOutput: whatever the session's
// TimeZone, the text PostgreSQL prints for a timestamptz converts back
// to the same instant.
func TestConvertTimestamptzReadsPostgresOutput(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	zones := []string{"UTC", "Asia/Kolkata", "America/St_Johns", "Europe/Amsterdam", "Africa/Monrovia", "Asia/Kathmandu", "Pacific/Chatham", "America/Sao_Paulo"}
	lo := time.Date(2, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	hi := time.Date(9998, 12, 31, 0, 0, 0, 0, time.UTC).UnixMicro()
	rapid.Check(t, func(rt *rapid.T) {
		at := time.UnixMicro(rapid.Int64Range(lo, hi).Draw(rt, "at")).UTC()
		zone := rapid.SampledFrom(zones).Draw(rt, "zone")
		tx, err := db.BeginTxx(ctx, nil)
		require.NoError(rt, err)
		defer func() { _ = tx.Rollback() }()
		_, err = tx.Exec("SET LOCAL TimeZone = '" + zone + "'")
		require.NoError(rt, err)
		var text string
		require.NoError(rt, tx.Get(&text, "SELECT $1::timestamptz::text", at.Format(time.RFC3339Nano)))
		got, reason := convertValue(col("timestamptz"), text)
		require.Empty(rt, reason, "PostgreSQL's %q in %s", text, zone)
		require.Equal(rt, at.Format(time.RFC3339Nano), got, "PostgreSQL's %q in %s", text, zone)
	})
}

// TestConvertBoolAgreesWithPostgres: boolean text is accepted exactly
// when PostgreSQL accepts it, with the same value.
func TestConvertBoolAgreesWithPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	words := []string{"t", "tr", "tru", "true", "f", "fa", "fal", "fals", "false", "y", "ye", "yes", "n", "no",
		"o", "on", "of", "off", "1", "0", "truee", "onn", "offf", "10", "2", "", "nO", "TRUE", "Off"}
	rapid.Check(t, func(rt *rapid.T) {
		var s string
		if rapid.Bool().Draw(rt, "word") {
			w := []byte(rapid.SampledFrom(words).Draw(rt, "w"))
			for i := range w {
				if rapid.Bool().Draw(rt, "upper") && w[i] >= 'a' && w[i] <= 'z' {
					w[i] -= 'a' - 'A'
				}
			}
			ws := rapid.StringMatching(`[ \t\n\r\v\f]{0,2}`)
			s = ws.Draw(rt, "before") + string(w) + ws.Draw(rt, "after")
		} else {
			s = rapid.StringMatching(`[tTrRuUeEfFaAlLsSyYnNoO10 \tx]{0,6}`).Draw(rt, "s")
		}
		got, reason := convertValue(col("bool"), s)
		var pg bool
		if err := db.Get(&pg, "SELECT $1::bool", s); err != nil {
			require.NotEmpty(rt, reason, "PostgreSQL refuses %q (%v) but it was accepted", s, err)
		} else {
			require.Empty(rt, reason, "PostgreSQL accepts %q but it was rejected", s)
			require.Equal(rt, pg, got, "%q", s)
		}
	})
}

// TestConvertUUIDAgreesWithPostgres: uuid text is accepted exactly when
// PostgreSQL accepts it (braces, hyphens after any group of four
// digits), and converted to PostgreSQL's canonical text.
func TestConvertUUIDAgreesWithPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for in, want := range map[string]string{
		"{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}":  "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"a0eebc999c0b4ef8bb6d6bb9bd380a11":        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"{a0eebc999c0b4ef8bb6d6bb9bd380a11}":      "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
	} {
		got, reason := convertValue(col("uuid"), in)
		require.Empty(t, reason, in)
		require.Equal(t, want, got, in)
	}
	rapid.Check(t, func(rt *rapid.T) {
		var b strings.Builder
		hexDigits := rapid.StringMatching(`[0-9a-fA-F]{32}`).Draw(rt, "hex")
		for i := range 32 {
			b.WriteByte(hexDigits[i])
			if i < 31 && (i%4 == 3 && rapid.IntRange(0, 2).Draw(rt, "dash4") == 0 || rapid.IntRange(0, 40).Draw(rt, "dash") == 0) {
				b.WriteByte('-')
			}
		}
		s := b.String()
		switch rapid.IntRange(0, 5).Draw(rt, "braces") {
		case 0:
			s = "{" + s + "}"
		case 1:
			s = "{" + s
		case 2:
			s += "}"
		}
		switch rapid.IntRange(0, 6).Draw(rt, "mutate") {
		case 0:
			i := rapid.IntRange(0, len(s)-1).Draw(rt, "del")
			s = s[:i] + s[i+1:]
		case 1:
			i := rapid.IntRange(0, len(s)).Draw(rt, "ins")
			s = s[:i] + rapid.SampledFrom([]string{"g", "-", " ", "0"}).Draw(rt, "c") + s[i:]
		}
		got, reason := convertValue(col("uuid"), s)
		var pg string
		if err := db.Get(&pg, "SELECT $1::uuid::text", s); err != nil {
			require.NotEmpty(rt, reason, "PostgreSQL refuses %q (%v) but it was accepted", s, err)
		} else {
			require.Empty(rt, reason, "PostgreSQL accepts %q but it was rejected", s)
			require.Equal(rt, pg, got, "%q", s)
		}
	})
}

// TestConvertJSONAgreesWithPostgres: json and jsonb text with escapes
// (\u0000, escaped backslashes, surrogates) and numbers with large
// exponents is accepted exactly when PostgreSQL accepts it.
func TestConvertJSONAgreesWithPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for in, ok := range map[string]bool{
		`"\\u0000"`: true, `{"a\\u0000":"\\\\u0000"}`: true, `"\u0000"`: false, `"\\\u0000"`: false, `{"k\u0000":1}`: false,
		`"\ud83d\ude00"`: true, `"\ud83d"`: false, `"\ude00"`: false, `"\ud83dx"`: false, `"\ud83d\n"`: false,
		`1e131071`: true, `1e131072`: false, `[1e-16383]`: true, `{"a":1.5e-16383}`: false, `"1e200000"`: true,
	} {
		_, reason := convertValue(col("jsonb"), in)
		require.Equal(t, ok, reason == "", "%s: %s", in, reason)
	}
	pieces := []string{`a`, `\\`, `\u0000`, `\\u0000`, `\\\u0000`, `\ud83d`, `\ude00`, `\ud83d\ude00`, `\n`, `\"`, `\u00e9`, `u0000`, `é`}
	exps := []string{"", "e5", "e-5", "e131071", "e131072", "e-16383", "e-16384", "E+131070", "e1073741823", "e-1073741823"}
	rapid.Check(t, func(rt *rapid.T) {
		var parts []string
		for range rapid.IntRange(1, 3).Draw(rt, "values") {
			if rapid.Bool().Draw(rt, "string") {
				var b strings.Builder
				b.WriteByte('"')
				for range rapid.IntRange(0, 4).Draw(rt, "pieces") {
					b.WriteString(rapid.SampledFrom(pieces).Draw(rt, "piece"))
				}
				b.WriteByte('"')
				parts = append(parts, b.String())
			} else {
				parts = append(parts, rapid.SampledFrom([]string{"0", "1", "-12.5", "0.001", "100"}).Draw(rt, "mantissa")+
					rapid.SampledFrom(exps).Draw(rt, "exp"))
			}
		}
		s := "[" + strings.Join(parts, ",") + "]"
		for _, typ := range []string{"json", "jsonb"} {
			_, reason := convertValue(col(typ), s)
			var out string
			if err := db.Get(&out, "SELECT $1::"+typ+"::text", s); err != nil {
				require.NotEmpty(rt, reason, "PostgreSQL refuses %s as %s (%v) but it was accepted", s, typ, err)
			} else {
				require.Empty(rt, reason, "PostgreSQL accepts %s as %s but it was rejected", s, typ)
			}
		}
	})
}

// TestNumericLimitsAgreeWithPostgres extends
// TestNumericCheckAgreesWithPostgres to unconstrained numeric and to the
// limits of the numeric format: large exponents, 16383 digits after the
// point, 131072 before it.
func TestNumericLimitsAgreeWithPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	agree := func(tb require.TestingT, s string, p, sc int) {
		typ := "numeric"
		if p > 0 {
			typ = fmt.Sprintf("numeric(%d,%d)", p, sc)
		}
		_, reason := convertValue(Column{Name: "n", Type: typ, BaseType: "numeric", Precision: p, Scale: sc}, s)
		shown := s
		if len(shown) > 40 {
			shown = fmt.Sprintf("%s... (%d bytes)", s[:40], len(s))
		}
		var ok bool
		if err := db.Get(&ok, "SELECT $1::"+typ+" IS NOT NULL", s); err != nil {
			require.NotEmpty(tb, reason, "PostgreSQL refuses %q as %s (%v) but it was accepted", shown, typ, err)
		} else {
			require.Empty(tb, reason, "PostgreSQL accepts %q as %s but it was rejected", shown, typ)
		}
	}
	for _, s := range []string{
		"1" + strings.Repeat("0", 131071), "1" + strings.Repeat("0", 131072), "0." + strings.Repeat("0", 16383), "0." + strings.Repeat("0", 16384),
		strings.Repeat("0", 200000) + "1", "1." + strings.Repeat("5", 16383), "1e200000", "-1e200000", "1e-200000", "0e200000", "0e-200000",
		"1e99999999999999999999", "0e1073741822", "0e1073741823", "0e-1073741822", "0e-1073741823", "1e00000000000000000005",
	} {
		for _, ps := range [][2]int{{0, 0}, {10, 2}, {3, -2}, {1000, 1000}} {
			agree(t, s, ps[0], ps[1])
		}
	}
	bounds := []int{0, 16383, -16383, 131071, -131071, 1073741823, -1073741823, 1000, -1000}
	rapid.Check(t, func(rt *rapid.T) {
		p := rapid.IntRange(0, 12).Draw(rt, "precision")
		sc := 0
		if p > 0 {
			sc = rapid.IntRange(-2, p).Draw(rt, "scale")
		}
		var b strings.Builder
		b.WriteString(rapid.SampledFrom([]string{"", "-", "+"}).Draw(rt, "sign"))
		b.WriteString(strings.Repeat("0", rapid.IntRange(0, 5).Draw(rt, "zeros")))
		b.WriteString(rapid.StringMatching(`[0-9]{0,14}`).Draw(rt, "int"))
		if rapid.Bool().Draw(rt, "dot") {
			b.WriteString("." + rapid.StringMatching(`[0-9]{0,6}`).Draw(rt, "frac"))
		}
		switch rapid.IntRange(0, 3).Draw(rt, "exp") {
		case 0:
			fmt.Fprintf(&b, "e%d", rapid.IntRange(-5, 5).Draw(rt, "e"))
		case 1:
			fmt.Fprintf(&b, "e%d", rapid.SampledFrom(bounds).Draw(rt, "bound")+rapid.IntRange(-6, 6).Draw(rt, "delta"))
		}
		agree(rt, b.String(), p, sc)
	})
}

// TestConvertFloatRangeAgreesWithPostgres: a float64 for a real column is
// refused exactly when PostgreSQL refuses the text lib/pq sends (underflow
// to zero, overflow to infinity), and float8 text that is not zero but
// reads as zero is refused as PostgreSQL refuses it.
func TestConvertFloatRangeAgreesWithPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	agree := func(tb require.TestingT, typ string, in any) {
		base := map[string]string{"real": "float4", "double precision": "float8"}[typ]
		_, reason := convertValue(col(base), in)
		var out string
		if err := db.Get(&out, "SELECT $1::"+typ+"::text", in); err != nil {
			require.NotEmpty(tb, reason, "PostgreSQL refuses %v as %s (%v) but it was accepted", in, typ, err)
		} else {
			require.Empty(tb, reason, "PostgreSQL accepts %v as %s (= %s) but it was rejected", in, typ, out)
		}
	}
	tiny := float64(math.SmallestNonzeroFloat32)
	for _, f := range []float64{1e-50, 1e-45, 7e-46, 7.1e-46, tiny, tiny / 2, math.Nextafter(tiny/2, 1), math.Nextafter(tiny/2, 0), -1e-50,
		math.MaxFloat32, math.Nextafter(math.MaxFloat32, math.Inf(1)), 3.4028235e38, 3.4028236e38, 3.5e38, -3.5e38, 1e39, 0, math.Inf(1), math.NaN()} {
		agree(t, "real", f)
	}
	for _, s := range []string{"1e-400", "-1e-400", "0e-400", "4.9e-324", "2e-324", "3e-324", "1e309", "0x1p-2000", "0x0p-2000", "1e-50"} {
		agree(t, "double precision", s)
	}
	rapid.Check(t, func(rt *rapid.T) {
		e := rapid.SampledFrom([]int{-47, -46, -45, -44, -39, -38, 37, 38, 39}).Draw(rt, "e")
		f := rapid.Float64Range(1, 10).Draw(rt, "m") * math.Pow(10, float64(e))
		if rapid.Bool().Draw(rt, "neg") {
			f = -f
		}
		agree(rt, "real", f)
	})
}

// TestConvertedValuesCopy: values of many Go types, converted, go
// through lib/pq's COPY into columns of their types.
func TestConvertedValuesCopy(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	_, err := db.Exec(`CREATE TYPE mood AS ENUM ('happy', 'sad');
		CREATE TABLE t (i interval, m mood, u uuid, r real, n numeric, b boolean, tz timestamptz, j jsonb, a int4[], ip inet, s text)`)
	require.NoError(t, err)
	cols := []Column{col("interval"), col("mood"), col("uuid"), col("float4"), col("numeric"), col("bool"), col("timestamptz"), col("jsonb"), col("_int4"), col("inet"), col("text")}
	rows := [][]any{
		{-1500 * time.Nanosecond, testCode("happy"), testUUID{1, 2, 3}, 1e-45, testDecimal{-5, -3}, " Yes ", "2024-03-10 12:00:00.5+05:30",
			`{"a":"\\u0000"}`, pq.Array([]int{1, 2}), net.ParseIP("2001:db8::1"), sql.NullString{String: "x", Valid: true}},
		{sql.Null[time.Duration]{V: time.Minute, Valid: true}, "sad", "{A0EEBC99-9C0B4EF8-BB6D6BB9-BD380A11}", float32(2.5), new(big.Int).SetInt64(-7), "of", "2024-03-10T12:00:00+0100",
			map[string]any{"k": []any{1, "two"}}, "{3}", "192.0.2.1", testCode("y")},
		{nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil},
	}
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	stmt, err := tx.Prepare("COPY t (i, m, u, r, n, b, tz, j, a, ip, s) FROM STDIN")
	require.NoError(t, err)
	for _, row := range rows {
		out := make([]any, len(row))
		for i, v := range row {
			var reason string
			out[i], reason = convertValue(cols[i], v)
			require.Empty(t, reason, "%s %v", cols[i].BaseType, v)
		}
		_, err := stmt.Exec(out...)
		require.NoError(t, err)
	}
	_, err = stmt.Exec()
	require.NoError(t, err)
	require.NoError(t, stmt.Close())
	var got []string
	require.NoError(t, sqlx.Select(tx, &got, `SELECT concat_ws('|', i, m, u, r, n, b, tz AT TIME ZONE 'UTC', j, a, ip, s) FROM t ORDER BY m NULLS LAST`))
	require.Equal(t, []string{
		"-00:00:00.000002|happy|01020300-0000-0000-0000-000000000000|1e-45|-0.005|t|2024-03-10 06:30:00.5|{\"a\": \"\\\\u0000\"}|{1,2}|2001:db8::1|x",
		"00:01:00|sad|a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11|2.5|-7|f|2024-03-10 11:00:00|{\"k\": [1, \"two\"]}|{3}|192.0.2.1|y",
		"",
	}, got)
}

// TestRawJSONKeepsWhatItCan: a value JSON or jsonb cannot hold becomes
// its display text, and only it; the rest of the row is kept as JSON.
func TestRawJSONKeepsWhatItCan(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	names := []string{"ok", "complex", "inf", "chan", "nul", "num", "raw", "time", "nested", "bad\xffname"}
	values := []any{"fine", complex(1, 2), struct{ F float64 }{math.Inf(1)}, make(chan int), struct{ S string }{"a\x00b"},
		json.Number("1e200000"), json.RawMessage(`"\ud800"`), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		map[string]any{"x\x00": []any{1.5, math.NaN(), "y"}}, 7, "extra"}
	raw := rawJSON(names, values, nil)
	require.True(t, json.Valid(raw), "%s", raw)
	var got map[string]any
	require.NoError(t, json.Unmarshal(raw, &got))
	require.Equal(t, "fine", got["ok"])
	require.Equal(t, "(1+2i)", got["complex"])
	require.Equal(t, "{+Inf}", got["inf"])
	require.IsType(t, "", got["chan"])
	require.Equal(t, `"{a\x00b}"`, got["nul"])
	require.Equal(t, "1e200000", got["num"])
	require.Equal(t, `"\ud800"`, got["raw"])
	require.Equal(t, "10000-01-01T00:00:00Z", got["time"])
	require.Equal(t, map[string]any{`"x\x00"`: []any{1.5, "NaN", "y"}}, got["nested"])
	require.Equal(t, float64(7), got[`"bad\xffname"`])
	require.Equal(t, "extra", got["$11"])
	var stored string
	require.NoError(t, db.Get(&stored, "SELECT $1::jsonb::text", string(raw)))

	require.JSONEq(t, `"(1+0i)"`, string(rawJSON(nil, nil, complex(1, 0))))
	require.JSONEq(t, `{"a":"(2+0i)","b":[1]}`, string(rawJSON(nil, nil, map[string]any{"a": complex(2, 0), "b": []any{1}})))
}

// TestRawJSONTruncatesLargeRows: a row's JSON beyond 64 KiB is stored as
// {"truncated": true, "bytes": N, "prefix": "..."}, itself at most 64 KiB
// of valid, jsonb-safe JSON.
func TestRawJSONTruncatesLargeRows(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	long := strings.Repeat(`quote " backslash \ \u0000 nul-text é 😀 <&> `+"\n\t", 3000)
	for _, values := range [][]any{{long}, {strings.Repeat("x", maxRawJSON)}, {strings.Repeat("é", maxRawJSON)}, {long, long}} {
		full, err := json.Marshal(map[string]any{"c": values[0]})
		require.NoError(t, err)
		names := []string{"c", "d"}[:len(values)]
		if len(values) > 1 {
			full, err = json.Marshal(map[string]any{"c": values[0], "d": values[1]})
			require.NoError(t, err)
		}
		raw := rawJSON(names, values, nil)
		require.LessOrEqual(t, len(raw), maxRawJSON)
		require.True(t, json.Valid(raw))
		require.True(t, utf8.Valid(raw))
		var got struct {
			Truncated bool   `json:"truncated"`
			Bytes     int    `json:"bytes"`
			Prefix    string `json:"prefix"`
		}
		require.NoError(t, json.Unmarshal(raw, &got))
		require.True(t, got.Truncated)
		require.Equal(t, len(full), got.Bytes)
		require.True(t, strings.HasPrefix(string(full), got.Prefix))
		require.Greater(t, len(raw), maxRawJSON-16, "the prefix fills the cap")
		var n int
		require.NoError(t, db.Get(&n, "SELECT length($1::jsonb->>'prefix')", string(raw)))
		require.Equal(t, utf8.RuneCountInString(got.Prefix), n)
	}
	small := rawJSON([]string{"c"}, []any{strings.Repeat("x", 1000)}, nil)
	require.JSONEq(t, `{"c":"`+strings.Repeat("x", 1000)+`"}`, string(small))
}

// BenchmarkConvertNormalize measures the types outside the fast path.
func BenchmarkConvertNormalize(b *testing.B) {
	v := sql.NullString{String: "x", Valid: true}
	q := testQty(3)
	c, n := col("text"), col("int8")
	for b.Loop() {
		_, _ = convertValue(c, v)
		_, _ = convertValue(n, q)
	}
}
