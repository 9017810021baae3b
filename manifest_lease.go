package backfill

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// Leases of chunks across transactions (see doc.go, "Many workers and
// hosts", and backfill_shorttx.go).
//
// A worker of [PGManifest] claims a chunk in a short transaction of its
// own (leaseChunk): it writes its worker key into the chunk's lease_key,
// increments lease_epoch and commits. It then extracts the chunk outside
// any transaction, into a spool, and stages, merges and checkpoints it in
// the chunk's transaction, whose first statement after the session
// settings is the fence (fenceLease): an UPDATE of the chunk's row WHERE
// lease_key and lease_epoch are still the worker's, the chunk still
// claimable and the run running; it clears the lease in that
// transaction. A lease is live while its worker is unfinished and
// heartbeating within its stale bound; the claim takes a chunk whose lease
// is not live (its worker crashed, froze or finished) over by incrementing
// the epoch.
//
// The token that keeps a fenced-out worker from committing is
// (lease_key, lease_epoch), checked under the row lock in the transaction
// that also writes the merge and the checkpoint: a worker whose lease was
// taken over finds no row (the epoch moved on) and rolls back; a taker
// that finds the row locked by the stale worker's merge skips it, and the
// waiting workers fence that backend (pg_terminate_backend, holders) as
// before.

// chunkLease is a chunk leased by a worker.
type chunkLease struct {
	state ChunkState
	epoch int64
	// control is the run's control state read by the lease's statement
	// (the read between two chunks, backfill_control.go).
	control ControlState
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

// leaseChunk leases the first claimable chunk of batchID (the conditions
// of claimLeased) whose lease is free, not live, or key's own and not in
// l.avoid (the caller lists there the chunks its goroutines work), in a
// short transaction of its own. ok is false when there is none.
//
// With l.jobConcurrency > 0 it leases only while fewer than that many
// chunks of the batch hold a live lease (full is then true): the job-wide
// concurrency cap. A chunk's lease lasts from this claim to the commit of
// its transaction, which clears it (the fence), so the count covers the
// chunks extracting and merging across every process. The lease
// transactions of a batch take a transaction-level advisory lock first,
// so that two of them do not both see the last free place; a worker that
// died holds its place only until its lease is no longer live.
func (m *PGManifest) leaseChunk(ctx context.Context, db sqlx.ExtContext, batchID int64, l lease) (cl chunkLease, ok, full bool, err error) {
	avoid := make([]int64, len(l.avoid))
	for i, seq := range l.avoid {
		avoid[i] = int64(seq)
	}
	var rows []struct {
		pgChunkRow
		Epoch     int64  `db:"lease_epoch"`
		RunStatus string `db:"run_status"`
		RunReason string `db:"run_reason"`
		RunKnobs  string `db:"run_knobs"`
	}
	err = inShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows, full = rows[:0], false
		if l.jobConcurrency > 0 {
			var n int
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('backfill job concurrency ' || $1 || ' ' || $2, 0))`,
				m.schema, batchID); err != nil {
				return err
			}
			if err := sqlx.GetContext(ctx, tx, &n, m.sql(`SELECT count(*) FROM {s}.chunks c WHERE c.batch_id = $1 AND `+liveLease("$2")),
				batchID, l.staleAfter.Seconds()); err != nil {
				return err
			}
			if n >= l.jobConcurrency {
				full = true
				return nil
			}
		}
		return sqlx.SelectContext(ctx, tx, &rows, m.sql(leaseQuery), batchID, pq.Array(avoid), l.key, l.staleAfter.Seconds())
	})
	if err != nil {
		return chunkLease{}, false, false, fmt.Errorf("backfill: lease chunk of batch %d: %w", batchID, err)
	}
	if len(rows) == 0 {
		return chunkLease{}, false, full, nil
	}
	st := ControlState{Status: RunStatus(rows[0].RunStatus), Reason: rows[0].RunReason, Knobs: map[string]float64{}}
	if err := json.Unmarshal([]byte(rows[0].RunKnobs), &st.Knobs); err != nil {
		return chunkLease{}, false, false, fmt.Errorf("backfill: lease chunk of batch %d: knobs: %w", batchID, err)
	}
	return chunkLease{state: rows[0].state(), epoch: rows[0].Epoch, control: st}, true, false, nil
}

// leaseQuery leases the first claimable chunk of batch $1 (claimQuery's
// conditions, and the same walk of the index chunks_claimable) not in $2
// (int[]) whose lease is free, not live ($4: the stale bound in seconds)
// or key $3's own, and returns it with its new lease_epoch and the run's
// control state (Control's columns: run_status, run_reason, run_knobs),
// so that the read of the control state between two chunks costs no
// statement of its own.
//
// Its commit does not wait for the WAL flush (synchronous_commit off): a
// lease lost with a server crash is harmless. The crash ends the chunk's
// transaction (its connection), and the lease's row is back at its
// previous lease_key and lease_epoch; a lease taken afterwards by another
// worker may reuse the lost epoch number, but under its own key, which
// the lost lease's fence (key and epoch) does not match. The chunk's
// commit, which flushes the WAL, makes the lease durable with it.
var leaseQuery = `UPDATE {s}.chunks SET lease_key = $3, lease_epoch = lease_epoch + 1, leased_at = now()
			WHERE batch_id = $1 AND seq = (SELECT c.seq FROM {s}.chunks c
				WHERE c.batch_id = $1 AND c.status IN ('pending', 'open')
					AND (c.status = 'pending' OR c.open_call < (SELECT calls FROM {s}.runs WHERE batch_id = $1 AND status = 'running'))
				AND EXISTS (SELECT 1 FROM {s}.runs WHERE batch_id = $1 AND status = 'running')
				AND NOT (c.seq = ANY ($2::int[]))
				AND (c.lease_key = $3 OR NOT (` + liveLease("$4") + `))
				ORDER BY c.seq LIMIT 1 FOR UPDATE SKIP LOCKED)
			AND set_config('synchronous_commit', 'off', true) IS NOT NULL
			RETURNING ` + chunkColumns + `, lease_epoch,
				(SELECT r.status FROM {s}.runs r WHERE r.batch_id = $1) AS run_status,
				(SELECT r.last_error FROM {s}.runs r WHERE r.batch_id = $1) AS run_reason,
				coalesce((SELECT json_object_agg(k.key, k.value) FROM {s}.knobs k WHERE k.batch_id = $1), '{}')::text AS run_knobs`

// fenceLease is the fence of a leased chunk's transaction tx: with the
// settings of the lease (claimLeased's), it locks the chunk's row and
// clears its lease WHERE the lease is still key's at epoch, the chunk
// claimable and the run running or paused (a chunk in flight when the run
// is paused finishes: only new claims stop). ok is false when it is not:
// the lease was taken over (or the chunk or run moved on), and tx must
// not commit the chunk. pid is the backend's.
//
// One statement (issue 15, per-chunk round trips): the settings are an
// uncorrelated subquery in a condition without columns, which PostgreSQL
// evaluates once, as a one-time filter, before the scan reaches the
// chunk's row; the wait for that row's lock is so bounded by the try's
// lock_timeout, as when the settings were a statement of their own. (The
// lock of the chunks table itself, which only the manifest's migrations
// contend for, is taken before, under the session's own lock_timeout.)
func (m *PGManifest) fenceLease(ctx context.Context, tx sqlx.ExtContext, batchID int64, seq int, epoch int64, l lease) (st ChunkState, pid int, ok bool, err error) {
	app, kIdle, kInt, kCount, userTO := l.settings()
	var rows []struct {
		pgChunkRow
		Pid int `db:"backend_pid"`
	}
	err = sqlx.SelectContext(ctx, tx, &rows, m.sql(`UPDATE {s}.chunks c SET lease_key = NULL, leased_at = NULL
		WHERE (SELECT true WHERE `+leaseSettings+`)
		AND c.batch_id = $1 AND c.seq = $2 AND c.lease_key = $3 AND c.lease_epoch = $4
		AND (c.status = 'pending' OR c.status = 'open'
			AND c.open_call < (SELECT calls FROM {s}.runs WHERE batch_id = $1 AND status IN ('running', 'paused')))
		AND EXISTS (SELECT 1 FROM {s}.runs WHERE batch_id = $1 AND status IN ('running', 'paused'))
		RETURNING `+chunkColumns+`, pg_backend_pid() AS backend_pid`), batchID, seq, l.key, epoch,
		l.stmtTimeout, l.lockTimeout, app, kIdle, kInt, kCount, userTO)
	if err != nil {
		return ChunkState{}, 0, false, fmt.Errorf("backfill: fence chunk %d of batch %d: %w", seq, batchID, err)
	}
	if len(rows) == 0 {
		return ChunkState{}, 0, false, nil
	}
	return rows[0].state(), rows[0].Pid, true, nil
}

// leaseSettings is the condition that sets, locally in the chunk's
// transaction, the settings claimLeased sets with its claim ($5 to $11:
// statement_timeout, lock_timeout, the application_name prefix, the TCP
// keepalive idle, interval and count, tcp_user_timeout; see
// lease.settings).
const leaseSettings = `set_config('statement_timeout', CASE WHEN set_config('backfill.statement_timeout',
			coalesce(nullif($5, ''), current_setting('statement_timeout')), true) IS NOT NULL THEN '0' END, true) IS NOT NULL
		AND set_config('backfill.lock_timeout', set_config('lock_timeout', coalesce(nullif($6, ''), current_setting('lock_timeout')), true), true) IS NOT NULL
		AND set_config('application_name', left($7 || current_setting('application_name'), 63), true) IS NOT NULL
		AND set_config('tcp_keepalives_idle', $8, true) IS NOT NULL
		AND set_config('tcp_keepalives_interval', $9, true) IS NOT NULL
		AND set_config('tcp_keepalives_count', $10, true) IS NOT NULL
		AND set_config('tcp_user_timeout', $11, true) IS NOT NULL`

// releaseLease clears the lease of chunk seq if it is still key's at
// epoch, in a short transaction of its own.
func (m *PGManifest) releaseLease(ctx context.Context, db sqlx.ExtContext, batchID int64, seq int, key string, epoch int64) error {
	return inShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		_, err := tx.ExecContext(ctx, m.sql(`UPDATE {s}.chunks SET lease_key = NULL, leased_at = NULL
			WHERE batch_id = $1 AND seq = $2 AND lease_key = $3 AND lease_epoch = $4`), batchID, seq, key, epoch)
		if err != nil {
			return fmt.Errorf("backfill: release the lease of chunk %d of batch %d: %w", seq, batchID, err)
		}
		return nil
	})
}
