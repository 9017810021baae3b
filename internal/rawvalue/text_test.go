package rawvalue

import (
	"database/sql"
	"database/sql/driver"
	"fmt"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type node struct {
	Name string
	Next *node
}

// TestDisplayIsBounded: values fmt prints print the same; values that
// contain themselves, nest too deep or are too long are cut and marked,
// and the text is valid UTF-8 PostgreSQL can store.
func TestDisplayIsBounded(t *testing.T) {
	t.Parallel()
	for _, v := range []any{1, "s", 2.5, []int{1, 2}, [2]string{"a", "b"}, struct {
		A int
		B string
	}{1, "x"}, map[string]int{"b": 2, "a": 1}, fmt.Errorf("boom"), []int(nil)} {
		require.Equal(t, fmt.Sprint(v), Display(v), "%T", v)
	}
	require.Equal(t, "NULL", Display(nil))

	m := map[string]any{"k": 1}
	m["self"] = m
	require.Equal(t, "map[k:1 self:<cycle>]", Display(m))
	s := []any{1, nil}
	s[1] = s
	require.Equal(t, "[1 <cycle>]", Display(s))
	n := &node{Name: "a"}
	n.Next = n
	require.Contains(t, Display(n), "{a {a {a ")
	require.Contains(t, Display(n), markTooDeep)
	require.NotContains(t, Display(n), "0x")

	var deep any = 1
	for range maxRawDepth + 5 {
		deep = []any{deep}
	}
	require.Contains(t, Display(deep), markTooDeep)

	long := strings.Repeat("é", MaxDisplay)
	got := Display(long)
	require.True(t, utf8.ValidString(got))
	require.LessOrEqual(t, len(got), MaxDisplay+len("…"))
	require.True(t, strings.HasSuffix(got, "…"))
	require.Equal(t, `"a\x00b"`, Display("a\x00b"))
	require.Equal(t, `"\xff"`, Display([]byte{0xff}))
	require.Equal(t, "NaN", Display(math.NaN()))
}

// TestValidPrefix: the longest prefix of at most n bytes that does not
// cut a character.
func TestValidPrefix(t *testing.T) {
	t.Parallel()
	require.Equal(t, "abc", ValidPrefix("abc", 5))
	require.Equal(t, "ab", ValidPrefix("abc", 2))
	require.Equal(t, "a", ValidPrefix("aé", 2))
	require.Equal(t, "aé", ValidPrefix("aé", 3))
	require.Equal(t, "", ValidPrefix("€", 2))
}

// valuer is a custom driver.Valuer.
type valuer struct{ cents int64 }

func (v valuer) Value() (driver.Value, error) {
	return fmt.Sprintf("%d.%02d", v.cents/100, v.cents%100), nil
}

// TestDisplayShowsValuesNotAddresses: a value delivered through pointers
// (any depth), sql.Null* or another driver.Valuer shows as the value it
// delivers, a nil pointer or an invalid sql.Null* as NULL; pointers
// inside composites are followed too; never a Go address.
func TestDisplayShowsValuesNotAddresses(t *testing.T) {
	t.Parallel()
	n := 70000
	str := "x"
	ps := &str
	when := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		v    any
		want string
	}{
		{&n, "70000"},
		{&ps, "x"},
		{(*int)(nil), "NULL"},
		{(**string)(nil), "NULL"},
		{sql.NullInt64{Int64: 70000, Valid: true}, "70000"},
		{&sql.NullInt64{Int64: 70000, Valid: true}, "70000"},
		{sql.NullInt64{}, "NULL"},
		{sql.NullString{String: "abc", Valid: true}, "abc"},
		{sql.Null[int]{V: 5, Valid: true}, "5"},
		{valuer{12345}, "123.45"},
		{&valuer{12345}, "123.45"},
		{(*valuer)(nil), "NULL"},
		{&when, "2026-01-02T03:04:05Z"},
		{sql.NullTime{Time: when, Valid: true}, "2026-01-02T03:04:05Z"},
		{&struct{ A int }{3}, "{3}"},
		{struct{ P *int }{&n}, "{70000}"},
		{[]*int{&n, nil}, "[70000 <nil>]"},
		{big.NewInt(42), "42"},
		// No value but an address: the type only, at any depth.
		{make(chan int), "(chan int)"},
		{func() {}, "(func())"},
		{unsafe.Pointer(&n), "(unsafe.Pointer)"},
		{[]any{1, make(chan int), "x"}, "[1 (chan int) x]"},
		{map[string]any{"f": func() {}}, "map[f:(func())]"},
		{struct {
			C chan int
			P unsafe.Pointer
		}{make(chan int), unsafe.Pointer(&n)}, "{(chan int) (unsafe.Pointer)}"},
		{&struct{ F func(int) error }{func(int) error { return nil }}, "{(func(int) error)}"},
	} {
		got := Display(c.v)
		require.Equal(t, c.want, got, "%T", c.v)
		require.NotContains(t, got, "0x", "%T", c.v)
	}
}

// TestJSONShowsValuerValues: the raw row of a rejected row holds the
// value a driver.Valuer delivers, and a pointer's element.
func TestJSONShowsValuerValues(t *testing.T) {
	t.Parallel()
	n := 70000
	got := JSON([]string{"a", "b", "c", "d"}, []any{sql.NullInt64{Int64: 70000, Valid: true}, &n, sql.NullString{}, valuer{250}}, nil)
	require.JSONEq(t, `{"a": 70000, "b": 70000, "c": null, "d": "2.50"}`, string(got))
}
