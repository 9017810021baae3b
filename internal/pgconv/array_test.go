package pgconv

import (
	"math"
	"math/big"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConvertGoSlicesToArrays: a Go slice or array written to an array
// column is array text, each element converted for the element type;
// a type no element can be is a type mismatch, a bad element value a
// reason for the row.
func TestConvertGoSlicesToArrays(t *testing.T) {
	t.Parallel()
	s := "x"
	for _, c := range []struct {
		col  Column
		in   any
		want any
	}{
		{col("_int4"), []int64{1, -2}, "{1,-2}"},
		{col("_int8"), [2]int{3, 4}, "{3,4}"},
		{col("_float8"), []float64{1.5, math.Inf(1), math.Inf(-1)}, "{1.5,Infinity,-Infinity}"},
		{col("_bool"), []bool{true, false}, "{t,f}"},
		{col("_text"), []string{`a"b`, `c\d`, "", "NULL"}, `{"a\"b","c\\d","","NULL"}`},
		{col("_text"), []*string{&s, nil}, `{"x",NULL}`},
		{col("_text"), []any{"y", nil}, `{"y",NULL}`},
		{col("_int8"), []any{int32(5), nil}, "{5,NULL}"},
		{col("_int4"), [][]int64{{1, 2}, {3, 4}}, "{{1,2},{3,4}}"},
		{col("_int4"), [][]int64{{1}, nil}, "{{1},NULL}"},
		{col("_bytea"), [][]byte{{0xde, 0xad}, nil}, `{"\\xdead",NULL}`},
		{col("_int4"), []int64(nil), nil},
		{col("_numeric"), []*big.Rat{big.NewRat(1, 4)}, `{"0.25"}`},
	} {
		got, reason := Convert(c.col, c.in)
		require.Empty(t, reason, "%s %#v", c.col.BaseType, c.in)
		require.Equal(t, c.want, got, "%s %#v", c.col.BaseType, c.in)
	}
	_, reason := Convert(Column{Name: "c", Type: "integer[]", BaseType: "_int4"}, []struct{}{{}})
	require.True(t, TypeMismatch(reason), reason)
	require.Contains(t, reason, "Go type []struct {} is not supported for column type integer[] (element 1: ")
	_, reason = Convert(col("_int2"), []int64{1, 70000})
	require.False(t, TypeMismatch(reason), reason)
	require.Contains(t, reason, "array element 2: ")
	_, reason = Convert(Column{Name: "c", BaseType: "_int4", NotNull: true}, []int64(nil))
	require.Equal(t, "null value in NOT NULL column", reason)
	_, reason = Convert(col("_int4"), [][][][][][][]int64{{{{{{{1}}}}}}})
	require.Contains(t, reason, "more than 6 dimensions")
}

// TestRatDecimal: a *big.Rat with a finite decimal expansion is its
// exact decimal text; another is refused naming why (a value reason, not
// a type mismatch).
func TestRatDecimal(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   *big.Rat
		want string
	}{{big.NewRat(3, 1), "3"}, {big.NewRat(1, 8), "0.125"}, {big.NewRat(-1, 40), "-0.025"}, {big.NewRat(7, 500), "0.014"}} {
		got, reason := Convert(col("numeric"), c.in)
		require.Empty(t, reason, c.in.String())
		require.Equal(t, c.want, got, c.in.String())
	}
	_, reason := Convert(col("numeric"), big.NewRat(1, 3))
	require.False(t, TypeMismatch(reason), reason)
	require.Contains(t, reason, "*big.Rat 1/3 has no finite decimal expansion")
	got, reason := Convert(col("numeric"), (*big.Rat)(nil))
	require.Empty(t, reason)
	require.Nil(t, got)
}
