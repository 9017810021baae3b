package rawvalue

import (
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/pgbackfill/backfill/internal/pgconv"
)

// MaxJSON caps the JSON of a rejected row in the exception queue;
// larger rows are stored as truncatedJSON.
const MaxJSON = 64 << 10

// JSON renders a rejected row for the exception queue as jsonb-safe
// JSON: an object of column to value when names are given, else raw
// itself. A value that JSON or jsonb cannot hold is stored as its
// Display text, and only that value; a row whose JSON is longer than
// MaxJSON is stored as truncatedJSON.
func JSON(names []string, values []any, raw any) json.RawMessage {
	var obj any
	if names != nil {
		m := make(map[string]any, len(values))
		for i, v := range values {
			k := fmt.Sprintf("$%d", i+1)
			if i < len(names) {
				k = names[i]
			}
			m[jsonSafeKey(k)] = jsonSafe(v)
		}
		obj = m
	} else {
		obj = jsonSafe(raw)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		// Not expected: jsonSafe returns values that marshal.
		b, _ = json.Marshal(Display(raw))
	}
	if len(b) > MaxJSON {
		return truncatedJSON(b)
	}
	return b
}

// truncatedJSON stores b, JSON longer than MaxJSON, as
// {"truncated":true,"bytes":len(b),"prefix":"<the start of b as text>"},
// with the longest prefix that keeps the whole within MaxJSON bytes.
func truncatedJSON(b []byte) json.RawMessage {
	head := `{"truncated":true,"bytes":` + strconv.Itoa(len(b)) + `,"prefix":"`
	const tail = `"}`
	out := make([]byte, 0, MaxJSON)
	out = append(out, head...)
	limit := MaxJSON - len(tail)
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		i += size
		var esc string
		switch {
		case r == '"':
			esc = `\"`
		case r == '\\':
			esc = `\\`
		case r == 0 || r == utf8.RuneError:
			esc = "\ufffd" // not expected in JSON text; jsonb refuses \u0000
		case r < 0x20:
			esc = fmt.Sprintf(`\u%04x`, r)
		default:
			esc = string(r)
		}
		if len(out)+len(esc) > limit {
			break
		}
		out = append(out, esc...)
	}
	return append(out, tail...)
}

func jsonSafeKey(k string) string {
	if strings.IndexByte(k, 0) >= 0 || !utf8.ValidString(k) {
		return strconv.QuoteToASCII(k)
	}
	return k
}

// jsonSafe returns v in a form that json.Marshal encodes as JSON jsonb
// takes: text with NUL bytes or invalid UTF-8 and non-finite floats as
// escaped text, maps and slices element by element, and any other value
// as its own JSON (json.RawMessage) unless that fails or jsonb would
// refuse it, in which case as its Display text. Cycles, nesting deeper
// than maxRawDepth and values beyond maxRawNodes are cut and marked (a
// value jsonSafe does not walk itself, such as a struct, that has any of
// them is stored as its boundedText).
func jsonSafe(v any) any {
	w := &rawWalk{nodes: maxRawNodes}
	return w.safe(v, 0)
}

func (w *rawWalk) safe(v any, depth int) any {
	if w.nodes--; w.nodes < 0 {
		return markTruncated
	}
	switch x := v.(type) {
	case nil, bool, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return v
	case string:
		return safeString(x)
	case []byte:
		return w.safe(string(x), depth)
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Sprint(x)
		}
		return x
	case float32:
		return w.safe(float64(x), depth)
	case map[string]any:
		return w.safeMap(x, depth)
	case []any:
		return w.safeSlice(x, depth)
	}
	if _, ok := v.(driver.Valuer); ok {
		// sql.NullInt64, a decimal type: the value it delivers.
		if r := Reduce(v); reflect.TypeOf(r) != reflect.TypeOf(v) {
			return w.safe(r, depth)
		}
	}
	return w.safeOther(v, depth)
}

// safeString is s, at most maxRawString bytes of it, escaped when it
// holds NUL bytes or invalid UTF-8.
func safeString(s string) string {
	if len(s) > maxRawString {
		s = ValidPrefix(s, maxRawString) + "…"
	}
	if strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
		return strconv.QuoteToASCII(s)
	}
	return s
}

// safeMap is m entry by entry, within the walk's limits.
func (w *rawWalk) safeMap(m map[string]any, depth int) any {
	if depth >= maxRawDepth {
		return markTooDeep
	}
	if !w.enter(reflect.ValueOf(m).Pointer()) {
		return markCycle
	}
	defer w.leave()
	out := make(map[string]any, min(len(m), w.nodes+1))
	for k, e := range m {
		if w.nodes <= 0 {
			out[markTruncated] = fmt.Sprintf("%d more entries", len(m)-len(out))
			break
		}
		out[jsonSafeKey(k)] = w.safe(e, depth+1)
	}
	return out
}

// safeSlice is s element by element, within the walk's limits.
func (w *rawWalk) safeSlice(s []any, depth int) any {
	if depth >= maxRawDepth {
		return markTooDeep
	}
	if !w.enter(reflect.ValueOf(s).Pointer()) {
		return markCycle
	}
	defer w.leave()
	out := make([]any, min(len(s), w.nodes+1))
	for i := range out {
		out[i] = w.safe(s[i], depth+1)
	}
	return out
}

// safeOther is v of another type: encoding/json's own form, once the
// value is known to be finite and shallow enough for it and for jsonb,
// else its Display text.
func (w *rawWalk) safeOther(v any, depth int) any {
	shape := &rawWalk{nodes: w.nodes}
	if !shape.bounded(reflect.ValueOf(v), depth) {
		return Display(v) // boundedText, escaped
	}
	w.nodes = shape.nodes
	b, err := pgconv.MarshalJSON(v)
	if err != nil || !utf8.Valid(b) || pgconv.JSONBReason(b) != "" {
		return Display(v)
	}
	return json.RawMessage(b)
}

// bounded reports whether v has no cycle, no nesting deeper than
// maxRawDepth (counting from depth) and at most w.nodes values, which it
// uses up.
func (w *rawWalk) bounded(v reflect.Value, depth int) bool {
	if w.nodes--; w.nodes < 0 || depth > maxRawDepth {
		return false
	}
	switch v.Kind() {
	case reflect.Interface:
		return v.IsNil() || w.bounded(v.Elem(), depth)
	case reflect.Pointer:
		return v.IsNil() || w.within(v, func() bool { return w.bounded(v.Elem(), depth+1) })
	case reflect.Map:
		return v.IsNil() || w.within(v, func() bool { return w.boundedMap(v, depth) })
	case reflect.Slice:
		if v.IsNil() || v.Type().Elem().Kind() == reflect.Uint8 {
			return true // nil, or bytes: one value
		}
		return w.within(v, func() bool { return w.boundedElems(v.Len(), v.Index, depth) })
	case reflect.Array:
		return w.boundedElems(v.Len(), v.Index, depth)
	case reflect.Struct:
		return w.boundedElems(v.NumField(), v.Field, depth)
	}
	return true
}

// within reports f() for v, a map, slice or pointer entered on the walk's
// path, and false when v is on it already (a cycle).
func (w *rawWalk) within(v reflect.Value, f func() bool) bool {
	if !w.enter(v.Pointer()) {
		return false
	}
	defer w.leave()
	return f()
}

// boundedMap reports whether every key and value of map v is bounded.
func (w *rawWalk) boundedMap(v reflect.Value, depth int) bool {
	for it := v.MapRange(); it.Next(); {
		if !w.bounded(it.Key(), depth+1) || !w.bounded(it.Value(), depth+1) {
			return false
		}
	}
	return true
}

// boundedElems reports whether the n elements elem(0..n-1) are bounded.
func (w *rawWalk) boundedElems(n int, elem func(int) reflect.Value, depth int) bool {
	for i := range n {
		if !w.bounded(elem(i), depth+1) {
			return false
		}
	}
	return true
}
