package backfill

import (
	"fmt"
	"strings"

	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// This file builds the SQL of a rollback, one function per statement.
// Identifiers are quoted through internal/sqlgen; values are bind
// parameters, numbered as each function says. The statements are pinned
// by testdata/rollback_*.golden.sql.

// conflictsSQL counts and lists (n, key, by) the rows the chunks seqs ($2)
// of batch $1 changed that a later batch, not in $3, changed again: rows
// of the undo log, and rows it inserted (lineage) that filter selects
// (bind parameters from $4).
func (rb *pgRollback) conflictsSQL(filter string) string {
	return fmt.Sprintf(`WITH c AS (
			SELECT DISTINCT u.key, t.%[4]s AS by FROM %[1]s u CROSS JOIN LATERAL jsonb_populate_record(NULL::%[2]s, u.key) r
			JOIN %[2]s t ON %[3]s
			WHERE u.batch_id = $1 AND u.seq = ANY ($2::int[]) AND t.%[4]s IS DISTINCT FROM $1 AND NOT coalesce(t.%[4]s = ANY ($3::bigint[]), false)
			UNION
			SELECT %[6]s, t.%[4]s FROM %[2]s t WHERE t.%[5]s = $1 AND t.%[4]s IS DISTINCT FROM $1 AND NOT coalesce(t.%[4]s = ANY ($3::bigint[]), false) AND %[7]s)
		SELECT (SELECT count(*) FROM c) AS n, c.key::text AS key, coalesce(c.by, 0) AS by FROM c ORDER BY c.key::text LIMIT 100`,
		rb.entries(), rb.target, rb.match(), rb.updated, rb.inserted, keyJSON("t", rb.identity), filter)
}

// previewSQL counts (deleted, restored) the rows a rollback of the chunks
// seqs ($2) of batch $1 would delete and restore: those no later batch
// changed, or all with force ($3); filter selects the inserted rows (bind
// parameters from $4).
func (rb *pgRollback) previewSQL(filter string) string {
	return fmt.Sprintf(`SELECT
			(SELECT count(*) FROM %[2]s t WHERE t.%[5]s = $1 AND (t.%[4]s IS NOT DISTINCT FROM $1 OR $3) AND %[6]s) +
			count(DISTINCT u.key) FILTER (WHERE u.op = 'insert') AS deleted,
			count(DISTINCT u.key) FILTER (WHERE u.op = 'update') AS restored
		FROM %[1]s u CROSS JOIN LATERAL jsonb_populate_record(NULL::%[2]s, u.key) r
		JOIN %[2]s t ON %[3]s
		WHERE u.batch_id = $1 AND u.seq = ANY ($2::int[]) AND (t.%[4]s IS NOT DISTINCT FROM $1 OR $3)`,
		rb.entries(), rb.target, rb.match(), rb.updated, rb.inserted, filter)
}

// restoreSQL restores the earliest prior image of each row that chunk $2
// of batch $1 updated (the state before the chunk touched it), unless a
// later batch changed the row and not force ($3).
func (rb *pgRollback) restoreSQL() string {
	sets := make([]string, len(rb.columns))
	for i, c := range rb.columns {
		sets[i] = "r." + sqlgen.Ident(c)
	}
	return fmt.Sprintf(`UPDATE %[2]s t SET (%[5]s) = ROW(%[6]s)
			FROM (SELECT DISTINCT ON (u.key) u.key, u.before FROM %[1]s u
				WHERE u.batch_id = $1 AND u.seq = $2 AND u.op = 'update' ORDER BY u.key, u.id) u
			CROSS JOIN LATERAL jsonb_populate_record(NULL::%[2]s, u.before) r
			WHERE %[3]s AND (t.%[4]s IS NOT DISTINCT FROM $1 OR $3)`,
		rb.undo, rb.target, rb.match(), rb.updated, sqlgen.List("", rb.columns), strings.Join(sets, ", "))
}

// deleteLoggedSQL deletes the rows the undo log of chunk $2 of batch $1
// records as inserted, unless a later batch changed the row and not
// force ($3).
func (rb *pgRollback) deleteLoggedSQL() string {
	return fmt.Sprintf(`DELETE FROM %[2]s t
			USING %[1]s u CROSS JOIN LATERAL jsonb_populate_record(NULL::%[2]s, u.key) r
			WHERE u.batch_id = $1 AND u.seq = $2 AND u.op = 'insert' AND %[3]s AND (t.%[4]s IS NOT DISTINCT FROM $1 OR $3)`,
		rb.entries(), rb.target, rb.match(), rb.updated)
}

// deleteInsertedSQL deletes the rows batch $1 inserted (lineage) that
// filter selects (bind parameters from $3), unless a later batch changed
// the row and not force ($2), and lists their keys in
// backfill_rollback_keys.
func (rb *pgRollback) deleteInsertedSQL(filter string) string {
	return fmt.Sprintf(`WITH d AS (DELETE FROM %[1]s t WHERE t.%[2]s = $1 AND (t.%[3]s IS NOT DISTINCT FROM $1 OR $2) AND %[4]s RETURNING %[5]s AS key)
		INSERT INTO backfill_rollback_keys SELECT key FROM d`, rb.target, rb.inserted, rb.updated, filter, keyJSON("t", rb.identity))
}

// retileKeys lists the History keys the undo log of chunk $2 of batch $1
// (every chunk for $2 < 0) touched or whose rows the rollback deleted.
func (rb *pgRollback) retileKeys() string {
	t := rb.info.Target
	return fmt.Sprintf(`SELECT DISTINCT %[3]s FROM (
			SELECT u.key FROM %[1]s u WHERE u.batch_id = $1 AND (u.seq = $2 OR $2 < 0)
			UNION ALL SELECT k.key FROM backfill_rollback_keys k) u
		CROSS JOIN LATERAL jsonb_populate_record(NULL::%[2]s, u.key) r`, rb.entries(), rb.target, sqlgen.List("r.", t.Key))
}

// retileSQL recomputes valid_to of the versions of retileKeys: each ends
// where the next version of its key starts.
func (rb *pgRollback) retileSQL() string {
	t := rb.info.Target
	key := sqlgen.List("", t.Key)
	vf, vt := sqlgen.Ident(t.ValidFrom), sqlgen.Ident(t.ValidTo)
	keys := rb.retileKeys()
	return fmt.Sprintf(`WITH x AS (SELECT %[2]s, %[3]s, lead(%[3]s) OVER (PARTITION BY %[2]s ORDER BY %[3]s) AS _backfill_next_from
			FROM %[1]s WHERE (%[2]s) IN (%[5]s))
		UPDATE %[1]s t SET %[4]s = x._backfill_next_from FROM x
		WHERE %[6]s AND t.%[3]s = x.%[3]s AND t.%[4]s IS DISTINCT FROM x._backfill_next_from`,
		rb.target, key, vf, vt, keys, sqlgen.Equal("t", "x", t.Key))
}

// checkRetiledSQL lists up to 5 keys of retileKeys whose versions overlap
// or leave a gap.
func (rb *pgRollback) checkRetiledSQL() string {
	t := rb.info.Target
	key := sqlgen.List("", t.Key)
	vf, vt := sqlgen.Ident(t.ValidFrom), sqlgen.Ident(t.ValidTo)
	keys := rb.retileKeys()
	return fmt.Sprintf(`SELECT DISTINCT row(%[2]s)::text FROM (
			SELECT %[2]s, %[3]s, %[4]s, lead(%[3]s) OVER (PARTITION BY %[2]s ORDER BY %[3]s) AS _backfill_next_from
			FROM %[1]s WHERE (%[2]s) IN (%[5]s)) x
		WHERE %[4]s IS DISTINCT FROM _backfill_next_from OR %[4]s <= %[3]s LIMIT 5`, rb.target, key, vf, vt, keys)
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

// deliveredSQL lists (n, deleted, key, by) the rows a rollback of batch
// $1 would delete or restore that a done chunk of another batch, not in
// $3, delivered unchanged: for the whole batch, or for oneChunk the
// chunks $4, whose inserted rows filter selects (bind parameters from
// $5). $2 is the identity's column names.
func (rb *pgRollback) deliveredSQL(oneChunk bool, filter string) string {
	identity := rb.identity
	lo := func(alias, bound string) string {
		parts := make([]string, len(identity))
		for i, c := range identity {
			parts[i] = "(" + alias + "." + bound + ")." + sqlgen.Ident(c)
		}
		return "ROW(" + strings.Join(parts, ", ") + ")"
	}
	tid := "ROW(" + sqlgen.List("t.", identity) + ")"
	// inRange: t lies within the delivering chunk's identity bounds, or
	// the chunk used another identity (a job with another Key on the same
	// table) and every row of the batch counts.
	// (Apart for the lookups into the target: an OR of the two would not
	// be an index condition, and each chunk would read the whole target.)
	ranged := fmt.Sprintf("%[1]s >= %[2]s AND %[1]s <= %[3]s", tid, lo("d", "lo"), lo("d", "hi"))
	inRange := "(NOT d.ranged OR (" + ranged + "))"
	// The rows the rollback would touch that batch last wrote: for a whole
	// batch every row whose UpdatedBy is batch (inserted or updated by
	// it); for one chunk, those it inserted within the chunk's bounds,
	// then those its undo log names.
	whole := "true"
	if oneChunk {
		whole = "t." + rb.inserted + " = $1 AND " + filter
	}
	var undoBranch string
	if oneChunk {
		undoBranch = fmt.Sprintf(`
			UNION ALL
			SELECT %[1]s, d.batch_id, false FROM %[2]s u CROSS JOIN LATERAL jsonb_populate_record(NULL::%[3]s, u.key) r
			JOIN %[3]s t ON %[4]s
			JOIN d ON %[5]s
			WHERE u.batch_id = $1 AND u.seq = ANY ($4::int[]) AND t.%[6]s = $1`,
			keyJSON("t", identity), rb.entries(), rb.target, rb.match(), inRange, rb.updated)
	}
	return fmt.Sprintf(`WITH d AS MATERIALIZED (
			SELECT d.batch_id, d.key_columns = $2::text[] AS ranged,
				jsonb_populate_record(NULL::%[1]s, d.lo) AS lo, jsonb_populate_record(NULL::%[1]s, d.hi) AS hi
			FROM %[2]s d JOIN %[3]s c ON c.batch_id = d.batch_id AND c.seq = d.seq
			WHERE d.owner = $1 AND d.batch_id <> $1 AND c.status IN ('done', 'open') AND d.batch_id <> ALL ($3::bigint[])),
		hit AS (
			SELECT %[4]s AS key, d.batch_id AS by, t.%[5]s = $1 AS del
			FROM d CROSS JOIN LATERAL (SELECT * FROM %[1]s t WHERE t.%[6]s = $1 AND %[7]s AND %[8]s OFFSET 0) t
			WHERE d.ranged
			UNION ALL
			SELECT %[4]s, d.batch_id, t.%[5]s = $1
			FROM (SELECT DISTINCT d.batch_id FROM d WHERE NOT d.ranged) d CROSS JOIN LATERAL (SELECT * FROM %[1]s t WHERE t.%[6]s = $1 AND %[8]s OFFSET 0) t%[9]s),
		x AS (SELECT DISTINCT ON (key) key, by, del FROM hit ORDER BY key, by)
		SELECT count(*) OVER () AS n, count(*) FILTER (WHERE del) OVER () AS deleted, key::text AS key, by
		FROM x ORDER BY key::text LIMIT 100`,
		rb.target, rb.m.sql("{s}.delivered"), rb.m.sql("{s}.chunks"), keyJSON("t", identity), rb.inserted, rb.updated,
		ranged, whole, undoBranch)
}

// recordDeliveredSQL summarises the staged rows the target holds as last
// written by another batch: one row per owner in the delivered table,
// with the least and greatest identity ($1 batch, $2 chunk, $3 the
// identity's column names).
func (s *pgStager) recordDeliveredSQL() string {
	t := s.info.Target
	identity := s.info.identity()
	ub := sqlgen.Ident(t.Lineage.UpdatedBy)
	// The least and greatest identity per owner: one window over the
	// found rows (first_value/last_value of each identity column), the
	// JSON built for those two rows only. The target is looked up once
	// per staged row (LATERAL with OFFSET 0, as in the History merge):
	// as a plain join, once the target is analysed, the planner may read
	// the whole target in index order against every staged row to save
	// the window's sort (a 10,000-row chunk against 200,000 rows took
	// 250 s).
	lo, hi := make([]string, len(identity)), make([]string, len(identity))
	loJSON, hiJSON := make([]string, len(identity)), make([]string, len(identity))
	for i, c := range identity {
		lo[i] = fmt.Sprintf("first_value(x.%s) OVER w AS _backfill_lo_%d", sqlgen.Ident(c), i)
		hi[i] = fmt.Sprintf("last_value(x.%s) OVER w AS _backfill_hi_%d", sqlgen.Ident(c), i)
		loJSON[i] = fmt.Sprintf("%s, y._backfill_lo_%d", pq.QuoteLiteral(c), i)
		hiJSON[i] = fmt.Sprintf("%s, y._backfill_hi_%d", pq.QuoteLiteral(c), i)
	}
	return fmt.Sprintf(`INSERT INTO %[1]s (owner, batch_id, seq, key_columns, lo, hi, row_count)
		SELECT y._backfill_owner, $1::bigint, $2::int, $3::text[], jsonb_build_object(%[9]s), jsonb_build_object(%[10]s), y._backfill_n FROM (
			SELECT DISTINCT ON (x._backfill_owner) x._backfill_owner, count(*) OVER w AS _backfill_n, %[7]s, %[8]s
			FROM (SELECT t.* FROM %[2]s s CROSS JOIN LATERAL (
				SELECT %[4]s, t.%[5]s AS _backfill_owner FROM %[3]s t WHERE %[6]s OFFSET 0) t
				WHERE t._backfill_owner <> $1::bigint) x
			WINDOW w AS (PARTITION BY x._backfill_owner ORDER BY %[11]s ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
			ORDER BY x._backfill_owner) y`,
		s.info.Chunk.DeliveredTable, s.q.stage, sqlgen.Table(t.Table), sqlgen.List("t.", identity), ub,
		sqlgen.Equal("t", "s", identity), strings.Join(lo, ", "), strings.Join(hi, ", "),
		strings.Join(loJSON, ", "), strings.Join(hiJSON, ", "), sqlgen.List("x.", identity))
}
