package backfill

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

func pqQuoteLiteral(s string) string { return pq.QuoteLiteral(s) }

// PublishMode says when a run's rows become visible to readers.
type PublishMode string

const (
	// PublishPerChunk (the default, "") makes each chunk visible when its
	// transaction commits.
	PublishPerChunk PublishMode = ""
	// PublishVersionedView loads the run into a new version of the target
	// table, invisible to readers who query [Publish.View], and switches
	// the view to it in one transaction when every chunk is done: readers
	// see the old version or the new one, never a mix. The previous
	// version is kept; [Runner.Rollback] switches the view back to it, or,
	// for a batch not yet published, makes sure it never is. A scope that
	// ends after now (or the watermark) is refused with [ErrInvalidScope]:
	// its open chunks would keep the run from completing, so from being
	// published. Versions are named "<table>__v<batch>", shortened with a
	// hash when longer than PostgreSQL's 63 bytes.
	PublishVersionedView PublishMode = "versioned_view"
)

// Publish configures how a job's rows reach readers ([Job.Publish]).
type Publish struct {
	// Mode is the publish mode; the zero value publishes per chunk.
	//
	// With PublishVersionedView the table of record becomes the version
	// the view reads: after the first publish, write to that version (or
	// through the backfill), not to the base table, whose later edits no
	// version copies.
	Mode PublishMode
	// View is the view readers query, optionally schema-qualified, in the
	// form of [Target.Table] (PublishVersionedView). It is created on the
	// first publish.
	View string
	// LockTimeout bounds the wait for the parent's lock when swapping a
	// partition (PublishPartitionSwap), as a PostgreSQL interval; on
	// timeout the chunk is retried (55P03 is retryable); default "5s".
	// It also bounds each try of the view switch of PublishVersionedView,
	// which waits for readers' transactions on the view while new readers
	// of the view queue behind it; default "200ms" there, so that they
	// wait at most that long.
	LockTimeout string
	// LockRetries is how many times the view switch of
	// PublishVersionedView is tried when LockTimeout expires, pausing
	// 100ms, 200ms, ... (at most 5s) in between; new readers read the old
	// version meanwhile. After the last try the run returns an error
	// wrapping [ErrPublishBlocked] naming the blocking sessions. 0 means
	// [DefaultPublishLockRetries].
	LockRetries int
}

// DefaultPublishLockRetries is the default of [Publish.LockRetries].
const DefaultPublishLockRetries = 10

func (p Publish) String() string {
	if p.Mode == PublishPerChunk {
		return ""
	}
	return string(p.Mode) + ":" + p.View
}

func (p Publish) validate(job string) error {
	switch p.Mode {
	case PublishPerChunk:
		return nil
	case PublishVersionedView:
		if p.View == "" {
			return fmt.Errorf("%w: Job.Publish.View is required with PublishVersionedView (job %q)", ErrInvalidConfig, job)
		}
		if _, _, err := sqlgen.ParseTable(p.View); err != nil {
			return fmt.Errorf("%w: Job.Publish.View: %w (job %q)", ErrInvalidConfig, err, job)
		}
		return nil
	case PublishPartitionSwap, PublishAtEnd:
		return nil
	}
	return fmt.Errorf("%w: Job.Publish.Mode %q is not supported (job %q)", ErrInvalidConfig, p.Mode, job)
}

// versionTable names the table version a batch loads: "<table>__v<batch>"
// in the table's schema (table is a name [sqlgen.ParseTable] accepts; the
// result is in the same form). A name longer than PostgreSQL keeps (63
// bytes) is shortened by [sqlgen.Derived], which keeps "__v<batch>" whole:
// left to PostgreSQL's truncation, batch 10's version of a 59-byte table
// would be batch 1's table. Partition swap names its new partitions so too.
func versionTable(table string, batchID int64) string {
	s, t := sqlgen.SplitTable(table)
	return sqlgen.Qualified(s, sqlgen.Derived(t, fmt.Sprintf("__v%d", batchID)))
}

// versionMarker is the comment prepareVersion puts on the version it
// creates for batchID of table, in the transaction that creates it: a
// table of that name without it (a user's table, or another derived name)
// is never merged into.
func versionMarker(table string, batchID int64) string {
	return fmt.Sprintf("backfill: version of %s for batch %d", table, batchID)
}

// viewSource returns the table the view reads (from pg_depend and
// pg_rewrite, PostgreSQL docs 53.18 and 53.43), or "" when the view does
// not exist yet.
func viewSource(ctx context.Context, db sqlx.ExtContext, view string) (string, error) {
	var src []string
	var rels []struct {
		Schema string `db:"nspname"`
		Name   string `db:"relname"`
	}
	err := sqlx.SelectContext(ctx, db, &rels, `SELECT DISTINCT n.nspname, c.relname
		FROM pg_rewrite r
		JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid AND d.deptype = 'n'
		JOIN pg_class c ON c.oid = d.refobjid AND c.relkind IN ('r', 'p')
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE r.ev_class = to_regclass($1) AND d.refobjid <> r.ev_class`, sqlgen.Table(view))
	if err != nil {
		return "", fmt.Errorf("backfill: view %s: %w", view, err)
	}
	for _, r := range rels {
		src = append(src, sqlgen.Qualified(r.Schema, r.Name))
	}
	if len(src) > 1 {
		return "", fmt.Errorf("backfill: view %s reads %d tables %v; a versioned view reads one", view, len(src), src)
	}
	if len(src) == 0 {
		return "", nil
	}
	return src[0], nil
}

// prepareVersion creates, once per batch, the table version the run loads
// (a copy of the version readers see now, or of the target table before
// the first publish), and prepares the merge into it.
func (r *Runner) prepareVersion(ctx context.Context, job Job, info TableInfo, batchID int64) (TableInfo, error) {
	version := versionTable(info.Target.Table, batchID)
	marker := versionMarker(info.Target.Table, batchID)
	err := inTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('backfill.version:' || $1, 0))`, version); err != nil {
			return err
		}
		// The name must resolve to the version this batch created (an
		// earlier call of the run), or to nothing: never to a table of
		// someone else's that happens to have the name.
		var found []sql.NullString
		if err := sqlx.SelectContext(ctx, tx, &found, `SELECT obj_description(c.oid, 'pg_class') FROM (SELECT to_regclass($1) AS oid) c WHERE c.oid IS NOT NULL`, sqlgen.Table(version)); err != nil {
			return err
		}
		if len(found) == 1 {
			if found[0].String != marker {
				return fmt.Errorf("%w: table %s exists but is not the version backfill created for batch %d of %s (its comment is %q, not %q); rename it, "+
					"or, if an older version of this library created it for this run, mark it with COMMENT ON TABLE %s IS %s",
					ErrInvalidConfig, version, batchID, info.Target.Table, found[0].String, marker, sqlgen.Table(version), pqQuoteLiteral(marker))
			}
			return nil
		}
		current, err := viewSource(ctx, tx, job.Publish.View)
		if err != nil {
			return err
		}
		if current == "" {
			current = info.Target.Table
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE %s (LIKE %s INCLUDING ALL)`, sqlgen.Table(version), sqlgen.Table(current))); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`COMMENT ON TABLE %s IS %s`, sqlgen.Table(version), pqQuoteLiteral(marker))); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s SELECT * FROM %s`, sqlgen.Table(version), sqlgen.Table(current)))
		return err
	})
	if err != nil {
		return TableInfo{}, fmt.Errorf("backfill: job %q: create version %s: %w", job.Name, version, err)
	}
	t := info.Target
	t.Table = version
	t.Columns = nil
	for _, c := range info.Columns[:info.Written] {
		t.Columns = append(t.Columns, c.Name)
	}
	return r.cfg.Merger.Prepare(ctx, r.db, t)
}

// Event kinds of the view switch of [PublishVersionedView], in the audit
// log ([ManifestAudit]).
const (
	// EventPublished: the view was switched to the batch's version, in
	// the switch's transaction; detail: view, version, previous.
	EventPublished = "published"
	// EventPublishBlocked: every try of the switch timed out behind
	// sessions holding the view; the run is completed but unpublished
	// (runs.last_error says so, and backfill.completed_batches leaves it
	// out) until a later call of Run publishes it; detail: view, version,
	// tries, lock_timeout, blockers.
	EventPublishBlocked = "publish_blocked"
)

// viewSwitch is one switch of a versioned view, publish or switch back:
// each try runs in its own transaction that first takes a
// transaction-level advisory lock on the view (so publishes and switch
// backs of one view run one at a time) and then calls try, which does its
// checks under that lock (and the run row's) and calls replace to point
// the view at another table.
//
// CREATE OR REPLACE VIEW needs an ACCESS EXCLUSIVE lock on the view, which
// waits for every transaction that read the view, and every new reader of
// the view queues behind that wait. So replace waits at most timeout
// (lock_timeout, local to the try's transaction), and a try that timed out
// (55P03) is run again, up to tries times, pausing 100ms, 200ms, ... (at
// most 5s) in between while readers go on reading the old table. When
// every try timed out, switchView returns an error wrapping
// [ErrPublishBlocked] that names the sessions holding the view
// (pid, application_name, state, query) and them alone in blockers.
type viewSwitch struct {
	view    string // the view, in the form of Publish.View
	target  string // the table the view is switched to, for messages
	timeout string // lock_timeout of each try
	tries   int
	what    string // what switches, for messages: "publish job "x" batch 2"
}

func (r *Runner) switchView(ctx context.Context, vs viewSwitch, try func(tx sqlx.ExtContext, replace func(source string) error) error) (blockers string, err error) {
	for n := 1; ; n++ {
		var blocking string // what pg_blocking_pids said during the last try
		err := inTx(ctx, r.db, func(tx sqlx.ExtContext) error {
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('backfill.view:' || $1, 0))`, vs.view); err != nil {
				return err
			}
			return try(tx, func(source string) error {
				var pid int
				if err := sqlx.GetContext(ctx, tx, &pid, `SELECT pg_backend_pid() FROM set_config('lock_timeout', $1, true)`, vs.timeout); err != nil {
					return err
				}
				var watch func() string
				if n >= vs.tries {
					watch = watchBlockers(ctx, r.db, pid)
				}
				_, err := tx.ExecContext(ctx, fmt.Sprintf(`CREATE OR REPLACE VIEW %s AS SELECT * FROM %s`, sqlgen.Table(vs.view), sqlgen.Table(source)))
				if watch != nil {
					blocking = watch()
				}
				if err != nil {
					return fmt.Errorf("backfill: %s: switch view %s: %w", vs.what, vs.view, err)
				}
				return nil
			})
		})
		var pe *pq.Error
		if err == nil || !errors.As(err, &pe) || pe.Code != "55P03" {
			return "", err
		}
		if n >= vs.tries {
			blockers := blocking
			if blockers == "" {
				blockers = lockHolders(context.WithoutCancel(ctx), r.db, vs.view)
			}
			return blockers, fmt.Errorf("backfill: %s: %w: view %s not switched to %s after %d tries with lock_timeout %s; held by %s",
				vs.what, ErrPublishBlocked, vs.view, vs.target, n, vs.timeout, blockers)
		}
		r.cfg.Logger.Warn("view locked by readers; retrying its switch", "switch", vs.what, "view", vs.view, "to", vs.target, "try", n, "lock_timeout", vs.timeout)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(min(100*time.Millisecond<<(n-1), 5*time.Second)):
		}
	}
}

// lockRunRow locks the batch's run row (FOR UPDATE) in tx and returns its
// status: publish and rollback of a batch take it, after the view's lock,
// so that each sees the other's outcome. With a manifest other than
// [PGManifest] (no runs table; [Runner.Rollback] needs PGManifest, so no
// rollback can interleave) it returns RunCompleted.
func (r *Runner) lockRunRow(ctx context.Context, tx sqlx.ExtContext, batchID int64) (RunStatus, error) {
	pm, ok := r.cfg.Manifest.(*PGManifest)
	if !ok {
		return RunCompleted, nil
	}
	var st []RunStatus
	if err := sqlx.SelectContext(ctx, tx, &st, pm.sql(`SELECT status FROM {s}.runs WHERE batch_id = $1 FOR UPDATE`), batchID); err != nil {
		return "", err
	}
	if len(st) == 0 {
		return "", fmt.Errorf("batch %d: %w", batchID, ErrRunNotFound)
	}
	return st[0], nil
}

// publishVersion switches the view to the batch's version (see
// [viewSwitch]: bounded lock_timeout, retries, blockers named) and records
// it, in the switch's transaction, as an [EventPublished] with the previous
// version, clearing the run's last_error. It reports false, doing nothing,
// when the view already reads the version.
//
// Under the view's and the run row's locks it checks that the run is
// still completed: a batch rolled back while its publish was pending (a
// blocked publish, or one retrying) is never published, now or by any
// later call; it returns an error wrapping [ErrAlreadyCompleted] then.
//
// When every try timed out it records an [EventPublishBlocked] naming the
// blockers and sets the run's last_error, so that the manifest says the
// run is completed but unpublished, and returns the error wrapping
// [ErrPublishBlocked]; running the job again publishes it.
func (r *Runner) publishVersion(ctx context.Context, job Job, run Run, table string) (bool, error) {
	audit, ok := r.cfg.Manifest.(ManifestAudit)
	if !ok {
		return false, fmt.Errorf("backfill: publish job %q: %w: the manifest has no audit log", job.Name, ErrUnsupported)
	}
	version := versionTable(table, run.BatchID)
	vs := viewSwitch{view: job.Publish.View, target: version, timeout: cmpOr(job.Publish.LockTimeout, "200ms"),
		tries: cmpOr(job.Publish.LockRetries, DefaultPublishLockRetries), what: fmt.Sprintf("publish job %q batch %d", job.Name, run.BatchID)}
	switched := false
	status := RunCompleted
	blockers, err := r.switchView(ctx, vs, func(tx sqlx.ExtContext, replace func(string) error) error {
		var err error
		if status, err = r.lockRunRow(ctx, tx, run.BatchID); err != nil || status != RunCompleted {
			return err
		}
		previous, err := viewSource(ctx, tx, job.Publish.View)
		if err != nil || previous == version {
			return err
		}
		if err := replace(version); err != nil {
			return err
		}
		if err := r.setRunError(ctx, tx, run.BatchID, ""); err != nil {
			return err
		}
		detail, _ := json.Marshal(map[string]string{"view": job.Publish.View, "version": version, "previous": previous})
		if err := audit.RecordEvent(ctx, tx, Event{BatchID: run.BatchID, Job: job.Name, Kind: EventPublished, Actor: r.cfg.WorkerID, Detail: detail}); err != nil {
			return err
		}
		switched = true
		return nil
	})
	switch {
	case errors.Is(err, ErrPublishBlocked):
		err = fmt.Errorf("%w; the run is completed but unpublished: run the job again to publish it", err)
		fctx := context.WithoutCancel(ctx)
		rerr := inTx(fctx, r.db, func(tx sqlx.ExtContext) error {
			if st, err := r.lockRunRow(fctx, tx, run.BatchID); err != nil || st != RunCompleted {
				return err
			}
			if err := r.setRunError(fctx, tx, run.BatchID, err.Error()); err != nil {
				return err
			}
			detail, _ := json.Marshal(map[string]any{"view": job.Publish.View, "version": version, "tries": vs.tries,
				"lock_timeout": vs.timeout, "blockers": blockers})
			return audit.RecordEvent(fctx, tx, Event{BatchID: run.BatchID, Job: job.Name, Kind: EventPublishBlocked, Actor: r.cfg.WorkerID, Detail: detail})
		})
		return false, errors.Join(err, rerr)
	case err != nil:
		return false, err
	case status != RunCompleted:
		return false, fmt.Errorf("backfill: publish job %q batch %d: %w: the batch is %s (rolled back while its publish was pending); view %s not switched to %s",
			job.Name, run.BatchID, ErrAlreadyCompleted, status, job.Publish.View, version)
	}
	return switched, nil
}

// setRunError sets the run's last_error in tx ([PGManifest] only).
func (r *Runner) setRunError(ctx context.Context, tx sqlx.ExtContext, batchID int64, msg string) error {
	pm, ok := r.cfg.Manifest.(*PGManifest)
	if !ok {
		return nil
	}
	_, err := tx.ExecContext(ctx, pm.sql(`UPDATE {s}.runs SET last_error = $2, updated_at = now() WHERE batch_id = $1 AND last_error <> $2`), batchID, msg)
	return err
}

// switchBack withdraws a versioned-view batch (see [Runner.Rollback]) in
// one [viewSwitch] of the job's view, bounded like the publish by
// [Publish.LockTimeout] and [Publish.LockRetries] ([ErrPublishBlocked]
// names the blocking readers; nothing changes then). Under the view's and
// the run row's locks, so that a pending publish of the batch cannot slip
// in between, it either points the view back to the version the batch's
// [EventPublished] replaced (the base table for the first publish;
// refused with [ErrRollbackConflict] when a later batch published, unless
// force), or, when the batch was never published, only marks it
// rolled_back: its pending publish then never happens. Either way the run
// becomes rolled_back in the same transaction. It reports what it did:
// "switched_back", "unpublished", or "" when the batch was rolled back
// already.
func (r *Runner) switchBack(ctx context.Context, job Job, run Run, base string, opts RollbackOptions) (string, error) {
	audit, ok := r.cfg.Manifest.(ManifestAudit)
	if !ok {
		return "", fmt.Errorf("backfill: switch back batch %d: %w", run.BatchID, ErrUnsupported)
	}
	vs := viewSwitch{view: job.Publish.View, target: "the previous version", timeout: cmpOr(job.Publish.LockTimeout, "200ms"),
		tries: cmpOr(job.Publish.LockRetries, DefaultPublishLockRetries), what: fmt.Sprintf("rollback of batch %d", run.BatchID)}
	outcome := ""
	_, err := r.switchView(ctx, vs, func(tx sqlx.ExtContext, replace func(string) error) error {
		outcome = ""
		status, err := r.lockRunRow(ctx, tx, run.BatchID)
		if err != nil {
			return err
		}
		switch status {
		case RunRolledBack:
			return nil
		case RunRunning:
			return fmt.Errorf("backfill: rollback of batch %d: %w: the run is running again; wait for it or cancel it first", run.BatchID, ErrInvalidConfig)
		}
		events, err := audit.Events(ctx, tx, run.BatchID)
		if err != nil {
			return err
		}
		var pub struct{ View, Version, Previous string }
		found := false
		for _, e := range events {
			if e.Kind == EventPublished {
				if err := json.Unmarshal(e.Detail, &pub); err != nil {
					return err
				}
				found = true
			}
		}
		kind := "rollback_switch_back"
		detail := map[string]any{"why": opts.Why}
		if found {
			current, err := viewSource(ctx, tx, pub.View)
			if err != nil {
				return err
			}
			if current != pub.Version && !opts.Force {
				return fmt.Errorf("backfill: switch back batch %d: %w: view %s reads %s, not this batch's %s (a later batch published)",
					run.BatchID, ErrRollbackConflict, pub.View, current, pub.Version)
			}
			if pub.Previous == "" {
				// The first publish created the view: before it, the data
				// was the base table's.
				pub.Previous = base
			}
			if err := replace(pub.Previous); err != nil {
				return err
			}
			detail = map[string]any{"why": opts.Why, "view": pub.View, "from": pub.Version, "to": pub.Previous, "force": opts.Force}
			outcome = "switched_back"
		} else {
			// Never published: readers never saw the batch. Withdrawn
			// under the run row's lock, its pending publish (if any)
			// finds it rolled back and never switches the view.
			kind = "rollback_unpublished"
			outcome = "unpublished"
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+sqlgen.Ident(r.pgManifestSchema())+`.runs SET status = 'rolled_back', updated_at = now() WHERE batch_id = $1`, run.BatchID); err != nil {
			return err
		}
		d, _ := json.Marshal(detail)
		return audit.RecordEvent(ctx, tx, Event{BatchID: run.BatchID, Job: run.Job, Kind: kind, Actor: opts.Actor, Detail: d})
	})
	if err != nil {
		return "", err
	}
	return outcome, nil
}

// watchBlockers polls, while session pid waits for a lock, the sessions
// that block it (pg_blocking_pids, PostgreSQL docs 9.27.1, joined to
// pg_stat_activity); the returned stop function ends the polling and
// describes the last blockers seen ("" if none were).
func watchBlockers(ctx context.Context, db sqlx.ExtContext, pid int) (stop func() string) {
	done := make(chan struct{})
	result := make(chan string, 1)
	go func() {
		last := ""
		defer func() { result <- last }()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if s := describeSessions(ctx, db, `SELECT b.pid, coalesce(a.application_name, '') AS app, coalesce(a.state, '') AS state,
				'' AS mode, coalesce(a.query, '') AS query
				FROM unnest(pg_blocking_pids($1)) AS b(pid) JOIN pg_stat_activity a ON a.pid = b.pid ORDER BY b.pid`, pid); s != "" {
				last = s
			}
		}
	}()
	return func() string {
		close(done)
		return <-result
	}
}

// describeSessions runs q (columns pid, app, state, mode, query) and
// describes the sessions it returns, "" for none or on error.
func describeSessions(ctx context.Context, db sqlx.ExtContext, q string, args ...any) string {
	var rows []struct {
		PID   int    `db:"pid"`
		App   string `db:"app"`
		State string `db:"state"`
		Mode  string `db:"mode"`
		Query string `db:"query"`
	}
	if err := sqlx.SelectContext(ctx, db, &rows, q, args...); err != nil || len(rows) == 0 {
		return ""
	}
	parts := make([]string, len(rows))
	for i, h := range rows {
		q := h.Query
		if len(q) > 200 {
			q = q[:200] + "..."
		}
		what := h.State
		if h.Mode != "" {
			what += ", holding " + h.Mode
		}
		parts[i] = fmt.Sprintf("pid %d (application_name %q, %s, query %q)", h.PID, h.App, what, q)
	}
	return strings.Join(parts, ", ")
}

// lockHolders describes the other sessions that hold a lock on relation
// rel (pg_locks joined to pg_stat_activity, PostgreSQL docs 54.12 and
// 27.2.3): the sessions pg_blocking_pids would name for a waiter on an
// ACCESS EXCLUSIVE lock of rel.
func lockHolders(ctx context.Context, db sqlx.ExtContext, rel string) string {
	s := describeSessions(ctx, db, `SELECT DISTINCT a.pid, coalesce(a.application_name, '') AS app,
		coalesce(a.state, '') AS state, l.mode, coalesce(a.query, '') AS query
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'relation' AND l.relation = to_regclass($1) AND l.granted AND l.pid <> pg_backend_pid()
		ORDER BY a.pid`, sqlgen.Table(rel))
	if s == "" {
		return "sessions that have since released it"
	}
	return s
}

func (r *Runner) pgManifestSchema() string {
	if pm, ok := r.cfg.Manifest.(*PGManifest); ok {
		return pm.schema
	}
	return "backfill"
}

// PublishPartitionSwap loads each chunk into a new table beside the
// target's partition for exactly the chunk's bounds (a copy of it, merged
// with the chunk's rows), validates it, and swaps it in — DETACH the old
// partition, ATTACH the new one — in the chunk's transaction, with the
// lock_timeout of [Publish.LockTimeout] (PostgreSQL docs, 5.11.2.2
// "Partition Maintenance"). Readers see the old partition or the new one,
// never a mix. The old partition is kept, detached, for
// [Runner.Rollback], which swaps it back. The target must be partitioned
// by RANGE on [Job.ChunkColumn] with one partition per chunk.
const PublishPartitionSwap PublishMode = "partition_swap"

// partitionFor finds the partition of parent whose range bounds are the
// chunk's, by reading the bounds back from pg_get_expr(relpartbound) and
// casting them to the partition key's type.
func partitionFor(ctx context.Context, db sqlx.ExtContext, parent string, c Chunk) (name, keyType string, err error) {
	var lo, hi any
	switch c.Kind {
	case KindTime:
		lo, hi = c.Start, c.End
	case KindInt:
		lo, hi = c.Lo, c.Hi
	default:
		return "", "", fmt.Errorf("backfill: partition swap: %w: list chunks have no range partition", ErrUnsupported)
	}
	var keyTypes []string
	if err := sqlx.SelectContext(ctx, db, &keyTypes, `SELECT format_type(a.atttypid, a.atttypmod)
		FROM pg_partitioned_table p JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
		WHERE p.partrelid = to_regclass($1) AND p.partstrat = 'r' AND p.partnatts = 1`, sqlgen.Table(parent)); err != nil {
		return "", "", err
	}
	if len(keyTypes) != 1 {
		return "", "", fmt.Errorf("backfill: partition swap: %w: %s is not partitioned by RANGE on one column", ErrInvalidConfig, parent)
	}
	keyType = keyTypes[0]
	var rels []struct {
		Schema string `db:"nspname"`
		Name   string `db:"relname"`
	}
	err = sqlx.SelectContext(ctx, db, &rels, fmt.Sprintf(`SELECT n.nspname, c.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace,
		LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), '^FOR VALUES FROM \(''(.*)''\) TO \(''(.*)''\)$') m
		WHERE i.inhparent = to_regclass($1) AND m IS NOT NULL AND m[1]::%[1]s = $2::%[1]s AND m[2]::%[1]s = $3::%[1]s`, keyType),
		sqlgen.Table(parent), lo, hi)
	if err != nil {
		return "", "", err
	}
	var names []string
	for _, r := range rels {
		names = append(names, sqlgen.Qualified(r.Schema, r.Name))
	}
	if len(names) != 1 {
		return "", "", fmt.Errorf("backfill: partition swap: %w: %s has no partition for exactly %s", ErrInvalidConfig, parent, c)
	}
	return names[0], keyType, nil
}

// prepareSwap creates the chunk's new partition table (a copy of the
// current partition) in tx and prepares the merge into it.
func (r *Runner) prepareSwap(ctx context.Context, tx sqlx.ExtContext, info TableInfo, c Chunk, batchID int64) (TableInfo, string, string, error) {
	part, keyType, err := partitionFor(ctx, tx, info.Target.Table, c)
	if err != nil {
		return TableInfo{}, "", "", err
	}
	next := versionTable(part, batchID)
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (LIKE %[2]s INCLUDING ALL); INSERT INTO %[1]s SELECT * FROM %[2]s`,
		sqlgen.Table(next), sqlgen.Table(part))); err != nil {
		return TableInfo{}, "", "", fmt.Errorf("backfill: partition swap: copy %s: %w", part, err)
	}
	t := info.Target
	t.Table = next
	t.Columns = nil
	for _, col := range info.Columns[:info.Written] {
		t.Columns = append(t.Columns, col.Name)
	}
	ninfo, err := r.cfg.Merger.Prepare(ctx, tx, t)
	return ninfo, part, keyType, err
}

// swapPartition attaches next in place of part, in tx.
func swapPartition(ctx context.Context, tx sqlx.ExtContext, parent, part, next, col, keyType string, c Chunk, lockTimeout string) error {
	lo, hi := any(c.Lo), any(c.Hi)
	if c.Kind == KindTime {
		lo, hi = c.Start, c.End
	}
	q := sqlgen.Ident(col)
	// A CHECK constraint matching the bounds lets ATTACH skip its scan.
	var check string
	if err := sqlx.GetContext(ctx, tx, &check, fmt.Sprintf(`SELECT format('%%s IS NOT NULL AND %%s >= %%L::%[2]s AND %%s < %%L::%[2]s', %[1]s, %[1]s, $1::%[2]s, %[1]s, $2::%[2]s)`,
		pqQuoteLiteral(q), keyType), lo, hi); err != nil {
		return err
	}
	var bounds string
	if err := sqlx.GetContext(ctx, tx, &bounds, fmt.Sprintf(`SELECT format('FROM (%%L) TO (%%L)', $1::%[1]s, $2::%[1]s)`, keyType), lo, hi); err != nil {
		return err
	}
	stmts := []string{
		`SELECT set_config('lock_timeout', ` + pqQuoteLiteral(lockTimeout) + `, true)`,
		fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT backfill_bounds CHECK (%s)`, sqlgen.Table(next), check),
		fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s`, sqlgen.Table(parent), sqlgen.Table(part)),
		fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES %s`, sqlgen.Table(parent), sqlgen.Table(next), bounds),
		fmt.Sprintf(`ALTER TABLE %s DROP CONSTRAINT backfill_bounds`, sqlgen.Table(next)),
	}
	for _, s := range stmts {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("backfill: partition swap of %s: %w", part, err)
		}
	}
	return nil
}

// swapBack withdraws a partition-swap batch: in reverse chunk order, one
// transaction per chunk with its checkpoint, it attaches the partition
// each chunk replaced in place of the chunk's. It refuses, changing
// nothing, when a later batch swapped one of those partitions again.
func (r *Runner) swapBack(ctx context.Context, pm *PGManifest, run Run, parent string, opts RollbackOptions) (RollbackReport, error) {
	rep := RollbackReport{BatchID: run.BatchID, Status: run.Status, Preview: opts.Preview}
	events, err := pm.Events(ctx, r.db, run.BatchID)
	if err != nil {
		return rep, err
	}
	states, err := pm.Chunks(ctx, r.db, run.BatchID)
	if err != nil {
		return rep, err
	}
	type swap struct {
		Seq      int
		Chunk    string
		Old, New string
	}
	var swaps []swap
	for _, e := range events {
		if e.Kind != "partition_swapped" {
			continue
		}
		var s swap
		if err := json.Unmarshal(e.Detail, &s); err != nil {
			return rep, err
		}
		if states[s.Seq].Status == ChunkDone && (opts.ChunkID == "" || s.Chunk == opts.ChunkID) {
			swaps = append(swaps, s)
		}
	}
	for i, j := 0, len(swaps)-1; i < j; i, j = i+1, j-1 {
		swaps[i], swaps[j] = swaps[j], swaps[i]
	}
	for _, s := range swaps {
		cur, _, err := partitionFor(ctx, r.db, parent, states[s.Seq].Chunk)
		if err != nil {
			return rep, err
		}
		if cur != s.New {
			rep.Conflicts++
			rep.ConflictKeys = append(rep.ConflictKeys, fmt.Sprintf("%s: %s is attached, not %s", s.Chunk, cur, s.New))
		}
	}
	rep.Chunks = len(swaps)
	if opts.Preview {
		return rep, nil
	}
	if rep.Conflicts > 0 {
		return rep, fmt.Errorf("backfill: rollback of batch %d: %w: later batches swapped %d partitions again: %v", run.BatchID, ErrRollbackConflict, rep.Conflicts, rep.ConflictKeys)
	}
	rep.Chunks = 0
	for _, s := range swaps {
		c := states[s.Seq].Chunk
		err := inTx(ctx, r.db, func(tx sqlx.ExtContext) error {
			var status []string
			if err := sqlx.SelectContext(ctx, tx, &status, pm.sql(`SELECT status FROM {s}.chunks WHERE batch_id = $1 AND seq = $2 FOR UPDATE`), run.BatchID, s.Seq); err != nil {
				return err
			}
			if len(status) == 0 || status[0] != string(ChunkDone) {
				return nil
			}
			_, keyType, err := partitionFor(ctx, tx, parent, c)
			if err != nil {
				return err
			}
			var col string
			if err := sqlx.GetContext(ctx, tx, &col, `SELECT a.attname FROM pg_partitioned_table p JOIN pg_attribute a
				ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] WHERE p.partrelid = to_regclass($1)`, sqlgen.Table(parent)); err != nil {
				return err
			}
			if err := swapPartition(ctx, tx, parent, s.New, s.Old, col, keyType, c, cmpOr(opts.lockTimeout, "5s")); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, pm.sql(`UPDATE {s}.chunks SET status = 'rolled_back' WHERE batch_id = $1 AND seq = $2`), run.BatchID, s.Seq); err != nil {
				return err
			}
			rep.Chunks++
			return nil
		})
		if err != nil {
			return rep, fmt.Errorf("backfill: rollback of batch %d chunk %s: %w", run.BatchID, s.Chunk, err)
		}
	}
	err = inTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		if opts.ChunkID == "" {
			if _, err := tx.ExecContext(ctx, pm.sql(`UPDATE {s}.runs SET status = 'rolled_back', updated_at = now() WHERE batch_id = $1`), run.BatchID); err != nil {
				return err
			}
		}
		detail, _ := json.Marshal(map[string]any{"why": opts.Why, "chunk": opts.ChunkID, "partitions": rep.Chunks})
		return pm.RecordEvent(ctx, tx, Event{BatchID: run.BatchID, Job: run.Job, Kind: "rollback_switch_back", Actor: opts.Actor, Detail: detail})
	})
	if err == nil && opts.ChunkID == "" {
		rep.Status = RunRolledBack
	}
	return rep, err
}
