package backfill

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
)

// Statements sent later, with the next one (issue 15, per-chunk round
// trips).
//
// A chunk's transaction runs statements that return nothing the library
// reads and that fail only when the transaction is already lost: its
// savepoints and their releases, the merge's planner settings and their
// restore. Each one alone is a round trip to the server. batchTx queues
// them (later) and sends them in front of the next statement without
// parameters, in one simple query (lib/pq runs a statement without
// parameters as a simple query, which may hold several statements; the
// result is the last one's, its affected rows included). Before any other
// statement (one with parameters, a query, the COPY's prepare) and before
// the commit, the queue is sent on its own, so the order of the
// statements on the server is the order the library issued them in.
// Nothing outlives the transaction: a rollback drops the queue with the
// rest.

// batchTx is a chunk's transaction that sends the statements queued by
// later with the next statement.
type batchTx struct {
	Tx
	pending []string
	// fresh: the chunk this transaction fenced was pending (set by
	// runChunkLeased): no earlier read of it queued exceptions, and
	// PGManifest.CompleteChunk skips the statement that replaces them.
	fresh bool
}

// batched returns tx as a batchTx when it is a PostgreSQL transaction
// (one that can prepare statements: lib/pq's, possibly wrapped); another
// DB's (backfilltest's) as it is.
func batched(tx Tx) Tx {
	if _, ok := tx.(preparer); ok {
		return &batchTx{Tx: tx}
	}
	return tx
}

// later runs statement q (no parameters, no result read) in tx: queued
// when tx is a batchTx, at once otherwise.
func later(ctx context.Context, tx sqlx.ExtContext, q string) error {
	if b, ok := tx.(*batchTx); ok {
		b.pending = append(b.pending, q)
		return nil
	}
	_, err := tx.ExecContext(ctx, q)
	return err
}

// flush sends the queued statements on their own.
func (t *batchTx) flush(ctx context.Context) error {
	if len(t.pending) == 0 {
		return nil
	}
	q := strings.Join(t.pending, "; ")
	t.pending = t.pending[:0]
	if _, err := t.Tx.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("%s: %w", q, err)
	}
	return nil
}

// ExecContext runs q after the queued statements: in the same simple
// query when q has no parameters.
func (t *batchTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if len(args) == 0 && len(t.pending) > 0 {
		q = strings.Join(append(t.pending, q), "; ")
		t.pending = t.pending[:0]
		return t.Tx.ExecContext(ctx, q)
	}
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.ExecContext(ctx, q, args...)
}

// query returns q after the queued statements when q has no parameters
// and none of them returns rows (lib/pq returns the rows of the first
// statement of a simple query that has some), or sends the queue on its
// own first.
func (t *batchTx) query(ctx context.Context, q string, args []any) (string, error) {
	if len(t.pending) == 0 {
		return q, nil
	}
	rowless := true
	for _, p := range t.pending {
		rowless = rowless && (strings.HasPrefix(p, "SAVEPOINT ") || strings.HasPrefix(p, "RELEASE SAVEPOINT ") || strings.HasPrefix(p, "ROLLBACK TO SAVEPOINT "))
	}
	if len(args) == 0 && rowless {
		q = strings.Join(append(t.pending, q), "; ")
		t.pending = t.pending[:0]
		return q, nil
	}
	return q, t.flush(ctx)
}

// QueryContext implements sqlx.ExtContext.
func (t *batchTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	q, err := t.query(ctx, q, args)
	if err != nil {
		return nil, err
	}
	return t.Tx.QueryContext(ctx, q, args...)
}

// QueryxContext implements sqlx.ExtContext.
func (t *batchTx) QueryxContext(ctx context.Context, q string, args ...any) (*sqlx.Rows, error) {
	q, err := t.query(ctx, q, args)
	if err != nil {
		return nil, err
	}
	return t.Tx.QueryxContext(ctx, q, args...)
}

// QueryRowxContext implements sqlx.ExtContext. A failure of the queued
// statements sent on their own leaves the transaction aborted: the query
// then fails too.
func (t *batchTx) QueryRowxContext(ctx context.Context, q string, args ...any) *sqlx.Row {
	q, _ = t.query(ctx, q, args)
	return t.Tx.QueryRowxContext(ctx, q, args...)
}

// PrepareContext prepares q (the COPY of staging) after the queued
// statements.
func (t *batchTx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	p, ok := t.Tx.(preparer)
	if !ok {
		return nil, errNotTx
	}
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return p.PrepareContext(ctx, q)
}

// Commit sends the queued statements, then commits.
func (t *batchTx) Commit() error {
	if err := t.flush(context.Background()); err != nil {
		_ = t.Tx.Rollback()
		return err
	}
	return t.Tx.Commit()
}

// Rollback drops the queued statements and rolls back.
func (t *batchTx) Rollback() error {
	t.pending = nil
	return t.Tx.Rollback()
}
