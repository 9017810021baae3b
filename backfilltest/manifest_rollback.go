package backfilltest

import (
	"context"

	"github.com/pgbackfill/backfill/backfilldriver"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

// chunkRolledBack is the status of a rolled back chunk, as PGManifest
// writes it.
const chunkRolledBack backfill.ChunkStatus = "rolled_back"

var (
	_ backfilldriver.ManifestRollback = (*Manifest)(nil)
	_ backfilldriver.ManifestUndoLog  = (*Manifest)(nil)
)

// UndoTable implements [backfilldriver.ManifestUndoLog]: the fake Merger keeps
// the undo log in memory under this name.
func (m *Manifest) UndoTable() string { return `"backfilltest"."undo"` }

// DeliveredTable implements [backfilldriver.ManifestUndoLog]. The fake Merger
// keeps no summary of unchanged deliveries under this name, so its
// rollback reports no delivered conflicts (only rows later batches
// changed).
func (m *Manifest) DeliveredTable() string { return `"backfilltest"."delivered"` }

// Run implements [backfilldriver.ManifestRollback.Run].
func (m *Manifest) Run(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfill.Run, error) {
	if err := ctx.Err(); err != nil {
		return backfill.Run{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return backfill.Run{}, err
	}
	return r.run, nil
}

// RollBackChunk implements [backfilldriver.ManifestRollback.RollBackChunk]; in
// a fake transaction the chunk is marked on commit.
func (m *Manifest) RollBackChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, seq int) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	m.mu.Lock()
	r, err := m.get(batchID)
	ok := err == nil && seq >= 0 && seq < len(r.chunks) && (r.chunks[seq].Status == backfill.ChunkDone || r.chunks[seq].Status == backfill.ChunkOpen)
	m.mu.Unlock()
	if err != nil || !ok {
		return false, err
	}
	return true, apply(tx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		r.chunks[seq].Status = chunkRolledBack
	})
}

// RollBackRun implements [backfilldriver.ManifestRollback.RollBackRun]; in a
// fake transaction the run changes on commit.
func (m *Manifest) RollBackRun(ctx context.Context, tx sqlx.ExtContext, batchID int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	r, err := m.get(batchID)
	m.mu.Unlock()
	if err != nil {
		return err
	}
	return apply(tx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		r.run.Status = backfill.RunRolledBack
	})
}
