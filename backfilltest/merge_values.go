package backfilltest

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Value helpers of the fake Merger: how it compares, orders and prints the
// values it stores as given. They approximate PostgreSQL for the types the
// suite uses (text as string, bigint as int64, timestamptz as time.Time)
// and a few more.

// sameValue is the merger's change detection, the equality rule of the
// PostgreSQL merger (package backfill, "Equality") for the values the
// fakes store as given: nil equals nil only, times are equal when they
// are the same instant, integers of any Go integer type when their values
// are, floats when their bits are.
func sameValue(a, b any) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if x, ok := integerText(a); ok {
		y, ok := integerText(b)
		return ok && x == y
	}
	switch x := a.(type) {
	case time.Time:
		y, ok := b.(time.Time)
		return ok && x.Equal(y)
	case []byte:
		y, ok := b.([]byte)
		return ok && bytes.Equal(x, y)
	case float64:
		// Byte for byte, as the PostgreSQL merger compares floats
		// (float8send): -0 is not 0, NaN is NaN.
		y, ok := b.(float64)
		return ok && math.Float64bits(x) == math.Float64bits(y)
	case float32:
		y, ok := b.(float32)
		return ok && math.Float32bits(x) == math.Float32bits(y)
	}
	return reflect.DeepEqual(a, b)
}

// numericKey returns the number numeric input text s stores as, without
// its scale ("1.0" and "1.00" give "1"), as numeric's equality compares
// it; s itself when it is not a finite number (NaN, infinities).
func numericKey(s string) string {
	if r, ok := new(big.Rat).SetString(strings.TrimSpace(s)); ok {
		return r.RatString()
	}
	return s
}

// integerText returns v's decimal text when v is of a Go integer type
// (named types included): int64(1) and int(1) are one value, as in a
// PostgreSQL integer column.
func integerText(v any) (string, bool) {
	rv := reflect.ValueOf(v)
	switch {
	case !rv.IsValid():
		return "", false
	case rv.CanInt():
		return strconv.FormatInt(rv.Int(), 10), true
	case rv.CanUint():
		return strconv.FormatUint(rv.Uint(), 10), true
	}
	return "", false
}

// compareValues orders two non-nil values of the same kind: times,
// strings (bytewise, like COLLATE "C"), integers, unsigned integers,
// floats. Other values cannot be ordered.
func compareValues(a, b any) (int, error) {
	switch x := a.(type) {
	case time.Time:
		if y, ok := b.(time.Time); ok {
			return x.Compare(y), nil
		}
	case string:
		if y, ok := b.(string); ok {
			return strings.Compare(x, y), nil
		}
	}
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	switch {
	case va.CanInt() && vb.CanInt():
		return cmp.Compare(va.Int(), vb.Int()), nil
	case va.CanUint() && vb.CanUint():
		return cmp.Compare(va.Uint(), vb.Uint()), nil
	case va.CanFloat() && vb.CanFloat():
		return cmp.Compare(va.Float(), vb.Float()), nil
	}
	return 0, fmt.Errorf("backfilltest: cannot order %T and %T values", a, b)
}

// scalarText is the PostgreSQL text output of a value, approximated:
// integers and floats in decimal, booleans as t/f, times as timestamptz
// in UTC ("2024-01-02 03:04:05+00"), bytes in hex ("\x0a"), anything
// else as fmt prints it.
func scalarText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case bool:
		if x {
			return "t"
		}
		return "f"
	case time.Time:
		return x.UTC().Format("2006-01-02 15:04:05.999999") + "+00"
	case []byte:
		return `\x` + hex.EncodeToString(x)
	}
	rv := reflect.ValueOf(v)
	switch {
	case rv.CanInt():
		return strconv.FormatInt(rv.Int(), 10)
	case rv.CanUint():
		return strconv.FormatUint(rv.Uint(), 10)
	case rv.CanFloat():
		return strconv.FormatFloat(rv.Float(), 'g', -1, 64)
	}
	return fmt.Sprint(v)
}

// recordText approximates PostgreSQL's text output of ROW(values...)
// (record_out): "(a,1,)" with NULL as nothing, and a value quoted, with "
// and \ doubled, when it is empty or holds one of "\(), or white space.
// NewerVersionWins compares these texts bytewise. The rendering of each
// value is scalarText's, so the order of rows matches the PostgreSQL
// merger's for text and integer columns; for other types it is a consistent
// order of its own.
func recordText(values []any) string {
	var b strings.Builder
	b.WriteByte('(')
	for i, v := range values {
		if i > 0 {
			b.WriteByte(',')
		}
		if v == nil {
			continue
		}
		s := scalarText(v)
		if s != "" && !strings.ContainsAny(s, "\"\\(), \t\n\v\f\r") {
			b.WriteString(s)
			continue
		}
		b.WriteByte('"')
		for _, r := range s {
			if r == '"' || r == '\\' {
				b.WriteRune(r)
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte(')')
	return b.String()
}

// jsonbText renders a row as PostgreSQL prints to_jsonb of it: keys
// ordered by length, then bytewise, as jsonb stores them, with ", " and
// ": " as separators; times as ISO 8601 in UTC ("2024-01-02T03:04:05+00:00"),
// bytes as "\x..." text.
func jsonbText(names []string, values []any) string {
	idx := make([]int, len(names))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(i, j int) int {
		return cmp.Or(cmp.Compare(len(names[i]), len(names[j])), strings.Compare(names[i], names[j]))
	})
	var b strings.Builder
	b.WriteByte('{')
	for n, i := range idx {
		if n > 0 {
			b.WriteString(", ")
		}
		b.WriteString(jsonValue(names[i]))
		b.WriteString(": ")
		b.WriteString(jsonValue(values[i]))
	}
	b.WriteByte('}')
	return b.String()
}

func jsonValue(v any) string {
	switch x := v.(type) {
	case time.Time:
		v = x.UTC().Format("2006-01-02T15:04:05.999999") + "+00:00"
	case []byte:
		v = scalarText(x)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return jsonValue(fmt.Sprint(v))
	}
	return strings.TrimSuffix(buf.String(), "\n")
}
