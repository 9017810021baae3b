package sqlgen

import (
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestIdent(t *testing.T) {
	cases := map[string]string{
		`a`:          `"a"`,
		`Mixed Case`: `"Mixed Case"`,
		`x"; drop`:   `"x""; drop"`,
	}
	for in, want := range cases {
		if got := Ident(in); got != want {
			t.Errorf("Ident(%q) = %s, want %s", in, got, want)
		}
	}
	if got := Table("s.t"); got != `"s"."t"` {
		t.Errorf("Table = %s", got)
	}
	if got := Equal("t", "s", []string{"a", "b"}); got != `t."a" = s."a" AND t."b" = s."b"` {
		t.Errorf("Equal = %s", got)
	}
	if got := Row("s.", []string{"a"}); got != `ROW(s."a")` {
		t.Errorf("Row = %s", got)
	}
}

func TestParseTable(t *testing.T) {
	ok := []struct{ in, schema, table string }{
		{`t`, ``, `t`},
		{`s.t`, `s`, `t`},
		{`Mixed.Case`, `Mixed`, `Case`},
		{`"we.ird".t`, `we.ird`, `t`},
		{`we."ird.t"`, `we`, `ird.t`},
		{`"a""b".c`, `a"b`, `c`},
		{`"x.y"`, ``, `x.y`},
		{`"a"."b"`, `a`, `b`},
		{`" spaced ".t t`, ` spaced `, `t t`},
	}
	for _, c := range ok {
		s, tb, err := ParseTable(c.in)
		if err != nil || s != c.schema || tb != c.table {
			t.Errorf("ParseTable(%q) = %q, %q, %v; want %q, %q", c.in, s, tb, err, c.schema, c.table)
		}
	}
	for _, in := range []string{``, `we.ird.t`, `a..b`, `.t`, `s.`, `"unterminated`, `"a"b.c`, `a"b.c`, `"a".b.c`, `"".t`, `s.""`, `a.b.`} {
		if s, tb, err := ParseTable(in); !errors.Is(err, ErrTableName) {
			t.Errorf("ParseTable(%q) = %q, %q, %v; want ErrTableName", in, s, tb, err)
		}
		if got := Table(in); !strings.HasPrefix(got, "(invalid") {
			t.Errorf("Table(%q) = %s; want SQL that resolves to nothing", in, got)
		}
	}
	if got := Table(`"we.ird".t`); got != `"we.ird"."t"` {
		t.Errorf("Table = %s", got)
	}
}

// TestQualifiedRoundTrip: any schema and table, dots and quotes
// included, survive Qualified and ParseTable unchanged.
func TestQualifiedRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		part := rapid.StringOfN(rapid.SampledFrom([]rune{'a', 'B', '.', '"', ' ', 'é', '_'}), 1, 6, -1)
		schema := rapid.OneOf(rapid.Just(""), part).Draw(t, "schema")
		table := part.Draw(t, "table")
		s, tb, err := ParseTable(Qualified(schema, table))
		if err != nil || s != schema || tb != table {
			t.Fatalf("ParseTable(Qualified(%q, %q)) = %q, %q, %v", schema, table, s, tb, err)
		}
	})
}
