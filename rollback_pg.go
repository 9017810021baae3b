package backfill

import (
	"context"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// pgRollback is the SQL of a rollback of one target from the undo log of
// a [PGManifest]'s schema. Undo rows are matched to target rows through
// jsonb_to_record (PostgreSQL docs, 9.16 "JSON Functions"), which turns
// the logged key back into a record of the identity columns (keyRecord),
// and a prior image, which holds every column, is restored through
// jsonb_populate_record as a row of the target type.
type pgRollback struct {
	m        sqlManifest
	info     TableInfo
	target   string // quoted
	undo     string // quoted
	identity []string
	updated  string // quoted lineage UpdatedBy column
	inserted string // quoted lineage InsertedBy column
	columns  []string
	// chunkColumn and zone are the plan's ChunkColumn and Zone: they find
	// the rows a single chunk inserted (""/nil: unknown).
	chunkColumn string
	zone        string
	// keyTypes: the identity columns' types (format_type), which read
	// a logged key back as a record of those columns only (keyRecord).
	keyTypes map[string]string
}

func newPGRollback(m sqlManifest, info TableInfo) *pgRollback {
	return &pgRollback{m: m, info: info, target: sqlgen.Table(info.Target.Table), undo: m.UndoTable(),
		identity: info.identity(), updated: sqlgen.Ident(info.Target.Lineage.UpdatedBy), inserted: sqlgen.Ident(info.Target.Lineage.InsertedBy)}
}

// load reads the target's updatable columns (not generated, not identity
// ALWAYS): a prior image restores all of them.
func (rb *pgRollback) load(ctx context.Context, db sqlx.ExtContext) error {
	err := sqlx.SelectContext(ctx, db, &rb.columns, `SELECT a.attname::text FROM pg_attribute a
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
	rb.keyTypes = map[string]string{}
	for _, t := range types {
		rb.keyTypes[t.Name] = t.Type
	}
	return nil
}

// keyRecord is a FROM item reading the jsonb expression j (a logged key)
// as a record named alias of the identity columns only, typed as in the
// target. Not jsonb_populate_record(NULL::target, j): that builds a whole
// target row, and a column of a NOT NULL domain (CREATE DOMAIN d AS text
// NOT NULL) refuses the NULL it would get, failing every rollback and
// preview.
func (rb *pgRollback) keyRecord(j, alias string) string {
	defs := make([]string, len(rb.identity))
	for i, n := range rb.identity {
		defs[i] = sqlgen.Ident(n) + " " + rb.keyTypes[n]
	}
	return fmt.Sprintf("jsonb_to_record(%s) AS %s(%s)", j, alias, strings.Join(defs, ", "))
}

func (rb *pgRollback) match() string { return sqlgen.Equal("t", "r", rb.identity) }

// entries is the undo log with key arrays ("inserts") expanded to one row
// per inserted key: (batch_id, seq, id, op, key, before).
func (rb *pgRollback) entries() string {
	return fmt.Sprintf(`(SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
		FROM %[1]s u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.op = 'inserts'
		UNION ALL
		SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM %[1]s u WHERE u.op IN ('insert', 'update'))`, rb.undo)
}

// conflicts counts the rows the batch (or one chunk of it) changed that a
// later batch changed again: rows of the undo log, and rows it inserted
// (found by lineage), with up to 100 of them and the batch that last
// changed each. Changes by the batches in exclude (rolled back before
// this one by the same call) do not count.
func (rb *pgRollback) conflicts(ctx context.Context, db sqlx.ExtContext, batch int64, seqs []int, chunk *ChunkState, exclude []int64) (int64, []RollbackConflict, error) {
	var rows []struct {
		N   int64  `db:"n"`
		Key string `db:"key"`
		By  int64  `db:"by"`
	}
	filter, fargs := rb.insertedFilter(chunk, 4)
	err := sqlx.SelectContext(ctx, db, &rows, fmt.Sprintf(`WITH c AS (
			SELECT DISTINCT u.key, t.%[4]s AS by FROM %[1]s u CROSS JOIN LATERAL %[8]s
			JOIN %[2]s t ON %[3]s
			WHERE u.batch_id = $1 AND u.seq = ANY ($2::int[]) AND t.%[4]s IS DISTINCT FROM $1 AND NOT coalesce(t.%[4]s = ANY ($3::bigint[]), false)
			UNION
			SELECT %[6]s, t.%[4]s FROM %[2]s t WHERE t.%[5]s = $1 AND t.%[4]s IS DISTINCT FROM $1 AND NOT coalesce(t.%[4]s = ANY ($3::bigint[]), false) AND %[7]s)
		SELECT (SELECT count(*) FROM c) AS n, c.key::text AS key, coalesce(c.by, 0) AS by FROM c ORDER BY c.key::text LIMIT 100`,
		rb.entries(), rb.target, rb.match(), rb.updated, rb.inserted, keyJSON("t", rb.identity), filter, rb.keyRecord("u.key", "r")),
		append([]any{batch, pq.Array(seqs), pq.Array(append([]int64{}, exclude...))}, fargs...)...)
	if err != nil {
		return 0, nil, fmt.Errorf("backfill: rollback %s: conflicts: %w", rb.info.Target.Table, err)
	}
	if len(rows) == 0 {
		return 0, nil, nil
	}
	out := make([]RollbackConflict, len(rows))
	for i, r := range rows {
		out[i] = RollbackConflict{Key: r.Key, Batch: r.By}
	}
	return rows[0].N, out, nil
}

// preview counts the rows a rollback of the chunks would delete and
// restore.
func (rb *pgRollback) preview(ctx context.Context, db sqlx.ExtContext, batch int64, seqs []int, chunk *ChunkState, force bool) (deleted, restored int64, err error) {
	var n struct {
		Deleted  int64 `db:"deleted"`
		Restored int64 `db:"restored"`
	}
	filter, fargs := rb.insertedFilter(chunk, 4)
	err = sqlx.GetContext(ctx, db, &n, fmt.Sprintf(`SELECT
			(SELECT count(*) FROM %[2]s t WHERE t.%[5]s = $1 AND (t.%[4]s IS NOT DISTINCT FROM $1 OR $3) AND %[6]s) +
			count(DISTINCT u.key) FILTER (WHERE u.op = 'insert') AS deleted,
			count(DISTINCT u.key) FILTER (WHERE u.op = 'update') AS restored
		FROM %[1]s u CROSS JOIN LATERAL %[7]s
		JOIN %[2]s t ON %[3]s
		WHERE u.batch_id = $1 AND u.seq = ANY ($2::int[]) AND (t.%[4]s IS NOT DISTINCT FROM $1 OR $3)`,
		rb.entries(), rb.target, rb.match(), rb.updated, rb.inserted, filter, rb.keyRecord("u.key", "r")), append([]any{batch, pq.Array(seqs), force}, fargs...)...)
	if err != nil {
		return 0, 0, fmt.Errorf("backfill: rollback %s: preview: %w", rb.info.Target.Table, err)
	}
	return n.Deleted, n.Restored, nil
}

// chunk rolls back one chunk in its own transaction, with the chunk's
// manifest row as checkpoint. done is false when the chunk was not (or no
// longer) done: rolled back by an earlier, interrupted call.
func (rb *pgRollback) chunk(ctx context.Context, db sqlx.ExtContext, batch int64, seq int, chunk *ChunkState, force bool) (deleted, restored int64, done bool, err error) {
	err = inTx(ctx, db, func(tx sqlx.ExtContext) error {
		if err := rb.keysTable(ctx, tx); err != nil {
			return err
		}
		var status []string
		if err := sqlx.SelectContext(ctx, tx, &status, rb.m.sql(`SELECT status FROM {s}.chunks WHERE batch_id = $1 AND seq = $2 FOR UPDATE`), batch, seq); err != nil {
			return err
		}
		if len(status) == 0 || status[0] != string(ChunkDone) && status[0] != string(ChunkOpen) {
			return nil
		}
		sets := make([]string, len(rb.columns))
		for i, c := range rb.columns {
			sets[i] = "r." + sqlgen.Ident(c)
		}
		// The earliest prior image of each row in the chunk: the state
		// before the chunk touched it.
		res, err := tx.ExecContext(ctx, fmt.Sprintf(`UPDATE %[2]s t SET (%[5]s) = ROW(%[6]s)
			FROM (SELECT DISTINCT ON (u.key) u.key, u.before FROM %[1]s u
				WHERE u.batch_id = $1 AND u.seq = $2 AND u.op = 'update' ORDER BY u.key, u.id) u
			CROSS JOIN LATERAL jsonb_populate_record(NULL::%[2]s, u.before) r
			WHERE %[3]s AND (t.%[4]s IS NOT DISTINCT FROM $1 OR $3)`,
			rb.undo, rb.target, rb.match(), rb.updated, sqlgen.List("", rb.columns), strings.Join(sets, ", ")), batch, seq, force)
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		restored, _ = res.RowsAffected()
		res, err = tx.ExecContext(ctx, fmt.Sprintf(`DELETE FROM %[2]s t
			USING %[1]s u CROSS JOIN LATERAL %[5]s
			WHERE u.batch_id = $1 AND u.seq = $2 AND u.op = 'insert' AND %[3]s AND (t.%[4]s IS NOT DISTINCT FROM $1 OR $3)`,
			rb.entries(), rb.target, rb.match(), rb.updated, rb.keyRecord("u.key", "r")), batch, seq, force)
		if err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		deleted, _ = res.RowsAffected()
		if chunk != nil {
			n, err := rb.deleteInserted(ctx, tx, batch, chunk, force)
			if err != nil {
				return err
			}
			deleted += n
		}
		if rb.info.Target.Mode == History {
			if err := rb.retile(ctx, tx, batch, seq); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, rb.m.sql(`UPDATE {s}.chunks SET status = 'rolled_back' WHERE batch_id = $1 AND seq = $2`), batch, seq); err != nil {
			return err
		}
		done = true
		return nil
	})
	return deleted, restored, done, err
}

// finish records the rollback in the audit log and, for a whole batch,
// sets the run's status.
func (rb *pgRollback) finish(ctx context.Context, db sqlx.ExtContext, run Run, whole, force bool, e func(deleted int64) Event) (deleted int64, err error) {
	err = inTx(ctx, db, func(tx sqlx.ExtContext) error {
		if whole {
			// The rows the batch inserted, found by lineage, in one
			// statement: a crash before the commit leaves them all, and the
			// next call deletes them.
			if err := rb.keysTable(ctx, tx); err != nil {
				return err
			}
			n, err := rb.deleteInserted(ctx, tx, run.BatchID, nil, force)
			if err != nil {
				return err
			}
			deleted = n
			if rb.info.Target.Mode == History {
				if err := rb.retile(ctx, tx, run.BatchID, -1); err != nil {
					return err
				}
			}
			if _, err := tx.ExecContext(ctx, rb.m.sql(`UPDATE {s}.runs SET status = 'rolled_back', updated_at = now() WHERE batch_id = $1`), run.BatchID); err != nil {
				return err
			}
		}
		return rb.m.RecordEvent(ctx, tx, e(deleted))
	})
	return deleted, err
}

// keysTable makes the transaction-local list of keys whose rows this
// transaction deleted (for re-tiling History keys).
func (rb *pgRollback) keysTable(ctx context.Context, tx sqlx.ExtContext) error {
	_, err := tx.ExecContext(ctx, `CREATE TEMP TABLE IF NOT EXISTS backfill_rollback_keys (key jsonb NOT NULL) ON COMMIT DELETE ROWS`)
	return err
}

// deleteInserted deletes the rows the batch inserted (lineage InsertedBy),
// all of them or those of one chunk, that no later batch changed (unless
// force), and lists their keys in backfill_rollback_keys.
func (rb *pgRollback) deleteInserted(ctx context.Context, tx sqlx.ExtContext, batch int64, chunk *ChunkState, force bool) (int64, error) {
	filter, fargs := rb.insertedFilter(chunk, 3)
	res, err := tx.ExecContext(ctx, fmt.Sprintf(`WITH d AS (DELETE FROM %[1]s t WHERE t.%[2]s = $1 AND (t.%[3]s IS NOT DISTINCT FROM $1 OR $2) AND %[4]s RETURNING %[5]s AS key)
		INSERT INTO backfill_rollback_keys SELECT key FROM d`, rb.target, rb.inserted, rb.updated, filter, keyJSON("t", rb.identity)),
		append([]any{batch, force}, fargs...)...)
	if err != nil {
		return 0, fmt.Errorf("delete inserted rows: %w", err)
	}
	return res.RowsAffected()
}

// insertedFilter returns an SQL condition on target alias t that selects
// the rows of one chunk by the plan's ChunkColumn, with its bind
// parameters numbered from first; "true" for a whole batch (chunk nil).
func (rb *pgRollback) insertedFilter(chunk *ChunkState, first int) (string, []any) {
	if chunk == nil {
		return "true", nil
	}
	if rb.chunkColumn == "" {
		// No column to find them by: Rollback refuses a chunk that
		// inserted rows without one, so there are none to find.
		return "false", nil
	}
	col := "t." + sqlgen.Ident(rb.chunkColumn)
	p := func(i int) string { return fmt.Sprintf("$%d", first+i) }
	c := chunk.Chunk
	switch c.Kind {
	case KindTime:
		var base string
		for _, x := range rb.info.Columns {
			if x.Name == rb.chunkColumn {
				base = x.BaseType
			}
		}
		if base == "timestamp" || base == "date" {
			return fmt.Sprintf("%[1]s >= (%[2]s::timestamptz AT TIME ZONE %[4]s)::%[5]s AND %[1]s < (%[3]s::timestamptz AT TIME ZONE %[4]s)::%[5]s",
				col, p(0), p(1), p(2), base), []any{c.Start, c.End, cmpOr(rb.zone, "UTC")}
		}
		return fmt.Sprintf("%s >= %s AND %s < %s", col, p(0), col, p(1)), []any{c.Start, c.End}
	case KindInt:
		return fmt.Sprintf("%s >= %s AND %s < %s", col, p(0), col, p(1)), []any{c.Lo, c.Hi}
	default:
		return fmt.Sprintf("%s = %s", col, p(0)), []any{c.Item}
	}
}

// retile recomputes valid_to for the History keys the chunk's undo log
// touched, so that the versions left tile each key's history again (a
// restored prior image may end where a version of a later chunk or batch
// now starts), then checks the tiling.
func (rb *pgRollback) retile(ctx context.Context, tx sqlx.ExtContext, batch int64, seq int) error {
	t := rb.info.Target
	key := sqlgen.List("", t.Key)
	vf, vt := sqlgen.Ident(t.ValidFrom), sqlgen.Ident(t.ValidTo)
	keys := fmt.Sprintf(`SELECT DISTINCT %[3]s FROM (
			SELECT u.key FROM %[1]s u WHERE u.batch_id = $1 AND (u.seq = $2 OR $2 < 0)
			UNION ALL SELECT k.key FROM backfill_rollback_keys k) u
		CROSS JOIN LATERAL %[2]s`, rb.entries(), rb.keyRecord("u.key", "r"), sqlgen.List("r.", t.Key))
	_, err := tx.ExecContext(ctx, fmt.Sprintf(`WITH x AS (SELECT %[2]s, %[3]s, lead(%[3]s) OVER (PARTITION BY %[2]s ORDER BY %[3]s) AS _backfill_next_from
			FROM %[1]s WHERE (%[2]s) IN (%[5]s))
		UPDATE %[1]s t SET %[4]s = x._backfill_next_from FROM x
		WHERE %[6]s AND t.%[3]s = x.%[3]s AND t.%[4]s IS DISTINCT FROM x._backfill_next_from`,
		rb.target, key, vf, vt, keys, sqlgen.Equal("t", "x", t.Key)), batch, seq)
	if err != nil {
		return fmt.Errorf("retile intervals: %w", err)
	}
	var bad []string
	err = sqlx.SelectContext(ctx, tx, &bad, fmt.Sprintf(`SELECT DISTINCT row(%[2]s)::text FROM (
			SELECT %[2]s, %[3]s, %[4]s, lead(%[3]s) OVER (PARTITION BY %[2]s ORDER BY %[3]s) AS _backfill_next_from
			FROM %[1]s WHERE (%[2]s) IN (%[5]s)) x
		WHERE %[4]s IS DISTINCT FROM _backfill_next_from OR %[4]s <= %[3]s LIMIT 5`, rb.target, key, vf, vt, keys), batch, seq)
	if err != nil {
		return fmt.Errorf("check intervals: %w", err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: after rollback, keys %v", ErrHistoryIntervals, bad)
	}
	return nil
}
