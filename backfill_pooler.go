package backfill

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jmoiron/sqlx"
)

// Pooler safety. Behind a transaction pooler (PgBouncer with pool_mode =
// transaction), a client's server connection is its own only while a
// transaction is open; between transactions the pooler may hand it to
// another client. So:
//
//   - A statement with bind parameters runs in a transaction. lib/pq sends
//     one outside a transaction in two round trips (Parse, Describe, Sync;
//     then Bind, Execute, Sync), and the pooler may run the second on
//     another server connection, where the unnamed statement is another
//     client's or none ("bind message has 13 result formats but query has
//     1 columns", "unnamed prepared statement does not exist"). Reads go
//     through inTx too (a short READ COMMITTED transaction); a statement
//     without parameters (the simple query protocol, one round trip) may
//     run outside one.
//   - No session state outlives a transaction: settings are made with
//     SET LOCAL or set_config(..., true), advisory locks are transaction
//     locks (pg_advisory_xact_lock), temporary tables are dropped on
//     commit, no named prepared statements.
//
// The methods of pgDB below are the statements that the library runs on
// a Postgres DB outside a transaction. They behave as the embedded
// *sqlx.DB's, and report a statement with parameters to outsideTxHook
// when one is set (by the tests: a statement the pooler may mix up).

// outsideTxHook, when not nil, is called with every statement with bind
// parameters run on a pgDB outside a transaction. Tests set it.
var outsideTxHook func(query string)

// outsideTxAnyHook, when not nil, is called with every statement run on a
// pgDB outside a transaction, with or without parameters. Tests set it.
var outsideTxAnyHook atomic.Pointer[func(query string)]

func (d pgDB) checkOutsideTx(query string, args []any) {
	if h := outsideTxAnyHook.Load(); h != nil {
		(*h)(query)
	}
	if len(args) > 0 && outsideTxHook != nil {
		outsideTxHook(query)
	}
}

// ExecContext implements sqlx.ExecerContext.
func (d pgDB) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	d.checkOutsideTx(query, args)
	return d.DB.ExecContext(ctx, query, args...)
}

// QueryContext implements sqlx.QueryerContext.
func (d pgDB) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	d.checkOutsideTx(query, args)
	return d.DB.QueryContext(ctx, query, args...)
}

// QueryxContext implements sqlx.QueryerContext.
func (d pgDB) QueryxContext(ctx context.Context, query string, args ...any) (*sqlx.Rows, error) {
	d.checkOutsideTx(query, args)
	return d.DB.QueryxContext(ctx, query, args...)
}

// QueryRowxContext implements sqlx.QueryerContext.
func (d pgDB) QueryRowxContext(ctx context.Context, query string, args ...any) *sqlx.Row {
	d.checkOutsideTx(query, args)
	return d.DB.QueryRowxContext(ctx, query, args...)
}

// readTx runs the reads of f in a transaction when db is not one (inTx:
// READ COMMITTED, retried on 40001 and 40P01), so that their parameterised
// statements are safe behind a transaction pooler. f must only read, and
// must not keep state across attempts.
func readTx(ctx context.Context, db sqlx.ExtContext, f func(tx sqlx.ExtContext) error) error {
	return inTx(ctx, db, f)
}

// statementPoolerHint explains err, the failure of a BEGIN, when it is a
// dropped connection (driver.ErrBadConn) on a database that runs a
// statement without a transaction block: a pooler in statement mode
// (PgBouncer's pool_mode = statement) closes the connection of a client
// that begins a transaction, and lib/pq loses its message. backfill needs
// transactions. Other errors are returned as they are.
func statementPoolerHint(ctx context.Context, b txBeginner, err error) error {
	if !errors.Is(err, driver.ErrBadConn) {
		return err
	}
	ex, ok := b.(sqlx.ExecerContext)
	if !ok {
		return err
	}
	if _, perr := ex.ExecContext(ctx, `SELECT 1`); perr != nil {
		return err
	}
	return fmt.Errorf("%w: %w: the database runs statements but drops the connection at BEGIN, as a pooler in statement mode does "+
		"(PgBouncer pool_mode = statement); backfill needs transactions: set pool_mode = transaction (or session) for this database and user", errStatementPooler, err)
}

// errStatementPooler marks the error of a pooler in statement mode
// (statementPoolerHint): a configuration to fix, not a failure to retry.
var errStatementPooler = errors.New("pooler in statement mode")
