package quote

import "testing"

func TestShell(t *testing.T) {
	for in, want := range map[string]string{
		"flights":      "flights",
		"reject gate":  "'reject gate'",
		"it's":         `"it's"`,
		"it's $x":      `'it'\''s $x'`,
		"":             "''",
		"a;rm -rf":     "'a;rm -rf'",
		"$HOME":        "'$HOME'",
		"ops/v2:x@y-1": "ops/v2:x@y-1",
	} {
		if got := Shell(in); got != want {
			t.Errorf("Shell(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestSQL(t *testing.T) {
	for in, want := range map[string]string{
		"flights":     "'flights'",
		"it's":        "'it''s'",
		"reject gate": "'reject gate'",
	} {
		if got := SQL(in); got != want {
			t.Errorf("SQL(%q) = %s, want %s", in, got, want)
		}
	}
}
