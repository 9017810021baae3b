package backfilltest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// subchunkKey is a plan chunk: its batch and Seq.
type subchunkKey struct {
	batch int64
	seq   int
}

// Subchunks implements [backfilldriver.ManifestSubchunks.Subchunks].
func (m *Manifest) Subchunks(ctx context.Context, db sqlx.ExtContext, batchID int64, seq int) ([]backfilltype.Subchunk, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.get(batchID); err != nil {
		return nil, err
	}
	return slices.Clone(m.subchunks[subchunkKey{batchID, seq}]), nil
}

// CompleteSubchunk implements
// [backfilldriver.ManifestSubchunks.CompleteSubchunk]: tx must be the
// fake [*Tx] that fenced the chunk; the sub-chunk, its exceptions and the
// lease given back to leaseKey apply when it commits.
func (m *Manifest) CompleteSubchunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, chunkID, leaseKey string, s backfilltype.Subchunk, exceptions []backfilltype.Exception) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !s.Balanced() {
		return fmt.Errorf("backfill: complete sub-chunk [%s, %s) of chunk %s: %w: %+v", s.Lo, s.Hi, chunkID, backfill.ErrAccounting, s.Counts)
	}
	ftx, ok := tx.(*Tx)
	if !ok {
		return fmt.Errorf("backfilltest: complete sub-chunk of chunk %s: executor %T is not a *backfilltest.Tx", chunkID, tx)
	}
	m.mu.Lock()
	r, err := m.get(batchID)
	k := subchunkKey{batchID, s.Seq}
	switch {
	case err != nil:
	case s.Seq < 0 || s.Seq >= len(r.chunks) || r.chunks[s.Seq].Status != backfill.ChunkPending || r.locked[s.Seq] != ftx:
		err = fmt.Errorf("backfill: complete sub-chunk [%s, %s) of chunk %s of batch %d: chunk is not pending (completed by another worker?) or not fenced in this transaction", s.Lo, s.Hi, chunkID, batchID)
	case r.run.Status != backfill.RunRunning && r.run.Status != backfill.RunPaused && r.run.Status != backfill.RunFailed:
		err = fmt.Errorf("backfill: complete sub-chunk [%s, %s) of chunk %s of batch %d: the run is %s", s.Lo, s.Hi, chunkID, batchID, r.run.Status)
	case slices.ContainsFunc(m.subchunks[k], func(o backfilltype.Subchunk) bool { return o.Pos == s.Pos || o.Lo == s.Lo }):
		err = fmt.Errorf("backfill: complete sub-chunk [%s, %s) of chunk %s of batch %d: position %d is recorded already", s.Lo, s.Hi, chunkID, batchID, s.Pos)
	}
	m.mu.Unlock()
	if err != nil {
		return err
	}
	ex := slices.Clone(exceptions)
	now := time.Now()
	for i := range ex {
		ex[i] = pgstore.ManifestException(ex[i])
		ex[i].BatchID, ex[i].ChunkID, ex[i].CreatedAt = batchID, chunkID, now
	}
	s.Worker, s.CommittedAt = pgstore.ManifestText(s.Worker), now
	// After the fence's own commit function, which ends the lease.
	return apply(tx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.subchunks == nil {
			m.subchunks = map[subchunkKey][]backfilltype.Subchunk{}
		}
		m.subchunks[k] = append(m.subchunks[k], s)
		slices.SortFunc(m.subchunks[k], func(a, b backfilltype.Subchunk) int { return a.Pos - b.Pos })
		r.exceptions = append(r.exceptions, ex...)
		if le := r.leases[s.Seq]; le != nil && le.key == "" {
			le.key, le.at = leaseKey, now
		}
	})
}
