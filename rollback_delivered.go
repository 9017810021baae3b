package backfill

import "github.com/pgbackfill/backfill/backfilltype"

// Unchanged deliveries and rollback.
//
// Lineage records only the batches that changed a row: a row that a later
// batch delivered unchanged still names the batch that wrote it. Batch 1
// writes {1: 'same', 2: 'old'}, batch 2 (a restatement, or another job on
// the same target) writes {1: 'same', 3: 'new'}: key 1 says batch 1, and a
// rollback of batch 1 that trusted lineage alone would delete it (or, had
// batch 1 updated it, restore an image older than what batch 2 delivered)
// although batch 2, still applied, says it exists as it is.
//
// Three ways to know better were weighed:
//
//   - A per-row entry for each unchanged row whose last writer is another
//     batch (the undo log's way). Exact, but a restatement of an unchanged
//     range by a new batch, the common case, would write one entry per row:
//     WAL in proportion to the data, where a replay must write almost none.
//   - At rollback time only: treat every row inside the bounds of a later
//     batch's done chunk as delivered by it. No write at all, but it cannot
//     tell a row the later batch delivered from one it no longer had (key 2
//     above, which a restatement dropped), and a job without ChunkColumn has
//     no bounds: every row of the target would be "delivered".
//   - A summary per chunk (chosen): after the merge, in the chunk's
//     transaction, one read of the chunk's staged identities against the
//     target finds the rows the chunk delivered that another batch last
//     wrote (lineage UpdatedBy not this batch), and records for each such
//     owner batch one row in the manifest's delivered table: the owner,
//     how many rows, and the least and greatest identity among them. Only
//     chunks with unchanged rows run the read; a first load writes nothing
//     more, and a replay writes one small row per chunk and owner, not per
//     row.
//
// A rollback of batch B then treats a row it would delete or restore as
// delivered by batch D when a done chunk of D recorded owner B and the
// row's identity lies within that chunk's least and greatest identity.
// This is exact about which batches delivered rows of B (and when: the
// summary was taken after B wrote them), and conservative inside the
// identity bounds: a row of B between two rows D delivered, which D did not
// deliver itself, is reported too. Such a row is listed, never silently
// removed; Force removes it. Chunks whose batch or chunk was rolled back
// no longer count, so rolling back D first and then B works as before.
// Rows that the same batch's own chunks delivered again (overlapping chunk
// bounds) are not summarised.

// RollbackConflict is one row a rollback would delete or restore although
// a later batch that is still applied changed or delivered it.
type RollbackConflict = backfilltype.RollbackConflict
