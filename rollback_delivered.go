package backfill

import (
	"context"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// Unchanged deliveries and rollback.
//
// Lineage records only the batches that changed a row: a row that a later
// batch delivered unchanged still names the batch that wrote it. Batch 1
// writes {1: 'same', 2: 'old'}, batch 2 (a restatement, or another job on
// the same target) writes {1: 'same', 3: 'new'}: key 1 says batch 1, and a
// rollback of batch 1 that trusted lineage alone would delete it (or, had
// batch 1 updated it, restore an image older than what batch 2 delivered)
// although batch 2, still applied, says it exists as it is.
//
// Three ways to know better were weighed:
//
//   - A per-row entry for each unchanged row whose last writer is another
//     batch (the undo log's way). Exact, but a restatement of an unchanged
//     range by a new batch, the common case, would write one entry per row:
//     WAL in proportion to the data, where a replay must write almost none.
//   - At rollback time only: treat every row inside the bounds of a later
//     batch's done chunk as delivered by it. No write at all, but it cannot
//     tell a row the later batch delivered from one it no longer had (key 2
//     above, which a restatement dropped), and a job without ChunkColumn has
//     no bounds: every row of the target would be "delivered".
//   - A summary per chunk (chosen): after the merge, in the chunk's
//     transaction, one read of the chunk's staged identities against the
//     target finds the rows the chunk delivered that another batch last
//     wrote (lineage UpdatedBy not this batch), and records for each such
//     owner batch one row in the manifest's delivered table: the owner,
//     how many rows, and the least and greatest identity among them. Only
//     chunks with unchanged rows run the read; a first load writes nothing
//     more, and a replay writes one small row per chunk and owner, not per
//     row.
//
// A rollback of batch B then treats a row it would delete or restore as
// delivered by batch D when a done chunk of D recorded owner B and the
// row's identity lies within that chunk's least and greatest identity.
// This is exact about which batches delivered rows of B (and when: the
// summary was taken after B wrote them), and conservative inside the
// identity bounds: a row of B between two rows D delivered, which D did not
// deliver itself, is reported too. Such a row is listed, never silently
// removed; Force removes it. Chunks whose batch or chunk was rolled back
// no longer count, so rolling back D first and then B works as before.
// Rows that the same batch's own chunks delivered again (overlapping chunk
// bounds) are not summarised.

// recordDelivered summarises, after a merge, the staged rows that exist in
// the target last written by another batch (the chunk delivered them
// unchanged, or a conflict policy kept the target's version): one row per
// owner batch in info.Chunk.DeliveredTable. It does nothing without
// unchanged rows, lineage or a delivered table.
func (s *pgStager) recordDelivered(ctx context.Context, unchanged int64) error {
	t := s.info.Target
	if unchanged <= 0 || s.info.Chunk.DeliveredTable == "" || t.Lineage.UpdatedBy == "" {
		return nil
	}
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
	q := fmt.Sprintf(`INSERT INTO %[1]s (owner, batch_id, seq, key_columns, lo, hi, row_count)
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
	if _, err := s.tx.ExecContext(ctx, q, s.info.Chunk.BatchID, s.info.Chunk.Seq, pq.Array(identity)); err != nil {
		return fmt.Errorf("backfill: merge %s: record unchanged deliveries: %w", t.Table, err)
	}
	return nil
}

// RollbackConflict is one row a rollback would delete or restore although
// a later batch that is still applied changed or delivered it.
type RollbackConflict struct {
	// Key is the row's identity (business key, plus ValidFrom in History
	// mode) as JSON, e.g. {"id": 1}.
	Key string
	// Batch is the later batch: the one that last changed the row
	// (lineage UpdatedBy), or the one that delivered it unchanged.
	Batch int64
	// Delivered is true when the later batch delivered the row unchanged
	// (lineage does not show it; see [RollbackOptions.Force]), false when
	// it changed the row.
	Delivered bool
}

// String renders the conflict for messages: `{"id": 1} (delivered
// unchanged by batch 2)`.
func (c RollbackConflict) String() string {
	if c.Delivered {
		return fmt.Sprintf("%s (delivered unchanged by batch %d)", c.Key, c.Batch)
	}
	return fmt.Sprintf("%s (changed by batch %d)", c.Key, c.Batch)
}

// delivered finds the rows that rolling back the chunks seqs of batch
// (one chunk, or the whole batch when chunk is nil) would delete or
// restore and that a done chunk of another batch, not in exclude,
// delivered unchanged (see recordDelivered). It returns how many, how many
// of them the rollback would delete (the rest it would restore), and up
// to 100 of them ordered by key.
func (rb *pgRollback) delivered(ctx context.Context, db sqlx.ExtContext, batch int64, seqs []int, chunk *ChunkState, exclude []int64) (n, deleted int64, rows []RollbackConflict, err error) {
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
	ranged := fmt.Sprintf("%[1]s >= %[2]s AND %[1]s <= %[3]s", tid, lo("d", "lo"), lo("d", "hi"))
	inRange := "(NOT d.ranged OR (" + ranged + "))"
	// The rows the rollback would touch that batch last wrote: for a whole
	// batch every row whose UpdatedBy is batch (inserted or updated by
	// it); for one chunk, those it inserted within the chunk's bounds,
	// then those its undo log names.
	filter, fargs := rb.insertedFilter(chunk, 5)
	whole := "true"
	if chunk != nil {
		whole = "t." + rb.inserted + " = $1 AND " + filter
	}
	var undoBranch string
	if chunk != nil {
		undoBranch = fmt.Sprintf(`
			UNION ALL
			SELECT %[1]s, d.batch_id, false FROM %[2]s u CROSS JOIN LATERAL %[7]s
			JOIN %[3]s t ON %[4]s
			JOIN d ON %[5]s
			WHERE u.batch_id = $1 AND u.seq = ANY ($4::int[]) AND t.%[6]s = $1`,
			keyJSON("t", identity), rb.entries(), rb.target, rb.match(), inRange, rb.updated, rb.keyRecord("u.key", "r"))
	}
	q := fmt.Sprintf(`WITH d AS MATERIALIZED (
			SELECT d.batch_id, d.key_columns = $2::text[] AS ranged, %[10]s, %[11]s
			FROM %[2]s d JOIN %[3]s c ON c.batch_id = d.batch_id AND c.seq = d.seq
			LEFT JOIN LATERAL %[12]s ON true LEFT JOIN LATERAL %[13]s ON true
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
		ranged, whole, undoBranch, boundCols("lo"), boundCols("hi"),
		rb.keyRecord("CASE WHEN d.key_columns = $2::text[] THEN d.lo END", "lo"), rb.keyRecord("CASE WHEN d.key_columns = $2::text[] THEN d.hi END", "hi"))
	var res []struct {
		N       int64  `db:"n"`
		Deleted int64  `db:"deleted"`
		Key     string `db:"key"`
		By      int64  `db:"by"`
	}
	// $1 batch, $2 identity, $3 exclude; for one chunk $4 seqs and the
	// chunk's bounds from $5.
	args := []any{batch, pq.Array(identity), pq.Array(append([]int64{}, exclude...))}
	if chunk != nil {
		args = append(append(args, pq.Array(seqs)), fargs...)
	}
	if err := sqlx.SelectContext(ctx, db, &res, q, args...); err != nil {
		return 0, 0, nil, fmt.Errorf("backfill: rollback %s: rows delivered by later batches: %w", rb.info.Target.Table, err)
	}
	if len(res) == 0 {
		return 0, 0, nil, nil
	}
	for _, r := range res {
		rows = append(rows, RollbackConflict{Key: r.Key, Batch: r.By, Delivered: true})
	}
	return res[0].N, res[0].Deleted, rows, nil
}
