package spool

import (
	"context"
	"math"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestSpoolRoundTrip: whatever rows a chunk's row writer spools (the
// converted value types), with whatever memory bound, a replay returns
// them as added, as often as asked, also while another spool is closed
// (its memory pooled for others), and Close removes the file a spilled
// spool wrote.
func TestSpoolRoundTrip(t *testing.T) {
	value := rapid.OneOf(
		rapid.Just[any](nil),
		rapid.Map(rapid.String(), func(s string) any { return s }),
		rapid.Map(rapid.SliceOf(rapid.Byte()), func(b []byte) any { return b }),
		rapid.Just[any]([]byte{}),
		rapid.Map(rapid.Bool(), func(b bool) any { return b }),
		rapid.Map(rapid.Int64(), func(n int64) any { return n }),
		rapid.Map(rapid.Int(), func(n int) any { return n }),
		rapid.Map(rapid.Int32(), func(n int32) any { return n }),
		rapid.Map(rapid.Float64(), func(f float64) any { return f }),
		rapid.Map(rapid.Int64Range(-1e15, 1e15), func(us int64) any { return time.UnixMicro(us).UTC() }),
	)
	rapid.Check(t, func(t *rapid.T) {
		old := MemLimit
		MemLimit = rapid.IntRange(0, 2000).Draw(t, "limit")
		defer func() { MemLimit = old }()
		cols := rapid.IntRange(1, 5).Draw(t, "cols")
		rows := rapid.SliceOfN(rapid.SliceOfN(value, cols, cols), 0, 50).Draw(t, "rows")
		sp := &Spool{}
		buf := make([]any, cols)
		// Another chunk's spool, filled alongside and closed at some row:
		// its memory goes back to the pools (cleared) and serves sp's
		// later rows, without touching sp's earlier ones.
		other, closeAt := &Spool{}, rapid.IntRange(0, len(rows)).Draw(t, "closeAt")
		for i, r := range rows {
			if i == closeAt {
				require.NoError(t, other.Close())
			}
			if i < closeAt {
				require.NoError(t, other.Add(context.Background(), int64(i), []any{"other", int64(i)}))
			}
			copy(buf, r)
			require.NoError(t, sp.Add(context.Background(), int64(i+1)*2, buf))
			for j := range buf {
				if b, ok := buf[j].([]byte); ok && len(b) > 0 {
					buf[j] = append([]byte(nil), b...)
					buf[j].([]byte)[0] ^= 0xff // the writer reuses its buffers
				}
			}
		}
		require.Equal(t, int64(len(rows)), sp.Len())
		for range 2 {
			i := 0
			require.NoError(t, sp.Replay(context.Background(), func(row int64, values []any) error {
				require.Equal(t, int64(i+1)*2, row)
				for j, v := range values {
					want := rows[i][j]
					if f, ok := want.(float64); ok && math.IsNaN(f) {
						require.True(t, math.IsNaN(v.(float64)))
						continue
					}
					if tm, ok := want.(time.Time); ok {
						require.True(t, tm.Equal(v.(time.Time)))
						continue
					}
					if b, ok := want.([]byte); ok && b == nil {
						require.Nil(t, v, "a nil byte slice is NULL")
						continue
					}
					require.Equal(t, want, v)
				}
				i++
				return nil
			}))
			require.Equal(t, len(rows), i)
		}
		require.NoError(t, other.Close())
		var name string
		if sp.F != nil {
			name = sp.F.Name()
		}
		require.NoError(t, sp.Close())
		require.NoError(t, sp.Close())
		if name != "" {
			_, err := os.Stat(name)
			require.True(t, os.IsNotExist(err), "the spool's file is removed")
		}
	})
}

// TestMemBudgetSharedBySpools: the spools of the process share
// MemBudget: a spool under its own MemLimit moves to a file once all the
// spools together would hold more than the budget in memory, and a
// spool closed or moved to a file gives its share back.
func TestMemBudgetSharedBySpools(t *testing.T) {
	oldLimit, oldBudget := MemLimit, MemBudget
	MemLimit, MemBudget = 1<<20, 64<<10
	defer func() { MemLimit, MemBudget = oldLimit, oldBudget }()
	ctx := context.Background()
	base := InMem()
	row := []any{"0123456789012345678901234567890123456789", int64(7), time.Unix(0, 0).UTC()}
	a, b := &Spool{}, &Spool{}
	for i := range 300 { // about 40 KiB: under the budget alone
		require.NoError(t, a.Add(ctx, int64(i+1), row))
	}
	require.Nil(t, a.F, "a spool under its limit and the budget stays in memory")
	inA := InMem() - base
	require.Greater(t, inA, int64(0))
	for i := range 300 {
		require.NoError(t, b.Add(ctx, int64(i+1), row))
	}
	require.NotNil(t, b.F, "past the shared budget the next spool moves to a file")
	require.Nil(t, a.F)
	require.Equal(t, inA, InMem()-base, "a spool in a file holds no share")
	var n int
	require.NoError(t, b.Replay(ctx, func(r int64, vs []any) error {
		n++
		require.Equal(t, int64(n), r)
		require.Equal(t, row, vs)
		return nil
	}))
	require.Equal(t, 300, n)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	require.Equal(t, base, InMem(), "closed spools give their share back")
}
