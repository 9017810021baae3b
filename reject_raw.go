package backfill

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgbackfill/backfill/internal/pgconv"
)

// Rejected rows keep what the extractor passed, whatever it is: a value
// that contains itself (a map holding itself, a slice holding itself, a
// pointer cycle), a value nested deeper than jsonb takes, or a huge one.
// Both renderings, jsonSafe for the exception's raw jsonb and boundedText
// for its value text, walk values with limits, so that no value can
// exhaust the stack or the memory of the process.
const (
	// maxRawDepth is how deep jsonSafe and boundedText follow nested maps,
	// slices, arrays, structs and pointers; deeper parts are replaced by
	// the marker "<too deep>".
	maxRawDepth = 32
	// maxRawNodes is how many values jsonSafe keeps for one rejected
	// value; the rest are replaced by the marker "<truncated>".
	maxRawNodes = 20_000
	// maxRawString is the most bytes of one string jsonSafe keeps (the
	// whole row's JSON is capped at maxRawJSON afterwards).
	maxRawString = 1 << 20
)

// Markers that replace the parts of a value that are not stored.
const (
	markCycle     = "<cycle>"
	markTooDeep   = "<too deep>"
	markTruncated = "<truncated>"
)

// rawWalk carries the limits of one jsonSafe or boundedText call: the
// values left to visit and the maps and slices on the path from the root
// (for cycles).
type rawWalk struct {
	nodes int
	path  []uintptr
}

// enter reports whether a map or slice whose data starts at p may be
// entered: it is not on the path already. The caller calls leave after.
func (w *rawWalk) enter(p uintptr) bool {
	if p != 0 && slices.Contains(w.path, p) {
		return false
	}
	w.path = append(w.path, p)
	return true
}

func (w *rawWalk) leave() { w.path = w.path[:len(w.path)-1] }

// jsonSafe returns v in a form that json.Marshal encodes as JSON jsonb
// takes: text with NUL bytes or invalid UTF-8 and non-finite floats as
// escaped text, maps and slices element by element, and any other value
// as its own JSON (json.RawMessage) unless that fails or jsonb would
// refuse it, in which case as its displayValue. Cycles, nesting deeper
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
		if len(x) > maxRawString {
			x = validPrefix(x, maxRawString) + "…"
		}
		if strings.IndexByte(x, 0) >= 0 || !utf8.ValidString(x) {
			return strconv.QuoteToASCII(x)
		}
		return x
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
		if depth >= maxRawDepth {
			return markTooDeep
		}
		if !w.enter(reflect.ValueOf(x).Pointer()) {
			return markCycle
		}
		defer w.leave()
		m := make(map[string]any, min(len(x), w.nodes+1))
		for k, e := range x {
			if w.nodes <= 0 {
				m[markTruncated] = fmt.Sprintf("%d more entries", len(x)-len(m))
				break
			}
			m[jsonSafeKey(k)] = w.safe(e, depth+1)
		}
		return m
	case []any:
		if depth >= maxRawDepth {
			return markTooDeep
		}
		if !w.enter(reflect.ValueOf(x).Pointer()) {
			return markCycle
		}
		defer w.leave()
		s := make([]any, min(len(x), w.nodes+1))
		for i := range s {
			s[i] = w.safe(x[i], depth+1)
		}
		return s
	}
	// Another type: encoding/json's own form, once the value is known to
	// be finite and shallow enough for it and for jsonb.
	shape := &rawWalk{nodes: w.nodes}
	if !shape.bounded(reflect.ValueOf(v), depth) {
		return displayValue(v) // boundedText, escaped
	}
	w.nodes = shape.nodes
	b, err := pgconv.MarshalJSON(v)
	if err != nil || !utf8.Valid(b) || pgconv.JSONBReason(b) != "" {
		return displayValue(v)
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
		if v.IsNil() {
			return true
		}
		if !w.enter(v.Pointer()) {
			return false
		}
		defer w.leave()
		return w.bounded(v.Elem(), depth+1)
	case reflect.Map:
		if v.IsNil() {
			return true
		}
		if !w.enter(v.Pointer()) {
			return false
		}
		defer w.leave()
		for it := v.MapRange(); it.Next(); {
			if !w.bounded(it.Key(), depth+1) || !w.bounded(it.Value(), depth+1) {
				return false
			}
		}
	case reflect.Slice:
		if v.IsNil() {
			return true
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return true // bytes: one value
		}
		if !w.enter(v.Pointer()) {
			return false
		}
		defer w.leave()
		fallthrough
	case reflect.Array:
		for i := range v.Len() {
			if !w.bounded(v.Index(i), depth+1) {
				return false
			}
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if !w.bounded(v.Field(i), depth+1) {
				return false
			}
		}
	}
	return true
}

// boundedText prints v as fmt's %v does (a value's String or Error method
// included), but never beyond about max bytes, nor deeper than
// maxRawDepth, and a map or slice that contains itself is printed as the
// marker "<cycle>" where it recurs: fmt.Sprint of such a value never
// returns.
func boundedText(v any, max int) string {
	p := &textPrinter{max: max}
	p.print(reflect.ValueOf(v), 0)
	s := p.b.String()
	if len(s) > max {
		s = validPrefix(s, max) + "…"
	}
	return s
}

type textPrinter struct {
	b   strings.Builder
	max int
	rawWalk
}

var (
	stringerType  = reflect.TypeFor[fmt.Stringer]()
	errorType     = reflect.TypeFor[error]()
	formatterType = reflect.TypeFor[fmt.Formatter]()
)

func (p *textPrinter) print(v reflect.Value, depth int) {
	if p.b.Len() > p.max {
		return
	}
	if !v.IsValid() {
		p.b.WriteString("<nil>")
		return
	}
	if depth > maxRawDepth {
		p.b.WriteString(markTooDeep)
		return
	}
	if t := v.Type(); v.CanInterface() && (t.Implements(stringerType) || t.Implements(errorType) || t.Implements(formatterType)) {
		// The value's own text (fmt turns a panic into text).
		fmt.Fprint(&p.b, v.Interface())
		return
	}
	switch v.Kind() {
	case reflect.Interface:
		if v.IsNil() {
			p.b.WriteString("<nil>")
			return
		}
		p.print(v.Elem(), depth)
	case reflect.Pointer:
		switch e := v.Type().Elem().Kind(); {
		case v.IsNil():
			p.b.WriteString("<nil>")
		case depth == 0 && (e == reflect.Struct || e == reflect.Map || e == reflect.Slice || e == reflect.Array):
			p.b.WriteByte('&')
			p.print(v.Elem(), depth+1)
		default:
			fmt.Fprintf(&p.b, "0x%x", v.Pointer())
		}
	case reflect.Map:
		if !p.enter(v.Pointer()) {
			p.b.WriteString(markCycle)
			return
		}
		defer p.leave()
		type entry struct{ k, v string }
		var entries []entry
		size := 0
		for it := v.MapRange(); it.Next() && p.b.Len()+size <= p.max; {
			// Each entry printed on its own, then sorted by key text: an
			// order that does not depend on the map's iteration.
			sub := &textPrinter{max: p.max - p.b.Len(), rawWalk: rawWalk{path: p.path}}
			sub.print(it.Key(), depth+1)
			k := sub.b.String()
			sub.b.Reset()
			sub.print(it.Value(), depth+1)
			entries = append(entries, entry{k, sub.b.String()})
			size += len(k) + sub.b.Len() + 2
		}
		slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.k, b.k) })
		p.b.WriteString("map[")
		for i, e := range entries {
			if i > 0 {
				p.b.WriteByte(' ')
			}
			p.b.WriteString(e.k)
			p.b.WriteByte(':')
			p.b.WriteString(e.v)
			if p.b.Len() > p.max {
				return
			}
		}
		p.b.WriteByte(']')
	case reflect.Slice:
		if v.IsNil() {
			p.b.WriteString("[]")
			return
		}
		if !p.enter(v.Pointer()) {
			p.b.WriteString(markCycle)
			return
		}
		defer p.leave()
		fallthrough
	case reflect.Array:
		p.b.WriteByte('[')
		for i := range v.Len() {
			if i > 0 {
				p.b.WriteByte(' ')
			}
			p.print(v.Index(i), depth+1)
			if p.b.Len() > p.max {
				return
			}
		}
		p.b.WriteByte(']')
	case reflect.Struct:
		p.b.WriteByte('{')
		for i := range v.NumField() {
			if i > 0 {
				p.b.WriteByte(' ')
			}
			p.print(v.Field(i), depth+1)
			if p.b.Len() > p.max {
				return
			}
		}
		p.b.WriteByte('}')
	case reflect.String:
		p.b.WriteString(validPrefix(v.String(), p.max-p.b.Len()+1))
	default:
		// A scalar: fmt prints a reflect.Value as the value it holds.
		fmt.Fprint(&p.b, v)
	}
}

// validPrefix returns the longest prefix of s of at most n bytes that
// does not cut a UTF-8 sequence.
func validPrefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for i := 0; i < utf8.UTFMax && len(s) > 0; i++ {
		r, size := utf8.DecodeLastRuneInString(s)
		if r != utf8.RuneError || size > 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}

// maxDisplay is the most bytes displayValue keeps.
const maxDisplay = 1000

// displayValue renders v for an exception's value column: text that
// PostgreSQL can store (NUL bytes and invalid UTF-8 are escaped), at most
// maxDisplay bytes. Composite values are printed like fmt's %v, bounded
// in depth and size and with cycles marked (see boundedText).
func displayValue(v any) string {
	var s string
	switch x := v.(type) {
	case nil:
		return "NULL"
	case string:
		s = x
	case []byte:
		s = string(x)
	case json.RawMessage:
		s = string(x)
	case time.Time:
		s = x.Format(time.RFC3339Nano)
	default:
		s = boundedText(x, maxDisplay)
	}
	if strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
		s = strconv.QuoteToASCII(s)
	}
	if len(s) > maxDisplay {
		s = s[:maxDisplay]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return s
}

// maxRawJSON caps the JSON of a rejected row in the exception queue;
// larger rows are stored as truncatedJSON.
const maxRawJSON = 64 << 10

// rawJSON renders a rejected row for the exception queue as jsonb-safe
// JSON: an object of column to value when names are given, else raw
// itself. A value that JSON or jsonb cannot hold is stored as its
// displayValue text, and only that value; a row whose JSON is longer than
// maxRawJSON is stored as truncatedJSON.
func rawJSON(names []string, values []any, raw any) json.RawMessage {
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
		b, _ = json.Marshal(displayValue(raw))
	}
	if len(b) > maxRawJSON {
		return truncatedJSON(b)
	}
	return b
}

// truncatedJSON stores b, JSON longer than maxRawJSON, as
// {"truncated":true,"bytes":len(b),"prefix":"<the start of b as text>"},
// with the longest prefix that keeps the whole within maxRawJSON bytes.
func truncatedJSON(b []byte) json.RawMessage {
	head := `{"truncated":true,"bytes":` + strconv.Itoa(len(b)) + `,"prefix":"`
	const tail = `"}`
	out := make([]byte, 0, maxRawJSON)
	out = append(out, head...)
	limit := maxRawJSON - len(tail)
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
