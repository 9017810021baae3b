package backfilldriver

import (
	"context"

	"github.com/jmoiron/sqlx"
)

// DB is what a backfill.Runner needs from a database: an executor for
// statements outside chunks and a way to begin a chunk's transaction.
// backfill.Postgres adapts a *sqlx.DB; backfilltest.NewDB returns an in-memory
// one for tests with fakes.
type DB interface {
	sqlx.ExtContext
	// Begin starts a transaction. Its Commit makes the chunk's merge,
	// exceptions and checkpoint durable together. The PostgreSQL merger
	// needs READ COMMITTED (or SERIALIZABLE) transactions: it locks the
	// chunk's keys, then reads the target in statements that must see what
	// the merges it waited for committed.
	Begin(ctx context.Context) (Tx, error)
}

// Tx is a chunk's transaction. *sqlx.Tx satisfies it.
type Tx interface {
	sqlx.ExtContext
	// Commit makes the transaction's writes durable and ends it; on an
	// error the Runner counts the chunk's attempt as failed.
	Commit() error
	// Rollback discards the transaction's writes and ends it. The Runner
	// may call it after Commit or after a failed Commit, and ignores its
	// error then, as database/sql's Tx allows (it returns sql.ErrTxDone).
	Rollback() error
}
