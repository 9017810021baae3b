package pgconv

import (
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/stretchr/testify/require"
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
		got, reason := Convert(c.col, c.in)
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
		{"slice into array", col("_int4"), []int64{1}, "Go type []int64 is not supported for column type _int4"},
		{"NUL in enum text", col("mood"), testCode("a\x00"), "NUL byte"},
		{"bad UTF-8 in interval text", col("interval"), "1 \xff", "not valid UTF-8"},
		{"big.Rat is not decimal text", col("numeric"), big.NewRat(1, 3), "invalid input syntax for type numeric"},
	}
	for _, c := range rejects {
		got, reason := Convert(c.col, c.in)
		require.Contains(t, reason, c.reason, c.name)
		require.Nil(t, got, c.name)
	}

	// The type a column name shows is the declared one when known.
	_, reason := Convert(Column{Name: "c", Type: "interval day", BaseType: "interval"}, true)
	require.Equal(t, "Go type bool is not supported for column type interval day; write time.Duration or text", reason)
}
