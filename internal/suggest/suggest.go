// Package suggest helps error messages about a name the user typed that
// names nothing: it lists what exists and suggests the closest name.
package suggest

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// maxListed bounds how many candidates List names; the rest are counted.
const maxListed = 40

// Closest returns the candidate nearest to name by edit distance
// (optimal string alignment, case-insensitive), or "" when none is near enough: within
// a third of the longer name's length, and at least 1 (a name that only
// differs by case is always near). Ties go to the first candidate.
func Closest(name string, candidates []string) string {
	if name == "" {
		return ""
	}
	best, bestD := "", -1
	for _, c := range candidates {
		if c == name {
			continue
		}
		d := distance(strings.ToLower(name), strings.ToLower(c))
		limit := max(1, max(utf8.RuneCountInString(name), utf8.RuneCountInString(c))/3)
		if d <= limit && (bestD < 0 || d < bestD) {
			best, bestD = c, d
		}
	}
	return best
}

// List returns what, the candidates quoted and comma-separated (at most
// 40, then how many more), and the closest one to name when there is one:
//
//	the table has columns "id", "name"; did you mean "name"?
//
// With no candidates it says what has none.
func List(what, name string, candidates []string) string {
	if len(candidates) == 0 {
		return what + " none"
	}
	var b strings.Builder
	b.WriteString(what)
	b.WriteByte(' ')
	for i, c := range candidates {
		if i == maxListed {
			fmt.Fprintf(&b, " and %d more", len(candidates)-maxListed)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", c)
	}
	if c := Closest(name, candidates); c != "" {
		fmt.Fprintf(&b, "; did you mean %q?", c)
	}
	return b.String()
}

// distance is the edit distance between a and b, in runes: insertions,
// deletions, substitutions and transpositions of adjacent runes (optimal
// string alignment).
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
