package pgconv

import (
	"testing"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestConvertBoolAgreesWithPostgres: boolean text is accepted exactly
// when PostgreSQL accepts it, with the same value.
func TestConvertBoolAgreesWithPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	words := []string{"t", "tr", "tru", "true", "f", "fa", "fal", "fals", "false", "y", "ye", "yes", "n", "no",
		"o", "on", "of", "off", "1", "0", "truee", "onn", "offf", "10", "2", "", "nO", "TRUE", "Off"}
	rapid.Check(t, func(rt *rapid.T) {
		var s string
		if rapid.Bool().Draw(rt, "word") {
			w := []byte(rapid.SampledFrom(words).Draw(rt, "w"))
			for i := range w {
				if rapid.Bool().Draw(rt, "upper") && w[i] >= 'a' && w[i] <= 'z' {
					w[i] -= 'a' - 'A'
				}
			}
			ws := rapid.StringMatching(`[ \t\n\r\v\f]{0,2}`)
			s = ws.Draw(rt, "before") + string(w) + ws.Draw(rt, "after")
		} else {
			s = rapid.StringMatching(`[tTrRuUeEfFaAlLsSyYnNoO10 \tx]{0,6}`).Draw(rt, "s")
		}
		got, reason := Convert(col("bool"), s)
		var pg bool
		if err := db.Get(&pg, "SELECT $1::bool", s); err != nil {
			require.NotEmpty(rt, reason, "PostgreSQL refuses %q (%v) but it was accepted", s, err)
		} else {
			require.Empty(rt, reason, "PostgreSQL accepts %q but it was rejected", s)
			require.Equal(rt, pg, got, "%q", s)
		}
	})
}
