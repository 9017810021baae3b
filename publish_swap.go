package backfill

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

func pqQuoteLiteral(s string) string { return pq.QuoteLiteral(s) }

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
	part, keyType, err := partitionFor(ctx, tx, ex.info.Target.Table, c)
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
	if err := swapPartition(ctx, tx, swapParams{
		parent: ex.info.Target.Table, part: t.part, next: t.info.Target.Table, col: ex.job.ChunkColumn,
		keyType: t.keyType, chunk: c, lockTimeout: cmp.Or(ex.job.Publish.LockTimeout, "5s"),
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

// partitionFor finds the partition of parent whose range bounds are the
// chunk's, by reading the bounds back from pg_get_expr(relpartbound) and
// casting them to the partition key's type. When db is not a
// transaction, it reads in one of its own (readTx).
func partitionFor(ctx context.Context, db sqlx.ExtContext, parent string, c Chunk) (name, keyType string, err error) {
	err = pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		var err error
		name, keyType, err = partitionForTx(ctx, tx, parent, c)
		return err
	})
	return name, keyType, err
}

func partitionForTx(ctx context.Context, db sqlx.ExtContext, parent string, c Chunk) (name, keyType string, err error) {
	var lo, hi any
	switch c.Kind {
	case backfilltype.KindTime:
		lo, hi = c.Start, c.End
	case backfilltype.KindInt:
		lo, hi = c.Lo, c.Hi
	default:
		return "", "", fmt.Errorf("backfill: partition swap: %w: list chunks have no range partition", ErrUnsupported)
	}
	var keyTypes []string
	if err := sqlx.SelectContext(ctx, db, &keyTypes, `SELECT format_type(a.atttypid, a.atttypmod)
		FROM pg_partitioned_table p JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
		WHERE p.partrelid = to_regclass($1) AND p.partstrat = 'r' AND p.partnatts = 1`, sqlgen.Table(parent)); err != nil {
		return "", "", err
	}
	if len(keyTypes) != 1 {
		return "", "", fmt.Errorf("backfill: partition swap: %w: %s is not partitioned by RANGE on one column", ErrInvalidConfig, parent)
	}
	keyType = keyTypes[0]
	var rels []struct {
		Schema string `db:"nspname"`
		Name   string `db:"relname"`
	}
	err = sqlx.SelectContext(ctx, db, &rels, fmt.Sprintf(`SELECT n.nspname, c.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace,
		LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), '^FOR VALUES FROM \(''(.*)''\) TO \(''(.*)''\)$') m
		WHERE i.inhparent = to_regclass($1) AND m IS NOT NULL AND m[1]::%[1]s = $2::%[1]s AND m[2]::%[1]s = $3::%[1]s`, keyType),
		sqlgen.Table(parent), lo, hi)
	if err != nil {
		return "", "", err
	}
	var names []string
	for _, r := range rels {
		names = append(names, sqlgen.Qualified(r.Schema, r.Name))
	}
	if len(names) != 1 {
		return "", "", fmt.Errorf("backfill: partition swap: %w: %s has no partition for exactly %s", ErrInvalidConfig, parent, c)
	}
	return names[0], keyType, nil
}

// prepareSwap creates the new table of partition part (a copy of it) in
// tx and prepares the merge into it.
func (r *Runner) prepareSwap(ctx context.Context, tx sqlx.ExtContext, info TableInfo, part string, batchID int64) (TableInfo, error) {
	next := versionTable(part, batchID)
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

// swapParams are the inputs of swapPartition besides its transaction.
type swapParams struct {
	// parent is the partitioned table's name, unquoted (sqlgen.Table
	// quotes it).
	parent string
	// part is the partition attached now, to detach, named as parent.
	part string
	// next is the table to attach in its place.
	next string
	// col is the partition key column.
	col string
	// keyType is the key column's SQL type, e.g. "bigint".
	keyType string
	// chunk is the chunk whose bounds are the partition's.
	chunk Chunk
	// lockTimeout is PostgreSQL's lock_timeout for the swap, e.g. "5s".
	lockTimeout string
}

// swapPartition attaches p.next in place of p.part, in tx.
func swapPartition(ctx context.Context, tx sqlx.ExtContext, p swapParams) error {
	lo, hi := any(p.chunk.Lo), any(p.chunk.Hi)
	if p.chunk.Kind == backfilltype.KindTime {
		lo, hi = p.chunk.Start, p.chunk.End
	}
	q := sqlgen.Ident(p.col)
	// A CHECK constraint matching the bounds lets ATTACH skip its scan.
	var check string
	if err := sqlx.GetContext(ctx, tx, &check, fmt.Sprintf(`SELECT format('%%s IS NOT NULL AND %%s >= %%L::%[2]s AND %%s < %%L::%[2]s', %[1]s, %[1]s, $1::%[2]s, %[1]s, $2::%[2]s)`,
		pqQuoteLiteral(q), p.keyType), lo, hi); err != nil {
		return err
	}
	var bounds string
	if err := sqlx.GetContext(ctx, tx, &bounds, fmt.Sprintf(`SELECT format('FROM (%%L) TO (%%L)', $1::%[1]s, $2::%[1]s)`, p.keyType), lo, hi); err != nil {
		return err
	}
	stmts := []string{
		`SELECT set_config('lock_timeout', ` + pqQuoteLiteral(p.lockTimeout) + `, true)`,
		fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT backfill_bounds CHECK (%s)`, sqlgen.Table(p.next), check),
		fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s`, sqlgen.Table(p.parent), sqlgen.Table(p.part)),
		fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES %s`, sqlgen.Table(p.parent), sqlgen.Table(p.next), bounds),
		fmt.Sprintf(`ALTER TABLE %s DROP CONSTRAINT backfill_bounds`, sqlgen.Table(p.next)),
	}
	for _, s := range stmts {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("backfill: partition swap of %s: %w", p.part, err)
		}
	}
	return nil
}

// swapBack withdraws a partition-swap batch: in reverse chunk order, one
// transaction per chunk with its checkpoint, it attaches the partition
// each chunk replaced in place of the chunk's. It refuses, changing
// nothing, when a later batch swapped one of those partitions again.
func (r *Runner) swapBack(ctx context.Context, pm backfilldriver.SQLManifest, run Run, parent string, opts RollbackOptions) (RollbackReport, error) {
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
		cur, _, err := partitionFor(ctx, r.db, parent, states[s.Seq].Chunk)
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
	done := false
	err := pgstore.InTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		var status []string
		if err := sqlx.SelectContext(ctx, tx, &status, pm.SQL(`SELECT status FROM {s}.chunks WHERE batch_id = $1 AND seq = $2 FOR UPDATE`), p.batchID, p.swap.Seq); err != nil {
			return err
		}
		if len(status) == 0 || status[0] != string(ChunkDone) {
			return nil
		}
		_, keyType, err := partitionFor(ctx, tx, p.parent, p.chunk)
		if err != nil {
			return err
		}
		var col string
		if err := sqlx.GetContext(ctx, tx, &col, `SELECT a.attname FROM pg_partitioned_table p JOIN pg_attribute a
			ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] WHERE p.partrelid = to_regclass($1)`, sqlgen.Table(p.parent)); err != nil {
			return err
		}
		if err := swapPartition(ctx, tx, swapParams{
			parent: p.parent, part: p.swap.New, next: p.swap.Old, col: col, keyType: keyType, chunk: p.chunk, lockTimeout: cmp.Or(p.lockTimeout, "5s"),
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
