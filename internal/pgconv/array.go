package pgconv

import (
	"encoding/hex"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
)

// maxArrayDims is PostgreSQL's limit on an array's dimensions (MAXDIM).
const maxArrayDims = 6

// arrayValue renders rv, a Go slice or array ([]int64, []string,
// [][]float64, []*string, []any...) written to col, an array column, as
// PostgreSQL array text: each element converted by Convert for the
// element type (so checked as a column of that type would check it),
// strings double-quoted with backslash and double quote escaped, numbers
// and booleans bare, NULL for nil elements, nested slices as
// sub-arrays. A nil slice is NULL. An element whose Go type can never fit
// the element type gives Convert's reason, an extractor bug (see
// TypeMismatch); an element value the type cannot hold, its reason for
// the row. Sub-arrays of unequal lengths are left to PostgreSQL, which
// refuses them (the caller isolates and queues the row).
func arrayValue(col *Column, rv reflect.Value) (any, string) {
	if rv.Kind() == reflect.Slice && rv.IsNil() {
		return Convert(*col, nil) // NULL, or why col cannot be NULL
	}
	elem := Column{Name: col.Name, BaseType: col.BaseType[1:]}
	if t, ok := strings.CutSuffix(col.Type, "[]"); ok {
		elem.Type = t // "character varying(3)[]": the element's declared type
	}
	conv := For(elem)
	var b strings.Builder
	if reason := appendArray(&b, &conv, rv, 0); reason != "" {
		return nil, reason
	}
	return textValue(b.String())
}

// appendArray appends rv's elements as array text to b (see arrayValue),
// each converted by elem.
func appendArray(b *strings.Builder, elem *Converter, rv reflect.Value, depth int) string {
	if depth >= maxArrayDims {
		return fmt.Sprintf("array has more than %d dimensions, PostgreSQL's limit", maxArrayDims)
	}
	b.WriteByte('{')
	for i := range rv.Len() {
		if i > 0 {
			b.WriteByte(',')
		}
		e := rv.Index(i)
		for e.Kind() == reflect.Interface && !e.IsNil() {
			e = e.Elem()
		}
		if e.Kind() == reflect.Slice && e.IsNil() {
			b.WriteString("NULL") // a nil slice, []byte too, is NULL
			continue
		}
		if (e.Kind() == reflect.Slice || e.Kind() == reflect.Array) && e.Type().Elem().Kind() != reflect.Uint8 {
			if reason := appendArray(b, elem, e, depth+1); reason != "" {
				return reason
			}
			continue
		}
		var x any
		if e.IsValid() && (e.Kind() != reflect.Interface || !e.IsNil()) {
			x = e.Interface()
		}
		conv, reason := elem.Convert(x)
		if reason != "" {
			if TypeMismatch(reason) {
				// No element of this Go type fits: an extractor bug.
				return fmt.Sprintf("Go type %s is not supported for column type %s[] (element %d: %s)", rv.Type(), typeName(&elem.col, elem.col.BaseType), i+1, reason)
			}
			return fmt.Sprintf("array element %d: %s", i+1, reason)
		}
		appendArrayElem(b, conv)
	}
	b.WriteByte('}')
	return ""
}

// appendArrayElem appends conv, an element as Convert returned it, to b:
// NULL, numbers and booleans bare, anything else double-quoted.
func appendArrayElem(b *strings.Builder, conv any) {
	switch c := conv.(type) {
	case nil:
		b.WriteString("NULL")
	case int64:
		b.WriteString(strconv.FormatInt(c, 10))
	case float64:
		switch {
		case math.IsInf(c, 1):
			b.WriteString("Infinity")
		case math.IsInf(c, -1):
			b.WriteString("-Infinity")
		default:
			b.WriteString(strconv.FormatFloat(c, 'g', -1, 64))
		}
	case bool:
		if c {
			b.WriteByte('t')
		} else {
			b.WriteByte('f')
		}
	case []byte:
		quoteArrayElem(b, `\x`+hex.EncodeToString(c))
	case string:
		quoteArrayElem(b, c)
	default:
		quoteArrayElem(b, fmt.Sprint(c))
	}
}

// quoteArrayElem appends s to b as a double-quoted array element.
func quoteArrayElem(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
}
