package sqlgen

import "testing"

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
