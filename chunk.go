package backfill

import "github.com/pgbackfill/backfill/backfilltype"

// Chunk is one unit of work of a backfill: a half-open interval of the
// chunking dimension, loaded, merged and checkpointed in one transaction.
//
// A chunk's ID is derived from its bounds only, so the same scope always
// yields the same IDs and a resumed run finds the chunks it already
// completed. Exactly one group of bound fields is set, chosen by Kind.
type Chunk = backfilltype.Chunk

// Chunker turns a frozen scope into the ordered, deterministic list of
// chunks that tile it: no gaps, no overlaps, each chunk half-open.
//
// Implementations must be safe to call more than once and must return the
// same chunks (same IDs, same order) for the same scope, because the plan
// fingerprint and resume depend on it. A Runner holds the chunks Chunks
// returns for the length of the call; a Chunker that also implements
// [ChunkStreamer], as the built-in ones do, is never asked for them all.
type Chunker = backfilltype.Chunker

// ChunkStreamer is an optional capability of a [Chunker]: its chunks one
// at a time, so that a long plan (a million chunks) is planned, claimed
// and resumed without every chunk in memory. The built-in chunkers
// ([IntRange], [List], [Hours], [Days], [Months], [Every]) implement it.
//
// A Runner plans a job whose Chunker is a ChunkStreamer from ChunkSeq
// (inserting the manifest's chunk rows as they come, and hashing their
// IDs into the plan fingerprint, which is the same as from Chunks) and
// runs each chunk it claims as ChunkOf restores it from the manifest's
// row; it never calls Chunks. A Chunker that is not a ChunkStreamer is
// called once per Run and its []Chunk is held for the call: its memory
// (about 250 bytes per chunk) is the caller's to bound.
type ChunkStreamer = backfilltype.ChunkStreamer
