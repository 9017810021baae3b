package backfilldriver

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// ManifestUndoLog is implemented by manifests that host, in the target's
// database, the undo log and the delivered summary that a merger writing
// them ([UndoLogWriter]) fills in each chunk's transaction
// ([backfilltype.ChunkRef.UndoTable],
// [backfilltype.ChunkRef.DeliveredTable]). backfill.PGManifest does. A job
// rolled back with [backfilltype.RollbackUndoLog] needs it.
type ManifestUndoLog interface {
	// UndoTable returns the undo log's table, quoted and schema-qualified.
	// It is called once per call of backfill.Runner.Run, does not block,
	// and is safe for concurrent use.
	UndoTable() string
	// DeliveredTable returns the delivered summary's table, quoted and
	// SchemaName-qualified, in the manner of UndoTable.
	DeliveredTable() string
}

// ManifestStaging is implemented by manifests that checkpoint the chunks
// of a run published at its end (backfill.PublishAtEnd) as staged, their rows
// kept in a persistent staging table of the run that a merger with
// [MergerStaging] fills. backfill.PGManifest does.
type ManifestStaging interface {
	// StagingTable returns the run's persistent staging table, quoted and
	// SchemaName-qualified. It does not block and is safe for concurrent use.
	StagingTable(batchID int64) string
	// StageChunk checkpoints chunk p.Chunk, claimed in tx, as staged, in
	// tx: p.Read rows of which p.Rejected went to the exception queue
	// (p.Exceptions) and p.Staged to the staging table. It returns an error
	// wrapping [backfilltype.ErrAccounting] when p.Read != p.Rejected +
	// p.Staged, and an error when the chunk is not pending.
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
	Chunk backfilltype.Chunk
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
	Exceptions []backfilltype.Exception
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
// (backfill.PublishAtEnd). The PostgreSQL merger does.
type MergerStaging interface {
	// CreateStaging creates the staging table for rows of info, if it does
	// not exist. It is called once per call of backfill.Runner.Run, before
	// any chunk.
	CreateStaging(ctx context.Context, db sqlx.ExtContext, table string, info backfilltype.TableInfo) error
	// StagePersistent returns a stager that adds chunk seq's rows to
	// table in tx; its Merge ends the staging and merges nothing (a zero
	// MergeResult). Staged reports how many rows it staged.
	StagePersistent(ctx context.Context, tx sqlx.ExtContext, table string, info backfilltype.TableInfo, seq int) (PersistentStager, error)
	// StageFrom returns a stager of info in tx holding the rows of chunk
	// seq in table, as Stage would after they were added; Merge merges
	// them. It returns an error wrapping [backfilltype.ErrAccounting] when
	// table holds another number of the chunk's rows than rows (what the
	// manifest checkpointed).
	StageFrom(ctx context.Context, tx sqlx.ExtContext, info backfilltype.TableInfo, table string, seq int, rows int64) (Stager, error)
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
// which goes to the exception queue (backfill.Config.MaxStagingRejects).
// The PostgreSQL merger does. Without it a refused value fails the chunk.
type StagingIsolator interface {
	// IsolatesRefusedValues reports whether the Runner may isolate
	// refused values; it is called once, by backfill.NewWithDB.
	IsolatesRefusedValues() bool
}

// TableStager is implemented by mergers whose stagers stage a chunk's
// rows into a table of the chunk's database and implement
// [StagingTabler]. The built-in checks of package backfill that read the
// staging table with SQL (every one but CheckExceptionRate) need it: a
// Runner refuses a job with one of them, before any work, when its merger
// lacks it. The PostgreSQL merger has it; the in-memory fakes of
// backfilltest do not.
type TableStager interface {
	// StagesIntoTables reports whether the stagers stage into tables; it
	// is called once, by backfill.NewWithDB.
	StagesIntoTables() bool
}

// UndoLogWriter is implemented by mergers whose stagers write an undo image
// of every row they change to [backfilltype.ChunkRef.UndoTable] and
// summarise unchanged deliveries in [backfilltype.ChunkRef.DeliveredTable],
// in the chunk's transaction. The PostgreSQL merger does.
// [backfilltype.RollbackUndoLog] needs it.
type UndoLogWriter interface {
	// WritesUndoLog reports whether the stagers write the undo log; it is
	// called once, by backfill.NewWithDB.
	WritesUndoLog() bool
}

// MergerRollback is implemented by mergers that roll a batch back from
// the undo log their stagers wrote ([UndoLogWriter]). The PostgreSQL merger
// and backfilltest's Merger do. backfill.Runner.Rollback needs it.
type MergerRollback interface {
	// UndoRollback returns the rollback of scope on info's target, whose
	// manifest is m. It returns an error wrapping
	// [backfilltype.ErrUnsupported] when it cannot roll back with m (the
	// PostgreSQL merger needs a backfill.PGManifest, whose SchemaName holds
	// the undo log).
	UndoRollback(ctx context.Context, db sqlx.ExtContext, m ManifestRollback, info backfilltype.TableInfo, scope backfilltype.RollbackScope) (UndoRollback, error)
}

// SQLManifest is a manifest whose tables live in the target's
// PostgreSQL database, in the schema sql substitutes for {s}: the undo
// log's SQL reads them, and the switch back of a publish mode updates
// them in the same transactions as the target. Only backfill.PGManifest is
// one.
type SQLManifest interface {
	Manifest
	ManifestRollback
	ManifestUndoLog
	// SQL returns q with every {s} replaced by the manifest's schema as a
	// quoted identifier (and {schema} by its name as a quoted literal).
	SQL(q string) string
}

// ManifestWaits is implemented by manifests that record the waits of
// chunks ([backfilltype.Wait]): backfill.PGManifest (table waits) and
// backfilltest's Manifest (in memory). Without it, waits are only logged.
type ManifestWaits interface {
	// RecordWait appends w, in a short transaction of its own (db is not
	// the chunk's transaction, which rolled back).
	RecordWait(ctx context.Context, db sqlx.ExtContext, w backfilltype.Wait) error
	// Waits returns the waits of run batchID in the order recorded.
	Waits(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Wait, error)
}

// ManifestGates is implemented by manifests that keep the evidence of a
// failed quality gate outside the chunk attempt it rolled back;
// backfill.PGManifest and backfilltest.Manifest do. Without it the runner
// records only the failed attempt's check results, and not atomically with
// the pause.
type ManifestGates interface {
	// RecordGateFailure records, in one transaction of its own (db is not
	// the chunk's transaction, which has rolled back), the evidence of
	// attempt p.Attempt of chunk p.ChunkID that a failed gate rolled back:
	// every check's result and the exceptions the attempt had found
	// (write-time and merge-time rejects), both marked with the attempt
	// ([backfilltype.Validation.FailedAttempt],
	// [backfilltype.Exception.FailedAttempt]); it counts the attempt in the
	// chunk's Attempts (with p.Reason as its last error) and pauses the run
	// with p.Reason. All of it commits or none: after a crash before the
	// commit the run is still running, the chunk pending, and the next call
	// judges the chunk again and records it then.
	RecordGateFailure(ctx context.Context, db sqlx.ExtContext, p backfilltype.GateFailure) error
	// FailedAttemptExceptions returns the exceptions recorded by
	// RecordGateFailure, in (chunk Seq, attempt, row) order. They are not
	// part of [Manifest.Exceptions], the queue of rows not loaded by
	// checkpointed chunks.
	FailedAttemptExceptions(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Exception, error)
}

// ManifestSkips is implemented by manifests that record, with a chunk's
// checkpoint, the fingerprints a later replay compares to skip the chunk
// (backfill.Job.SkipUnchanged), and look them up. backfill.PGManifest and
// backfilltest's Manifest do. A job with SkipUnchanged needs it
// ([backfilltype.ErrUnsupported] otherwise, before any work).
type ManifestSkips interface {
	// CompleteChunkFingerprinted is [Manifest.CompleteChunk] that also
	// records fp (its SkipKey, Source, Target and Version, each "" for
	// none; BatchID and Counts are ignored) on the chunk's row, in the same transaction tx
	// (PGManifest: in the same statement), so that a crash loses the
	// checkpoint and the fingerprints together. It replaces whatever the
	// row recorded before.
	CompleteChunkFingerprinted(ctx context.Context, tx sqlx.ExtContext, batchID int64, r backfilltype.ChunkResult, exceptions []backfilltype.Exception, fp ChunkFingerprints) error
	// BaseFingerprints returns the fingerprints recorded by the newest
	// done chunk chunkID of a run of job that recorded skipKey (its
	// [ChunkFingerprints.SkipKey]), in a batch other than batchID, whose
	// run is not rolled back (a rolled back chunk is not done), whatever
	// the scope or plan fingerprint of that run. ok is false when there
	// is no such chunk or it recorded no Source or Target: the newest
	// such chunk is the base, never an older one. fp carries the base
	// chunk's Version as recorded and its Counts. It reads in tx, the
	// chunk's transaction.
	BaseFingerprints(ctx context.Context, tx sqlx.ExtContext, job, skipKey string, batchID int64, chunkID string) (fp ChunkFingerprints, ok bool, err error)
}

// ChunkFingerprints are the fingerprints a load recorded for one chunk
// ([ManifestSkips]): of the chunk's source rows, and of its
// target rows after the merge, as opaque text ("" for none).
type ChunkFingerprints struct {
	// BatchID is the batch whose checkpoint recorded them (set by
	// BaseFingerprints).
	BatchID int64
	// SkipKey is the hex SHA-256 of what determines how the chunk's rows
	// are merged: the run's plan without its scope and chunk IDs, and the
	// target's column types. A later run looks its base up by it, so a
	// run over another scope (part of the range, or more) finds the
	// chunks an earlier run loaded, and a run planned otherwise (another
	// code version, column list, mode, target type...) finds none.
	SkipKey string
	// Source is the multiset hash of the chunk's staged source rows, in
	// the form "v2:rows:lane0:lane1" (the row encoding's version, then
	// hexadecimal lanes; version 1 had no tag). A base recorded under
	// another version never matches: the chunk merges once.
	Source string
	// Target is the multiset hash of the target rows within the chunk's
	// ChunkColumn bounds after the merge: of their row versions (table,
	// ctid and xmin) on a target whose partitions are all heap tables,
	// in the form "tuples:shape:rows:sum" (shape: a hash of the
	// columns' places in the target and the partitions holding the
	// rows), where any write to one of the rows, even of the same values,
	// changes it; otherwise (a column of an enum, range or citext type, a
	// reg* column, a partition not a heap table, or chunk transactions
	// not READ COMMITTED) of their values, in the form "rows:sum".
	Target string
	// Version is the chunk's source version (backfill.ChunkVersioner) read
	// before the extraction whose rows Source hashes ("" for none); a
	// replay whose version is equal skips the extraction too. Recorded
	// only with Source and Target.
	Version string
	// Counts are the base chunk's counts as checkpointed (set by
	// BaseFingerprints; ignored by CompleteChunkFingerprinted): a replay
	// that skips without extracting takes its Read, and extracts when its
	// Rejected is not 0 (rejects are queued only by an extraction).
	Counts backfilltype.Counts
	// Seq is the base chunk's seq in its batch, and Skipped whether its
	// checkpoint skipped its merge (set by BaseFingerprints; ignored by
	// CompleteChunkFingerprinted). A replay that skips the chunk again
	// copies a skipped base's delivered summary instead of reading the
	// chunk's target rows (see pgstore.CopyDelivered).
	Seq     int
	Skipped bool
}

// IsZero reports whether fp records no fingerprint (whatever its
// SkipKey).
func (fp ChunkFingerprints) IsZero() bool { return fp.Source == "" && fp.Target == "" }

// ManifestStatus is implemented by manifests that compute a run's
// progress (backfill.PGManifest). backfill.Runner.Status needs it.
type ManifestStatus interface {
	// Status returns the progress of run batchID, or an error wrapping
	// [backfilltype.ErrRunNotFound].
	Status(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.Status, error)
}

// ManifestThrottle is implemented by manifests that record throttle periods
// and host the job-wide concurrency slots (backfill.Config.JobConcurrency).
// backfill.PGManifest does. backfill.Runner.TimeSplit needs it.
type ManifestThrottle interface {
	// ThrottlePeriods returns the throttle periods of run batchID in the
	// order they started.
	ThrottlePeriods(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.ThrottlePeriod, error)
	// Run returns the run of batchID ([backfilltype.ErrRunNotFound] if none).
	Run(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.Run, error)
}

// ManifestWorkers is implemented by manifests that record the workers of
// a run and their heartbeats (backfill.PGManifest). With it,
// backfill.Runner.Run registers and heartbeats, waits for chunks in flight
// rather than returning, and fences frozen workers
// (backfill.Config.StaleAfter).
type ManifestWorkers interface {
	// Workers returns the workers that worked run batchID, latest first.
	Workers(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Worker, error)
	// RunLiveness returns the liveness of run batchID, or an error
	// wrapping [backfilltype.ErrRunNotFound].
	RunLiveness(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.RunLiveness, error)
}
