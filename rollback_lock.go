package backfill

import (
	"cmp"
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// A rollback by the undo log takes the target's merge lock in each of its
// transactions.
//
// Rollback decides what to delete and restore from what it sees of the
// target, its lineage and the deliveries of later batches (the conflict
// check). A merge of the same rows in flight, not yet committed, is
// invisible to it: without a lock, a rollback of batch 1 deletes the rows
// that batch 2, still merging, delivers unchanged, and batch 2 then
// commits "unchanged" rows that are gone. So every transaction of the
// rollback that checks or writes (lockedTx) first takes the target's
// whole-target merge lock (merge_lock.go, lock -1 of the target's
// namespace) exclusively, as a transaction lock (pg_advisory_xact_lock,
// released at its commit or rollback), then runs the conflict check, and
// only then writes: it waits for the merges into the target in flight
// (they hold lock -1 shared or exclusive until their chunk's transaction
// ends), and a merge that starts later waits for it; the check then sees
// the deliveries those merges committed and refuses. Between two
// transactions of the rollback a merge may commit: the next one's check
// sees it, and the rollback stops with [ErrRollbackConflict] before
// writing, the chunks rolled back so far staying rolled back (as after a
// crash; run it again, with Force or after rolling the later batch back).
//
// The lock is never held across transactions (no session lock): behind a
// transaction pooler (PgBouncer, pool_mode = transaction), a session lock
// would stay on a server connection that other clients then use, and its
// unlock could run on another one. Neither does the rollback hold a
// connection of its own while it works in others, which a pool of few
// server connections, taken by merges waiting for the lock, could leave
// waiting for ever.
//
// Lock order cannot form a cycle: each transaction takes lock -1 before
// any other lock of its own, and holds no row, advisory or manifest lock a
// merge waits for while it waits (the batch it rolls back is not running:
// rollbackBatch). Merges take lock -1 first, then key locks, then rows.

// lockTarget takes the target's merge lock for tx (see above). A runner
// whose DB is not one of Postgres (a DB of the caller's, such as
// backfilltest's) takes no lock.
func (u *undoRollback) lockTarget(ctx context.Context, tx sqlx.ExtContext) error {
	if _, ok := u.r.db.(pgstore.PGDB); !ok {
		return nil
	}
	ns := pgstore.LockNamespace(cmp.Or(u.info.LockRoot, u.info.Target.Table))
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1::int, $2::int)`, ns, pgstore.WholeTarget); err != nil {
		return fmt.Errorf("backfill: rollback of batch %d: wait for the merges into %s: %w", u.run.BatchID, u.info.Target.Table, err)
	}
	return nil
}

// lockedTx runs f in a transaction of the rollback (inTx: READ COMMITTED,
// retried on 40001 and 40P01) that holds the target's merge lock. Unless
// the rollback is forced, it first checks again for the conflicts that a
// merge committed since the last check may have made with what f writes:
// those of the undo log of chunks seqs, the deliveries, and with lineage
// set the rows the batch inserted (a scan of the target: Finish). It
// returns [ErrRollbackConflict] without running f when there are any. (A
// rollback of the caller's, not [PGMerger]'s, takes no lock and checks
// once.)
func (u *undoRollback) lockedTx(ctx context.Context, seqs []int, lineage bool, f func(tx sqlx.ExtContext) error) error {
	return pgstore.InBoundedTx(ctx, u.r.db, func(tx sqlx.ExtContext) error {
		if err := u.lockTarget(ctx, tx); err != nil {
			return err
		}
		if sc, ok := u.rb.(pgstore.ScopedConflicts); ok && !u.opts.Force {
			c, err := sc.ConflictsOf(ctx, tx, seqs, lineage)
			if err != nil {
				return err
			}
			if n := c.Changed + c.Delivered; n > 0 {
				rows := c.Rows[:min(100, len(c.Rows))]
				return fmt.Errorf("backfill: rollback of batch %d: %w: %d rows were changed (%d) or delivered unchanged (%d) by batches committed while it ran: %s; "+
					"the chunks rolled back so far stay rolled back; roll those batches back first or use Force",
					u.run.BatchID, ErrRollbackConflict, n, c.Changed, c.Delivered, conflictList(rows, n))
			}
		}
		return f(tx)
	})
}
