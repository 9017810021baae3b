package rawvalue

import (
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxDisplay is the most bytes Display keeps.
const MaxDisplay = 1000

// Display renders v for an exception's value column and for error
// texts: the value, never a Go address: pointers are followed to any
// depth (a nil one is NULL), a channel, a function or an unsafe.Pointer
// shows its type only ("(chan int)", at any depth), a driver.Valuer (sql.NullInt64, a custom
// type) shows its Value, a time.Time its RFC 3339 text, []byte its text.
// The result is text that PostgreSQL can store (NUL bytes and invalid
// UTF-8 are escaped), at most MaxDisplay bytes. Composite values are
// printed like fmt's %v, their pointers followed too, bounded in depth
// and size and with cycles marked (see boundedText).
func Display(v any) string {
	var s string
	switch x := Reduce(v).(type) {
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
		s = boundedText(x, MaxDisplay)
	}
	if strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
		s = strconv.QuoteToASCII(s)
	}
	if len(s) > MaxDisplay {
		s = s[:MaxDisplay]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return s
}

// Reduce returns the value v delivers: a driver.Valuer's Value (a nil
// pointer Valuer, or an invalid sql.Null*, is nil), the element of a
// pointer (nil for a nil one), in turn, at most 16 times; a value with a
// String or Error method of its own (a *big.Int) stays as it is, as does
// a Valuer whose Value fails or panics.
func Reduce(v any) any {
	for range 16 {
		switch x := v.(type) {
		case nil:
			return nil
		case time.Time, []byte, string:
			return v
		case driver.Valuer:
			rv := reflect.ValueOf(x)
			if rv.Kind() == reflect.Pointer && rv.IsNil() {
				return nil
			}
			val, ok := valuerValue(x)
			if !ok {
				return v
			}
			v = val
			continue
		case fmt.Stringer, error:
			// A pointer whose element has the method too (a *time.Time)
			// is followed; one whose method needs the pointer (a
			// *big.Int) is not.
			rv := reflect.ValueOf(v)
			if rv.Kind() != reflect.Pointer {
				return v
			}
			if rv.IsNil() {
				return nil
			}
			if et := rv.Type().Elem(); !et.Implements(stringerType) && !et.Implements(errorType) {
				return v
			}
			v = rv.Elem().Interface()
			continue
		}
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Pointer {
			return v
		}
		if rv.IsNil() {
			return nil
		}
		v = rv.Elem().Interface()
	}
	return v
}

// valuerValue calls x.Value; ok is false when it fails or panics.
func valuerValue(x driver.Valuer) (v any, ok bool) {
	defer func() {
		if recover() != nil {
			v, ok = nil, false
		}
	}()
	v, err := x.Value()
	return v, err == nil
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
		s = ValidPrefix(s, max) + "…"
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
		p.printPointer(v, depth)
	case reflect.Map:
		p.within(v, func() { p.printMap(v, depth) })
	case reflect.Slice:
		if v.IsNil() {
			p.b.WriteString("[]")
			return
		}
		p.within(v, func() { p.printElems("[", "]", v.Len(), v.Index, depth) })
	case reflect.Array:
		p.printElems("[", "]", v.Len(), v.Index, depth)
	case reflect.Struct:
		p.printElems("{", "}", v.NumField(), v.Field, depth)
	case reflect.String:
		p.b.WriteString(ValidPrefix(v.String(), p.max-p.b.Len()+1))
	case reflect.Chan, reflect.Func, reflect.UnsafePointer:
		// No value to show but an address: the type only.
		p.b.WriteString(TypeOnly(v.Type()))
	default:
		// A scalar: fmt prints a reflect.Value as the value it holds.
		fmt.Fprint(&p.b, v)
	}
}

// TypeOnly is how Display shows a value of type t that has no text but
// its address (a channel, a function, an unsafe.Pointer): its type in
// parentheses, such as "(chan int)".
func TypeOnly(t reflect.Type) string { return "(" + t.String() + ")" }

// within prints f() for v, a map or slice entered on the walk's path, or
// the marker "<cycle>" when v is on it already.
func (p *textPrinter) within(v reflect.Value, f func()) {
	if !p.enter(v.Pointer()) {
		p.b.WriteString(markCycle)
		return
	}
	defer p.leave()
	f()
}

// printPointer prints pointer v as the value it points to, at any depth
// (never its address): <nil> for a nil one; a pointer cycle ends at
// maxRawDepth.
func (p *textPrinter) printPointer(v reflect.Value, depth int) {
	if v.IsNil() {
		p.b.WriteString("<nil>")
		return
	}
	p.print(v.Elem(), depth+1)
}

// printMap prints map v as map[k:v ...], its entries sorted by key text.
func (p *textPrinter) printMap(v reflect.Value, depth int) {
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
}

// printElems prints the n elements elem(0..n-1) between open and close,
// separated by spaces, stopping once the text is past max.
func (p *textPrinter) printElems(open, close string, n int, elem func(int) reflect.Value, depth int) {
	p.b.WriteString(open)
	for i := range n {
		if i > 0 {
			p.b.WriteByte(' ')
		}
		p.print(elem(i), depth+1)
		if p.b.Len() > p.max {
			return
		}
	}
	p.b.WriteString(close)
}

// ValidPrefix returns the longest prefix of s of at most n bytes that
// does not cut a UTF-8 sequence.
func ValidPrefix(s string, n int) string {
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
