package pgstore

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
)

var _ backfilldriver.ManifestSkips = (*Manifest)(nil)

// CompleteChunkFingerprinted implements [ManifestSkips]: the checkpoint
// statement of CompleteChunk also sets the chunk row's fingerprints, skip key
// and skipped marker (migration 19), in the chunk's transaction.
func (m *Manifest) CompleteChunkFingerprinted(ctx context.Context, tx sqlx.ExtContext, batchID int64, r backfilltype.ChunkResult, exceptions []backfilltype.Exception, fp backfilldriver.ChunkFingerprints) error {
	return m.completeChunk(ctx, tx, batchID, r, exceptions, fp)
}

// BaseFingerprints implements [backfilldriver.ManifestSkips] in one
// statement: the job's runs by runs_job, each run's chunk by its (batch_id,
// chunk_id) key.
func (m *Manifest) BaseFingerprints(ctx context.Context, tx sqlx.ExtContext, job, skipKey string, batchID int64, chunkID string) (backfilldriver.ChunkFingerprints, bool, error) {
	var rows []struct {
		BatchID int64          `db:"batch_id"`
		Source  sql.NullString `db:"source_fingerprint"`
		Target  sql.NullString `db:"target_fingerprint"`
		Version sql.NullString `db:"source_version"`
		Seq     int            `db:"seq"`
		Skipped bool           `db:"skipped"`
		backfilltype.Counts
	}
	err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT c.batch_id, c.source_fingerprint, c.target_fingerprint, c.source_version, c.seq, c.skipped,
		c.rows_read, c.rows_inserted, c.rows_updated, c.rows_unchanged, c.rows_rejected, c.rows_deduplicated
		FROM {s}.runs r JOIN {s}.chunks c ON c.batch_id = r.batch_id AND c.chunk_id = $3
		WHERE r.job_name = $1 AND c.skip_key = $2 AND r.batch_id <> $4 AND r.status <> 'rolled_back' AND c.status = 'done'
		ORDER BY r.batch_id DESC LIMIT 1`), job, skipKey, chunkID, batchID)
	if err != nil {
		return backfilldriver.ChunkFingerprints{}, false, fmt.Errorf("backfill: chunk %s: base fingerprints: %w", chunkID, err)
	}
	if len(rows) == 0 || !rows[0].Source.Valid || !rows[0].Target.Valid {
		return backfilldriver.ChunkFingerprints{}, false, nil
	}
	b := rows[0]
	return backfilldriver.ChunkFingerprints{BatchID: b.BatchID, SkipKey: skipKey, Source: b.Source.String, Target: b.Target.String, Version: b.Version.String, Counts: b.Counts, Seq: b.Seq, Skipped: b.Skipped}, true, nil
}

// nullIfEmpty is s, or NULL when s is "".
func nullIfEmpty(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

// CopyDelivered records the delivered summary of chunk seq of batch
// batchID, skipped in tx on the fingerprints of base chunk baseSeq of
// batch baseBatch, a chunk skipped too, by copying the base's summary
// (in delivered, the manifest's delivered table) instead of reading the
// chunk's target rows. It copies only when the base's rows are a
// complete summary of rows target rows: every row of it is of the
// identity columns identity, its owners other than batchID, and its
// counts add up to rows. It reports whether it copied; when it did not
// (nothing written), the caller reads the rows.
//
// The caller proves, by a tuple fingerprint (any write to a row changes
// it) equal to the one the base recorded, that the chunk's target rows
// are the row versions the base's fingerprint saw, lineage included, so
// that their owners, counts and bounds are the base's. The counts check
// catches a base whose summary left rows out (those its own batch
// owned, which this batch reports) or was read from other rows than
// its fingerprint.
func CopyDelivered(ctx context.Context, tx sqlx.ExtContext, delivered string, batchID int64, seq int, baseBatch int64, baseSeq int, identity []string, rows int64) (bool, error) {
	res, err := tx.ExecContext(ctx, `WITH b AS MATERIALIZED (
	SELECT d.owner, d.key_columns, d.lo, d.hi, d.row_count FROM `+delivered+` d WHERE d.batch_id = $3 AND d.seq = $4)
INSERT INTO `+delivered+` (owner, batch_id, seq, key_columns, lo, hi, row_count)
SELECT b.owner, $1, $2, b.key_columns, b.lo, b.hi, b.row_count FROM b
WHERE (SELECT bool_and(b.key_columns = $5::text[] AND b.owner <> $1) AND sum(b.row_count) = $6 FROM b)`,
		batchID, seq, baseBatch, baseSeq, pq.Array(identity), rows)
	if err != nil {
		return false, fmt.Errorf("backfill: chunk %d: copy the delivered summary of batch %d: %w", seq, baseBatch, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("backfill: chunk %d: copy the delivered summary of batch %d: %w", seq, baseBatch, err)
	}
	return n > 0, nil
}
