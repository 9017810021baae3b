package backfilltest

import (
	"context"

	"github.com/pgbackfill/backfill/backfilldriver"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

var _ backfilldriver.ManifestSkips = (*Manifest)(nil)

// CompleteChunkFingerprinted implements
// [backfilldriver.ManifestSkips.CompleteChunkFingerprinted]: CompleteChunk,
// recording fp on the chunk when the fake transaction commits.
func (m *Manifest) CompleteChunkFingerprinted(ctx context.Context, tx sqlx.ExtContext, batchID int64, res backfill.ChunkResult, exceptions []backfill.Exception, fp backfilldriver.ChunkFingerprints) error {
	return m.completeChunk(ctx, tx, batchID, res, exceptions, fp)
}

// BaseFingerprints implements [backfilldriver.ManifestSkips.BaseFingerprints]
// as PGManifest does: the newest done chunk of the job's runs that
// recorded skipKey, other than batchID, not rolled back.
func (m *Manifest) BaseFingerprints(ctx context.Context, tx sqlx.ExtContext, job, skipKey string, batchID int64, chunkID string) (backfilldriver.ChunkFingerprints, bool, error) {
	if err := ctx.Err(); err != nil {
		return backfilldriver.ChunkFingerprints{}, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := len(m.runs) - 1; i >= 0; i-- {
		r := m.runs[i]
		if r.run.Job != job || r.run.BatchID == batchID || r.run.Status == backfill.RunRolledBack {
			continue
		}
		for _, c := range r.chunks {
			if c.Chunk.ID != chunkID || c.Status != backfill.ChunkDone {
				continue
			}
			fp, ok := r.fingerprints[c.Chunk.Seq]
			if !ok || skipKey == "" || fp.SkipKey != skipKey {
				break
			}
			if fp.IsZero() || fp.Source == "" || fp.Target == "" {
				return backfilldriver.ChunkFingerprints{}, false, nil
			}
			fp.BatchID, fp.Counts, fp.Seq, fp.Skipped = r.run.BatchID, c.Counts, c.Chunk.Seq, c.Skipped
			return fp, true, nil
		}
	}
	return backfilldriver.ChunkFingerprints{}, false, nil
}
