package chunkers

import (
	"context"
	"fmt"
	"iter"
	"strconv"

	"github.com/pgbackfill/backfill/backfilltype"
)

// maxChunks bounds the number of chunks a built-in chunker returns, so that
// a mistaken step (one second over ten years, a step of 1 over the whole
// int64 range) fails with ErrInvalidScope instead of exhausting memory.
// A million chunks is about a century of hours.
const maxChunks = 1 << 20

// IntRange is the chunker of backfill.IntRange: [lo, hi) in steps.
type IntRange struct {
	Lo, Hi, Step int64 `json:"-" db:"-"`
}

// Scope returns e.g. "int [0, 10000) step 1000".
func (c *IntRange) Scope() string {
	return fmt.Sprintf("int [%d, %d) step %d", c.Lo, c.Hi, c.Step)
}

// Chunks implements [backfilltype.Chunker.Chunks]; see [IntRange].
func (c *IntRange) Chunks(ctx context.Context) ([]backfilltype.Chunk, error) {
	n, err := c.count(ctx)
	if err != nil {
		return nil, err
	}
	chunks := make([]backfilltype.Chunk, 0, n)
	for i := range n {
		chunks = append(chunks, c.chunk(i))
	}
	return chunks, nil
}

// count returns the number of chunks, or the errors of Chunks.
func (c *IntRange) count(ctx context.Context) (int, error) {
	if c.Step <= 0 {
		return 0, fmt.Errorf("%w: int: step %d is not positive", backfilltype.ErrInvalidScope, c.Step)
	}
	if c.Lo >= c.Hi {
		return 0, fmt.Errorf("%w: int: lo %d is not less than hi %d", backfilltype.ErrEmptyScope, c.Lo, c.Hi)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	// hi-lo may not fit an int64 but always fits a uint64: 0 < hi-lo < 2^64,
	// and unsigned subtraction is exact modulo 2^64.
	span, step := uint64(c.Hi)-uint64(c.Lo), uint64(c.Step)
	n := span / step
	if span%step != 0 {
		n++
	}
	if n > maxChunks {
		return 0, fmt.Errorf("%w: %s has %d chunks, more than %d", backfilltype.ErrInvalidScope, c.Scope(), n, maxChunks)
	}
	return int(n), nil
}

// chunk returns chunk i (0 <= i < count): [lo+i*step, lo+(i+1)*step)
// clipped to hi, computed without overflow.
func (c *IntRange) chunk(i int) backfilltype.Chunk {
	lo := int64(uint64(c.Lo) + uint64(i)*uint64(c.Step)) // < hi, so exact modulo 2^64
	hi := c.Hi
	if uint64(c.Hi)-uint64(lo) > uint64(c.Step) {
		hi = lo + c.Step // lo+step < c.hi, so no overflow
	}
	return backfilltype.Chunk{ID: "int:" + strconv.FormatInt(lo, 10) + "/" + strconv.FormatInt(hi, 10), Seq: i, Kind: backfilltype.KindInt, Lo: lo, Hi: hi}
}

// ChunkSeq implements [backfilltype.ChunkStreamer.ChunkSeq]; see [IntRange].
func (c *IntRange) ChunkSeq(ctx context.Context) iter.Seq2[backfilltype.Chunk, error] {
	return func(yield func(backfilltype.Chunk, error) bool) {
		n, err := c.count(ctx)
		if err != nil {
			yield(backfilltype.Chunk{}, err)
			return
		}
		for i := range n {
			if i%4096 == 4095 {
				if err := ctx.Err(); err != nil {
					yield(backfilltype.Chunk{}, err)
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
func (c *IntRange) ChunkOf(x backfilltype.Chunk) (backfilltype.Chunk, bool) {
	n, err := c.count(context.Background())
	if err != nil || x.Kind != backfilltype.KindInt || x.Seq < 0 || x.Seq >= n {
		return backfilltype.Chunk{}, false
	}
	if want := c.chunk(x.Seq); want == x {
		return want, true
	}
	return backfilltype.Chunk{}, false
}
