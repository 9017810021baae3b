package textcap

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		more string
		want string
	}{
		{"short", 10, "x", "short"},
		{"exactly10!", 10, "x", "exactly10!"},
		{"ééééé", 5, "x", "ééééé"}, // 10 bytes, 5 characters
		{"abcdefghijkl", 3, "", "abc … (12 characters)"},
		{"ééééé", 2, "see JSON", "éé … (5 characters; see JSON)"},
		{strings.Repeat("x", 1234567), 1, "", "x … (1,234,567 characters)"},
	} {
		if got := Clip(c.s, c.n, c.more); got != c.want {
			t.Errorf("Clip(%.20q, %d, %q) = %.80q, want %q", c.s, c.n, c.more, got, c.want)
		}
		if !utf8.ValidString(Clip(c.s, c.n, c.more)) {
			t.Errorf("Clip(%.20q, %d) split a character", c.s, c.n)
		}
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", -1234567: "-1,234,567", 52428800: "52,428,800"} {
		if got := Thousands(n); got != want {
			t.Errorf("Thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestClipMiddle(t *testing.T) {
	if got := ClipMiddle("abcdef", 3, 3, "x"); got != "abcdef" {
		t.Errorf("ClipMiddle = %q", got)
	}
	if got, want := ClipMiddle("abcdéfgh", 2, 3, "see JSON"), "ab … (8 characters in all; see JSON) … fgh"; got != want {
		t.Errorf("ClipMiddle = %q, want %q", got, want)
	}
	if got := ClipMiddle("ééééé", 1, 1, ""); got != "é … (5 characters in all) … é" {
		t.Errorf("ClipMiddle = %q", got)
	}
}
