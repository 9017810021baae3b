package pgconv

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestNumericTextAgreesWithPostgres: for random numeric input text and
// random numeric(p,s) or unconstrained numeric, NumericText is the text
// PostgreSQL prints for the value it stores, scale included.
func TestNumericTextAgreesWithPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, s := range []string{"1.5", "1.50", "15e-1", "0.00", "-0.0", "-0", " 7 ", "nan", "-inf", "+Infinity", "1e3", "1.0e-3", ".5", "-.50e1"} {
		got, ok := NumericText(s, 0, 0)
		require.True(t, ok, s)
		var want string
		require.NoError(t, db.Get(&want, "SELECT $1::numeric::text", s))
		require.Equal(t, want, got, "%q", s)
	}
	rapid.Check(t, func(rt *rapid.T) {
		p := rapid.IntRange(0, 12).Draw(rt, "precision")
		sc := 0
		typ := "numeric"
		if p > 0 {
			sc = rapid.IntRange(-2, p).Draw(rt, "scale")
			typ = fmt.Sprintf("numeric(%d,%d)", p, sc)
		}
		var b strings.Builder
		b.WriteString(rapid.SampledFrom([]string{"", "-", "+"}).Draw(rt, "sign"))
		b.WriteString(strings.Repeat("0", rapid.IntRange(0, 2).Draw(rt, "zeros")))
		b.WriteString(rapid.StringMatching(`[0-9]{0,10}`).Draw(rt, "int"))
		if rapid.Bool().Draw(rt, "dot") {
			b.WriteString("." + rapid.StringMatching(`[0-9]{0,6}`).Draw(rt, "frac"))
		}
		if rapid.IntRange(0, 3).Draw(rt, "exp") == 0 {
			b.WriteString(fmt.Sprintf("e%d", rapid.IntRange(-5, 5).Draw(rt, "e")))
		}
		s := b.String()
		col := Column{Name: "n", Type: typ, BaseType: "numeric", Precision: p, Scale: sc}
		if _, reason := Convert(col, s); reason != "" {
			return
		}
		var want string
		require.NoError(rt, db.Get(&want, "SELECT $1::"+typ+"::text", s))
		got, ok := NumericText(s, p, sc)
		require.True(rt, ok, "%q", s)
		require.Equal(rt, want, got, "%q as %s", s, typ)
	})
}
