package pgconv

import "encoding/hex"

// convertUUID converts v for a uuid column: a [16]byte or text, written
// in canonical form.
func convertUUID(_ *Column, v, _ any) (any, string) {
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
