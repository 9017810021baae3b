package backfilltype

import (
	"time"
)

// Counts are the row outcomes of a chunk or a run. For every chunk
// Read == Inserted + Updated + Unchanged + Rejected + Deduplicated.
type Counts struct {
	// Read is every row the extractor passed to Write or Reject.
	Read int64 `db:"rows_read" json:"read"`
	// Inserted rows had a business key absent from the target.
	Inserted int64 `db:"rows_inserted" json:"inserted"`
	// Updated rows replaced a target row with different content.
	Updated int64 `db:"rows_updated" json:"updated"`
	// Unchanged rows matched a target row exactly and wrote nothing.
	Unchanged int64 `db:"rows_unchanged" json:"unchanged"`
	// Rejected rows went to the exception queue.
	Rejected int64 `db:"rows_rejected" json:"rejected"`
	// Deduplicated rows lost to another row of the same business key in
	// the same chunk ([DuplicatePolicy]).
	Deduplicated int64 `db:"rows_deduplicated" json:"deduplicated"`
}

// Balanced reports whether Read == Inserted + Updated + Unchanged +
// Rejected + Deduplicated.
func (c Counts) Balanced() bool {
	return c.Read == c.Inserted+c.Updated+c.Unchanged+c.Rejected+c.Deduplicated
}

// Add returns c + o, field by field.
func (c Counts) Add(o Counts) Counts {
	return Counts{
		Read: c.Read + o.Read, Inserted: c.Inserted + o.Inserted, Updated: c.Updated + o.Updated,
		Unchanged: c.Unchanged + o.Unchanged, Rejected: c.Rejected + o.Rejected, Deduplicated: c.Deduplicated + o.Deduplicated,
	}
}

// Reread returns the counts of a chunk read again while open
// ([ChunkOpen]): c are the counts it holds from its earlier reads, latest
// those of the read that just merged. They describe the chunk's rows as
// they stand, not the sum of the reads: Read, Rejected and Deduplicated
// are the latest read's (a row read, or rejected, by several reads
// counts once). Of the rows the latest read merged (its Inserted +
// Updated + Unchanged), those an earlier read inserted or changed stay
// counted as Inserted and Updated: Inserted is c.Inserted +
// latest.Inserted and Updated c.Updated + latest.Updated, each capped by
// the merged rows left (Inserted first); the rest are Unchanged. The
// result balances when latest does, and its Inserted and Updated never
// decrease from one read to the next unless the chunk's merged rows do
// (rows gone from the source, or now rejected). The counts are
// aggregates: a row inserted by one read and changed by the next counts
// as inserted, and rows changed by several reads are counted at most
// once each only as far as the cap tells.
func (c Counts) Reread(latest Counts) Counts {
	merged := latest.Inserted + latest.Updated + latest.Unchanged
	ins := min(c.Inserted+latest.Inserted, merged)
	upd := min(c.Updated+latest.Updated, merged-ins)
	return Counts{Read: latest.Read, Inserted: ins, Updated: upd, Unchanged: merged - ins - upd,
		Rejected: latest.Rejected, Deduplicated: latest.Deduplicated}
}

// ChunkResult is what one completed chunk recorded in the manifest.
type ChunkResult struct {
	Chunk Chunk
	Counts
	// Attempt is the 1-based attempt that completed the chunk.
	Attempt int
	// Worker is the backfill.Config.WorkerID of the process that completed it.
	Worker string
	// StartedAt and FinishedAt bound the successful attempt.
	StartedAt, FinishedAt time.Time
	// Open is true when the chunk is a time chunk whose end lies after
	// the run's horizon (the watermark of backfill.Job.Watermark taken by this
	// call, or StartedAt when earlier or without one): rows of its
	// interval may still arrive, so it is checkpointed as [ChunkOpen] and
	// read again by the next call instead of being final.
	Open bool
	// Skipped is true when the chunk's source and target rows were
	// unchanged since the last load and its staging and merge were
	// skipped (backfill.Job.SkipUnchanged).
	Skipped bool
}
