package backfill

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

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

// recordDelivered summarises, after a merge, the staged rows that exist in
// the target last written by another batch (the chunk delivered them
// unchanged, or a conflict policy kept the target's version): one row per
// owner batch in info.Chunk.DeliveredTable. It does nothing without
// unchanged rows, lineage or a delivered table.
func (s *pgStager) recordDelivered(ctx context.Context, unchanged int64) error {
	t := s.info.Target
	if unchanged <= 0 || s.info.Chunk.DeliveredTable == "" || t.Lineage.UpdatedBy == "" {
		return nil
	}
	identity := s.info.identity()
	q := s.recordDeliveredSQL()
	if _, err := s.tx.ExecContext(ctx, q, s.info.Chunk.BatchID, s.info.Chunk.Seq, pq.Array(identity)); err != nil {
		return fmt.Errorf("backfill: merge %s: record unchanged deliveries: %w", t.Table, err)
	}
	return nil
}

// RollbackConflict is one row a rollback would delete or restore although
// a later batch that is still applied changed or delivered it.
type RollbackConflict struct {
	// Key is the row's identity (business key, plus ValidFrom in History
	// mode) as JSON, e.g. {"id": 1}.
	Key string
	// Batch is the later batch: the one that last changed the row
	// (lineage UpdatedBy), or the one that delivered it unchanged.
	Batch int64
	// Delivered is true when the later batch delivered the row unchanged
	// (lineage does not show it; see [RollbackOptions.Force]), false when
	// it changed the row.
	Delivered bool
}

// String renders the conflict for messages: `{"id": 1} (delivered
// unchanged by batch 2)`.
func (c RollbackConflict) String() string {
	if c.Delivered {
		return fmt.Sprintf("%s (delivered unchanged by batch %d)", c.Key, c.Batch)
	}
	return fmt.Sprintf("%s (changed by batch %d)", c.Key, c.Batch)
}

// delivered finds the rows that rolling back the chunks seqs of batch
// (one chunk, or the whole batch when chunk is nil) would delete or
// restore and that a done chunk of another batch, not in exclude,
// delivered unchanged (see recordDelivered). It returns how many, how many
// of them the rollback would delete (the rest it would restore), and up
// to 100 of them ordered by key.
func (rb *pgRollback) delivered(ctx context.Context, db sqlx.ExtContext, batch int64, seqs []int, chunk *ChunkState, exclude []int64) (n, deleted int64, rows []RollbackConflict, err error) {
	filter, fargs := rb.insertedFilter(chunk, 5)
	q := rb.deliveredSQL(chunk != nil, filter)
	var res []struct {
		N       int64  `db:"n"`
		Deleted int64  `db:"deleted"`
		Key     string `db:"key"`
		By      int64  `db:"by"`
	}
	// $1 batch, $2 identity, $3 exclude; for one chunk $4 seqs and the
	// chunk's bounds from $5.
	args := []any{batch, pq.Array(rb.identity), pq.Array(append([]int64{}, exclude...))}
	if chunk != nil {
		args = append(append(args, pq.Array(seqs)), fargs...)
	}
	if err := sqlx.SelectContext(ctx, db, &res, q, args...); err != nil {
		return 0, 0, nil, fmt.Errorf("backfill: rollback %s: rows delivered by later batches: %w", rb.info.Target.Table, err)
	}
	if len(res) == 0 {
		return 0, 0, nil, nil
	}
	for _, r := range res {
		rows = append(rows, RollbackConflict{Key: r.Key, Batch: r.By, Delivered: true})
	}
	return res[0].N, res[0].Deleted, rows, nil
}
