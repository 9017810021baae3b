package backfill

import (
	"cmp"
	"database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// convertValue checks that v can be stored in col and returns it in the
// form staged by COPY. A non-empty reason means the row must be rejected;
// it names what is wrong with the value (the caller adds chunk, row and
// column).
//
// v is first reduced to a built-in type by normalize (driver.Valuer,
// pointers, named types, fmt.Stringer). Columns of a type this function
// does not check (interval, time and timetz aside, which also take
// time.Duration and time.Time: enums, inet, arrays, ranges...) take
// text only, which PostgreSQL's input function reads; other Go values are
// rejected rather than sent in a form PostgreSQL might misread. Columns of
// unknown type (BaseType "", fakes) pass the reduced value through, except
// that NULL keys and text with NUL bytes or invalid UTF-8 are always
// rejected.
func convertValue(col Column, v any) (any, string) {
	src := v
	switch v.(type) {
	case nil, string, int64, int, int32, float64, bool, time.Time, []byte:
		// Built-in types need no normalisation: the fast path.
	default:
		var reason string
		if v, src, reason = normalize(v); reason != "" {
			return nil, reason
		}
	}
	if v == nil {
		switch {
		case col.Key:
			return nil, "missing key column: NULL business key value"
		case col.NotNull:
			return nil, "null value in NOT NULL column"
		}
		return nil, ""
	}
	switch col.BaseType {
	case "int2":
		return intValue(col, v, math.MinInt16, math.MaxInt16, "smallint")
	case "int4":
		return intValue(col, v, math.MinInt32, math.MaxInt32, "integer")
	case "int8":
		return intValue(col, v, math.MinInt64, math.MaxInt64, "bigint")
	case "float4", "float8":
		name := "double precision"
		if col.BaseType == "float4" {
			name = "real"
			if s, ok := v.(string); ok {
				// Rounded once, to the nearest real, as PostgreSQL
				// reads the text.
				v = float4Text(s)
			}
		}
		f, reason := toFloat(v, name)
		if reason != "" {
			return nil, floatReason(col, reason)
		}
		if col.BaseType == "float4" && !float4InRange(f) {
			return nil, floatReason(col, "out of range for type real")
		}
		return f, ""
	case "numeric":
		return toNumeric(v, col)
	case "bool":
		switch x := v.(type) {
		case bool:
			return x, ""
		case string:
			b, ok := parseBool(x)
			if !ok {
				return nil, "invalid boolean, want t/f, true/false, yes/no, on/off or 1/0"
			}
			return b, ""
		}
		return nil, wrongType(v, "boolean")
	case "text", "varchar", "bpchar", "name", "citext":
		s, reason := toText(v, src)
		if reason != "" {
			return nil, reason
		}
		if col.MaxLen > 0 && len(s) > col.MaxLen && utf8.RuneCountInString(strings.TrimRight(s, " ")) > col.MaxLen {
			return nil, fmt.Sprintf("value too long: %s column %q holds at most %d characters, got %d", cmpOr(col.Type, col.BaseType), col.Name, col.MaxLen, utf8.RuneCountInString(s))
		}
		if _, ok := v.(string); ok {
			return v, "" // the string as it came, without boxing it again
		}
		return s, ""
	case "date", "timestamp", "timestamptz":
		switch x := v.(type) {
		case time.Time:
			return convertTime(col, x)
		case string:
			return convertTimeText(col, x, v)
		}
		name := col.BaseType
		if name == "timestamptz" {
			name = "timestamp with time zone"
		}
		return nil, wrongType(v, name)
	case "time", "timetz":
		if x, ok := v.(time.Time); ok {
			// The wall clock of x in its own location (as lib/pq reads
			// a time column: on 0000-01-01), with its offset for timetz.
			if col.BaseType == "time" {
				return truncMicro(x).Format("15:04:05.999999"), ""
			}
			return truncMicro(x).Format("15:04:05.999999-07:00:00"), ""
		}
		if s, ok := textOf(v, src); ok {
			return textValue(s)
		}
		return nil, fmt.Sprintf("Go type %T is not supported for column type %s; write time.Time or text", src, cmpOr(col.Type, col.BaseType))
	case "uuid":
		switch x := v.(type) {
		case [16]byte:
			return formatUUID(x), ""
		case string:
			u, ok := parseUUID(x)
			if !ok {
				return nil, "invalid uuid"
			}
			// Canonical form, so that equal UUIDs have equal text.
			return formatUUID(u), ""
		}
		return nil, wrongType(v, "uuid")
	case "json", "jsonb":
		var b []byte
		switch x := src.(type) {
		case json.RawMessage:
			b = x
		case []byte:
			b = x
		case string:
			b = []byte(x)
		default:
			// Named types too: a named string is a JSON string, not JSON
			// text.
			var err error
			if b, err = marshalJSON(x); err != nil {
				var te *json.UnsupportedTypeError
				if errors.As(err, &te) && te.Type == reflect.TypeOf(x) {
					// A channel, a function, a complex number: never JSON.
					return nil, fmt.Sprintf("Go type %T cannot be encoded as json", x)
				}
				return nil, "cannot encode as json: " + err.Error()
			}
		}
		if !json.Valid(b) {
			return nil, "invalid json"
		}
		if !utf8.Valid(b) {
			return nil, "json is not valid UTF-8"
		}
		if col.BaseType == "jsonb" {
			if reason := jsonbReason(b); reason != "" {
				if strings.HasPrefix(reason, "jsonb number") {
					reason = fmt.Sprintf("%s: %s column %q holds numbers of at most %d digits before the decimal point and %d after",
						reason, cmpOr(col.Type, "jsonb"), col.Name, numericMaxExp10+1, numericMaxDscale)
				}
				return nil, reason
			}
		}
		return string(b), ""
	case "bytea":
		switch x := v.(type) {
		case []byte:
			return x, ""
		case string:
			return []byte(x), ""
		}
		return nil, wrongType(v, "bytea")
	case "interval":
		if d, ok := src.(time.Duration); ok {
			return formatInterval(d), ""
		}
		if s, ok := textOf(v, src); ok {
			return textValue(s)
		}
		return nil, fmt.Sprintf("Go type %T is not supported for column type %s; write time.Duration or text", src, cmp.Or(col.Type, col.BaseType))
	case "":
		// Unknown type (fakes): pass through, but never send text
		// PostgreSQL cannot store.
		if s, ok := textOf(v, src); ok {
			return textValue(s)
		}
		return v, ""
	}
	// A type not checked here: text only, read by PostgreSQL's input
	// function (a value it refuses is isolated and queued, see
	// backfill_isolate.go). Any other Go value might be sent in a form
	// PostgreSQL reads differently (time.Duration as nanoseconds into an
	// interval).
	if s, ok := textOf(v, src); ok {
		return textValue(s)
	}
	if strings.HasPrefix(col.BaseType, "_") {
		// An array column (pg_type names array types "_" + element):
		// a Go slice or array is rendered as array text.
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice || rv.Kind() == reflect.Array {
			return arrayValue(col, rv)
		}
	}
	return nil, fmt.Sprintf("Go type %T is not supported for column type %s; write text", src, cmp.Or(col.Type, col.BaseType))
}

// arrayValue renders rv, a Go slice or array ([]int64, []string,
// [][]float64, []*string, []any...) written to col, an array column, as
// PostgreSQL array text: each element converted by convertValue for the
// element type (so checked as a column of that type would check it),
// strings double-quoted with backslash and double quote escaped, numbers
// and booleans bare, NULL for nil elements, nested slices as
// sub-arrays. A nil slice is NULL. An element whose Go type can never fit
// the element type gives convertValue's reason, an extractor bug (see
// typeMismatch); an element value the type cannot hold, its reason for
// the row. Sub-arrays of unequal lengths are left to PostgreSQL, which
// refuses them (the row is queued, see backfill_isolate.go).
func arrayValue(col Column, rv reflect.Value) (any, string) {
	if rv.Kind() == reflect.Slice && rv.IsNil() {
		return convertValue(col, nil) // NULL, or why col cannot be NULL
	}
	elem := Column{Name: col.Name, BaseType: col.BaseType[1:]}
	if t, ok := strings.CutSuffix(col.Type, "[]"); ok {
		elem.Type = t // "character varying(3)[]": the element's declared type
	}
	var b strings.Builder
	if reason := appendArray(&b, elem, rv, 0); reason != "" {
		return nil, reason
	}
	return textValue(b.String())
}

// appendArray appends rv's elements as array text to b (see arrayValue).
func appendArray(b *strings.Builder, elem Column, rv reflect.Value, depth int) string {
	if depth >= 6 {
		return "array has more than 6 dimensions, PostgreSQL's limit"
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
		conv, reason := convertValue(elem, x)
		if reason != "" {
			if typeMismatch(reason) {
				// No element of this Go type fits: an extractor bug.
				return fmt.Sprintf("Go type %s is not supported for column type %s[] (element %d: %s)", rv.Type(), cmp.Or(elem.Type, elem.BaseType), i+1, reason)
			}
			return fmt.Sprintf("array element %d: %s", i+1, reason)
		}
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
	b.WriteByte('}')
	return ""
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

// maxNormalizeDepth bounds the driver.Valuer calls and pointer
// dereferences of normalize (a Valuer that returns itself).
const maxNormalizeDepth = 16

var (
	timeType  = reflect.TypeFor[time.Time]()
	uuidType  = reflect.TypeFor[[16]byte]()
	bytesType = reflect.TypeFor[[]byte]()
)

// normalize reduces v, a value of a type outside convertValue's fast
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
		case *big.Rat:
			if x == nil {
				return nil, nil, ""
			}
			s, reason := ratDecimal(x)
			return s, v, reason
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

// ratDecimal returns r as exact decimal text, or, when r has no finite
// decimal expansion (its reduced denominator has a prime factor other
// than 2 and 5, as 1/3), why it cannot be stored exactly. The reason is
// about the value, not the Go type: the row is queued.
func ratDecimal(r *big.Rat) (string, string) {
	if r.IsInt() {
		return r.Num().String(), ""
	}
	d := new(big.Int).Set(r.Denom())
	twos := int(d.TrailingZeroBits())
	d.Rsh(d, uint(twos))
	fives := 0
	five, q, rem := big.NewInt(5), new(big.Int), new(big.Int)
	for {
		q.QuoRem(d, five, rem)
		if rem.Sign() != 0 {
			break
		}
		d.Set(q)
		fives++
	}
	if d.Cmp(big.NewInt(1)) != 0 {
		return "", fmt.Sprintf("*big.Rat %s has no finite decimal expansion, and numeric and float columns store decimals: round it first (Rat.FloatString)", boundedText(r, 100))
	}
	return r.FloatString(max(twos, fives)), ""
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

// textOf returns v, a normalised value, as text when it is text: a
// string, or bytes (but the String of a named byte slice that has one,
// such as net.IP, whose bytes are not its text).
func textOf(v, src any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		if s, ok := src.(fmt.Stringer); ok && reflect.TypeOf(src) != bytesType {
			return s.String(), true
		}
		return string(x), true
	}
	return "", false
}

// truncMicro truncates t to whole microseconds, PostgreSQL's precision
// (PostgreSQL docs, 8.5 "Date/Time Types"). The rule is truncation, toward
// the past, never rounding: a value just below a chunk's end stays in that
// chunk, and the chunk check and the stored value agree. Nanosecond
// sources are normalised this way; coarser sources (milliseconds,
// seconds) are exact.
func truncMicro(t time.Time) time.Time {
	return t.Truncate(time.Microsecond)
}

// formatInterval renders d as interval input: whole microseconds,
// PostgreSQL's precision, truncated toward the past like truncMicro (so
// that t + d, truncated, is t + the stored interval for a stored t).
func formatInterval(d time.Duration) string {
	us := int64(d / time.Microsecond)
	if d%time.Microsecond < 0 {
		us--
	}
	return strconv.FormatInt(us, 10) + " microseconds"
}

// parseBool reads s as PostgreSQL's boolean input does: surrounding
// whitespace ignored, any case, and any prefix of true, false, yes or no,
// on, off (at least "of"), 1 or 0.
func parseBool(s string) (value, ok bool) {
	s = strings.Trim(s, " \t\n\v\f\r")
	prefixOf := func(word string, least int) bool {
		if len(s) < least || len(s) > len(word) {
			return false
		}
		for i := range len(s) {
			if c := s[i]; c != word[i] && c+'a'-'A' != word[i] {
				return false
			}
		}
		return true
	}
	if s == "" {
		return false, false
	}
	switch s[0] {
	case 't', 'T':
		return true, prefixOf("true", 1)
	case 'f', 'F':
		return false, prefixOf("false", 1)
	case 'y', 'Y':
		return true, prefixOf("yes", 1)
	case 'n', 'N':
		return false, prefixOf("no", 1)
	case 'o', 'O':
		if prefixOf("on", 2) {
			return true, true
		}
		return false, prefixOf("off", 2)
	case '1':
		return true, len(s) == 1
	case '0':
		return false, len(s) == 1
	}
	return false, false
}

// parseUUID reads s as PostgreSQL's uuid input does: 32 hex digits in
// any case, optionally in braces, with a hyphen allowed after any group
// of four digits but the last.
func parseUUID(s string) ([16]byte, bool) {
	var u [16]byte
	braces := len(s) > 0 && s[0] == '{'
	if braces {
		if s[len(s)-1] != '}' {
			return u, false
		}
		s = s[1 : len(s)-1]
	}
	j := 0
	for i := range u {
		if j+2 > len(s) {
			return u, false
		}
		hi, ok1 := unhex(s[j])
		lo, ok2 := unhex(s[j+1])
		if !ok1 || !ok2 {
			return u, false
		}
		u[i] = hi<<4 | lo
		j += 2
		if j < len(s) && s[j] == '-' && i%2 == 1 && i < len(u)-1 {
			j++
		}
	}
	return u, j == len(s)
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func formatUUID(u [16]byte) string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// jsonbReason says why PostgreSQL's jsonb input refuses b, valid JSON
// that the json type takes: a \u0000 escape (an escaped backslash
// followed by "u0000" is fine), a surrogate escape not in a high-low
// pair, or a number beyond the numeric format. "" when jsonb takes b.
func jsonbReason(b []byte) string {
	const unpaired = "jsonb cannot store an unpaired Unicode surrogate escape"
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			high := false // the previous character was a high surrogate escape
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] != '\\' || b[i+1] != 'u' {
					if high {
						return unpaired
					}
					if b[i] == '\\' {
						i++ // the escaped character, maybe a quote or backslash
					}
					continue
				}
				r, _ := strconv.ParseUint(string(b[i+2:i+6]), 16, 32)
				i += 5
				switch {
				case r == 0:
					return `jsonb cannot store \u0000`
				case r >= 0xd800 && r <= 0xdbff:
					if high {
						return unpaired
					}
					high = true
				case r >= 0xdc00 && r <= 0xdfff:
					if !high {
						return unpaired
					}
					high = false
				default:
					if high {
						return unpaired
					}
				}
			}
			if high {
				return unpaired
			}
		case c == '-' || c >= '0' && c <= '9':
			j := i + 1
			for j < len(b) && strings.IndexByte("0123456789.eE+-", b[j]) >= 0 {
				j++
			}
			if reason := numericReason(string(b[i:j]), 0, 0); reason != "" {
				return "jsonb number: " + reason
			}
			i = j - 1
		}
	}
	return ""
}

// limitNote returns, for a reason PostgreSQL gave while staging (see
// backfill_isolate.go) that says a value is out of range (SQLSTATE
// 22003, 22008, 22015), the reason with col's real limit appended, for
// the column types whose text the row writer leaves to PostgreSQL.
func limitNote(col Column, reason string) string {
	if !strings.Contains(reason, "(SQLSTATE 22003)") && !strings.Contains(reason, "(SQLSTATE 22008)") && !strings.Contains(reason, "(SQLSTATE 22015)") {
		return reason
	}
	typ := cmpOr(col.Type, col.BaseType)
	switch col.BaseType {
	case "interval":
		return fmt.Sprintf("%s: %s column %q holds months and days each from -2147483648 to 2147483647 (about ±178000000 years) and a time part from -2562047788:00:54.775808 to 2562047788:00:54.775807", reason, typ, col.Name)
	case "time", "timetz":
		return fmt.Sprintf("%s: %s column %q holds 00:00:00 to 24:00:00", reason, typ, col.Name)
	}
	return reason
}

// wrongType is the reason for a Go type that no value of can be stored in
// a column of type want (see typeMismatch).
func wrongType(v any, want string) string {
	return fmt.Sprintf("wrong type %T for %s column", v, want)
}

// typeMismatch reports whether reason, from convertValue, says that the
// value's Go type can never be stored in the column, whatever its value:
// an extractor bug ([ErrExtractor]) rather than bad data. Such reasons,
// and only they, begin "wrong type " (wrongType) or "Go type ".
func typeMismatch(reason string) bool {
	return strings.HasPrefix(reason, "wrong type ") || strings.HasPrefix(reason, "Go type ")
}

// toText returns v, a normalised value, as text for a text column (see
// textOf), checked by checkText.
func toText(v, src any) (string, string) {
	s, ok := textOf(v, src)
	if !ok {
		return "", wrongType(v, "text")
	}
	if reason := checkText(s); reason != "" {
		return "", reason
	}
	return s, ""
}

// checkText says why PostgreSQL cannot store text s, "" when it can.
func checkText(s string) string {
	if strings.IndexByte(s, 0) >= 0 {
		return "text contains a NUL byte"
	}
	if !utf8.ValidString(s) {
		return "text is not valid UTF-8"
	}
	return ""
}

// textValue is s as convertValue returns text: s, or the reason it cannot
// be stored.
func textValue(s string) (any, string) {
	if reason := checkText(s); reason != "" {
		return nil, reason
	}
	return s, ""
}

// intValue converts v for an integer column of type name holding [lo,
// hi]; a value out of range is refused with the column's range.
func intValue(col Column, v any, lo, hi int64, name string) (any, string) {
	n, reason := toInt(v, lo, hi, name)
	switch {
	case strings.HasPrefix(reason, "out of range"):
		reason = fmt.Sprintf("out of range: %s column %q holds %d to %d", cmpOr(col.Type, name), col.Name, lo, hi)
	case strings.HasPrefix(reason, "not an integer"):
		reason = fmt.Sprintf("not an integer: %s column %q holds whole numbers from %d to %d", cmpOr(col.Type, name), col.Name, lo, hi)
	}
	return n, reason
}

// floatReason names col and its range in an out-of-range reason of
// toFloat.
func floatReason(col Column, reason string) string {
	if !strings.HasPrefix(reason, "out of range") {
		return reason
	}
	if col.BaseType == "float4" {
		return fmt.Sprintf("out of range: %s column %q holds magnitudes from about 1.4e-45 to 3.4028235e+38, 0, ±Infinity and NaN", cmpOr(col.Type, "real"), col.Name)
	}
	return fmt.Sprintf("out of range: %s column %q holds magnitudes from about 4.9e-324 to 1.7976931348623157e+308, 0, ±Infinity and NaN", cmpOr(col.Type, "double precision"), col.Name)
}

// float4Text reads s, text for a real column, as PostgreSQL's float4 input
// does: rounded once to the nearest float32, which the returned float64
// holds exactly. Text it cannot read, or out of range, is returned
// unchanged for toFloat to give the reason.
func float4Text(s string) any {
	t := strings.Trim(s, pgSpace)
	f, err := strconv.ParseFloat(t, 32)
	if err != nil || f == 0 && !zeroMantissa(t) {
		return s
	}
	return f
}

// toInt converts v to an int64 in [lo, hi]; name is the column type for
// reasons.
func toInt(v any, lo, hi int64, name string) (any, string) {
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
			if t := strings.Trim(x, pgSpace); t != x && t != "" {
				return toInt(t, lo, hi, name) // PostgreSQL skips surrounding whitespace
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
			return toInt(norm, lo, hi, name)
		}
		return nil, wrongType(v, name)
	}
	if n < lo || n > hi {
		return nil, "out of range for type " + name
	}
	return n, ""
}

// toFloat converts v to a float64; name is the column type for reasons.
// Text that is not zero but reads as zero (1e-400) is out of range, as
// PostgreSQL says.
func toFloat(v any, name string) (float64, string) {
	switch x := v.(type) {
	case float64:
		return x, ""
	case float32:
		return float64(x), ""
	case int:
		return float64(x), ""
	case int32:
		return float64(x), ""
	case int64:
		return float64(x), ""
	case uint64:
		return float64(x), ""
	case string:
		f, err := strconv.ParseFloat(x, 64)
		if err != nil {
			if t := strings.Trim(x, pgSpace); t != x && t != "" {
				return toFloat(t, name) // PostgreSQL skips surrounding whitespace
			}
			if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
				return 0, "out of range for type " + name
			}
			return 0, "invalid input syntax for type " + name
		}
		if f == 0 && !zeroMantissa(x) {
			return 0, "out of range for type " + name
		}
		return f, ""
	case json.Number:
		return toFloat(string(x), name)
	}
	return 0, wrongType(v, "floating-point")
}

// zeroMantissa reports whether s, text strconv.ParseFloat read as zero,
// has only zero digits before its exponent (decimal or hexadecimal).
func zeroMantissa(s string) bool {
	s = strings.TrimLeft(s, "+-")
	hexa := len(s) > 1 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')
	if hexa {
		s = s[2:]
	}
	for _, c := range []byte(s) {
		switch {
		case !hexa && (c == 'e' || c == 'E'), hexa && (c == 'p' || c == 'P'):
			return true
		case c >= '1' && c <= '9', hexa && (c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'):
			return false
		}
	}
	return true
}

// float4InRange reports whether PostgreSQL's real input takes f as lib/pq
// sends it (the shortest decimal text of the float64): its nearest
// float32 must be neither infinite for a finite f nor zero for a non-zero
// f ("out of range for type real"). Denormals are taken.
func float4InRange(f float64) bool {
	if f == 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return true
	}
	if a := math.Abs(f); a > 1e-37 && a < 3e38 {
		return true
	}
	f32, _ := strconv.ParseFloat(strconv.FormatFloat(f, 'f', -1, 64), 32)
	return f32 != 0 && !math.IsInf(f32, 0)
}

// toNumeric validates v for a numeric column (precision 0 means
// unconstrained), including the checks that would otherwise fail the COPY
// (see numericReason). NaN is stored in any numeric column, ±Infinity
// (PostgreSQL 14 and later) in an unconstrained one: as float64 values or
// as the text PostgreSQL reads (NaN, Infinity, inf, any case, signed).
func toNumeric(v any, col Column) (any, string) {
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case json.Number:
		s = string(x)
	case float64:
		switch {
		case math.IsNaN(x):
			return "NaN", ""
		case math.IsInf(x, 1):
			return numericInfinity(col, "Infinity")
		case math.IsInf(x, -1):
			return numericInfinity(col, "-Infinity")
		}
		s = strconv.FormatFloat(x, 'f', -1, 64)
	case float32:
		return toNumeric(float64(x), col)
	case int64:
		s = strconv.FormatInt(x, 10)
	case int:
		s = strconv.Itoa(x)
	case uint64:
		s = strconv.FormatUint(x, 10)
	case int8, int16, int32, uint8, uint16, uint32, uint:
		s = fmt.Sprint(x)
	default:
		return nil, wrongType(v, "numeric")
	}
	reason := numericReason(s, col.Precision, col.Scale)
	if reason == errNumericSyntax {
		// The slow path: surrounding whitespace, NaN and infinities.
		t := strings.Trim(s, pgSpace)
		switch strings.ToLower(t) {
		case "nan":
			return "NaN", ""
		case "infinity", "+infinity", "inf", "+inf":
			return numericInfinity(col, "Infinity")
		case "-infinity", "-inf":
			return numericInfinity(col, "-Infinity")
		}
		if t != s && t != "" {
			return toNumeric(t, col)
		}
	}
	switch reason {
	case "":
	case errNumericFieldOverflow:
		return nil, fmt.Sprintf("numeric field overflow: %s column %q holds at most %s in absolute value", cmpOr(col.Type, "numeric"), col.Name, numericMax(col.Precision, col.Scale))
	case errNumericFormat:
		return nil, fmt.Sprintf("value overflows numeric format: %s column %q holds at most %d digits before the decimal point and %d after", cmpOr(col.Type, "numeric"), col.Name, numericMaxExp10+1, numericMaxDscale)
	default:
		return nil, reason
	}
	if _, ok := v.(string); ok {
		return v, "" // the string as it came, without boxing it again
	}
	return s, ""
}

// numericInfinity returns inf ("Infinity" or "-Infinity") for col, or
// why col cannot hold it: a numeric(p,s) column holds finite values only.
func numericInfinity(col Column, inf string) (any, string) {
	if col.Precision != 0 {
		return nil, fmt.Sprintf("numeric field overflow: %s column %q cannot hold %s; it holds at most %s in absolute value (only an unconstrained numeric holds infinities)",
			cmpOr(col.Type, "numeric"), col.Name, inf, numericMax(col.Precision, col.Scale))
	}
	return inf, ""
}

// numericMax is the largest value of numeric(p,s), in decimal: p nines,
// s of them after the point (s may be negative, or greater than p).
func numericMax(p, s int) string {
	nines := strings.Repeat("9", p)
	switch {
	case s <= 0:
		return nines + strings.Repeat("0", -s)
	case s >= p:
		return "0." + strings.Repeat("0", s-p) + nines
	}
	return nines[:p-s] + "." + nines[p-s:]
}

// Limits of PostgreSQL's numeric format (src/backend/utils/adt/numeric.c,
// PostgreSQL 15): at most 16383 digits after the point (dscale), a first
// significant digit at most at 10^131071 (weight 32767 in base 10000
// digits), and an exponent in input below INT_MAX/2 in absolute value.
const (
	numericMaxDscale   = 16383
	numericMaxExp10    = 131071
	numericMaxExponent = math.MaxInt32 / 2
)

const (
	errNumericSyntax        = "invalid input syntax for type numeric"
	errNumericFormat        = "value overflows numeric format"
	errNumericFieldOverflow = "numeric field overflow"
)

// numericReason checks s as PostgreSQL 15's numeric input reads it into
// numeric(p,s) (p 0: unconstrained): the syntax of decimalText; the
// format's limits, checked before the type modifier (1e-20000 overflows
// numeric(10,2) although it would round to 0.00); then, rounded half away
// from zero to the scale, the absolute value must be below 10^(p-s)
// ("numeric field overflow"). Plain decimals short enough are checked by
// the scan alone.
func numericReason(s string, p, sc int) string {
	d, ok := parseDecimal(s)
	if !ok {
		return errNumericSyntax
	}
	if d.plain && len(d.frac) <= numericMaxDscale {
		intDigits := len(strings.TrimLeft(d.int, "0"))
		if p == 0 && intDigits <= numericMaxExp10+1 ||
			p != 0 && (len(d.frac) <= sc && intDigits <= p-sc || intDigits+1 <= p-sc) {
			return ""
		}
	}
	if d.exp >= numericMaxExponent || d.exp <= -numericMaxExponent {
		return errNumericFormat
	}
	if int64(len(d.frac))-d.exp > numericMaxDscale {
		return errNumericFormat
	}
	sig, e10 := d.significant()
	if sig == "" {
		return "" // zero
	}
	if e10 > numericMaxExp10 {
		return errNumericFormat
	}
	if p == 0 {
		return ""
	}
	// Round to scale: keep the significant digits at 10^-sc and above.
	keep := e10 + int64(sc) + 1
	if keep <= 0 {
		// 0, or 10^-sc when rounded up: within any precision.
		return ""
	}
	if keep < int64(len(sig)) && sig[keep] >= '5' && strings.Trim(sig[:keep], "9") == "" {
		e10++ // 99.96 rounds to 100.0
	}
	if e10 >= int64(p-sc) {
		return errNumericFieldOverflow
	}
	return ""
}

// decimalText is numeric input text: [+-]digits[.digits] or [+-].digits,
// optionally with an exponent [eE][+-]digits.
type decimalText struct {
	int, frac string // the digits before and after the point
	exp       int64  // the exponent, saturated beyond ±2^40
	plain     bool   // no exponent
}

// parseDecimal splits s as decimalText.
func parseDecimal(s string) (d decimalText, ok bool) {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := func() string {
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return s[start:i]
	}
	d.int = digits()
	if i < len(s) && s[i] == '.' {
		i++
		d.frac = digits()
	}
	if d.int == "" && d.frac == "" {
		return d, false
	}
	if i == len(s) {
		d.plain = true
		return d, true
	}
	if s[i] != 'e' && s[i] != 'E' {
		return d, false
	}
	i++
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	e := digits()
	if e == "" || i != len(s) {
		return d, false
	}
	for _, c := range []byte(e) {
		if d.exp < 1<<40 {
			d.exp = d.exp*10 + int64(c-'0')
		}
	}
	if neg {
		d.exp = -d.exp
	}
	return d, true
}

// significant returns d's digits from the first non-zero one, and the
// power of ten of that digit; "" for zero.
func (d decimalText) significant() (string, int64) {
	if i := strings.IndexFunc(d.int, func(r rune) bool { return r != '0' }); i >= 0 {
		return d.int[i:] + d.frac, int64(len(d.int)-1-i) + d.exp
	}
	if i := strings.IndexFunc(d.frac, func(r rune) bool { return r != '0' }); i >= 0 {
		return d.frac[i:], int64(-1-i) + d.exp
	}
	return "", 0
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

// marshalJSON is json.Marshal, with a panicking MarshalJSON or String
// method an error.
func marshalJSON(v any) (b []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return json.Marshal(v)
}
