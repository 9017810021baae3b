package pgstore

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
)

// BatchTx is a chunk's transaction that sends the statements queued by
// Later with the next statement.
type BatchTx struct {
	backfilldriver.Tx
	pending []string
	// Fresh: the chunk this transaction fenced was pending (set by
	// runChunk): no earlier read of it queued exceptions, and
	// Manifest.CompleteChunk skips the statement that replaces them.
	Fresh bool `json:"-" db:"-"`
}

// Later runs statement q (no parameters, no result read) in tx: queued
// when tx is a BatchTx, at once otherwise.
func Later(ctx context.Context, tx sqlx.ExtContext, q string) error {
	if b, ok := tx.(*BatchTx); ok {
		b.pending = append(b.pending, q)
		return nil
	}
	_, err := tx.ExecContext(ctx, q)
	return err
}

// flush sends the queued statements on their own.
func (t *BatchTx) flush(ctx context.Context) error {
	if len(t.pending) == 0 {
		return nil
	}
	q := strings.Join(t.pending, "; ")
	what := queuedPurpose(t.pending)
	t.pending = t.pending[:0]
	if _, err := t.Tx.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("sending the chunk transaction's queued %s: %w", what, err)
	}
	return nil
}

// queuedPurpose says what the queued statements qs do, for an error
// (their SQL text is no help to an operator): "savepoints" for the
// savepoints of the merge's steps, "settings" for set_config, or both.
func queuedPurpose(qs []string) string {
	var savepoints, settings, other bool
	for _, q := range qs {
		switch {
		case strings.HasPrefix(q, "SAVEPOINT "), strings.HasPrefix(q, "RELEASE SAVEPOINT "), strings.HasPrefix(q, "ROLLBACK TO SAVEPOINT "):
			savepoints = true
		case strings.Contains(q, "set_config("):
			settings = true
		default:
			other = true
		}
	}
	var parts []string
	if savepoints {
		parts = append(parts, "savepoints")
	}
	if settings {
		parts = append(parts, "settings")
	}
	if other || len(parts) == 0 {
		parts = append(parts, "statements")
	}
	return strings.Join(parts, " and ")
}

// ExecContext runs q after the queued statements: in the same simple
// query when q has no parameters.
func (t *BatchTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
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
func (t *BatchTx) query(ctx context.Context, q string, args []any) (string, error) {
	if len(t.pending) == 0 {
		return q, nil
	}
	rowless := true
	for _, p := range t.pending {
		rowless = rowless && (strings.HasPrefix(p, "SAVEPOINT ") || strings.HasPrefix(p, "SET LOCAL ") || strings.HasPrefix(p, "RELEASE SAVEPOINT ") || strings.HasPrefix(p, "ROLLBACK TO SAVEPOINT "))
	}
	if len(args) == 0 && rowless {
		q = strings.Join(append(t.pending, q), "; ")
		t.pending = t.pending[:0]
		return q, nil
	}
	return q, t.flush(ctx)
}

// QueryContext implements sqlx.ExtContext.
func (t *BatchTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	q, err := t.query(ctx, q, args)
	if err != nil {
		return nil, err
	}
	return t.Tx.QueryContext(ctx, q, args...)
}

// QueryxContext implements sqlx.ExtContext.
func (t *BatchTx) QueryxContext(ctx context.Context, q string, args ...any) (*sqlx.Rows, error) {
	q, err := t.query(ctx, q, args)
	if err != nil {
		return nil, err
	}
	return t.Tx.QueryxContext(ctx, q, args...)
}

// QueryRowxContext implements sqlx.ExtContext. A failure of the queued
// statements sent on their own leaves the transaction aborted: the query
// then fails too.
func (t *BatchTx) QueryRowxContext(ctx context.Context, q string, args ...any) *sqlx.Row {
	q, _ = t.query(ctx, q, args)
	return t.Tx.QueryRowxContext(ctx, q, args...)
}

// PrepareContext prepares q (the COPY of staging) after the queued
// statements.
func (t *BatchTx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	p, ok := t.Tx.(Preparer)
	if !ok {
		return nil, errNotTx
	}
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return p.PrepareContext(ctx, q)
}

// Commit sends the queued statements, then commits.
func (t *BatchTx) Commit() error {
	if err := t.flush(context.Background()); err != nil {
		_ = t.Tx.Rollback()
		return err
	}
	return t.Tx.Commit()
}

// Rollback drops the queued statements and rolls back.
func (t *BatchTx) Rollback() error {
	t.pending = nil
	return t.Tx.Rollback()
}

// OutsideTxHook is, when not nil, called with every statement with bind
// parameters run on a [PGDB] outside a transaction. Tests set it.
var OutsideTxHook func(query string)

// OutsideTxAnyHook is, when not nil, called with every statement run on
// a [PGDB] outside a transaction, with or without parameters. Tests set
// it.
var OutsideTxAnyHook atomic.Pointer[func(query string)]

func (d PGDB) checkOutsideTx(query string, args []any) {
	if h := OutsideTxAnyHook.Load(); h != nil {
		(*h)(query)
	}
	if len(args) > 0 && OutsideTxHook != nil {
		OutsideTxHook(query)
	}
}

// ExecContext implements sqlx.ExecerContext.
func (d PGDB) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	d.checkOutsideTx(query, args)
	return d.DB.ExecContext(ctx, query, args...)
}

// QueryContext implements sqlx.QueryerContext.
func (d PGDB) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	d.checkOutsideTx(query, args)
	return d.DB.QueryContext(ctx, query, args...)
}

// QueryxContext implements sqlx.QueryerContext.
func (d PGDB) QueryxContext(ctx context.Context, query string, args ...any) (*sqlx.Rows, error) {
	d.checkOutsideTx(query, args)
	return d.DB.QueryxContext(ctx, query, args...)
}

// QueryRowxContext implements sqlx.QueryerContext.
func (d PGDB) QueryRowxContext(ctx context.Context, query string, args ...any) *sqlx.Row {
	d.checkOutsideTx(query, args)
	return d.DB.QueryRowxContext(ctx, query, args...)
}

// ReadTx runs the reads of f in a transaction when db is not one (InTx:
// READ COMMITTED, retried on 40001 and 40P01), so that their parameterised
// statements are safe behind a transaction pooler. As InBoundedTx, it sets
// lock_timeout (backfill.Config.LockTimeout) locally and retries a read
// whose lock wait timed out (an operator's LOCK TABLE on a manifest
// table) with the sleeps of backfill.Config.LockRetries, logging each
// wait with the sessions holding strong locks. f must only read, and
// must not keep state across attempts.
func ReadTx(ctx context.Context, db sqlx.ExtContext, f func(tx sqlx.ExtContext) error) error {
	return inTxIdle(ctx, db, txRead, f)
}

// SnapshotReadTx is ReadTx in one snapshot (REPEATABLE READ, read only):
// every statement of f sees the same committed state, so that figures
// read by separate statements (a run's counts and its chunks in flight)
// agree with each other.
func SnapshotReadTx(ctx context.Context, db sqlx.ExtContext, f func(tx sqlx.ExtContext) error) error {
	return inTxIdle(ctx, db, txReadSnapshot, f)
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
		"(PgBouncer pool_mode = statement); backfill needs transactions: set pool_mode = transaction (or session) for this database and user", ErrStatementPooler, err)
}

// ErrStatementPooler marks the error of a pooler in statement mode
// (statementPoolerHint): a configuration to fix, not a failure to retry.
var ErrStatementPooler = errors.New("pooler in statement mode")

// PGDB adapts a *sqlx.DB opened with lib/pq to [backfilldriver.DB]
// (backfill.Postgres returns one): statements outside chunks run on the
// pool, and Begin starts a chunk's READ COMMITTED transaction.
type PGDB struct {
	*sqlx.DB
	// Settings are the Runner's timeouts for the short manifest
	// transactions (nil: the defaults).
	Settings *TxSettings `json:"-" db:"-"`
	// Log is the Runner's logger, for the waits of those transactions
	// (nil: slog's default).
	Log *slog.Logger `json:"-" db:"-"`
}

// Begin starts a READ COMMITTED transaction, whatever the database's
// default_transaction_isolation: the merge takes its key locks
// ([PGStager.lockKeys]) and then reads the target in later statements, whose
// snapshots must show what the merges it waited for committed.
func (d PGDB) Begin(ctx context.Context) (backfilldriver.Tx, error) {
	return d.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
}

// RowAdder is where a row writer puts its converted rows: the chunk's
// [backfilldriver.Stager], or a spool.
type RowAdder interface {
	// Add adds converted row number row (1-based in the chunk), values in
	// the order of the table's columns, as [backfilldriver.Stager.Add].
	Add(ctx context.Context, row int64, values []any) error
}

// TxSettings are the timeouts the library sets in its transactions,
// resolved from a Config.
type TxSettings struct {
	// LockTimeout is Config.LockTimeout (negative: none set).
	LockTimeout time.Duration `json:"-" db:"-"`
	// StmtTimeout is Config.StatementTimeout (0: the session's; negative:
	// none).
	StmtTimeout time.Duration            `json:"-" db:"-"`
	Retries     []backfilltype.LockRetry `json:"-" db:"-"`
	// ConnBudget bounds the time a manifest transaction retries transient
	// faults of the connection or the server, from the first one (0:
	// DefaultConnBudget).
	ConnBudget time.Duration `json:"-" db:"-"`
}

// defaultTxSettings apply to manifest transactions on a database handle
// that no Runner configured (a *sqlx.DB passed to a [Manifest] directly).
var defaultTxSettings = TxSettings{LockTimeout: backfilltype.DefaultLockTimeout, Retries: backfilltype.DefaultLockRetries(backfilltype.DefaultLockTimeout)}

// TryLockTimeout is the lock_timeout of try n (0-based) of an attempt, as
// PostgreSQL reads it ("" sets none: the session's value stays).
func (s TxSettings) TryLockTimeout(n int) string {
	if s.LockTimeout < 0 || len(s.Retries) == 0 {
		return ""
	}
	t := s.Retries[min(n, len(s.Retries)-1)].Timeout
	if t <= 0 {
		t = s.LockTimeout
	}
	return msSetting(min(t, s.LockTimeout))
}

// StmtSetting is the statement_timeout the merge runs under ("" for the
// session's).
func (s TxSettings) StmtSetting() string {
	switch {
	case s.StmtTimeout < 0:
		return "0"
	case s.StmtTimeout > 0:
		return msSetting(s.StmtTimeout)
	}
	return ""
}

// manifestLockTimeout is the lock_timeout of the short manifest
// transactions ("" for none).
func (s TxSettings) manifestLockTimeout() string {
	if s.LockTimeout < 0 {
		return ""
	}
	return msSetting(cmp.Or(s.LockTimeout, backfilltype.DefaultLockTimeout))
}

// msSetting is d as a PostgreSQL time setting in milliseconds (at least 1).
func msSetting(d time.Duration) string {
	return fmt.Sprint(max(d.Milliseconds(), 1))
}

// shortTxSettings is the one statement (no parameters: pooler-safe) that
// sets the settings of a short manifest transaction: the idle timeout,
// and lock_timeout and statement_timeout unless ownWaits (the caller
// sets its own lock_timeout) or unset.
func shortTxSettings(s TxSettings, ownWaits bool) string {
	q := fmt.Sprintf(`SELECT set_config('idle_in_transaction_session_timeout', '%d', true)`, ManifestIdleMS.Load())
	if lt := s.manifestLockTimeout(); lt != "" && !ownWaits {
		q += `, set_config('lock_timeout', '` + lt + `', true)`
	}
	if st := s.StmtSetting(); st != "" {
		q += `, set_config('statement_timeout', '` + st + `', true)`
	}
	return q
}

// Jitter returns d scaled by a random factor in [0.75, 1.25).
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(float64(d) * (0.75 + rand.Float64()/2))
}

// sleepCtx sleeps for d, or until ctx is done: it reports whether the
// sleep ran its course (false: ctx was done first).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// WaitCode returns the SQLSTATE of err when it is a wait: lock timeout
// (55P03), deadlock (40P01), serialization failure (40001), or a
// cancelled statement (57014: a statement timeout, or a cancel by another
// session) while ctx is not done. It also returns PostgreSQL's message.
func WaitCode(ctx context.Context, err error) (code, msg string, ok bool) {
	var pe *pq.Error
	if err == nil || ctx.Err() != nil || !errors.As(err, &pe) {
		return "", "", false
	}
	switch pe.Code {
	case "55P03", "40P01", "40001", "57014":
		return string(pe.Code), pe.Message, true
	}
	return "", "", false
}

// retryWaits runs try until it returns nil, an error that is not a wait,
// or the table's rows are used up: a try that waited (WaitCode) is run
// again after the row's jittered sleep. The short manifest transactions
// use it; a chunk's tries are retried by the Runner (chunkWaited).
// Each wait is reported to waited (nil: none) before the sleep.
func retryWaits(ctx context.Context, retries []backfilltype.LockRetry, try func() error, waited func(code, msg string, try int, sleep time.Duration)) error {
	for n := 0; ; n++ {
		err := try()
		code, msg, ok := WaitCode(ctx, err)
		if !ok || n+1 >= len(retries) {
			return err
		}
		sleep := Jitter(retries[n].Sleep)
		if waited != nil {
			waited(code, msg, n+1, sleep)
		}
		if !sleepCtx(ctx, sleep) {
			return err
		}
	}
}
