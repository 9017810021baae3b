// Package sqlgen builds SQL text from identifiers. Identifiers are always
// quoted with [Ident]; values never appear in generated SQL, they are bind
// parameters or COPY data.
package sqlgen

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Ident quotes one identifier: doubles embedded double quotes and wraps it
// in double quotes (PostgreSQL docs, 4.1.1 "Identifiers and Key Words").
func Ident(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// MaxIdentLen is the length in bytes of the longest identifier PostgreSQL
// keeps (NAMEDATALEN - 1 in a default build, PostgreSQL docs 4.1.1): it
// silently truncates longer ones, so two long names that differ only
// after byte 63 name the same object.
const MaxIdentLen = 63

// Derived names an object derived from base, such as a table version:
// base + suffix when that fits [MaxIdentLen] bytes. A longer name is
// shortened deterministically instead of being left to PostgreSQL's
// truncation: base is cut (at a UTF-8 character boundary) and followed by
// "_", 12 hex digits of the SHA-256 of the whole base, and the whole
// suffix. So the suffix (e.g. a batch ID) always survives, and two bases
// that share a long prefix get different names. suffix must be shorter
// than MaxIdentLen - 13 bytes.
func Derived(base, suffix string) string {
	if len(base)+len(suffix) <= MaxIdentLen {
		return base + suffix
	}
	sum := sha256.Sum256([]byte(base))
	tag := "_" + hex.EncodeToString(sum[:])[:12]
	keep := max(0, MaxIdentLen-len(suffix)-len(tag))
	for keep > 0 && !utf8.RuneStart(base[keep]) {
		keep--
	}
	return base[:keep] + tag + suffix
}

// ErrTableName is returned by [ParseTable] for a table name it cannot
// split unambiguously.
var ErrTableName = errors.New("invalid table name")

// ParseTable splits a possibly schema-qualified table name into its schema
// ("" if absent) and table. The name has one or two parts separated by a
// dot outside double quotes. A part is either unquoted, taken literally
// (no case folding: "Sales" names the table Sales), or wholly enclosed in
// double quotes, with "" standing for one quote inside; a part quoted so
// may contain dots: `"we.ird".t` is table t of schema we.ird, `we."ird.t"`
// table ird.t of schema we, `"a""b".c` table c of schema a"b.
//
// Errors wrap [ErrTableName]: more than one unquoted dot ("a.b.c" could
// mean "a"."b.c" or "a.b"."c"), an empty part, a quote inside an unquoted
// part or text after a closing quote, and an unterminated quote.
func ParseTable(name string) (schema, table string, err error) {
	var parts []string
	bad := func(why string) (string, string, error) {
		return "", "", fmt.Errorf("%w %q: %s; quote a part that holds a dot, as in \"we.ird\".t", ErrTableName, name, why)
	}
	i := 0
	for {
		var part strings.Builder
		if i < len(name) && name[i] == '"' {
			i++
			closed := false
			for i < len(name) {
				if name[i] == '"' {
					if i+1 < len(name) && name[i+1] == '"' {
						part.WriteByte('"')
						i += 2
						continue
					}
					i++
					closed = true
					break
				}
				part.WriteByte(name[i])
				i++
			}
			if !closed {
				return bad("unterminated quote")
			}
			if i < len(name) && name[i] != '.' {
				return bad("text after a closing quote")
			}
		} else {
			for i < len(name) && name[i] != '.' {
				if name[i] == '"' {
					return bad("a quote inside an unquoted part")
				}
				part.WriteByte(name[i])
				i++
			}
		}
		if part.Len() == 0 {
			return bad("empty part")
		}
		parts = append(parts, part.String())
		if i == len(name) {
			break
		}
		i++ // the dot
		if len(parts) == 2 {
			return bad("more than one unquoted dot")
		}
	}
	if len(parts) == 1 {
		return "", parts[0], nil
	}
	return parts[0], parts[1], nil
}

// SplitTable is [ParseTable] for names already checked: for a name
// ParseTable refuses it returns ("", name) and [Table] does not use it.
func SplitTable(name string) (schema, table string) {
	s, t, err := ParseTable(name)
	if err != nil {
		return "", name
	}
	return s, t
}

// Qualified returns the name [ParseTable] parses back into schema and
// table (schema "" for none): each part as is, or quoted when it holds a
// dot or a double quote or starts with a quote. Prepare stores the target
// in this form.
func Qualified(schema, table string) string {
	part := func(p string) string {
		if p == "" || strings.ContainsAny(p, `."`) {
			return Ident(p)
		}
		return p
	}
	if schema == "" {
		return part(table)
	}
	return part(schema) + "." + part(table)
}

// Table quotes a possibly schema-qualified table name (see [ParseTable]):
// "a.b" -> "a"."b", `"a.b".c` -> "a.b"."c". A name ParseTable refuses
// gives SQL that cannot resolve to any table (a syntax error), never a
// guess; callers check names with ParseTable first to report why.
func Table(name string) string {
	s, t, err := ParseTable(name)
	if err != nil {
		return "(invalid table name " + Ident(name) + ")"
	}
	if s == "" {
		return Ident(t)
	}
	return Ident(s) + "." + Ident(t)
}

// List quotes each name and joins them with ", ", each prefixed with
// prefix (e.g. "s." for "s"."a", "s"."b"; pass "" for none).
func List(prefix string, names []string) string {
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(prefix)
		b.WriteString(Ident(n))
	}
	return b.String()
}

// Equal returns "l.a = r.a AND l.b = r.b" for the names, with the given
// table aliases (unquoted, trusted: aliases are chosen by the library).
func Equal(l, r string, names []string) string {
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteString(" AND ")
		}
		q := Ident(n)
		b.WriteString(l + "." + q + " = " + r + "." + q)
	}
	return b.String()
}

// Row returns "(p.a, p.b)" (a row constructor) for the names, or "ROW(p.a)"
// for a single name so that IS DISTINCT FROM compares rows either way.
func Row(prefix string, names []string) string {
	if len(names) == 1 {
		return "ROW(" + prefix + Ident(names[0]) + ")"
	}
	return "(" + List(prefix, names) + ")"
}
