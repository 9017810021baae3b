// Package textcap cuts long stored texts for display: a reason, an actor,
// an error or a value from the manifest can be megabytes long, and a
// report or a terminal shows its head and its full length instead.
package textcap

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Clip returns s when it has at most n characters (runes); otherwise its
// first n characters followed by " … (N characters; more)", N the full
// length with thousands separators, e.g. "… (52,428,800 characters; the
// full text in the JSON report)". more says where the full text is; ""
// leaves it out. The cut never splits a character.
func Clip(s string, n int, more string) string {
	if len(s) <= n {
		return s // n bytes hold at most n characters
	}
	total := utf8.RuneCountInString(s)
	if total <= n {
		return s
	}
	cut := 0
	for i := 0; i < n; i++ {
		_, size := utf8.DecodeRuneInString(s[cut:])
		cut += size
	}
	var b strings.Builder
	b.Grow(cut + 80 + len(more))
	b.WriteString(s[:cut])
	b.WriteString(" … (")
	b.WriteString(Thousands(int64(total)))
	b.WriteString(" characters")
	if more != "" {
		b.WriteString("; ")
		b.WriteString(more)
	}
	b.WriteString(")")
	return b.String()
}

// Thousands formats n with comma thousands separators: 1234567 is
// "1,234,567".
func Thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// ClipMiddle returns s when it has at most head+tail characters;
// otherwise its first head characters, " … (N characters in all; more)
// … ", and its last tail characters: for a text whose end matters too (a
// reason followed by what to do about it).
func ClipMiddle(s string, head, tail int, more string) string {
	if len(s) <= head+tail {
		return s
	}
	total := utf8.RuneCountInString(s)
	if total <= head+tail {
		return s
	}
	h := 0
	for i := 0; i < head; i++ {
		_, size := utf8.DecodeRuneInString(s[h:])
		h += size
	}
	t := len(s)
	for i := 0; i < tail; i++ {
		_, size := utf8.DecodeLastRuneInString(s[:t])
		t -= size
	}
	note := " … (" + Thousands(int64(total)) + " characters in all"
	if more != "" {
		note += "; " + more
	}
	return s[:h] + note + ") … " + s[t:]
}
