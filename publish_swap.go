package backfill

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// PublishPartitionSwap loads each chunk into a new table beside the
// target's partition for exactly the chunk's bounds (a copy of it, merged
// with the chunk's rows), validates it, and swaps it in — DETACH the old
// partition, ATTACH the new one — in the chunk's transaction, with the
// lock_timeout of [Publish.LockTimeout] (PostgreSQL docs, 5.11.2.2
// "Partition Maintenance"). Readers see the old partition or the new one,
// never a mix. The old partition is kept, detached, for
// [Runner.Rollback], which swaps it back. The target must be partitioned
// by RANGE on [Job.ChunkColumn] with one partition per chunk.
const PublishPartitionSwap PublishMode = "partition_swap"

// publishSwap is the publisher of [PublishPartitionSwap].
type publishSwap struct{ publishChunk }

func (publishSwap) requires(c capabilities) error {
	return need(c.audit != nil, "ManifestAudit", "partition swaps are recorded in the audit log")
}

func (publishSwap) rereads() bool { return false }

func (publishSwap) switchesBack() bool { return true }

// target is a copy of the chunk's partition, beside it.
func (publishSwap) target(ctx context.Context, ex *execution, tx backfilldriver.Tx, c Chunk) (chunkTarget, error) {
	part, keyType, err := pgstore.PartitionFor(ctx, tx, ex.info.Target.Table, c)
	if err != nil {
		return chunkTarget{}, err
	}
	info, err := ex.r.prepareSwap(ctx, tx, ex.info, part, ex.batchID)
	if err != nil {
		return chunkTarget{}, err
	}
	t := ex.mergeTarget(ctx, tx, info, c)
	t.part, t.keyType = part, keyType
	return t, nil
}

// beforeCommit swaps the chunk's table in, records the swap and
// completes the chunk.
func (publishSwap) beforeCommit(ctx context.Context, ex *execution, tx backfilldriver.Tx, t chunkTarget, res ChunkResult, exceptions []Exception) error {
	c := res.Chunk
	if err := pgstore.SwapPartition(ctx, tx, pgstore.SwapParams{
		Parent: ex.info.Target.Table, Part: t.part, Next: t.info.Target.Table, Col: ex.job.ChunkColumn,
		KeyType: t.keyType, Chunk: c, LockTimeout: cmp.Or(ex.job.Publish.LockTimeout, "5s"),
	}); err != nil {
		return err
	}
	detail, _ := json.Marshal(map[string]any{"seq": c.Seq, "chunk": c.ID, "parent": ex.info.Target.Table, "old": t.part, "new": t.info.Target.Table})
	if err := ex.r.caps.audit.RecordEvent(ctx, tx, backfilltype.Event{BatchID: ex.batchID, Job: ex.job.Name, Kind: "partition_swapped", Actor: ex.r.cfg.WorkerID, Detail: detail}); err != nil {
		return err
	}
	return ex.r.cfg.Manifest.CompleteChunk(ctx, tx, ex.batchID, res, exceptions)
}

func (publishSwap) rollback(ctx context.Context, r *Runner, _ Job, run Run, plan Plan, opts RollbackOptions) (RollbackReport, bool, error) {
	if run.Status == RunRolledBack {
		return RollbackReport{BatchID: run.BatchID, Status: run.Status}, true, nil
	}
	begin := time.Now()
	rep, err := r.swapBack(ctx, r.caps.sql, run, plan.Target.Table, opts)
	rep.Elapsed = time.Since(begin)
	return rep, true, err
}

// prepareSwap creates the new table of partition part (a copy of it) in
// tx and prepares the merge into it.
func (r *Runner) prepareSwap(ctx context.Context, tx sqlx.ExtContext, info TableInfo, part string, batchID int64) (TableInfo, error) {
	next := pgstore.VersionTable(part, batchID)
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (LIKE %[2]s INCLUDING ALL); INSERT INTO %[1]s SELECT * FROM %[2]s`,
		sqlgen.Table(next), sqlgen.Table(part))); err != nil {
		return TableInfo{}, fmt.Errorf("backfill: partition swap: copy %s: %w", part, err)
	}
	t := info.Target
	t.Table = next
	t.Columns = nil
	for _, col := range info.Columns[:info.Written] {
		t.Columns = append(t.Columns, col.Name)
	}
	return r.cfg.Merger.Prepare(ctx, tx, t)
}

// swapBack withdraws a partition-swap batch: in reverse chunk order, one
// transaction per chunk with its checkpoint, it attaches the partition
// each chunk replaced in place of the chunk's. It refuses, changing
// nothing, when a later batch swapped one of those partitions again.
func (r *Runner) swapBack(ctx context.Context, pm backfilldriver.SQLManifest, run Run, parent string, opts RollbackOptions) (RollbackReport, error) {
	ctx = pgstore.WithPurpose(ctx, "swap partitions back", run.BatchID)
	rep := RollbackReport{BatchID: run.BatchID, Status: run.Status, Preview: opts.Preview}
	states, err := pm.Chunks(ctx, r.db, run.BatchID)
	if err != nil {
		return rep, err
	}
	swaps, err := r.batchSwaps(ctx, pm, run.BatchID, states, opts.ChunkID)
	if err != nil {
		return rep, err
	}
	for _, s := range swaps {
		cur, _, err := pgstore.PartitionFor(ctx, r.db, parent, states[s.Seq].Chunk)
		if err != nil {
			return rep, err
		}
		if cur != s.New {
			rep.Conflicts++
			rep.ConflictKeys = append(rep.ConflictKeys, fmt.Sprintf("%s: %s is attached, not %s", s.Chunk, cur, s.New))
		}
	}
	rep.Chunks = len(swaps)
	if opts.Preview {
		return rep, nil
	}
	if rep.Conflicts > 0 {
		return rep, fmt.Errorf("backfill: rollback of batch %d: %w: later batches swapped %d partitions again: %v", run.BatchID, ErrRollbackConflict, rep.Conflicts, rep.ConflictKeys)
	}
	rep.Chunks = 0
	for _, s := range swaps {
		done, err := r.swapBackChunk(ctx, pm, swapBackParams{
			batchID: run.BatchID, parent: parent, chunk: states[s.Seq].Chunk, swap: s, lockTimeout: opts.lockTimeout,
		})
		if err != nil {
			return rep, fmt.Errorf("backfill: rollback of batch %d chunk %s: %w", run.BatchID, s.Chunk, err)
		}
		if done {
			rep.Chunks++
		}
	}
	err = pgstore.InTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		if opts.ChunkID == "" {
			if _, err := tx.ExecContext(ctx, pm.SQL(`UPDATE {s}.runs SET status = 'rolled_back', updated_at = now() WHERE batch_id = $1`), run.BatchID); err != nil {
				return err
			}
		}
		detail, _ := json.Marshal(map[string]any{"why": opts.Why, "chunk": opts.ChunkID, "partitions": rep.Chunks})
		return pm.RecordEvent(ctx, tx, backfilltype.Event{BatchID: run.BatchID, Job: run.Job, Kind: "rollback_switch_back", Actor: opts.Actor, Detail: detail})
	})
	if err == nil && opts.ChunkID == "" {
		rep.Status = RunRolledBack
	}
	return rep, err
}

// partitionSwap is a "partition_swapped" event: chunk Seq's partition Old
// was replaced by New.
type partitionSwap struct {
	Seq      int
	Chunk    string
	Old, New string
}

// batchSwaps returns the swaps of the batch's done chunks (only chunkID's
// unless ""), the last first.
func (r *Runner) batchSwaps(ctx context.Context, pm backfilldriver.SQLManifest, batchID int64, states []backfilltype.ChunkState, chunkID string) ([]partitionSwap, error) {
	events, err := pm.Events(ctx, r.db, batchID)
	if err != nil {
		return nil, err
	}
	var swaps []partitionSwap
	for _, e := range events {
		if e.Kind != "partition_swapped" {
			continue
		}
		var s partitionSwap
		if err := json.Unmarshal(e.Detail, &s); err != nil {
			return nil, err
		}
		if states[s.Seq].Status == ChunkDone && (chunkID == "" || s.Chunk == chunkID) {
			swaps = append(swaps, s)
		}
	}
	slices.Reverse(swaps)
	return swaps, nil
}

// swapBackParams are the inputs of Runner.swapBackChunk besides its
// manifest.
type swapBackParams struct {
	// batchID is the run (batch) being rolled back.
	batchID int64
	// parent is the partitioned table's name, unquoted.
	parent string
	// chunk is the chunk whose swap is withdrawn.
	chunk Chunk
	// swap is the chunk's "partition_swapped" event.
	swap partitionSwap
	// lockTimeout is PostgreSQL's lock_timeout for the swap; "" is "5s".
	lockTimeout string
}

// swapBackChunk attaches p.swap.Old in place of p.swap.New for p.chunk,
// with the chunk's checkpoint, in one transaction; it reports false when
// the chunk is no longer done (rolled back meanwhile).
func (r *Runner) swapBackChunk(ctx context.Context, pm backfilldriver.SQLManifest, p swapBackParams) (bool, error) {
	ctx = pgstore.WithPurpose(ctx, "swap a chunk's partition back", 0)
	done := false
	err := pgstore.InTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		var status []string
		if err := sqlx.SelectContext(ctx, tx, &status, pm.SQL(`SELECT status FROM {s}.chunks WHERE batch_id = $1 AND seq = $2 FOR UPDATE`), p.batchID, p.swap.Seq); err != nil {
			return err
		}
		if len(status) == 0 || status[0] != string(ChunkDone) {
			return nil
		}
		_, keyType, err := pgstore.PartitionFor(ctx, tx, p.parent, p.chunk)
		if err != nil {
			return err
		}
		var col string
		if err := sqlx.GetContext(ctx, tx, &col, `SELECT a.attname FROM pg_partitioned_table p JOIN pg_attribute a
			ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] WHERE p.partrelid = to_regclass($1)`, sqlgen.Table(p.parent)); err != nil {
			return err
		}
		if err := pgstore.SwapPartition(ctx, tx, pgstore.SwapParams{
			Parent: p.parent, Part: p.swap.New, Next: p.swap.Old, Col: col, KeyType: keyType, Chunk: p.chunk, LockTimeout: cmp.Or(p.lockTimeout, "5s"),
		}); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, pm.SQL(`UPDATE {s}.chunks SET status = 'rolled_back' WHERE batch_id = $1 AND seq = $2`), p.batchID, p.swap.Seq); err != nil {
			return err
		}
		done = true
		return nil
	})
	return done && err == nil, err
}
