package pgstore

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// ScopedConflicts is an [backfilldriver.UndoRollback] that checks the
// conflicts of some of its chunks: those not rolled back yet.
type ScopedConflicts interface {
	ConflictsOf(ctx context.Context, db sqlx.ExtContext, seqs []int, lineage bool) (backfilltype.RollbackConflicts, error)
}
