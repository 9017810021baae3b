package backfilldriver

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// Merger loads a chunk's rows into staging and merges them into the target
// by business key. The PostgreSQL merger (backfill.Config's default
// Merger) is the PostgreSQL implementation; backfilltest.Merger the
// in-memory fake; backfilltest.TestMerger the conformance suite.
//
// Methods take the executor per call; Stage receives the chunk's
// transaction. Implementations must be safe for concurrent use on
// different transactions.
type Merger interface {
	// Prepare checks the target once per run before any chunk: the table
	// and columns exist ([backfilltype.ErrTargetNotFound]) and a unique
	// index covers exactly the business key
	// ([backfilltype.ErrNoUniqueKey]). It resolves empty Target.Columns and
	// fills in the defaults of Mode and Duplicates.
	Prepare(ctx context.Context, db sqlx.ExtContext, t backfilltype.Target) (backfilltype.TableInfo, error)
	// Stage opens an empty staging area for one chunk in tx. The returned
	// Stager is used by one goroutine and ends with Merge or Close.
	Stage(ctx context.Context, tx sqlx.ExtContext, info backfilltype.TableInfo) (Stager, error)
}

// Stager holds one chunk's staged rows until they are merged. Not safe for
// concurrent use.
type Stager interface {
	// Add stages one row: row is its 1-based number in the chunk (the order
	// for [backfilltype.DuplicatePolicy]), values follow TableInfo.Columns
	// and are already converted to the column types. Key values are never
	// nil.
	Add(ctx context.Context, row int64, values []any) error
	// Merge ends staging and merges the staged rows into the target in the
	// chunk's transaction. Rows identical to their target row write
	// nothing. Repeated business keys are resolved by Target.Duplicates
	// first. It may be called once.
	Merge(ctx context.Context) (backfilltype.MergeResult, error)
	// Close releases the stager's resources; it is safe after Merge and
	// after errors, and idempotent.
	Close() error
}
