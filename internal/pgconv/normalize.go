package pgconv

import (
	"database/sql/driver"
	"fmt"
	"math/big"
	"reflect"
	"strings"
	"time"
)

// maxNormalizeDepth bounds the driver.Valuer calls and pointer
// dereferences of normalize (a Valuer that returns itself).
const maxNormalizeDepth = 16

var (
	timeType  = reflect.TypeFor[time.Time]()
	uuidType  = reflect.TypeFor[[16]byte]()
	bytesType = reflect.TypeFor[[]byte]()
)

// normalize reduces v, a value of a type outside Convert's fast
// path, to one of nil, string, int64, uint64, float64, float32, bool,
// time.Time, []byte or [16]byte, in this order of rules:
//
//   - a driver.Valuer gives its Value (sql.NullString, decimal types),
//     which is reduced in turn; sql.Null[T] gives V (or NULL) unconverted;
//   - a nil pointer is NULL, another pointer its element;
//   - a named type of a basic kind gives the basic value (type Code string,
//     type Qty int64, a named []byte, a [16]byte-kind UUID); a struct
//     convertible to time.Time the time;
//   - any other fmt.Stringer gives its String (big.Int, decimal types;
//     *big.Float its exact text, its String rounds to 10 digits).
//
// Anything else is returned unchanged (and rejected as the wrong type by
// the column's conversion). src is v after Valuer calls and dereferences
// only: the type a column may treat specially (time.Duration for
// interval, a named type's String for text, any value for json).
func normalize(v any) (norm, src any, reason string) {
	var ptr any // the last pointer dereferenced, for its String method
	for range maxNormalizeDepth {
		switch x := v.(type) {
		case nil:
			return nil, nil, ""
		case string, int64, int, int32, int16, int8, uint, uint64, uint32, uint16, uint8,
			float64, float32, bool, time.Time, []byte, [16]byte:
			return basic(v), v, ""
		case *big.Float:
			if x == nil {
				return nil, nil, ""
			}
			s := x.Text('g', -1)
			return s, v, ""
		case driver.Valuer:
			rv := reflect.ValueOf(v)
			if rv.Kind() == reflect.Pointer && rv.IsNil() {
				return nil, nil, ""
			}
			if t := rv.Type(); t.PkgPath() == "database/sql" && strings.HasPrefix(t.Name(), "Null[") {
				// sql.Null[T]: its Value converts V as database/sql
				// would (a time.Duration to int64, a [16]byte refused);
				// take V itself.
				if !rv.FieldByName("Valid").Bool() {
					return nil, nil, ""
				}
				v = rv.FieldByName("V").Interface()
				continue
			}
			dv, err := callValue(x)
			if err != nil {
				return nil, nil, fmt.Sprintf("%T.Value failed: %v", v, err)
			}
			v = dv
			continue
		}
		rv := reflect.ValueOf(v)
		if rv.Kind() == reflect.Pointer {
			if rv.IsNil() {
				return nil, nil, ""
			}
			ptr = v
			v = rv.Elem().Interface()
			continue
		}
		norm, reason := byKind(rv, v, ptr)
		return norm, v, reason
	}
	return nil, nil, fmt.Sprintf("Go type %T: more than %d levels of driver.Valuer or pointer", v, maxNormalizeDepth)
}

// callValue calls v.Value, turning a panic (a nil receiver inside a
// non-nil interface, say) into an error.
func callValue(v driver.Valuer) (dv driver.Value, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return v.Value()
}

// callString calls s.String, turning a panic into a reason.
func callString(s fmt.Stringer) (str, reason string) {
	defer func() {
		if r := recover(); r != nil {
			reason = fmt.Sprintf("%T.String failed: panic: %v", s, r)
		}
	}()
	return s.String(), ""
}

// basic widens the small built-in integer types to int64 or uint64 and
// returns other values unchanged.
func basic(v any) any {
	switch x := v.(type) {
	case int16:
		return int64(x)
	case int8:
		return int64(x)
	case uint32:
		return int64(x)
	case uint16:
		return int64(x)
	case uint8:
		return int64(x)
	case uint:
		return uint64(x)
	}
	return v
}

// byKind reduces a named type to its basic kind (see normalize); ptr is
// the pointer v was reached through, or nil.
func byKind(rv reflect.Value, v, ptr any) (any, string) {
	switch rv.Kind() {
	case reflect.String:
		return rv.String(), ""
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), ""
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return rv.Uint(), ""
	case reflect.Float32:
		return float32(rv.Float()), ""
	case reflect.Float64:
		return rv.Float(), ""
	case reflect.Bool:
		return rv.Bool(), ""
	case reflect.Slice:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			return rv.Bytes(), ""
		}
	case reflect.Array:
		if rv.Type().ConvertibleTo(uuidType) {
			return rv.Convert(uuidType).Interface(), ""
		}
	case reflect.Struct:
		if rv.Type().ConvertibleTo(timeType) {
			return rv.Convert(timeType).Interface(), ""
		}
	}
	if s, ok := v.(fmt.Stringer); ok {
		return callString(s)
	}
	if s, ok := ptr.(fmt.Stringer); ok {
		return callString(s)
	}
	return v, ""
}
