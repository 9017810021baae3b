package backfill

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// The target's privileges. With a [PGManifest] and the PostgreSQL merger,
// [Runner.Run] checks, before it creates or resumes a batch, every
// privilege the job needs (the manifest's too: [Runner.runPrivileges]),
// and reports all the missing ones at once in a [*PrivilegeError] with
// the GRANT statements to run: USAGE on the target's schema, SELECT on
// every column, INSERT on the written columns, USAGE on the sequences of
// unwritten serial columns, UPDATE where the mode updates (an Upsert
// without it runs insert-only), and CREATE or ownership for the publish
// modes that create or swap tables. [Runner.Rollback] by the undo log
// checks DELETE and UPDATE as the batch needs them. The README
// ("Privileges") lists them; the design note docs/design/privileges.md
// says why each is needed.

// privilegeCheck is one privilege check of a run or a rollback: the
// [pgstore.PrivilegeChecker] that runs the catalog queries and gathers
// what is missing, and db, the check's read transaction, for the
// queries of the engine's own decisions (the manifest's privileges, what
// a rollback will change).
type privilegeCheck struct {
	db sqlx.ExtContext
	pg *pgstore.PrivilegeChecker
}

func newPrivilegeCheck(ctx context.Context, db sqlx.ExtContext) (*privilegeCheck, error) {
	pg, err := pgstore.NewPrivilegeChecker(ctx, db)
	if err != nil {
		return nil, err
	}
	return &privilegeCheck{db: db, pg: pg}, nil
}

// pgPrivileges reports whether the Runner checks privileges: on
// PostgreSQL, with a PGManifest (nil otherwise) and whether a [pgstore.Merger]
// writes the target.
func (r *Runner) pgPrivileges() (pm *PGManifest, target bool) {
	if _, ok := r.db.(pgstore.PGDB); !ok {
		return nil, false
	}
	pm, _ = r.cfg.Manifest.(*PGManifest)
	_, target = r.cfg.Merger.(*pgstore.Merger)
	return pm, target
}

// checkTargetSchema checks USAGE on the schema of job's target, before
// Prepare (which cannot find a table in a schema it may not use).
func (r *Runner) checkTargetSchema(ctx context.Context, job Job) error {
	ctx = pgstore.WithPurpose(ctx, "check the target schema", 0)
	if _, target := r.pgPrivileges(); !target {
		return nil
	}
	// In one read transaction: safe behind a transaction pooler.
	var c *privilegeCheck
	err := pgstore.ReadTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		var err error
		if c, err = newPrivilegeCheck(ctx, tx); err != nil {
			return err
		}
		s, err := pgstore.SchemaOf(ctx, tx, job.Target.Table)
		if err == nil {
			err = c.pg.Schema(ctx, s, "USAGE", "the target")
		}
		if pm, _ := r.pgPrivileges(); err == nil && len(c.pg.Missing) > 0 && pm != nil {
			// The run stops here: name the manifest's missing privileges too.
			var missing []backfilltype.Privilege
			missing, _, err = pm.MissingPrivileges(ctx, tx)
			c.pg.Missing = append(missing, c.pg.Missing...)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("backfill: job %q: privileges: %w", job.Name, err)
	}
	if err := c.pg.Err(); err != nil {
		return fmt.Errorf("backfill: job %q: %w", job.Name, err)
	}
	return nil
}

// checkRunPrivileges checks every privilege the run of job on the
// prepared target info needs (see the top of this file) and returns
// warnings (an insert-only Upsert) or a *PrivilegeError listing all the
// missing ones. Called by planRun before the run is created or resumed.
func (r *Runner) checkRunPrivileges(ctx context.Context, job Job, info TableInfo) (warnings []string, err error) {
	ctx = pgstore.WithPurpose(ctx, "check the run's privileges", 0)
	pm, target := r.pgPrivileges()
	if pm == nil && !target {
		return nil, nil
	}
	// In one read transaction: safe behind a transaction pooler.
	var c *privilegeCheck
	err = pgstore.ReadTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		var err error
		if c, err = newPrivilegeCheck(ctx, tx); err != nil {
			return err
		}
		return r.runPrivileges(ctx, c, pm, target, job, info)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: job %q: privileges: %w", job.Name, err)
	}
	if err := c.pg.Err(); err != nil {
		return nil, fmt.Errorf("backfill: job %q: %w", job.Name, err)
	}
	if target && info.InsertOnly {
		what, grant := pgstore.UpdateLacks(info)
		warnings = append(warnings, fmt.Sprintf("role %s lacks UPDATE on %s: the run only inserts; a chunk with a row to update fails with %v (%s)",
			sqlgen.Ident(c.pg.Role), what, ErrPrivilege, grant))
	}
	return warnings, nil
}

func (r *Runner) runPrivileges(ctx context.Context, c *privilegeCheck, pm *PGManifest, target bool, job Job, info TableInfo) error {
	if pm != nil {
		if err := c.runManifest(ctx, pm, job); err != nil {
			return err
		}
	}
	if !target {
		return nil
	}
	return c.runTarget(ctx, job, info)
}

// runManifest adds the manifest's missing privileges and, for
// [PublishAtEnd], CREATE on the manifest's schema (the run's staging
// table).
func (c *privilegeCheck) runManifest(ctx context.Context, pm *PGManifest, job Job) error {
	missing, _, err := pm.MissingPrivileges(ctx, c.db)
	if err != nil {
		return err
	}
	c.pg.Missing = append(c.pg.Missing, missing...)
	if job.Publish.Mode == PublishAtEnd {
		if err := c.pg.Schema(ctx, pm.SchemaName, "CREATE", "the run's staging table (PublishAtEnd)"); err != nil {
			return err
		}
	}
	return nil
}

// runTarget checks what a run of job needs on the target of info:
// SELECT, INSERT on the written columns, UPDATE in History mode, USAGE on
// the sequences of unwritten serial columns, and what the publish mode
// needs (runPublish). A target that does not exist yet needs nothing.
func (c *privilegeCheck) runTarget(ctx context.Context, job Job, info TableInfo) error {
	t := info.Target
	oid, err := pgstore.RelationOID(ctx, c.db, t.Table)
	if err != nil || oid == 0 {
		return err
	}
	names := make([]string, len(info.Columns))
	for i, col := range info.Columns {
		names[i] = col.Name
	}
	if err := c.pg.Columns(ctx, oid, t.Table, "SELECT", nil, "the merge reads target rows"); err != nil {
		return err
	}
	if err := c.pg.Columns(ctx, oid, t.Table, "INSERT", names, "the merge inserts rows"); err != nil {
		return err
	}
	if t.Mode == History {
		cols := append(slices.Clone(pgstore.CompareColumns(info).Written), t.ValidTo)
		if err := c.pg.Columns(ctx, oid, t.Table, "UPDATE", cols, "History updates and closes versions"); err != nil {
			return err
		}
	}
	if err := c.pg.Serials(ctx, oid, names); err != nil {
		return err
	}
	schema, err := pgstore.SchemaOf(ctx, c.db, t.Table)
	if err != nil {
		return err
	}
	return c.runPublish(ctx, job, t.Table, oid, schema)
}

// runPublish checks what job's publish mode needs of the target table
// (its oid, in schema): CREATE on schema and ownership of the target for
// [PublishPartitionSwap]; CREATE on schema and the view's schema, and
// ownership of the view once it exists, for [PublishVersionedView].
// Other modes need nothing here.
func (c *privilegeCheck) runPublish(ctx context.Context, job Job, table string, oid int64, schema string) error {
	switch job.Publish.Mode {
	case PublishPartitionSwap:
		if err := c.pg.Schema(ctx, schema, "CREATE", "the partitions PublishPartitionSwap creates"); err != nil {
			return err
		}
		if err := c.pg.Owner(ctx, oid, "table", table, "PublishPartitionSwap detaches and attaches its partitions"); err != nil {
			return err
		}
	case PublishVersionedView:
		return c.runVersionedView(ctx, job.Publish.View, schema)
	}
	return nil
}

// runVersionedView checks what [PublishVersionedView] needs: CREATE on
// the target's schema (the table versions) and on the schema of view when
// it differs, and ownership of view once it exists.
func (c *privilegeCheck) runVersionedView(ctx context.Context, view, schema string) error {
	if err := c.pg.Schema(ctx, schema, "CREATE", "the table versions PublishVersionedView creates"); err != nil {
		return err
	}
	vs, err := pgstore.SchemaOf(ctx, c.db, view)
	if err != nil {
		return err
	}
	if vs != schema {
		if err := c.pg.Schema(ctx, vs, "CREATE", "the view PublishVersionedView creates"); err != nil {
			return err
		}
	}
	viewOID, err := pgstore.RelationOID(ctx, c.db, view)
	if err != nil {
		return err
	}
	if viewOID != 0 {
		if err := c.pg.Owner(ctx, viewOID, "view", view, "PublishVersionedView replaces the view"); err != nil {
			return err
		}
	}
	return nil
}

// checkRollbackPrivileges checks, before a rollback of batchID by the
// undo log changes anything, DELETE on the target when the batch
// inserted rows, UPDATE when its undo log holds prior images, and the
// manifest's privileges.
func (r *Runner) checkRollbackPrivileges(ctx context.Context, info TableInfo, batchID int64) error {
	ctx = pgstore.WithPurpose(ctx, "check the rollback's privileges", batchID)
	pm, target := r.pgPrivileges()
	if pm == nil && !target {
		return nil
	}
	// In one read transaction: safe behind a transaction pooler.
	var c *privilegeCheck
	err := pgstore.ReadTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		var err error
		if c, err = newPrivilegeCheck(ctx, tx); err != nil {
			return err
		}
		return r.rollbackPrivileges(ctx, c, pm, target, info, batchID)
	})
	if err != nil {
		return fmt.Errorf("backfill: rollback of batch %d: privileges: %w", batchID, err)
	}
	if err := c.pg.Err(); err != nil {
		return fmt.Errorf("backfill: rollback of batch %d: %w", batchID, err)
	}
	return nil
}

func (r *Runner) rollbackPrivileges(ctx context.Context, c *privilegeCheck, pm *PGManifest, target bool, info TableInfo, batchID int64) error {
	// Without the manifest's word, both are required.
	updates, deletes := info.Target.Mode == History, true
	if pm != nil {
		missing, _, err := pm.MissingPrivileges(ctx, c.db)
		if err != nil {
			return err
		}
		c.pg.Missing = append(c.pg.Missing, missing...)
		if len(missing) == 0 {
			var need struct {
				Updates bool `db:"updates"`
				Deletes bool `db:"deletes"`
			}
			// The rows a rollback deletes are the rows the batch inserted:
			// logged in the undo log, or found by lineage (InsertedBy), and
			// counted in the rows_inserted of the chunks that committed
			// them (in the chunk's transaction). A History version the
			// batch opened is an inserted row too. None: no DELETE.
			if err := sqlx.GetContext(ctx, c.db, &need, pm.SQL(`SELECT
				EXISTS (SELECT FROM {s}.undo WHERE batch_id = $1 AND op = 'update') AS updates,
				EXISTS (SELECT FROM {s}.undo WHERE batch_id = $1 AND op IN ('insert', 'inserts'))
					OR EXISTS (SELECT FROM {s}.chunks WHERE batch_id = $1 AND rows_inserted > 0) AS deletes`), batchID); err != nil {
				return err
			}
			updates, deletes = need.Updates, need.Deletes
		}
	}
	if !target {
		return nil
	}
	t := info.Target
	oid, err := pgstore.RelationOID(ctx, c.db, t.Table)
	if err != nil || oid == 0 {
		return err
	}
	n := len(c.pg.Missing)
	if err := c.pg.Columns(ctx, oid, t.Table, "SELECT", nil, "the rollback reads target rows"); err != nil {
		return err
	}
	if !deletes && t.Lineage.InsertedBy != "" {
		// The rows lineage finds, whatever the chunks' counts say (a
		// chunk read again may count its earlier inserts as unchanged).
		deletes = len(c.pg.Missing) > n
		if !deletes {
			if err := sqlx.GetContext(ctx, c.db, &deletes, fmt.Sprintf(`SELECT EXISTS (SELECT FROM %s WHERE %s = $1)`,
				sqlgen.Table(t.Table), sqlgen.Ident(t.Lineage.InsertedBy)), batchID); err != nil {
				return err
			}
		}
	}
	if deletes {
		if err := c.pg.Table(ctx, oid, t.Table, "DELETE", "the rollback deletes the rows the batch inserted"); err != nil {
			return err
		}
	}
	if updates {
		cols := slices.Clone(pgstore.CompareColumns(info).Written)
		if t.Mode == History {
			cols = append(cols, t.ValidTo)
		}
		if err := c.pg.Columns(ctx, oid, t.Table, "UPDATE", cols, "the rollback restores the rows the batch updated"); err != nil {
			return err
		}
	}
	return nil
}

// GrantOptions says what a role does with a target, for [TargetGrants].
type GrantOptions struct {
	// Publish is the job's publish mode.
	Publish PublishMode
	// ManifestSchema is the manifest's schema, for PublishAtEnd's
	// staging tables; "" means "backfill".
	ManifestSchema string
	// Rollback: the role also rolls batches back ([Runner.Rollback]),
	// which deletes the rows a batch inserted and, when runs update rows,
	// restores them.
	Rollback bool
	// InsertOnly leaves UPDATE out for an Upsert that could update rows:
	// the role loads new ground only, and a chunk that would update a row
	// fails with [ErrPrivilege]. Ignored for History, which always
	// updates.
	InsertOnly bool
}

// TargetGrants returns the GRANT statements that give role what a job
// writing t needs on its target (the manifest's are printed by the command
// "backfill grants", or returned by the Grants method of [PGManifest]):
// USAGE on the target's schema; SELECT and INSERT on the table; UPDATE
// when the runs update rows (History, an Upsert with SourceWins or
// NewerVersionWins unless o.InsertOnly; not AppendOnly, Keyless or
// TargetWins); DELETE with o.Rollback; CREATE on the schemas a publish
// mode creates tables or views in; and, as SQL comments, the ownership
// PublishPartitionSwap and PublishVersionedView need. An unqualified
// t.Table is taken in schema "public". USAGE on the sequences of serial
// columns the job does not write is not listed, since it needs the
// catalog: [Runner.Run] names them when it checks, and the command
// "backfill grants" looks them up. Identifiers are quoted.
func TargetGrants(role string, t Target, o GrantOptions) ([]string, error) {
	schema, table, err := sqlgen.ParseTable(t.Table)
	if err != nil {
		return nil, fmt.Errorf("backfill: grants: %w: %w", ErrInvalidConfig, err)
	}
	schema = cmp.Or(schema, "public")
	q := sqlgen.Ident(schema) + "." + sqlgen.Ident(table)
	privs := []string{"SELECT", "INSERT"}
	mode := cmp.Or(t.Mode, Upsert)
	switch {
	case !slices.Contains([]Mode{Upsert, AppendOnly, Keyless, History}, mode):
		return nil, fmt.Errorf("backfill: grants: %w: mode %q is not upsert, append_only, keyless or history", ErrInvalidConfig, t.Mode)
	case !slices.Contains([]ConflictPolicy{"", SourceWins, TargetWins, NewerVersionWins}, t.Conflict):
		return nil, fmt.Errorf("backfill: grants: %w: conflict policy %q is not source_wins, target_wins or newer_version_wins", ErrInvalidConfig, t.Conflict)
	case !slices.Contains([]PublishMode{PublishPerChunk, PublishAtEnd, PublishPartitionSwap, PublishVersionedView}, o.Publish):
		return nil, fmt.Errorf("backfill: grants: %w: publish mode %q is not \"\", at_end, partition_swap or versioned_view", ErrInvalidConfig, o.Publish)
	}
	updates := mode == History || mode == Upsert && t.Conflict != TargetWins && !o.InsertOnly
	if updates {
		privs = append(privs, "UPDATE")
	}
	if o.Rollback {
		privs = append(privs, "DELETE")
	}
	out := []string{
		pgstore.GrantOn("USAGE", "SCHEMA "+sqlgen.Ident(schema), role),
		pgstore.GrantOn(strings.Join(privs, ", "), "TABLE "+q, role),
	}
	switch o.Publish {
	case PublishAtEnd:
		out = append(out, pgstore.GrantOn("CREATE", "SCHEMA "+sqlgen.Ident(cmp.Or(o.ManifestSchema, "backfill")), role))
	case PublishPartitionSwap:
		out = append(out, pgstore.GrantOn("CREATE", "SCHEMA "+sqlgen.Ident(schema), role),
			fmt.Sprintf("-- PublishPartitionSwap: %s must own %s: ALTER TABLE %s OWNER TO %s; (or be a member of its owner's role, only if that is a NOLOGIN role without SUPERUSER, CREATEROLE, CREATEDB, REPLICATION, BYPASSRLS or pg_* memberships)", sqlgen.Ident(role), q, q, sqlgen.Ident(role)))
	case PublishVersionedView:
		out = append(out, pgstore.GrantOn("CREATE", "SCHEMA "+sqlgen.Ident(schema), role),
			fmt.Sprintf("-- PublishVersionedView: CREATE on the view's schema too, and %s must own the view once it exists: ALTER VIEW <view> OWNER TO %s; (or be a member of its owner's role, only if that is a NOLOGIN role without SUPERUSER, CREATEROLE, CREATEDB, REPLICATION, BYPASSRLS or pg_* memberships)", sqlgen.Ident(role), sqlgen.Ident(role)))
	}
	return out, nil
}
