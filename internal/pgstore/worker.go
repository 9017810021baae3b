package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
)

// Liveness values of [backfilltype.RunLiveness.Liveness] for a running run;
// a run that is not running has its status as its liveness.
const (
	// LivenessRunning: a worker of the run heartbeated within its
	// backfill.Config.StaleAfter.
	LivenessRunning = "running"
	// LivenessStalled: no unfinished worker heartbeated within its
	// StaleAfter, but one did within twice it: a worker is frozen or cut
	// off, and waiting workers fence it.
	LivenessStalled = "stalled"
	// LivenessDead: the run is running in the manifest but no unfinished
	// worker heartbeated within twice its StaleAfter (or none ever
	// registered): nobody works it. Running the job again resumes it.
	LivenessDead = "dead"
)

var (
	_ backfilldriver.ManifestWorkers = (*Manifest)(nil)
	_ backfilldriver.ManifestLeases  = (*Manifest)(nil)
)

// Workers implements [backfilldriver.ManifestWorkers.Workers].
func (m *Manifest) Workers(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Worker, error) {
	ctx = m.purpose(ctx, "read workers", batchID)
	var rows []struct {
		backfilltype.Worker
		StaleSec float64 `db:"stale_sec"`
		AgeSec   float64 `db:"age_sec"`
	}
	// In a read transaction: safe behind a transaction pooler.
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = rows[:0]
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT worker_key, worker_id, batch_id, job_name, host, pid, started_at, heartbeat_at,
		finished_at, state, extract(epoch FROM stale_after)::float8 AS stale_sec, extract(epoch FROM now() - heartbeat_at)::float8 AS age_sec,
		(state = 'lost' OR finished_at IS NULL AND heartbeat_at < now() - stale_after) AS stale
		FROM {s}.workers WHERE batch_id = $1 ORDER BY started_at DESC, worker_key`), batchID)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: workers of batch %d: %w", batchID, err)
	}
	out := make([]backfilltype.Worker, len(rows))
	for i, r := range rows {
		out[i] = r.Worker
		out[i].StaleAfter = time.Duration(r.StaleSec * float64(time.Second))
		out[i].HeartbeatAge = time.Duration(r.AgeSec * float64(time.Second))
	}
	return out, nil
}

// RunLiveness implements [backfilldriver.ManifestWorkers.RunLiveness] from the
// run_liveness view.
func (m *Manifest) RunLiveness(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.RunLiveness, error) {
	ctx = m.purpose(ctx, "read the run's liveness", batchID)
	var rows []backfilltype.RunLiveness
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = rows[:0]
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT batch_id, job_name, status, liveness, last_heartbeat, live_workers
		FROM {s}.run_liveness WHERE batch_id = $1`), batchID)
	})
	if err != nil {
		return backfilltype.RunLiveness{}, fmt.Errorf("backfill: liveness of batch %d: %w", batchID, err)
	}
	if len(rows) == 0 {
		return backfilltype.RunLiveness{}, fmt.Errorf("backfill: liveness of batch %d: %w", batchID, backfilltype.ErrRunNotFound)
	}
	return rows[0], nil
}

// RegisterWorker implements [backfilldriver.ManifestLeases.RegisterWorker]:
// a row of the workers table, in a short transaction of its own. A key
// registers once: a second registration fails (unique_violation).
//
// A try run again by InShortTx may follow a COMMIT that was cut and did
// commit: such a try first looks for the row its key, batch and worker
// ID make, and keeps it.
func (m *Manifest) RegisterWorker(ctx context.Context, db sqlx.ExtContext, w backfilltype.Worker) error {
	ctx = m.purpose(ctx, "register the worker", w.BatchID)
	tries := 0
	return InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		if tries++; tries > 1 {
			var mine []int
			if err := sqlx.SelectContext(ctx, tx, &mine, m.SQL(`SELECT 1 FROM {s}.workers WHERE worker_key = $1 AND batch_id = $2 AND worker_id = $3`),
				w.Key, w.BatchID, ManifestText(w.ID)); err != nil {
				return err
			}
			if len(mine) == 1 {
				return nil
			}
		}
		_, err := tx.ExecContext(ctx, m.SQL(`INSERT INTO {s}.workers (worker_key, worker_id, batch_id, job_name, host, pid, stale_after)
			VALUES ($1, $2, $3, $4, $5, $6, make_interval(secs => $7))`),
			w.Key, ManifestText(w.ID), w.BatchID, w.Job, ManifestText(w.Host), w.PID, w.StaleAfter.Seconds())
		return err
	})
}

// Heartbeat implements [backfilldriver.ManifestLeases.Heartbeat]: it
// refreshes the worker's heartbeat_at, in a short transaction
// of its own that does not wait for its WAL to be flushed (a lost
// heartbeat is harmless).
func (m *Manifest) Heartbeat(ctx context.Context, db sqlx.ExtContext, key string) error {
	ctx = m.purpose(ctx, "heartbeat", 0)
	return InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		_, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.workers SET heartbeat_at = now()
			WHERE worker_key = $1 AND finished_at IS NULL AND set_config('synchronous_commit', 'local', true) IS NOT NULL`), key)
		return err
	})
}

// FinishWorker implements [backfilldriver.ManifestLeases.FinishWorker].
func (m *Manifest) FinishWorker(ctx context.Context, db sqlx.ExtContext, key string) error {
	ctx = m.purpose(ctx, "record the worker's end", 0)
	return InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		_, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.workers SET heartbeat_at = now(), finished_at = now(), state = 'finished'
			WHERE worker_key = $1`), key)
		return err
	})
}

// ClaimQuery selects and locks the first claimable chunk of batch $1
// not in $2 (int[]): pending, or open and left by an earlier call of the
// run, while the run is running. Its condition status IN ('pending',
// 'open') is the predicate of the index chunks_claimable (migration 18),
// so that the planner walks that index in seq order and stops at the
// first claimable row, however many chunks of the batch are done, also
// on a chunks table never analyzed.
const ClaimQuery = `SELECT ` + chunkColumns + ` FROM {s}.chunks
		WHERE batch_id = $1 AND status IN ('pending', 'open')
			AND (status = 'pending' OR open_call < (SELECT calls FROM {s}.runs WHERE batch_id = $1 AND status = 'running'))
		AND EXISTS (SELECT 1 FROM {s}.runs WHERE batch_id = $1 AND status = 'running')
		AND NOT (seq = ANY ($2::int[]))
		ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED`

// Holders lists the chunks of run batchID (only while it is running,
// when running) held by transactions other than those of worker self
// ("" for none). With fence, the same statement
// terminates the backend of each holder whose worker is stale (heartbeat
// older than its registered stale bound, or finished) by the server's
// clock at that moment.
func (m *Manifest) Holders(ctx context.Context, db sqlx.ExtContext, batchID int64, self string, staleAfter time.Duration, fence, running bool) ([]backfilldriver.ChunkHolder, error) {
	ctx = m.purpose(ctx, "read the chunks' holders", batchID)
	var out []backfilldriver.ChunkHolder
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		out = out[:0]
		return sqlx.SelectContext(ctx, tx, &out, m.SQL(`SELECT * FROM (SELECT c.seq, c.chunk_id, l.pid, `+holderColumns("$4", "$2", "$3")+`
			FROM {s}.chunks c
			JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = c.xmax AND l.granted AND l.mode = 'ExclusiveLock'
			`+holderJoin+`
			WHERE c.batch_id = $1 AND c.status IN ('pending', 'open') AND l.pid <> pg_backend_pid()
				AND ($2 = '' OR coalesce(w.worker_key, '') <> $2)
				AND (NOT $5 OR EXISTS (SELECT 1 FROM {s}.runs r WHERE r.batch_id = $1 AND r.status = 'running'))
			UNION ALL
			-- Chunks leased by live workers, extracting outside a
			-- transaction (the lease); a lease that is not live
			-- is taken over by the claim.
			-- Live as the claim judges it (liveLease): a young lease of a
			-- worker that stopped heartbeating is waited for, not skipped.
			SELECT c.seq, c.chunk_id, 0, c.lease_key, coalesce(w.worker_id, ''), coalesce(w.host, ''), coalesce(w.pid, 0),
				coalesce(extract(epoch FROM now() - w.heartbeat_at)::float8, -1), false, false
			FROM {s}.chunks c LEFT JOIN {s}.workers w ON w.worker_key = c.lease_key
			WHERE c.batch_id = $1 AND c.status IN ('pending', 'open') AND ($2 = '' OR c.lease_key <> $2)
				AND `+liveLease("$3")+`
				AND (NOT $5 OR EXISTS (SELECT 1 FROM {s}.runs r WHERE r.batch_id = $1 AND r.status = 'running'))
			) h ORDER BY seq`), batchID, self, staleAfter.Seconds(), fence, running)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: chunks in flight of batch %d: %w", batchID, err)
	}
	return out, nil
}

// WaitInFlight waits until no transaction holds a chunk of batchID that
// was pending or open: it locks those rows (FOR UPDATE, which waits for
// each holder) with lock_timeout = poll, and between tries lists the
// holders (logged with the wait's duration) and fences the stale ones. It
// is the barrier after a run stops being running (abandoned, paused for a
// rollback, failed before a rollback): a chunk claimed while it ran
// either holds its row (the barrier waits for its commit or rollback) or
// is skipped by the claim (the barrier holds its row).
func (m *Manifest) WaitInFlight(ctx context.Context, db sqlx.ExtContext, batchID int64, w backfilldriver.FenceWait) error {
	ctx = m.purpose(ctx, "wait for the chunks in flight", batchID)
	begin := time.Now()
	log := w.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fenceOK := true
	for n := 0; ; n++ {
		leased := 0
		err := inShortTxOwnWaits(ctx, db, func(tx sqlx.ExtContext) error {
			// lock_timeout in a statement of its own: it bounds the lock
			// of the chunks table too, which the next one takes when
			// PostgreSQL parses it (an operator's LOCK TABLE).
			if _, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, max(w.Poll.Milliseconds(), 1))); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, m.SQL(`SELECT 1 FROM {s}.chunks WHERE batch_id = $1 AND status IN ('pending', 'open')
				ORDER BY seq FOR UPDATE`), batchID)
			if err != nil {
				return err
			}
			// Chunks leased by live workers, extracting outside a
			// transaction (the lease), are in flight too.
			return sqlx.GetContext(ctx, tx, &leased, m.SQL(`SELECT count(*) FROM {s}.chunks c WHERE c.batch_id = $1
				AND c.status IN ('pending', 'open') AND c.lease_key <> $2 AND `+liveLease("$3")), batchID, w.Self, w.StaleAfter.Seconds())
		})
		if err == nil && leased > 0 {
			hs, _ := m.Holders(ctx, db, batchID, w.Self, w.StaleAfter, false, false)
			for _, h := range hs {
				LogHolder(log, w.What, batchID, h, time.Since(begin))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(w.Poll):
			}
			continue
		}
		var pe *pq.Error
		if err == nil {
			if n > 0 {
				log.Info("backfill: chunks in flight ended", "what", w.What, "batch_id", batchID, "waited", time.Since(begin))
			}
			return nil
		}
		if !errors.As(err, &pe) || pe.Code != "55P03" {
			return fmt.Errorf("backfill: wait for the chunks in flight of batch %d: %w", batchID, err)
		}
		hs, herr := m.Holders(ctx, db, batchID, w.Self, w.StaleAfter, fenceOK, false)
		if herr != nil && IsPermission(herr) {
			fenceOK = false
			log.Error("backfill: cannot terminate a stale worker's backend: grant the role pg_signal_backend (or run every worker as the same role)",
				"batch_id", batchID, "error", herr)
			hs, herr = m.Holders(ctx, db, batchID, w.Self, w.StaleAfter, false, false)
		}
		if herr != nil {
			log.Warn("backfill: listing chunks in flight failed", "batch_id", batchID, "error", herr)
		}
		for _, h := range hs {
			LogHolder(log, w.What, batchID, h, time.Since(begin))
		}
		if len(hs) == 0 {
			// No chunk's holder: a lock of the table (an operator's LOCK
			// TABLE on the manifest).
			log.Warn("backfill: waiting for the chunks in flight: the manifest's chunks table is locked", "what", w.What, "batch_id", batchID,
				"waited", time.Since(begin), "blockers", cmp.Or(DescribeBlockers(StrongLockHolders(context.WithoutCancel(ctx), db)), "none seen"))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// holderColumns are the columns of a holder (l.pid, its session a and
// worker w: holderJoin) after its chunk: its worker, whether the worker
// is stale (finished, or its heartbeat older than its registered stale
// bound, at least staleArg seconds, by the server's clock), and, when
// fenceArg, whether its backend was terminated for it (the fence of a
// stale worker other than selfArg's).
//
// The heartbeat's age is taken at clock_timestamp(), not now(): the
// columns may be read in a transaction that has waited long (a chunk's
// whose key locks are held, [Manifest.LockHolders]).
func holderColumns(fenceArg, selfArg, staleArg string) string {
	stale := `(w.finished_at IS NOT NULL OR w.heartbeat_at < clock_timestamp() - greatest(w.stale_after, make_interval(secs => ` + staleArg + `)))`
	return `coalesce(w.worker_key, '') AS worker_key,
			coalesce(w.worker_id, a.application_name, '') AS worker_id, coalesce(w.host, '') AS host, coalesce(w.pid, 0) AS os_pid,
			coalesce(extract(epoch FROM clock_timestamp() - w.heartbeat_at)::float8, -1) AS age_sec,
			coalesce(` + stale + `, false) AS stale,
			CASE WHEN ` + fenceArg + ` AND w.worker_key IS NOT NULL AND w.worker_key <> ` + selfArg + ` AND ` + stale + `
				THEN pg_terminate_backend(l.pid) ELSE false END AS terminated`
}

// holderJoin joins a holder's backend l.pid to its session a and, by
// the application_name "backfill <worker key> " its chunk's transaction
// sets (leaseSettings), to its worker w.
const holderJoin = `LEFT JOIN pg_stat_activity a ON a.pid = l.pid
			LEFT JOIN {s}.workers w ON a.application_name LIKE 'backfill ' || w.worker_key || ' %'`

// LogHolder logs one chunk a worker waits for: which chunk, its holder
// (worker, host, backend pid, heartbeat age), how long the wait lasts so
// far, and whether the holder was fenced.
func LogHolder(log *slog.Logger, what string, batchID int64, h backfilldriver.ChunkHolder, waited time.Duration) {
	attrs := holderAttrs([]any{"what", what, "batch_id", batchID, "seq", h.Seq, "chunk", h.ChunkID}, h, waited)
	switch {
	case h.Terminated:
		log.Warn("backfill: fenced a stale worker: terminated the backend holding the chunk; its transaction rolls back and the chunk is claimable", attrs...)
	case h.Stale:
		log.Warn("backfill: waiting for a chunk held by a stale worker (not fenced)", attrs...)
	default:
		log.Info("backfill: waiting for a chunk in flight", attrs...)
	}
}

// holderAttrs appends to attrs the log attributes of holder h (worker,
// host, backend pid, the wait so far, and where known its OS pid and
// heartbeat age) that LogHolder and LogLockHolder share.
func holderAttrs(attrs []any, h backfilldriver.ChunkHolder, waited time.Duration) []any {
	attrs = append(attrs, "holder", h.WorkerID, "holder_host", h.Host, "holder_backend_pid", h.PID, "waited", waited)
	if h.OSPID > 0 {
		attrs = append(attrs, "holder_os_pid", h.OSPID)
	}
	if h.AgeSec >= 0 {
		attrs = append(attrs, "holder_heartbeat_age", time.Duration(h.AgeSec*float64(time.Second)))
	}
	return attrs
}

// IsPermission reports whether err is PostgreSQL refusing a privilege
// (42501), as pg_terminate_backend does for another role's backend.
func IsPermission(err error) bool {
	var pe *pq.Error
	return errors.As(err, &pe) && pe.Code == "42501"
}
