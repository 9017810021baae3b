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
// capability. One is required of every Manifest:
// [backfilldriver.ManifestLeases], without which NewWithDB returns such
// an error. A wrapper around a Manifest or Merger hides the capabilities
// of what it wraps unless it implements them too.

// RollbackConflicts are the rows a rollback would delete or restore that
// later batches still applied changed or delivered unchanged.
type RollbackConflicts = backfilltype.RollbackConflicts

// capabilities are the optional interfaces of a Runner's Manifest and
// Merger, resolved once by NewWithDB; a nil field is a capability the
// implementation lacks.
type capabilities struct {
	audit       backfilldriver.ManifestAudit
	validations backfilldriver.ManifestValidations // pause, resume and check results
	gates       backfilldriver.ManifestGates
	undo        backfilldriver.ManifestUndoLog
	staging     backfilldriver.ManifestStaging
	sql         backfilldriver.SQLManifest // switch back, a running run's rollback
	rollback    backfilldriver.ManifestRollback
	mergeStage  backfilldriver.MergerStaging
	mergeUndo   backfilldriver.MergerRollback
	isolates    bool // StagingIsolator
	tables      bool // TableStager
	writesUndo  bool // UndoLogWriter
	// workers: registration, heartbeats, leases and fencing; required
	// (never nil in a Runner).
	workers backfilldriver.ManifestLeases
	// waits records the waits of chunks.
	waits backfilldriver.ManifestWaits
	// throttle: throttle periods and live workers (PGManifest only).
	throttle        pgstore.ThrottleManifest
	throttlePeriods backfilldriver.ManifestThrottle
	// control: pause, resume, cancel and knobs (PGManifest only).
	control pgstore.ControlManifest
	// skips records and looks up the fingerprints of Job.SkipUnchanged.
	skips backfilldriver.ManifestSkips
	// approvals: Job.Approval (PGManifest only).
	approvals pgstore.ApprovalManifest
}

// resolveCapabilities looks the capabilities of m and mg up. It returns
// an error wrapping [ErrUnsupported] naming ManifestLeases when m lacks
// it: every chunk runs on the leased path ([execution.runChunk]).
func resolveCapabilities(m Manifest, mg Merger) (capabilities, error) {
	var c capabilities
	c.audit, _ = m.(backfilldriver.ManifestAudit)
	c.validations, _ = m.(backfilldriver.ManifestValidations)
	c.gates, _ = m.(backfilldriver.ManifestGates)
	c.undo, _ = m.(backfilldriver.ManifestUndoLog)
	c.staging, _ = m.(backfilldriver.ManifestStaging)
	c.sql, _ = m.(backfilldriver.SQLManifest)
	c.rollback, _ = m.(backfilldriver.ManifestRollback)
	c.workers, _ = m.(backfilldriver.ManifestLeases)
	c.waits, _ = m.(backfilldriver.ManifestWaits)
	c.throttle, _ = m.(pgstore.ThrottleManifest)
	c.throttlePeriods, _ = m.(backfilldriver.ManifestThrottle)
	c.control, _ = m.(pgstore.ControlManifest)
	c.skips, _ = m.(backfilldriver.ManifestSkips)
	c.approvals, _ = m.(pgstore.ApprovalManifest)
	c.mergeStage, _ = mg.(backfilldriver.MergerStaging)
	c.mergeUndo, _ = mg.(backfilldriver.MergerRollback)
	if si, ok := mg.(backfilldriver.StagingIsolator); ok {
		c.isolates = si.IsolatesRefusedValues()
	}
	if ts, ok := mg.(backfilldriver.TableStager); ok {
		c.tables = ts.StagesIntoTables()
	}
	if uw, ok := mg.(backfilldriver.UndoLogWriter); ok {
		c.writesUndo = uw.WritesUndoLog()
	}
	return c, need(c.workers != nil, "ManifestLeases", "a Runner leases every chunk in the manifest, extracts it outside any transaction and fences the lease in the chunk's transaction")
}

// need returns an error wrapping [ErrUnsupported] naming capability what
// (an interface name) when has is false, for use before any work.
func need(has bool, what, why string) error {
	if has {
		return nil
	}
	return fmt.Errorf("%w: %s (%s)", ErrUnsupported, why, what)
}
