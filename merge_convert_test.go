package backfill

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestNumericCheckAgreesWithPostgres: for random decimal text and random
// numeric(p,s), convertValue accepts exactly what PostgreSQL's numeric
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
		_, reason := convertValue(col, s)
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
		_, reason := convertValue(col, in)
		require.Equal(t, ok, reason == "", "%q: %s", in, reason)
	}
	_, reason := convertValue(col, 1e9)
	require.Equal(t, `numeric field overflow: numeric(10,2) column "n" holds at most 99999999.99 in absolute value`, reason)
	for p, want := range map[[2]int]string{{5, 2}: "999.99", {3, 0}: "999", {3, -2}: "99900", {3, 5}: "0.00999", {2, 2}: "0.99"} {
		require.Equal(t, want, numericMax(p[0], p[1]))
	}
}
