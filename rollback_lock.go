package backfill

import (
	"context"
	"database/sql/driver"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// A rollback by the undo log takes the target's merge lock.
//
// Rollback decides what to delete and restore from what it sees of the
// target, its lineage and the deliveries of later batches (the conflict
// check). A merge of the same rows in flight, not yet committed, is
// invisible to it: without a lock, a rollback of batch 1 deletes the rows
// that batch 2, still merging, delivers unchanged, and batch 2 then
// commits "unchanged" rows that are gone. So the rollback takes the
// target's whole-target merge lock (merge_lock.go, lock -1 of the target's
// namespace) exclusively, at session level on one connection, before its
// conflict check, and does all its reading and writing on that
// connection until it returns. It waits for the merges into the target in
// flight (they hold lock -1 shared or exclusive until their chunk's
// transaction ends) and every merge that starts later waits for it; its
// conflict check then sees the deliveries those merges committed and
// refuses.
//
// Lock order cannot form a cycle: the rollback takes lock -1 before any
// other lock of its own, and holds no row, advisory or manifest lock a
// merge waits for while it waits (the batch it rolls back is not running:
// rollbackBatch). Merges take lock -1 first, then key locks, then rows.

// lockTarget takes the target's merge lock for the rollback (see above)
// and points u.db at the connection holding it. The returned func
// releases it; a connection whose unlock fails is discarded, not returned
// to the pool still holding the lock. A runner whose DB is not one of
// Postgres (a DB of the caller's) takes no lock: its connection pool is
// not ours to hold a connection of.
func (u *undoRollback) lockTarget(ctx context.Context) (unlock func(), err error) {
	pd, ok := u.r.db.(pgDB)
	if !ok || pd.DB == nil {
		return func() {}, nil
	}
	conn, err := pd.DB.Connx(ctx)
	if err != nil {
		return nil, fmt.Errorf("backfill: rollback of batch %d: connection: %w", u.run.BatchID, err)
	}
	info := u.info
	ns := lockNamespace(cmpOr(info.lockRoot, info.Target.Table))
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1::int, $2::int)`, ns, wholeTarget); err != nil {
		discard(conn)
		return nil, fmt.Errorf("backfill: rollback of batch %d: wait for the merges into %s: %w", u.run.BatchID, info.Target.Table, err)
	}
	u.db = connDB{Conn: conn, driver: pd.DB.DriverName()}
	return func() {
		u.db = u.r.db
		if _, err := conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1::int, $2::int)`, ns, wholeTarget); err != nil {
			discard(conn)
			return
		}
		_ = conn.Close()
	}, nil
}

// discard closes conn and drops its session from the pool (its session
// may hold a lock).
func discard(conn *sqlx.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// connDB is one connection of a pool as a sqlx.ExtContext that begins
// its transactions on that connection (inTx).
type connDB struct {
	*sqlx.Conn
	driver string
}

// DriverName implements sqlx.ExtContext.
func (c connDB) DriverName() string { return c.driver }

// BindNamed implements sqlx.ExtContext.
func (c connDB) BindNamed(query string, arg any) (string, []any, error) {
	return sqlx.BindNamed(sqlx.BindType(c.driver), query, arg)
}
