package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
)

// FenceCtxKey carries a fenceWait to the manifest's StartRun (which waits
// for the chunks in flight of the run it abandons).
type FenceCtxKey struct{}

// fenceWaitFrom returns the fenceWait ctx carries, or the defaults.
func fenceWaitFrom(ctx context.Context) backfilldriver.FenceWait {
	if w, ok := ctx.Value(FenceCtxKey{}).(backfilldriver.FenceWait); ok {
		return w
	}
	return backfilldriver.FenceWait{StaleAfter: backfilltype.DefaultStaleAfter, Poll: time.Second}
}

// liveLease is the SQL condition "the lease of chunk row c is held by a
// live worker" ($staleArg: the claimer's Config.StaleAfter in seconds):
// its worker is unfinished and heartbeating within its stale bound, or
// the lease is younger than the claimer's bound. The second arm matters
// when the claim's snapshot predates the worker's registration: the
// claim's lock rechecks the chunk's row as committed (READ COMMITTED),
// but its subquery on workers keeps the statement's snapshot.
func liveLease(staleArg string) string { return liveLeaseOf("c", staleArg) }

// liveLeaseOf is liveLease for the chunk row named alias.
func liveLeaseOf(alias, staleArg string) string {
	return alias + `.lease_key IS NOT NULL AND (` + alias + `.leased_at >= now() - make_interval(secs => ` + staleArg + `)
			OR EXISTS (SELECT 1 FROM {s}.workers w WHERE w.worker_key = ` + alias + `.lease_key AND w.finished_at IS NULL
				AND w.heartbeat_at >= now() - greatest(w.stale_after, make_interval(secs => ` + staleArg + `))))`
}

// LeaseChunk leases the first claimable chunk of batchID (the conditions
// of ClaimQuery) whose lease is free, not live, or key's own and not in
// l.Avoid (the caller lists there the chunks its goroutines work), in a
// short transaction of its own (InShortTx). Run again after its commit's
// answer was lost, it leases the chunk it had leased again (key's own
// lease), at the next epoch. ok is false when there is none.
//
// With l.JobConcurrency > 0 it leases only while fewer than that many
// chunks of the batch hold a live lease (full is then true), in a short
// transaction of its own (InShortTx): the job-wide
// concurrency cap. A chunk's lease lasts from this claim to the commit of
// its transaction, which clears it (the fence), so the count covers the
// chunks extracting and merging across every process. The lease
// transactions of a batch take a transaction-level advisory lock first,
// so that two of them do not both see the last free place; a worker that
// died holds its place only until its lease is no longer live.
func (m *Manifest) LeaseChunk(ctx context.Context, db sqlx.ExtContext, batchID int64, l backfilldriver.Lease) (cl backfilldriver.ChunkLease, ok, full bool, err error) {
	ctx = m.purpose(ctx, "lease a chunk", batchID)
	avoid := make([]int64, len(l.Avoid))
	for i, seq := range l.Avoid {
		avoid[i] = int64(seq)
	}
	var rows []struct {
		pgChunkRow
		Epoch     int64  `db:"lease_epoch"`
		RunStatus string `db:"run_status"`
		RunReason string `db:"run_reason"`
		RunKnobs  string `db:"run_knobs"`
	}
	if l.JobConcurrency <= 0 {
		// A transaction of its own, not a statement outside one: through
		// a transaction pooler (PgBouncer), the two messages of a
		// statement with bind parameters may reach two server
		// connections outside a transaction.
		err = InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
			rows = rows[:0]
			return sqlx.SelectContext(ctx, tx, &rows, m.SQL(LeaseQuery), batchID, pq.Array(avoid), l.Key, l.StaleAfter.Seconds(), "")
		})
	} else {
		err = InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
			rows, full = rows[:0], false
			var n int
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('backfill job concurrency ' || $1 || ' ' || $2, 0))`,
				m.SchemaName, batchID); err != nil {
				return err
			}
			if err := sqlx.GetContext(ctx, tx, &n, m.SQL(`SELECT count(*) FROM {s}.chunks c WHERE c.batch_id = $1 AND `+liveLease("$2")),
				batchID, l.StaleAfter.Seconds()); err != nil {
				return err
			}
			if n >= l.JobConcurrency {
				full = true
				return nil
			}
			return sqlx.SelectContext(ctx, tx, &rows, m.SQL(LeaseQuery), batchID, pq.Array(avoid), l.Key, l.StaleAfter.Seconds(), "")
		})
	}
	if err != nil {
		return backfilldriver.ChunkLease{}, false, false, fmt.Errorf("backfill: lease chunk of batch %d: %w", batchID, err)
	}
	if len(rows) == 0 {
		return backfilldriver.ChunkLease{}, false, full, nil
	}
	st := backfilltype.ControlState{Status: backfilltype.RunStatus(rows[0].RunStatus), Reason: rows[0].RunReason, Knobs: map[string]float64{}}
	if err := json.Unmarshal([]byte(rows[0].RunKnobs), &st.Knobs); err != nil {
		return backfilldriver.ChunkLease{}, false, false, fmt.Errorf("backfill: lease chunk of batch %d: knobs: %w", batchID, err)
	}
	return backfilldriver.ChunkLease{State: rows[0].state(), Epoch: rows[0].Epoch, Control: st}, true, false, nil
}

// LeaseQuery leases the first claimable chunk of batch $1 (ClaimQuery's
// conditions, and the same walk of the index chunks_claimable) not in $2
// (int[]) whose lease is free, not live ($4: the stale bound in seconds)
// or key $3's own, and returns it with its new lease_epoch and the run's
// control state (Control's columns: run_status, run_reason, run_knobs),
// so that the read of the control state between two chunks costs no
// statement of its own. The statement is the manifest's function
// lease_chunk (migration 28), whose plan the session keeps: sent as
// text, it was parsed and planned again for every chunk. The liveness of
// a lease there is liveLease's.
//
// Its commit does not wait for the WAL flush (synchronous_commit off): a
// lease lost with a server crash is harmless. The crash ends the chunk's
// transaction (its connection), and the lease's row is back at its
// previous lease_key and lease_epoch; a lease taken afterwards by another
// worker may reuse the lost epoch number, but under its own key, which
// the lost lease's fence (key and epoch) does not match. The chunk's
// commit, which flushes the WAL, makes the lease durable with it.
var LeaseQuery = `SELECT ` + chunkColumns + `, lease_epoch, run_status, run_reason, run_knobs
			FROM {s}.lease_chunk($1, $2::int[], $3, $4, $5)`

// fieldsOf returns the comma-separated columns cols as fields of the
// composite value v: "(v).a, (v).b".
func fieldsOf(v, cols string) string {
	fs := strings.Split(cols, ",")
	for i, f := range fs {
		fs[i] = "(" + v + ")." + strings.TrimSpace(f)
	}
	return strings.Join(fs, ", ")
}

// FenceLease implements [backfilldriver.ManifestLeases.FenceLease]: the
// fence of a leased chunk's transaction tx. With the settings of the
// lease (leaseSettings), it locks the chunk's row and
// clears its lease WHERE the lease is still key's at epoch, the chunk
// claimable and the run running or paused (a chunk in flight when the run
// is paused finishes: only new claims stop). ok is false when it is not:
// the lease was taken over (or the chunk or run moved on), and tx must
// not commit the chunk. pid is the backend's.
//
// One simple query, one round trip per chunk: the try's lock_timeout
// first, queued (Later) as SET LOCAL in front of the fence, so that it
// bounds the lock of the chunks table the fence takes (an operator's
// LOCK TABLE on the manifest: the wait ends in 55P03, a wait of the
// chunk); then the fence, without parameters (its values are literals):
// a call of the manifest's function fence_lease (migration 28), whose
// plan the session keeps, which sets the lease's settings
// (leaseSettings), then locks the chunk's row and clears its lease.
func (m *Manifest) FenceLease(ctx context.Context, tx sqlx.ExtContext, batchID int64, seq int, epoch int64, l backfilldriver.Lease) (st backfilltype.ChunkState, pid int, ok bool, err error) {
	app, kIdle, kInt, kCount, userTO := sessionSettings(l)
	var rows []struct {
		pgChunkRow
		Pid int `db:"backend_pid"`
	}
	if l.LockTimeout != "" {
		if err := Later(ctx, tx, `SET LOCAL lock_timeout = `+QuoteLiteral(l.LockTimeout)); err != nil {
			return backfilltype.ChunkState{}, 0, false, fmt.Errorf("backfill: fence chunk %d of batch %d: %w", seq, batchID, err)
		}
	}
	lit := func(v any) string { return QuoteLiteral(fmt.Sprint(v)) }
	// Longest placeholders first: $1 is a prefix of $10 and $11. Replaced
	// before the schema's name is put in, which may hold a "$".
	args := strings.NewReplacer("$11", lit(userTO), "$10", lit(kCount), "$1", lit(batchID), "$2", lit(seq), "$3", lit(l.Key),
		"$4", lit(epoch), "$5", lit(l.StmtTimeout), "$6", lit(l.LockTimeout), "$7", lit(app), "$8", lit(kIdle), "$9", lit(kInt))
	err = sqlx.SelectContext(ctx, tx, &rows, m.SQL(args.Replace(`SELECT `+fieldsOf("f.chunk", chunkColumns)+`, f.backend_pid
		FROM {s}.fence_lease($1::bigint, $2::int, $3, $4::bigint, $5, $6, $7, $8, $9, $10, $11) f`)))
	if err != nil {
		var pe *pq.Error
		if errors.As(err, &pe) && pe.Code == "55P03" {
			return backfilltype.ChunkState{}, 0, false, fmt.Errorf("backfill: fence chunk %d of batch %d: waited lock_timeout %s ms for the manifest table %s.chunks or the chunk's row of it "+
				"(a session's LOCK TABLE, or another worker's transaction on the chunk: see the wait's blockers): end that session or retry later: %w: %w", seq, batchID, l.LockTimeout, m.SchemaName, ErrManifestLocked, err)
		}
		return backfilltype.ChunkState{}, 0, false, fmt.Errorf("backfill: fence chunk %d of batch %d: %w", seq, batchID, err)
	}
	if len(rows) == 0 {
		return backfilltype.ChunkState{}, 0, false, nil
	}
	return rows[0].state(), rows[0].Pid, true, nil
}

// sessionSettings returns the last five of the lease's settings
// (leaseSettings) of lease l as arguments of the fence (fence_lease, $7
// to $11 of FenceLease; $5 and $6 are l.StmtTimeout and l.LockTimeout),
// which sets them locally in the chunk's transaction:
//
//   - statement_timeout 0 (the value of the merge, kept in
//     backfill.statement_timeout; [Config.StatementTimeout], or the
//     session's when ""): the COPY that stays open while the spool is
//     replayed is not charged to it. The merge puts it back (PGMerger's
//     planner settings) for its statements and what follows;
//   - lock_timeout, the try's ([Config.LockRetries]; "" keeps the
//     session's), also kept in backfill.lock_timeout for the merge to put
//     back (PlannerSettings); its key locks wait in steps of their own
//     (WaitLock), which put the try's back when granted;
//   - application_name "backfill <worker key> " before the session's
//     own: the chunk's holder, for the waiting workers' fencing (Holders);
//   - TCP keepalives (idle StaleAfter/3, interval StaleAfter/9, 3
//     probes) and tcp_user_timeout = StaleAfter: the server ends the
//     transaction of a worker cut off within the bound.
//     Not idle_in_transaction_session_timeout: the chunk's transaction is
//     idle while its validators run in the process, which may take long;
//     a worker frozen between statements stops heartbeating and is fenced
//     by the others instead.
func sessionSettings(l backfilldriver.Lease) (appName, keepIdle, keepInterval, keepCount, userTimeoutMS string) {
	s := max(int(l.StaleAfter/time.Second), 3)
	return "backfill " + l.Key + " ", fmt.Sprint(max(s/3, 1)), fmt.Sprint(max(s/9, 1)), "3",
		fmt.Sprint(l.StaleAfter.Milliseconds())
}

// ErrManifestLocked marks the error of a chunk's fence that waited its
// lock_timeout for the manifest's chunks table (an operator's LOCK
// TABLE) or the chunk's row of it: a wait of the manifest, not of the
// chunk's data.
var ErrManifestLocked = errors.New("manifest table locked")

// ReleaseLease clears the lease of chunk seq if it is still key's at
// epoch, in a short transaction of its own. A lock wait (55P03) is not
// retried: the lease is key's still, its worker claims the chunk again.
func (m *Manifest) ReleaseLease(ctx context.Context, db sqlx.ExtContext, batchID int64, seq int, key string, epoch int64) error {
	ctx = m.purpose(ctx, "release a lease", batchID)
	return inTxIdle(ctx, db, txShortOnce, func(tx sqlx.ExtContext) error {
		_, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.chunks SET lease_key = NULL, leased_at = NULL
			WHERE batch_id = $1 AND seq = $2 AND lease_key = $3 AND lease_epoch = $4`), batchID, seq, key, epoch)
		if err != nil {
			return fmt.Errorf("backfill: release the lease of chunk %d of batch %d: %w", seq, batchID, err)
		}
		return nil
	})
}
