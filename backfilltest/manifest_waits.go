package backfilltest

import (
	"context"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
)

var _ backfilldriver.ManifestWaits = (*Manifest)(nil)

// RecordWait implements [backfilldriver.ManifestWaits.RecordWait] in memory,
// like the PostgreSQL manifest's append-only waits table: an ID in the
// order recorded and the time of the record.
func (m *Manifest) RecordWait(ctx context.Context, db sqlx.ExtContext, w backfilltype.Wait) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextWait++
	w.ID, w.At = m.nextWait, time.Now()
	w.Blockers = append([]backfilltype.Blocker{}, w.Blockers...)
	m.waits = append(m.waits, w)
	return nil
}

// Waits implements [backfilldriver.ManifestWaits.Waits].
func (m *Manifest) Waits(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Wait, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []backfilltype.Wait
	for _, w := range m.waits {
		if w.BatchID == batchID {
			out = append(out, w)
		}
	}
	return out, nil
}
