package backfilltest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

// chunkStaged is the status of a chunk checkpointed by StageChunk, as
// [backfill.PGManifest] records it.
const chunkStaged backfill.ChunkStatus = "staged"

var _ backfilldriver.ManifestStaging = (*Manifest)(nil)

// StagingTable implements [backfilldriver.ManifestStaging.StagingTable]: a name
// for [Merger]'s persistent staging of the batch.
func (m *Manifest) StagingTable(batchID int64) string { return fmt.Sprintf("stage_%d", batchID) }

// StageChunk implements [backfilldriver.ManifestStaging.StageChunk]; in a fake
// transaction the checkpoint is applied on commit.
func (m *Manifest) StageChunk(ctx context.Context, tx sqlx.ExtContext, p backfilldriver.StageChunkParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.Read != p.Rejected+p.Staged {
		return fmt.Errorf("backfill: stage chunk %s: %w: read %d != staged %d + rejected %d", p.Chunk.ID, backfill.ErrAccounting, p.Read, p.Staged, p.Rejected)
	}
	m.mu.Lock()
	r, err := m.get(p.BatchID)
	if err == nil && (p.Chunk.Seq < 0 || p.Chunk.Seq >= len(r.chunks) || r.chunks[p.Chunk.Seq].Status != backfill.ChunkPending) {
		err = fmt.Errorf("backfill: stage chunk %s of batch %d: chunk is not pending", p.Chunk.ID, p.BatchID)
	}
	m.mu.Unlock()
	if err != nil {
		return err
	}
	ex := slices.Clone(p.Exceptions)
	now := time.Now()
	for i := range ex {
		ex[i].BatchID, ex[i].ChunkID, ex[i].CreatedAt = p.BatchID, p.Chunk.ID, now
	}
	return apply(tx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		st := &r.chunks[p.Chunk.Seq]
		st.Status = chunkStaged
		st.Counts = backfill.Counts{Read: p.Read, Rejected: p.Rejected}
		if r.staged == nil {
			r.staged = map[int]int64{}
		}
		r.staged[p.Chunk.Seq] = p.Staged
		r.exceptions = append(r.exceptions, ex...)
	})
}

// StagedChunks implements [backfilldriver.ManifestStaging.StagedChunks]. tx
// must be a fake [*Tx]: the chunks stay claimed by it until it ends, and
// chunks another transaction holds are left out (PostgreSQL waits for
// that transaction, after which they are no longer staged).
func (m *Manifest) StagedChunks(ctx context.Context, tx sqlx.ExtContext, batchID int64) ([]backfilldriver.StagedChunk, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ftx, ok := tx.(*Tx)
	if !ok {
		return nil, fmt.Errorf("backfilltest: staged chunks: executor %T is not a *backfilltest.Tx", tx)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return nil, err
	}
	var out []backfilldriver.StagedChunk
	for i, c := range r.chunks {
		if c.Status != chunkStaged {
			continue
		}
		if owner, held := r.locked[i]; held && owner != ftx {
			continue
		}
		r.locked[i] = ftx
		seq := i
		ftx.OnEnd(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			if r.locked[seq] == ftx {
				delete(r.locked, seq)
			}
		})
		out = append(out, backfilldriver.StagedChunk{Seq: i, Read: c.Read, Rejected: c.Rejected, Staged: r.staged[i]})
	}
	return out, nil
}
