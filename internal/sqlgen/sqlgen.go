// Package sqlgen builds SQL text from identifiers. Identifiers are always
// quoted with [Ident]; values never appear in generated SQL, they are bind
// parameters or COPY data.
package sqlgen

import (
	"strings"
)

// Ident quotes one identifier: doubles embedded double quotes and wraps it
// in double quotes (PostgreSQL docs, 4.1.1 "Identifiers and Key Words").
func Ident(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// SplitTable splits "schema.table" into its schema ("" if absent) and table.
// A name already quoted is not supported: pass names unquoted.
func SplitTable(name string) (schema, table string) {
	if i := strings.IndexByte(name, '.'); i >= 0 {
		return name[:i], name[i+1:]
	}
	return "", name
}

// Table quotes a possibly schema-qualified table name: "a.b" -> "a"."b".
func Table(name string) string {
	s, t := SplitTable(name)
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
