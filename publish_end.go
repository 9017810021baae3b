package backfill

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// PublishAtEnd stages every chunk into a persistent, logged staging table
// of the run (<manifest schema>.stage_<batch>), checkpointed per chunk
// (status staged), so a crash keeps what was staged; when no chunk is left
// to stage, one transaction checks every chunk's staged rows against the
// manifest, merges the chunks in order, runs [Job.Validators] on each and
// checkpoints them done. Readers see nothing of the run before that
// transaction commits, and all of it after. Needs a manifest with
// [backfilldriver.ManifestStaging] and a merger with
// [backfilldriver.MergerStaging] ([PGManifest] and the PostgreSQL merger,
// or backfilltest's fakes).
const PublishAtEnd PublishMode = "at_end"

// publishEnd is the publisher of [PublishAtEnd]: chunks are staged into
// the run's persistent staging table, and the run's last call merges them
// all in one transaction (finish).
type publishEnd struct{}

var (
	_ backfilldriver.MergerStaging   = (*pgstore.Merger)(nil)
	_ backfilldriver.StagingIsolator = (*pgstore.Merger)(nil)
	_ backfilldriver.UndoLogWriter   = (*pgstore.Merger)(nil)
	_ backfilldriver.TableStager     = (*pgstore.Merger)(nil)
)

func (publishEnd) requires(c capabilities) error {
	return errors.Join(need(c.staging != nil, "ManifestStaging", "PublishAtEnd checkpoints staged chunks in the manifest"),
		need(c.mergeStage != nil, "MergerStaging", "PublishAtEnd stages into the run's persistent staging table"))
}

func (publishEnd) rereads() bool { return false }

func (publishEnd) switchesBack() bool { return false }

func (publishEnd) publishesOpen() bool { return true }

func (publishEnd) prepare(ctx context.Context, ex *execution) error {
	if err := ex.r.caps.mergeStage.CreateStaging(pgstore.WithLockWaiting(ctx, ex.r.lockWaiting(ex.log, ex.batchID, "", nil)), ex.r.db, ex.r.caps.staging.StagingTable(ex.batchID), ex.info); err != nil {
		return fmt.Errorf("backfill: job %q: staging table: %w", ex.job.Name, err)
	}
	return nil
}

func (publishEnd) target(ctx context.Context, ex *execution, tx backfilldriver.Tx, c Chunk) (chunkTarget, error) {
	info := ex.info
	info.Chunk = backfilltype.ChunkRef{BatchID: ex.batchID, Seq: c.Seq}
	t := chunkTarget{info: info, deferred: true, isolate: ex.r.caps.isolates && ex.r.cfg.MaxStagingRejects > 0}
	var ps backfilldriver.PersistentStager
	t.newStager = func() (backfilldriver.Stager, error) {
		st, err := ex.r.caps.mergeStage.StagePersistent(ctx, tx, ex.r.caps.staging.StagingTable(ex.batchID), ex.info, c.Seq)
		ps = st
		return st, err
	}
	t.staged = func() int64 { return ps.Staged() }
	return t, nil
}

// beforeCommit checkpoints the chunk as staged.
func (publishEnd) beforeCommit(ctx context.Context, ex *execution, tx backfilldriver.Tx, t chunkTarget, res ChunkResult, exceptions []Exception) error {
	return ex.r.caps.staging.StageChunk(ctx, tx, backfilldriver.StageChunkParams{
		BatchID: ex.batchID, Chunk: res.Chunk, Read: res.Read, Rejected: res.Rejected, Staged: t.staged(), Exceptions: exceptions,
	})
}

func (publishEnd) finish(ctx context.Context, ex *execution) { ex.publish(ctx) }

func (publishEnd) published(context.Context, *execution, Run) (bool, error) { return false, nil }

func (publishEnd) rollback(context.Context, *Runner, Job, Run, Plan, RollbackOptions) (RollbackReport, bool, error) {
	return RollbackReport{}, false, nil
}

// publishAtEnd merges every staged chunk of the run in one transaction.
// It returns the results of the chunks it completed.
func (ex *execution) publishAtEnd(ctx context.Context) ([]ChunkResult, error) {
	ctx = pgstore.WithPurpose(ctx, "publish at the end of the run", ex.batchID)
	r := ex.r
	stage := r.caps.staging.StagingTable(ex.batchID)
	var done []ChunkResult
	err := pgstore.InBoundedTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		done = done[:0] // pgstore.InBoundedTx may run this again after a conflict
		staged, err := r.caps.staging.StagedChunks(ctx, tx, ex.batchID)
		if err != nil || len(staged) == 0 {
			return err
		}
		states, err := r.cfg.Manifest.Chunks(ctx, tx, ex.batchID)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(states, func(s backfilltype.ChunkState) bool { return s.Status != chunkStaged && s.Status != ChunkDone }) {
			return nil // other chunks are still to be staged
		}
		for _, sc := range staged {
			i, found := slices.BinarySearchFunc(states, sc.Seq, func(s backfilltype.ChunkState, seq int) int { return s.Chunk.Seq - seq })
			var c Chunk
			ok := found
			if found {
				c, ok = ex.plan.ChunkOf(states[i].Chunk)
			}
			if !ok {
				return fmt.Errorf("backfill: publish: staged chunk %d is not in the plan", sc.Seq)
			}
			res, err := ex.publishStaged(ctx, tx, stage, c, sc)
			if err != nil {
				return err
			}
			done = append(done, res)
		}
		return r.caps.mergeStage.DropStaging(ctx, tx, stage)
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}

// chunkStaged is the status of a chunk staged for the publish at the end
// ([backfilldriver.ManifestStaging.StageChunk]).
const chunkStaged ChunkStatus = "staged"

// publishStaged merges, validates and completes staged chunk sc (the
// plan's chunk c) in the publish's transaction tx.
func (ex *execution) publishStaged(ctx context.Context, tx sqlx.ExtContext, stage string, c Chunk, sc backfilldriver.StagedChunk) (ChunkResult, error) {
	r := ex.r
	started := time.Now()
	info := ex.chunkInfo(ex.info, c)
	// Verified against the manifest: what a crash kept is what was
	// checkpointed.
	st, err := r.caps.mergeStage.StageFrom(ctx, tx, info, stage, sc.Seq, sc.Staged)
	if errors.Is(err, ErrAccounting) {
		return ChunkResult{}, fmt.Errorf("backfill: publish: chunk %s: %w", c.ID, err)
	}
	if err != nil {
		return ChunkResult{}, err
	}
	defer st.Close()
	// Its merge lock waits like a chunk's: logged, fencing a stale worker
	// that holds it ([Runner.lockWaiting]).
	self := ""
	if ex.worker != nil {
		self = ex.worker.key
	}
	mr, err := st.Merge(pgstore.WithLockWaiting(ctx, r.lockWaiting(ex.log.With("seq", c.Seq, "chunk", c.ID), ex.batchID, self, nil)))
	if err != nil {
		return ChunkResult{}, &ChunkError{Chunk: c, Attempt: 1, Err: err}
	}
	if err := pgstore.TooManyRejects(r.cfg.MaxRejectsPerChunk, c, 0, sc.Rejected, mr.Rejected); err != nil {
		return ChunkResult{}, &ChunkError{Chunk: c, Attempt: 1, Err: err}
	}
	res := ChunkResult{Chunk: c, Attempt: 1, StartedAt: started, Worker: r.cfg.WorkerID,
		Counts: Counts{Read: sc.Read, Inserted: mr.Inserted, Updated: mr.Updated, Unchanged: mr.Unchanged,
			Rejected: sc.Rejected + int64(len(mr.Rejected)), Deduplicated: mr.Deduplicated}}
	if !res.Balanced() {
		return ChunkResult{}, &ChunkError{Chunk: c, Attempt: 1, Err: fmt.Errorf("%w: %+v", ErrAccounting, res.Counts)}
	}
	checks, err := ex.validate(ctx, tx, c, info, st, res.Counts)
	var ge *gateError
	if errors.As(err, &ge) {
		// Kept outside the rolled back publish (execution.publish).
		for _, e := range mr.Rejected {
			e.ChunkID = c.ID
			ge.exceptions = append(ge.exceptions, e)
		}
		return ChunkResult{}, &ChunkError{Chunk: c, Attempt: 1, Err: ge}
	}
	if err != nil {
		return ChunkResult{}, err
	}
	if len(checks) > 0 {
		if err := r.caps.validations.AddValidations(ctx, tx, ex.batchID, c.ID, checks); err != nil {
			return ChunkResult{}, err
		}
	}
	res.FinishedAt = time.Now()
	exceptions := make([]Exception, len(mr.Rejected))
	for i, e := range mr.Rejected {
		e.BatchID, e.ChunkID = ex.batchID, c.ID
		exceptions[i] = e
	}
	if err := r.cfg.Manifest.CompleteChunk(ctx, tx, ex.batchID, res, exceptions); err != nil {
		return ChunkResult{}, err
	}
	return res, nil
}
