package pgconv

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestNumericCheckAgreesWithPostgres: for random decimal text and random
// numeric(p,s), Convert accepts exactly what PostgreSQL's numeric
// input accepts, so that a COPY never fails on a value we let through and
// no value PostgreSQL takes is rejected.
func TestNumericCheckAgreesWithPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rapid.Check(t, func(rt *rapid.T) {
		p := rapid.IntRange(1, 12).Draw(rt, "precision")
		sc := rapid.IntRange(-2, p).Draw(rt, "scale")
		var b strings.Builder
		b.WriteString(rapid.SampledFrom([]string{"", "-", "+"}).Draw(rt, "sign"))
		b.WriteString(strings.Repeat("0", rapid.IntRange(0, 2).Draw(rt, "zeros")))
		b.WriteString(rapid.StringMatching(`[0-9]{0,14}`).Draw(rt, "int"))
		if rapid.Bool().Draw(rt, "dot") {
			b.WriteString("." + rapid.StringMatching(`[0-9]{0,6}`).Draw(rt, "frac"))
		}
		if rapid.IntRange(0, 5).Draw(rt, "exp") == 0 {
			b.WriteString(fmt.Sprintf("e%d", rapid.IntRange(-5, 5).Draw(rt, "e")))
		}
		s := b.String()
		typ := fmt.Sprintf("numeric(%d,%d)", p, sc)
		col := Column{Name: "n", Type: typ, BaseType: "numeric", Precision: p, Scale: sc}
		_, reason := Convert(col, s)
		var out string
		err := db.Get(&out, "SELECT $1::"+typ+"::text", s)
		if err != nil {
			require.NotEmpty(rt, reason, "PostgreSQL refuses %q as %s (%v) but it was accepted", s, typ, err)
		} else {
			require.Empty(rt, reason, "PostgreSQL accepts %q as %s (= %s) but it was rejected", s, typ, out)
		}
	})
}

func TestNumericCheckCases(t *testing.T) {
	t.Parallel()
	col := Column{Name: "n", Type: "numeric(10,2)", BaseType: "numeric", Precision: 10, Scale: 2}
	for in, ok := range map[string]bool{
		"99999999.99": true, "99999999.995": false, "123456789.00": false, "-00012.5": true,
		"0.001": true, "+.5": true, "1e7": true, "1e8": false, ".": false, "1.2.3": false, "abc": false, "": false,
	} {
		_, reason := Convert(col, in)
		require.Equal(t, ok, reason == "", "%q: %s", in, reason)
	}
	_, reason := Convert(col, 1e9)
	require.Equal(t, `numeric field overflow: numeric(10,2) column "n" holds at most 99999999.99 in absolute value`, reason)
	for p, want := range map[[2]int]string{{5, 2}: "999.99", {3, 0}: "999", {3, -2}: "99900", {3, 5}: "0.00999", {2, 2}: "0.99"} {
		require.Equal(t, want, numericMax(p[0], p[1]))
	}
}

// TestNumericLimitsAgreeWithPostgres extends
// TestNumericCheckAgreesWithPostgres to unconstrained numeric and to the
// limits of the numeric format: large exponents, 16383 digits after the
// point, 131072 before it.
func TestNumericLimitsAgreeWithPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	agree := func(tb require.TestingT, s string, p, sc int) {
		typ := "numeric"
		if p > 0 {
			typ = fmt.Sprintf("numeric(%d,%d)", p, sc)
		}
		_, reason := Convert(Column{Name: "n", Type: typ, BaseType: "numeric", Precision: p, Scale: sc}, s)
		shown := s
		if len(shown) > 40 {
			shown = fmt.Sprintf("%s... (%d bytes)", s[:40], len(s))
		}
		var ok bool
		if err := db.Get(&ok, "SELECT $1::"+typ+" IS NOT NULL", s); err != nil {
			require.NotEmpty(tb, reason, "PostgreSQL refuses %q as %s (%v) but it was accepted", shown, typ, err)
		} else {
			require.Empty(tb, reason, "PostgreSQL accepts %q as %s but it was rejected", shown, typ)
		}
	}
	for _, s := range []string{
		"1" + strings.Repeat("0", 131071), "1" + strings.Repeat("0", 131072), "0." + strings.Repeat("0", 16383), "0." + strings.Repeat("0", 16384),
		strings.Repeat("0", 200000) + "1", "1." + strings.Repeat("5", 16383), "1e200000", "-1e200000", "1e-200000", "0e200000", "0e-200000",
		"1e99999999999999999999", "0e1073741822", "0e1073741823", "0e-1073741822", "0e-1073741823", "1e00000000000000000005",
	} {
		for _, ps := range [][2]int{{0, 0}, {10, 2}, {3, -2}, {1000, 1000}} {
			agree(t, s, ps[0], ps[1])
		}
	}
	bounds := []int{0, 16383, -16383, 131071, -131071, 1073741823, -1073741823, 1000, -1000}
	rapid.Check(t, func(rt *rapid.T) {
		p := rapid.IntRange(0, 12).Draw(rt, "precision")
		sc := 0
		if p > 0 {
			sc = rapid.IntRange(-2, p).Draw(rt, "scale")
		}
		var b strings.Builder
		b.WriteString(rapid.SampledFrom([]string{"", "-", "+"}).Draw(rt, "sign"))
		b.WriteString(strings.Repeat("0", rapid.IntRange(0, 5).Draw(rt, "zeros")))
		b.WriteString(rapid.StringMatching(`[0-9]{0,14}`).Draw(rt, "int"))
		if rapid.Bool().Draw(rt, "dot") {
			b.WriteString("." + rapid.StringMatching(`[0-9]{0,6}`).Draw(rt, "frac"))
		}
		switch rapid.IntRange(0, 3).Draw(rt, "exp") {
		case 0:
			fmt.Fprintf(&b, "e%d", rapid.IntRange(-5, 5).Draw(rt, "e"))
		case 1:
			fmt.Fprintf(&b, "e%d", rapid.SampledFrom(bounds).Draw(rt, "bound")+rapid.IntRange(-6, 6).Draw(rt, "delta"))
		}
		agree(rt, b.String(), p, sc)
	})
}
