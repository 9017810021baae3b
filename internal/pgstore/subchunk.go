package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// The adaptive chunk knobs of [Manifest.SetKnob] (and set_knob).
const (
	// KnobChunkTarget replaces backfill.Config.ChunkTarget, in whole
	// milliseconds; 0 turns adaptation off for the run.
	KnobChunkTarget = "chunk_target_ms"
	// KnobChunkMaxRows replaces backfill.Config.ChunkMaxRows, a cap on the
	// rows of a sub-chunk (0: none).
	KnobChunkMaxRows = "chunk_max_rows"
)

// Subchunks implements [backfilldriver.ManifestSubchunks], in a short
// transaction of its own unless db is one.
func (m *Manifest) Subchunks(ctx context.Context, db sqlx.ExtContext, batchID int64, seq int) ([]backfilltype.Subchunk, error) {
	var rows []struct {
		backfilltype.Subchunk
		DurationMS float64 `db:"duration_ms"`
	}
	ctx = m.purpose(ctx, "read the sub-chunks of a chunk", batchID)
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = rows[:0]
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT seq, pos, lo, hi, rows_read, rows_inserted, rows_updated, rows_unchanged,
			rows_rejected, rows_deduplicated, split, duration_ms, worker, committed_at
			FROM {s}.subchunks WHERE batch_id = $1 AND seq = $2 ORDER BY pos`), batchID, seq)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: sub-chunks of chunk %d of batch %d: %w", seq, batchID, err)
	}
	out := make([]backfilltype.Subchunk, len(rows))
	for i, r := range rows {
		out[i] = r.Subchunk
		out[i].Duration = time.Duration(r.DurationMS * float64(time.Millisecond))
	}
	return out, nil
}

// CompleteSubchunk implements [backfilldriver.ManifestSubchunks]: one
// statement gives the lease back to its holder (the fence cleared it;
// the fence's row lock is held) while the plan chunk is pending and its
// run goes on, and inserts the sub-range; then its exceptions are queued
// under the plan chunk's ID.
func (m *Manifest) CompleteSubchunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, chunkID, leaseKey string, s backfilltype.Subchunk, exceptions []backfilltype.Exception) error {
	if !s.Balanced() {
		return fmt.Errorf("backfill: complete sub-chunk [%s, %s) of chunk %s: %w: %+v", s.Lo, s.Hi, chunkID, backfilltype.ErrAccounting, s.Counts)
	}
	res, err := tx.ExecContext(ctx, m.SQL(`WITH l AS (UPDATE {s}.chunks SET lease_key = $15, leased_at = clock_timestamp()
			WHERE batch_id = $1 AND seq = $2 AND status = 'pending' AND lease_key IS NULL
				AND EXISTS (SELECT 1 FROM {s}.runs WHERE batch_id = $1 AND status NOT IN ('abandoned', 'rolled_back', 'cancelled'))
			RETURNING 1)
		INSERT INTO {s}.subchunks (batch_id, seq, pos, lo, hi, rows_read, rows_inserted, rows_updated,
		rows_unchanged, rows_rejected, rows_deduplicated, split, duration_ms, worker)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14 FROM l`),
		batchID, s.Seq, s.Pos, s.Lo, s.Hi, s.Read, s.Inserted, s.Updated, s.Unchanged, s.Rejected, s.Deduplicated, s.Split,
		float64(s.Duration)/float64(time.Millisecond), ManifestText(s.Worker), leaseKey)
	if err != nil {
		return fmt.Errorf("backfill: complete sub-chunk [%s, %s) of chunk %s: %w", s.Lo, s.Hi, chunkID, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("backfill: complete sub-chunk [%s, %s) of chunk %s of batch %d: chunk is not pending (completed by another worker?) or the run was abandoned, rolled back or cancelled", s.Lo, s.Hi, chunkID, batchID)
	}
	if err := m.addExceptions(ctx, tx, batchID, chunkID, exceptions); err != nil {
		return fmt.Errorf("backfill: complete sub-chunk [%s, %s) of chunk %s: exceptions: %w", s.Lo, s.Hi, chunkID, err)
	}
	return nil
}

// SubchunkedChunks returns the plan chunks of batchID that have
// sub-chunks committed and are not done (pending or failed), with the
// rows their sub-chunks updated: a rollback of the batch restores them.
func (m *Manifest) SubchunkedChunks(ctx context.Context, db sqlx.ExtContext, batchID int64) (map[int]int64, error) {
	ctx = m.purpose(ctx, "read the chunks split and not done", batchID)
	var rows []struct {
		Seq     int   `db:"seq"`
		Updated int64 `db:"updated"`
	}
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = rows[:0]
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT s.seq, sum(s.rows_updated) AS updated FROM {s}.subchunks s
			JOIN {s}.chunks c ON c.batch_id = s.batch_id AND c.seq = s.seq AND c.status IN ('pending', 'failed')
			WHERE s.batch_id = $1 GROUP BY s.seq`), batchID)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: chunks split of batch %d: %w", batchID, err)
	}
	out := make(map[int]int64, len(rows))
	for _, r := range rows {
		out[r.Seq] = r.Updated
	}
	return out, nil
}
