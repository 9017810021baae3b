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
	// records fp (its SkipKey, Source, Target and Version, each "" for
	// none; BatchID and Counts are ignored) on the chunk's row, in the same transaction tx
	// (PGManifest: in the same statement), so that a crash loses the
	// checkpoint and the fingerprints together. It replaces whatever the
	// row recorded before.
	CompleteChunkFingerprinted(ctx context.Context, tx sqlx.ExtContext, batchID int64, r ChunkResult, exceptions []Exception, fp ChunkFingerprints) error
	// BaseFingerprints returns the fingerprints recorded by the newest
	// done chunk chunkID of a run of job that recorded skipKey (its
	// [ChunkFingerprints.SkipKey]), in a batch other than batchID, whose
	// run is not rolled back (a rolled back chunk is not done), whatever
	// the scope or plan fingerprint of that run. ok is false when there
	// is no such chunk or it recorded no Source or Target: the newest
	// such chunk is the base, never an older one. fp carries the base
	// chunk's Version as recorded and its Counts. It reads in tx, the
	// chunk's transaction.
	BaseFingerprints(ctx context.Context, tx sqlx.ExtContext, job, skipKey string, batchID int64, chunkID string) (fp ChunkFingerprints, ok bool, err error)
}

// ChunkFingerprints are the fingerprints a load recorded for one chunk
// ([ManifestSkips]): of the chunk's converted source rows, and of its
// target rows after the merge, as opaque text ("" for none).
type ChunkFingerprints struct {
	// BatchID is the batch whose checkpoint recorded them (set by
	// BaseFingerprints).
	BatchID int64
	// SkipKey is the hex SHA-256 of what determines how the chunk's rows
	// are merged: the run's plan without its scope and chunk IDs, and the
	// target's column types. A later run looks its base up by it, so a
	// run over another scope (part of the range, or more) finds the
	// chunks an earlier run loaded, and a run planned otherwise (another
	// code version, column list, mode, target type...) finds none.
	SkipKey string
	// Source is the multiset hash of the chunk's staged source rows, in
	// the form "v2:rows:lane0:lane1" (the row encoding's version, then
	// hexadecimal lanes; version 1 had no tag). A base recorded under
	// another version never matches: the chunk merges once.
	Source string
	// Target is the multiset hash of the target rows within the chunk's
	// ChunkColumn bounds after the merge: of their row versions (table,
	// ctid and xmin) on a target whose partitions are all heap tables,
	// in the form "tuples:shape:rows:sum" (shape: a hash of the
	// columns' places in the target and the partitions holding the
	// rows), where any write to one of the rows, even of the same values,
	// changes it; otherwise (a column of an enum, range or citext type, a
	// reg* column, a partition not a heap table, or chunk transactions
	// not READ COMMITTED) of their values, in the form "rows:sum".
	Target string
	// Version is the chunk's source version ([ChunkVersioner]) read
	// before the extraction whose rows Source hashes ("" for none); a
	// replay whose version is equal skips the extraction too. Recorded
	// only with Source and Target.
	Version string
	// Counts are the base chunk's counts as checkpointed (set by
	// BaseFingerprints; ignored by CompleteChunkFingerprinted): a replay
	// that skips without extracting takes its Read, and extracts when its
	// Rejected is not 0 (rejects are queued only by an extraction).
	Counts Counts
}

// IsZero reports whether fp records no fingerprint (whatever its
// SkipKey).
func (fp ChunkFingerprints) IsZero() bool { return fp.Source == "" && fp.Target == "" }

var _ ManifestSkips = (*PGManifest)(nil)

// CompleteChunkFingerprinted implements [ManifestSkips]: the checkpoint
// statement of CompleteChunk also sets the chunk row's fingerprints, skip key
// and skipped marker (migration 19), in the chunk's transaction.
func (m *PGManifest) CompleteChunkFingerprinted(ctx context.Context, tx sqlx.ExtContext, batchID int64, r ChunkResult, exceptions []Exception, fp ChunkFingerprints) error {
	return m.completeChunk(ctx, tx, batchID, r, exceptions, fp)
}

// BaseFingerprints implements [ManifestSkips] in one statement: the
// job's runs by runs_job, each run's chunk by its (batch_id, chunk_id)
// key.
func (m *PGManifest) BaseFingerprints(ctx context.Context, tx sqlx.ExtContext, job, skipKey string, batchID int64, chunkID string) (ChunkFingerprints, bool, error) {
	var rows []struct {
		BatchID int64          `db:"batch_id"`
		Source  sql.NullString `db:"source_fingerprint"`
		Target  sql.NullString `db:"target_fingerprint"`
		Version sql.NullString `db:"source_version"`
		Counts
	}
	err := sqlx.SelectContext(ctx, tx, &rows, m.sql(`SELECT c.batch_id, c.source_fingerprint, c.target_fingerprint, c.source_version,
		c.rows_read, c.rows_inserted, c.rows_updated, c.rows_unchanged, c.rows_rejected, c.rows_deduplicated
		FROM {s}.runs r JOIN {s}.chunks c ON c.batch_id = r.batch_id AND c.chunk_id = $3
		WHERE r.job_name = $1 AND c.skip_key = $2 AND r.batch_id <> $4 AND r.status <> 'rolled_back' AND c.status = 'done'
		ORDER BY r.batch_id DESC LIMIT 1`), job, skipKey, chunkID, batchID)
	if err != nil {
		return ChunkFingerprints{}, false, fmt.Errorf("backfill: chunk %s: base fingerprints: %w", chunkID, err)
	}
	if len(rows) == 0 || !rows[0].Source.Valid || !rows[0].Target.Valid {
		return ChunkFingerprints{}, false, nil
	}
	b := rows[0]
	return ChunkFingerprints{BatchID: b.BatchID, SkipKey: skipKey, Source: b.Source.String, Target: b.Target.String, Version: b.Version.String, Counts: b.Counts}, true, nil
}

// nullIfEmpty is s, or NULL when s is "".
func nullIfEmpty(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }
