package backfill

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/quote"
)

// RollbackOptions configures [Runner.Rollback].
type RollbackOptions struct {
	// BatchID is the batch to roll back; 0 means the job's latest run
	// that is completed, failed or paused.
	BatchID int64
	// ChunkID limits the rollback to one chunk of the batch. Rows that
	// later chunks of the same batch changed again are restored as they
	// were before this chunk. Rows the chunk inserted are found by lineage
	// within the chunk's bounds of [Job.ChunkColumn]; without one, a chunk
	// that inserted rows cannot be rolled back alone ([ErrUnsupported]).
	// Rows of the chunk that later batches changed or delivered unchanged
	// are conflicts as for a whole batch (see Force).
	ChunkID string
	// Force rolls back rows that later, still applied batches changed or
	// delivered unchanged too, overwriting their changes and removing (or
	// restoring an older image over) rows they delivered. The choice and
	// the rows are recorded in the audit log and the report's
	// ConflictRows. Without it a rollback that meets such rows is refused
	// with [ErrRollbackConflict], listing them, and changes nothing.
	Force bool
	// Preview computes what the rollback would do without writing.
	Preview bool
	// Actor and Why are recorded in the audit log; both are required
	// unless Preview.
	Actor, Why string

	lockTimeout string // the job's Publish.LockTimeout, for swaps
	// exclude are batches the same call rolls back before this one
	// (RollbackModule's preview): their changes and deliveries do not
	// conflict.
	exclude []int64
}

// RollbackReport says what a rollback did (or, in a preview, would do).
type RollbackReport struct {
	BatchID int64
	// Chunks is how many chunks this call rolled back (or would).
	Chunks int
	// Deleted counts rows the batch inserted that were deleted; Restored
	// rows the batch updated (or whose SCD2 interval it closed) that got
	// their prior image back.
	Deleted, Restored int64
	// Conflicts counts rows the rollback would delete or restore although
	// a later batch that is still applied changed them (lineage) or
	// delivered them unchanged; ConflictsDelivered counts the latter.
	// ConflictRows lists up to 100 of them, ordered by key, each with the
	// later batch; ConflictKeys their keys as JSON. Without Force, Deleted
	// and Restored leave them out: the rollback is refused.
	Conflicts          int64
	ConflictsDelivered int64
	ConflictRows       []RollbackConflict
	ConflictKeys       []string
	// ConflictBatches are the later batches of all the conflicts (the
	// batch that last changed or delivered each row), newest first: the
	// order in which to roll them back before this batch, so that its
	// rollback then finds the rows as it left them and restores them
	// without Force. A row that several later batches changed names only
	// the last: a preview after rolling that one back names the next.
	ConflictBatches []int64
	// Preview is true when nothing was written.
	Preview bool
	// Status is the batch's run status after the call.
	Status  RunStatus
	Elapsed time.Duration
}

// Rollback withdraws a batch of job (or one of its chunks) using the undo
// log written during the batch ([RollbackUndoLog]): rows the batch
// inserted are deleted, rows it updated get their prior image back, SCD2
// intervals it closed or split are restored. It works in reverse commit
// order (the order in which the chunks' merges committed, which at
// Concurrency > 1 need not be plan order, so that each row gets back the
// image it had before the batch), one transaction per chunk (for a whole
// batch, per slice of consecutive chunks, at most 100,000 restored rows
// and 200 chunks) that also marks its chunks rolled_back, so a crash
// mid-rollback leaves whole chunks and running Rollback again completes
// it; rolling back a rolled back batch changes nothing.
//
// Before writing anything it refuses with [ErrRollbackConflict], unless
// opts.Force, when a later batch that is still applied changed rows of
// this batch or delivered them unchanged (exact about which batches,
// conservative between the identity bounds each chunk recorded). A preview
// reports the same conflicts. A whole-batch rollback is audited and sets
// the run's status to rolled_back. A running run whose only unfinished
// chunks are [ChunkOpen] is paused first (and stays paused if refused);
// one with pending or failed chunks is refused with [ErrInvalidConfig].
//
// It needs a manifest with [backfilldriver.ManifestRollback] and, for the
// undo log, a merger with [backfilldriver.UndoLogWriter] and
// [backfilldriver.MergerRollback]; a publish mode that switches back, or a
// running run, needs a [PGManifest]; [ErrUnsupported] otherwise, naming
// what is missing. The design note docs/design/rollback.md explains the
// conflict check and its locks.
func (r *Runner) Rollback(ctx context.Context, job Job, opts RollbackOptions) (RollbackReport, error) {
	begin := time.Now()
	run, plan, err := r.rollbackBatch(ctx, job, opts)
	if err != nil {
		return RollbackReport{}, err
	}
	if plan.Publish == job.Publish.String() {
		// A publish mode that switches back rolls back its own way.
		opts.lockTimeout = job.Publish.LockTimeout
		if publisherFor(job.Publish).switchesBack() && r.caps.sql == nil {
			return RollbackReport{}, fmt.Errorf("backfill: rollback of batch %d: %w: publish mode %s switches back in the manifest's tables (PGManifest)", run.BatchID, ErrUnsupported, job.Publish.Mode)
		}
		if rep, handled, err := publisherFor(job.Publish).rollback(ctx, r, job, run, plan, opts); handled {
			return rep, err
		}
	}
	u, err := r.undoRollback(ctx, job, run, plan, opts)
	if err != nil {
		return RollbackReport{}, err
	}
	if !opts.Preview {
		// Before anything changes: every missing privilege at once.
		if err := r.checkRollbackPrivileges(ctx, u.info, run.BatchID); err != nil {
			return RollbackReport{}, err
		}
	}
	rep, err := u.conflicts(ctx)
	if err != nil {
		return rep, err
	}
	if opts.Preview {
		rep, err = u.preview(ctx, rep)
		if err == nil {
			err = r.recordPreview(ctx, run, opts, rep)
		}
		rep.Elapsed = time.Since(begin)
		return rep, err
	}
	if rep.Conflicts > 0 && !opts.Force {
		rep.Elapsed = time.Since(begin)
		return rep, fmt.Errorf("backfill: rollback of batch %d: %w: %d rows were changed (%d) or delivered unchanged (%d) by later batches still applied%s: %s; %s or use Force",
			run.BatchID, ErrRollbackConflict, rep.Conflicts, rep.Conflicts-rep.ConflictsDelivered, rep.ConflictsDelivered, namedBatches(rep.ConflictBatches),
			conflictList(rep.ConflictRows, rep.Conflicts), rollBackFirst(rep.ConflictBatches))
	}
	if rep.Conflicts > 0 {
		r.cfg.Logger.Warn("backfill rollback forced over later batches", "job", run.Job, "batch_id", run.BatchID, "conflicts", rep.Conflicts,
			"delivered", rep.ConflictsDelivered, "rows", conflictList(rep.ConflictRows, rep.Conflicts), "actor", opts.Actor)
	}
	rep, err = u.apply(ctx, rep)
	rep.Elapsed = time.Since(begin)
	if err != nil || rep.Chunks == 0 && run.Status == RunRolledBack {
		return rep, err
	}
	r.cfg.Logger.Info("backfill rollback", "job", run.Job, "batch_id", run.BatchID, "chunks", rep.Chunks, "deleted", rep.Deleted,
		"restored", rep.Restored, "force", opts.Force, "actor", opts.Actor)
	return rep, nil
}

// rollbackBatch checks opts and finds the batch of job to roll back and
// its plan; the batch must not be running.
func (r *Runner) rollbackBatch(ctx context.Context, job Job, opts RollbackOptions) (Run, Plan, error) {
	if err := need(r.caps.rollback != nil, "ManifestRollback", "the manifest keeps the rollback's bookkeeping"); err != nil {
		return Run{}, Plan{}, fmt.Errorf("backfill: rollback of job %q: %w", job.Name, err)
	}
	if !opts.Preview && (opts.Actor == "" || opts.Why == "") {
		return Run{}, Plan{}, fmt.Errorf("backfill: rollback of job %q: %w: Actor and Why are required", job.Name, ErrInvalidConfig)
	}
	if err := r.cfg.Manifest.Init(ctx, r.db); err != nil {
		return Run{}, Plan{}, err
	}
	run, err := r.rollbackRun(ctx, r.caps.rollback, job.Name, opts.BatchID)
	if err != nil {
		return Run{}, Plan{}, err
	}
	if run.Status == RunRunning {
		// A run whose only unfinished chunks are open (loaded, read again
		// by each call until the horizon passes their end) can be
		// withdrawn: it is paused first, so that no call reads them again.
		if err := need(r.caps.sql != nil, "PGManifest", "a running run is paused in the manifest's tables first"); err != nil {
			return Run{}, Plan{}, fmt.Errorf("backfill: rollback of batch %d: %w", run.BatchID, err)
		}
		if run, err = r.stopOpenRun(ctx, r.caps.sql, run, opts); err != nil {
			return Run{}, Plan{}, err
		}
	}
	if wm := r.caps.workers; !opts.Preview && (run.Status == RunPaused || run.Status == RunFailed || run.Status == RunCancelled) {
		// Chunks claimed while the run was running may still be in
		// flight (the run's row is no lock they hold): wait for them,
		// fencing stale holders, before the rollback reads what to undo.
		if err := wm.WaitInFlight(ctx, r.db, run.BatchID, r.fenceWait(fmt.Sprintf("rollback of batch %d", run.BatchID))); err != nil {
			return Run{}, Plan{}, err
		}
	}
	var plan Plan
	if err := json.Unmarshal(run.Plan, &plan); err != nil {
		return Run{}, Plan{}, fmt.Errorf("backfill: rollback of batch %d: plan: %w", run.BatchID, err)
	}
	return run, plan, nil
}

// undoRollback is one call of Rollback by the undo log: the batch, the
// chunks it rolls back (seqs, in reverse order) and, for one chunk, its
// state.
type undoRollback struct {
	r    *Runner
	run  Run
	opts RollbackOptions
	rb   backfilldriver.UndoRollback
	// info is the target, whose merge lock the rollback takes (lockTarget).
	info TableInfo
	seqs []int
	// updated is the rows each chunk updated (its undo log's size), which
	// bounds the slices of a whole-batch rollback (slices).
	updated map[int]int64
	one     *backfilltype.ChunkState
	// deliveredDeleted counts the delivered conflicts the rollback would
	// delete (conflicts).
	deliveredDeleted int64
}

// undoRollback readies the rollback of run by the undo log.
func (r *Runner) undoRollback(ctx context.Context, job Job, run Run, plan Plan, opts RollbackOptions) (*undoRollback, error) {
	ctx = pgstore.WithPurpose(ctx, "roll back", run.BatchID)
	if plan.Rollback != RollbackUndoLog {
		return nil, fmt.Errorf("backfill: rollback of batch %d: %w: it was planned with rollback %q", run.BatchID, ErrUnsupported, cmp.Or(plan.Rollback, "none"))
	}
	if !r.caps.writesUndo {
		return nil, fmt.Errorf("backfill: rollback of batch %d: %w: the merger does not write the undo log (UndoLogWriter)", run.BatchID, ErrUnsupported)
	}
	if err := need(r.caps.mergeUndo != nil, "MergerRollback", "the merger rolls back from its undo log"); err != nil {
		return nil, fmt.Errorf("backfill: rollback of batch %d: %w", run.BatchID, err)
	}
	info, err := r.cfg.Merger.Prepare(ctx, r.db, job.Target)
	if err != nil {
		return nil, err
	}
	if info.Target.Table != plan.Target.Table {
		return nil, fmt.Errorf("backfill: rollback of batch %d: %w: job target %q is not the batch's %q", run.BatchID, ErrInvalidConfig, info.Target.Table, plan.Target.Table)
	}
	states, err := r.cfg.Manifest.Chunks(ctx, r.db, run.BatchID)
	if err != nil {
		return nil, err
	}
	u := &undoRollback{r: r, run: run, opts: opts, info: info, updated: map[int]int64{}}
	split, err := splitChunks(ctx, r, run.BatchID)
	if err != nil {
		return nil, err
	}
	for _, s := range states {
		if (s.Status == ChunkDone || s.Status == ChunkOpen) && (opts.ChunkID == "" || s.Chunk.ID == opts.ChunkID) {
			u.seqs = append(u.seqs, s.Chunk.Seq)
			u.updated[s.Chunk.Seq] = s.Updated
		} else if n, ok := split[s.Chunk.Seq]; ok && (s.Status == ChunkPending || s.Status == ChunkFailed) && (opts.ChunkID == "" || s.Chunk.ID == opts.ChunkID) {
			// Sub-chunks committed, the plan chunk not done (adapt.go).
			u.seqs = append(u.seqs, s.Chunk.Seq)
			u.updated[s.Chunk.Seq] = n
		}
	}
	if opts.ChunkID != "" && !slices.ContainsFunc(states, func(s backfilltype.ChunkState) bool { return s.Chunk.ID == opts.ChunkID }) {
		return nil, fmt.Errorf("backfill: rollback of batch %d: %w: no chunk %q", run.BatchID, ErrInvalidConfig, opts.ChunkID)
	}
	slices.Reverse(u.seqs) // reverse order: the last change first (OrderChunks below refines it)
	scope := backfilltype.RollbackScope{BatchID: run.BatchID, Seqs: u.seqs, Exclude: opts.exclude}
	if plan.Time != nil {
		scope.ChunkColumn, scope.Zone = plan.Time.ChunkColumn, plan.Time.Zone
	}
	// A single chunk's inserted rows are found by lineage within the
	// chunk's bounds of Job.ChunkColumn; a whole batch's by lineage alone.
	if opts.ChunkID != "" {
		i := slices.IndexFunc(states, func(s backfilltype.ChunkState) bool { return s.Chunk.ID == opts.ChunkID })
		u.one = &states[i]
		scope.Chunk = u.one
		if scope.ChunkColumn == "" && u.one.Inserted > 0 {
			return nil, fmt.Errorf("backfill: rollback of batch %d chunk %s: %w: the chunk inserted %d rows and the job has no ChunkColumn to find them by; roll back the whole batch",
				run.BatchID, opts.ChunkID, ErrUnsupported, u.one.Inserted)
		}
	}
	err = pgstore.ReadTx(ctx, r.db, func(tx sqlx.ExtContext) (err error) {
		if u.rb, err = r.caps.mergeUndo.UndoRollback(ctx, tx, r.caps.rollback, info, scope); err != nil {
			return err
		}
		if co, ok := u.rb.(pgstore.ChunkOrder); ok {
			// Reverse commit order, which at Concurrency > 1 need not be
			// reverse plan order.
			u.seqs, err = co.OrderChunks(ctx, tx)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return u, nil
}

// conflicts returns the report with the rows later batches still applied
// changed or delivered unchanged. Unless it is a preview, it checks
// holding the target's merge lock ([undoRollback.lockedTx]).
func (u *undoRollback) conflicts(ctx context.Context) (RollbackReport, error) {
	ctx = pgstore.WithPurpose(ctx, "find the rollback's conflicts", 0)
	rep := RollbackReport{BatchID: u.run.BatchID, Preview: u.opts.Preview, Status: u.run.Status}
	var c RollbackConflicts
	err := pgstore.InBoundedTx(ctx, u.r.db, func(tx sqlx.ExtContext) (err error) {
		if !u.opts.Preview {
			if err := u.lockTarget(ctx, tx); err != nil {
				return err
			}
		}
		c, err = u.rb.Conflicts(ctx, tx)
		return err
	})
	if err != nil {
		return rep, err
	}
	rep.ConflictsDelivered, u.deliveredDeleted = c.Delivered, c.DeliveredDeleted
	rep.Conflicts = c.Changed + c.Delivered
	rep.ConflictRows = c.Rows
	rep.ConflictBatches = conflictBatches(c)
	slices.SortFunc(rep.ConflictRows, func(a, b RollbackConflict) int { return strings.Compare(a.Key, b.Key) })
	rep.ConflictRows = rep.ConflictRows[:min(100, len(rep.ConflictRows))]
	for _, c := range rep.ConflictRows {
		rep.ConflictKeys = append(rep.ConflictKeys, c.Key)
	}
	return rep, nil
}

// preview adds to rep what the rollback would delete and restore.
func (u *undoRollback) preview(ctx context.Context, rep RollbackReport) (RollbackReport, error) {
	ctx = pgstore.WithPurpose(ctx, "preview the rollback", 0)
	rep.Chunks = len(u.seqs)
	err := pgstore.ReadTx(ctx, u.r.db, func(tx sqlx.ExtContext) (err error) {
		rep.Deleted, rep.Restored, err = u.rb.Preview(ctx, tx, u.opts.Force)
		return err
	})
	if err != nil {
		return rep, err
	}
	if !u.opts.Force {
		// Without Force those rows stay, as the changed ones do.
		rep.Deleted = max(0, rep.Deleted-u.deliveredDeleted)
		rep.Restored = max(0, rep.Restored-(rep.ConflictsDelivered-u.deliveredDeleted))
	}
	return rep, nil
}

// apply rolls the chunks back, one transaction each, then finishes the
// batch (or chunk) and records it in the audit log.
func (u *undoRollback) apply(ctx context.Context, rep RollbackReport) (RollbackReport, error) {
	run, opts, db := u.run, u.opts, u.r.db
	if len(u.seqs) > 0 {
		// Visible even if this call is interrupted: who started it and why.
		started, _ := json.Marshal(map[string]any{"why": opts.Why, "chunk": opts.ChunkID, "force": opts.Force, "chunks": len(u.seqs),
			"conflicts_overridden": rep.Conflicts * boolInt(opts.Force), "conflict_rows": conflictStrings(rep.ConflictRows, 20)})
		if err := u.r.caps.rollback.RecordEvent(ctx, db, backfilltype.Event{BatchID: run.BatchID, Job: run.Job, Kind: "rollback_started", Actor: opts.Actor, Detail: started}); err != nil {
			return rep, err
		}
	}
	seqs := u.seqs
	if sr, ok := u.rb.(pgstore.SliceRollback); ok && u.one == nil && u.info.Target.Mode != History {
		// A whole batch: slices of chunks, one transaction each.
		var err error
		if rep, seqs, err = u.applySlices(ctx, sr, rep); err != nil {
			return rep, err
		}
	}
	for _, seq := range seqs {
		var deleted, restored int64
		var done bool
		// Holding the target's merge lock, after a new conflict check.
		err := u.lockedTx(ctx, []int{seq}, u.one != nil, func(tx sqlx.ExtContext) (err error) {
			deleted, restored, done, err = u.rb.RollBackChunk(ctx, tx, seq, opts.Force)
			return err
		})
		if err != nil {
			return rep, fmt.Errorf("backfill: rollback of batch %d chunk %d: %w", run.BatchID, seq, err)
		}
		if done {
			rep.Chunks++
			rep.Deleted += deleted
			rep.Restored += restored
		}
	}
	if rep.Chunks == 0 && run.Status == RunRolledBack {
		return rep, nil // rolled back already: nothing changes
	}
	kind := "rollback"
	if opts.ChunkID != "" {
		kind = "rollback_chunk"
	}
	var deleted int64
	err := u.lockedTx(ctx, []int{}, true, func(tx sqlx.ExtContext) (err error) {
		deleted, err = u.rb.Finish(ctx, tx, opts.ChunkID == "", opts.Force, func(deleted int64) backfilltype.Event {
			detail, _ := json.Marshal(map[string]any{"why": opts.Why, "chunk": opts.ChunkID, "force": opts.Force, "chunks": rep.Chunks,
				"from": run.Status, "to": rollbackStatus(run.Status, opts.ChunkID),
				"deleted": rep.Deleted + deleted, "restored": rep.Restored, "conflicts_overridden": rep.Conflicts * boolInt(opts.Force),
				"delivered_overridden": rep.ConflictsDelivered * boolInt(opts.Force), "conflict_rows": conflictStrings(rep.ConflictRows, 20)})
			return backfilltype.Event{BatchID: run.BatchID, Job: run.Job, Kind: kind, Actor: opts.Actor, Detail: detail}
		})
		return err
	})
	if err != nil {
		return rep, fmt.Errorf("backfill: rollback of batch %d: %w", run.BatchID, err)
	}
	rep.Deleted += deleted
	if opts.ChunkID == "" {
		rep.Status = RunRolledBack
	}
	return rep, nil
}

// Slices of a whole-batch rollback: at most sliceRows rows updated by the
// batch (the undo entries restored) and sliceChunks chunks per
// transaction. A transaction holds the target's merge lock, so merges
// into the target wait for it: 100,000 restored rows take about 1-2 s on
// a durable server, and a crash redoes at most that much. Per chunk, the
// transaction's fixed cost (lock, manifest, conflict checks, round trips)
// weighed as much as restoring 1,000-row chunks.
var (
	sliceRows   int64 = 100_000
	sliceChunks       = 200
)

// testBeforeSlice, set by tests, is called before the transaction of
// each slice with the job and the slice's chunks.
var testBeforeSlice atomic.Pointer[func(job string, seqs []int)]

// applySlices rolls the chunks back in slices (consecutive chunks in
// reverse commit order, sliceRows and sliceChunks at most), one
// transaction each, and returns the report and the chunks left to roll
// back one by one (none, unless an undo log written by earlier versions
// holds inserted keys).
func (u *undoRollback) applySlices(ctx context.Context, sr pgstore.SliceRollback, rep RollbackReport) (RollbackReport, []int, error) {
	seqs := u.seqs
	for len(seqs) > 0 {
		n, rows := 0, int64(0)
		for n < len(seqs) && n < sliceChunks && (n == 0 || rows+u.updated[seqs[n]] <= sliceRows) {
			rows += u.updated[seqs[n]]
			n++
		}
		slice := seqs[:n]
		if h := testBeforeSlice.Load(); h != nil {
			(*h)(u.run.Job, slice)
		}
		var restored int64
		var done int
		var deleted int64
		err := u.sliceTx(ctx, sr, slice, func(tx sqlx.ExtContext, checked bool) (err error) {
			if !checked {
				restored, done, err = sr.RollBackChunks(ctx, tx, slice, u.opts.Force)
				return err
			}
			// Checked for conflicts: chunk by chunk, in reverse commit
			// order, each restoring its own prior images.
			restored, done, deleted = 0, 0, 0
			for _, seq := range slice {
				d, rs, ok, err := u.rb.RollBackChunk(ctx, tx, seq, u.opts.Force)
				if err != nil {
					return err
				}
				if ok {
					done++
					restored += rs
					deleted += d
				}
			}
			return nil
		})
		if errors.Is(err, pgstore.ErrSliceLegacy) {
			return rep, seqs, nil // chunk by chunk from here
		}
		if errors.Is(err, ErrRollbackConflict) {
			return rep, nil, err
		}
		if err != nil {
			return rep, nil, fmt.Errorf("backfill: rollback of batch %d chunks %d to %d: %w", u.run.BatchID, slice[0], slice[len(slice)-1], err)
		}
		rep.Chunks += done
		rep.Restored += restored
		rep.Deleted += deleted
		seqs = seqs[n:]
	}
	return rep, nil, nil
}

// stopOpenRun makes a running run whose every unfinished chunk is open
// ([ChunkOpen]) ready for a whole-batch rollback: in one transaction, it
// locks the run's row, checks that no chunk is pending or failed,
// and pauses the run with the rollback's actor and why, so that no call
// claims its chunks again; Rollback then proceeds as for a paused run
// (and, interrupted, resumes on the paused run). A preview changes
// nothing. Any other running run is refused with what to do. The chunks
// in flight (open chunks read again) are waited for after the pause
// commits (rollbackBatch, pgstore.WaitInFlight).
func (r *Runner) stopOpenRun(ctx context.Context, pm backfilldriver.SQLManifest, run Run, opts RollbackOptions) (Run, error) {
	ctx = pgstore.WithPurpose(ctx, "stop the open run", run.BatchID)
	refuse := func(unfinished int) error {
		return fmt.Errorf("backfill: rollback of batch %d: %w: the run is still running with %d chunks pending or failed; finish it first "+
			"(run the job again; a run paused by a gate can be resumed, or rolled back as it is), or start a new run with Job.NewRun, "+
			"which abandons this one; a running run whose only unfinished chunks are open can be rolled back", run.BatchID, ErrInvalidConfig, unfinished)
	}
	if opts.ChunkID != "" {
		return run, fmt.Errorf("backfill: rollback of batch %d: %w: the run is still running (chunks are open); roll back the whole batch, or wait until it completes to roll back one chunk",
			run.BatchID, ErrInvalidConfig)
	}
	countUnfinished := func(db sqlx.ExtContext) (int, error) {
		var n int
		err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
			return sqlx.GetContext(ctx, tx, &n, pm.SQL(`SELECT count(*) FROM {s}.chunks WHERE batch_id = $1 AND status NOT IN ('done', 'open')`), run.BatchID)
		})
		return n, err
	}
	if opts.Preview {
		n, err := countUnfinished(r.db)
		if err != nil {
			return run, err
		}
		if n > 0 {
			return run, refuse(n)
		}
		return run, nil
	}
	err := pgstore.InBoundedTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		var status string
		if err := sqlx.GetContext(ctx, tx, &status, pm.SQL(`SELECT status FROM {s}.runs WHERE batch_id = $1 FOR NO KEY UPDATE`), run.BatchID); err != nil {
			return err
		}
		run.Status = RunStatus(status)
		if run.Status != RunRunning {
			return nil // finished meanwhile: Rollback goes on with its status
		}
		n, err := countUnfinished(tx)
		if err != nil {
			return err
		}
		if n > 0 {
			return refuse(n)
		}
		// The operator's free text, stored as the manifest stores it.
		reason := pgstore.ManifestText(fmt.Sprintf("rollback requested by %s: %s", opts.Actor, opts.Why))
		if _, err := tx.ExecContext(ctx, pm.SQL(`UPDATE {s}.runs SET status = 'paused', last_error = $2, updated_at = now() WHERE batch_id = $1`), run.BatchID, reason); err != nil {
			return err
		}
		run.Status, run.LastError = RunPaused, reason
		detail, _ := json.Marshal(map[string]string{"reason": reason})
		return pm.RecordEvent(ctx, tx, backfilltype.Event{BatchID: run.BatchID, Job: run.Job, Kind: "run_paused", Actor: opts.Actor, Detail: detail})
	})
	if err != nil {
		return run, err
	}
	return run, nil
}

// conflictList renders up to 10 conflicting rows for an error or a log
// line, saying how many more there are.
func conflictList(rows []RollbackConflict, total int64) string {
	s := strings.Join(conflictStrings(rows, 10), ", ")
	if more := total - int64(min(10, len(rows))); more > 0 {
		s += fmt.Sprintf(" and %d more (RollbackReport.ConflictRows lists 100)", more)
	}
	return s
}

// conflictBatches returns the later batches of c (c.Batches, or those of
// c.Rows when the UndoRollback lists none), each once, newest first.
func conflictBatches(c RollbackConflicts) []int64 {
	bs := slices.Clone(c.Batches)
	if bs == nil {
		for _, r := range c.Rows {
			bs = append(bs, r.Batch)
		}
	}
	bs = slices.DeleteFunc(bs, func(b int64) bool { return b == 0 }) // no lineage: no batch to name
	slices.Sort(bs)
	slices.Reverse(bs)
	return slices.Compact(bs)
}

// namedBatches is " (batch 3)" naming the conflicts' later batches bs
// (ConflictBatches) for an error, or "" for none known.
func namedBatches(bs []int64) string {
	if len(bs) == 0 {
		return ""
	}
	return " (" + quote.Batches(bs) + ")"
}

// rollBackFirst is the advice of a refused rollback whose conflicts'
// later batches are bs (ConflictBatches, newest first).
func rollBackFirst(bs []int64) string {
	switch len(bs) {
	case 0:
		return "roll those batches back first"
	case 1:
		return "roll back " + quote.Batches(bs) + " first, then this batch,"
	}
	return "roll back " + quote.Batches(bs) + " first, newest first, then this batch,"
}

func conflictStrings(rows []RollbackConflict, n int) []string {
	out := make([]string, 0, min(n, len(rows)))
	for _, c := range rows[:min(n, len(rows))] {
		out = append(out, c.String())
	}
	return out
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func (r *Runner) rollbackRun(ctx context.Context, pm backfilldriver.ManifestRollback, job string, batchID int64) (Run, error) {
	if batchID != 0 {
		run, err := pm.Run(ctx, r.db, batchID)
		if err != nil {
			return Run{}, err
		}
		if run.Job != job {
			return Run{}, fmt.Errorf("backfill: rollback: %w: batch %d belongs to job %q, not %q", ErrInvalidConfig, batchID, run.Job, job)
		}
		return run, nil
	}
	run, err := pm.LatestRun(ctx, r.db, job, RunRunning, RunCompleted, RunFailed, RunPaused, RunRolledBack, RunCancelled)
	if err != nil {
		return Run{}, fmt.Errorf("backfill: rollback of job %q: %w", job, err)
	}
	return run, nil
}

// RollbackModule rolls back module of graph g and every module that
// depends on it, even indirectly (rolling back "flights" rolls back
// "route_stats" built from it too): the latest batch of each of their
// jobs, children before parents (the modules in reverse dependency
// order, a module's jobs in reverse order). Jobs with no run (a disabled
// module never run) are skipped. It previews every job first and
// refuses, changing nothing, if any has conflicts (unless opts.Force):
// rows a later batch outside the set changed or delivered unchanged (see
// [Runner.Rollback]); the set's own later batches, rolled back first, do
// not count. Rows of the other modules' jobs are left as they are.
// opts.BatchID and opts.ChunkID must be zero; g is refused as
// [Runner.RunGraph] refuses it, and an unknown module with
// [ErrInvalidConfig]. The reports are in the order of the rollbacks
// (with opts.Preview, of the previews).
func (r *Runner) RollbackModule(ctx context.Context, g Graph, module string, opts RollbackOptions) ([]RollbackReport, error) {
	if opts.BatchID != 0 || opts.ChunkID != "" {
		return nil, fmt.Errorf("backfill: rollback of module %q: %w: BatchID and ChunkID apply to one job", module, ErrInvalidConfig)
	}
	order, err := g.validate()
	if err != nil {
		return nil, err
	}
	m := g.moduleIndex(module)
	if m < 0 {
		return nil, fmt.Errorf("backfill: rollback of module %q: %w: graph %q has no such module", module, ErrInvalidConfig, g.Name)
	}
	set := g.descendants(m)
	// Children first: the dependency order reversed.
	var jobs []Job
	var names []string
	for i := len(order) - 1; i >= 0; i-- {
		if !set[order[i]] {
			continue
		}
		mod := g.Modules[order[i]]
		names = append(names, mod.Name)
		for k := len(mod.Jobs) - 1; k >= 0; k-- {
			jobs = append(jobs, mod.Jobs[k])
		}
	}
	preview := opts
	preview.Preview = true
	var reports []RollbackReport
	var run []Job
	for _, job := range jobs {
		rep, err := r.Rollback(ctx, job, preview)
		if errors.Is(err, ErrRunNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if rep.Conflicts > 0 && !opts.Force {
			return nil, fmt.Errorf("backfill: rollback of module %q: job %q: %w: %d rows changed or delivered by later batches still applied%s, outside the modules rolled back (%s): %s",
				module, job.Name, ErrRollbackConflict, rep.Conflicts, namedBatches(rep.ConflictBatches), joinNames(names, ", "), conflictList(rep.ConflictRows, rep.Conflicts))
		}
		reports = append(reports, rep)
		run = append(run, job)
		if rep.Status != RunRolledBack {
			preview.exclude = append(preview.exclude, rep.BatchID)
		}
	}
	if opts.Preview {
		return reports, nil
	}
	reports = reports[:0]
	opts.Why = fmt.Sprintf("module %s of graph %s (with its dependents %s): %s", module, g.Name, joinNames(names, ", "), opts.Why)
	for _, job := range run {
		rep, err := r.Rollback(ctx, job, opts)
		reports = append(reports, rep)
		if err != nil {
			return reports, err
		}
	}
	return reports, nil
}

// Unchanged deliveries and rollback. Lineage names only the batch that
// last changed a row, so a row a later batch delivered unchanged still
// names the earlier one. After its merge, each chunk with unchanged rows
// records, per batch that last wrote them, how many it delivered and
// their least and greatest identity (one manifest row per chunk and owner,
// never one per row). A rollback of batch B treats a row of B within the
// bounds a done chunk of a later batch D recorded for owner B as
// delivered by D: exact about which batches, conservative between the
// bounds, never silent. The design note docs/design/rollback.md weighs
// the alternatives.

// RollbackConflict is one row a rollback would delete or restore although
// a later batch that is still applied changed or delivered it.
type RollbackConflict = backfilltype.RollbackConflict
