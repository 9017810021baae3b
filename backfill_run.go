package backfill

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jmoiron/sqlx"
)

// DB is what a [Runner] needs from a database: an executor for
// statements outside chunks and a way to begin a chunk's transaction.
// [Postgres] adapts a *sqlx.DB; backfilltest.NewDB returns an in-memory
// one for tests with fakes.
type DB interface {
	sqlx.ExtContext
	// Begin starts a transaction. Its Commit makes the chunk's merge,
	// exceptions and checkpoint durable together.
	Begin(ctx context.Context) (Tx, error)
}

// Tx is a chunk's transaction. *sqlx.Tx satisfies it.
type Tx interface {
	sqlx.ExtContext
	Commit() error
	Rollback() error
}

type pgDB struct{ *sqlx.DB }

func (d pgDB) Begin(ctx context.Context) (Tx, error) {
	return d.BeginTxx(ctx, &sql.TxOptions{})
}

// Postgres adapts db (opened with the "postgres" driver of lib/pq) to [DB].
func Postgres(db *sqlx.DB) DB { return pgDB{db} }

// Runner runs jobs. It is safe for concurrent use; several Runners, in one
// or many processes, may run the same job at once: each chunk is claimed by
// exactly one of them.
type Runner struct {
	db  DB
	cfg Config
}

// New returns a Runner on a PostgreSQL database. cfg may be nil. It returns
// an error wrapping [ErrInvalidConfig] naming a bad field.
func New(db *sqlx.DB, cfg *Config) (*Runner, error) {
	if db == nil {
		return nil, errors.New("backfill: new: nil db")
	}
	return NewWithDB(Postgres(db), cfg)
}

// NewWithDB returns a Runner on any [DB], such as backfilltest.NewDB for
// tests with fakes. cfg may be nil.
func NewWithDB(db DB, cfg *Config) (*Runner, error) {
	r := &Runner{db: db}
	if cfg != nil {
		r.cfg = *cfg
	}
	return r, nil
}

// Run freezes job into a plan and runs its chunks until all are done.
func (r *Runner) Run(ctx context.Context, job Job) (Report, error) {
	return Report{}, errors.New("backfill: not implemented")
}
