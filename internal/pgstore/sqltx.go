package pgstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/jmoiron/sqlx/reflectx"
)

// SQLTx returns the database/sql transaction under tx, a chunk's
// transaction, for code outside the library that writes in it (an
// engine's job completion, backfill.Runner.RunChunk). The statements a
// BatchTx queued are sent first, so that the order of the statements on
// the server stays the order they were issued in. A transaction that is
// not database/sql's (backfilltest's DB) is an error.
func SQLTx(ctx context.Context, tx sqlx.ExtContext) (*sql.Tx, error) {
	if b, ok := tx.(*BatchTx); ok {
		if err := b.flush(ctx); err != nil {
			return nil, err
		}
		tx = b.Tx
	}
	switch t := tx.(type) {
	case *connTx:
		return t.Tx.Tx, nil
	case *sqlx.Tx:
		return t.Tx, nil
	}
	return nil, fmt.Errorf("backfill: the chunk's transaction (%T) is not a database/sql transaction: a Runner on backfill.Postgres has one", tx)
}

// ExtTx is a caller's database/sql transaction as the executor the
// manifest's methods take: they run their statements in it, beginning
// no transaction of their own (InTx runs f on an executor that cannot
// begin one). Its statements use PostgreSQL's $n placeholders as
// written.
func ExtTx(tx *sql.Tx) sqlx.ExtContext {
	return &sqlx.Tx{Tx: tx, Mapper: reflectx.NewMapperFunc("db", strings.ToLower)}
}
