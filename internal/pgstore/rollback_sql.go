package pgstore

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"

	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// ConflictsSQL counts and lists (n, batches, key, by) the rows the chunks
// seqs ($2) of batch $1 changed that a later batch, not in $3, changed
// again: rows of the undo log, and rows it inserted (lineage) that filter
// selects (bind parameters from $4). batches are the later batches of all
// of them, the rows listed or not.
func (rb *pgRollback) ConflictsSQL(filter string) string {
	return SQLf(`WITH c AS (
	SELECT DISTINCT u.key, t.{ub} AS by FROM {entries} u CROSS JOIN LATERAL {record}
	JOIN {target} t ON {match}
	WHERE t.{ub} IS DISTINCT FROM $1 AND NOT coalesce(t.{ub} = ANY ($3::bigint[]), false)
	UNION
	SELECT {key}, t.{ub} FROM {target} t WHERE t.{ib} = $1 AND t.{ub} IS DISTINCT FROM $1 AND NOT coalesce(t.{ub} = ANY ($3::bigint[]), false) AND {filter})
SELECT (SELECT count(*) FROM c) AS n, (SELECT array_agg(DISTINCT c.by) FROM c WHERE c.by IS NOT NULL) AS batches,
	c.key::text AS key, coalesce(c.by, 0) AS by FROM c ORDER BY c.key::text LIMIT 100`,
		"entries", rb.entries("$2::int[]"), "target", rb.target, "match", rb.match(), "ub", rb.updated, "ib", rb.inserted,
		"key", keyJSON("t", rb.identity), "filter", filter, "record", rb.keyRecord("u.key", "r"))
}

// PreviewSQL counts (deleted, restored) the rows a rollback of the chunks
// seqs ($2) of batch $1 would delete and restore: those no later batch
// changed, or all with force ($3); filter selects the inserted rows (bind
// parameters from $4).
func (rb *pgRollback) PreviewSQL(filter string) string {
	return SQLf(`SELECT
	(SELECT count(*) FROM {target} t WHERE t.{ib} = $1 AND (t.{ub} IS NOT DISTINCT FROM $1 OR $3) AND {filter}) +
	count(DISTINCT u.key) FILTER (WHERE u.op = 'insert') AS deleted,
	count(DISTINCT u.key) FILTER (WHERE u.op = 'update') AS restored
FROM {entries} u CROSS JOIN LATERAL {record}
JOIN {target} t ON {match}
WHERE (t.{ub} IS NOT DISTINCT FROM $1 OR $3)`,
		"entries", rb.entries("$2::int[]"), "target", rb.target, "match", rb.match(), "ub", rb.updated, "ib", rb.inserted, "filter", filter,
		"record", rb.keyRecord("u.key", "r"))
}

// RestoreSQL restores the earliest prior image of each row that the
// chunks $2 (int[]) of batch $1 updated (the state before the first of
// them touched it), unless a later batch changed the row and not force
// ($3). Each logged row is looked up once by its identity.
func (rb *pgRollback) RestoreSQL() string {
	return SQLf(`UPDATE {target} t SET ({columns}) = ROW({rcolumns})
FROM (SELECT DISTINCT ON (u.key) u.key, u.before FROM {updates} u ORDER BY u.key, u.id) u
CROSS JOIN LATERAL jsonb_populate_record(NULL::{target}, u.before) r
WHERE {match} AND (t.{ub} IS NOT DISTINCT FROM $1 OR $3)`,
		"updates", rb.updates(), "target", rb.target, "match", rb.match(), "ub", rb.updated,
		"columns", sqlgen.List("", rb.Columns), "rcolumns", sqlgen.List("r.", rb.Columns))
}

// DeleteLoggedSQL deletes the rows the undo log of the chunks $2 (int[])
// of batch $1 records as inserted (written by earlier versions), unless a later batch changed the row and not
// force ($3).
func (rb *pgRollback) DeleteLoggedSQL() string {
	return SQLf(`DELETE FROM {target} t
USING {entries} u CROSS JOIN LATERAL {record}
WHERE u.op = 'insert' AND {match} AND (t.{ub} IS NOT DISTINCT FROM $1 OR $3)`,
		"entries", rb.entries("$2::int[]"), "target", rb.target, "match", rb.match(), "ub", rb.updated, "record", rb.keyRecord("u.key", "r"))
}

// DeleteInsertedSQL deletes the rows batch $1 inserted (lineage) that
// filter selects (bind parameters from $3), unless a later batch changed
// the row and not force ($2), and, for a History target, lists their keys
// in backfill_rollback_keys (for re-tiling). Only History lists them:
// written to a temporary table, the keys made the deletion of a first
// load's rows about 9 times slower (15 s against 1.7 s for 1,000,000
// rows).
func (rb *pgRollback) DeleteInsertedSQL(filter string) string {
	if rb.info.Target.Mode != backfilltype.History {
		return SQLf(`DELETE FROM {target} t WHERE t.{ib} = $1 AND (t.{ub} IS NOT DISTINCT FROM $1 OR $2) AND {filter}`,
			"target", rb.target, "ib", rb.inserted, "ub", rb.updated, "filter", filter)
	}
	return SQLf(`WITH d AS (DELETE FROM {target} t WHERE t.{ib} = $1 AND (t.{ub} IS NOT DISTINCT FROM $1 OR $2) AND {filter} RETURNING {key} AS key)
INSERT INTO backfill_rollback_keys SELECT key FROM d`,
		"target", rb.target, "ib", rb.inserted, "ub", rb.updated, "filter", filter, "key", keyJSON("t", rb.identity))
}

// retileKeys lists the History keys the undo log of chunk $2 of batch $1
// (every chunk for $2 < 0) touched or whose rows the rollback deleted.
func (rb *pgRollback) retileKeys() string {
	return SQLf(`SELECT DISTINCT {rkey} FROM (
	SELECT u.key FROM {entries} u
	UNION ALL SELECT k.key FROM backfill_rollback_keys k) u
CROSS JOIN LATERAL {record}`,
		"entries", rb.allEntries(), "record", rb.keyRecord("u.key", "r"), "rkey", sqlgen.List("r.", rb.info.Target.Key))
}

// RetileSQL recomputes valid_to of the versions of retileKeys: each ends
// where the next version of its key starts.
func (rb *pgRollback) RetileSQL() string {
	t := rb.info.Target
	return SQLf(`WITH x AS (SELECT {key}, {vf}, lead({vf}) OVER (PARTITION BY {key} ORDER BY {vf}) AS _backfill_next_from
	FROM {target} WHERE ({key}) IN ({keys}))
UPDATE {target} t SET {vt} = x._backfill_next_from FROM x
WHERE {tx} AND t.{vf} = x.{vf} AND t.{vt} IS DISTINCT FROM x._backfill_next_from`,
		"target", rb.target, "key", sqlgen.List("", t.Key), "vf", sqlgen.Ident(t.ValidFrom), "vt", sqlgen.Ident(t.ValidTo),
		"keys", rb.retileKeys(), "tx", sqlgen.Equal("t", "x", t.Key))
}

// CheckRetiledSQL lists up to 5 keys of retileKeys whose versions overlap
// or leave a gap.
func (rb *pgRollback) CheckRetiledSQL() string {
	t := rb.info.Target
	return SQLf(`SELECT DISTINCT row({key})::text FROM (
	SELECT {key}, {vf}, {vt}, lead({vf}) OVER (PARTITION BY {key} ORDER BY {vf}) AS _backfill_next_from
	FROM {target} WHERE ({key}) IN ({keys})) x
WHERE {vt} IS DISTINCT FROM _backfill_next_from OR {vt} <= {vf} LIMIT 5`,
		"target", rb.target, "key", sqlgen.List("", t.Key), "vf", sqlgen.Ident(t.ValidFrom), "vt", sqlgen.Ident(t.ValidTo),
		"keys", rb.retileKeys())
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
		defs[i] = sqlgen.Ident(n) + " " + rb.KeyTypes[n]
	}
	return SQLf("jsonb_to_record({j}) AS {alias}({defs})", "j", j, "alias", alias, "defs", strings.Join(defs, ", "))
}

// match is the condition that target row t and undo row r (a logged key
// or prior image) have the same identity.
func (rb *pgRollback) match() string { return sqlgen.Equal("t", "r", rb.identity) }

// entries is the undo log of batch $1 and the chunks seqs (an SQL
// expression of type int[]), with key arrays ("inserts") expanded to one
// row per inserted key: (batch_id, seq, id, op, key, before). The chunks'
// entries are read by one lookup of the undo log's primary key per chunk
// (LATERAL with OFFSET 0): as seq = ANY (seqs), the planner, whose
// estimates of a fresh undo log are tiny, read every entry of the batch
// for each chunk and filtered on seq, which made a rollback by chunk
// quadratic in the batch.
func (rb *pgRollback) entries(seqs string) string {
	return SQLf(`(SELECT u.* FROM unnest({seqs}) AS _backfill_s(seq) CROSS JOIN LATERAL (
	SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM {undo} u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'inserts'
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM {undo} u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op IN ('insert', 'update')
	OFFSET 0) u)`, "undo", rb.undo, "seqs", seqs)
}

// updates is the undo log's prior images (key, id, before) of batch $1
// and the chunks $2 (int[]), one lookup per chunk as in entries.
func (rb *pgRollback) updates() string {
	return SQLf(`(SELECT u.* FROM unnest($2::int[]) AS _backfill_s(seq)
	CROSS JOIN LATERAL (SELECT u.key, u.id, u.before FROM {undo} u WHERE u.batch_id = $1 AND u.seq = _backfill_s.seq AND u.op = 'update' OFFSET 0) u)`,
		"undo", rb.undo)
}

// allEntries is entries of every chunk of batch $1 whose seq is $2, or of
// every chunk for $2 < 0.
func (rb *pgRollback) allEntries() string {
	return SQLf(`(SELECT u.batch_id, u.seq, u.id, 'insert' AS op, e.key, NULL::jsonb AS before
	FROM {undo} u CROSS JOIN LATERAL jsonb_array_elements(u.key) AS e(key) WHERE u.op = 'inserts' AND u.batch_id = $1 AND (u.seq = $2 OR $2 < 0)
	UNION ALL
	SELECT u.batch_id, u.seq, u.id, u.op, u.key, u.before FROM {undo} u WHERE u.op IN ('insert', 'update') AND u.batch_id = $1 AND (u.seq = $2 OR $2 < 0))`, "undo", rb.undo)
}

// InsertedFilter returns an SQL condition on target alias t that selects
// the rows of one chunk by the plan's ChunkColumn, with its bind
// parameters numbered from first; "true" for a whole batch (chunk nil).
func (rb *pgRollback) InsertedFilter(chunk *backfilltype.ChunkState, first int) (string, []any) {
	if chunk == nil {
		return "true", nil
	}
	if rb.ChunkColumn == "" {
		// No column to find them by: Rollback refuses a chunk that
		// inserted rows without one, so there are none to find.
		return "false", nil
	}
	col := "t." + sqlgen.Ident(rb.ChunkColumn)
	p := func(i int) string { return fmt.Sprintf("$%d", first+i) }
	c := chunk.Chunk
	switch c.Kind {
	case backfilltype.KindTime:
		var base string
		for _, x := range rb.info.Columns {
			if x.Name == rb.ChunkColumn {
				base = x.BaseType
			}
		}
		if base == "timestamp" || base == "date" {
			return SQLf("{col} >= ({lo}::timestamptz AT TIME ZONE {zone})::{type} AND {col} < ({hi}::timestamptz AT TIME ZONE {zone})::{type}",
				"col", col, "lo", p(0), "hi", p(1), "zone", p(2), "type", base), []any{c.Start, c.End, cmp.Or(rb.Zone, "UTC")}
		}
		return fmt.Sprintf("%s >= %s AND %s < %s", col, p(0), col, p(1)), []any{c.Start, c.End}
	case backfilltype.KindInt:
		return fmt.Sprintf("%s >= %s AND %s < %s", col, p(0), col, p(1)), []any{c.Lo, c.Hi}
	default:
		return fmt.Sprintf("%s = %s", col, p(0)), []any{c.Item}
	}
}

// DeliveredSQL lists (n, deleted, batches, key, by) the rows a rollback
// of batch $1 would delete or restore that a done chunk of another batch,
// not in $3, delivered unchanged (batches: the delivering batches of all
// of them): for the whole batch, or for oneChunk the
// chunks $4, whose inserted rows filter selects (bind parameters from
// $5). $2 is the identity's column names.
func (rb *pgRollback) DeliveredSQL(oneChunk bool, filter string) string {
	identity := rb.identity
	// The delivering chunk's bounds, as columns _backfill_lo_<i> and
	// _backfill_hi_<i> of d (boundCols; see keyRecord for why not a whole
	// target row).
	lo := func(alias, bound string) string {
		parts := make([]string, len(identity))
		for i := range identity {
			parts[i] = fmt.Sprintf("%s._backfill_%s_%d", alias, bound, i)
		}
		return "ROW(" + strings.Join(parts, ", ") + ")"
	}
	boundCols := func(bound string) string {
		parts := make([]string, len(identity))
		for i, c := range identity {
			parts[i] = fmt.Sprintf("%s.%s AS _backfill_%s_%d", bound, sqlgen.Ident(c), bound, i)
		}
		return strings.Join(parts, ", ")
	}
	tid := "ROW(" + sqlgen.List("t.", identity) + ")"
	// inRange: t lies within the delivering chunk's identity bounds, or
	// the chunk used another identity (a job with another Key on the same
	// table) and every row of the batch counts.
	// (Apart for the lookups into the target: an OR of the two would not
	// be an index condition, and each chunk would read the whole target.)
	ranged := SQLf("{tid} >= {lo} AND {tid} <= {hi}", "tid", tid, "lo", lo("d", "lo"), "hi", lo("d", "hi"))
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
		undoBranch = SQLf(`
	UNION ALL
	SELECT {key}, d.batch_id, false FROM {entries} u CROSS JOIN LATERAL {record}
	JOIN {target} t ON {match}
	JOIN d ON {inRange}
	WHERE t.{ub} = $1`,
			"key", keyJSON("t", identity), "entries", rb.entries("$4::int[]"), "target", rb.target, "match", rb.match(), "inRange", inRange,
			"ub", rb.updated, "record", rb.keyRecord("u.key", "r"))
	}
	return SQLf(`WITH d AS MATERIALIZED (
	SELECT d.batch_id, d.key_columns = $2::text[] AS ranged, {loCols}, {hiCols}
	FROM {delivered} d JOIN {chunks} c ON c.batch_id = d.batch_id AND c.seq = d.seq
	LEFT JOIN LATERAL {loRecord} ON true LEFT JOIN LATERAL {hiRecord} ON true
	WHERE d.owner = $1 AND d.batch_id <> $1 AND c.status IN ('done', 'open') AND d.batch_id <> ALL ($3::bigint[])),
hit AS (
	SELECT {key} AS key, d.batch_id AS by, t.{ib} = $1 AS del
	FROM d CROSS JOIN LATERAL (SELECT * FROM {target} t WHERE t.{ub} = $1 AND {ranged} AND {whole} OFFSET 0) t
	WHERE d.ranged
	UNION ALL
	SELECT {key}, d.batch_id, t.{ib} = $1
	FROM (SELECT DISTINCT d.batch_id FROM d WHERE NOT d.ranged) d CROSS JOIN LATERAL (SELECT * FROM {target} t WHERE t.{ub} = $1 AND {whole} OFFSET 0) t{undoBranch}),
x AS (SELECT DISTINCT ON (key) key, by, del FROM hit ORDER BY key, by)
SELECT count(*) OVER () AS n, count(*) FILTER (WHERE del) OVER () AS deleted, (SELECT array_agg(DISTINCT x.by) FROM x) AS batches,
	key::text AS key, by
FROM x ORDER BY key::text LIMIT 100`,
		"target", rb.target, "delivered", rb.m.SQL("{s}.delivered"), "chunks", rb.m.SQL("{s}.chunks"), "key", keyJSON("t", identity),
		"ib", rb.inserted, "ub", rb.updated, "ranged", ranged, "whole", whole, "undoBranch", undoBranch,
		"loCols", boundCols("lo"), "hiCols", boundCols("hi"),
		"loRecord", rb.keyRecord("CASE WHEN d.key_columns = $2::text[] THEN d.lo END", "lo"),
		"hiRecord", rb.keyRecord("CASE WHEN d.key_columns = $2::text[] THEN d.hi END", "hi"))
}

// RecordDeliveredSQL summarises the staged rows the target holds as last
// written by another batch: one row per owner in the delivered table,
// with the least and greatest identity ($1 batch, $2 chunk, $3 the
// identity's column names).
func (s *PGStager) RecordDeliveredSQL() string {
	t := s.Info.Target
	identity := s.Info.Identity()
	// The least and greatest identity per owner: one window over the
	// found rows (first_value/last_value of each identity column), the
	// JSON built for those two rows only. The target is looked up once
	// per staged row (LATERAL with OFFSET 0, as in the History merge):
	// as a plain join, once the target is analysed, the planner may read
	// the whole target in index order against every staged row to save
	// the window's sort, which grows with the target, not the chunk.
	rows := SQLf(`SELECT t.* FROM {stage} s CROSS JOIN LATERAL (
		SELECT {tid}, t.{ub} AS _backfill_owner FROM {target} t WHERE {ts} OFFSET 0) t
		WHERE t._backfill_owner <> $1::bigint`,
		"stage", s.Q.Stage, "target", sqlgen.Table(t.Table), "tid", sqlgen.List("t.", identity),
		"ub", sqlgen.Ident(t.Lineage.UpdatedBy), "ts", sqlgen.Equal("t", "s", identity))
	return DeliveredSummarySQL(s.Info.Chunk.DeliveredTable, identity, rows)
}

// DeliveredSummarySQL inserts into the delivered table one row per owner
// batch of rows (a query of the identity columns and _backfill_owner, the
// rows' lineage UpdatedBy, other than $1): how many, and the least and
// greatest identity ($1 batch, $2 chunk, $3 the identity's column names,
// further parameters rows's own). A merged chunk's stager and a skipped
// chunk record their deliveries with it.
//
// The rows are read once (x). With few owners, the usual case (one per
// earlier batch that wrote the chunk's rows), each owner's least and
// greatest identity are two top-1 scans of x (a bounded heap, one
// comparison per row), not a sort of every row by owner and identity and
// a window over it, which cost several times more on a skipped chunk.
// With more than deliveredFewOwners owners, whose scans would add up,
// one sort and window do it (the other branch, gated off by its
// one-time filter). o stops at one owner more than the top-1 branch
// takes: the planner then expects few owners, not its default of 200,
// whose estimated scans would cost the statement a JIT compilation
// longer than its run.
func DeliveredSummarySQL(delivered string, identity []string, rows string) string {
	ctes, insert := deliveredSummaryParts(delivered, identity, rows)
	return "WITH " + ctes + "\n" + insert
}

// deliveredSummaryParts returns DeliveredSummarySQL's two parts: its
// common table expressions (x, the rows, and o), and the INSERT that
// reads them, so that another statement (the Upsert merge) can take
// both into its own WITH.
func deliveredSummaryParts(delivered string, identity []string, rows string) (ctes, insert string) {
	lo, hi := make([]string, len(identity)), make([]string, len(identity))
	loJSON, hiJSON := make([]string, len(identity)), make([]string, len(identity))
	topLo, topHi := make([]string, len(identity)), make([]string, len(identity))
	desc := make([]string, len(identity))
	for i, c := range identity {
		lo[i] = fmt.Sprintf("first_value(x.%s) OVER w AS _backfill_lo_%d", sqlgen.Ident(c), i)
		hi[i] = fmt.Sprintf("last_value(x.%s) OVER w AS _backfill_hi_%d", sqlgen.Ident(c), i)
		loJSON[i] = fmt.Sprintf("%s, y._backfill_lo_%d", pq.QuoteLiteral(c), i)
		hiJSON[i] = fmt.Sprintf("%s, y._backfill_hi_%d", pq.QuoteLiteral(c), i)
		topLo[i] = fmt.Sprintf("x.%s AS _backfill_lo_%d", sqlgen.Ident(c), i)
		topHi[i] = fmt.Sprintf("x.%s AS _backfill_hi_%d", sqlgen.Ident(c), i)
		desc[i] = "x." + sqlgen.Ident(c) + " DESC"
	}
	ctes = SQLf(`x AS MATERIALIZED ({rows}),
o AS MATERIALIZED (SELECT x._backfill_owner, count(*) AS _backfill_n FROM x GROUP BY x._backfill_owner LIMIT {few} + 1)`,
		"rows", rows, "few", strconv.Itoa(deliveredFewOwners))
	insert = SQLf(`INSERT INTO {delivered} (owner, batch_id, seq, key_columns, lo, hi, row_count)
SELECT y._backfill_owner, $1::bigint, $2::int, $3::text[], jsonb_build_object({loJSON}), jsonb_build_object({hiJSON}), y._backfill_n FROM (
	SELECT o._backfill_owner, o._backfill_n, l.*, h.* FROM o
	CROSS JOIN LATERAL (SELECT {topLo} FROM x WHERE x._backfill_owner = o._backfill_owner ORDER BY {xid} LIMIT 1) l
	CROSS JOIN LATERAL (SELECT {topHi} FROM x WHERE x._backfill_owner = o._backfill_owner ORDER BY {desc} LIMIT 1) h
	WHERE (SELECT count(*) FROM o) <= {few}
	UNION ALL
	SELECT * FROM (
		SELECT DISTINCT ON (x._backfill_owner) x._backfill_owner, count(*) OVER w AS _backfill_n, {lo}, {hi}
		FROM x
		WINDOW w AS (PARTITION BY x._backfill_owner ORDER BY {xid} ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
		ORDER BY x._backfill_owner) z
	WHERE (SELECT count(*) FROM o) > {few}) y`,
		"delivered", delivered, "lo", strings.Join(lo, ", "),
		"hi", strings.Join(hi, ", "), "loJSON", strings.Join(loJSON, ", "), "hiJSON", strings.Join(hiJSON, ", "),
		"xid", sqlgen.List("x.", identity), "desc", strings.Join(desc, ", "),
		"topLo", strings.Join(topLo, ", "), "topHi", strings.Join(topHi, ", "), "few", strconv.Itoa(deliveredFewOwners))
	return ctes, insert
}

// deliveredFewOwners is the most owners of a chunk's delivered rows whose
// bounds DeliveredSummarySQL finds by top-1 scans rather than one sort.
const deliveredFewOwners = 8
