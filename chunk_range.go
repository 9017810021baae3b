package backfill

import (
	"slices"

	"github.com/pgbackfill/backfill/internal/chunkers"
)

// IntRange returns a [Chunker] of [backfilltype.KindInt] chunks that tile
// the half-open integer range [lo, hi) in steps of step: chunk i is
// [lo+i*step, lo+(i+1)*step), and the last chunk is clipped to hi if step
// does not divide hi-lo. IDs are "int:<Lo>/<Hi>" in decimal, e.g.
// "int:1000/2000"; Scope is e.g. "int [0, 10000) step 1000".
//
// Any int64 bounds are accepted, math.MinInt64 and math.MaxInt64 included;
// the arithmetic checks for overflow instead of wrapping. Because the range
// is half-open, math.MaxInt64 itself can never be inside a chunk.
//
// Chunks returns [ErrInvalidScope] if step is not positive or the range has
// more than 1<<20 (1,048,576) chunks, and [ErrEmptyScope] if lo is not less
// than hi. The returned Chunker is immutable and safe for concurrent use.
func IntRange(lo, hi, step int64) Chunker {
	return &chunkers.IntRange{Lo: lo, Hi: hi, Step: step}
}

// List returns a [Chunker] of [backfilltype.KindList] chunks, one per item,
// in the given order: a tenant, a file, a partition. IDs are "list:<item>",
// e.g. "list:tenant-42". Scope is "list <n> items sha256:<16 hex digits>",
// a SHA-256 prefix over the items in order, so it changes when an item is
// added, removed, renamed or moved. List copies items; changing the slice
// afterwards does not change the chunker.
//
// Chunks returns [ErrEmptyScope] if there are no items, and
// [ErrInvalidScope] if an item is the empty string, two items are equal or
// there are more than 1<<20 (1,048,576) items. The returned Chunker is
// immutable and safe for concurrent use.
func List(items ...string) Chunker {
	return &chunkers.List{Items: slices.Clone(items)}
}
