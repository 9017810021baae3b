package backfill

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// The fingerprints of replays that skip unchanged chunks
// ([Job.SkipUnchanged], replay_skip.go) on the manifest's chunk rows.

// ManifestSkips is implemented by manifests that record, with a chunk's
// checkpoint, the fingerprints a later replay compares to skip the chunk
// ([Job.SkipUnchanged]), and look them up. [PGManifest] and
// backfilltest's Manifest do. A job with SkipUnchanged needs it
// ([ErrUnsupported] otherwise, before any work).
type ManifestSkips interface {
	// CompleteChunkFingerprinted is [Manifest.CompleteChunk] that also
	// records fp (its Source and Target; BatchID is ignored) on the
	// chunk's row, in the same transaction tx (PGManifest: in the same
	// statement), so that a crash loses the checkpoint and the
	// fingerprints together. A zero fp records none (and clears any).
	CompleteChunkFingerprinted(ctx context.Context, tx sqlx.ExtContext, batchID int64, r ChunkResult, exceptions []Exception, fp ChunkFingerprints) error
	// BaseFingerprints returns the fingerprints recorded by the newest
	// done chunk chunkID of a run of job whose plan fingerprint is plan,
	// in a batch other than batchID, whose run is not rolled back (a
	// rolled back chunk is not done). ok is false when there is no such
	// chunk or it recorded none: the newest such chunk is the base, never
	// an older one. It reads in tx, the chunk's transaction.
	BaseFingerprints(ctx context.Context, tx sqlx.ExtContext, job, plan string, batchID int64, chunkID string) (fp ChunkFingerprints, ok bool, err error)
}

// ChunkFingerprints are the fingerprints a load recorded for one chunk
// ([ManifestSkips]): of the chunk's converted source rows, and of its
// target rows after the merge, as opaque text ("" for none).
type ChunkFingerprints struct {
	// BatchID is the batch whose checkpoint recorded them (set by
	// BaseFingerprints).
	BatchID int64
	// Source is the multiset hash of the chunk's staged source rows, in
	// the form "rows:lane0:lane1" (hexadecimal lanes).
	Source string
	// Target is the multiset hash of the target rows within the chunk's
	// ChunkColumn bounds after the merge, in the form "rows:sum".
	Target string
}

// IsZero reports whether fp records nothing.
func (fp ChunkFingerprints) IsZero() bool { return fp.Source == "" && fp.Target == "" }

// migrationSkips is manifest migration 19: the fingerprints of a chunk's
// source rows and of its target rows after its merge, written by the
// chunk's checkpoint statement (NULL when the load did not qualify, see
// replay_skip.go).
const migrationSkips = `
ALTER TABLE {s}.chunks ADD COLUMN source_fingerprint text, ADD COLUMN target_fingerprint text;
COMMENT ON COLUMN {s}.chunks.source_fingerprint IS
	'Multiset hash of the chunk''s staged source rows (rows:lane0:lane1), recorded when its merge took every staged row; a replay with SkipUnchanged compares it.';
COMMENT ON COLUMN {s}.chunks.target_fingerprint IS
	'Multiset hash of the target rows within the chunk''s ChunkColumn bounds after its merge (rows:sum), recorded with source_fingerprint.';
`

var _ ManifestSkips = (*PGManifest)(nil)

// CompleteChunkFingerprinted implements [ManifestSkips]: the checkpoint
// statement of CompleteChunk sets the two columns.
func (m *PGManifest) CompleteChunkFingerprinted(ctx context.Context, tx sqlx.ExtContext, batchID int64, r ChunkResult, exceptions []Exception, fp ChunkFingerprints) error {
	return m.completeChunk(ctx, tx, batchID, r, exceptions, fp)
}

// BaseFingerprints implements [ManifestSkips] in one statement: the
// job's runs by runs_job, each run's chunk by its (batch_id, chunk_id)
// key.
func (m *PGManifest) BaseFingerprints(ctx context.Context, tx sqlx.ExtContext, job, plan string, batchID int64, chunkID string) (ChunkFingerprints, bool, error) {
	var rows []struct {
		BatchID int64          `db:"batch_id"`
		Source  sql.NullString `db:"source_fingerprint"`
		Target  sql.NullString `db:"target_fingerprint"`
	}
	err := sqlx.SelectContext(ctx, tx, &rows, m.sql(`SELECT c.batch_id, c.source_fingerprint, c.target_fingerprint
		FROM {s}.runs r JOIN {s}.chunks c ON c.batch_id = r.batch_id AND c.chunk_id = $3
		WHERE r.job_name = $1 AND r.plan_fingerprint = $2 AND r.batch_id <> $4 AND r.status <> 'rolled_back' AND c.status = 'done'
		ORDER BY r.batch_id DESC LIMIT 1`), job, plan, chunkID, batchID)
	if err != nil {
		return ChunkFingerprints{}, false, fmt.Errorf("backfill: chunk %s: base fingerprints: %w", chunkID, err)
	}
	if len(rows) == 0 || !rows[0].Source.Valid || !rows[0].Target.Valid {
		return ChunkFingerprints{}, false, nil
	}
	return ChunkFingerprints{BatchID: rows[0].BatchID, Source: rows[0].Source.String, Target: rows[0].Target.String}, true, nil
}

// nullIfEmpty is s, or NULL when s is "".
func nullIfEmpty(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }
