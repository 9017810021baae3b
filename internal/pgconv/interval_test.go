package pgconv

import (
	"math"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestConvertIntervalExact: a time.Duration is stored as whole
// microseconds, truncated toward the past like TruncMicro, and
// PostgreSQL reads exactly that many microseconds.
func TestConvertIntervalExact(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	check := func(tb require.TestingT, d time.Duration) {
		got, reason := Convert(col("interval"), d)
		require.Empty(tb, reason)
		want := int64(d) / 1000
		if int64(d)%1000 < 0 {
			want--
		}
		var us int64
		require.NoError(tb, db.Get(&us, "SELECT (extract(epoch FROM $1::interval) * 1000000)::bigint", got))
		require.Equal(tb, want, us, "%v stored as %s", d, got)
		// Consistent with TruncMicro: a stored time plus the stored
		// interval is the stored sum.
		if us > math.MinInt64/1000 {
			base := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
			require.Equal(tb, TruncMicro(base.Add(d)), base.Add(time.Duration(us)*time.Microsecond), "%v", d)
		}
	}
	for _, d := range []time.Duration{0, 1, -1, 999, -999, 1000, -1000, -1500, time.Hour, -time.Hour, math.MaxInt64, math.MinInt64} {
		check(t, d)
	}
	rapid.Check(t, func(rt *rapid.T) {
		check(rt, time.Duration(rapid.Int64().Draw(rt, "d")))
	})
}
