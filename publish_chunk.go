package backfill

import (
	"context"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
)

// publishChunk is the publisher of [PublishPerChunk]: each chunk merges
// into the target and is visible when its transaction commits. The other
// per-chunk modes embed it.
type publishChunk struct{}

func (publishChunk) requires(capabilities) error { return nil }

func (publishChunk) rereads() bool { return true }

func (publishChunk) switchesBack() bool { return false }

func (publishChunk) publishesOpen() bool { return true }

func (publishChunk) prepare(context.Context, *execution) error { return nil }

func (publishChunk) target(ctx context.Context, ex *execution, tx backfilldriver.Tx, c Chunk) (chunkTarget, error) {
	return ex.mergeTarget(ctx, tx, ex.info, c), nil
}

func (publishChunk) beforeCommit(ctx context.Context, ex *execution, tx backfilldriver.Tx, _ chunkTarget, res ChunkResult, exceptions []Exception) error {
	return ex.r.cfg.Manifest.CompleteChunk(ctx, tx, ex.batchID, res, exceptions)
}

func (publishChunk) finish(context.Context, *execution) {}

func (publishChunk) published(context.Context, *execution, Run) (bool, error) { return false, nil }

func (publishChunk) rollback(context.Context, *Runner, Job, Run, Plan, RollbackOptions) (RollbackReport, bool, error) {
	return RollbackReport{}, false, nil
}

// mergeTarget is the target of chunk c merged by the Runner's Merger into
// info, in tx.
func (ex *execution) mergeTarget(ctx context.Context, tx backfilldriver.Tx, info TableInfo, c Chunk) chunkTarget {
	info = ex.chunkInfo(info, c)
	return chunkTarget{info: info, isolate: ex.r.caps.isolates && ex.r.cfg.MaxStagingRejects > 0,
		newStager: func() (backfilldriver.Stager, error) { return ex.r.cfg.Merger.Stage(ctx, tx, info) }}
}

// chunkInfo is info with chunk c's reference, for its merge.
func (ex *execution) chunkInfo(info TableInfo, c Chunk) TableInfo {
	info.Chunk = backfilltype.ChunkRef{BatchID: ex.batchID, Seq: c.Seq, UndoTable: ex.undoTable, DeliveredTable: ex.deliveredTable,
		MaxRefused: ex.r.cfg.MaxMergeRefusals}
	return info
}
