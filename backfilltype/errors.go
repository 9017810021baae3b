package backfilltype

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/lib/pq"
)

// IsConnectionError reports whether err is a lost or refused connection
// or a server shutting down or starting: class 08, 57P01
// admin_shutdown (also a backend terminated by fencing), 57P02
// crash_shutdown, 57P03 cannot_connect_now, 53300 too_many_connections
// (max_connections or a CONNECTION LIMIT used up by other clients),
// driver.ErrBadConn, io.EOF, network errors (connection refused, reset,
// timeouts).
func IsConnectionError(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var pe *pq.Error
	if errors.As(err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P03", "53300":
			return true
		}
		return strings.HasPrefix(string(pe.Code), "08")
	}
	return false
}

var (
	// ErrEmptyScope is returned by [Chunker.Chunks] when the scope holds no
	// chunk (start not before end, an empty list).
	ErrEmptyScope = errors.New("backfill: empty scope")
	// ErrInvalidScope is returned by chunker constructors and
	// [Chunker.Chunks] for bounds that cannot be chunked (a non-positive
	// step, a nil location, duplicate list items).
	ErrInvalidScope = errors.New("backfill: invalid scope")
	// ErrPlanChanged is returned by backfill.Runner.Run when the latest run
	// of the same job name (incomplete, completed or rolled back) has a
	// different plan fingerprint and backfill.Job.NewRun is false. The
	// error text says which fields changed.
	ErrPlanChanged = errors.New("backfill: plan changed")
	// ErrNoUniqueKey is returned by backfill.Merger.Prepare when the target
	// has no unique index or constraint on exactly the business key
	// columns.
	ErrNoUniqueKey = errors.New("backfill: target has no unique index on the business key")
	// ErrTargetNotFound is returned by backfill.Merger.Prepare when the target
	// table or one of the named columns does not exist.
	ErrTargetNotFound = errors.New("backfill: target not found")
	// ErrAccounting is returned (wrapped in a [*ChunkError]) when a chunk's
	// counts do not balance: read != inserted + updated + unchanged +
	// rejected + deduplicated. The chunk is rolled back.
	ErrAccounting = errors.New("backfill: row accounting does not balance")
	// ErrInvalidConfig is returned by backfill.New and backfill.Runner.Run
	// for a Config or Job that fails validation; the message names the
	// field.
	ErrInvalidConfig = errors.New("backfill: invalid configuration")
	// ErrTooManyRejects is returned (wrapped in a [*ChunkError]) when a
	// chunk rejects more rows than backfill.Config.MaxRejectsPerChunk (every
	// kind counted: the extractor's Reject, conversion rejects, values
	// refused while staging, merge conflicts and rows the target
	// refuses), or when PostgreSQL refuses more values while staging than
	// backfill.Config.MaxStagingRejects or more rows while merging than
	// backfill.Config.MaxMergeRefusals.
	ErrTooManyRejects = errors.New("backfill: too many rejected rows")
	// ErrWriterClosed is returned by backfill.RowWriter methods called
	// after the extractor returned.
	ErrWriterClosed = errors.New("backfill: row writer used after extract returned")
	// ErrHistoryIntervals is returned (wrapped in a [*ChunkError]) when a
	// History merge would leave a key's valid_from/valid_to intervals
	// overlapping or with a gap; the chunk is rolled back. Since the merge
	// recomputes the intervals of the keys it touches, only a concurrent
	// writer that does not take the merge's key locks (or a trigger) can
	// cause it: the error says so and is retryable ([IsRetryable]).
	ErrHistoryIntervals = errors.New("backfill: history intervals do not tile")
	// ErrUnsupported is returned when a feature needs an optional
	// interface (such as backfilldriver.ManifestAudit) that the configured
	// implementation lacks.
	ErrUnsupported = errors.New("backfill: not supported by this implementation")
	// ErrNoWatermark is returned by backfill.Runner.Handoff when the job
	// has no completed run with a recorded watermark.
	ErrNoWatermark = errors.New("backfill: no completed run with a watermark")
	// ErrRunAbandoned is returned by backfill.Runner.Run when the run it
	// was working on was abandoned by a newer run of the same job
	// (backfill.Job.NewRun) in another process: this call stopped claiming
	// chunks.
	ErrRunAbandoned = errors.New("backfill: run abandoned by a newer run")
	// ErrExtractorPanic is returned (wrapped in a [*ChunkError]) when an
	// extractor panicked; the chunk rolls back and is not retried.
	ErrExtractorPanic = errors.New("backfill: extractor panicked")
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
	ErrExtractor = errors.New("backfill: extractor bug")
	// ErrNotPaused is returned by backfill.Runner.Resume when the job's latest
	// run is not paused.
	ErrNotPaused = errors.New("backfill: run is not paused")
	// ErrRunPaused is returned by backfill.Runner.Run when the job's run is
	// paused: a quality gate failed, a throttle reached its critical
	// level, or an operator paused it (backfill.PGManifest.Pause, the SQL
	// function pause), before or during the call (the chunks in flight
	// finished first). Resume it with backfill.Runner.Resume or the SQL
	// function resume.
	ErrRunPaused = errors.New("backfill: run is paused")
	// ErrRunCancelled is returned by backfill.Runner.Run when the job's run
	// was cancelled (backfill.PGManifest.Cancel, the SQL function cancel),
	// before or during the call: the chunks in flight rolled back and the
	// run is [RunCancelled]. A later Run of the job does not restart it (it
	// returns this error again): resume it explicitly with
	// backfill.Runner.Resume or the SQL function resume, or start a new run
	// with backfill.Job.NewRun.
	ErrRunCancelled = errors.New("backfill: run is cancelled")
	// ErrRunStatus is returned by the control functions
	// (backfill.PGManifest.Pause, backfill.PGManifest.Cancel,
	// backfill.PGManifest.Resume, backfill.PGManifest.SetKnob) when the
	// run's status does not allow the decision (pausing a completed run,
	// resuming a running one); the message names the status.
	ErrRunStatus = errors.New("backfill: the run's status does not allow this")
	// ErrGateFailed is returned (wrapped in a [*ChunkError]) when a check
	// of severity error failed: the chunk rolled back and the run paused.
	ErrGateFailed = errors.New("backfill: quality gate failed")
	// ErrRollbackConflict is returned by backfill.Runner.Rollback when rows
	// the batch wrote were changed or delivered unchanged by a later batch
	// that is still applied; nothing was changed.
	ErrRollbackConflict = errors.New("backfill: rollback conflicts with later batches")
	// ErrAlreadyCompleted is returned by backfill.Runner.Run (with the
	// run's Report) when the latest run of the job with the same plan is
	// completed, or was rolled back: nothing was extracted or written
	// (Report.ChunksRun is 0, Report.Resumed false). Set
	// backfill.Job.NewRun to restate the scope in a new run.
	ErrAlreadyCompleted = errors.New("backfill: already completed; nothing done; use Job.NewRun to restate")
	// ErrPublishBlocked is returned by backfill.Runner.Run when the view
	// switch of backfill.PublishVersionedView timed out on every try behind
	// sessions holding locks on the view (the message names them). The run
	// is completed but not published (an [EventPublishBlocked] and the
	// run's last_error say so); running the job again publishes it.
	// backfill.Runner.Rollback of a published versioned-view batch returns
	// it too when its switch back is blocked so; nothing changed then.
	ErrPublishBlocked = errors.New("backfill: publish blocked by sessions holding the view")
	// ErrChunksOpen is returned by backfill.Runner.Run (joined with any
	// other error, with the Report) when the call ends with chunks left
	// [ChunkOpen]: time chunks that end after the horizon (the watermark or
	// now) were loaded but are not final, so the run is still running, not
	// completed. Report.ChunksOpen and Report.OpenChunks say which. It is
	// not a failure: run the job again once the horizon has passed their
	// end, or withdraw the run with backfill.Runner.Rollback. Scripts that
	// treat a nil error as "done" thus never take an unfinished run for a
	// finished one.
	ErrChunksOpen = errors.New("backfill: chunks are still open; the run is not complete; run the job again later")
	// ErrRunIncomplete is returned by backfill.Runner.Run (with the run's
	// Report) when the call ended with nothing more to claim and no error,
	// yet chunks of the run are neither done nor open (taken by a worker of
	// another process that then stopped, for instance). The run stays
	// running; running the job again resumes it. A nil error from Run thus
	// always means every chunk is done.
	ErrRunIncomplete = errors.New("backfill: run not complete: chunks are still pending; run the job again to resume it")
	// ErrNoFailedGate is returned (with [ErrInvalidConfig]) by
	// backfill.Runner.AcceptGate for a chunk that has no failed gate to
	// accept: it never failed one, or its failed gate is not the current
	// verdict on it (the chunk was judged again since, e.g. it completed
	// with an acceptance, while another chunk's gate paused the run). The
	// message names the chunks whose failed gates can be accepted.
	ErrNoFailedGate = errors.New("backfill: the chunk has no failed gate to accept")
	// ErrRunNotFound is returned by backfill.Manifest lookups of an unknown
	// batch.
	ErrRunNotFound = errors.New("backfill: run not found")
	// ErrPlanIncomplete is returned by backfill.Runner.RollbackBatch when the
	// plan the manifest recorded for the batch lacks a field the rollback
	// needs (a plan of an older version, or written by hand); the message
	// names the field (e.g. "target.inserted_by"). Roll it back with
	// backfill.Runner.Rollback and the job instead.
	ErrPlanIncomplete = errors.New("backfill: the recorded plan lacks what the rollback needs")
	// ErrPrivilege is returned (wrapped in a *backfill.PrivilegeError that
	// lists every missing privilege with the GRANT statement to run) by
	// backfill.Runner.Run before it creates or resumes a batch, and by
	// backfill.Runner.Rollback before it changes anything, when the
	// session's role lacks a privilege the job needs; and (wrapped in a
	// [*ChunkError]) when an Upsert run by a role without UPDATE on the
	// target meets a row it would update: the chunk rolls back.
	ErrPrivilege = errors.New("backfill: insufficient privilege")
	// ErrSchemaBehind is returned by backfill.PGManifest.Init when the
	// manifest's SchemaName is older than this library's and the session's
	// role cannot migrate it (it lacks CREATE on the database or the
	// schema, or does not own the tables): an administrator runs
	// backfill.PGManifest.Migrate (the command "backfill migrate") once.
	// The message names both versions.
	ErrSchemaBehind = errors.New("backfill: manifest schema is behind this library; an administrator must run backfill migrate")
)

// ErrSchemaMissing marks an error of a statement that found no manifest
// schema, or no table or function of it (dropped, or never migrated):
// an administrator runs backfill.PGManifest.Migrate (the command
// "backfill migrate"). errors.Is reports it as [ErrSchemaBehind] too:
// both are fixed by the migration.
var ErrSchemaMissing error = schemaMissingError{}

type schemaMissingError struct{}

func (schemaMissingError) Error() string {
	return "backfill: manifest schema is missing; an administrator must run backfill migrate"
}

// Is reports target as ErrSchemaBehind: both need the migration.
func (schemaMissingError) Is(target error) bool { return target == ErrSchemaBehind }

// ErrNotRetryable marks an error that IsRetryable must refuse although its
// code would otherwise be retried.
var ErrNotRetryable = errors.New("not retryable")

// ChunkError says which chunk failed and why. It wraps the cause.
type ChunkError struct {
	// Chunk is the chunk that failed.
	Chunk Chunk
	// Attempt is the 1-based attempt that failed.
	Attempt int
	// Err is the cause.
	Err error
}

// Error says which chunk failed, on which attempt, and why.
func (e *ChunkError) Error() string {
	return fmt.Sprintf("backfill: chunk %d %s (attempt %d): %v", e.Chunk.Seq, e.Chunk.ID, e.Attempt, e.Err)
}

// Unwrap returns the cause, for errors.Is and errors.As.
func (e *ChunkError) Unwrap() error { return e.Err }

// PartialError is returned by backfill.Runner.Run when some chunks completed
// before a failure. Completed chunks stay completed (they are checkpointed);
// running the same job again resumes with the first incomplete chunk.
type PartialError struct {
	// BatchID is the run's batch ID.
	BatchID int64
	// Done lists the IDs of chunks completed by this call, in completion
	// order: the first 65,536 of them, so that a call that runs a long
	// plan does not hold every chunk's ID.
	Done []string
	// DoneCount is the number of chunks completed by this call (more than
	// len(Done) past 65,536).
	DoneCount int
	// Failed is the first chunk failure; others are in Errs.
	Failed *ChunkError
	// Errs holds every chunk failure of this call.
	Errs []error
}

// Error says how many chunks this call completed and the first failure;
// when no chunk failed (a gate paused the run after a chunk, perhaps the
// last) it says the batch stopped, not that it partially completed.
func (e *PartialError) Error() string {
	var b strings.Builder
	failed := 0
	for _, err := range e.Errs {
		var ce *ChunkError
		if errors.As(err, &ce) {
			failed++
		}
	}
	done := max(e.DoneCount, len(e.Done))
	if failed == 0 {
		// No chunk failed: the run stopped after its chunks (a gate
		// paused it, the run's end could not be recorded...), perhaps
		// after the last one.
		fmt.Fprintf(&b, "backfill: batch %d stopped with no chunk failed, %d chunks done in this call", e.BatchID, done)
	} else {
		fmt.Fprintf(&b, "backfill: batch %d partially completed: %d chunks done in this call, %d failed", e.BatchID, done, failed)
	}
	switch {
	case e.Failed != nil:
		fmt.Fprintf(&b, ": %v", e.Failed)
	case len(e.Errs) > 0:
		fmt.Fprintf(&b, ": %v", e.Errs[0])
	}
	// The other errors that are not a chunk's failure (a failure that
	// could not be recorded, a stop): never hidden behind the first.
	shown := 0
	for i, err := range e.Errs {
		var ce *ChunkError
		if err == nil || errors.As(err, &ce) || (e.Failed == nil && i == 0) {
			continue
		}
		if shown == 3 {
			b.WriteString("; and more (PartialError.Errs)")
			break
		}
		fmt.Fprintf(&b, "; also: %v", err)
		shown++
	}
	return b.String()
}

// Unwrap returns every failure of the call, for errors.Is and errors.As.
func (e *PartialError) Unwrap() []error { return e.Errs }

// IsRetryable reports whether err is a transient database failure for which
// retrying the chunk can succeed: serialization failure (40001), deadlock
// (40P01), lock not available (55P03), a unique violation of the business
// key caused by a concurrent insert of the same key (23505; violations of
// other unique constraints are not retried), [ErrHistoryIntervals] (another
// writer changed the versions of the merged keys meanwhile), connection
// failures (class 08, 57P01-57P03 a server shutting down, restarting or
// terminating the backend, a broken connection, io.EOF, network errors),
// and 57014 query_canceled (a statement timeout:
// backfill.Config.StatementTimeout; it is also what the cancellation of a
// context looks like, and a Runner never retries once its context is done).
// The Runner retries 40001, 40P01, 55P03 and 57014 first as waits, which do
// not count toward backfill.Config.MaxAttempts
// (backfill.Config.LockRetries); connection failures of a chunk's
// transaction are not attempts either (retried for up to 2 ×
// backfill.Config.StaleAfter). See
// https://www.postgresql.org/docs/15/errcodes-appendix.html.
func IsRetryable(err error) bool {
	if errors.Is(err, ErrNotRetryable) {
		return false
	}
	if errors.Is(err, ErrConcurrentChange) {
		return true
	}
	if IsConnectionError(err) {
		return true
	}
	var pe *pq.Error
	if errors.As(err, &pe) {
		switch pe.Code {
		case "40001", "40P01", "55P03", "57014", "23505":
			return true
		}
	}
	return false
}

// ErrConcurrentChange marks an error that [IsRetryable] accepts although
// it has no retryable SQLSTATE: another transaction changed what the
// merge read, and a retry reads it again.
var ErrConcurrentChange = errors.New("changed concurrently")
