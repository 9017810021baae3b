package chunkers

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"iter"
	"slices"
	"strings"

	"github.com/pgbackfill/backfill/backfilltype"
)

// List is the chunker of backfill.List: one chunk per item.
type List struct {
	Items []string `json:"-" db:"-"`
}

// Scope returns e.g. "list 3 items sha256:1f2e3d4c5b6a7988".
func (c *List) Scope() string {
	h := sha256.New()
	var buf []byte
	for _, it := range c.Items {
		// Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
		buf = binary.AppendUvarint(buf[:0], uint64(len(it)))
		h.Write(buf)
		h.Write([]byte(it))
	}
	return fmt.Sprintf("list %d items sha256:%s", len(c.Items), hex.EncodeToString(h.Sum(nil)[:8]))
}

// Chunks implements [backfilltype.Chunker.Chunks]; see [List].
func (c *List) Chunks(ctx context.Context) ([]backfilltype.Chunk, error) {
	if err := c.check(ctx); err != nil {
		return nil, err
	}
	chunks := make([]backfilltype.Chunk, len(c.Items))
	for i, it := range c.Items {
		chunks[i] = backfilltype.Chunk{ID: "list:" + it, Seq: i, Kind: backfilltype.KindList, Item: it}
	}
	return chunks, nil
}

// check returns the errors of Chunks: an empty list, an empty item, a
// duplicate (the first in list order, named with the item it repeats),
// too many items. It sorts the items' positions, not a set of the items,
// so that a long list is checked in 4 bytes per item.
func (c *List) check(ctx context.Context) error {
	if len(c.Items) == 0 {
		return fmt.Errorf("%w: list: no items", backfilltype.ErrEmptyScope)
	}
	if len(c.Items) > maxChunks {
		return fmt.Errorf("%w: list: %d items, more than %d", backfilltype.ErrInvalidScope, len(c.Items), maxChunks)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	pos := make([]int32, len(c.Items))
	for i := range pos {
		pos[i] = int32(i)
	}
	slices.SortStableFunc(pos, func(a, b int32) int { return strings.Compare(c.Items[a], c.Items[b]) })
	dup, first := -1, -1
	for k := 1; k < len(pos); k++ {
		// Equal items are adjacent, in list order: pos[k] repeats the
		// first of its run.
		if c.Items[pos[k]] == c.Items[pos[k-1]] && (dup < 0 || int(pos[k]) < dup) {
			j := k - 1
			for j > 0 && c.Items[pos[j-1]] == c.Items[pos[k]] {
				j--
			}
			dup, first = int(pos[k]), int(pos[j])
		}
	}
	// The first bad item in list order, as a scan in order finds it.
	if i := slices.Index(c.Items, ""); i >= 0 && (dup < 0 || i < dup) {
		return fmt.Errorf("%w: list: item %d is empty", backfilltype.ErrInvalidScope, i)
	}
	if dup >= 0 {
		return fmt.Errorf("%w: list: item %d %q duplicates item %d", backfilltype.ErrInvalidScope, dup, c.Items[dup], first)
	}
	return nil
}

// ChunkSeq implements [backfilltype.ChunkStreamer.ChunkSeq]; see [List].
func (c *List) ChunkSeq(ctx context.Context) iter.Seq2[backfilltype.Chunk, error] {
	return func(yield func(backfilltype.Chunk, error) bool) {
		if err := c.check(ctx); err != nil {
			yield(backfilltype.Chunk{}, err)
			return
		}
		for i, it := range c.Items {
			if !yield(backfilltype.Chunk{ID: "list:" + it, Seq: i, Kind: backfilltype.KindList, Item: it}, nil) {
				return
			}
		}
	}
}

// ChunkOf implements [backfilltype.ChunkStreamer.ChunkOf]; see [List].
func (c *List) ChunkOf(x backfilltype.Chunk) (backfilltype.Chunk, bool) {
	if x.Kind != backfilltype.KindList || x.Seq < 0 || x.Seq >= len(c.Items) || c.Items[x.Seq] != x.Item || x.ID != "list:"+x.Item {
		return backfilltype.Chunk{}, false
	}
	return backfilltype.Chunk{ID: x.ID, Seq: x.Seq, Kind: backfilltype.KindList, Item: x.Item}, true
}
