package pgconv

import "strings"

// convertBool converts v for a boolean column.
func convertBool(_ *Column, v, _ any) (any, string) {
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
