package quote

import (
	"fmt"
	"strings"
	"testing"
)

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

func TestSQLIdentAndSchemaFlag(t *testing.T) {
	for in, want := range map[string]string{"backfill": "backfill", "Ops": `"Ops"`, `a"b c`: `"a""b c"`} {
		if got := SQLIdent(in); got != want {
			t.Errorf("SQLIdent(%q) = %s, want %s", in, got, want)
		}
	}
	for in, want := range map[string]string{"backfill": "", "": "", "ops": " --schema ops", "my ops": " --schema 'my ops'"} {
		if got := SchemaFlag(in); got != want {
			t.Errorf("SchemaFlag(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBatches(t *testing.T) {
	for bs, want := range map[string]string{"": "batches", "3": "batch 3", "4 3": "batches 4 and 3", "5 4 3": "batches 5, 4 and 3"} {
		var ids []int64
		for _, f := range strings.Fields(bs) {
			var n int64
			fmt.Sscan(f, &n)
			ids = append(ids, n)
		}
		if got := Batches(ids); got != want {
			t.Errorf("Batches(%v) = %q, want %q", ids, got, want)
		}
	}
}
