package pgconv

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
)

func convertInt2(col *Column, v, _ any) (any, string) {
	return intValue(col, v, math.MinInt16, math.MaxInt16, "smallint")
}

func convertInt4(col *Column, v, _ any) (any, string) {
	return intValue(col, v, math.MinInt32, math.MaxInt32, "integer")
}

func convertInt8(col *Column, v, _ any) (any, string) {
	return intValue(col, v, math.MinInt64, math.MaxInt64, "bigint")
}

// intValue converts v for an integer column of type name holding [lo,
// hi]; a value out of range is refused with the column's range.
func intValue(col *Column, v any, lo, hi int64, name string) (any, string) {
	n, reason := ToInt(v, lo, hi, name)
	switch {
	case strings.HasPrefix(reason, "out of range"):
		reason = fmt.Sprintf("out of range: %s column %q holds %d to %d", cmp.Or(col.Type, name), col.Name, lo, hi)
	case strings.HasPrefix(reason, "not an integer"):
		reason = fmt.Sprintf("not an integer: %s column %q holds whole numbers from %d to %d", cmp.Or(col.Type, name), col.Name, lo, hi)
	}
	return n, reason
}

// ToInt converts v to an int64 in [lo, hi]; name is the column type for
// reasons.
func ToInt(v any, lo, hi int64, name string) (any, string) {
	var n int64
	switch x := v.(type) {
	case int:
		n = int64(x)
	case int8:
		n = int64(x)
	case int16:
		n = int64(x)
	case int32:
		n = int64(x)
	case int64:
		n = x
	case uint8:
		n = int64(x)
	case uint16:
		n = int64(x)
	case uint32:
		n = int64(x)
	case uint:
		if uint64(x) > math.MaxInt64 {
			return nil, "out of range for type " + name
		}
		n = int64(x)
	case uint64:
		if x > math.MaxInt64 {
			return nil, "out of range for type " + name
		}
		n = int64(x)
	case float32, float64:
		// As PostgreSQL reads the text lib/pq would send: out of range
		// before a fraction (32769.5 is out of range for smallint).
		f, _ := toFloat(x, "double precision")
		switch {
		case math.IsNaN(f):
			return nil, "not an integer: type " + name + " holds whole numbers"
		case f < -0x1p63 || f >= 0x1p63 || f < float64(lo) || f > float64(hi): // int64 holds [-2^63, 2^63)
			return nil, "out of range for type " + name
		case f != math.Trunc(f):
			return nil, "not an integer: type " + name + " holds whole numbers"
		}
		n = int64(f)
	case string:
		p, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			if t := strings.Trim(x, Space); t != x && t != "" {
				return ToInt(t, lo, hi, name) // PostgreSQL skips surrounding whitespace
			}
			if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
				return nil, "out of range for type " + name
			}
			return nil, "invalid input syntax for type " + name
		}
		n = p
	case json.Number:
		p, err := x.Int64()
		if err != nil {
			return nil, "invalid input syntax for type " + name
		}
		n = p
	default:
		// Named types and Valuers, for callers that did not normalise.
		if norm, _, reason := normalize(v); reason == "" && norm != nil && reflect.TypeOf(norm) != reflect.TypeOf(v) {
			return ToInt(norm, lo, hi, name)
		}
		return nil, wrongType(v, name)
	}
	if n < lo || n > hi {
		return nil, "out of range for type " + name
	}
	return n, ""
}
