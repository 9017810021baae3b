package backfilltype

import (
	"context"
	"fmt"
	"iter"
	"time"
)

// ChunkKind says which dimension a [Chunk] bounds.
type ChunkKind string

const (
	// KindTime chunks bound an instant: [Chunk.Start, Chunk.End).
	KindTime ChunkKind = "time"
	// KindInt chunks bound an integer key: [Chunk.Lo, Chunk.Hi).
	KindInt ChunkKind = "int"
	// KindList chunks hold exactly one item of an explicit list (a tenant,
	// a file name): the half-open interval [Item, successor(Item)).
	KindList ChunkKind = "list"
)

// Chunk is one unit of work of a backfill: a half-open interval of the
// chunking dimension, loaded, merged and checkpointed in one transaction.
//
// A chunk's ID is derived from its bounds only, so the same scope always
// yields the same IDs and a resumed run finds the chunks it already
// completed. Exactly one group of bound fields is set, chosen by Kind.
type Chunk struct {
	// ID is stable and derived from Kind and the bounds, e.g.
	// "time:2024-03-10T00:00:00-05:00/2024-03-11T00:00:00-04:00",
	// "int:1000/2000" or "list:tenant-42".
	ID string
	// Seq is the chunk's 0-based position in its plan.
	Seq int
	// Kind selects which bounds below are meaningful.
	Kind ChunkKind

	// Start is the inclusive lower bound of a KindTime chunk, in the
	// chunker's location.
	Start time.Time
	// End is the exclusive upper bound of a KindTime chunk.
	End time.Time

	// Lo is the inclusive lower bound of a KindInt chunk.
	Lo int64
	// Hi is the exclusive upper bound of a KindInt chunk.
	Hi int64

	// Item is the single value of a KindList chunk.
	Item string
}

// Duration returns End-Start for a KindTime chunk (23h or 25h for a calendar
// day across a daylight-saving change) and 0 for other kinds.
func (c Chunk) Duration() time.Duration {
	if c.Kind != KindTime {
		return 0
	}
	return c.End.Sub(c.Start)
}

// Bounds returns the chunk's lower and upper bound as text, as recorded in
// the manifest: RFC 3339 with offset for time, decimal for int, and the
// item and an empty upper bound for list chunks.
func (c Chunk) Bounds() (lower, upper string) {
	switch c.Kind {
	case KindTime:
		return c.Start.Format(time.RFC3339Nano), c.End.Format(time.RFC3339Nano)
	case KindInt:
		return fmt.Sprint(c.Lo), fmt.Sprint(c.Hi)
	default:
		return c.Item, ""
	}
}

// String returns the chunk in half-open notation, e.g.
// "[2024-03-10T00:00:00-05:00, 2024-03-11T00:00:00-04:00) America/New_York 23h0m0s".
func (c Chunk) String() string {
	switch c.Kind {
	case KindTime:
		return fmt.Sprintf("[%s, %s) %s %s", c.Start.Format(time.RFC3339Nano), c.End.Format(time.RFC3339Nano), c.Start.Location(), c.Duration())
	case KindInt:
		return fmt.Sprintf("[%d, %d)", c.Lo, c.Hi)
	default:
		return fmt.Sprintf("{%s}", c.Item)
	}
}

// Contains reports whether v lies in the chunk's half-open interval. v must
// be a time.Time for KindTime (compared as an instant, in any location), an
// int, int32 or int64 for KindInt and a string for KindList; any other type
// returns false. The chunks of a built-in chunker (backfill.Hours,
// backfill.Days, backfill.Months, backfill.Every, backfill.IntRange,
// backfill.List) tile their scope, so every value of the scope is contained
// in exactly one of them and no other value in any.
func (c Chunk) Contains(v any) bool {
	switch c.Kind {
	case KindTime:
		t, ok := v.(time.Time)
		return ok && !t.Before(c.Start) && t.Before(c.End)
	case KindInt:
		var n int64
		switch x := v.(type) {
		case int:
			n = int64(x)
		case int32:
			n = int64(x)
		case int64:
			n = x
		default:
			return false
		}
		return n >= c.Lo && n < c.Hi
	case KindList:
		s, ok := v.(string)
		return ok && s == c.Item
	}
	return false
}

// Chunker turns a frozen scope into the ordered, deterministic list of
// chunks that tile it: no gaps, no overlaps, each chunk half-open.
//
// Implementations must be safe to call more than once and must return the
// same chunks (same IDs, same order) for the same scope, because the plan
// fingerprint and resume depend on it. A Runner holds the chunks Chunks
// returns for the length of the call; a Chunker that also implements
// [ChunkStreamer], as the built-in ones do, is never asked for them all.
type Chunker interface {
	// Scope describes the whole scope in a stable, human-readable form
	// (e.g. "days [2006-01-01T00:00:00Z, 2006-04-01T00:00:00Z) UTC"). It is
	// part of the plan fingerprint.
	Scope() string
	// Chunks returns every chunk of the scope in order, with Seq set to the
	// position. It may query a database (key-range chunkers) and so takes a
	// context. It returns [ErrEmptyScope] for an empty scope and
	// [ErrInvalidScope] for bounds that cannot be chunked.
	Chunks(ctx context.Context) ([]Chunk, error)
}

// ChunkStreamer is an optional capability of a [Chunker]: its chunks one at
// a time, so that a long plan (a million chunks) is planned, claimed and
// resumed without every chunk in memory. The built-in chunkers
// (backfill.IntRange, backfill.List, backfill.Hours, backfill.Days,
// backfill.Months, backfill.Every) implement it.
//
// A Runner plans a job whose Chunker is a ChunkStreamer from ChunkSeq
// (inserting the manifest's chunk rows as they come, and hashing their
// IDs into the plan fingerprint, which is the same as from Chunks) and
// runs each chunk it claims as ChunkOf restores it from the manifest's
// row; it never calls Chunks. A Chunker that is not a ChunkStreamer is
// called once per Run and its []Chunk is held for the call: its memory
// (about 250 bytes per chunk) is the caller's to bound.
type ChunkStreamer interface {
	Chunker
	// ChunkSeq yields the chunks Chunks returns, in the same order with
	// Seq set, one at a time. An error (those of Chunks, or ctx's) is
	// yielded with a zero Chunk and ends the sequence. It may be
	// iterated more than once and yields the same chunks each time.
	ChunkSeq(ctx context.Context) iter.Seq2[Chunk, error]
	// ChunkOf returns the chunk of the scope that the manifest recorded
	// as c ([ChunkState.Chunk]: Seq, ID, Kind and bounds), as ChunkSeq
	// yields it: a time chunk's bounds in the chunker's location. ok is
	// false when c is not a chunk of the scope (another ID or other
	// bounds) or, where the chunker computes a Seq's chunk directly, not
	// the chunk of its Seq. A Runner runs only chunks of the run's batch,
	// whose fingerprint covers every chunk ID in order.
	ChunkOf(c Chunk) (chunk Chunk, ok bool)
}
