package pgconv

import (
	"strings"
	"testing"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestConvertJSONAgreesWithPostgres: json and jsonb text with escapes
// (\u0000, escaped backslashes, surrogates) and numbers with large
// exponents is accepted exactly when PostgreSQL accepts it.
func TestConvertJSONAgreesWithPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for in, ok := range map[string]bool{
		`"\\u0000"`: true, `{"a\\u0000":"\\\\u0000"}`: true, `"\u0000"`: false, `"\\\u0000"`: false, `{"k\u0000":1}`: false,
		`"\ud83d\ude00"`: true, `"\ud83d"`: false, `"\ude00"`: false, `"\ud83dx"`: false, `"\ud83d\n"`: false,
		`1e131071`: true, `1e131072`: false, `[1e-16383]`: true, `{"a":1.5e-16383}`: false, `"1e200000"`: true,
	} {
		_, reason := Convert(col("jsonb"), in)
		require.Equal(t, ok, reason == "", "%s: %s", in, reason)
	}
	pieces := []string{`a`, `\\`, `\u0000`, `\\u0000`, `\\\u0000`, `\ud83d`, `\ude00`, `\ud83d\ude00`, `\n`, `\"`, `\u00e9`, `u0000`, `é`}
	exps := []string{"", "e5", "e-5", "e131071", "e131072", "e-16383", "e-16384", "E+131070", "e1073741823", "e-1073741823"}
	rapid.Check(t, func(rt *rapid.T) {
		var parts []string
		for range rapid.IntRange(1, 3).Draw(rt, "values") {
			if rapid.Bool().Draw(rt, "string") {
				var b strings.Builder
				b.WriteByte('"')
				for range rapid.IntRange(0, 4).Draw(rt, "pieces") {
					b.WriteString(rapid.SampledFrom(pieces).Draw(rt, "piece"))
				}
				b.WriteByte('"')
				parts = append(parts, b.String())
			} else {
				parts = append(parts, rapid.SampledFrom([]string{"0", "1", "-12.5", "0.001", "100"}).Draw(rt, "mantissa")+
					rapid.SampledFrom(exps).Draw(rt, "exp"))
			}
		}
		s := "[" + strings.Join(parts, ",") + "]"
		for _, typ := range []string{"json", "jsonb"} {
			_, reason := Convert(col(typ), s)
			var out string
			if err := db.Get(&out, "SELECT $1::"+typ+"::text", s); err != nil {
				require.NotEmpty(rt, reason, "PostgreSQL refuses %s as %s (%v) but it was accepted", s, typ, err)
			} else {
				require.Empty(rt, reason, "PostgreSQL accepts %s as %s but it was rejected", s, typ)
			}
		}
	})
}
