package backfilltest

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilldriver"
)

var _ backfilldriver.ManifestWaits = (*Manifest)(nil)

// RecordWait implements [backfilldriver.ManifestWaits.RecordWait] in memory,
// like the PostgreSQL manifest's append-only waits table: an ID in the
// order recorded and the time of the record.
func (m *Manifest) RecordWait(ctx context.Context, db sqlx.ExtContext, w backfill.Wait) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextWait++
	w.ID, w.At = m.nextWait, time.Now()
	w.Blockers = append([]backfill.Blocker{}, w.Blockers...)
	m.waits = append(m.waits, w)
	return nil
}

// Waits implements [backfilldriver.ManifestWaits.Waits].
func (m *Manifest) Waits(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfill.Wait, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []backfill.Wait
	for _, w := range m.waits {
		if w.BatchID == batchID {
			out = append(out, w)
		}
	}
	return out, nil
}
