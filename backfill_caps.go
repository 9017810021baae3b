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
	// StageChunk checkpoints chunk c, claimed in tx, as staged: read rows
	// of which rejected went to the exception queue (exceptions) and
	// staged to the staging table, in tx. It returns an error wrapping
	// [ErrAccounting] when read != rejected + staged.
	StageChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, c Chunk, read, rejected, staged int64, exceptions []Exception) error
	// StagedChunks returns the batch's staged chunks in Seq order, locked
	// in tx (the publish's transaction) until it ends.
	StagedChunks(ctx context.Context, tx sqlx.ExtContext, batchID int64) ([]StagedChunk, error)
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

// sqlManifest is a manifest whose tables live in the target's
// PostgreSQL database, in the schema sql substitutes for {s}: the undo
// log's rollback and the switch back of a publish mode update them in
// the same transactions as the target. Only [PGManifest] is one.
type sqlManifest interface {
	Manifest
	ManifestAudit
	ManifestUndoLog
	// Run returns the run of batchID ([ErrRunNotFound] if none).
	Run(ctx context.Context, db sqlx.ExtContext, batchID int64) (Run, error)
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
	sql         sqlManifest // rollback and switch back
	mergeStage  MergerStaging
	isolates    bool // StagingIsolator
	writesUndo  bool // UndoLogWriter
}

func resolveCapabilities(m Manifest, mg Merger) capabilities {
	var c capabilities
	c.audit, _ = m.(ManifestAudit)
	c.validations, _ = m.(ManifestValidations)
	c.gates, _ = m.(ManifestGates)
	c.undo, _ = m.(ManifestUndoLog)
	c.staging, _ = m.(ManifestStaging)
	c.sql, _ = m.(sqlManifest)
	c.mergeStage, _ = mg.(MergerStaging)
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
