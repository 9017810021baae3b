package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilldriver"
)

// Bounded lock waits. An advisory lock the library waits for in a
// transaction that may already hold work (a chunk's staged rows, a
// rollback's checks) is taken by WaitLock in steps: each try runs in a
// savepoint with lock_timeout set to the step; a try that times out
// rolls back to the savepoint (what the transaction did before is kept)
// and reports the wait to the context's LockWaiting, which lists the
// holders (LockHolders), fences the stale workers among them and says
// whether to try again. So a holder that stopped (SIGSTOP, a frozen
// cgroup, a debugger) without its backend noticing is found and fenced
// within a step of its heartbeat going stale, and every step is logged
// with its holders. The lock's own statement puts the transaction's
// lock_timeout back once granted.

// DefaultLockStep is the lock_timeout of one try of WaitLock when the
// context carries no LockWaiting.
const DefaultLockStep = time.Second

// LockSpec names the advisory locks a statement of WaitLock asks for,
// for LockHolders to find the sessions holding a conflicting one: the
// two-int merge locks of Namespace (Keys exclusively, WholeTarget shared
// first; or WholeTarget exclusively when Whole), or, when Name is not
// "", the one-bigint lock hashtextextended(Name, 0).
type LockSpec struct {
	Namespace int32
	Keys      []int64
	Whole     bool
	Name      string
}

// LockWait is one step of a wait of WaitLock.
type LockWait struct {
	// What names the locks in messages ("key locks of public.t").
	What string
	Spec LockSpec
	// PID is the waiting backend's.
	PID int
	// Waited is the time since the first try.
	Waited time.Duration
	// Budget is the transaction's lock_timeout when the wait began (0:
	// none).
	Budget time.Duration
	// Done: the locks were granted after at least one step timed out;
	// the last report of the wait.
	Done bool
	// Tx is the waiting transaction, usable by Wait between two steps
	// (the step's savepoint is rolled back): a statement Wait needs (the
	// holders, their fence) runs there, on the connection the wait
	// already holds, rather than on another one a small pool (a pooler's
	// server connections) may not have while every connection waits.
	// An error there must not abort it: run it in a savepoint (InSavepoint).
	Tx sqlx.ExtContext
}

// InSavepoint runs f in tx inside a savepoint of its own, rolled back
// to when f fails, so that a failure of f leaves the rest of tx usable.
func InSavepoint(ctx context.Context, tx sqlx.ExtContext, f func(tx sqlx.ExtContext) error) error {
	if _, err := tx.ExecContext(ctx, `SAVEPOINT backfill_lock_holders`); err != nil {
		return err
	}
	if err := f(tx); err != nil {
		if _, rerr := tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_lock_holders; RELEASE SAVEPOINT backfill_lock_holders`); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	_, err := tx.ExecContext(ctx, `RELEASE SAVEPOINT backfill_lock_holders`)
	return err
}

// LockWaiting is how WaitLock waits: the lock_timeout of each try
// (Step), and Wait, called after each try that timed out (and once with
// Done when the locks were granted), which reports whether to try again.
// When it reports false, WaitLock returns the try's lock timeout (55P03).
type LockWaiting struct {
	Step time.Duration
	Wait func(ctx context.Context, w LockWait) bool
}

type lockWaitingKey struct{}

// WithLockWaiting returns ctx carrying lw for the WaitLock calls under
// it.
func WithLockWaiting(ctx context.Context, lw LockWaiting) context.Context {
	return context.WithValue(ctx, lockWaitingKey{}, lw)
}

// lockWaitingFrom returns the LockWaiting ctx carries or the default:
// steps of DefaultLockStep, waiting on (without a bound, until ctx ends).
func lockWaitingFrom(ctx context.Context) LockWaiting {
	lw, _ := ctx.Value(lockWaitingKey{}).(LockWaiting)
	if lw.Step <= 0 {
		lw.Step = DefaultLockStep
	}
	if lw.Wait == nil {
		lw.Wait = func(context.Context, LockWait) bool { return true }
	}
	return lw
}

// WaitLock takes the advisory locks of spec in tx in steps (see above).
// stmt builds the locking statement from cond, a condition without
// columns that sets the step's lock_timeout, which the statement must
// evaluate before its first lock function (a one-time filter); args are
// its parameters. Without args, the statement is sent with the
// savepoint in one round trip (BatchTx). The error of a try that is not a
// lock timeout, or of the last one, is returned as it is.
func WaitLock(ctx context.Context, tx sqlx.ExtContext, what string, spec LockSpec, stmt func(cond string) string, args ...any) error {
	lw := lockWaitingFrom(ctx)
	// A step never exceeds the transaction's own lock_timeout (when set):
	// an application session queued behind the wait waits no longer
	// than that.
	step := max(lw.Step.Milliseconds(), 1)
	// The transaction's lock_timeout in milliseconds from its text
	// ("0", "250ms", "2s", "1min"), which interval input reads with its
	// unit: the pg_settings view would build every setting's row first,
	// a cost this statement pays once per chunk.
	q := stmt(fmt.Sprintf(`set_config('backfill.lock_wait', current_setting('lock_timeout'), true) IS NOT NULL
		AND set_config('lock_timeout', (SELECT CASE WHEN s.ms > 0 THEN least(s.ms, %d) ELSE %d END
			FROM (SELECT (extract(epoch FROM current_setting('lock_timeout')::interval) * 1000)::bigint AS ms) s)::text, true) IS NOT NULL`, step, step))
	w := LockWait{What: what, Spec: spec, Tx: tx}
	var begin time.Time
	for {
		if begin.IsZero() {
			begin = time.Now()
		}
		if err := Later(ctx, tx, `SAVEPOINT backfill_lock_wait`); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, q, args...)
		if err == nil {
			// Queued apart: a query queued after the first may be sent
			// with it (BatchTx.query), but not after the second, which
			// returns a row.
			if err := Later(ctx, tx, `RELEASE SAVEPOINT backfill_lock_wait`); err != nil {
				return err
			}
			if err := Later(ctx, tx, `SELECT set_config('lock_timeout', current_setting('backfill.lock_wait'), true)`); err != nil {
				return err
			}
			if w.PID != 0 {
				w.Done, w.Waited = true, time.Since(begin)
				lw.Wait(ctx, w)
			}
			return nil
		}
		var pe *pq.Error
		if !errors.As(err, &pe) || pe.Code != "55P03" || ctx.Err() != nil {
			return err
		}
		if _, rerr := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT backfill_lock_wait; RELEASE SAVEPOINT backfill_lock_wait`); rerr != nil {
			return errors.Join(err, rerr)
		}
		if w.PID == 0 {
			// Once a wait: the backend, and the lock_timeout the savepoint's
			// rollback put back (pg_settings: milliseconds).
			var row struct {
				PID    int   `db:"pid"`
				Budget int64 `db:"budget"`
			}
			if rerr := sqlx.GetContext(ctx, tx, &row, `SELECT pg_backend_pid() AS pid, setting::bigint AS budget FROM pg_settings WHERE name = 'lock_timeout'`); rerr != nil {
				return errors.Join(err, rerr)
			}
			w.PID, w.Budget = row.PID, time.Duration(row.Budget)*time.Millisecond
		}
		w.Waited = time.Since(begin)
		if !lw.Wait(ctx, w) || ctx.Err() != nil {
			return err
		}
	}
}

// lockSpecCond is the condition on pg_locks l that it is a lock
// conflicting with spec (holders: granted, other backends): $1 the
// namespace, $2 the keys (bigint[]), $3 whole, $4 the name.
const lockSpecCond = `l.locktype = 'advisory' AND l.granted
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND CASE WHEN $4 <> '' THEN l.objsubid = 1
				AND l.classid = ((hashtextextended($4, 0) >> 32) & 4294967295)::oid
				AND l.objid = (hashtextextended($4, 0) & 4294967295)::oid
			ELSE l.objsubid = 2 AND l.classid = ($1::bigint & 4294967295)::oid
				AND (l.objid = 4294967295 AND ($3 OR l.mode = 'ExclusiveLock')
					OR NOT $3 AND l.objid::bigint = ANY ($2::bigint[])) END`

// LockHolders lists the sessions other than pid that hold an advisory
// lock conflicting with w.Spec, as [backfilldriver.ChunkHolder]s
// without a chunk (Seq 0, ChunkID ""), the worker found by the
// session's application_name as in Holders. With fence, the same
// statement terminates the backend of each holder whose worker is stale,
// with Holders' condition (the lease fence's), unless the worker is self.
func (m *Manifest) LockHolders(ctx context.Context, db sqlx.ExtContext, w LockWait, self string, staleAfter time.Duration, fence bool) ([]backfilldriver.ChunkHolder, error) {
	ctx = m.purpose(ctx, "list lock holders", 0)
	var out []backfilldriver.ChunkHolder
	keys := w.Spec.Keys
	if keys == nil {
		keys = []int64{}
	}
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		out = out[:0]
		// db may be the waiting transaction itself (LockWait.Tx), whose
		// view of pg_stat_activity is taken once per transaction: clear it.
		if _, err := tx.ExecContext(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			return err
		}
		return sqlx.SelectContext(ctx, tx, &out, m.SQL(`SELECT 0 AS seq, '' AS chunk_id, l.pid, `+holderColumns("$8", "$6", "$7")+`
			FROM (SELECT DISTINCT l.pid FROM pg_locks l WHERE `+lockSpecCond+` AND l.pid <> $5 AND l.pid <> pg_backend_pid()) l
			`+holderJoin+` ORDER BY l.pid`),
			w.Spec.Namespace, pq.Array(keys), w.Spec.Whole, w.Spec.Name, w.PID, self, staleAfter.Seconds(), fence)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: holders of the %s: %w", w.What, err)
	}
	return out, nil
}

// LogLockHolder logs one session holding a lock a transaction waits for
// (WaitLock), in the shape of LogHolder: the holder (worker, host,
// backend pid, heartbeat age), how long the wait lasts so far, and
// whether the holder was fenced.
func LogLockHolder(log *slog.Logger, w LockWait, batchID int64, h backfilldriver.ChunkHolder) {
	attrs := holderAttrs([]any{"what", w.What, "batch_id", batchID}, h, w.Waited)
	switch {
	case h.Terminated:
		log.Warn("backfill: fenced a stale worker: terminated the backend holding a lock this transaction waits for; its transaction rolls back", attrs...)
	case h.Stale:
		log.Warn("backfill: waiting for a lock held by a stale worker (not fenced)", attrs...)
	case h.AgeSec < 0:
		log.Warn("backfill: waiting for a lock held by a session that is not a backfill worker", append(attrs, "lock_timeout", w.Budget)...)
	default:
		log.Info("backfill: waiting for a lock held by a live worker", attrs...)
	}
}

// LockName takes the one-bigint advisory lock hashtextextended(name, 0)
// of the library (its stage, version and view locks) in tx with
// WaitLock: in steps, each wait reported to the context's LockWaiting.
// what names the lock in messages.
func LockName(ctx context.Context, tx sqlx.ExtContext, what, name string) error {
	return WaitLock(ctx, tx, what, LockSpec{Name: name}, func(cond string) string {
		return `SELECT pg_advisory_xact_lock(hashtextextended($1, 0)) WHERE ` + cond
	}, name)
}
