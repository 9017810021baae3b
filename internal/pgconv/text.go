package pgconv

import (
	"fmt"
	"reflect"
	"strings"
	"unicode/utf8"
)

// convertText converts v for a text, varchar, bpchar, name or citext
// column, checking a varchar(n) or char(n) column's length.
func convertText(col *Column, v, src any) (any, string) {
	s, reason := toText(v, src)
	if reason != "" {
		return nil, reason
	}
	if col.MaxLen > 0 && len(s) > col.MaxLen && utf8.RuneCountInString(strings.TrimRight(s, " ")) > col.MaxLen {
		return nil, fmt.Sprintf("value too long: %s column %q holds at most %d characters, got %d", typeName(col, col.BaseType), col.Name, col.MaxLen, utf8.RuneCountInString(s))
	}
	if _, ok := v.(string); ok {
		return v, "" // the string as it came, without boxing it again
	}
	return s, ""
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

// textValue is s as Convert returns text: s, or the reason it cannot
// be stored.
func textValue(s string) (any, string) {
	if reason := checkText(s); reason != "" {
		return nil, reason
	}
	return s, ""
}
