package backfill_test

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"strings"
	"testing"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill"
)

// intSpan is an int chunk reduced to its bounds.
type intSpan struct{ Lo, Hi int64 }

func intSpans(chunks []backfill.Chunk) []intSpan {
	out := make([]intSpan, len(chunks))
	for i, c := range chunks {
		out[i] = intSpan{c.Lo, c.Hi}
	}
	return out
}

func TestIntRange(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		lo, hi, step int64
		want         []intSpan
	}{
		{"step divides", 0, 9, 3, []intSpan{{0, 3}, {3, 6}, {6, 9}}},
		{"last chunk clipped", 0, 10, 3, []intSpan{{0, 3}, {3, 6}, {6, 9}, {9, 10}}},
		{"step larger than range", -5, 5, 100, []intSpan{{-5, 5}}},
		{"negative bounds", -10, -4, 4, []intSpan{{-10, -6}, {-6, -4}}},
		{"single value", 7, 8, 1, []intSpan{{7, 8}}},
		{"up to MaxInt64", math.MaxInt64 - 10, math.MaxInt64, 3, []intSpan{
			{math.MaxInt64 - 10, math.MaxInt64 - 7},
			{math.MaxInt64 - 7, math.MaxInt64 - 4},
			{math.MaxInt64 - 4, math.MaxInt64 - 1},
			{math.MaxInt64 - 1, math.MaxInt64},
		}},
		{"from MinInt64", math.MinInt64, math.MinInt64 + 5, 2, []intSpan{
			{math.MinInt64, math.MinInt64 + 2},
			{math.MinInt64 + 2, math.MinInt64 + 4},
			{math.MinInt64 + 4, math.MinInt64 + 5},
		}},
		{"whole int64 range, step MaxInt64", math.MinInt64, math.MaxInt64, math.MaxInt64, []intSpan{
			{math.MinInt64, -1},
			{-1, math.MaxInt64 - 1},
			{math.MaxInt64 - 1, math.MaxInt64},
		}},
		{"range wider than MaxInt64 in one step", -2, math.MaxInt64, math.MaxInt64, []intSpan{
			{-2, math.MaxInt64 - 2},
			{math.MaxInt64 - 2, math.MaxInt64},
		}},
		{"step MaxInt64 over a short range", 0, 1, math.MaxInt64, []intSpan{{0, 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := backfill.IntRange(tt.lo, tt.hi, tt.step)
			chunks := mustChunks(t, c)
			requireIntTiling(t, chunks, tt.lo, tt.hi)
			if diff := cmp.Diff(tt.want, intSpans(chunks)); diff != "" {
				t.Errorf("IntRange(%d, %d, %d) mismatch (-want +got):\n%s", tt.lo, tt.hi, tt.step, diff)
			}
		})
	}
}

func TestIntRangeIDAndScope(t *testing.T) {
	t.Parallel()
	c := backfill.IntRange(1000, 3000, 1000)
	require.Equal(t, "int [1000, 3000) step 1000", c.Scope())
	chunks := mustChunks(t, c)
	want := []backfill.Chunk{
		{ID: "int:1000/2000", Seq: 0, Kind: backfilltype.KindInt, Lo: 1000, Hi: 2000},
		{ID: "int:2000/3000", Seq: 1, Kind: backfilltype.KindInt, Lo: 2000, Hi: 3000},
	}
	if diff := cmp.Diff(want, chunks); diff != "" {
		t.Errorf("IntRange chunks mismatch (-want +got):\n%s", diff)
	}
	require.Equal(t, "[1000, 2000)", chunks[0].String())
	lower, upper := chunks[0].Bounds()
	require.Equal(t, "1000", lower)
	require.Equal(t, "2000", upper)
	require.Equal(t, "int [-9223372036854775808, 9223372036854775807) step 1", backfill.IntRange(math.MinInt64, math.MaxInt64, 1).Scope())
}

func TestIntRangeErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		lo, hi, step int64
		want         error
		mention      string
	}{
		{"zero step", 0, 10, 0, backfill.ErrInvalidScope, "step 0 is not positive"},
		{"negative step", 0, 10, -1, backfill.ErrInvalidScope, "step -1 is not positive"},
		{"MinInt64 step", 0, 10, math.MinInt64, backfill.ErrInvalidScope, "not positive"},
		{"empty", 5, 5, 1, backfill.ErrEmptyScope, "lo 5 is not less than hi 5"},
		{"reversed", 6, 5, 1, backfill.ErrEmptyScope, "lo 6 is not less than hi 5"},
		{"reversed extremes", math.MaxInt64, math.MinInt64, 1, backfill.ErrEmptyScope, "not less than"},
		{"too many chunks", 0, 1<<20 + 1, 1, backfill.ErrInvalidScope, "1048577 chunks, more than 1048576"},
		{"whole range step 1", math.MinInt64, math.MaxInt64, 1, backfill.ErrInvalidScope, "18446744073709551615 chunks"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			chunks, err := backfill.IntRange(tt.lo, tt.hi, tt.step).Chunks(context.Background())
			require.ErrorIs(t, err, tt.want)
			require.Nil(t, chunks)
			require.True(t, strings.HasPrefix(err.Error(), "backfill: "), err.Error())
			require.Contains(t, err.Error(), tt.mention)
		})
	}
	// Exactly at the limit is fine.
	chunks := mustChunks(t, backfill.IntRange(0, 1<<20, 1))
	require.Len(t, chunks, 1<<20)
}

// requireIntTiling checks that chunks tile [lo, hi) in order with Seq as
// the position and IDs derived from the bounds.
func requireIntTiling(t require.TestingT, chunks []backfill.Chunk, lo, hi int64) {
	require.NotEmpty(t, chunks)
	require.Equal(t, lo, chunks[0].Lo)
	require.Equal(t, hi, chunks[len(chunks)-1].Hi)
	ids := make(map[string]bool, len(chunks))
	for i, c := range chunks {
		require.Equal(t, i, c.Seq)
		require.Equal(t, backfilltype.KindInt, c.Kind)
		require.Less(t, c.Lo, c.Hi, "chunk %v is empty", c)
		require.Equal(t, fmt.Sprintf("int:%d/%d", c.Lo, c.Hi), c.ID)
		require.False(t, ids[c.ID], "duplicate ID %s", c.ID)
		ids[c.ID] = true
		require.True(t, c.Contains(c.Lo), "chunk %v does not contain its lower bound", c)
		require.True(t, c.Contains(c.Hi-1), "chunk %v does not contain its last value", c)
		require.False(t, c.Contains(c.Hi), "chunk %v contains its upper bound", c)
		if i > 0 {
			require.Equal(t, chunks[i-1].Hi, c.Lo, "gap or overlap between %v and %v", chunks[i-1], c)
		}
	}
}

// drawInt64Near draws a value anywhere, or close to one of the extremes.
func drawInt64Near(rt *rapid.T, label string) int64 {
	return rapid.OneOf(
		rapid.Int64(),
		rapid.Int64Range(math.MaxInt64-1000, math.MaxInt64),
		rapid.Int64Range(math.MinInt64, math.MinInt64+1000),
		rapid.Int64Range(-1000, 1000),
	).Draw(rt, label)
}

func TestIntRangeProperty(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		a, b := drawInt64Near(rt, "a"), drawInt64Near(rt, "b")
		if a == b {
			rt.Skip("empty range")
		}
		lo, hi := min(a, b), max(a, b)
		bigLo, bigHi := big.NewInt(lo), big.NewInt(hi)
		spanBig := new(big.Int).Sub(bigHi, bigLo)

		// Keep the chunk count at most 300: step >= ceil(span/300).
		minStep := new(big.Int).Div(new(big.Int).Add(spanBig, big.NewInt(299)), big.NewInt(300)).Int64()
		minStep = max(minStep, 1)
		step := rapid.OneOf(
			rapid.Int64Range(minStep, min(minStep+1000, math.MaxInt64)),
			rapid.Int64Range(minStep, math.MaxInt64),
			rapid.Just(int64(math.MaxInt64)),
		).Draw(rt, "step")

		c := backfill.IntRange(lo, hi, step)
		chunks, err := c.Chunks(context.Background())
		require.NoError(rt, err, c.Scope())
		requireIntTiling(rt, chunks, lo, hi)

		// Bounds computed independently with arbitrary precision.
		wantN := new(big.Int).Div(new(big.Int).Add(spanBig, big.NewInt(step-1)), big.NewInt(step))
		require.Equal(rt, wantN.Int64(), int64(len(chunks)))
		for i, ch := range chunks {
			wantLo := new(big.Int).Add(bigLo, new(big.Int).Mul(big.NewInt(int64(i)), big.NewInt(step)))
			wantHi := new(big.Int).Add(wantLo, big.NewInt(step))
			if wantHi.Cmp(bigHi) > 0 {
				wantHi = bigHi
			}
			require.Equal(rt, wantLo.Int64(), ch.Lo, "chunk %d", i)
			require.Equal(rt, wantHi.Int64(), ch.Hi, "chunk %d", i)
		}

		again, err := c.Chunks(context.Background())
		require.NoError(rt, err)
		if diff := cmp.Diff(chunks, again); diff != "" {
			rt.Fatalf("second call differs (-first +second):\n%s", diff)
		}

		// Every value in [lo, hi) is in exactly one chunk, none outside.
		for i := range 20 {
			v := rapid.Int64Range(lo, hi-1).Draw(rt, fmt.Sprint("in", i))
			require.Len(rt, containing(chunks, v), 1, "value %d", v)
			if v >= math.MinInt32 && v <= math.MaxInt32 {
				require.Len(rt, containing(chunks, int32(v)), 1, "int32 value %d", v)
			}
			require.Len(rt, containing(chunks, int(v)), 1, "int value %d", v)
		}
		if lo > math.MinInt64 {
			v := rapid.Int64Range(math.MinInt64, lo-1).Draw(rt, "below")
			require.Empty(rt, containing(chunks, v), "value %d below the range", v)
		}
		v := rapid.Int64Range(hi, math.MaxInt64).Draw(rt, "above")
		require.Empty(rt, containing(chunks, v), "value %d at or above the range", v)
		require.Empty(rt, containing(chunks, fmt.Sprint(lo)), "a string is not an integer")
	})
}

func TestList(t *testing.T) {
	t.Parallel()
	c := backfill.List("tenant-9", "tenant-10", "tenant-1")
	chunks := mustChunks(t, c)
	want := []backfill.Chunk{
		{ID: "list:tenant-9", Seq: 0, Kind: backfilltype.KindList, Item: "tenant-9"},
		{ID: "list:tenant-10", Seq: 1, Kind: backfilltype.KindList, Item: "tenant-10"},
		{ID: "list:tenant-1", Seq: 2, Kind: backfilltype.KindList, Item: "tenant-1"},
	}
	if diff := cmp.Diff(want, chunks); diff != "" {
		t.Errorf("List chunks mismatch (-want +got):\n%s", diff)
	}
	for i, item := range []string{"tenant-9", "tenant-10", "tenant-1"} {
		require.Equal(t, []int{i}, containing(chunks, item))
	}
	require.Empty(t, containing(chunks, "tenant-2"))
	require.Empty(t, containing(chunks, "tenant"))
	require.Empty(t, containing(chunks, 9))
	require.Equal(t, "{tenant-9}", chunks[0].String())
	lower, upper := chunks[0].Bounds()
	require.Equal(t, "tenant-9", lower)
	require.Equal(t, "", upper)
}

func TestListScope(t *testing.T) {
	t.Parallel()
	scope := backfill.List("a", "b", "c").Scope()
	require.Regexp(t, `^list 3 items sha256:[0-9a-f]{16}$`, scope)
	// SHA-256 of the length-prefixed items: 0x01 'a' 0x01 'b' 0x01 'c'.
	require.Equal(t, "list 3 items sha256:ac678da99e6e9ebf", scope)
	require.Equal(t, scope, backfill.List("a", "b", "c").Scope(), "same items, same scope")

	others := []backfill.Chunker{
		backfill.List("a", "b"),
		backfill.List("a", "b", "c", "d"),
		backfill.List("a", "b", "x"),
		backfill.List("c", "b", "a"),
		backfill.List("ab", "c", ""),
		backfill.List("a", "bc", ""),
	}
	seen := map[string]bool{scope: true}
	for _, o := range others {
		require.False(t, seen[o.Scope()], "scope %q repeats", o.Scope())
		seen[o.Scope()] = true
	}

	// List copies its items.
	items := []string{"a", "b", "c"}
	c := backfill.List(items...)
	items[0] = "z"
	require.Equal(t, scope, c.Scope())
	require.Equal(t, "a", mustChunks(t, c)[0].Item)
}

func TestListErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		items   []string
		want    error
		mention string
	}{
		{"no items", nil, backfill.ErrEmptyScope, "list: no items"},
		{"empty slice", []string{}, backfill.ErrEmptyScope, "list: no items"},
		{"empty item", []string{"a", ""}, backfill.ErrInvalidScope, "item 1 is empty"},
		{"duplicate", []string{"a", "b", "a"}, backfill.ErrInvalidScope, `item 2 "a" duplicates item 0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			chunks, err := backfill.List(tt.items...).Chunks(context.Background())
			require.ErrorIs(t, err, tt.want)
			require.Nil(t, chunks)
			require.True(t, strings.HasPrefix(err.Error(), "backfill: "), err.Error())
			require.Contains(t, err.Error(), tt.mention)
		})
	}
}

func TestListProperty(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		items := rapid.SliceOfNDistinct(rapid.StringN(1, 12, -1), 1, 50, rapid.ID[string]).Draw(rt, "items")
		c := backfill.List(items...)
		chunks, err := c.Chunks(context.Background())
		require.NoError(rt, err)
		require.Len(rt, chunks, len(items))
		for i, ch := range chunks {
			require.Equal(rt, backfill.Chunk{ID: "list:" + items[i], Seq: i, Kind: backfilltype.KindList, Item: items[i]}, ch)
			require.Equal(rt, []int{i}, containing(chunks, items[i]))
		}
		again, err := c.Chunks(context.Background())
		require.NoError(rt, err)
		require.Equal(rt, chunks, again)
		require.Equal(rt, c.Scope(), backfill.List(items...).Scope())
		if len(items) > 1 {
			require.NotEqual(rt, c.Scope(), backfill.List(items[1:]...).Scope())
		}
	})
}
