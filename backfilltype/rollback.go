package backfilltype

import (
	"fmt"
)

// RollbackScope is what one call of backfill.Runner.Rollback rolls back.
type RollbackScope struct {
	// BatchID is the batch rolled back.
	BatchID int64
	// Seqs are the chunks rolled back (done or open), in reverse plan
	// order; an UndoRollback that knows the order in which their merges
	// committed may roll them back in reverse commit order instead.
	Seqs []int
	// Chunk is the one chunk rolled back
	// (backfill.RollbackOptions.ChunkID), or nil for the whole batch.
	Chunk *ChunkState
	// Exclude are batches rolled back before this one by the same call
	// (backfill.Runner.RollbackModule): their changes do not conflict.
	Exclude []int64
	// ChunkColumn and Zone are the plan's: they find the rows one chunk
	// inserted ("": unknown).
	ChunkColumn, Zone string
}

// RollbackConflicts are the rows a rollback would delete or restore that
// later batches still applied changed or delivered unchanged.
type RollbackConflicts struct {
	// Changed counts the rows later batches changed (lineage UpdatedBy);
	// Delivered those they delivered unchanged, DeliveredDeleted how many
	// of these the rollback would delete (the rest it would restore).
	Changed, Delivered, DeliveredDeleted int64
	// Rows lists up to 100 of each kind, in any order.
	Rows []RollbackConflict
	// Batches are the later batches of all of them (each row's
	// RollbackConflict.Batch, not only those of Rows), in any order; nil
	// means those of Rows.
	Batches []int64
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
	// (lineage does not show it; see backfill.RollbackOptions.Force), false
	// when it changed the row.
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
