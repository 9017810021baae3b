package valuedump

import (
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
)

// FuncName returns the symbol name of function value f ("nil" for nil).
func FuncName(f reflect.Value) string {
	if f.IsNil() {
		return "nil"
	}
	if fn := runtime.FuncForPC(f.Pointer()); fn != nil {
		return fn.Name()
	}
	return "func"
}

// HiddenConfig reports whether values of t hold what encoding/json does
// not show: unexported struct fields or functions.
func HiddenConfig(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Func:
		return true
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return HiddenConfig(t.Elem(), seen)
	case reflect.Map:
		return HiddenConfig(t.Key(), seen) || HiddenConfig(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if f := t.Field(i); !f.IsExported() || HiddenConfig(f.Type, seen) {
				return true
			}
		}
	}
	return false
}

// Dump writes a deterministic description of v: every field,
// exported or not, functions by symbol name, pointers followed (never
// their address), map entries sorted; at most 4 levels deep.
func Dump(b *strings.Builder, v reflect.Value, depth int) {
	if depth > 4 {
		b.WriteString("…")
		return
	}
	switch v.Kind() {
	case reflect.Invalid:
		b.WriteString("nil")
	case reflect.Func:
		b.WriteString(FuncName(v))
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			b.WriteString("nil")
			return
		}
		Dump(b, v.Elem(), depth+1)
	case reflect.Struct:
		dumpStruct(b, v, depth)
	case reflect.Slice, reflect.Array:
		dumpList(b, v, depth)
	case reflect.Map:
		dumpMap(b, v, depth)
	default:
		dumpScalar(b, v)
	}
}

// dumpStruct writes the struct v as Dump does: "{Name:value ...}",
// every field in declaration order, each field at depth+1.
func dumpStruct(b *strings.Builder, v reflect.Value, depth int) {
	b.WriteString("{")
	for i := range v.NumField() {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(v.Type().Field(i).Name + ":")
		Dump(b, v.Field(i), depth+1)
	}
	b.WriteString("}")
}

// dumpList writes the slice or array v as Dump does: "[e ...]", its
// first 100 elements at most, each at depth+1.
func dumpList(b *strings.Builder, v reflect.Value, depth int) {
	b.WriteString("[")
	for i := range min(v.Len(), 100) {
		if i > 0 {
			b.WriteString(" ")
		}
		Dump(b, v.Index(i), depth+1)
	}
	b.WriteString("]")
}

// dumpMap writes the map v as Dump does: "map[k:v ...]", the entries
// (keys and values at depth+1) sorted by their text.
func dumpMap(b *strings.Builder, v reflect.Value, depth int) {
	entries := make([]string, 0, v.Len())
	for it := v.MapRange(); it.Next(); {
		var e strings.Builder
		Dump(&e, it.Key(), depth+1)
		e.WriteString(":")
		Dump(&e, it.Value(), depth+1)
		entries = append(entries, e.String())
	}
	slices.Sort(entries)
	b.WriteString("map[" + strings.Join(entries, " ") + "]")
}

// dumpScalar writes a value v of no other kind Dump handles: a
// channel or unsafe pointer by its type, a string quoted, a bool or a
// number in fmt's default format; nothing for any other kind.
func dumpScalar(b *strings.Builder, v reflect.Value) {
	switch v.Kind() {
	case reflect.Chan, reflect.UnsafePointer:
		b.WriteString(v.Type().String())
	case reflect.String:
		fmt.Fprintf(b, "%q", v.String())
	case reflect.Bool:
		fmt.Fprint(b, v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		fmt.Fprint(b, v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		fmt.Fprint(b, v.Uint())
	case reflect.Float32, reflect.Float64:
		fmt.Fprint(b, v.Float())
	case reflect.Complex64, reflect.Complex128:
		fmt.Fprint(b, v.Complex())
	}
}
