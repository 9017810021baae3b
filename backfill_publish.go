package backfill

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

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
	// version is kept; [Runner.Rollback] switches the view back to it.
	PublishVersionedView PublishMode = "versioned_view"
)

// Publish configures how a job's rows reach readers ([Job.Publish]).
type Publish struct {
	// Mode is the publish mode; the zero value publishes per chunk.
	Mode PublishMode
	// View is the view readers query, optionally schema-qualified
	// (PublishVersionedView). It is created on the first publish.
	View string
}

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
		return nil
	}
	return fmt.Errorf("%w: Job.Publish.Mode %q is not supported (job %q)", ErrInvalidConfig, p.Mode, job)
}

// versionTable names the table version a batch loads: "<table>__v<batch>".
func versionTable(table string, batchID int64) string {
	return fmt.Sprintf("%s__v%d", table, batchID)
}

// viewSource returns the table the view reads (from pg_depend and
// pg_rewrite, PostgreSQL docs 53.18 and 53.43), or "" when the view does
// not exist yet.
func viewSource(ctx context.Context, db sqlx.ExtContext, view string) (string, error) {
	var src []string
	err := sqlx.SelectContext(ctx, db, &src, `SELECT DISTINCT n.nspname || '.' || c.relname
		FROM pg_rewrite r
		JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid AND d.deptype = 'n'
		JOIN pg_class c ON c.oid = d.refobjid AND c.relkind IN ('r', 'p')
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE r.ev_class = to_regclass($1) AND d.refobjid <> r.ev_class`, sqlgen.Table(view))
	if err != nil {
		return "", fmt.Errorf("backfill: view %s: %w", view, err)
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
// the audit log; it does nothing when the view already reads it.
func (r *Runner) publishVersion(ctx context.Context, job Job, run Run, table string) error {
	audit, ok := r.cfg.Manifest.(ManifestAudit)
	if !ok {
		return fmt.Errorf("backfill: publish job %q: %w: the manifest has no audit log", job.Name, ErrUnsupported)
	}
	version := versionTable(table, run.BatchID)
	return inTx(ctx, r.db, func(tx sqlx.ExtContext) error {
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
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`CREATE OR REPLACE VIEW %s AS SELECT * FROM %s`, sqlgen.Table(job.Publish.View), sqlgen.Table(version))); err != nil {
			return fmt.Errorf("backfill: publish job %q: switch view %s: %w", job.Name, job.Publish.View, err)
		}
		detail, _ := json.Marshal(map[string]string{"view": job.Publish.View, "version": version, "previous": previous})
		return audit.RecordEvent(ctx, tx, Event{BatchID: run.BatchID, Job: job.Name, Kind: "published", Actor: r.cfg.WorkerID, Detail: detail})
	})
}

// switchBack points the view of a versioned-view batch back to the version
// it replaced; it reports false when the batch was never published.
func (r *Runner) switchBack(ctx context.Context, run Run, actor, why string) (bool, error) {
	audit, ok := r.cfg.Manifest.(ManifestAudit)
	if !ok {
		return false, fmt.Errorf("backfill: switch back batch %d: %w", run.BatchID, ErrUnsupported)
	}
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
		if current != pub.Version {
			return fmt.Errorf("backfill: switch back batch %d: %w: view %s reads %s, not this batch's %s (a later batch published)",
				run.BatchID, ErrRollbackConflict, pub.View, current, pub.Version)
		}
		if pub.Previous == "" {
			return fmt.Errorf("backfill: switch back batch %d: %w: it was the view's first version", run.BatchID, ErrUnsupported)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`CREATE OR REPLACE VIEW %s AS SELECT * FROM %s`, sqlgen.Table(pub.View), sqlgen.Table(pub.Previous))); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+sqlgen.Ident(r.pgManifestSchema())+`.runs SET status = 'rolled_back', updated_at = now() WHERE batch_id = $1`, run.BatchID); err != nil {
			return err
		}
		detail, _ := json.Marshal(map[string]string{"why": why, "view": pub.View, "from": pub.Version, "to": pub.Previous})
		return audit.RecordEvent(ctx, tx, Event{BatchID: run.BatchID, Job: run.Job, Kind: "rollback_switch_back", Actor: actor, Detail: detail})
	})
	return err == nil, err
}

func (r *Runner) pgManifestSchema() string {
	if pm, ok := r.cfg.Manifest.(*PGManifest); ok {
		return pm.schema
	}
	return "backfill"
}
