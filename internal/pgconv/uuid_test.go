package pgconv

import (
	"strings"
	"testing"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestConvertUUIDAgreesWithPostgres: uuid text is accepted exactly when
// PostgreSQL accepts it (braces, hyphens after any group of four
// digits), and converted to PostgreSQL's canonical text.
func TestConvertUUIDAgreesWithPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for in, want := range map[string]string{
		"{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}":  "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"a0eebc999c0b4ef8bb6d6bb9bd380a11":        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"{a0eebc999c0b4ef8bb6d6bb9bd380a11}":      "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
	} {
		got, reason := Convert(col("uuid"), in)
		require.Empty(t, reason, in)
		require.Equal(t, want, got, in)
	}
	rapid.Check(t, func(rt *rapid.T) {
		var b strings.Builder
		hexDigits := rapid.StringMatching(`[0-9a-fA-F]{32}`).Draw(rt, "hex")
		for i := range 32 {
			b.WriteByte(hexDigits[i])
			if i < 31 && (i%4 == 3 && rapid.IntRange(0, 2).Draw(rt, "dash4") == 0 || rapid.IntRange(0, 40).Draw(rt, "dash") == 0) {
				b.WriteByte('-')
			}
		}
		s := b.String()
		switch rapid.IntRange(0, 5).Draw(rt, "braces") {
		case 0:
			s = "{" + s + "}"
		case 1:
			s = "{" + s
		case 2:
			s += "}"
		}
		switch rapid.IntRange(0, 6).Draw(rt, "mutate") {
		case 0:
			i := rapid.IntRange(0, len(s)-1).Draw(rt, "del")
			s = s[:i] + s[i+1:]
		case 1:
			i := rapid.IntRange(0, len(s)).Draw(rt, "ins")
			s = s[:i] + rapid.SampledFrom([]string{"g", "-", " ", "0"}).Draw(rt, "c") + s[i:]
		}
		got, reason := Convert(col("uuid"), s)
		var pg string
		if err := db.Get(&pg, "SELECT $1::uuid::text", s); err != nil {
			require.NotEmpty(rt, reason, "PostgreSQL refuses %q (%v) but it was accepted", s, err)
		} else {
			require.Empty(rt, reason, "PostgreSQL accepts %q but it was rejected", s)
			require.Equal(rt, pg, got, "%q", s)
		}
	})
}
