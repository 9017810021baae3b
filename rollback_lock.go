package backfill

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// A rollback by the undo log takes the target's merge lock in each of its
// transactions: every transaction that checks or writes
// ([undoRollback.lockedTx]) first takes the target's whole-target merge
// lock ([pgstore.WholeTarget] in [pgstore.LockNamespace]) exclusively, as a
// transaction lock, then checks for conflicts, then writes. So it waits for
// the merges into the target in flight, and sees the deliveries they
// committed; a merge that commits between two of its transactions stops it
// with [ErrRollbackConflict] before the next one writes. The lock is never
// held across transactions (poolers), and lock -1 comes before any other
// lock, as in a merge, so no cycle forms. The design note
// docs/design/rollback.md explains the alternatives.

// lockTarget takes the target's merge lock for tx (see above), in
// bounded steps ([pgstore.WaitLock], [Runner.lockWaiting]): each wait is
// logged with the holders, a stale worker holding it (a merge frozen
// before its commit) is fenced, and a session that is no worker holds
// it for the transaction's lock_timeout at most (InBoundedTx then
// retries by Config.LockRetries). A runner
// whose DB is not one of Postgres (a DB of the caller's, such as
// backfilltest's) takes no lock.
func (u *undoRollback) lockTarget(ctx context.Context, tx sqlx.ExtContext) error {
	if _, ok := u.r.db.(pgstore.PGDB); !ok {
		return nil
	}
	ns := pgstore.LockNamespace(cmp.Or(u.info.LockRoot, u.info.Target.Table))
	lctx := pgstore.WithLockWaiting(ctx, u.r.lockWaiting(u.r.cfg.Logger, u.run.BatchID, "", nil))
	err := pgstore.WaitLock(lctx, tx, "merge lock of "+u.info.Target.Table+" (rollback)", pgstore.LockSpec{Namespace: ns, Whole: true}, func(cond string) string {
		return fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d, %d) WHERE %s`, ns, pgstore.WholeTarget, cond)
	})
	if err != nil {
		return fmt.Errorf("backfill: rollback of batch %d: wait for the merges into %s: %w", u.run.BatchID, u.info.Target.Table, err)
	}
	return nil
}

// lockedTx runs f in a transaction of the rollback (pgstore.InTx: READ
// COMMITTED, retried on 40001 and 40P01) that holds the target's merge
// lock. Unless the rollback is forced, it first checks again for the
// conflicts that a merge committed since the last check may have made with
// what f writes: those of the undo log of chunks seqs, the deliveries, and
// with lineage set the rows the batch inserted (a scan of the target:
// Finish). It returns [ErrRollbackConflict] without running f when there
// are any. (A rollback of the caller's, not the PostgreSQL merger's, takes
// no lock and checks once.)
func (u *undoRollback) lockedTx(ctx context.Context, seqs []int, lineage bool, f func(tx sqlx.ExtContext) error) error {
	ctx = pgstore.WithPurpose(ctx, "roll back chunks", 0)
	return pgstore.InBoundedTx(ctx, u.r.db, func(tx sqlx.ExtContext) error {
		if err := u.lockTarget(ctx, tx); err != nil {
			return err
		}
		if sc, ok := u.rb.(pgstore.ScopedConflicts); ok && !u.opts.Force {
			c, err := sc.ConflictsOf(ctx, tx, seqs, lineage)
			if err != nil {
				return err
			}
			if err := u.conflictError(c); err != nil {
				return err
			}
		}
		return f(tx)
	})
}

// sliceTx runs f, the rollback of the chunks seqs of a whole batch, in a
// transaction that holds the target's merge lock, as lockedTx does. Unless
// the rollback is forced, it checks the deliveries first; the rows the
// chunks updated, it does not check apart: f restores them and counts
// them against the undo log, and when it restored fewer
// ([pgstore.ErrSliceRecheck]: a later batch may have changed some, or
// chunks of the slice changed one row twice) the transaction rolls back
// and a second one checks for conflicts (lockedTx) before f rolls the
// chunks back one by one (checked), as without slices.
func (u *undoRollback) sliceTx(ctx context.Context, sr pgstore.SliceRollback, seqs []int, f func(tx sqlx.ExtContext, checked bool) error) error {
	ctx = pgstore.WithPurpose(ctx, "roll back chunks", 0)
	err := pgstore.InBoundedTx(ctx, u.r.db, func(tx sqlx.ExtContext) error {
		if err := u.lockTarget(ctx, tx); err != nil {
			return err
		}
		if !u.opts.Force {
			c, err := sr.DeliveredConflicts(ctx, tx)
			if err != nil {
				return err
			}
			if err := u.conflictError(c); err != nil {
				return err
			}
		}
		return f(tx, false)
	})
	if !errors.Is(err, pgstore.ErrSliceRecheck) {
		return err
	}
	return u.lockedTx(ctx, seqs, false, func(tx sqlx.ExtContext) error { return f(tx, true) })
}

// conflictError is the error of a check under the merge lock that found
// the conflicts c (nil for none).
func (u *undoRollback) conflictError(c RollbackConflicts) error {
	n := c.Changed + c.Delivered
	if n == 0 {
		return nil
	}
	rows := c.Rows[:min(100, len(c.Rows))]
	bs := conflictBatches(c)
	return fmt.Errorf("backfill: rollback of batch %d: %w: %d rows were changed (%d) or delivered unchanged (%d) by batches committed while it ran%s: %s; "+
		"the chunks rolled back so far stay rolled back; %s or use Force",
		u.run.BatchID, ErrRollbackConflict, n, c.Changed, c.Delivered, namedBatches(bs), conflictList(rows, n), rollBackFirst(bs))
}
