package backfill

import (
	"errors"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

var (
	// ErrEmptyScope is returned by [backfilltype.Chunker.Chunks] when the
	// scope holds no chunk (start not before end, an empty list).
	ErrEmptyScope = backfilltype.ErrEmptyScope
	// ErrInvalidScope is returned by chunker constructors and
	// [backfilltype.Chunker.Chunks] for bounds that cannot be chunked (a
	// non-positive step, a nil location, duplicate list items).
	ErrInvalidScope = backfilltype.ErrInvalidScope
	// ErrPlanChanged is returned by [Runner.Run] when the latest run of the
	// same job name (incomplete, completed or rolled back) has a different
	// plan fingerprint and [Job.NewRun] is false. The error text says which
	// fields changed.
	ErrPlanChanged = backfilltype.ErrPlanChanged
	// ErrNoUniqueKey is returned by [backfilldriver.Merger.Prepare] when
	// the target has no unique index or constraint on exactly the business
	// key columns.
	ErrNoUniqueKey = backfilltype.ErrNoUniqueKey
	// ErrTargetNotFound is returned by [backfilldriver.Merger.Prepare] when
	// the target table or one of the named columns does not exist.
	ErrTargetNotFound = backfilltype.ErrTargetNotFound
	// ErrAccounting is returned (wrapped in a [*ChunkError]) when a chunk's
	// counts do not balance: read != inserted + updated + unchanged +
	// rejected + deduplicated. The chunk is rolled back.
	ErrAccounting = backfilltype.ErrAccounting
	// ErrInvalidConfig is returned by [New] and [Runner.Run] for a Config or
	// Job that fails validation; the message names the field.
	ErrInvalidConfig = backfilltype.ErrInvalidConfig
	// ErrTooManyRejects is returned (wrapped in a [*ChunkError]) when a
	// chunk rejects more rows than [Config.MaxRejectsPerChunk] (every
	// kind counted: the extractor's Reject, conversion rejects, values
	// refused while staging, merge conflicts and rows the target
	// refuses), or when PostgreSQL refuses more values while staging than
	// [Config.MaxStagingRejects] or more rows while merging than
	// [Config.MaxMergeRefusals].
	ErrTooManyRejects = backfilltype.ErrTooManyRejects
	// ErrWriterClosed is returned by [RowWriter] methods called after the
	// extractor returned.
	ErrWriterClosed = backfilltype.ErrWriterClosed
	// ErrHistoryIntervals is returned (wrapped in a [*ChunkError]) when a
	// History merge would leave a key's valid_from/valid_to intervals
	// overlapping or with a gap; the chunk is rolled back. Since the merge
	// recomputes the intervals of the keys it touches, only a concurrent
	// writer that does not take the merge's key locks (or a trigger) can
	// cause it: the error says so and is retryable ([IsRetryable]).
	ErrHistoryIntervals = backfilltype.ErrHistoryIntervals
	// ErrUnsupported is returned when a feature needs an optional
	// interface (such as [backfilldriver.ManifestAudit]) that the configured
	// implementation lacks.
	ErrUnsupported = backfilltype.ErrUnsupported
	// ErrNoWatermark is returned by [Runner.Handoff] when the job has no
	// completed run with a recorded watermark.
	ErrNoWatermark = backfilltype.ErrNoWatermark
	// ErrRunAbandoned is returned by [Runner.Run] when the run it was
	// working on was abandoned by a newer run of the same job
	// ([Job.NewRun]) in another process: this call stopped claiming chunks.
	ErrRunAbandoned = backfilltype.ErrRunAbandoned
	// ErrExtractorPanic is returned (wrapped in a [*ChunkError]) when an
	// extractor panicked; the chunk rolls back and is not retried.
	ErrExtractorPanic = backfilltype.ErrExtractorPanic
	// ErrExtractor is returned (wrapped in a [*ChunkError]) when an
	// extractor wrote a row that no data can make valid: a wrong number of
	// values, or a Go type that no conversion accepts for its column (a
	// struct or a channel for an integer column, a bool for a timestamp).
	// It is a bug in the extractor, not bad data: the chunk rolls back and
	// is not retried, and the error names the chunk, the row, the column,
	// the columns expected and what was passed. Values of an acceptable
	// type that a column cannot hold (out of range, unparsable text, NULL
	// in a NOT NULL column) are bad data instead and go to the exception
	// queue.
	ErrExtractor = backfilltype.ErrExtractor
	// ErrNotPaused is returned by [Runner.Resume] when the job's latest
	// run is not paused.
	ErrNotPaused = backfilltype.ErrNotPaused
	// ErrRunPaused is returned by [Runner.Run] when the job's run is
	// paused (a quality gate failed, a throttle reached its critical
	// level, or an operator paused it: [Runner.Pause], the SQL function
	// pause) and the call does not wait for the resume: the pause is one
	// of this Runner's [Runner.PauseOnSignal], or [Config.ReturnOnPause]
	// is set, or ctx ended the wait, or the manifest has no control plane
	// (the chunks in flight finished first). By default Run waits for
	// the resume instead, as [Work] always does. Resume it with the SQL
	// function resume, the CLI's "backfill resume" or [Runner.Resume];
	// the message says how.
	ErrRunPaused = backfilltype.ErrRunPaused
	// ErrRunCancelled is returned by [Runner.Run] when the job's run was
	// cancelled ([Runner.Cancel], the SQL function cancel), before or
	// during the call: the chunks in flight rolled back and the run is
	// [RunCancelled]. A later Run of the job does not restart it (it
	// returns this error again): resume it explicitly with
	// [Runner.Resume] or the SQL function resume, or start a new run
	// with [Job.NewRun].
	ErrRunCancelled = backfilltype.ErrRunCancelled
	// ErrRunStatus is returned by the control functions ([Runner.Pause],
	// [Runner.Cancel], [Runner.SetKnob], the SQL functions) when
	// the run's status does not allow the decision (pausing a completed
	// run, resuming a running one); the message names the status.
	ErrRunStatus = backfilltype.ErrRunStatus
	// ErrGateFailed is returned (wrapped in a [*ChunkError]) when a check
	// of severity error failed: the chunk rolled back and the run paused.
	ErrGateFailed = backfilltype.ErrGateFailed
	// ErrRollbackConflict is returned by [Runner.Rollback] when rows the
	// batch wrote were changed or delivered unchanged by a later batch
	// that is still applied; nothing was changed.
	ErrRollbackConflict = backfilltype.ErrRollbackConflict
	// ErrAlreadyCompleted is returned by [Runner.Run] (with the run's
	// Report) when the latest run of the job with the same plan is
	// completed, or was rolled back: nothing was extracted or written
	// (Report.ChunksRun is 0, Report.Resumed false). Set [Job.NewRun] to
	// restate the scope in a new run.
	ErrAlreadyCompleted = backfilltype.ErrAlreadyCompleted
	// ErrPublishBlocked is returned by [Runner.Run] when the view switch of
	// [PublishVersionedView] timed out on every try behind sessions holding
	// locks on the view (the message names them). The run is completed but
	// not published (an [backfilltype.EventPublishBlocked] and the run's
	// last_error say so); running the job again publishes it.
	// [Runner.Rollback] of a published versioned-view batch returns it too
	// when its switch back is blocked so; nothing changed then.
	ErrPublishBlocked = backfilltype.ErrPublishBlocked
	// ErrChunksOpen is returned by [Runner.Run] (joined with any other
	// error, with the Report) when the call ends with chunks left
	// [ChunkOpen]: time chunks that end after the horizon (the watermark
	// or now) were loaded but are not final, so the run is still running,
	// not completed. Report.ChunksOpen and Report.OpenChunks say which.
	// It is not a failure: run the job again once the horizon has passed
	// their end, or withdraw the run with [Runner.Rollback]. Scripts that
	// treat a nil error as "done" thus never take an unfinished run for a
	// finished one.
	ErrChunksOpen = backfilltype.ErrChunksOpen
	// ErrRunIncomplete is returned by [Runner.Run] (with the run's Report)
	// when the call ended with nothing more to claim and no error, yet
	// chunks of the run are neither done nor open (taken by a worker of
	// another process that then stopped, for instance). The run stays
	// running; running the job again resumes it. A nil error from Run
	// thus always means every chunk is done.
	ErrRunIncomplete = backfilltype.ErrRunIncomplete
	// ErrNoFailedGate is returned (with [ErrInvalidConfig]) by
	// [Runner.AcceptGate] for a chunk that has no failed gate to accept:
	// it never failed one, or its failed gate is not the current verdict
	// on it (the chunk was judged again since, e.g. it completed with an
	// acceptance, while another chunk's gate paused the run). The message
	// names the chunks whose failed gates can be accepted.
	ErrNoFailedGate = backfilltype.ErrNoFailedGate
	// ErrRunNotFound is returned by [Manifest] lookups of an unknown batch.
	ErrRunNotFound = backfilltype.ErrRunNotFound
	// ErrPlanIncomplete is returned by [Runner.RollbackBatch] when the
	// plan the manifest recorded for the batch lacks a field the rollback
	// needs (a plan of an older version, or written by hand); the message
	// names the field (e.g. "target.inserted_by"). Roll it back with
	// [Runner.Rollback] and the job instead.
	ErrPlanIncomplete = backfilltype.ErrPlanIncomplete
	// ErrPrivilege is returned (wrapped in a [*PrivilegeError] that lists
	// every missing privilege with the GRANT statement to run) by
	// [Runner.Run] before it creates or resumes a batch, and by
	// [Runner.Rollback] before it changes anything, when the session's
	// role lacks a privilege the job needs; and (wrapped in a
	// [*ChunkError]) when an Upsert run by a role without UPDATE on the
	// target meets a row it would update: the chunk rolls back.
	ErrPrivilege = backfilltype.ErrPrivilege
	// ErrSchemaBehind is returned by the manifest's Init (called by
	// [Runner.Run] and the Runner's other entry points) when the manifest's
	// schema is older than this library's and the session's role cannot
	// migrate it (it lacks CREATE on the database or the schema, or does
	// not own the tables): an administrator runs the command "backfill
	// migrate" (or the Migrate method of [PGManifest]) once. The message
	// names both versions.
	ErrSchemaBehind = backfilltype.ErrSchemaBehind
	// ErrSchemaMissing marks the error of a statement that found no
	// manifest schema, or no table or function of it (dropped while a run
	// works, or never migrated): an administrator runs the command
	// "backfill migrate" (or the Migrate method of [PGManifest]).
	// errors.Is reports it as [ErrSchemaBehind] too.
	ErrSchemaMissing = backfilltype.ErrSchemaMissing
)

// ChunkError says which chunk failed and why. It wraps the cause.
type ChunkError = backfilltype.ChunkError

// PartialError is returned by [Runner.Run] when some chunks completed
// before a failure. Completed chunks stay completed (they are checkpointed);
// running the same job again resumes with the first incomplete chunk.
type PartialError = backfilltype.PartialError

// IsRetryable reports whether err is a transient database failure for which
// retrying the chunk can succeed: serialization failure (40001), deadlock
// (40P01), lock not available (55P03), a unique violation of the business
// key caused by a concurrent insert of the same key (23505; violations of
// other unique constraints are not retried), [ErrHistoryIntervals] (another
// writer changed the versions of the merged keys meanwhile), connection
// failures (class 08, 57P01-57P03 a server shutting down, restarting or
// terminating the backend, a broken connection, io.EOF, network errors),
// and 57014 query_canceled (a statement timeout: [Config.StatementTimeout];
// it is also what the cancellation of a context looks like, and a Runner
// never retries once its context is done). The Runner retries 40001, 40P01,
// 55P03 and 57014 first as waits, which do not count toward
// [Config.MaxAttempts] ([Config.LockRetries]). See https://www.postgresql.org/docs/15/errcodes-appendix.html.
// A chunk whose rejected rows passed their share of
// [Config.MemoryBudget] only with those the other chunks in flight hold
// is retryable too.
func IsRetryable(err error) bool {
	if errors.Is(err, errMemoryShare) && !errors.Is(err, backfilltype.ErrNotRetryable) {
		return true
	}
	return backfilltype.IsRetryable(err)
}

// Least privilege. An administrator creates and migrates the manifest's
// schema once (the command "backfill migrate", or the Migrate method of
// [PGManifest]); the role that runs jobs then needs no DDL privilege for
// the manifest: the manifest's Init only reads the schema's version when
// it is current.
// What the runtime role needs, and what [Runner.Run] checks before it
// creates or resumes a batch (the target's part is on [Runner.Run]'s
// privilege check, [Runner.checkTargetSchema]):
//
//   - USAGE on the manifest's schema; SELECT, INSERT, UPDATE and DELETE on
//     its tables (SELECT only on events and schema_migrations); EXECUTE on
//     its functions record_event and library_control (the library's own
//     events and its pause on a signal); USAGE on its sequences, if any;
//   - TEMPORARY on the database (staging tables are temporary tables).

// PrivilegeError lists every privilege the session's role lacks for a
// job, with the statements to grant them. It wraps [ErrPrivilege].
type PrivilegeError = pgstore.PrivilegeError
