// Package pgconv converts Go values for PostgreSQL columns: it checks that
// a value can be stored in a column of a given type and returns it in the
// form staged by COPY, or the reason PostgreSQL would refuse it. It is
// split per type family as pgx's pgtype is (int.go, float.go, numeric.go,
// text.go, bool.go, uuid.go, json.go, bytea.go, timestamp.go, time.go,
// interval.go); normalize.go reduces the caller's Go types to built-in
// ones first.
package pgconv

import (
	"cmp"
	"fmt"
	"strings"
	"time"
)

// Column is what conversion needs to know of a target column.
type Column struct {
	// Name is the column name, for reasons.
	Name string
	// Type is the declared type as format_type prints it, for reasons; ""
	// when unknown.
	Type string
	// BaseType is the type's name in pg_type ("varchar", "int8"); "" when
	// unknown, in which case values pass through (see Convert).
	BaseType string
	// MaxLen is the maximum length in characters of a varchar(n) or
	// char(n) column, 0 for none.
	MaxLen int
	// Precision and Scale are a numeric(p,s) column's; Precision is 0 for
	// an unconstrained numeric.
	Precision, Scale int
	// NotNull and Key refuse NULL.
	NotNull, Key bool
}

// Converter converts values for one column. Build it once per column with
// For; its Convert does the per-value work only.
type Converter struct {
	col  Column
	conv convertFunc
}

// convertFunc converts v, a non-nil value normalised by normalize (src
// is v before the reduction to a basic type), for col.
type convertFunc func(col *Column, v, src any) (any, string)

// families maps a base type to the converter of its family. A base type
// not in it takes text only (convertOther).
var families = map[string]convertFunc{
	"int2":        convertInt2,
	"int4":        convertInt4,
	"int8":        convertInt8,
	"float4":      convertFloat4,
	"float8":      convertFloat8,
	"numeric":     convertNumeric,
	"bool":        convertBool,
	"text":        convertText,
	"varchar":     convertText,
	"bpchar":      convertText,
	"name":        convertText,
	"citext":      convertText,
	"date":        convertTimestamp,
	"timestamp":   convertTimestamp,
	"timestamptz": convertTimestamp,
	"time":        convertTimeOfDay,
	"timetz":      convertTimeOfDay,
	"uuid":        convertUUID,
	"json":        convertJSON,
	"jsonb":       convertJSON,
	"bytea":       convertBytea,
	"interval":    convertInterval,
	"":            convertUnknown,
}

// For returns the converter of col, its family resolved once.
func For(col Column) Converter {
	conv, ok := families[col.BaseType]
	if !ok {
		conv = convertOther
	}
	return Converter{col: col, conv: conv}
}

// Convert checks that v can be stored in c's column and returns it in
// the form staged by COPY. A non-empty reason means the row must be
// rejected; it names what is wrong with the value (the caller adds chunk,
// row and column). A reason for which TypeMismatch is true means no value
// of v's Go type can be stored in the column.
//
// v is first reduced to a built-in type by normalize (driver.Valuer,
// pointers, named types, fmt.Stringer). Columns of a type no family
// checks (interval, time and timetz aside, which also take time.Duration
// and time.Time: enums, inet, arrays, ranges...) take text only, which
// PostgreSQL's input function reads; other Go values are rejected rather
// than sent in a form PostgreSQL might misread. Columns of unknown type
// (BaseType "", fakes) pass the reduced value through, except that NULL
// keys and text with NUL bytes or invalid UTF-8 are always rejected.
func (c *Converter) Convert(v any) (any, string) {
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
		case c.col.Key:
			return nil, "missing key column: NULL business key value"
		case c.col.NotNull:
			return nil, "null value in NOT NULL column"
		}
		return nil, ""
	}
	return c.conv(&c.col, v, src)
}

// Convert converts v for col (see Converter.Convert); a caller converting
// many values for one column builds its Converter once with For.
func Convert(col Column, v any) (any, string) {
	c := For(col)
	return c.Convert(v)
}

// typeName is col's declared type, or name when it is unknown.
func typeName(col *Column, name string) string {
	return cmp.Or(col.Type, name)
}

// convertOther converts v for a column of a type no family checks: text
// only, read by PostgreSQL's input function (a value it refuses is
// isolated and queued by the caller). Any other Go value might be sent in
// a form PostgreSQL reads differently (time.Duration as nanoseconds into
// an interval).
func convertOther(col *Column, v, src any) (any, string) {
	if s, ok := textOf(v, src); ok {
		return textValue(s)
	}
	return nil, fmt.Sprintf("Go type %T is not supported for column type %s; write text", src, typeName(col, col.BaseType))
}

// convertUnknown converts v for a column of unknown type (fakes): passed
// through, but never text PostgreSQL cannot store.
func convertUnknown(_ *Column, v, src any) (any, string) {
	if s, ok := textOf(v, src); ok {
		return textValue(s)
	}
	return v, ""
}

// Space is what PostgreSQL's input functions skip around a value.
const Space = " \t\n\r\v\f"

// LimitNote returns, for a reason PostgreSQL gave while staging (see
// the caller isolated) that says a value is out of range (SQLSTATE
// 22003, 22008, 22015), the reason with col's real limit appended, for
// the column types whose text the row writer leaves to PostgreSQL.
func LimitNote(col Column, reason string) string {
	if !strings.Contains(reason, "(SQLSTATE 22003)") && !strings.Contains(reason, "(SQLSTATE 22008)") && !strings.Contains(reason, "(SQLSTATE 22015)") {
		return reason
	}
	typ := cmp.Or(col.Type, col.BaseType)
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

// TypeMismatch reports whether reason, from Convert, says that the
// value's Go type can never be stored in the column, whatever its value:
// an extractor bug rather than bad data. Such reasons,
// and only they, begin "wrong type " (wrongType) or "Go type ".
func TypeMismatch(reason string) bool {
	return strings.HasPrefix(reason, "wrong type ") || strings.HasPrefix(reason, "Go type ")
}
