// Package quote makes the commands and SQL that messages suggest
// pasteable: a shell argument is quoted only when it needs to be, and an
// SQL string literal always is.
package quote

import (
	"fmt"
	"regexp"
	"strings"
)

// plainWord matches a shell word that needs no quotes.
var plainWord = regexp.MustCompile(`^[A-Za-z0-9._/=:@%+-]+$`)

// Shell returns s as one argument of a POSIX shell command: unchanged
// when it is a plain word; in double quotes when it holds a single quote
// but nothing double quotes expand ($, `, \, ", !); else in single
// quotes, where an embedded single quote closes the quotes, is escaped
// with a backslash and reopens them. The empty string is a pair of single
// quotes.
func Shell(s string) string {
	if plainWord.MatchString(s) {
		return s
	}
	if strings.Contains(s, "'") && !strings.ContainsAny(s, "$`\\\"!") {
		return `"` + s + `"`
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// SQL returns s as an SQL string literal: in single quotes, an embedded
// single quote doubled. Backslashes are literal (standard_conforming_strings).
func SQL(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// Join returns the names as a comma-separated list, each quoted with
// Shell, for a message that lists names a command takes.
func Join(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = Shell(n)
	}
	return strings.Join(q, ", ")
}

// plainIdent matches an SQL identifier that needs no quotes.
var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// SQLIdent returns name as an SQL identifier: unchanged when it is a
// plain lower-case word, else in double quotes, an embedded double quote
// doubled.
func SQLIdent(name string) string {
	if plainIdent.MatchString(name) {
		return name
	}
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// SchemaFlag returns the operator command's flag that selects the
// manifest schema, with a leading space: "" for the default schema
// "backfill" (or none), else " --schema NAME", quoted with Shell.
func SchemaFlag(schema string) string {
	if schema == "" || schema == "backfill" {
		return ""
	}
	return " --schema " + Shell(schema)
}

// Batches names batches bs for a message, in their order: "batch 3",
// "batches 4 and 3", "batches 5, 4 and 3"; "batches" for none.
func Batches(bs []int64) string {
	switch len(bs) {
	case 0:
		return "batches"
	case 1:
		return fmt.Sprintf("batch %d", bs[0])
	}
	s := make([]string, len(bs))
	for i, b := range bs {
		s[i] = fmt.Sprint(b)
	}
	return "batches " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
