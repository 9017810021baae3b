package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
)

var _ backfilldriver.ManifestWaits = (*Manifest)(nil)

// RecordWait implements [backfilldriver.ManifestWaits.RecordWait].
func (m *Manifest) RecordWait(ctx context.Context, db sqlx.ExtContext, w backfilltype.Wait) error {
	ctx = m.purpose(ctx, "record a wait", w.BatchID)
	blockers := w.Blockers
	if blockers == nil {
		blockers = []backfilltype.Blocker{}
	}
	b, err := json.Marshal(blockers)
	if err != nil {
		return fmt.Errorf("backfill: record wait of chunk %s: %w", w.ChunkID, err)
	}
	err = InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		_, err := tx.ExecContext(ctx, m.SQL(`INSERT INTO {s}.waits (batch_id, seq, chunk_id, attempt, try, sqlstate, message, lock_timeout,
			statement_timeout, waited, sleep, final, blockers, worker)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, make_interval(secs => $10), make_interval(secs => $11), $12, $13, $14)`),
			w.BatchID, w.Seq, w.ChunkID, w.Attempt, w.Try, w.SQLState, ManifestText(w.Message), w.LockTimeout, w.StatementTimeout,
			w.Waited.Seconds(), w.Sleep.Seconds(), w.Final, string(ManifestJSON(b)), ManifestText(w.Worker))
		return err
	})
	if err != nil {
		return fmt.Errorf("backfill: record wait of chunk %s of batch %d: %w", w.ChunkID, w.BatchID, err)
	}
	return nil
}

// Waits implements [backfilldriver.ManifestWaits.Waits].
func (m *Manifest) Waits(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Wait, error) {
	ctx = m.purpose(ctx, "read waits", batchID)
	var rows []struct {
		backfilltype.Wait
		WaitedSec float64 `db:"waited_sec"`
		SleepSec  float64 `db:"sleep_sec"`
		Blockers  []byte  `db:"blockers"`
	}
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = rows[:0]
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT id, batch_id, seq, chunk_id, attempt, try, sqlstate, message, lock_timeout,
			statement_timeout, extract(epoch FROM waited)::float8 AS waited_sec, extract(epoch FROM sleep)::float8 AS sleep_sec,
			final, blockers, worker, at FROM {s}.waits WHERE batch_id = $1 ORDER BY id`), batchID)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: waits of batch %d: %w", batchID, err)
	}
	out := make([]backfilltype.Wait, len(rows))
	for i, r := range rows {
		out[i] = r.Wait
		out[i].Waited = time.Duration(r.WaitedSec * float64(time.Second))
		out[i].Sleep = time.Duration(r.SleepSec * float64(time.Second))
		if err := json.Unmarshal(r.Blockers, &out[i].Blockers); err != nil {
			return nil, fmt.Errorf("backfill: waits of batch %d: blockers of wait %d: %w", batchID, r.ID, err)
		}
	}
	return out, nil
}
