package pgstore

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jmoiron/sqlx"
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
		backfilltype.Counts
	}
	err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT c.batch_id, c.source_fingerprint, c.target_fingerprint, c.source_version,
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
	return backfilldriver.ChunkFingerprints{BatchID: b.BatchID, SkipKey: skipKey, Source: b.Source.String, Target: b.Target.String, Version: b.Version.String, Counts: b.Counts}, true, nil
}

// nullIfEmpty is s, or NULL when s is "".
func nullIfEmpty(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }
