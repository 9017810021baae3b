package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// pgRollback is the SQL of a rollback of one target from the undo log of
// a [Manifest]'s schema. Undo rows are matched to target rows through
// jsonb_to_record (PostgreSQL docs, 9.16 "JSON Functions"), which turns
// the logged key back into a record of the identity columns (keyRecord),
// and a prior image, which holds every column, is restored through
// jsonb_populate_record as a row of the target type.
type pgRollback struct {
	m        backfilldriver.SQLManifest
	info     backfilltype.TableInfo
	target   string // quoted
	undo     string // quoted
	identity []string
	updated  string   // quoted lineage UpdatedBy column
	inserted string   // quoted lineage InsertedBy column
	Columns  []string `json:"-" db:"-"`
	// ChunkColumn and zone are the plan's ChunkColumn and Zone: they find
	// the rows a single chunk inserted (""/nil: unknown).
	ChunkColumn string `json:"-" db:"-"`
	Zone        string `json:"-" db:"-"`
	// KeyTypes: the identity columns' types (format_type), which read
	// a logged key back as a record of those columns only (keyRecord).
	KeyTypes map[string]string `json:"-" db:"-"`
	scope    backfilltype.RollbackScope
	// noDelete: the role lacks DELETE on the target (load). A DELETE
	// needs it even when it deletes nothing, so the rollback of a batch
	// that only updated rows then runs none.
	noDelete bool
}

var (
	_ backfilldriver.UndoRollback = (*pgRollback)(nil)
	_ ChunkOrder                  = (*pgRollback)(nil)
)

// UndoRollback implements [MergerRollback]: the rollback by the undo log
// that m, a [Manifest], holds in its schema.
func (p *Merger) UndoRollback(ctx context.Context, db sqlx.ExtContext, m backfilldriver.ManifestRollback, info backfilltype.TableInfo, scope backfilltype.RollbackScope) (backfilldriver.UndoRollback, error) {
	pm, ok := m.(backfilldriver.SQLManifest)
	if !ok {
		return nil, fmt.Errorf("backfill: rollback %s: %w: PGMerger rolls back from the undo log of a PGManifest", info.Target.Table, backfilltype.ErrUnsupported)
	}
	rb := NewPGRollback(pm, info)
	rb.scope, rb.ChunkColumn, rb.Zone = scope, scope.ChunkColumn, scope.Zone
	if err := rb.load(ctx, db); err != nil {
		return nil, err
	}
	return rb, nil
}

// Conflicts implements [backfilldriver.UndoRollback].
func (rb *pgRollback) Conflicts(ctx context.Context, db sqlx.ExtContext) (backfilltype.RollbackConflicts, error) {
	return rb.ConflictsOf(ctx, db, rb.scope.Seqs, true)
}

// ConflictsOf is Conflicts for the chunks seqs of the scope, checked
// again under the target's merge lock by each transaction of a rollback:
// their undo log and the deliveries, and, when
// lineage is set, the rows the batch (or chunk) inserted found by lineage
// (a scan of the target, which only Finish's deletes need).
func (rb *pgRollback) ConflictsOf(ctx context.Context, db sqlx.ExtContext, seqs []int, lineage bool) (backfilltype.RollbackConflicts, error) {
	sc := rb.scope
	sc.Seqs = seqs
	var c backfilltype.RollbackConflicts
	changed, rows, batches, err := rb.conflicts(ctx, db, sc, lineage)
	if err != nil {
		return c, err
	}
	c.Changed, c.Rows, c.Batches = changed, rows, batches
	if sc.Chunk == nil || len(sc.Seqs) > 0 {
		var delivered []backfilltype.RollbackConflict
		var by []int64
		if c.Delivered, c.DeliveredDeleted, delivered, by, err = rb.delivered(ctx, db, sc.BatchID, sc.Seqs, sc.Chunk, sc.Exclude); err != nil {
			return c, err
		}
		c.Rows = append(c.Rows, delivered...)
		c.Batches = append(c.Batches, by...)
	}
	return c, nil
}

// Preview implements [backfilldriver.UndoRollback].
func (rb *pgRollback) Preview(ctx context.Context, db sqlx.ExtContext, force bool) (deleted, restored int64, err error) {
	return rb.preview(ctx, db, rb.scope.BatchID, rb.scope.Seqs, rb.scope.Chunk, force)
}

// RollBackChunk implements [backfilldriver.UndoRollback].
func (rb *pgRollback) RollBackChunk(ctx context.Context, tx sqlx.ExtContext, seq int, force bool) (deleted, restored int64, done bool, err error) {
	return rb.chunk(ctx, tx, rb.scope.BatchID, seq, rb.scope.Chunk, force)
}

// Finish implements [backfilldriver.UndoRollback].
func (rb *pgRollback) Finish(ctx context.Context, tx sqlx.ExtContext, whole, force bool, event func(deleted int64) backfilltype.Event) (int64, error) {
	return rb.finish(ctx, tx, rb.scope.BatchID, whole, force, event)
}

// NewPGRollback returns the rollback SQL of info's target from the undo
// log in m's schema, with no scope and nothing read yet:
// [Merger.UndoRollback] sets its scope and loads the target's columns
// before use. It runs nothing and cannot fail.
func NewPGRollback(m backfilldriver.SQLManifest, info backfilltype.TableInfo) *pgRollback {
	return &pgRollback{m: m, info: info, target: sqlgen.Table(info.Target.Table), undo: m.UndoTable(),
		identity: CompareColumns(info).Identity, updated: sqlgen.Ident(info.Target.Lineage.UpdatedBy), inserted: sqlgen.Ident(info.Target.Lineage.InsertedBy)}
}

// load reads the target's updatable columns (not generated, not identity
// ALWAYS): a prior image restores all of them.
func (rb *pgRollback) load(ctx context.Context, db sqlx.ExtContext) error {
	err := sqlx.SelectContext(ctx, db, &rb.Columns, `SELECT a.attname::text FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' AND a.attidentity <> 'a'
		ORDER BY a.attnum`, rb.target)
	if err != nil {
		return fmt.Errorf("backfill: rollback %s: columns: %w", rb.info.Target.Table, err)
	}
	var types []struct {
		Name string `db:"attname"`
		Type string `db:"type"`
	}
	if err := sqlx.SelectContext(ctx, db, &types, `SELECT a.attname::text AS attname, format_type(a.atttypid, a.atttypmod) AS type FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = ANY ($2::text[])`, rb.target, pq.Array(rb.identity)); err != nil {
		return fmt.Errorf("backfill: rollback %s: key types: %w", rb.info.Target.Table, err)
	}
	rb.KeyTypes = map[string]string{}
	for _, t := range types {
		rb.KeyTypes[t.Name] = t.Type
	}
	var mayDelete bool
	if err := sqlx.GetContext(ctx, db, &mayDelete, `SELECT coalesce(has_table_privilege(to_regclass($1), 'DELETE'), true)`, rb.target); err != nil {
		return fmt.Errorf("backfill: rollback %s: privileges: %w", rb.info.Target.Table, err)
	}
	rb.noDelete = !mayDelete
	return nil
}

// conflicts counts the rows the batch (or one chunk of it) changed that a
// later batch changed again: rows of the undo log, and rows it inserted
// (found by lineage), with up to 100 of them and the batch that last
// changed each, and the batches that last changed any of them. Changes by
// the batches in exclude (rolled back before this one by the same call)
// do not count.
func (rb *pgRollback) conflicts(ctx context.Context, db sqlx.ExtContext, sc backfilltype.RollbackScope, lineage bool) (int64, []backfilltype.RollbackConflict, []int64, error) {
	batch, seqs, chunk, exclude := sc.BatchID, sc.Seqs, sc.Chunk, sc.Exclude
	var rows []struct {
		N       int64         `db:"n"`
		Batches pq.Int64Array `db:"batches"`
		Key     string        `db:"key"`
		By      int64         `db:"by"`
	}
	filter, fargs := rb.InsertedFilter(chunk, 4)
	if !lineage {
		filter, fargs = "false", nil
	}
	err := sqlx.SelectContext(ctx, db, &rows, rb.ConflictsSQL(filter),
		append([]any{batch, pq.Array(seqs), pq.Array(append([]int64{}, exclude...))}, fargs...)...)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("backfill: rollback %s: conflicts: %w", rb.info.Target.Table, err)
	}
	if len(rows) == 0 {
		return 0, nil, nil, nil
	}
	out := make([]backfilltype.RollbackConflict, len(rows))
	for i, r := range rows {
		out[i] = backfilltype.RollbackConflict{Key: r.Key, Batch: r.By}
	}
	return rows[0].N, out, rows[0].Batches, nil
}

// preview counts the rows a rollback of the chunks would delete and
// restore.
func (rb *pgRollback) preview(ctx context.Context, db sqlx.ExtContext, batch int64, seqs []int, chunk *backfilltype.ChunkState, force bool) (deleted, restored int64, err error) {
	var n struct {
		Deleted  int64 `db:"deleted"`
		Restored int64 `db:"restored"`
	}
	filter, fargs := rb.InsertedFilter(chunk, 4)
	err = sqlx.GetContext(ctx, db, &n, rb.PreviewSQL(filter), append([]any{batch, pq.Array(seqs), force}, fargs...)...)
	if err != nil {
		return 0, 0, fmt.Errorf("backfill: rollback %s: preview: %w", rb.info.Target.Table, err)
	}
	return n.Deleted, n.Restored, nil
}

// chunk rolls back one chunk in tx, with the chunk's manifest row as
// checkpoint. done is false when the chunk was not (or no longer) done:
// rolled back by an earlier, interrupted call.
func (rb *pgRollback) chunk(ctx context.Context, tx sqlx.ExtContext, batch int64, seq int, chunk *backfilltype.ChunkState, force bool) (deleted, restored int64, done bool, err error) {
	err = func() error {
		if err := rb.keysTable(ctx, tx); err != nil {
			return err
		}
		if ok, err := rb.m.RollBackChunk(ctx, tx, batch, seq); err != nil || !ok {
			return err
		}
		// The UPDATE needs UPDATE privilege on the target even when it
		// restores nothing: a chunk that only inserted is rolled back by
		// a role that may only delete.
		var updated bool
		if err := sqlx.GetContext(ctx, tx, &updated, `SELECT EXISTS (SELECT FROM `+rb.undo+` WHERE batch_id = $1 AND seq = $2 AND op = 'update')`, batch, seq); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		if updated {
			if restored, err = rb.restore(ctx, tx, batch, []int{seq}, force); err != nil {
				return err
			}
		}
		// Likewise DELETE: without the privilege, only when the undo log
		// has inserted keys.
		logged := !rb.noDelete
		if !logged {
			if err := sqlx.GetContext(ctx, tx, &logged, `SELECT EXISTS (SELECT FROM `+rb.undo+` WHERE batch_id = $1 AND seq = $2 AND op IN ('insert', 'inserts'))`, batch, seq); err != nil {
				return fmt.Errorf("delete: %w", err)
			}
		}
		if logged {
			res, err := tx.ExecContext(ctx, rb.DeleteLoggedSQL(), batch, pq.Array([]int{seq}), force)
			if err != nil {
				return fmt.Errorf("delete: %w", err)
			}
			deleted, _ = res.RowsAffected()
		}
		if chunk != nil {
			n, err := rb.deleteInserted(ctx, tx, batch, chunk, force)
			if err != nil {
				return err
			}
			deleted += n
		}
		if rb.info.Target.Mode == backfilltype.History {
			if err := rb.retile(ctx, tx, batch, seq); err != nil {
				return err
			}
		}
		done = true
		return nil
	}()
	return deleted, restored, done, err
}

// restore restores the rows the chunks seqs of batch updated
// (RestoreSQL) and returns how many.
func (rb *pgRollback) restore(ctx context.Context, tx sqlx.ExtContext, batch int64, seqs []int, force bool) (int64, error) {
	res, err := tx.ExecContext(ctx, rb.RestoreSQL(), batch, pq.Array(seqs), force)
	if err != nil {
		return 0, fmt.Errorf("restore: %w", err)
	}
	return res.RowsAffected()
}

// ErrSliceRecheck is returned by [SliceRollback.RollBackChunks] when it
// restored fewer rows than the slice's undo log holds: a later batch may
// have changed some of them (or chunks of the slice changed one row
// twice, or rows are gone). The transaction must not commit; the caller
// rolls the chunks back one by one, each after a conflict check.
var ErrSliceRecheck = errors.New("backfill: rollback: fewer rows restored than logged")

// RollBackChunks implements [SliceRollback].
func (rb *pgRollback) RollBackChunks(ctx context.Context, tx sqlx.ExtContext, seqs []int, force bool) (restored int64, done int, err error) {
	batch := rb.scope.BatchID
	// The chunks still done (a concurrent rollback of the batch may have
	// rolled some back meanwhile).
	var rolled []int
	// A chunk pending or failed with sub-chunks committed (adaptive
	// chunks) holds their rows: rolled back as a done one.
	if err := sqlx.SelectContext(ctx, tx, &rolled, rb.m.SQL(`UPDATE {s}.chunks c SET status = 'rolled_back'
		WHERE batch_id = $1 AND seq = ANY ($2::int[]) AND (status IN ('done', 'open') OR status IN ('pending', 'failed')
			AND EXISTS (SELECT 1 FROM {s}.subchunks s WHERE s.batch_id = c.batch_id AND s.seq = c.seq)) RETURNING seq`), batch, pq.Array(seqs)); err != nil {
		return 0, 0, fmt.Errorf("backfill: rollback %s: %w", rb.info.Target.Table, err)
	}
	if len(rolled) == 0 {
		return 0, 0, nil
	}
	var n struct {
		Updates int64 `db:"updates"`
		Inserts int64 `db:"inserts"`
	}
	if err := sqlx.GetContext(ctx, tx, &n, SQLf(`SELECT count(*) FILTER (WHERE u.op = 'update') AS updates, count(*) FILTER (WHERE u.op <> 'update') AS inserts
		FROM unnest($2::int[]) AS s(seq) CROSS JOIN LATERAL (SELECT u.op FROM {undo} u WHERE u.batch_id = $1 AND u.seq = s.seq OFFSET 0) u`, "undo", rb.undo),
		batch, pq.Array(rolled)); err != nil {
		return 0, 0, fmt.Errorf("backfill: rollback %s: %w", rb.info.Target.Table, err)
	}
	if n.Inserts > 0 {
		return 0, 0, ErrSliceLegacy
	}
	if n.Updates == 0 {
		return 0, len(rolled), nil
	}
	if restored, err = rb.restore(ctx, tx, batch, rolled, force); err != nil {
		return 0, 0, fmt.Errorf("backfill: rollback %s: %w", rb.info.Target.Table, err)
	}
	if restored < n.Updates && !force {
		return 0, 0, ErrSliceRecheck
	}
	return restored, len(rolled), nil
}

// ErrSliceLegacy is returned by [SliceRollback.RollBackChunks] when the
// slice's undo log holds inserted keys (written by earlier versions of
// the merge): the transaction must not commit, and the caller rolls the
// chunks back one by one.
var ErrSliceLegacy = errors.New("backfill: rollback: inserted keys in the undo log")

// finish records the rollback in the audit log and, for a whole batch,
// sets the run's status.
func (rb *pgRollback) finish(ctx context.Context, tx sqlx.ExtContext, batch int64, whole, force bool, e func(deleted int64) backfilltype.Event) (deleted int64, err error) {
	err = func() error {
		if whole {
			// The rows the batch inserted, found by lineage, in one
			// statement: a crash before the commit leaves them all, and the
			// next call deletes them.
			if err := rb.keysTable(ctx, tx); err != nil {
				return err
			}
			n, err := rb.deleteInserted(ctx, tx, batch, nil, force)
			if err != nil {
				return err
			}
			deleted = n
			if rb.info.Target.Mode == backfilltype.History {
				if err := rb.retile(ctx, tx, batch, -1); err != nil {
					return err
				}
			}
			if err := rb.m.RollBackRun(ctx, tx, batch); err != nil {
				return err
			}
		}
		return rb.m.RecordEvent(ctx, tx, e(deleted))
	}()
	return deleted, err
}

// keysTable makes the transaction-local list of keys whose rows this
// transaction deleted (for re-tiling History keys).
func (rb *pgRollback) keysTable(ctx context.Context, tx sqlx.ExtContext) error {
	if rb.info.Target.Mode != backfilltype.History {
		return nil // only History re-tiles
	}
	_, err := tx.ExecContext(ctx, `CREATE TEMP TABLE IF NOT EXISTS backfill_rollback_keys (key jsonb NOT NULL) ON COMMIT DELETE ROWS`)
	return err
}

// deleteInserted deletes the rows the batch inserted (lineage InsertedBy),
// all of them or those of one chunk, that no later batch changed (unless
// force), and lists their keys in backfill_rollback_keys.
func (rb *pgRollback) deleteInserted(ctx context.Context, tx sqlx.ExtContext, batch int64, chunk *backfilltype.ChunkState, force bool) (int64, error) {
	filter, fargs := rb.InsertedFilter(chunk, 3)
	if rb.noDelete {
		// Without DELETE privilege, a DELETE only when there are rows to
		// delete (it fails then, as it must).
		var found bool
		if err := sqlx.GetContext(ctx, tx, &found, fmt.Sprintf(`SELECT EXISTS (SELECT FROM %s t WHERE t.%s = $1 AND $2::bool IS NOT NULL AND %s)`,
			rb.target, rb.inserted, filter), append([]any{batch, force}, fargs...)...); err != nil {
			return 0, fmt.Errorf("delete inserted rows: %w", err)
		}
		if !found {
			return 0, nil
		}
	}
	res, err := tx.ExecContext(ctx, rb.DeleteInsertedSQL(filter),
		append([]any{batch, force}, fargs...)...)
	if err != nil {
		return 0, fmt.Errorf("delete inserted rows: %w", err)
	}
	return res.RowsAffected()
}

// retile recomputes valid_to for the History keys the chunk's undo log
// touched, so that the versions left tile each key's history again (a
// restored prior image may end where a version of a later chunk or batch
// now starts), then checks the tiling.
func (rb *pgRollback) retile(ctx context.Context, tx sqlx.ExtContext, batch int64, seq int) error {
	_, err := tx.ExecContext(ctx, rb.RetileSQL(), batch, seq)
	if err != nil {
		return fmt.Errorf("retile intervals: %w", err)
	}
	var bad []string
	err = sqlx.SelectContext(ctx, tx, &bad, rb.CheckRetiledSQL(), batch, seq)
	if err != nil {
		return fmt.Errorf("check intervals: %w", err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: after rollback, keys %v", backfilltype.ErrHistoryIntervals, bad)
	}
	return nil
}

// OrderChunks implements [ChunkOrder]. A merge takes the locks of the
// keys it writes before it logs anything, so of two chunks that changed
// the same key, every undo entry of the one that committed second has a
// greater id than every entry of the first: ordered by their greatest
// entry, the chunks come in reverse commit order wherever it matters.
func (rb *pgRollback) OrderChunks(ctx context.Context, db sqlx.ExtContext) ([]int, error) {
	var last []int
	// The greatest entry of each chunk: one backward step in the undo
	// log's primary key per chunk, not a read of every entry.
	if err := sqlx.SelectContext(ctx, db, &last, SQLf(`SELECT s.seq FROM unnest($2::int[]) AS s(seq)
		CROSS JOIN LATERAL (SELECT max(u.id) AS last FROM {undo} u WHERE u.batch_id = $1 AND u.seq = s.seq) u
		WHERE u.last IS NOT NULL ORDER BY u.last DESC`, "undo", rb.undo),
		rb.scope.BatchID, pq.Array(rb.scope.Seqs)); err != nil {
		return nil, fmt.Errorf("backfill: rollback %s: chunks' commit order: %w", rb.info.Target.Table, err)
	}
	rb.scope.Seqs = orderSeqs(rb.scope.Seqs, last)
	return rb.scope.Seqs, nil
}

// orderSeqs returns first followed by the seqs of seqs that first lacks,
// in their order.
func orderSeqs(seqs, first []int) []int {
	out := append(make([]int, 0, len(seqs)), first...)
	seen := make(map[int]bool, len(first))
	for _, s := range first {
		seen[s] = true
	}
	for _, s := range seqs {
		if !seen[s] {
			out = append(out, s)
		}
	}
	return out
}

// DeliveredConflicts implements [SliceRollback].
func (rb *pgRollback) DeliveredConflicts(ctx context.Context, db sqlx.ExtContext) (backfilltype.RollbackConflicts, error) {
	var c backfilltype.RollbackConflicts
	var err error
	c.Delivered, c.DeliveredDeleted, c.Rows, c.Batches, err = rb.delivered(ctx, db, rb.scope.BatchID, rb.scope.Seqs, nil, rb.scope.Exclude)
	return c, err
}
