package backfill

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"

	"github.com/pgbackfill/backfill/backfilltype"
)

// maxChunks bounds the number of chunks a built-in chunker returns, so that
// a mistaken step (one second over ten years, a step of 1 over the whole
// int64 range) fails with ErrInvalidScope instead of exhausting memory.
// A million chunks is about a century of hours.
const maxChunks = 1 << 20

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
	return &intChunker{lo: lo, hi: hi, step: step}
}

// intChunker implements IntRange.
type intChunker struct{ lo, hi, step int64 }

// Scope returns e.g. "int [0, 10000) step 1000".
func (c *intChunker) Scope() string {
	return fmt.Sprintf("int [%d, %d) step %d", c.lo, c.hi, c.step)
}

// Chunks implements [backfilltype.Chunker.Chunks]; see [IntRange].
func (c *intChunker) Chunks(ctx context.Context) ([]Chunk, error) {
	n, err := c.count(ctx)
	if err != nil {
		return nil, err
	}
	chunks := make([]Chunk, 0, n)
	for i := range n {
		chunks = append(chunks, c.chunk(i))
	}
	return chunks, nil
}

// count returns the number of chunks, or the errors of Chunks.
func (c *intChunker) count(ctx context.Context) (int, error) {
	if c.step <= 0 {
		return 0, fmt.Errorf("%w: int: step %d is not positive", ErrInvalidScope, c.step)
	}
	if c.lo >= c.hi {
		return 0, fmt.Errorf("%w: int: lo %d is not less than hi %d", ErrEmptyScope, c.lo, c.hi)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	// hi-lo may not fit an int64 but always fits a uint64: 0 < hi-lo < 2^64,
	// and unsigned subtraction is exact modulo 2^64.
	span, step := uint64(c.hi)-uint64(c.lo), uint64(c.step)
	n := span / step
	if span%step != 0 {
		n++
	}
	if n > maxChunks {
		return 0, fmt.Errorf("%w: %s has %d chunks, more than %d", ErrInvalidScope, c.Scope(), n, maxChunks)
	}
	return int(n), nil
}

// chunk returns chunk i (0 <= i < count): [lo+i*step, lo+(i+1)*step)
// clipped to hi, computed without overflow.
func (c *intChunker) chunk(i int) Chunk {
	lo := int64(uint64(c.lo) + uint64(i)*uint64(c.step)) // < hi, so exact modulo 2^64
	hi := c.hi
	if uint64(c.hi)-uint64(lo) > uint64(c.step) {
		hi = lo + c.step // lo+step < c.hi, so no overflow
	}
	return Chunk{ID: "int:" + strconv.FormatInt(lo, 10) + "/" + strconv.FormatInt(hi, 10), Seq: i, Kind: backfilltype.KindInt, Lo: lo, Hi: hi}
}

// ChunkSeq implements [backfilltype.ChunkStreamer.ChunkSeq]; see [IntRange].
func (c *intChunker) ChunkSeq(ctx context.Context) iter.Seq2[Chunk, error] {
	return func(yield func(Chunk, error) bool) {
		n, err := c.count(ctx)
		if err != nil {
			yield(Chunk{}, err)
			return
		}
		for i := range n {
			if i%4096 == 4095 {
				if err := ctx.Err(); err != nil {
					yield(Chunk{}, err)
					return
				}
			}
			if !yield(c.chunk(i), nil) {
				return
			}
		}
	}
}

// ChunkOf implements [backfilltype.ChunkStreamer.ChunkOf]; see [IntRange].
func (c *intChunker) ChunkOf(x Chunk) (Chunk, bool) {
	n, err := c.count(context.Background())
	if err != nil || x.Kind != backfilltype.KindInt || x.Seq < 0 || x.Seq >= n {
		return Chunk{}, false
	}
	if want := c.chunk(x.Seq); want == x {
		return want, true
	}
	return Chunk{}, false
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
	return &listChunker{items: slices.Clone(items)}
}

// listChunker implements List.
type listChunker struct{ items []string }

// Scope returns e.g. "list 3 items sha256:1f2e3d4c5b6a7988".
func (c *listChunker) Scope() string {
	h := sha256.New()
	var buf []byte
	for _, it := range c.items {
		// Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
		buf = binary.AppendUvarint(buf[:0], uint64(len(it)))
		h.Write(buf)
		h.Write([]byte(it))
	}
	return fmt.Sprintf("list %d items sha256:%s", len(c.items), hex.EncodeToString(h.Sum(nil)[:8]))
}

// Chunks implements [backfilltype.Chunker.Chunks]; see [List].
func (c *listChunker) Chunks(ctx context.Context) ([]Chunk, error) {
	if err := c.check(ctx); err != nil {
		return nil, err
	}
	chunks := make([]Chunk, len(c.items))
	for i, it := range c.items {
		chunks[i] = Chunk{ID: "list:" + it, Seq: i, Kind: backfilltype.KindList, Item: it}
	}
	return chunks, nil
}

// check returns the errors of Chunks: an empty list, an empty item, a
// duplicate (the first in list order, named with the item it repeats),
// too many items. It sorts the items' positions, not a set of the items,
// so that a long list is checked in 4 bytes per item.
func (c *listChunker) check(ctx context.Context) error {
	if len(c.items) == 0 {
		return fmt.Errorf("%w: list: no items", ErrEmptyScope)
	}
	if len(c.items) > maxChunks {
		return fmt.Errorf("%w: list: %d items, more than %d", ErrInvalidScope, len(c.items), maxChunks)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	pos := make([]int32, len(c.items))
	for i := range pos {
		pos[i] = int32(i)
	}
	slices.SortStableFunc(pos, func(a, b int32) int { return strings.Compare(c.items[a], c.items[b]) })
	dup, first := -1, -1
	for k := 1; k < len(pos); k++ {
		// Equal items are adjacent, in list order: pos[k] repeats the
		// first of its run.
		if c.items[pos[k]] == c.items[pos[k-1]] && (dup < 0 || int(pos[k]) < dup) {
			j := k - 1
			for j > 0 && c.items[pos[j-1]] == c.items[pos[k]] {
				j--
			}
			dup, first = int(pos[k]), int(pos[j])
		}
	}
	// The first bad item in list order, as a scan in order finds it.
	if i := slices.Index(c.items, ""); i >= 0 && (dup < 0 || i < dup) {
		return fmt.Errorf("%w: list: item %d is empty", ErrInvalidScope, i)
	}
	if dup >= 0 {
		return fmt.Errorf("%w: list: item %d %q duplicates item %d", ErrInvalidScope, dup, c.items[dup], first)
	}
	return nil
}

// ChunkSeq implements [backfilltype.ChunkStreamer.ChunkSeq]; see [List].
func (c *listChunker) ChunkSeq(ctx context.Context) iter.Seq2[Chunk, error] {
	return func(yield func(Chunk, error) bool) {
		if err := c.check(ctx); err != nil {
			yield(Chunk{}, err)
			return
		}
		for i, it := range c.items {
			if !yield(Chunk{ID: "list:" + it, Seq: i, Kind: backfilltype.KindList, Item: it}, nil) {
				return
			}
		}
	}
}

// ChunkOf implements [backfilltype.ChunkStreamer.ChunkOf]; see [List].
func (c *listChunker) ChunkOf(x Chunk) (Chunk, bool) {
	if x.Kind != backfilltype.KindList || x.Seq < 0 || x.Seq >= len(c.items) || c.items[x.Seq] != x.Item || x.ID != "list:"+x.Item {
		return Chunk{}, false
	}
	return Chunk{ID: x.ID, Seq: x.Seq, Kind: backfilltype.KindList, Item: x.Item}, true
}
