package backfill

import (
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// RunStatus is the state of a run (one batch) in the manifest.
type RunStatus = backfilltype.RunStatus

const (
	// RunRunning: chunks remain to be done; running the job resumes it.
	RunRunning = backfilltype.RunRunning
	// RunCompleted: every chunk is done.
	RunCompleted = backfilltype.RunCompleted
	// RunFailed: a chunk failed for good; running the job again retries
	// the failed chunks and resumes.
	RunFailed = backfilltype.RunFailed
	// RunPaused: a quality gate failed, a throttle reached its critical
	// level, or an operator paused the run ([Runner.Pause], the SQL
	// function pause); nothing more is claimed (chunks in flight finish)
	// until [Runner.Resume] or the SQL function resume records who resumed
	// it and why.
	RunPaused = backfilltype.RunPaused
	// RunRolledBack: the run's changes were withdrawn by a rollback.
	RunRolledBack = backfilltype.RunRolledBack
	// RunAbandoned: a newer run of the same job was started with
	// [Job.NewRun]; this run will not be resumed. Its completed chunks
	// stay in the target.
	RunAbandoned = backfilltype.RunAbandoned
	// RunCancelled: an operator cancelled the run ([Runner.Cancel],
	// the SQL function cancel): its chunks in flight rolled back (pending
	// again), its done chunks stay in the target. Terminal until resumed
	// explicitly ([Runner.Resume], the SQL function resume): [Runner.Run]
	// returns [ErrRunCancelled] and does not restart it; [Job.NewRun]
	// starts a new run beside it. [Runner.Rollback] can withdraw it.
	RunCancelled = backfilltype.RunCancelled
)

// ChunkStatus is the state of one chunk of a run.
type ChunkStatus = backfilltype.ChunkStatus

const (
	// ChunkPending: not yet completed (never tried, or a retryable attempt
	// failed, or its worker crashed). Claimable.
	ChunkPending = backfilltype.ChunkPending
	// ChunkDone: merged and checkpointed; never extracted again by this run.
	ChunkDone = backfilltype.ChunkDone
	// ChunkFailed: the last attempt failed for good; reset to pending when
	// the run is resumed.
	ChunkFailed = backfilltype.ChunkFailed
	// ChunkOpen: merged and checkpointed, but not final: the chunk's end
	// lay after the run's horizon (the watermark of [Job.Watermark], or
	// the time the chunk was read), so rows of its interval may still
	// arrive in the source. It is not claimed again in the same call; the
	// next [Runner.Run] or [Runner.Resume] of the run sets it pending and
	// reads it again. Its counts and exceptions always describe the chunk
	// as it stands, not the sum of its reads: each read replaces the
	// exceptions of the one before, and its counts combine with the
	// chunk's as [backfilltype.Counts.Reread] says (Read is the latest
	// read's; rows an earlier read inserted or changed stay counted as
	// such). A run with an open chunk is not completed: [Runner.Run]
	// returns [ErrChunksOpen], and [Runner.Rollback] can withdraw it.
	ChunkOpen = backfilltype.ChunkOpen
)

// Plan is a job frozen at the start of a run: scope, chunks, target and
// code version. Its Fingerprint (hex SHA-256 of the canonical JSON of every
// field but Chunks' Seq) decides whether a later call resumes the run.
type Plan = backfilltype.Plan

// Run is one run (one batch) as recorded in the manifest.
type Run = backfilltype.Run

// Exception is one row of the exception queue: a row that was not loaded,
// with the reason.
type Exception = backfilltype.Exception

// Manifest is the durable ledger of runs, chunks and the exception queue.
//
// Every method takes the executor to use: the Runner passes the chunk's
// transaction to CompleteChunk (after the lease's fence,
// [backfilldriver.ManifestLeases], which every Manifest of a Runner must
// implement) so that the checkpoint commits, or rolls back, with the
// merge. Implementations must be safe for concurrent use by several
// goroutines and several processes. [PGManifest] is the PostgreSQL
// implementation; backfilltest.Manifest the in-memory fake;
// backfilltest.TestManifest the conformance suite.
type Manifest = backfilldriver.Manifest

// PGManifest is the PostgreSQL [Manifest]. It keeps its tables in one
// schema (default "backfill") of the target database, so that a chunk's
// checkpoint commits in the same transaction as its merge. Tables: runs,
// chunks, exceptions (the exception queue), events (the audit log) and
// schema_migrations.
type PGManifest = pgstore.Manifest

// NewPGManifest returns a PostgreSQL manifest in schema ("" means
// "backfill"). The schema is created and migrated by its Migrate method
// (an administrator's step, "backfill migrate"), or by its Init (which
// [Runner.Run] calls) when the role may. schema is one identifier, taken
// literally and always quoted: "ops.backfill" is the schema of that name
// (with a dot), never schema backfill of a database ops; do not quote it
// yourself.
func NewPGManifest(schema string) *PGManifest {
	return pgstore.NewManifest(schema)
}

// ManifestAction is what a caller is about to do with a [PGManifest]:
// its CheckAccess and VersionFor methods check, and a [*PrivilegeError]
// names, the privileges of that action and its fix.
type ManifestAction = pgstore.Action

// The actions of [ManifestAction].
const (
	// ActionRun runs, resumes, validates and rolls back jobs: a loader's
	// privileges ([PGManifest.Grants]; fix: backfill migrate --grant
	// ROLE, or the statements of backfill grants ROLE).
	ActionRun = pgstore.ActionRun
	// ActionRead reads the manifest (status, events, exceptions, runs,
	// chunks, report, validations): USAGE on its schema and SELECT on its
	// tables, an operator role's ([PGManifest.OperatorGrants]; fix:
	// GRANT OPERATOR TO ROLE).
	ActionRead = pgstore.ActionRead
	// ActionControl steers runs (pause, resume, cancel, set): USAGE on
	// the schema and EXECUTE on the control functions, an operator
	// role's.
	ActionControl = pgstore.ActionControl
)

// The Init, Migrate and Version methods of [PGManifest] create, migrate
// and read the manifest's schema; [PrivilegeError] lists what the
// runtime role needs.
