package backfill

import (
	"fmt"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
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
type ManifestUndoLog = backfilldriver.ManifestUndoLog

// ManifestStaging is implemented by manifests that checkpoint the chunks
// of a run published at its end ([PublishAtEnd]) as staged, their rows
// kept in a persistent staging table of the run that a merger with
// [MergerStaging] fills. [PGManifest] does.
type ManifestStaging = backfilldriver.ManifestStaging

// StageChunkParams are the arguments of [ManifestStaging.StageChunk]:
// one chunk's checkpoint as staged.
type StageChunkParams = backfilldriver.StageChunkParams

// StagedChunk is a chunk checkpointed as staged ([ManifestStaging]).
type StagedChunk = backfilldriver.StagedChunk

// MergerStaging is implemented by mergers that stage a chunk into a
// run's persistent staging table and merge it from there later
// ([PublishAtEnd]). [PGMerger] does.
type MergerStaging = backfilldriver.MergerStaging

// PersistentStager is a [Stager] into a persistent staging table
// ([MergerStaging.StagePersistent]).
type PersistentStager = backfilldriver.PersistentStager

// StagingIsolator is implemented by mergers whose stagers stage in the
// chunk's transaction (tx), so that a value PostgreSQL refuses shows as
// a data error when the staging ends, before the merge: the Runner then
// rolls back to a savepoint and stages the chunk again without the row,
// which goes to the exception queue ([Config.MaxStagingRejects]).
// [PGMerger] does. Without it a refused value fails the chunk.
type StagingIsolator = backfilldriver.StagingIsolator

// UndoLogWriter is implemented by mergers whose stagers write an undo
// image of every row they change to [ChunkRef.UndoTable] and summarise
// unchanged deliveries in [ChunkRef.DeliveredTable], in the chunk's
// transaction. [PGMerger] does. [RollbackUndoLog] needs it.
type UndoLogWriter = backfilldriver.UndoLogWriter

// ManifestRollback is implemented by manifests that keep the bookkeeping
// of a rollback by the undo log ([Runner.Rollback], [RollbackUndoLog]):
// which run to roll back, which of its chunks are rolled back, and the
// audit log. [PGManifest] and backfilltest's Manifest do. A rollback
// needs it, and a [MergerRollback].
type ManifestRollback = backfilldriver.ManifestRollback

// MergerRollback is implemented by mergers that roll a batch back from
// the undo log their stagers wrote ([UndoLogWriter]). [PGMerger] and
// backfilltest's Merger do. [Runner.Rollback] needs it.
type MergerRollback = backfilldriver.MergerRollback

// RollbackScope is what one call of [Runner.Rollback] rolls back.
type RollbackScope = backfilltype.RollbackScope

// RollbackConflicts are the rows a rollback would delete or restore that
// later batches still applied changed or delivered unchanged.
type RollbackConflicts = backfilltype.RollbackConflicts

// UndoRollback is the rollback of one [RollbackScope] by the undo log
// ([MergerRollback]). The Runner calls Conflicts, then Preview or, one
// transaction each, RollBackChunk for every chunk of the scope in its
// order and Finish. force rolls back the conflicting rows too.
type UndoRollback = backfilldriver.UndoRollback

// capabilities are the optional interfaces of a Runner's Manifest and
// Merger, resolved once by NewWithDB; a nil field is a capability the
// implementation lacks.
type capabilities struct {
	audit       ManifestAudit
	validations ManifestValidations // pause, resume and check results
	gates       ManifestGates
	undo        ManifestUndoLog
	staging     ManifestStaging
	sql         backfilldriver.SQLManifest // switch back, a running run's rollback
	rollback    ManifestRollback
	mergeStage  MergerStaging
	mergeUndo   MergerRollback
	isolates    bool // StagingIsolator
	writesUndo  bool // UndoLogWriter
	// workers: heartbeats, leases and fencing (PGManifest only).
	workers pgstore.WorkerManifest
	// waits records the waits of chunks (backfill_timeouts.go).
	waits ManifestWaits
	// throttle: throttle periods and job slots (PGManifest only).
	throttle        pgstore.ThrottleManifest
	throttlePeriods ManifestThrottle
	// control: pause, resume, cancel and knobs (PGManifest only).
	control pgstore.ControlManifest
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
	c.sql, _ = m.(backfilldriver.SQLManifest)
	c.rollback, _ = m.(ManifestRollback)
	c.workers, _ = m.(pgstore.WorkerManifest)
	c.waits, _ = m.(ManifestWaits)
	c.throttle, _ = m.(pgstore.ThrottleManifest)
	c.throttlePeriods, _ = m.(ManifestThrottle)
	c.control, _ = m.(pgstore.ControlManifest)
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
