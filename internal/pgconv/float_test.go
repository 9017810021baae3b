package pgconv

import (
	"math"
	"testing"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestConvertFloatRangeAgreesWithPostgres: a float64 for a real column is
// refused exactly when PostgreSQL refuses the text lib/pq sends (underflow
// to zero, overflow to infinity), and float8 text that is not zero but
// reads as zero is refused as PostgreSQL refuses it.
func TestConvertFloatRangeAgreesWithPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	agree := func(tb require.TestingT, typ string, in any) {
		base := map[string]string{"real": "float4", "double precision": "float8"}[typ]
		_, reason := Convert(col(base), in)
		var out string
		if err := db.Get(&out, "SELECT $1::"+typ+"::text", in); err != nil {
			require.NotEmpty(tb, reason, "PostgreSQL refuses %v as %s (%v) but it was accepted", in, typ, err)
		} else {
			require.Empty(tb, reason, "PostgreSQL accepts %v as %s (= %s) but it was rejected", in, typ, out)
		}
	}
	tiny := float64(math.SmallestNonzeroFloat32)
	for _, f := range []float64{1e-50, 1e-45, 7e-46, 7.1e-46, tiny, tiny / 2, math.Nextafter(tiny/2, 1), math.Nextafter(tiny/2, 0), -1e-50,
		math.MaxFloat32, math.Nextafter(math.MaxFloat32, math.Inf(1)), 3.4028235e38, 3.4028236e38, 3.5e38, -3.5e38, 1e39, 0, math.Inf(1), math.NaN()} {
		agree(t, "real", f)
	}
	for _, s := range []string{"1e-400", "-1e-400", "0e-400", "4.9e-324", "2e-324", "3e-324", "1e309", "0x1p-2000", "0x0p-2000", "1e-50"} {
		agree(t, "double precision", s)
	}
	rapid.Check(t, func(rt *rapid.T) {
		e := rapid.SampledFrom([]int{-47, -46, -45, -44, -39, -38, 37, 38, 39}).Draw(rt, "e")
		f := rapid.Float64Range(1, 10).Draw(rt, "m") * math.Pow(10, float64(e))
		if rapid.Bool().Draw(rt, "neg") {
			f = -f
		}
		agree(rt, "real", f)
	})
}
