// Package backfilltest holds in-memory fakes of the backfill interfaces
// and the conformance suites that the fakes and the PostgreSQL
// implementations pass alike, so that host applications can test their
// pipelines without a database and trust that the fakes behave like the
// real thing.
//
// A test with fakes:
//
//	db := backfilltest.NewDB()
//	merger := backfilltest.NewMerger()
//	merger.AddTable("orders", []string{"order_no"}, "order_no", "amount")
//	r, _ := backfill.NewWithDB(db, &backfill.Config{
//		Manifest: backfilltest.NewManifest(),
//		Merger:   merger,
//	})
//	report, err := r.Run(ctx, job)
//	rows := merger.Rows("orders")
package backfilltest

import (
	"context"
	"database/sql"
	"errors"
	"sync"

	"github.com/pgbackfill/backfill/backfilldriver"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

// ErrNoSQL is returned by every SQL method of the fake [DB] and [Tx]: the
// fakes keep their state in memory and run no SQL.
var ErrNoSQL = errors.New("backfilltest: the fake database runs no SQL")

// DB is an in-memory [backfill.DB]. Its transactions ([Tx]) collect the
// changes of the fakes and apply them on Commit, or drop them on Rollback,
// so a fake chunk is atomic like a real one. Safe for concurrent use.
type DB struct {
	noSQL
}

var _ backfill.DB = (*DB)(nil)

// NewDB returns an in-memory database for the fakes.
func NewDB() *DB { return &DB{} }

// Begin starts a transaction. It never fails unless ctx is done.
func (d *DB) Begin(ctx context.Context) (backfilldriver.Tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &Tx{}, nil
}

// Tx is a transaction of the fake [DB]. The fakes register what to do on
// commit and on rollback with [Tx.OnCommit] and [Tx.OnEnd].
type Tx struct {
	noSQL
	mu       sync.Mutex
	done     bool
	onCommit []func()
	onEnd    []func()
}

var _ backfilldriver.Tx = (*Tx)(nil)

// OnCommit registers f to run when the transaction commits, in
// registration order. On a finished transaction it does nothing and
// returns false.
func (tx *Tx) OnCommit(f func()) bool {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return false
	}
	tx.onCommit = append(tx.onCommit, f)
	return true
}

// OnEnd registers f to run when the transaction ends, after the commit
// functions on commit (used to release fake row locks).
func (tx *Tx) OnEnd(f func()) bool {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return false
	}
	tx.onEnd = append(tx.onEnd, f)
	return true
}

// Commit applies the registered changes. It returns sql.ErrTxDone after
// the transaction ended.
func (tx *Tx) Commit() error { return tx.end(true) }

// Rollback drops the registered changes. It returns sql.ErrTxDone after
// the transaction ended.
func (tx *Tx) Rollback() error { return tx.end(false) }

func (tx *Tx) end(commit bool) error {
	tx.mu.Lock()
	if tx.done {
		tx.mu.Unlock()
		return sql.ErrTxDone
	}
	tx.done = true
	fs, ends := tx.onCommit, tx.onEnd
	tx.mu.Unlock()
	if commit {
		for _, f := range fs {
			f()
		}
	}
	for _, f := range ends {
		f()
	}
	return nil
}

// apply runs f now, or on commit when ex is a fake transaction.
func apply(ex sqlx.ExtContext, f func()) error {
	if tx, ok := ex.(*Tx); ok {
		if !tx.OnCommit(f) {
			return sql.ErrTxDone
		}
		return nil
	}
	f()
	return nil
}

// noSQL implements sqlx.ExtContext for the fakes: every statement fails
// with ErrNoSQL (QueryRowxContext returns an empty row whose Scan must not
// be called).
type noSQL struct{}

// DriverName returns "backfilltest".
func (noSQL) DriverName() string { return "backfilltest" }

// Rebind returns q.
func (noSQL) Rebind(q string) string { return q }

// BindNamed returns ErrNoSQL.
func (noSQL) BindNamed(string, any) (string, []any, error) { return "", nil, ErrNoSQL }

// QueryContext returns ErrNoSQL.
func (noSQL) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	return nil, ErrNoSQL
}

// QueryxContext returns ErrNoSQL.
func (noSQL) QueryxContext(context.Context, string, ...any) (*sqlx.Rows, error) {
	return nil, ErrNoSQL
}

// QueryRowxContext returns an empty row; do not Scan it.
func (noSQL) QueryRowxContext(context.Context, string, ...any) *sqlx.Row {
	return &sqlx.Row{}
}

// ExecContext returns ErrNoSQL.
func (noSQL) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	return nil, ErrNoSQL
}
