package sqlgen

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

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

// TestDerivedNeverTruncated: a derived name always fits MaxIdentLen bytes
// (so PostgreSQL never truncates it), is valid UTF-8, keeps its suffix
// whole, is base+suffix whenever that fits, and two different bases or
// suffixes never give one name, as PostgreSQL's truncation of base+suffix
// did for "<59 bytes>__v10" and "<59 bytes>__v1".
func TestDerivedNeverTruncated(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		gen := rapid.StringOfN(rapid.RuneFrom([]rune("oé€𝄞_x")), 0, 80, -1)
		b1 := gen.Draw(t, "base1")
		b2 := rapid.OneOf(rapid.Just(b1), gen, rapid.Just(b1+"o")).Draw(t, "base2")
		n1 := rapid.Int64Range(1, 1<<62).Draw(t, "batch1")
		n2 := rapid.OneOf(rapid.Just(n1), rapid.Int64Range(1, 1<<62), rapid.Just(n1*10)).Draw(t, "batch2")
		s1, s2 := "__v"+strconv.FormatInt(n1, 10), "__v"+strconv.FormatInt(n2, 10)
		d1, d2 := Derived(b1, s1), Derived(b2, s2)
		for _, c := range []struct{ b, s, d string }{{b1, s1, d1}, {b2, s2, d2}} {
			if len(c.d) > MaxIdentLen || !utf8.ValidString(c.d) || !strings.HasSuffix(c.d, c.s) {
				t.Fatalf("Derived(%q, %q) = %q (%d bytes)", c.b, c.s, c.d, len(c.d))
			}
			if len(c.b)+len(c.s) <= MaxIdentLen && c.d != c.b+c.s {
				t.Fatalf("Derived(%q, %q) = %q, want the name as is", c.b, c.s, c.d)
			}
		}
		if (b1 != b2 || s1 != s2) == (d1 == d2) {
			t.Fatalf("Derived(%q, %q) = %q and Derived(%q, %q) = %q", b1, s1, d1, b2, s2, d2)
		}
	})
}
