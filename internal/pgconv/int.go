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
	n, reason := toInt64(v, lo, hi, name)
	if reason != "" {
		return nil, reason
	}
	if n < lo || n > hi {
		return nil, "out of range for type " + name
	}
	if _, ok := v.(int64); ok {
		return v, "" // the int64 as it came, without boxing it again
	}
	return n, ""
}

// toInt64 converts v to an int64, checking only what its type needs:
// floats against [lo, hi] before their fraction, as PostgreSQL reads
// them.
func toInt64(v any, lo, hi int64, name string) (int64, string) {
	if n, ok := fixedInt(v); ok {
		return n, ""
	}
	switch x := v.(type) {
	case uint:
		return uintToInt(uint64(x), name)
	case uint64:
		return uintToInt(x, name)
	case float32, float64:
		return floatToInt(x, lo, hi, name)
	case string:
		return textToInt(x, name)
	case json.Number:
		p, err := x.Int64()
		if err != nil {
			return 0, "invalid input syntax for type " + name
		}
		return p, ""
	}
	// Named types and Valuers, for callers that did not normalise.
	if norm, _, reason := normalize(v); reason == "" && norm != nil && reflect.TypeOf(norm) != reflect.TypeOf(v) {
		return toInt64(norm, lo, hi, name)
	}
	return 0, wrongType(v, name)
}

// fixedInt returns v as an int64 when v is of a Go integer type that
// always fits.
func fixedInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case int:
		return int64(x), true
	case int32:
		return int64(x), true
	case int16:
		return int64(x), true
	case int8:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint8:
		return int64(x), true
	}
	return 0, false
}

// uintToInt converts x, refusing values above the int64 range.
func uintToInt(x uint64, name string) (int64, string) {
	if x > math.MaxInt64 {
		return 0, "out of range for type " + name
	}
	return int64(x), ""
}

// floatToInt converts x, a float32 or float64, as PostgreSQL reads the
// text lib/pq would send: out of range before a fraction (32769.5 is out
// of range for smallint).
func floatToInt(x any, lo, hi int64, name string) (int64, string) {
	f, _ := toFloat(x, "double precision")
	switch {
	case math.IsNaN(f):
		return 0, "not an integer: type " + name + " holds whole numbers"
	case f < -0x1p63 || f >= 0x1p63 || f < float64(lo) || f > float64(hi): // int64 holds [-2^63, 2^63)
		return 0, "out of range for type " + name
	case f != math.Trunc(f):
		return 0, "not an integer: type " + name + " holds whole numbers"
	}
	return int64(f), ""
}

// textToInt reads x as PostgreSQL's integer input does, surrounding
// whitespace skipped.
func textToInt(x, name string) (int64, string) {
	p, err := strconv.ParseInt(x, 10, 64)
	if err == nil {
		return p, ""
	}
	if t := strings.Trim(x, Space); t != x && t != "" {
		return textToInt(t, name)
	}
	if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
		return 0, "out of range for type " + name
	}
	return 0, "invalid input syntax for type " + name
}
