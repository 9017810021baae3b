package backfill

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// The capabilities below grow [Manifest] and [Merger] without breaking
// their implementations (as database/sql/driver's ExecerContext grows
// Conn). A [Runner] looks them up once, when it is built ([NewWithDB]),
// and refuses a job that needs one its Manifest or Merger lacks before
// any work, with an error wrapping [ErrUnsupported] that names the
// capability. A wrapper around a Manifest or Merger hides the
// capabilities of what it wraps unless it implements them too.

// ManifestUndoLog is implemented by manifests that host, in the target's
// database, the undo log and the delivered summary that a merger writing
// them ([UndoLogWriter]) fills in each chunk's transaction
// ([ChunkRef.UndoTable], [ChunkRef.DeliveredTable]). [PGManifest] does.
// A job rolled back with [RollbackUndoLog] needs it.
type ManifestUndoLog interface {
	// UndoTable returns the undo log's table, quoted and schema-qualified.
	// It is called once per call of [Runner.Run], does not block, and is
	// safe for concurrent use.
	UndoTable() string
	// DeliveredTable returns the delivered summary's table, quoted and
	// schema-qualified, in the manner of UndoTable.
	DeliveredTable() string
}

// ManifestStaging is implemented by manifests that checkpoint the chunks
// of a run published at its end ([PublishAtEnd]) as staged, their rows
// kept in a persistent staging table of the run that a merger with
// [MergerStaging] fills. [PGManifest] does.
type ManifestStaging interface {
	// StagingTable returns the run's persistent staging table, quoted and
	// schema-qualified. It does not block and is safe for concurrent use.
	StagingTable(batchID int64) string
	// StageChunk checkpoints chunk p.Chunk, claimed in tx, as staged, in
	// tx: p.Read rows of which p.Rejected went to the exception queue
	// (p.Exceptions) and p.Staged to the staging table. It returns an
	// error wrapping [ErrAccounting] when p.Read != p.Rejected + p.Staged,
	// and an error when the chunk is not pending.
	StageChunk(ctx context.Context, tx sqlx.ExtContext, p StageChunkParams) error
	// StagedChunks returns the batch's staged chunks in Seq order, locked
	// in tx (the publish's transaction) until it ends.
	StagedChunks(ctx context.Context, tx sqlx.ExtContext, batchID int64) ([]StagedChunk, error)
}

// StageChunkParams are the arguments of [ManifestStaging.StageChunk]:
// one chunk's checkpoint as staged.
type StageChunkParams struct {
	// BatchID is the run (batch) the chunk belongs to.
	BatchID int64
	// Chunk is the chunk to checkpoint, claimed (pending) in the
	// transaction StageChunk is given; its Seq and ID are used.
	Chunk Chunk
	// Read is the number of source rows the chunk's extract read.
	Read int64
	// Rejected is the number of those rows that went to the exception
	// queue instead of the staging table; len(Exceptions) of them are
	// recorded as Exceptions.
	Rejected int64
	// Staged is the number of rows written to the run's persistent
	// staging table ([ManifestStaging.StagingTable]). Read must equal
	// Rejected + Staged.
	Staged int64
	// Exceptions are the chunk's rejected rows, added to the exception
	// queue with the checkpoint; their BatchID, ChunkID and CreatedAt are
	// set by StageChunk.
	Exceptions []Exception
}

// StagedChunk is a chunk checkpointed as staged ([ManifestStaging]).
type StagedChunk struct {
	Seq      int   `db:"seq"`
	Read     int64 `db:"rows_read"`
	Rejected int64 `db:"rows_rejected"`
	Staged   int64 `db:"rows_staged"`
}

// MergerStaging is implemented by mergers that stage a chunk into a
// run's persistent staging table and merge it from there later
// ([PublishAtEnd]). [PGMerger] does.
type MergerStaging interface {
	// CreateStaging creates the staging table for rows of info, if it
	// does not exist. It is called once per call of [Runner.Run], before
	// any chunk.
	CreateStaging(ctx context.Context, db sqlx.ExtContext, table string, info TableInfo) error
	// StagePersistent returns a stager that adds chunk seq's rows to
	// table in tx; its Merge ends the staging and merges nothing (a zero
	// MergeResult). Staged reports how many rows it staged.
	StagePersistent(ctx context.Context, tx sqlx.ExtContext, table string, info TableInfo, seq int) (PersistentStager, error)
	// StageFrom returns a stager of info in tx holding the rows of chunk
	// seq in table, as Stage would after they were added; Merge merges
	// them. It returns an error wrapping [ErrAccounting] when table holds
	// another number of the chunk's rows than rows (what the manifest
	// checkpointed).
	StageFrom(ctx context.Context, tx sqlx.ExtContext, info TableInfo, table string, seq int, rows int64) (Stager, error)
	// DropStaging drops table in tx, the publish's transaction, after
	// every chunk was merged from it.
	DropStaging(ctx context.Context, tx sqlx.ExtContext, table string) error
}

// PersistentStager is a [Stager] into a persistent staging table
// ([MergerStaging.StagePersistent]).
type PersistentStager interface {
	Stager
	// Staged returns how many rows Add staged.
	Staged() int64
}

// StagingIsolator is implemented by mergers whose stagers stage in the
// chunk's transaction (tx), so that a value PostgreSQL refuses shows as
// a data error when the staging ends, before the merge: the Runner then
// rolls back to a savepoint and stages the chunk again without the row,
// which goes to the exception queue ([Config.MaxStagingRejects]).
// [PGMerger] does. Without it a refused value fails the chunk.
type StagingIsolator interface {
	// IsolatesRefusedValues reports whether the Runner may isolate
	// refused values; it is called once, by [NewWithDB].
	IsolatesRefusedValues() bool
}

// UndoLogWriter is implemented by mergers whose stagers write an undo
// image of every row they change to [ChunkRef.UndoTable] and summarise
// unchanged deliveries in [ChunkRef.DeliveredTable], in the chunk's
// transaction. [PGMerger] does. [RollbackUndoLog] needs it.
type UndoLogWriter interface {
	// WritesUndoLog reports whether the stagers write the undo log; it is
	// called once, by [NewWithDB].
	WritesUndoLog() bool
}

// ManifestRollback is implemented by manifests that keep the bookkeeping
// of a rollback by the undo log ([Runner.Rollback], [RollbackUndoLog]):
// which run to roll back, which of its chunks are rolled back, and the
// audit log. [PGManifest] and backfilltest's Manifest do. A rollback
// needs it, and a [MergerRollback].
type ManifestRollback interface {
	ManifestAudit
	// Run returns the run of batchID ([ErrRunNotFound] if none).
	Run(ctx context.Context, db sqlx.ExtContext, batchID int64) (Run, error)
	// RollBackChunk marks chunk seq of batchID rolled back in tx if it is
	// done or open, and reports whether it was; false (and no change)
	// when an earlier, interrupted rollback marked it already. It locks
	// the chunk's row until tx ends.
	RollBackChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, seq int) (bool, error)
	// RollBackRun sets the status of run batchID to rolled_back in tx.
	RollBackRun(ctx context.Context, tx sqlx.ExtContext, batchID int64) error
}

// MergerRollback is implemented by mergers that roll a batch back from
// the undo log their stagers wrote ([UndoLogWriter]). [PGMerger] and
// backfilltest's Merger do. [Runner.Rollback] needs it.
type MergerRollback interface {
	// UndoRollback returns the rollback of scope on info's target, whose
	// manifest is m. It returns an error wrapping [ErrUnsupported] when
	// it cannot roll back with m (PGMerger needs a [PGManifest], whose
	// schema holds the undo log).
	UndoRollback(ctx context.Context, db sqlx.ExtContext, m ManifestRollback, info TableInfo, scope RollbackScope) (UndoRollback, error)
}

// RollbackScope is what one call of [Runner.Rollback] rolls back.
type RollbackScope struct {
	// BatchID is the batch rolled back.
	BatchID int64
	// Seqs are the chunks rolled back (done or open), in reverse order.
	Seqs []int
	// Chunk is the one chunk rolled back ([RollbackOptions.ChunkID]), or
	// nil for the whole batch.
	Chunk *ChunkState
	// Exclude are batches rolled back before this one by the same call
	// ([Runner.RollbackModule]): their changes do not conflict.
	Exclude []int64
	// ChunkColumn and Zone are the plan's: they find the rows one chunk
	// inserted ("": unknown).
	ChunkColumn, Zone string
}

// RollbackConflicts are the rows a rollback would delete or restore that
// later batches still applied changed or delivered unchanged.
type RollbackConflicts struct {
	// Changed counts the rows later batches changed (lineage UpdatedBy);
	// Delivered those they delivered unchanged, DeliveredDeleted how many
	// of these the rollback would delete (the rest it would restore).
	Changed, Delivered, DeliveredDeleted int64
	// Rows lists up to 100 of each kind, in any order.
	Rows []RollbackConflict
}

// UndoRollback is the rollback of one [RollbackScope] by the undo log
// ([MergerRollback]). The Runner calls Conflicts, then Preview or, one
// transaction each, RollBackChunk for every chunk of the scope in its
// order and Finish. force rolls back the conflicting rows too.
type UndoRollback interface {
	// Conflicts finds the rows later batches still applied changed or
	// delivered unchanged.
	Conflicts(ctx context.Context, db sqlx.ExtContext) (RollbackConflicts, error)
	// Preview counts the rows the rollback would delete and restore.
	Preview(ctx context.Context, db sqlx.ExtContext, force bool) (deleted, restored int64, err error)
	// RollBackChunk rolls back chunk seq in tx, marking it rolled back
	// in the manifest ([ManifestRollback.RollBackChunk]): rows it
	// updated get their earliest prior image back, rows it inserted are
	// deleted. done is false, and nothing changes, when the chunk was
	// rolled back already.
	RollBackChunk(ctx context.Context, tx sqlx.ExtContext, seq int, force bool) (deleted, restored int64, done bool, err error)
	// Finish ends the rollback in tx: for a whole batch (whole) it
	// deletes the rows the batch inserted that remain and sets the run
	// rolled back ([ManifestRollback.RollBackRun]); then it records
	// event(deleted) in the audit log.
	Finish(ctx context.Context, tx sqlx.ExtContext, whole, force bool, event func(deleted int64) Event) (deleted int64, err error)
}

// sqlManifest is a manifest whose tables live in the target's
// PostgreSQL database, in the schema sql substitutes for {s}: the undo
// log's SQL reads them, and the switch back of a publish mode updates
// them in the same transactions as the target. Only [PGManifest] is one.
type sqlManifest interface {
	Manifest
	ManifestRollback
	ManifestUndoLog
	sql(q string) string
}

// capabilities are the optional interfaces of a Runner's Manifest and
// Merger, resolved once by NewWithDB; a nil field is a capability the
// implementation lacks.
type capabilities struct {
	audit       ManifestAudit
	validations ManifestValidations // pause, resume and check results
	gates       ManifestGates
	undo        ManifestUndoLog
	staging     ManifestStaging
	sql         sqlManifest // switch back, a running run's rollback
	rollback    ManifestRollback
	mergeStage  MergerStaging
	mergeUndo   MergerRollback
	isolates    bool // StagingIsolator
	writesUndo  bool // UndoLogWriter
	// workers: heartbeats, leases and fencing (PGManifest only).
	workers workerManifest
	// waits records the waits of chunks (backfill_timeouts.go).
	waits ManifestWaits
	// throttle: throttle periods and job slots (PGManifest only).
	throttle        throttleManifest
	throttlePeriods ManifestThrottle
	// control: pause, resume, cancel and knobs (PGManifest only).
	control controlManifest
	// skips records and looks up the fingerprints of Job.SkipUnchanged.
	skips ManifestSkips
}

func resolveCapabilities(m Manifest, mg Merger) capabilities {
	var c capabilities
	c.audit, _ = m.(ManifestAudit)
	c.validations, _ = m.(ManifestValidations)
	c.gates, _ = m.(ManifestGates)
	c.undo, _ = m.(ManifestUndoLog)
	c.staging, _ = m.(ManifestStaging)
	c.sql, _ = m.(sqlManifest)
	c.rollback, _ = m.(ManifestRollback)
	c.workers, _ = m.(workerManifest)
	c.waits, _ = m.(ManifestWaits)
	c.throttle, _ = m.(throttleManifest)
	c.throttlePeriods, _ = m.(ManifestThrottle)
	c.control, _ = m.(controlManifest)
	c.skips, _ = m.(ManifestSkips)
	c.mergeStage, _ = mg.(MergerStaging)
	c.mergeUndo, _ = mg.(MergerRollback)
	if si, ok := mg.(StagingIsolator); ok {
		c.isolates = si.IsolatesRefusedValues()
	}
	if uw, ok := mg.(UndoLogWriter); ok {
		c.writesUndo = uw.WritesUndoLog()
	}
	return c
}

// need returns an error wrapping [ErrUnsupported] naming capability what
// (an interface name) when has is false, for use before any work.
func need(has bool, what, why string) error {
	if has {
		return nil
	}
	return fmt.Errorf("%w: %s (%s)", ErrUnsupported, why, what)
}
