package pgstore

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
)

// recordDelivered summarises, after a merge, the staged rows that exist in
// the target last written by another batch (the chunk delivered them
// unchanged, or a conflict policy kept the target's version): one row per
// owner batch in info.Chunk.DeliveredTable. It does nothing without
// unchanged rows, lineage or a delivered table.
func (s *PGStager) recordDelivered(ctx context.Context, unchanged int64) error {
	t := s.Info.Target
	if unchanged <= 0 || s.Info.Chunk.DeliveredTable == "" || t.Lineage.UpdatedBy == "" {
		return nil
	}
	identity := s.Info.Identity()
	q := s.RecordDeliveredSQL()
	if _, err := s.tx.ExecContext(ctx, q, s.Info.Chunk.BatchID, s.Info.Chunk.Seq, pq.Array(identity)); err != nil {
		return fmt.Errorf("backfill: merge %s: record unchanged deliveries: %w", t.Table, err)
	}
	return nil
}

// delivered finds the rows that rolling back the chunks seqs of batch
// (one chunk, or the whole batch when chunk is nil) would delete or
// restore and that a done chunk of another batch, not in exclude,
// delivered unchanged (see recordDelivered). It returns how many, how many
// of them the rollback would delete (the rest it would restore), up to
// 100 of them ordered by key, and the batches that delivered any of them.
func (rb *pgRollback) delivered(ctx context.Context, db sqlx.ExtContext, batch int64, seqs []int, chunk *backfilltype.ChunkState, exclude []int64) (n, deleted int64, rows []backfilltype.RollbackConflict, batches []int64, err error) {
	filter, fargs := rb.InsertedFilter(chunk, 5)
	q := rb.DeliveredSQL(chunk != nil, filter)
	var res []struct {
		N       int64         `db:"n"`
		Deleted int64         `db:"deleted"`
		Batches pq.Int64Array `db:"batches"`
		Key     string        `db:"key"`
		By      int64         `db:"by"`
	}
	// $1 batch, $2 identity, $3 exclude; for one chunk $4 seqs and the
	// chunk's bounds from $5.
	args := []any{batch, pq.Array(rb.identity), pq.Array(append([]int64{}, exclude...))}
	if chunk != nil {
		args = append(append(args, pq.Array(seqs)), fargs...)
	}
	if err := sqlx.SelectContext(ctx, db, &res, q, args...); err != nil {
		return 0, 0, nil, nil, fmt.Errorf("backfill: rollback %s: rows delivered by later batches: %w", rb.info.Target.Table, err)
	}
	if len(res) == 0 {
		return 0, 0, nil, nil, nil
	}
	for _, r := range res {
		rows = append(rows, backfilltype.RollbackConflict{Key: r.Key, Batch: r.By, Delivered: true})
	}
	return res[0].N, res[0].Deleted, rows, res[0].Batches, nil
}
