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
