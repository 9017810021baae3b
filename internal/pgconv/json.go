package pgconv

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// convertJSON converts v for a json or jsonb column: JSON text as
// json.RawMessage, []byte or string, or any other value, encoded.
func convertJSON(col *Column, _, src any) (any, string) {
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
		if b, err = MarshalJSON(x); err != nil {
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
		if reason := JSONBReason(b); reason != "" {
			if strings.HasPrefix(reason, "jsonb number") {
				reason = fmt.Sprintf("%s: %s column %q holds numbers of at most %d digits before the decimal point and %d after",
					reason, typeName(col, "jsonb"), col.Name, numericMaxExp10+1, numericMaxDscale)
			}
			return nil, reason
		}
	}
	return string(b), ""
}

// JSONBReason says why PostgreSQL's jsonb input refuses b, valid JSON
// that the json type takes: a \u0000 escape (an escaped backslash
// followed by "u0000" is fine), a surrogate escape not in a high-low
// pair, or a number beyond the numeric format. "" when jsonb takes b.
func JSONBReason(b []byte) string {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			var reason string
			if i, reason = jsonbString(b, i+1); reason != "" {
				return reason
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

const jsonbUnpaired = "jsonb cannot store an unpaired Unicode surrogate escape"

// jsonbString checks the JSON string of valid JSON b whose text starts at
// b[i], after its opening quote, as JSONBReason does; it returns the
// index of the closing quote.
func jsonbString(b []byte, i int) (int, string) {
	high := false // the previous character was a high surrogate escape
	for ; i < len(b) && b[i] != '"'; i++ {
		if b[i] != '\\' || b[i+1] != 'u' {
			if high {
				return i, jsonbUnpaired
			}
			if b[i] == '\\' {
				i++ // the escaped character, maybe a quote or backslash
			}
			continue
		}
		r, _ := strconv.ParseUint(string(b[i+2:i+6]), 16, 32)
		i += 5
		var reason string
		if high, reason = jsonbEscape(r, high); reason != "" {
			return i, reason
		}
	}
	if high {
		return i, jsonbUnpaired
	}
	return i, ""
}

// jsonbEscape checks the escape \u of code r, after a high surrogate
// escape when high; it reports whether r is a high surrogate.
func jsonbEscape(r uint64, high bool) (bool, string) {
	switch {
	case r == 0:
		return false, `jsonb cannot store \u0000`
	case r >= 0xd800 && r <= 0xdbff:
		if high {
			return false, jsonbUnpaired
		}
		return true, ""
	case r >= 0xdc00 && r <= 0xdfff:
		if !high {
			return false, jsonbUnpaired
		}
		return false, ""
	case high:
		return false, jsonbUnpaired
	}
	return false, ""
}

// MarshalJSON is json.Marshal, with a panicking MarshalJSON or String
// method an error.
func MarshalJSON(v any) (b []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return json.Marshal(v)
}
