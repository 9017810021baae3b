package pgstore

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// ScopedConflicts is an [backfilldriver.UndoRollback] that checks the
// conflicts of some of its chunks: those not rolled back yet.
type ScopedConflicts interface {
	// ConflictsOf returns the conflicts of the chunks seqs of the scope:
	// those of their undo log and deliveries and, when lineage is set,
	// of the rows they inserted, found by lineage (a scan of the target).
	ConflictsOf(ctx context.Context, db sqlx.ExtContext, seqs []int, lineage bool) (backfilltype.RollbackConflicts, error)
}

// ChunkOrder is an [backfilldriver.UndoRollback] that knows the order in
// which the chunks of its scope committed their merges. Chunks of one
// batch run concurrently, so that order need not be their plan order, and
// a chunk that changed a row another chunk of the batch changed before it
// logged that chunk's image as its prior image: only undoing the chunks in
// reverse commit order gives each row back the image it had before the
// batch.
type ChunkOrder interface {
	// OrderChunks reorders the chunks of the scope, the one whose merge
	// committed last first, and returns them; chunks that logged nothing
	// come last, in the scope's order.
	OrderChunks(ctx context.Context, db sqlx.ExtContext) ([]int, error)
}

// SliceRollback is an [backfilldriver.UndoRollback] that rolls back
// several chunks of a whole batch in one transaction, each statement set
// based over them (a slice: consecutive chunks in reverse commit order).
// Rows the batch inserted are left to Finish (lineage); History targets
// are rolled back chunk by chunk.
type SliceRollback interface {
	// RollBackChunks rolls back those of the chunks seqs of the batch
	// that are still done or open, in tx, marking them rolled back in the
	// manifest, and restores the earliest prior image of each row they
	// updated, unless a later batch changed it and not force. Unless
	// force, it returns ErrSliceRecheck when it restored fewer rows than
	// the undo log holds, and tx must not commit. It returns ErrSliceLegacy,
	// and tx must not commit, when their undo log holds inserted keys.
	// done is how many of seqs it rolled back.
	RollBackChunks(ctx context.Context, tx sqlx.ExtContext, seqs []int, force bool) (restored int64, done int, err error)
	// DeliveredConflicts returns the rows of the whole batch that later
	// batches still applied delivered unchanged (part of ConflictsOf).
	DeliveredConflicts(ctx context.Context, db sqlx.ExtContext) (backfilltype.RollbackConflicts, error)
}
