package pgconv

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestToInt: every Go integer type, floats, text and json.Number, each
// checked against the range as PostgreSQL's integer input checks it.
func TestToInt(t *testing.T) {
	t.Parallel()
	type qty int16
	for _, c := range []struct {
		in     any
		lo, hi int64
		want   any
		reason string
	}{
		{int8(-8), math.MinInt16, math.MaxInt16, int64(-8), ""},
		{int16(16), math.MinInt16, math.MaxInt16, int64(16), ""},
		{int32(32), math.MinInt16, math.MaxInt16, int64(32), ""},
		{int32(1 << 20), math.MinInt16, math.MaxInt16, nil, "out of range for type t"},
		{7, math.MinInt16, math.MaxInt16, int64(7), ""},
		{uint8(8), math.MinInt16, math.MaxInt16, int64(8), ""},
		{uint16(16), math.MinInt16, math.MaxInt16, int64(16), ""},
		{uint32(32), math.MinInt16, math.MaxInt16, int64(32), ""},
		{uint(9), math.MinInt64, math.MaxInt64, int64(9), ""},
		{uint64(math.MaxInt64), math.MinInt64, math.MaxInt64, int64(math.MaxInt64), ""},
		{uint64(math.MaxInt64 + 1), math.MinInt64, math.MaxInt64, nil, "out of range for type t"},
		{uint(math.MaxUint64), math.MinInt64, math.MaxInt64, nil, "out of range for type t"},
		{2.0, math.MinInt16, math.MaxInt16, int64(2), ""},
		{float32(-3), math.MinInt16, math.MaxInt16, int64(-3), ""},
		{32769.5, math.MinInt16, math.MaxInt16, nil, "out of range for type t"}, // range before fraction
		{2.5, math.MinInt16, math.MaxInt16, nil, "not an integer: type t holds whole numbers"},
		{math.NaN(), math.MinInt16, math.MaxInt16, nil, "not an integer: type t holds whole numbers"},
		{-0x1p63, math.MinInt64, math.MaxInt64, int64(math.MinInt64), ""},
		{0x1p63, math.MinInt64, math.MaxInt64, nil, "out of range for type t"},
		{math.Inf(1), math.MinInt64, math.MaxInt64, nil, "out of range for type t"},
		{"42", math.MinInt16, math.MaxInt16, int64(42), ""},
		{" \t-42\n", math.MinInt16, math.MaxInt16, int64(-42), ""},
		{"99999", math.MinInt16, math.MaxInt16, nil, "out of range for type t"},
		{"99999999999999999999", math.MinInt64, math.MaxInt64, nil, "out of range for type t"},
		{" 99999999999999999999 ", math.MinInt64, math.MaxInt64, nil, "out of range for type t"},
		{"4x", math.MinInt16, math.MaxInt16, nil, "invalid input syntax for type t"},
		{"  ", math.MinInt16, math.MaxInt16, nil, "invalid input syntax for type t"},
		{json.Number("12"), math.MinInt16, math.MaxInt16, int64(12), ""},
		{json.Number("1.5"), math.MinInt16, math.MaxInt16, nil, "invalid input syntax for type t"},
		{qty(5), math.MinInt16, math.MaxInt16, int64(5), ""},
		{true, math.MinInt16, math.MaxInt16, nil, "wrong type bool for t column"},
	} {
		got, reason := ToInt(c.in, c.lo, c.hi, "t")
		require.Equal(t, c.reason, reason, "%T %v", c.in, c.in)
		require.Equal(t, c.want, got, "%T %v", c.in, c.in)
	}
}
