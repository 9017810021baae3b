package backfilldriver

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// ManifestRollback is implemented by manifests that keep the bookkeeping of
// a rollback by the undo log (backfill.Runner.Rollback,
// [backfilltype.RollbackUndoLog]): which run to roll back, which of its
// chunks are rolled back, and the audit log. backfill.PGManifest and
// backfilltest's Manifest do. A rollback needs it, and a [MergerRollback].
type ManifestRollback interface {
	ManifestAudit
	// Run returns the run of batchID ([backfilltype.ErrRunNotFound] if none).
	Run(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.Run, error)
	// RollBackChunk marks chunk seq of batchID rolled back in tx if it is
	// done or open, and reports whether it was; false (and no change)
	// when an earlier, interrupted rollback marked it already. It locks
	// the chunk's row until tx ends.
	RollBackChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, seq int) (bool, error)
	// RollBackRun sets the status of run batchID to rolled_back in tx.
	RollBackRun(ctx context.Context, tx sqlx.ExtContext, batchID int64) error
}

// UndoRollback is the rollback of one [backfilltype.RollbackScope] by the
// undo log ([MergerRollback]). The Runner calls Conflicts, then Preview or,
// one transaction each, RollBackChunk for every chunk of the scope in its
// order and Finish. force rolls back the conflicting rows too.
type UndoRollback interface {
	// Conflicts finds the rows later batches still applied changed or
	// delivered unchanged.
	Conflicts(ctx context.Context, db sqlx.ExtContext) (backfilltype.RollbackConflicts, error)
	// Preview counts the rows the rollback would delete and restore.
	Preview(ctx context.Context, db sqlx.ExtContext, force bool) (deleted, restored int64, err error)
	// RollBackChunk rolls back chunk seq in tx, marking it rolled back
	// in the manifest ([ManifestRollback.RollBackChunk]): rows it
	// updated get their earliest prior image back, rows it inserted are
	// deleted. done is false, and nothing changes, when the chunk was
	// rolled back already.
	RollBackChunk(ctx context.Context, tx sqlx.ExtContext, seq int, force bool) (deleted, restored int64, done bool, err error)
	// Finish ends the rollback in tx: for a whole batch (whole) it
	// deletes the rows the batch inserted that remain and sets the run
	// rolled back ([ManifestRollback.RollBackRun]); then it records
	// event(deleted) in the audit log.
	Finish(ctx context.Context, tx sqlx.ExtContext, whole, force bool, event func(deleted int64) backfilltype.Event) (deleted int64, err error)
}
