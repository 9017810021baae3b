package pgstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// RehearsalRun creates, in tx, a run of plan for a rehearsal to load its
// chunks into, as StartRun creates a new run. The caller rolls tx back:
// the run never exists for anyone else. It holds the job's advisory lock
// in shared mode until tx ends: the rehearsal's transactions run side by
// side, and a StartRun of the job (which takes it exclusively) waits for
// them. The run's job name is the job's with " (rehearsal N)" appended,
// N being slot: concurrent transactions of one rehearsal (distinct slots)
// do not wait for each other on the index that allows one active run per
// job. A job whose latest run is running, paused or failed (a run a call
// would resume) is refused with an error wrapping
// [backfilltype.ErrRunStatus]: the rehearsal would measure a target half
// loaded by it.
func (m *Manifest) RehearsalRun(ctx context.Context, tx sqlx.ExtContext, plan backfilltype.Plan, worker string, slot int) (backfilltype.Run, error) {
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock_shared(hashtextextended('backfill.job:' || $1, 0))`, plan.Job); err != nil {
		return backfilltype.Run{}, fmt.Errorf("backfill: rehearse job %q: %w", plan.Job, err)
	}
	var active []struct {
		BatchID int64  `db:"batch_id"`
		Status  string `db:"status"`
	}
	if err := sqlx.SelectContext(ctx, tx, &active, m.SQL(`SELECT batch_id, status FROM {s}.runs
		WHERE job_name = $1 AND status IN ('running', 'paused', 'failed') ORDER BY batch_id DESC LIMIT 1`), plan.Job); err != nil {
		return backfilltype.Run{}, fmt.Errorf("backfill: rehearse job %q: %w", plan.Job, err)
	}
	if len(active) > 0 {
		return backfilltype.Run{}, fmt.Errorf("backfill: rehearse job %q: %w: its run (batch %d) is %s; rehearse before a run or after it ended (completed, cancelled, rolled back)",
			plan.Job, backfilltype.ErrRunStatus, active[0].BatchID, active[0].Status)
	}
	job := plan.Job
	plan.Job = fmt.Sprintf("%s (rehearsal %d)", plan.Job, slot)
	run, err := m.createRun(ctx, tx, plan, ManifestText(worker))
	if err != nil {
		return backfilltype.Run{}, fmt.Errorf("backfill: rehearse job %q: %w", job, err)
	}
	return run, nil
}

// rehearsalRow is a row of the rehearsals table.
type rehearsalRow struct {
	ID          int64     `db:"id"`
	Job         string    `db:"job_name"`
	Fingerprint string    `db:"plan_fingerprint"`
	CodeVersion string    `db:"code_version"`
	Worker      string    `db:"worker"`
	CreatedAt   time.Time `db:"created_at"`
	ChunksTotal int       `db:"chunks_total"`
	Concurrency int       `db:"concurrency"`
	Chunks      []byte    `db:"chunks"`
	Forecast    []byte    `db:"forecast"`
}

func (r rehearsalRow) rehearsal() (backfilltype.Rehearsal, error) {
	rh := backfilltype.Rehearsal{ID: r.ID, Job: r.Job, Fingerprint: r.Fingerprint, CodeVersion: r.CodeVersion, Worker: r.Worker,
		CreatedAt: r.CreatedAt, ChunksTotal: r.ChunksTotal}
	if err := json.Unmarshal(r.Chunks, &rh.Chunks); err != nil {
		return rh, fmt.Errorf("rehearsal %d: chunks: %w", r.ID, err)
	}
	if err := json.Unmarshal(r.Forecast, &rh.Forecast); err != nil {
		return rh, fmt.Errorf("rehearsal %d: forecast: %w", r.ID, err)
	}
	return rh, nil
}

const rehearsalColumns = `id, job_name, plan_fingerprint, code_version, worker, created_at, chunks_total, concurrency, chunks, forecast`

// RecordRehearsal records rh in the manifest, in one statement of its
// own, and returns it with its ID and creation time.
func (m *Manifest) RecordRehearsal(ctx context.Context, db sqlx.ExtContext, rh backfilltype.Rehearsal) (backfilltype.Rehearsal, error) {
	chunks, err := json.Marshal(rh.Chunks)
	if err != nil {
		return rh, err
	}
	forecast, err := json.Marshal(rh.Forecast)
	if err != nil {
		return rh, err
	}
	ctx = m.purpose(ctx, "record the rehearsal of job "+rh.Job, 0)
	err = InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		return tx.QueryRowxContext(ctx, m.SQL(`INSERT INTO {s}.rehearsals (job_name, plan_fingerprint, code_version, worker, chunks_total, concurrency, chunks, forecast)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id, created_at`),
			rh.Job, rh.Fingerprint, ManifestText(rh.CodeVersion), ManifestText(rh.Worker), rh.ChunksTotal, rh.Forecast.Concurrency, string(chunks), string(forecast)).
			Scan(&rh.ID, &rh.CreatedAt)
	})
	if err != nil {
		return rh, fmt.Errorf("backfill: record rehearsal of job %q: %w", rh.Job, err)
	}
	return rh, nil
}

// Rehearsals returns the rehearsals of job, newest first, at most limit
// (all for limit <= 0).
func (m *Manifest) Rehearsals(ctx context.Context, db sqlx.ExtContext, job string, limit int) ([]backfilltype.Rehearsal, error) {
	var rows []rehearsalRow
	lim := sql.NullInt64{Int64: int64(limit), Valid: limit > 0}
	if err := SnapshotReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT `+rehearsalColumns+` FROM {s}.rehearsals
		WHERE job_name = $1 ORDER BY id DESC LIMIT $2`), job, lim)
	}); err != nil {
		return nil, fmt.Errorf("backfill: rehearsals of job %q: %w", job, err)
	}
	out := make([]backfilltype.Rehearsal, 0, len(rows))
	for _, r := range rows {
		rh, err := r.rehearsal()
		if err != nil {
			return nil, err
		}
		out = append(out, rh)
	}
	return out, nil
}

// ForecastCheck returns the comparison of status s, run s.BatchID's,
// with the forecast of the latest rehearsal of the run's job and plan
// recorded before the run was created (nil for none). Its duration is the
// run's time less its paused time. A manifest older than migration 30
// has no rehearsal.
func (m *Manifest) ForecastCheck(ctx context.Context, db sqlx.ExtContext, s backfilltype.Status) (*backfilltype.ForecastCheck, error) {
	var fc *backfilltype.ForecastCheck
	d := time.Duration((s.Time.TotalSeconds - s.Time.PausedSeconds) * float64(time.Second))
	err := SnapshotReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		var err error
		fc, err = m.forecastOf(ctx, tx, s.BatchID, d, s.Rows.Read, s.Status == backfilltype.RunCompleted)
		return err
	})
	return fc, err
}

// forecastOf is ForecastCheck of run batchID, which took d and read rows
// (done: completed), in tx.
func (m *Manifest) forecastOf(ctx context.Context, tx sqlx.ExtContext, batchID int64, d time.Duration, rows int64, done bool) (*backfilltype.ForecastCheck, error) {
	var rs []rehearsalRow
	err := sqlx.SelectContext(ctx, tx, &rs, m.SQL(`SELECT `+qualified("h", rehearsalColumns)+` FROM {s}.rehearsals h
		JOIN {s}.runs r ON r.job_name = h.job_name AND r.plan_fingerprint = h.plan_fingerprint AND h.created_at <= r.created_at
		WHERE r.batch_id = $1 ORDER BY h.id DESC LIMIT 1`), batchID)
	if err != nil {
		var pe interface{ SQLState() string }
		if errors.As(err, &pe) && pe.SQLState() == "42P01" {
			return nil, nil
		}
		return nil, fmt.Errorf("backfill: forecast of batch %d: %w", batchID, err)
	}
	if len(rs) == 0 {
		return nil, nil
	}
	rh, err := rs[0].rehearsal()
	if err != nil {
		return nil, err
	}
	fc := &backfilltype.ForecastCheck{RehearsalID: rh.ID, RehearsedAt: rh.CreatedAt, Forecast: rh.Forecast,
		Duration: d, Rows: rows, Done: done, WALBytes: -1, TargetBytes: -1, IndexBytes: -1}
	// What the run recorded (migration 34): its WAL from its creation to
	// its completion or its latest checkpoint, its target's growth once
	// completed. A savepoint: a manifest without the columns leaves the
	// transaction usable.
	if _, err := tx.ExecContext(ctx, `SAVEPOINT backfill_forecast`); err != nil {
		return nil, fmt.Errorf("backfill: forecast of batch %d: %w", batchID, err)
	}
	var got struct {
		WAL     sql.NullInt64 `db:"wal"`
		Target  sql.NullInt64 `db:"target"`
		Indexes sql.NullInt64 `db:"indexes"`
	}
	err = sqlx.GetContext(ctx, tx, &got, m.SQL(`SELECT
		pg_wal_lsn_diff(coalesce(r.wal_end, (SELECT max(c.wal_lsn) FROM {s}.chunks c WHERE c.batch_id = r.batch_id), r.wal_start), r.wal_start)::bigint AS wal,
		r.target_end_bytes - r.target_start_bytes AS target, r.index_end_bytes - r.index_start_bytes AS indexes
		FROM {s}.runs r WHERE r.batch_id = $1`), batchID)
	if err != nil {
		var pe interface{ SQLState() string }
		if !errors.As(err, &pe) || pe.SQLState() != "42703" {
			return nil, fmt.Errorf("backfill: forecast of batch %d: %w", batchID, err)
		}
		if _, err := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT backfill_forecast`); err != nil {
			return nil, fmt.Errorf("backfill: forecast of batch %d: %w", batchID, err)
		}
		return fc, nil
	}
	if _, err := tx.ExecContext(ctx, `RELEASE SAVEPOINT backfill_forecast`); err != nil {
		return nil, fmt.Errorf("backfill: forecast of batch %d: %w", batchID, err)
	}
	for _, v := range []struct {
		dst *int64
		src sql.NullInt64
	}{{&fc.WALBytes, got.WAL}, {&fc.TargetBytes, got.Target}, {&fc.IndexBytes, got.Indexes}} {
		if v.src.Valid {
			*v.dst = v.src.Int64
		}
	}
	return fc, nil
}

// qualified prefixes each column of cols (a comma-separated list) with
// alias.
func qualified(alias, cols string) string {
	parts := strings.Split(cols, ",")
	for i, p := range parts {
		parts[i] = alias + "." + strings.TrimSpace(p)
	}
	return strings.Join(parts, ", ")
}

// RehearsalMark is what a rehearsed chunk's transaction measures of
// itself at its start and just before its rollback ([MarkRehearsal]).
type RehearsalMark struct {
	// WAL is pg_current_wal_insert_lsn, as text.
	WAL string `db:"wal"`
	// PID is the transaction's backend.
	PID int `db:"pid"`
	// Table and Indexes are the target's pg_table_size and
	// pg_indexes_size; Undo the undo log's pg_total_relation_size (0
	// without one); Temp the total size of the backend's temporary
	// relations.
	Table   int64 `db:"table_bytes"`
	Indexes int64 `db:"index_bytes"`
	Undo    int64 `db:"undo_bytes"`
	Temp    int64 `db:"temp_bytes"`
}

// MarkRehearsal reads, in tx, the transaction's [RehearsalMark] for the
// target table (as the job names it; with its partitions) and undo log undo ("" for
// none).
func MarkRehearsal(ctx context.Context, tx sqlx.ExtContext, table, undo string) (RehearsalMark, error) {
	var mk RehearsalMark
	err := sqlx.GetContext(ctx, tx, &mk, `SELECT pg_current_wal_insert_lsn()::text AS wal, pg_backend_pid() AS pid,
		coalesce((SELECT sum(pg_table_size(relid)) FROM pg_partition_tree($1::regclass)), pg_table_size($1::regclass))::bigint AS table_bytes,
		coalesce((SELECT sum(pg_indexes_size(relid)) FROM pg_partition_tree($1::regclass)), pg_indexes_size($1::regclass))::bigint AS index_bytes,
		CASE WHEN $2 = '' THEN 0 ELSE pg_total_relation_size($2::regclass) END AS undo_bytes,
		coalesce((SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c
			WHERE c.relnamespace = pg_my_temp_schema() AND c.relkind = 'r'), 0)::bigint AS temp_bytes`, sqlgen.Table(table), undo)
	if err != nil {
		return mk, fmt.Errorf("rehearsal: measure: %w", err)
	}
	return mk, nil
}

// WALInsert returns pg_current_wal_insert_lsn, as text.
func WALInsert(ctx context.Context, tx sqlx.ExtContext) (string, error) {
	var lsn string
	if err := sqlx.GetContext(ctx, tx, &lsn, `SELECT pg_current_wal_insert_lsn()::text`); err != nil {
		return "", fmt.Errorf("rehearsal: WAL: %w", err)
	}
	return lsn, nil
}

// CommitTime commits n short transactions on db, one after the other,
// each BEGIN, SELECT txid_current() (a transaction ID, so that its
// COMMIT writes a commit record and, as the server's synchronous_commit
// has it, waits for its flush), COMMIT, and returns the median time of
// one, and the server's durability settings ("fsync=on
// synchronous_commit=on"). Nothing persists but the transaction IDs
// taken.
func CommitTime(ctx context.Context, db *sqlx.DB, n int) (time.Duration, string, error) {
	var settings string
	if err := db.GetContext(ctx, &settings, `SELECT 'fsync=' || current_setting('fsync') || ' synchronous_commit=' || current_setting('synchronous_commit')`); err != nil {
		return 0, "", fmt.Errorf("rehearsal: durability settings: %w", err)
	}
	took := make([]time.Duration, 0, n)
	for range n {
		began := time.Now()
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return 0, "", fmt.Errorf("rehearsal: time a commit: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `SELECT txid_current()`); err != nil {
			_ = tx.Rollback()
			return 0, "", fmt.Errorf("rehearsal: time a commit: %w", err)
		}
		if err := tx.Commit(); err != nil {
			return 0, "", fmt.Errorf("rehearsal: time a commit: %w", err)
		}
		took = append(took, time.Since(began))
	}
	if n == 0 {
		return 0, settings, nil
	}
	slices.Sort(took)
	return took[n/2], settings, nil
}

// WALSince returns the WAL bytes inserted since lsn (a
// pg_current_wal_insert_lsn read earlier).
func WALSince(ctx context.Context, tx sqlx.ExtContext, lsn string) (int64, error) {
	var n int64
	if err := sqlx.GetContext(ctx, tx, &n, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint`, lsn); err != nil {
		return 0, fmt.Errorf("rehearsal: WAL: %w", err)
	}
	return n, nil
}

// OwnLocks returns the locks the transaction's backend holds, grouped by
// type, relation and mode, the system catalogs' left out.
func OwnLocks(ctx context.Context, tx sqlx.ExtContext) ([]backfilltype.RehearsalLock, error) {
	var ls []backfilltype.RehearsalLock
	err := sqlx.SelectContext(ctx, tx, &ls, `SELECT l.locktype, coalesce(c.oid::regclass::text, '') AS relation, l.mode, count(*)::int AS count
		FROM pg_locks l LEFT JOIN pg_class c ON c.oid = l.relation AND l.locktype = 'relation'
		WHERE l.pid = pg_backend_pid() AND l.granted
			AND (l.locktype <> 'relation' OR c.relnamespace IS DISTINCT FROM 'pg_catalog'::regnamespace)
		GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`)
	if err != nil {
		return nil, fmt.Errorf("rehearsal: locks: %w", err)
	}
	return ls, nil
}

// relationSizes is the SQL of two columns: the pg_table_size and
// pg_indexes_size of relation relid (an SQL expression of type oid),
// summed over its partitions; NULL when relid is NULL, no longer exists,
// or is locked by another session for longer than 50 ms (the manifest's
// function relation_sizes, which never waits longer).
func relationSizes(relid string) string {
	return `(SELECT table_bytes FROM {s}.relation_sizes(` + relid + `)), (SELECT index_bytes FROM {s}.relation_sizes(` + relid + `))`
}
