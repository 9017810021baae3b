package backfill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// publishView is the publisher of [PublishVersionedView]: the run loads
// its own version of the target, and the view switches to it when the run
// completes.
type publishView struct{ publishChunk }

func (publishView) requires(c capabilities) error {
	return need(c.audit != nil, "ManifestAudit", "PublishVersionedView records its publish in the audit log")
}

func (publishView) switchesBack() bool { return true }

func (publishView) prepare(ctx context.Context, ex *execution) error {
	info, err := ex.r.prepareVersion(ctx, ex.job, ex.info, ex.batchID)
	if err != nil {
		return err
	}
	ex.info = info
	return nil
}

// published switches the view. Idempotent: a crash between completion
// and the switch, or a switch that gave up behind a reader's lock,
// publishes on the next call.
func (publishView) published(ctx context.Context, ex *execution, run Run) (bool, error) {
	if run.Status != RunCompleted {
		return false, nil
	}
	return ex.r.publishVersion(ctx, ex.job, run, ex.base)
}

// rollback switches the view back: the batch's rows live in their own
// table version.
func (publishView) rollback(ctx context.Context, r *Runner, run Run, plan Plan, opts RollbackOptions) (RollbackReport, bool, error) {
	begin := time.Now()
	rep := RollbackReport{BatchID: run.BatchID, Status: run.Status}
	switch {
	case run.Status == RunRolledBack:
		rep.Preview = opts.Preview
		return rep, true, nil
	case opts.ChunkID != "":
		return rep, true, fmt.Errorf("backfill: rollback of batch %d: %w: a versioned-view batch is switched back whole", run.BatchID, ErrUnsupported)
	case opts.Preview:
		rep.Preview, rep.Elapsed = true, time.Since(begin)
		return rep, true, nil
	}
	switched, err := r.switchBack(ctx, run, plan.Target.Table, opts.Force, opts.Actor, opts.Why)
	if err != nil {
		return rep, true, err
	}
	if !switched {
		// Never published: readers never saw the batch; withdraw the run.
		if err := inTx(ctx, r.db, func(tx sqlx.ExtContext) error {
			if _, err := tx.ExecContext(ctx, r.caps.sql.sql(`UPDATE {s}.runs SET status = 'rolled_back', updated_at = now() WHERE batch_id = $1`), run.BatchID); err != nil {
				return err
			}
			detail, _ := json.Marshal(map[string]string{"why": opts.Why})
			return r.caps.sql.RecordEvent(ctx, tx, Event{BatchID: run.BatchID, Job: run.Job, Kind: "rollback_unpublished", Actor: opts.Actor, Detail: detail})
		}); err != nil {
			return rep, true, err
		}
	}
	return RollbackReport{BatchID: run.BatchID, Status: RunRolledBack, Elapsed: time.Since(begin)}, true, nil
}

// versionTable names the table version a batch loads: "<table>__v<batch>"
// in the table's schema (table is a name [sqlgen.ParseTable] accepts; the
// result is in the same form).
func versionTable(table string, batchID int64) string {
	s, t := sqlgen.SplitTable(table)
	return sqlgen.Qualified(s, fmt.Sprintf("%s__v%d", t, batchID))
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
	err := inTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('backfill.version:' || $1, 0))`, version); err != nil {
			return err
		}
		var exists bool
		if err := sqlx.GetContext(ctx, tx, &exists, `SELECT to_regclass($1) IS NOT NULL`, sqlgen.Table(version)); err != nil {
			return err
		}
		if exists {
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

// publishVersion switches the view to the batch's version in one
// transaction and records it ("published", with the previous version) in
// the audit log; it does nothing, and reports false, when the view already
// reads it.
//
// CREATE OR REPLACE VIEW needs an ACCESS EXCLUSIVE lock on the view, which
// waits for every transaction that read the view, and every new reader of
// the view queues behind that wait. So the switch waits at most
// [Publish.LockTimeout] (lock_timeout, local to its transaction) and is
// tried [Publish.LockRetries] times with a growing pause in between, while
// readers go on reading the old version. When every try timed out it
// returns an error wrapping [ErrPublishBlocked] that names the sessions
// holding a lock on the view (pid, application_name, state, query); the
// run stays completed and unpublished, and running the job again publishes
// it.
func (r *Runner) publishVersion(ctx context.Context, job Job, run Run, table string) (bool, error) {
	audit := r.caps.audit
	version := versionTable(table, run.BatchID)
	timeout := cmpOr(job.Publish.LockTimeout, "200ms")
	tries := cmpOr(job.Publish.LockRetries, DefaultPublishLockRetries)
	for try := 1; ; try++ {
		switched := false
		var blocking string // what pg_blocking_pids said during the last try
		err := inTx(ctx, r.db, func(tx sqlx.ExtContext) error {
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('backfill.view:' || $1, 0))`, job.Publish.View); err != nil {
				return err
			}
			previous, err := viewSource(ctx, tx, job.Publish.View)
			if err != nil {
				return err
			}
			if previous == version {
				return nil
			}
			var pid int
			if err := sqlx.GetContext(ctx, tx, &pid, `SELECT pg_backend_pid() FROM set_config('lock_timeout', $1, true)`, timeout); err != nil {
				return err
			}
			var watch func() string
			if try >= tries {
				watch = watchBlockers(ctx, r.db, pid)
			}
			_, err = tx.ExecContext(ctx, fmt.Sprintf(`CREATE OR REPLACE VIEW %s AS SELECT * FROM %s`, sqlgen.Table(job.Publish.View), sqlgen.Table(version)))
			if watch != nil {
				blocking = watch()
			}
			if err != nil {
				return fmt.Errorf("backfill: publish job %q: switch view %s: %w", job.Name, job.Publish.View, err)
			}
			switched = true
			detail, _ := json.Marshal(map[string]string{"view": job.Publish.View, "version": version, "previous": previous})
			return audit.RecordEvent(ctx, tx, Event{BatchID: run.BatchID, Job: job.Name, Kind: "published", Actor: r.cfg.WorkerID, Detail: detail})
		})
		if err == nil {
			return switched, nil
		}
		var pe *pq.Error
		if !errors.As(err, &pe) || pe.Code != "55P03" {
			return false, err
		}
		if try >= tries {
			blockers := blocking
			if blockers == "" {
				blockers = lockHolders(context.WithoutCancel(ctx), r.db, job.Publish.View)
			}
			return false, fmt.Errorf("backfill: publish job %q batch %d: %w: view %s not switched to %s after %d tries with lock_timeout %s; held by %s; the run is completed but unpublished: run the job again to publish it",
				job.Name, run.BatchID, ErrPublishBlocked, job.Publish.View, version, try, timeout, blockers)
		}
		r.cfg.Logger.Warn("publish: view locked by readers; retrying", "job", job.Name, "batch_id", run.BatchID, "view", job.Publish.View, "try", try, "lock_timeout", timeout)
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(min(100*time.Millisecond<<(try-1), 5*time.Second)):
		}
	}
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

// switchBack points the view of a versioned-view batch back to the version
// it replaced; it reports false when the batch was never published.
func (r *Runner) switchBack(ctx context.Context, run Run, base string, force bool, actor, why string) (bool, error) {
	audit := r.caps.sql
	events, err := audit.Events(ctx, r.db, run.BatchID)
	if err != nil {
		return false, err
	}
	var pub struct{ View, Version, Previous string }
	found := false
	for _, e := range events {
		if e.Kind == "published" {
			if err := json.Unmarshal(e.Detail, &pub); err != nil {
				return false, err
			}
			found = true
		}
	}
	if !found {
		return false, nil
	}
	err = inTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		current, err := viewSource(ctx, tx, pub.View)
		if err != nil {
			return err
		}
		if current != pub.Version && !force {
			return fmt.Errorf("backfill: switch back batch %d: %w: view %s reads %s, not this batch's %s (a later batch published)",
				run.BatchID, ErrRollbackConflict, pub.View, current, pub.Version)
		}
		if pub.Previous == "" {
			// The first publish created the view: before it, the data was
			// the base table's.
			pub.Previous = base
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`CREATE OR REPLACE VIEW %s AS SELECT * FROM %s`, sqlgen.Table(pub.View), sqlgen.Table(pub.Previous))); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, r.caps.sql.sql(`UPDATE {s}.runs SET status = 'rolled_back', updated_at = now() WHERE batch_id = $1`), run.BatchID); err != nil {
			return err
		}
		detail, _ := json.Marshal(map[string]any{"why": why, "view": pub.View, "from": pub.Version, "to": pub.Previous, "force": force})
		return audit.RecordEvent(ctx, tx, Event{BatchID: run.BatchID, Job: run.Job, Kind: "rollback_switch_back", Actor: actor, Detail: detail})
	})
	return err == nil, err
}
