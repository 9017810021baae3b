package backfill

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
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

// rollback switches the view back (or withdraws a batch never
// published): the batch's rows live in their own table version. One
// transaction under the view's and the run row's locks, with the
// publish's bounded lock_timeout and retries: a publish of the batch
// still pending never switches the view after it.
func (publishView) rollback(ctx context.Context, r *Runner, job Job, run Run, plan Plan, opts RollbackOptions) (RollbackReport, bool, error) {
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
	if _, err := r.switchBack(ctx, job, run, plan.Target.Table, opts); err != nil {
		return rep, true, err
	}
	return RollbackReport{BatchID: run.BatchID, Status: RunRolledBack, Elapsed: time.Since(begin)}, true, nil
}

func (publishView) publishesOpen() bool { return false }

// prepareVersion creates, once per batch, the table version the run loads
// (a copy of the version readers see now, or of the target table before
// the first publish), and prepares the merge into it.
func (r *Runner) prepareVersion(ctx context.Context, job Job, info TableInfo, batchID int64) (TableInfo, error) {
	ctx = pgstore.WithPurpose(ctx, "prepare the table version", batchID)
	version := pgstore.VersionTable(info.Target.Table, batchID)
	marker := pgstore.VersionMarker(info.Target.Table, batchID)
	err := pgstore.InTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		lctx := pgstore.WithLockWaiting(ctx, r.lockWaiting(r.cfg.Logger, batchID, "", nil))
		if err := pgstore.LockName(lctx, tx, "version lock of "+version, "backfill.version:"+version); err != nil {
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
					ErrInvalidConfig, version, batchID, info.Target.Table, found[0].String, marker, sqlgen.Table(version), pgstore.QuoteLiteral(marker))
			}
			return nil
		}
		current, err := pgstore.ViewSource(ctx, tx, job.Publish.View)
		if err != nil {
			return err
		}
		if current == "" {
			current = info.Target.Table
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE %s (LIKE %s INCLUDING ALL)`, sqlgen.Table(version), sqlgen.Table(current))); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`COMMENT ON TABLE %s IS %s`, sqlgen.Table(version), pgstore.QuoteLiteral(marker))); err != nil {
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
	ctx = pgstore.WithPurpose(ctx, "switch the view", 0)
	for n := 1; ; n++ {
		var blocking string // what pg_blocking_pids said during the last try
		err := pgstore.InTx(ctx, r.db, func(tx sqlx.ExtContext) error {
			lctx := pgstore.WithLockWaiting(ctx, r.lockWaiting(r.cfg.Logger.With("switch", vs.what), 0, "", nil))
			if err := pgstore.LockName(lctx, tx, "view lock of "+vs.view, "backfill.view:"+vs.view); err != nil {
				return err
			}
			return try(tx, func(source string) error {
				var pid int
				if err := sqlx.GetContext(ctx, tx, &pid, `SELECT pg_backend_pid() FROM set_config('lock_timeout', $1, true)`, vs.timeout); err != nil {
					return err
				}
				var watch func() string
				if n >= vs.tries {
					watch = pgstore.WatchBlockers(ctx, r.db, pid)
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
				blockers = pgstore.LockHolders(context.WithoutCancel(ctx), r.db, vs.view)
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
// [PGManifest] (no runs table; [Runner.Rollback] needs one, so no
// rollback can interleave) it returns RunCompleted.
func (r *Runner) lockRunRow(ctx context.Context, tx sqlx.ExtContext, batchID int64) (RunStatus, error) {
	pm := r.caps.sql
	if pm == nil {
		return RunCompleted, nil
	}
	var st []RunStatus
	if err := sqlx.SelectContext(ctx, tx, &st, pm.SQL(`SELECT status FROM {s}.runs WHERE batch_id = $1 FOR NO KEY UPDATE`), batchID); err != nil {
		return "", err
	}
	if len(st) == 0 {
		return "", fmt.Errorf("batch %d: %w", batchID, ErrRunNotFound)
	}
	return st[0], nil
}

// publishVersion switches the view to the batch's version (see
// [viewSwitch]: bounded lock_timeout, retries, blockers named) and records
// it, in the switch's transaction, as an [backfilltype.EventPublished] with
// the previous version, clearing the run's last_error. It reports false,
// doing nothing, when the view already reads the version.
//
// Under the view's and the run row's locks it checks that the run is
// still completed: a batch rolled back while its publish was pending (a
// blocked publish, or one retrying) is never published, now or by any
// later call; it returns an error wrapping [ErrAlreadyCompleted] then.
//
// When every try timed out it records an [backfilltype.EventPublishBlocked]
// naming the blockers and sets the run's last_error, so that the manifest
// says the run is completed but unpublished, and returns the error wrapping
// [ErrPublishBlocked]; running the job again publishes it.
func (r *Runner) publishVersion(ctx context.Context, job Job, run Run, table string) (bool, error) {
	ctx = pgstore.WithPurpose(ctx, "publish the table version", run.BatchID)
	audit := r.caps.audit // Run refused the job without it
	version := pgstore.VersionTable(table, run.BatchID)
	vs := viewSwitch{view: job.Publish.View, target: version, timeout: cmp.Or(job.Publish.LockTimeout, "200ms"),
		tries: cmp.Or(job.Publish.LockRetries, DefaultPublishLockRetries), what: fmt.Sprintf("publish job %q batch %d", job.Name, run.BatchID)}
	switched := false
	status := RunCompleted
	blockers, err := r.switchView(ctx, vs, func(tx sqlx.ExtContext, replace func(string) error) error {
		var err error
		if status, err = r.lockRunRow(ctx, tx, run.BatchID); err != nil || status != RunCompleted {
			return err
		}
		previous, err := pgstore.ViewSource(ctx, tx, job.Publish.View)
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
		if err := audit.RecordEvent(ctx, tx, backfilltype.Event{BatchID: run.BatchID, Job: job.Name, Kind: backfilltype.EventPublished, Actor: r.cfg.WorkerID, Detail: detail}); err != nil {
			return err
		}
		switched = true
		return nil
	})
	switch {
	case errors.Is(err, ErrPublishBlocked):
		err = fmt.Errorf("%w; the run is completed but unpublished: run the job again to publish it", err)
		fctx := context.WithoutCancel(ctx)
		rerr := pgstore.InTx(fctx, r.db, func(tx sqlx.ExtContext) error {
			if st, err := r.lockRunRow(fctx, tx, run.BatchID); err != nil || st != RunCompleted {
				return err
			}
			if err := r.setRunError(fctx, tx, run.BatchID, err.Error()); err != nil {
				return err
			}
			detail, _ := json.Marshal(map[string]any{"view": job.Publish.View, "version": version, "tries": vs.tries,
				"lock_timeout": vs.timeout, "blockers": blockers})
			return audit.RecordEvent(fctx, tx, backfilltype.Event{BatchID: run.BatchID, Job: job.Name, Kind: backfilltype.EventPublishBlocked, Actor: r.cfg.WorkerID, Detail: detail})
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

// setRunError sets the run's last_error in tx ([PGManifest] only), as
// free text is stored ([pgstore.ManifestText]).
func (r *Runner) setRunError(ctx context.Context, tx sqlx.ExtContext, batchID int64, msg string) error {
	pm := r.caps.sql
	if pm == nil {
		return nil
	}
	_, err := tx.ExecContext(ctx, pm.SQL(`UPDATE {s}.runs SET last_error = $2, updated_at = now() WHERE batch_id = $1 AND last_error <> $2`), batchID, pgstore.ManifestText(msg))
	return err
}

// switchBack withdraws a versioned-view batch (see [Runner.Rollback]) in
// one [viewSwitch] of the job's view, bounded like the publish by
// [Publish.LockTimeout] and [Publish.LockRetries] ([ErrPublishBlocked]
// names the blocking readers; nothing changes then). Under the view's and
// the run row's locks, so that a pending publish of the batch cannot slip
// in between, it either points the view back to the version the batch's
// [backfilltype.EventPublished] replaced (the base table for the first
// publish; refused with [ErrRollbackConflict] when a later batch published,
// unless force), or, when the batch was never published, only marks it
// rolled_back: its pending publish then never happens. Either way the run
// becomes rolled_back in the same transaction. It reports what it did:
// "switched_back", "unpublished", or "" when the batch was rolled back
// already.
func (r *Runner) switchBack(ctx context.Context, job Job, run Run, base string, opts RollbackOptions) (string, error) {
	audit := r.caps.sql // Rollback refused the batch without it
	vs := viewSwitch{view: job.Publish.View, target: "the previous version", timeout: cmp.Or(job.Publish.LockTimeout, "200ms"),
		tries: cmp.Or(job.Publish.LockRetries, DefaultPublishLockRetries), what: fmt.Sprintf("rollback of batch %d", run.BatchID)}
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
			if e.Kind == backfilltype.EventPublished {
				if err := json.Unmarshal(e.Detail, &pub); err != nil {
					return err
				}
				found = true
			}
		}
		kind := "rollback_switch_back"
		detail := map[string]any{"why": opts.Why}
		if found {
			current, err := pgstore.ViewSource(ctx, tx, pub.View)
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
		if _, err := tx.ExecContext(ctx, audit.SQL(`UPDATE {s}.runs SET status = 'rolled_back', updated_at = now() WHERE batch_id = $1`), run.BatchID); err != nil {
			return err
		}
		d, _ := json.Marshal(detail)
		return audit.RecordEvent(ctx, tx, backfilltype.Event{BatchID: run.BatchID, Job: run.Job, Kind: kind, Actor: opts.Actor, Detail: d})
	})
	if err != nil {
		return "", err
	}
	return outcome, nil
}
