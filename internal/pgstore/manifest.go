package pgstore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
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
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// JobStatus returns the progress of the latest run of the job named job,
// without the job's code: [Manifest.LatestRun], then
// [Manifest.Status]. A job that never ran gives an error wrapping
// [backfilltype.ErrRunNotFound].
func (m *Manifest) JobStatus(ctx context.Context, db sqlx.ExtContext, job string) (backfilltype.Status, error) {
	run, err := m.LatestRun(ctx, db, job)
	if err != nil {
		return backfilltype.Status{}, err
	}
	return m.Status(ctx, db, run.BatchID)
}

// Manifest is the PostgreSQL [Manifest]. It keeps its tables in one
// SchemaName (default "backfill") of the target database, so that a chunk's
// checkpoint commits in the same transaction as its merge. Tables: runs,
// chunks, exceptions (the exception queue), events (the audit log) and
// schema_migrations.
type Manifest struct {
	SchemaName string `json:"-" db:"-"`
	// CopyBatch is the number of chunks createRun sends per COPY (0:
	// copyChunksBatch; tests shorten it).
	CopyBatch int `json:"-" db:"-"`
}

var (
	_ backfilldriver.Manifest            = (*Manifest)(nil)
	_ backfilldriver.ManifestAudit       = (*Manifest)(nil)
	_ backfilldriver.ManifestValidations = (*Manifest)(nil)
	_ backfilldriver.ManifestGates       = (*Manifest)(nil)
	_ backfilldriver.ManifestUndoLog     = (*Manifest)(nil)
	_ backfilldriver.ManifestStaging     = (*Manifest)(nil)
	_ backfilldriver.SQLManifest         = (*Manifest)(nil)
	_ backfilldriver.ManifestRollback    = (*Manifest)(nil)
)

// NewManifest returns a PostgreSQL manifest in schema ("" means
// "backfill"). The schema is created and migrated by [Manifest.Migrate]
// (an administrator's step, "backfill migrate"), or by [Manifest.Init]
// when the role may. schema is one
// identifier, taken literally and always quoted: "ops.backfill" is the
// SchemaName of that name (with a dot), never schema backfill of a database
// ops; do not quote it yourself.
func NewManifest(schema string) *Manifest {
	if schema == "" {
		schema = "backfill"
	}
	return &Manifest{SchemaName: schema}
}

// Schema returns the manifest's schema name, unquoted.
func (m *Manifest) Schema() string { return m.SchemaName }

// SQL implements [backfilldriver.SQLManifest]: q with every {s} replaced
// by the manifest's schema as a quoted identifier and every {schema} by
// its name as a quoted literal.
func (m *Manifest) SQL(q string) string {
	q = strings.ReplaceAll(q, "{schema}", quoteLiteral(m.SchemaName))
	return strings.ReplaceAll(q, "{s}", sqlgen.Ident(m.SchemaName))
}

type txBeginner interface {
	BeginTxx(ctx context.Context, opts *sql.TxOptions) (*sqlx.Tx, error)
}

// InTx runs f in a transaction: a new one when db can begin one (*sqlx.DB,
// or a [backfilldriver.DB]), otherwise db itself, which must then be a
// transaction.
//
// A transaction InTx begins is READ COMMITTED, whatever the database's
// default_transaction_isolation: the library's transactions take a lock
// (an advisory lock, or a row lock with FOR UPDATE) and then read what the
// holder before them committed, which a snapshot taken before the lock
// (REPEATABLE READ, SERIALIZABLE) would not show. When it fails with
// serialization_failure (40001) or deadlock_detected (40P01) it is rolled
// back and f runs again in a new transaction, up to txAttempts times with
// a short jittered backoff (retryTx), so f must not keep state across
// attempts. When db is a transaction, its owner retries.
func InTx(ctx context.Context, db sqlx.ExtContext, f func(tx sqlx.ExtContext) error) error {
	return inTxIdle(ctx, db, txPlain, f)
}

// InShortTx is InTx for a transaction that only runs statements (no
// validator, no extractor, nothing of the caller's between them): it
// also sets idle_in_transaction_session_timeout to manifestIdleTimeout,
// locally, so that a worker frozen inside it (SIGSTOP, a stalled host)
// holds its locks, such as the run's row, for that long at most.
//
// It also sets lock_timeout (backfill.Config.LockTimeout) and, when
// configured, statement_timeout (backfill.Config.StatementTimeout),
// locally, in the same statement, and retries a transaction that waited
// (55P03, 57014; 40001 and 40P01 as InTx does) with the sleeps of
// backfill.Config.LockRetries (retryWaits). The settings are the Runner's
// when db is its [backfilldriver.DB], the defaults otherwise.
func InShortTx(ctx context.Context, db sqlx.ExtContext, f func(tx sqlx.ExtContext) error) error {
	return inTxIdle(ctx, db, txShort, f)
}

// InBoundedTx is InTx for a transaction that may run long (a rollback,
// the publish at the end of a run, an operator's decision): it sets
// lock_timeout (backfill.Config.LockTimeout) locally, but no statement_timeout
// and no idle timeout, and retries a transaction whose lock wait timed
// out (55P03; 40001 and 40P01 as InTx does) with the sleeps of
// backfill.Config.LockRetries. Each wait is logged with the sessions holding
// strong locks. f must be safe to run again.
func InBoundedTx(ctx context.Context, db sqlx.ExtContext, f func(tx sqlx.ExtContext) error) error {
	return inTxIdle(ctx, db, txBounded, f)
}

// inShortTxOwnWaits is InShortTx for a transaction that sets its own
// lock_timeout and handles its lock timeouts itself (WaitInFlight): no
// lock_timeout, no retry of 55P03.
func inShortTxOwnWaits(ctx context.Context, db sqlx.ExtContext, f func(tx sqlx.ExtContext) error) error {
	return inTxIdle(ctx, db, txShortOwnWaits, f)
}

// txMode is the kind of transaction inTxIdle runs.
type txMode int

const (
	txPlain txMode = iota
	txShort
	txShortOwnWaits
	// txShortOnce is txShort without the retry of its lock waits.
	txShortOnce
	txBounded
	txRead
	// txReadSnapshot is txRead in one snapshot (REPEATABLE READ, read
	// only).
	txReadSnapshot
)

func inTxIdle(ctx context.Context, db sqlx.ExtContext, mode txMode, f func(tx sqlx.ExtContext) error) error {
	settings := defaultTxSettings
	log := slog.Default()
	b, _ := db.(txBeginner)
	if pd, ok := db.(PGDB); ok {
		b = pd.DB
		if pd.Settings != nil {
			settings = *pd.Settings
		}
		if pd.Log != nil {
			log = pd.Log
		}
	}
	p := purposeOf(ctx)
	if b == nil {
		if d, ok := db.(backfilldriver.DB); ok {
			// Another DB, such as backfilltest's: its own transactions.
			return retryTx(ctx, func() error { return inDBTx(ctx, d, f) })
		}
		return p.schemaMissing(f(db))
	}
	try := func() error {
		return retryTx(ctx, func() error {
			opts := &sql.TxOptions{Isolation: sql.LevelReadCommitted}
			if mode == txReadSnapshot {
				opts = &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}
			}
			tx, err := b.BeginTxx(ctx, opts)
			if err != nil {
				return statementPoolerHint(ctx, b, err)
			}
			var set string
			switch mode {
			case txShort, txShortOwnWaits, txShortOnce:
				set = shortTxSettings(settings, mode == txShortOwnWaits)
			case txBounded, txRead, txReadSnapshot:
				if lt := settings.manifestLockTimeout(); lt != "" {
					set = `SELECT set_config('lock_timeout', '` + lt + `', true)`
				}
			}
			if set != "" {
				// No parameters: one round trip, pooler-safe.
				if _, err := tx.ExecContext(ctx, set); err != nil {
					_ = tx.Rollback()
					return err
				}
			}
			if err := f(tx); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		})
	}
	if mode == txShort || mode == txBounded || mode == txRead || mode == txReadSnapshot {
		once := try
		try = func() error {
			var blockers string
			err := retryWaits(ctx, settings.Retries, once, func(code, msg string, n int, sleep time.Duration) {
				// The blocker is gone once the statement timed out; the
				// sessions still holding strong locks are the likely ones.
				hs := StrongLockHolders(context.WithoutCancel(ctx), db)
				blockers = cmp.Or(DescribeBlockers(hs), "none seen")
				log.Warn("backfill: a transaction of the library waited; rolled back, retrying after a pause", append(p.attrs(), "sqlstate", code, "message", msg,
					"try", n, "lock_timeout", settings.manifestLockTimeout(), "sleep", sleep, "blockers", blockers)...)
			})
			if code, _, ok := WaitCode(ctx, err); ok && blockers != "" {
				// The retry table is used up: name the holders seen.
				return fmt.Errorf("waited for locks %d times (lock_timeout %s ms, SQLSTATE %s), blocked by %s; retry later or end the blocking session: %w",
					len(settings.Retries), settings.manifestLockTimeout(), code, blockers, err)
			}
			return err
		}
	}
	// A fault of the connection or the server (a lost connection, a
	// restart, max_connections used up) ends the transaction: it runs
	// again, within the bound of ConnBudget, fresh waits and all.
	return p.schemaMissing(retryTransient(ctx, log, p, cmp.Or(settings.ConnBudget, DefaultConnBudget), try))
}

// manifestIdleTimeout is idle_in_transaction_session_timeout in the
// transactions InShortTx begins: they only run statements, so a longer
// idle time means a frozen client.
const manifestIdleTimeout = 10 * time.Second

// ManifestIdleMS is manifestIdleTimeout in milliseconds; tests shorten it.
var ManifestIdleMS atomic.Int64

func init() { ManifestIdleMS.Store(manifestIdleTimeout.Milliseconds()) }

// txAttempts bounds the attempts of a transaction retried by retryTx.
const txAttempts = 8

// retryTx runs attempt until it succeeds, fails with an error other than
// a transaction conflict (isTxConflict), ctx ends, or txAttempts attempts
// are made. Between attempts it sleeps a random duration of up to 5 ms
// doubled per attempt (at most 320 ms), so conflicting callers spread out.
func retryTx(ctx context.Context, attempt func() error) error {
	for n := 1; ; n++ {
		err := attempt()
		if err == nil || n >= txAttempts || !isTxConflict(err) {
			return err
		}
		backoff := time.Duration(rand.Int64N(int64(5*time.Millisecond) << min(n, 6)))
		if !sleepCtx(ctx, backoff) {
			return err
		}
	}
}

// isTxConflict reports whether err is a serialization failure (40001) or
// a deadlock (40P01): PostgreSQL rolled the transaction back and running
// it again can succeed.
func isTxConflict(err error) bool {
	var pe *pq.Error
	if errors.As(err, &pe) {
		return pe.Code == "40001" || pe.Code == "40P01"
	}
	return false
}

// inDBTx runs f in a transaction of d.
func inDBTx(ctx context.Context, d backfilldriver.DB, f func(tx sqlx.ExtContext) error) error {
	tx, err := d.Begin(ctx)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

const runColumns = `batch_id, job_name, source, code_version, plan_fingerprint, plan, scope_lower, scope_upper,
	status, chunks_total, started_by, created_at, finished_at, last_error, watermark`

// StartRun implements [Manifest.StartRun]. It serialises callers for the
// same job with a transaction-level advisory lock on the job name.
//
// Abandoning a run (newRun) does not wait behind its chunks in flight
// with the advisory lock held: the abandon commits first (its chunks stop
// being claimed: the claim reads the run's status), then WaitInFlight
// waits for the chunks claimed before (fencing stale holders), and only
// then, in a new transaction, is the new run created. Whoever creates a
// run first waits so for the job's latest run if it is abandoned, so a
// crash between the abandon and the creation leaves no gap.
func (m *Manifest) StartRun(ctx context.Context, db sqlx.ExtContext, plan backfilltype.Plan, worker string, newRun bool) (backfilltype.Run, bool, error) {
	st := &runStart{m: m, plan: plan, worker: ManifestText(worker), newRun: newRun}
	ctx = m.purpose(ctx, "start run of job "+plan.Job, 0)
	for {
		err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error { return st.attempt(ctx, tx) })
		if err != nil {
			return backfilltype.Run{}, false, fmt.Errorf("backfill: start run of job %q: %w", plan.Job, err)
		}
		if st.wait == 0 {
			return st.run, st.resumed, nil
		}
		if err := m.waitAbandoned(ctx, db, plan.Job, st.wait); err != nil {
			return backfilltype.Run{}, false, fmt.Errorf("backfill: start run of job %q: %w", plan.Job, err)
		}
		st.waited = st.wait
	}
}

// runStart is the state of one StartRun call across its transactions:
// each transaction (attempt) resumes the job's run, refuses a changed
// plan, abandons the run to replace, or creates the new run, or asks the
// call to wait for the chunks in flight of an abandoned run first.
type runStart struct {
	m      *Manifest
	plan   backfilltype.Plan
	worker string // as ManifestText stores it
	newRun bool   // a new run is requested; cleared to join one another caller created

	run     backfilltype.Run // the run resumed or created
	resumed bool
	// created is the run an attempt created (0: none): when its COMMIT
	// was cut, the next attempt looks for it (createdRun).
	created int64
	// abandoned is the run this call abandoned (0: none); waited
	// the abandoned run whose chunks in flight it waited for.
	abandoned, waited int64
	wait              int64 // an abandoned run to wait for before creating
}

// attempt is one transaction of StartRun, with the job's advisory lock:
// it resumes or abandons the job's latest run that is not abandoned,
// refuses a changed plan, or creates the new run. It sets st.wait, and
// creates nothing, when the job's latest run is abandoned and its chunks
// in flight were not waited for yet.
func (st *runStart) attempt(ctx context.Context, tx sqlx.ExtContext) error {
	st.wait = 0
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('backfill.job:' || $1, 0))`, st.plan.Job); err != nil {
		return err
	}
	if done, err := st.createdRun(ctx, tx); done || err != nil {
		return err
	}
	prev, ok, err := st.lastRun(ctx, tx)
	if err != nil {
		return err
	}
	if ok {
		if done, err := st.continueFrom(ctx, tx, prev); done || err != nil {
			return err
		}
	}
	// The job's latest run, if abandoned, may have chunks in
	// flight: wait for them before a new run exists.
	var latest []struct {
		BatchID int64  `db:"batch_id"`
		Status  string `db:"status"`
	}
	if err := sqlx.SelectContext(ctx, tx, &latest, st.m.SQL(`SELECT batch_id, status FROM {s}.runs WHERE job_name = $1 ORDER BY batch_id DESC LIMIT 1`), st.plan.Job); err != nil {
		return err
	}
	if len(latest) == 1 && latest[0].Status == string(backfilltype.RunAbandoned) && latest[0].BatchID != st.waited {
		st.wait = latest[0].BatchID
		return nil
	}
	st.run, err = st.m.createRun(ctx, tx, st.plan, st.worker)
	if err == nil {
		st.created = st.run.BatchID
	}
	return err
}

// createdRun makes the run an earlier attempt of this call created the
// call's run when that attempt committed: an attempt whose COMMIT was
// cut (the connection lost) may have committed, and InShortTx runs the
// call's transaction again. The batch ID, taken from the sequence before
// the COMMIT, tells: the row exists only if it committed (a sequence
// value is never reused), so the call neither creates a second run nor
// abandons the one it created. It reports whether the run was found.
func (st *runStart) createdRun(ctx context.Context, tx sqlx.ExtContext) (bool, error) {
	if st.created == 0 {
		return false, nil
	}
	id := st.created
	st.created = 0
	var runs []backfilltype.Run
	if err := sqlx.SelectContext(ctx, tx, &runs, st.m.SQL(`SELECT `+runColumns+` FROM {s}.runs WHERE batch_id = $1`), id); err != nil {
		return false, err
	}
	if len(runs) == 0 {
		return false, nil
	}
	st.run, st.resumed = runs[0], false
	return true, nil
}

// lastRun returns the job's latest run that is not abandoned, locked FOR
// NO KEY UPDATE, and whether there is one to continue from: none when it
// is older than the run this call abandoned. A run with the same plan
// created by another caller after this call's abandon is joined: it
// clears st.newRun.
func (st *runStart) lastRun(ctx context.Context, tx sqlx.ExtContext) (backfilltype.Run, bool, error) {
	var last []backfilltype.Run
	if err := sqlx.SelectContext(ctx, tx, &last, st.m.SQL(`SELECT `+runColumns+` FROM {s}.runs
				WHERE job_name = $1 AND status <> 'abandoned' ORDER BY batch_id DESC LIMIT 1 FOR NO KEY UPDATE`), st.plan.Job); err != nil {
		return backfilltype.Run{}, false, err
	}
	if len(last) != 1 {
		return backfilltype.Run{}, false, nil
	}
	prev := last[0]
	same := prev.Fingerprint == st.plan.Fingerprint
	if st.abandoned != 0 && prev.BatchID > st.abandoned && same {
		// Another caller created the new run after this call
		// abandoned the old one: join it.
		st.newRun = false
	} else if st.abandoned != 0 && prev.BatchID < st.abandoned {
		// An older run: this call already abandoned the one
		// it replaces.
		return backfilltype.Run{}, false, nil
	}
	return prev, true, nil
}

// continueFrom decides from prev, the job's latest run not abandoned:
// it resumes prev (same plan, no new run requested), refuses a changed
// plan without a new run requested, or abandons prev when it is running,
// failed or paused. It reports whether it decided; false leaves the
// creation of a new run to the caller.
func (st *runStart) continueFrom(ctx context.Context, tx sqlx.ExtContext, prev backfilltype.Run) (bool, error) {
	same := prev.Fingerprint == st.plan.Fingerprint
	switch {
	case same && !st.newRun:
		return true, st.resume(ctx, tx, prev)
	case !same && !st.newRun:
		return true, planChangedFrom(st.plan, prev)
	}
	if prev.Status == backfilltype.RunRunning || prev.Status == backfilltype.RunFailed || prev.Status == backfilltype.RunPaused || prev.Status == backfilltype.RunAwaitingApproval {
		return true, st.abandon(ctx, tx, prev)
	}
	return false, nil
}

// resume makes prev the call's run, resumed. Unless prev is completed,
// paused, rolled back or cancelled, its failed chunks become pending
// again, it is running again with one more call, and the run_resumed
// event is recorded.
func (st *runStart) resume(ctx context.Context, tx sqlx.ExtContext, prev backfilltype.Run) error {
	m := st.m
	if prev.Status != backfilltype.RunCompleted && prev.Status != backfilltype.RunPaused && prev.Status != backfilltype.RunRolledBack && prev.Status != backfilltype.RunCancelled &&
		prev.Status != backfilltype.RunAwaitingApproval {
		if _, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.chunks SET status = 'pending' WHERE batch_id = $1 AND status = 'failed'`), prev.BatchID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.runs SET status = 'running', updated_at = now(), last_error = '', calls = calls + 1 WHERE batch_id = $1`), prev.BatchID); err != nil {
			return err
		}
		prev.Status = backfilltype.RunRunning
		if err := m.event(ctx, tx, pgEvent{batchID: prev.BatchID, job: st.plan.Job, kind: "run_resumed", actor: st.worker}); err != nil {
			return err
		}
	}
	st.run, st.resumed = prev, true
	return nil
}

// abandon marks prev abandoned, records the run_abandoned event, and
// sets the call to wait for prev's chunks in flight once this
// transaction commits; the new run is created after the wait.
func (st *runStart) abandon(ctx context.Context, tx sqlx.ExtContext, prev backfilltype.Run) error {
	m := st.m
	if _, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.runs SET status = 'abandoned', updated_at = now() WHERE batch_id = $1`), prev.BatchID); err != nil {
		return err
	}
	if err := m.event(ctx, tx, pgEvent{batchID: prev.BatchID, job: st.plan.Job, kind: "run_abandoned", actor: st.worker, detail: map[string]any{"reason": "new run requested"}}); err != nil {
		return err
	}
	// Committed first; the new run after the wait.
	st.abandoned, st.wait = prev.BatchID, prev.BatchID
	return nil
}

// planChangedFrom returns the error refusing plan, whose fingerprint
// differs from that of prev, the job's run recorded with an older plan
// (planChangedError); or the error decoding prev's plan.
func planChangedFrom(plan backfilltype.Plan, prev backfilltype.Run) error {
	var old backfilltype.Plan
	if err := json.Unmarshal(prev.Plan, &old); err != nil {
		return fmt.Errorf("decode plan of batch %d: %w", prev.BatchID, err)
	}
	old.Fingerprint = prev.Fingerprint
	if old.ChunkIDs == nil {
		old.N = prev.ChunksTotal // no IDs recorded: the count tells
	}
	return planChangedError(plan.Job, prev.BatchID, old, plan)
}

// waitAbandoned waits for the chunks in flight of the abandoned batch of
// job (WaitInFlight), with the fence wait of ctx named after the start of
// job's run.
func (m *Manifest) waitAbandoned(ctx context.Context, db sqlx.ExtContext, job string, batch int64) error {
	fw := fenceWaitFrom(ctx)
	if fw.What == "" {
		fw.What = "start run of job " + job
	}
	fw.What += ": wait for the chunks in flight of abandoned batch " + fmt.Sprint(batch)
	return m.WaitInFlight(ctx, db, batch, fw)
}

func (m *Manifest) createRun(ctx context.Context, tx sqlx.ExtContext, plan backfilltype.Plan, worker string) (backfilltype.Run, error) {
	pj, err := json.Marshal(plan)
	if err != nil {
		return backfilltype.Run{}, err
	}
	var run backfilltype.Run
	// What a rehearsal's forecast is compared with (ForecastCheck): the
	// WAL position and the target's sizes, read in this transaction.
	var target sql.NullString
	if _, _, err := sqlgen.ParseTable(plan.Target.Table); err == nil && plan.Target.Table != "" {
		target = sql.NullString{String: sqlgen.Table(plan.Target.Table), Valid: true}
	}
	err = sqlx.GetContext(ctx, tx, &run, m.SQL(`INSERT INTO {s}.runs
		(job_name, source, code_version, plan_fingerprint, plan, scope, scope_lower, scope_upper, status, chunks_total, started_by, watermark,
		wal_start, target_relid, target_start_bytes, index_start_bytes)
		SELECT $1, $2, $3, $4, $5, $6, '', '', $10, $7, $8, $9, pg_current_wal_insert_lsn(), t.relid, `+relationSizes("t.relid")+`
		FROM (SELECT to_regclass($11)::oid AS relid) t RETURNING `+runColumns),
		plan.Job, plan.Source, plan.CodeVersion, plan.Fingerprint, string(pj), plan.Scope, plan.Len(), worker, plan.Watermark, initialStatus(plan), target)
	if err != nil {
		return backfilltype.Run{}, err
	}
	// The chunks as they come: a long plan's are never all in memory.
	ins := m.chunkInserter(ctx, tx, run.BatchID)
	n := 0
	var first, last backfilltype.Chunk
	for c, err := range plan.AllChunks(ctx) {
		if err != nil {
			ins.abort()
			return backfilltype.Run{}, fmt.Errorf("chunks: %w", err)
		}
		if n == 0 {
			first = c
		}
		last, n = c, n+1
		if err := ins.Add(c); err != nil {
			ins.abort()
			return backfilltype.Run{}, fmt.Errorf("insert chunks: %w", err)
		}
	}
	if err := ins.flush(); err != nil {
		return backfilltype.Run{}, fmt.Errorf("insert chunks: %w", err)
	}
	if n != plan.Len() {
		return backfilltype.Run{}, fmt.Errorf("%w: the chunker gave %d chunks, then %d", backfilltype.ErrInvalidScope, plan.Len(), n)
	}
	if n > 0 {
		run.ScopeLower, _ = first.Bounds()
		_, run.ScopeUpper = last.Bounds()
		if last.Kind == backfilltype.KindList {
			run.ScopeUpper = last.Item
		}
		if _, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.runs SET scope_lower = $2, scope_upper = $3 WHERE batch_id = $1`),
			run.BatchID, run.ScopeLower, run.ScopeUpper); err != nil {
			return backfilltype.Run{}, err
		}
	}
	if n >= analyzeChunksAt {
		if err := m.analyzeChunks(ctx, tx); err != nil {
			return backfilltype.Run{}, fmt.Errorf("analyze chunks: %w", err)
		}
	}
	if err := m.event(ctx, tx, pgEvent{batchID: run.BatchID, job: plan.Job, kind: "run_started", actor: worker, detail: map[string]any{"fingerprint": plan.Fingerprint, "chunks": n, "to": run.Status}}); err != nil {
		return backfilltype.Run{}, err
	}
	return run, nil
}

// InsertChunksBatch is the number of chunks createRun inserts per
// statement when it cannot COPY them: the statement's parameters (ten
// arrays, as text) of a long plan are built a batch at a time, not all
// at once.
const InsertChunksBatch = 10_000

// copyChunksBatch is the number of chunks createRun sends per COPY: a
// statement of a long plan stays within seconds (a statement_timeout
// the role may have), and each costs one round trip more.
const copyChunksBatch = 100_000

// chunkInserter inserts a new run's chunks, pending, in its transaction:
// by COPY FROM STDIN, copyChunksBatch chunks per statement, when the
// transaction can prepare it (a *sqlx.Tx; lib/pq sends the rows as they
// are added, in messages of up to 64 KiB), else by insertChunks,
// InsertChunksBatch chunks at a time. COPY spares the server the parse
// of ten arrays per batch and the client their encoding.
type chunkInserter struct {
	m       *Manifest
	ctx     context.Context
	tx      sqlx.ExtContext
	batchID int64
	p       Preparer  // nil: insert statements
	copy    *sql.Stmt // the COPY in progress (nil: none)
	copied  int       // rows sent to it
	batch   []backfilltype.Chunk
}

func (m *Manifest) chunkInserter(ctx context.Context, tx sqlx.ExtContext, batchID int64) *chunkInserter {
	ins := &chunkInserter{m: m, ctx: ctx, tx: tx, batchID: batchID}
	ins.p, _ = tx.(Preparer)
	return ins
}

// Add inserts c (or buffers it for the next batch).
func (ins *chunkInserter) Add(c backfilltype.Chunk) error {
	if ins.p == nil {
		if ins.batch = append(ins.batch, c); len(ins.batch) == InsertChunksBatch {
			return ins.flush()
		}
		return nil
	}
	if ins.copy == nil {
		var err error
		ins.copy, err = ins.p.PrepareContext(ins.ctx, ins.m.SQL(`COPY {s}.chunks
			(batch_id, seq, chunk_id, kind, lower_bound, upper_bound, start_at, end_at, lo, hi, item) FROM STDIN`))
		if err != nil {
			return err
		}
		ins.copied = 0
	}
	lower, upper := c.Bounds()
	var start, end, lo, hi, item any
	switch c.Kind {
	case backfilltype.KindTime:
		start, end = c.Start, c.End
	case backfilltype.KindInt:
		lo, hi = c.Lo, c.Hi
	case backfilltype.KindList:
		item = c.Item
	}
	if _, err := ins.copy.ExecContext(ins.ctx, ins.batchID, int64(c.Seq), c.ID, string(c.Kind), lower, upper, start, end, lo, hi, item); err != nil {
		return err
	}
	if ins.copied++; ins.copied == cmp.Or(ins.m.CopyBatch, copyChunksBatch) {
		return ins.flush()
	}
	return nil
}

// flush inserts the chunks added and not yet inserted: the rest of a
// batch, or the end of the COPY in progress.
func (ins *chunkInserter) flush() error {
	if ins.p == nil {
		if len(ins.batch) == 0 {
			return nil
		}
		err := ins.m.insertChunks(ins.ctx, ins.tx, ins.batchID, ins.batch)
		ins.batch = ins.batch[:0]
		return err
	}
	if ins.copy == nil {
		return nil
	}
	_, err := ins.copy.ExecContext(ins.ctx)
	if cerr := ins.copy.Close(); err == nil {
		err = cerr
	}
	ins.copy = nil
	return err
}

// abort closes an unfinished COPY; the transaction is to roll back.
func (ins *chunkInserter) abort() {
	if ins.copy != nil {
		_ = ins.copy.Close()
		ins.copy = nil
	}
}

// insertChunks inserts chunks, pending, into batch batchID, in one
// statement.
func (m *Manifest) insertChunks(ctx context.Context, tx sqlx.ExtContext, batchID int64, chunks []backfilltype.Chunk) error {
	n := len(chunks)
	seqs := make([]int64, n)
	ids, kinds, lows, ups, items := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]sql.NullString, n)
	starts, ends := make([]sql.NullString, n), make([]sql.NullString, n)
	los, his := make([]sql.NullInt64, n), make([]sql.NullInt64, n)
	for i, c := range chunks {
		seqs[i], ids[i], kinds[i] = int64(c.Seq), c.ID, string(c.Kind)
		lows[i], ups[i] = c.Bounds()
		switch c.Kind {
		case backfilltype.KindTime:
			starts[i] = sql.NullString{String: c.Start.Format(time.RFC3339Nano), Valid: true}
			ends[i] = sql.NullString{String: c.End.Format(time.RFC3339Nano), Valid: true}
		case backfilltype.KindInt:
			los[i] = sql.NullInt64{Int64: c.Lo, Valid: true}
			his[i] = sql.NullInt64{Int64: c.Hi, Valid: true}
		case backfilltype.KindList:
			items[i] = sql.NullString{String: c.Item, Valid: true}
		}
	}
	_, err := tx.ExecContext(ctx, m.SQL(`INSERT INTO {s}.chunks
		(batch_id, seq, chunk_id, kind, lower_bound, upper_bound, start_at, end_at, lo, hi, item)
		SELECT $1, u.* FROM unnest($2::int[], $3::text[], $4::text[], $5::text[], $6::text[],
			$7::timestamptz[], $8::timestamptz[], $9::bigint[], $10::bigint[], $11::text[]) AS u`),
		batchID, pq.Array(seqs), pq.Array(ids), pq.Array(kinds), pq.Array(lows), pq.Array(ups),
		pq.Array(starts), pq.Array(ends), pq.Array(los), pq.Array(his), pq.Array(items))
	return err
}

// analyzeChunksAt is the number of chunks from which createRun analyzes
// the chunks table after inserting a plan's chunks.
const analyzeChunksAt = 1000

// analyzeChunks runs ANALYZE of the chunks table in tx (which sees the
// chunks tx inserted) when the session's role may: the table's owner or
// a member of its role (PostgreSQL before 17 has no MAINTAIN privilege;
// another role skips it, and the autovacuum's analyze of the table
// follows). Without statistics the planner takes a new plan's chunks
// for a handful of rows and claims them with a bitmap scan and a sort of
// every pending chunk (ClaimQuery), instead of the first entry of the
// index chunks_claimable. SKIP_LOCKED: a VACUUM or ANALYZE of the table
// in progress is not waited for.
func (m *Manifest) analyzeChunks(ctx context.Context, tx sqlx.ExtContext) error {
	var owner bool
	if err := sqlx.GetContext(ctx, tx, &owner, `SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = $1::regclass`,
		m.SQL(`{s}.chunks`)); err != nil {
		return err
	}
	if !owner {
		return nil
	}
	_, err := tx.ExecContext(ctx, m.SQL(`ANALYZE (SKIP_LOCKED) {s}.chunks`))
	return err
}

// pgEvent is a row of the events table: what happened (kind) to a run of
// job, who did it (actor, "" for the library) and details as JSON.
type pgEvent struct {
	batchID          int64
	job, kind, actor string
	detail           map[string]any // nil for none
}

// event records e in tx.
func (m *Manifest) event(ctx context.Context, tx sqlx.ExtContext, e pgEvent) error {
	detail := e.detail
	if detail == nil {
		detail = map[string]any{}
	}
	b, err := json.Marshal(detail)
	if err != nil {
		return err
	}
	// Through record_event: the session's role does not write the audit
	// log directly (migration 23); within its caps (migration 25).
	_, err = tx.ExecContext(ctx, m.SQL(`SELECT {s}.record_event($1, $2, $3, $4, $5::jsonb)`),
		e.batchID, e.job, e.kind, EventActor(e.actor), EventDetail(b))
	return err
}

type pgChunkRow struct {
	BatchID    int64          `db:"batch_id"`
	Seq        int            `db:"seq"`
	ChunkID    string         `db:"chunk_id"`
	Kind       string         `db:"kind"`
	StartAt    *time.Time     `db:"start_at"`
	EndAt      *time.Time     `db:"end_at"`
	Lo         sql.NullInt64  `db:"lo"`
	Hi         sql.NullInt64  `db:"hi"`
	Item       sql.NullString `db:"item"`
	Status     string         `db:"status"`
	Attempts   int            `db:"attempts"`
	StartedAt  *time.Time     `db:"started_at"`
	FinishedAt *time.Time     `db:"finished_at"`
	LastError  string         `db:"last_error"`
	Worker     string         `db:"worker"`
	Skipped    bool           `db:"skipped"`
	backfilltype.Counts
}

const chunkColumns = `batch_id, seq, chunk_id, kind, start_at, end_at, lo, hi, item, status, attempts,
	rows_read, rows_inserted, rows_updated, rows_unchanged, rows_rejected, rows_deduplicated,
	started_at, finished_at, last_error, worker, skipped`

func (r pgChunkRow) state() backfilltype.ChunkState {
	c := backfilltype.Chunk{ID: r.ChunkID, Seq: r.Seq, Kind: backfilltype.ChunkKind(r.Kind), Lo: r.Lo.Int64, Hi: r.Hi.Int64, Item: r.Item.String}
	if r.StartAt != nil {
		c.Start = *r.StartAt
	}
	if r.EndAt != nil {
		c.End = *r.EndAt
	}
	return backfilltype.ChunkState{BatchID: r.BatchID, Chunk: c, Status: backfilltype.ChunkStatus(r.Status), Attempts: r.Attempts, Counts: r.Counts,
		StartedAt: r.StartedAt, FinishedAt: r.FinishedAt, LastError: r.LastError, Worker: r.Worker, Skipped: r.Skipped}
}

// ClaimChunk implements [Manifest.ClaimChunk] with SELECT ... FOR UPDATE
// SKIP LOCKED (PostgreSQL docs, SELECT, "The Locking Clause"), checking
// in the same statement that the run is running, without locking the
// run's row. The same statement sets the timeouts of the transaction as a
// fenced chunk's transaction has them (leaseSettings), with the
// session's values: statement_timeout 0, the session's kept in
// backfill.statement_timeout for the merge to put back; lock_timeout
// kept in backfill.lock_timeout.
//
// No lock on the run's row (nor in LeaseChunk and FenceLease): a run that
// is abandoned or rolled back is first set so (committed), then
// WaitInFlight waits for the chunks in flight. A claim (or fence)
// statement that read the run as running either locked its chunk row
// before WaitInFlight reached it (WaitInFlight waits for it) or finds it
// locked by WaitInFlight and skips it. A statement whose snapshot is
// older than the change, and that locks its row only after WaitInFlight
// released it, is stopped by the checkpoint, which reads the run's status
// afresh (CompleteChunk). A run that is failed or paused meanwhile lets
// its chunks in flight commit: they were claimed while it ran, and a
// resume or a rollback waits for them.
func (m *Manifest) ClaimChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64) (backfilltype.ChunkState, bool, error) {
	var rows []pgChunkRow
	err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT c.* FROM (`+ClaimQuery+`) c
		WHERE set_config('statement_timeout', CASE WHEN set_config('backfill.statement_timeout',
			current_setting('statement_timeout'), true) IS NOT NULL THEN '0' END, true) IS NOT NULL
		AND set_config('backfill.lock_timeout', current_setting('lock_timeout'), true) IS NOT NULL`), batchID, "{}")
	if err != nil {
		return backfilltype.ChunkState{}, false, fmt.Errorf("backfill: claim chunk of batch %d: %w", batchID, err)
	}
	if len(rows) == 0 {
		return backfilltype.ChunkState{}, false, nil
	}
	return rows[0].state(), true, nil
}

// CompleteChunk implements [Manifest.CompleteChunk]. The chunk must be
// pending (claimed in tx); otherwise it returns an error and the caller
// must roll back.
func (m *Manifest) CompleteChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, r backfilltype.ChunkResult, exceptions []backfilltype.Exception) error {
	return m.completeChunk(ctx, tx, batchID, r, exceptions, backfilldriver.ChunkFingerprints{})
}

// completeChunk is CompleteChunk recording fp (none when zero) on the
// chunk's row in the checkpoint statement ([backfilldriver.ManifestSkips]).
func (m *Manifest) completeChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, r backfilltype.ChunkResult, exceptions []backfilltype.Exception, fp backfilldriver.ChunkFingerprints) error {
	if !r.Balanced() {
		return fmt.Errorf("backfill: complete chunk %s: %w: %+v", r.Chunk.ID, backfilltype.ErrAccounting, r.Counts)
	}
	// A chunk read again while open: the latest read replaces its
	// exception queue (a row rejected by every read is queued once), in
	// this transaction, before the status changes below. A chunk its
	// transaction found pending (BatchTx.Fresh, under the fence's row
	// lock) has none: the statement would delete nothing.
	if b, ok := tx.(*BatchTx); !ok || !b.Fresh {
		if _, err := tx.ExecContext(ctx, m.SQL(`DELETE FROM {s}.exceptions e USING {s}.chunks c
			WHERE c.batch_id = $1 AND c.seq = $2 AND c.status = 'open'
			AND e.batch_id = $1 AND e.chunk_id = c.chunk_id AND e.failed_attempt IS NULL`), batchID, r.Chunk.Seq); err != nil {
			return fmt.Errorf("backfill: complete chunk %s: exceptions of the earlier read: %w", r.Chunk.ID, err)
		}
	}
	if err := m.addExceptions(ctx, tx, batchID, r.Chunk.ID, exceptions); err != nil {
		return fmt.Errorf("backfill: complete chunk %s: exceptions: %w", r.Chunk.ID, err)
	}
	// A chunk read before (open) takes this read's counts as
	// [backfilltype.Counts.Reread] combines them with its own (the same
	// formula, in SQL: $4+$5+$6 are the rows this read merged); a staged
	// chunk's rows_read and rows_rejected are this result's.
	status := backfilltype.ChunkDone
	if r.Open {
		status = backfilltype.ChunkOpen
	}
	res, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.chunks SET status = $12, attempts = attempts + 1,
		rows_read = $3,
		rows_inserted = CASE WHEN status = 'open' THEN least(rows_inserted + $4, $4 + $5 + $6) ELSE $4 END,
		rows_updated = CASE WHEN status = 'open' THEN least(rows_updated + $5, $4 + $5 + $6 - least(rows_inserted + $4, $4 + $5 + $6)) ELSE $5 END,
		rows_unchanged = CASE WHEN status = 'open' THEN $4 + $5 + $6 - least(rows_inserted + $4, $4 + $5 + $6)
			- least(rows_updated + $5, $4 + $5 + $6 - least(rows_inserted + $4, $4 + $5 + $6)) ELSE $6 END,
		rows_rejected = $7,
		rows_deduplicated = $8,
		started_at = $9, finished_at = $10, last_error = '', worker = $11,
		rows_processed = rows_processed + CASE WHEN status = 'staged' THEN 0 ELSE $3::bigint END,
		reads = reads + CASE WHEN status = 'staged' THEN 0 ELSE 1 END, checkpointed_at = clock_timestamp(), wal_lsn = pg_current_wal_insert_lsn(),
		open_call = CASE WHEN $12 = 'open' THEN (SELECT calls FROM {s}.runs WHERE batch_id = $1) END,
		source_fingerprint = $13, target_fingerprint = $14, skip_key = $15, skipped = $16, source_version = $17
		WHERE batch_id = $1 AND seq = $2 AND status IN ('pending', 'staged', 'open')
			AND EXISTS (SELECT 1 FROM {s}.runs WHERE batch_id = $1 AND status NOT IN ('abandoned', 'rolled_back', 'cancelled'))`),
		batchID, r.Chunk.Seq, r.Read, r.Inserted, r.Updated, r.Unchanged, r.Rejected, r.Deduplicated, r.StartedAt, r.FinishedAt, ManifestText(r.Worker), string(status),
		nullIfEmpty(fp.Source), nullIfEmpty(fp.Target), nullIfEmpty(fp.SkipKey), r.Skipped, nullIfEmpty(fp.Version))
	if err != nil {
		return fmt.Errorf("backfill: complete chunk %s: %w", r.Chunk.ID, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("backfill: complete chunk %s of batch %d: chunk is not pending (completed by another worker?) or the run was abandoned, rolled back or cancelled", r.Chunk.ID, batchID)
	}
	return nil
}

func (m *Manifest) addExceptions(ctx context.Context, tx sqlx.ExtContext, batchID int64, chunkID string, ex []backfilltype.Exception) error {
	return m.addExceptionsOf(ctx, tx, batchID, chunkID, ex, sql.NullInt64{})
}

// addExceptionsOf appends ex to the queue, or, when failedAttempt is set,
// as the evidence of that rolled back attempt.
func (m *Manifest) addExceptionsOf(ctx context.Context, tx sqlx.ExtContext, batchID int64, chunkID string, ex []backfilltype.Exception, failedAttempt sql.NullInt64) error {
	const batch = 5000
	for len(ex) > 0 {
		part := ex[:min(batch, len(ex))]
		ex = ex[len(part):]
		rowsN := make([]int64, len(part))
		raws := make([]sql.NullString, len(part))
		cols, vals, reasons := make([]string, len(part)), make([]string, len(part)), make([]string, len(part))
		for i, e := range part {
			e = ManifestException(e) // free text PostgreSQL can store
			rowsN[i], cols[i], vals[i], reasons[i] = e.Row, e.Column, e.Value, e.Reason
			if len(e.Raw) > 0 {
				raws[i] = sql.NullString{String: string(e.Raw), Valid: true}
			}
		}
		_, err := tx.ExecContext(ctx, m.SQL(`INSERT INTO {s}.exceptions (batch_id, chunk_id, row_number, raw, column_name, value, reason, failed_attempt)
			SELECT $1, $2, u.*, $8 FROM unnest($3::bigint[], $4::jsonb[], $5::text[], $6::text[], $7::text[]) AS u`),
			batchID, chunkID, pq.Array(rowsN), pq.Array(raws), pq.Array(cols), pq.Array(vals), pq.Array(reasons), failedAttempt)
		if err != nil {
			return err
		}
	}
	return nil
}

// FailChunk implements [Manifest.FailChunk].
func (m *Manifest) FailChunk(ctx context.Context, db sqlx.ExtContext, batchID int64, seq int, msg string, final bool) error {
	ctx = m.purpose(ctx, "record the failure of a chunk", batchID)
	status := backfilltype.ChunkPending
	if final {
		status = backfilltype.ChunkFailed
	}
	// An open chunk holds rows of earlier reads: it stays open (and
	// claimable by the next call) whatever this attempt did.
	// In its own READ COMMITTED transaction (InTx), retried on 40001 and
	// 40P01, when db is not one already.
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		_, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.chunks SET attempts = attempts + 1, last_error = $3,
			status = CASE WHEN status = 'open' THEN status ELSE $4 END
			WHERE batch_id = $1 AND seq = $2 AND status <> 'done'`), batchID, seq, ManifestText(msg), string(status))
		return err
	})
	if err != nil {
		return fmt.Errorf("backfill: record failure of chunk %d of batch %d: %w", seq, batchID, err)
	}
	return nil
}

// FinishRun implements [Manifest.FinishRun].
func (m *Manifest) FinishRun(ctx context.Context, db sqlx.ExtContext, batchID int64, failed bool, msg string) (backfilltype.Run, error) {
	msg = ManifestText(msg)
	var run backfilltype.Run
	// Safe to run again after a COMMIT that was cut (InShortTx retries
	// it): a run that committed completed is returned as it is, and one
	// that committed failed is left failed while chunks remain.
	ctx = m.purpose(ctx, "finish run", batchID)
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		var runs []backfilltype.Run
		if err := sqlx.SelectContext(ctx, tx, &runs, m.SQL(`SELECT `+runColumns+` FROM {s}.runs WHERE batch_id = $1 FOR NO KEY UPDATE`), batchID); err != nil {
			return err
		}
		if len(runs) == 0 {
			return fmt.Errorf("batch %d: %w", batchID, backfilltype.ErrRunNotFound)
		}
		run = runs[0]
		switch run.Status {
		case backfilltype.RunCompleted, backfilltype.RunAbandoned, backfilltype.RunPaused, backfilltype.RunRolledBack, backfilltype.RunCancelled:
			return nil
		}
		// Whether any chunk is not done: the first one found will do.
		var open int
		if err := sqlx.GetContext(ctx, tx, &open, m.SQL(`SELECT count(*) FROM (SELECT FROM {s}.chunks WHERE batch_id = $1 AND status <> 'done' LIMIT 1) c`), batchID); err != nil {
			return err
		}
		var status backfilltype.RunStatus
		switch {
		case open == 0:
			status = backfilltype.RunCompleted
		case failed && run.Status == backfilltype.RunFailed:
			return nil
		case failed:
			status = backfilltype.RunFailed
		default:
			return nil
		}
		// A completed run records its WAL position and its target's sizes
		// (ForecastCheck).
		err := sqlx.GetContext(ctx, tx, &run, m.SQL(`UPDATE {s}.runs SET status = $2, last_error = $3, updated_at = now(),
			finished_at = CASE WHEN $2 = 'completed' THEN now() END,
			(wal_end, target_end_bytes, index_end_bytes) = (SELECT pg_current_wal_insert_lsn(), `+relationSizes("target_relid")+` WHERE $2 = 'completed')
			WHERE batch_id = $1 RETURNING `+runColumns), batchID, string(status), msg)
		if err != nil {
			return err
		}
		// Workers that stopped heartbeating (killed, crashed) never mark
		// themselves finished: the run's end says they are lost, their
		// live span ending at their last sign of life, not now.
		if _, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.workers SET state = 'lost', finished_at = least(now(), {s}.worker_last_life(worker_key))
			WHERE batch_id = $1 AND finished_at IS NULL AND heartbeat_at < now() - stale_after`), batchID); err != nil {
			return err
		}
		return m.event(ctx, tx, pgEvent{batchID: batchID, job: run.Job, kind: "run_" + string(status), detail: map[string]any{"error": msg}})
	})
	if err != nil {
		return backfilltype.Run{}, fmt.Errorf("backfill: finish run %d: %w", batchID, err)
	}
	return run, nil
}

// LoadedTotals sums the rows read and rejected of batchID's done and open
// chunks (see loadedTotaler), in one aggregate.
func (m *Manifest) LoadedTotals(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.Counts, error) {
	ctx = m.purpose(ctx, "read the run's totals", batchID)
	var sum struct {
		Read     int64 `db:"read"`
		Rejected int64 `db:"rejected"`
	}
	if err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		return sqlx.GetContext(ctx, tx, &sum, m.SQL(`SELECT coalesce(sum(rows_read), 0)::int8 AS read, coalesce(sum(rows_rejected), 0)::int8 AS rejected
			FROM {s}.chunks WHERE batch_id = $1 AND status IN ('done', 'open')`), batchID)
	}); err != nil {
		return backfilltype.Counts{}, fmt.Errorf("backfill: totals of batch %d: %w", batchID, err)
	}
	return backfilltype.Counts{Read: sum.Read, Rejected: sum.Rejected}, nil
}

// ChunkSummary counts and sums batchID's chunks (see chunkSummer), in
// one aggregate.
func (m *Manifest) ChunkSummary(ctx context.Context, db sqlx.ExtContext, batchID int64) (ChunkSummary, error) {
	ctx = m.purpose(ctx, "read the chunk summary", batchID)
	var row struct {
		Done    int            `db:"done"`
		Open    int            `db:"open"`
		Other   int            `db:"other"`
		Skipped int            `db:"skipped"`
		OpenIDs pq.StringArray `db:"open_ids"`
		backfilltype.Counts
	}
	if err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		return sqlx.GetContext(ctx, tx, &row, m.SQL(`SELECT count(*) FILTER (WHERE status = 'done') AS done,
			count(*) FILTER (WHERE status = 'open') AS open,
			count(*) FILTER (WHERE status NOT IN ('done', 'open')) AS other,
			count(*) FILTER (WHERE status IN ('done', 'open') AND skipped) AS skipped,
			coalesce(array_agg(chunk_id ORDER BY seq) FILTER (WHERE status = 'open'), '{}') AS open_ids,
			coalesce(sum(rows_read) FILTER (WHERE status IN ('done', 'open')), 0)::int8 AS rows_read,
			coalesce(sum(rows_inserted) FILTER (WHERE status IN ('done', 'open')), 0)::int8 AS rows_inserted,
			coalesce(sum(rows_updated) FILTER (WHERE status IN ('done', 'open')), 0)::int8 AS rows_updated,
			coalesce(sum(rows_unchanged) FILTER (WHERE status IN ('done', 'open')), 0)::int8 AS rows_unchanged,
			coalesce(sum(rows_rejected) FILTER (WHERE status IN ('done', 'open')), 0)::int8 AS rows_rejected,
			coalesce(sum(rows_deduplicated) FILTER (WHERE status IN ('done', 'open')), 0)::int8 AS rows_deduplicated
			FROM {s}.chunks WHERE batch_id = $1`), batchID)
	}); err != nil {
		return ChunkSummary{}, fmt.Errorf("backfill: chunks of batch %d: %w", batchID, err)
	}
	sum := ChunkSummary{Done: row.Done, Open: row.Open, Other: row.Other, Skipped: row.Skipped, Counts: row.Counts}
	if len(row.OpenIDs) > 0 {
		sum.OpenIDs = row.OpenIDs
	}
	return sum, nil
}

// Chunks implements [Manifest.Chunks].
func (m *Manifest) Chunks(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.ChunkState, error) {
	ctx = m.purpose(ctx, "read the chunks", batchID)
	var rows []pgChunkRow
	if err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = nil // a retried attempt starts over
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT `+chunkColumns+` FROM {s}.chunks WHERE batch_id = $1 ORDER BY seq`), batchID)
	}); err != nil {
		return nil, fmt.Errorf("backfill: chunks of batch %d: %w", batchID, err)
	}
	out := make([]backfilltype.ChunkState, len(rows))
	for i, r := range rows {
		out[i] = r.state()
	}
	return out, nil
}

// Exceptions implements [Manifest.Exceptions].
func (m *Manifest) Exceptions(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Exception, error) {
	ctx = m.purpose(ctx, "read exceptions", batchID)
	var rows []struct {
		backfilltype.Exception
		RawText sql.NullString `db:"raw_text"`
	}
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = nil // a retried attempt starts over
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT e.batch_id, e.chunk_id, e.row_number, e.raw::text AS raw_text,
		e.column_name, e.value, e.reason, e.created_at
		FROM {s}.exceptions e JOIN {s}.chunks c ON c.batch_id = e.batch_id AND c.chunk_id = e.chunk_id
		WHERE e.batch_id = $1 AND e.failed_attempt IS NULL ORDER BY c.seq, e.row_number, e.id`), batchID)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: exceptions of batch %d: %w", batchID, err)
	}
	out := make([]backfilltype.Exception, len(rows))
	for i, r := range rows {
		out[i] = r.Exception
		if r.RawText.Valid {
			out[i].Raw = json.RawMessage(r.RawText.String)
		}
	}
	return out, nil
}

// Run returns the run with batchID, or an error wrapping
// [backfilltype.ErrRunNotFound].
func (m *Manifest) Run(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.Run, error) {
	ctx = m.purpose(ctx, "read the run", batchID)
	var runs []backfilltype.Run
	if err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		runs = nil // a retried attempt starts over
		return sqlx.SelectContext(ctx, tx, &runs, m.SQL(`SELECT `+runColumns+` FROM {s}.runs WHERE batch_id = $1`), batchID)
	}); err != nil {
		return backfilltype.Run{}, fmt.Errorf("backfill: run %d: %w", batchID, err)
	}
	if len(runs) == 0 {
		return backfilltype.Run{}, fmt.Errorf("backfill: run %d: %w", batchID, backfilltype.ErrRunNotFound)
	}
	return runs[0], nil
}

var errNotTx = errors.New("backfill: executor is not a transaction")

// RecordEvent implements [backfilldriver.ManifestAudit.RecordEvent].
func (m *Manifest) RecordEvent(ctx context.Context, db sqlx.ExtContext, e backfilltype.Event) error {
	ctx = m.purpose(ctx, "record an event", e.BatchID)
	detail := EventDetail(e.Detail)
	var batch sql.NullInt64
	if e.BatchID != 0 {
		batch = sql.NullInt64{Int64: e.BatchID, Valid: true}
	}
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		_, err := tx.ExecContext(ctx, m.SQL(`SELECT {s}.record_event($1, $2, $3, $4, $5::jsonb)`),
			batch, e.Job, e.Kind, EventActor(e.Actor), detail)
		return err
	})
	if err != nil {
		return fmt.Errorf("backfill: record event %s of batch %d: %w", e.Kind, e.BatchID, err)
	}
	return nil
}

// Events implements [backfilldriver.ManifestAudit.Events].
func (m *Manifest) Events(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Event, error) {
	ctx = m.purpose(ctx, "read events", batchID)
	var rows []struct {
		backfilltype.Event
		Batch  sql.NullInt64 `db:"batch"`
		Detail string        `db:"detail_text"`
	}
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = nil // a retried attempt starts over
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT id, batch_id AS batch, job_name, kind, actor, coalesce(db_role, '') AS db_role,
		detail::text AS detail_text, created_at
		FROM {s}.events WHERE batch_id = $1 ORDER BY id`), batchID)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: events of batch %d: %w", batchID, err)
	}
	out := make([]backfilltype.Event, len(rows))
	for i, r := range rows {
		out[i] = r.Event
		out[i].BatchID = r.Batch.Int64
		out[i].Detail = json.RawMessage(r.Detail)
	}
	return out, nil
}

// LatestRun implements [backfilldriver.ManifestAudit.LatestRun].
func (m *Manifest) LatestRun(ctx context.Context, db sqlx.ExtContext, job string, statuses ...backfilltype.RunStatus) (backfilltype.Run, error) {
	ctx = m.purpose(ctx, "read the job's latest run", 0)
	st := make([]string, len(statuses))
	for i, s := range statuses {
		st[i] = string(s)
	}
	var runs []backfilltype.Run
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		runs = nil // a retried attempt starts over
		return sqlx.SelectContext(ctx, tx, &runs, m.SQL(`SELECT `+runColumns+` FROM {s}.runs
		WHERE job_name = $1 AND (cardinality($2::text[]) = 0 OR status = ANY ($2::text[])) ORDER BY batch_id DESC LIMIT 1`), job, pq.Array(st))
	})
	if err != nil {
		return backfilltype.Run{}, fmt.Errorf("backfill: latest run of job %q: %w", job, m.readDenied(ctx, db, err))
	}
	if len(runs) == 0 {
		return backfilltype.Run{}, fmt.Errorf("backfill: latest run of job %q with status %v: %w", job, statuses, backfilltype.ErrRunNotFound)
	}
	return runs[0], nil
}

// AddValidations implements
// [backfilldriver.ManifestValidations.AddValidations].
func (m *Manifest) AddValidations(ctx context.Context, db sqlx.ExtContext, batchID int64, chunkID string, results []backfilltype.CheckResult) error {
	ctx = m.purpose(ctx, "record validations", batchID)
	return m.addValidations(ctx, db, batchID, chunkID, results, sql.NullInt64{})
}

func (m *Manifest) addValidations(ctx context.Context, db sqlx.ExtContext, batchID int64, chunkID string, results []backfilltype.CheckResult, failedAttempt sql.NullInt64) error {
	ctx = m.purpose(ctx, "record validations", batchID)
	// All or none, in one READ COMMITTED transaction retried on 40001 and
	// 40P01 (InTx) when db is not one already.
	return InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		return m.insertValidations(ctx, tx, batchID, chunkID, results, failedAttempt)
	})
}

func (m *Manifest) insertValidations(ctx context.Context, db sqlx.ExtContext, batchID int64, chunkID string, results []backfilltype.CheckResult, failedAttempt sql.NullInt64) error {
	for _, r := range results {
		r = ManifestCheckResult(r) // free text PostgreSQL can store
		sample, err := json.Marshal(r.Sample)
		if err != nil {
			return err
		}
		if r.Sample == nil {
			sample = []byte("[]")
		}
		var detail sql.NullString
		if len(r.Detail) > 0 {
			detail = sql.NullString{String: string(r.Detail), Valid: true}
		}
		_, err = db.ExecContext(ctx, m.SQL(`INSERT INTO {s}.validations (batch_id, chunk_id, check_name, severity, passed, expected, actual, sample, detail, failed_attempt, accepted)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`), batchID, chunkID, r.Check, string(r.Severity), r.Passed, r.Expected, r.Actual, string(sample), detail,
			failedAttempt, r.Accepted)
		if err != nil {
			return fmt.Errorf("backfill: recording the result of check %s of chunk %s: %w", r.Check, chunkID, err)
		}
	}
	return nil
}

// Validations implements [backfilldriver.ManifestValidations.Validations].
func (m *Manifest) Validations(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Validation, error) {
	ctx = m.purpose(ctx, "read validations", batchID)
	var rows []struct {
		ChunkID   string         `db:"chunk_id"`
		Check     string         `db:"check_name"`
		Severity  string         `db:"severity"`
		Passed    bool           `db:"passed"`
		Expected  string         `db:"expected"`
		Actual    string         `db:"actual"`
		Sample    string         `db:"sample"`
		Detail    sql.NullString `db:"detail"`
		CreatedAt time.Time      `db:"created_at"`
		Failed    sql.NullInt64  `db:"failed_attempt"`
		Accepted  bool           `db:"accepted"`
	}
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = nil // a retried attempt starts over
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT chunk_id, check_name, severity, passed, expected, actual,
		sample::text AS sample, detail::text AS detail, created_at, failed_attempt, accepted FROM {s}.validations WHERE batch_id = $1 ORDER BY id`), batchID)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: validations of batch %d: %w", batchID, err)
	}
	out := make([]backfilltype.Validation, len(rows))
	for i, r := range rows {
		v := backfilltype.Validation{BatchID: batchID, ChunkID: r.ChunkID, CreatedAt: r.CreatedAt, FailedAttempt: int(r.Failed.Int64),
			CheckResult: backfilltype.CheckResult{Check: r.Check, Severity: backfilltype.Severity(r.Severity), Passed: r.Passed, Expected: r.Expected, Actual: r.Actual, Accepted: r.Accepted}}
		if err := json.Unmarshal([]byte(r.Sample), &v.Sample); err != nil {
			return nil, err
		}
		if r.Detail.Valid {
			v.Detail = json.RawMessage(r.Detail.String)
		}
		out[i] = v
	}
	return out, nil
}

// RecordGateFailure implements
// [backfilldriver.ManifestGates.RecordGateFailure] in one transaction of
// its own: the results and exceptions of the rolled back attempt, marked
// with its number, the pause and its event commit together or not at all.
func (m *Manifest) RecordGateFailure(ctx context.Context, db sqlx.ExtContext, p backfilltype.GateFailure) error {
	ctx = m.purpose(ctx, "record a gate failure", p.BatchID)
	reason := ManifestText(p.Reason)
	failed := sql.NullInt64{Int64: int64(p.Attempt), Valid: true}
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		if err := m.addValidations(ctx, tx, p.BatchID, p.ChunkID, p.Results, failed); err != nil {
			return err
		}
		if err := m.addExceptionsOf(ctx, tx, p.BatchID, p.ChunkID, p.Exceptions, failed); err != nil {
			return err
		}
		// The attempt counts: the next one has the next number.
		if _, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.chunks SET attempts = attempts + 1, last_error = $3
			WHERE batch_id = $1 AND chunk_id = $2 AND status <> 'done'`), p.BatchID, p.ChunkID, "quality gate failed: "+reason); err != nil {
			return err
		}
		return m.PauseRun(ctx, tx, p.BatchID, fmt.Sprintf("chunk %s: %s", p.ChunkID, reason))
	})
	if err != nil {
		return fmt.Errorf("backfill: record failed gate of chunk %s of batch %d: %w", p.ChunkID, p.BatchID, err)
	}
	return nil
}

// FailedAttemptExceptions implements
// [backfilldriver.ManifestGates.FailedAttemptExceptions].
func (m *Manifest) FailedAttemptExceptions(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Exception, error) {
	ctx = m.purpose(ctx, "read failed attempts' exceptions", batchID)
	var rows []struct {
		backfilltype.Exception
		RawText sql.NullString `db:"raw_text"`
	}
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = nil // a retried attempt starts over
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT e.batch_id, e.chunk_id, e.row_number, e.raw::text AS raw_text,
		e.column_name, e.value, e.reason, e.created_at, e.failed_attempt
		FROM {s}.exceptions e JOIN {s}.chunks c ON c.batch_id = e.batch_id AND c.chunk_id = e.chunk_id
		WHERE e.batch_id = $1 AND e.failed_attempt IS NOT NULL ORDER BY c.seq, e.failed_attempt, e.row_number, e.id`), batchID)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: exceptions of failed attempts of batch %d: %w", batchID, err)
	}
	out := make([]backfilltype.Exception, len(rows))
	for i, r := range rows {
		out[i] = r.Exception
		if r.RawText.Valid {
			out[i].Raw = json.RawMessage(r.RawText.String)
		}
	}
	return out, nil
}

// RollBackChunk implements [backfilldriver.ManifestRollback].
func (m *Manifest) RollBackChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, seq int) (bool, error) {
	var status []string
	// A chunk pending or failed with sub-chunks committed (adaptive
	// chunks) holds their rows: rolled back as a done one.
	if err := sqlx.SelectContext(ctx, tx, &status, m.SQL(`SELECT CASE WHEN status IN ('pending', 'failed') AND EXISTS (SELECT 1 FROM {s}.subchunks s
			WHERE s.batch_id = c.batch_id AND s.seq = c.seq) THEN 'done' ELSE status END
		FROM {s}.chunks c WHERE batch_id = $1 AND seq = $2 FOR UPDATE OF c`), batchID, seq); err != nil {
		return false, err
	}
	if len(status) == 0 || status[0] != string(backfilltype.ChunkDone) && status[0] != string(backfilltype.ChunkOpen) {
		return false, nil
	}
	if _, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.chunks SET status = 'rolled_back' WHERE batch_id = $1 AND seq = $2`), batchID, seq); err != nil {
		return false, err
	}
	return true, nil
}

// RollBackRun implements [backfilldriver.ManifestRollback].
func (m *Manifest) RollBackRun(ctx context.Context, tx sqlx.ExtContext, batchID int64) error {
	_, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.runs SET status = 'rolled_back', updated_at = now() WHERE batch_id = $1`), batchID)
	return err
}

// PauseRun implements [backfilldriver.ManifestValidations.PauseRun].
func (m *Manifest) PauseRun(ctx context.Context, db sqlx.ExtContext, batchID int64, reason string) error {
	ctx = m.purpose(ctx, "pause the run", batchID)
	reason = ManifestText(reason)
	return InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		var runs []backfilltype.Run
		if err := sqlx.SelectContext(ctx, tx, &runs, m.SQL(`UPDATE {s}.runs SET status = 'paused', last_error = $2, updated_at = now()
			WHERE batch_id = $1 AND status IN ('running', 'failed') RETURNING `+runColumns), batchID, reason); err != nil {
			return fmt.Errorf("backfill: pause run %d: %w", batchID, err)
		}
		if len(runs) == 0 {
			return nil
		}
		return m.event(ctx, tx, pgEvent{batchID: batchID, job: runs[0].Job, kind: "run_paused", detail: map[string]any{"reason": reason}})
	})
}

// ResumeRun implements [backfilldriver.ManifestValidations.ResumeRun] with
// the SQL function resume ([Manifest.Resume]): a cancelled run is resumed
// too.
func (m *Manifest) ResumeRun(ctx context.Context, db sqlx.ExtContext, batchID int64, actor, why string) error {
	return m.ReadControl(ctx, db, "resume", batchID, actor, why)
}

// StageChunk implements [ManifestStaging.StageChunk]: it checkpoints a
// chunk of a run published at its end (backfill.PublishAtEnd): its rows are
// in the run's persistent staging table and its exceptions in the queue;
// the merge counts come with the publish. The chunk must be pending
// (claimed in tx).
func (m *Manifest) StageChunk(ctx context.Context, tx sqlx.ExtContext, p backfilldriver.StageChunkParams) error {
	if p.Read != p.Rejected+p.Staged {
		return fmt.Errorf("backfill: stage chunk %s: %w: read %d != staged %d + rejected %d", p.Chunk.ID, backfilltype.ErrAccounting, p.Read, p.Staged, p.Rejected)
	}
	if err := m.addExceptions(ctx, tx, p.BatchID, p.Chunk.ID, p.Exceptions); err != nil {
		return fmt.Errorf("backfill: stage chunk %s: exceptions: %w", p.Chunk.ID, err)
	}
	res, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.chunks SET status = 'staged', rows_read = $3, rows_rejected = $4, rows_staged = $5,
		rows_processed = rows_processed + $3, reads = reads + 1, checkpointed_at = clock_timestamp()
		WHERE batch_id = $1 AND seq = $2 AND status = 'pending'
			AND EXISTS (SELECT 1 FROM {s}.runs WHERE batch_id = $1 AND status NOT IN ('abandoned', 'rolled_back', 'cancelled'))`), p.BatchID, p.Chunk.Seq, p.Read, p.Rejected, p.Staged)
	if err != nil {
		return fmt.Errorf("backfill: stage chunk %s: %w", p.Chunk.ID, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("backfill: stage chunk %s of batch %d: chunk is not pending", p.Chunk.ID, p.BatchID)
	}
	return nil
}

// StagedChunks implements [backfilldriver.ManifestStaging.StagedChunks].
func (m *Manifest) StagedChunks(ctx context.Context, tx sqlx.ExtContext, batchID int64) ([]backfilldriver.StagedChunk, error) {
	var out []backfilldriver.StagedChunk
	err := sqlx.SelectContext(ctx, tx, &out, m.SQL(`SELECT seq, rows_read, rows_rejected, rows_staged FROM {s}.chunks
		WHERE batch_id = $1 AND status = 'staged' ORDER BY seq FOR UPDATE`), batchID)
	return out, err
}

// StagingTable implements [ManifestStaging.StagingTable]: stage_<batch>
// in the manifest's schema.
func (m *Manifest) StagingTable(batchID int64) string {
	return sqlgen.Ident(m.SchemaName) + "." + sqlgen.Ident(fmt.Sprintf("stage_%d", batchID))
}

// UndoTable implements [ManifestUndoLog.UndoTable]: undo in the
// manifest's schema.
func (m *Manifest) UndoTable() string { return sqlgen.Ident(m.SchemaName) + ".undo" }

// DeliveredTable implements [ManifestUndoLog.DeliveredTable]: delivered
// in the manifest's schema.
func (m *Manifest) DeliveredTable() string { return sqlgen.Ident(m.SchemaName) + ".delivered" }
