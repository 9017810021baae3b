package backfilltrace

import (
	"context"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
)

// Tracer traces the chunks of a backfill.Runner (backfill.Config.Tracer).
// Its methods are called from the goroutine running the chunk;
// implementations must be safe for concurrent use when Concurrency > 1, and
// must not block.
type Tracer interface {
	// TraceChunkStart is called when a chunk was claimed, before its
	// other phases; the context it returns is passed to the chunk's
	// phases (and to the extractor) and to TraceChunkEnd.
	TraceChunkStart(ctx context.Context, data ChunkStartData) context.Context
	// TraceChunkEnd is called once per TraceChunkStart, when the
	// attempt committed or ended without a commit.
	TraceChunkEnd(ctx context.Context, data ChunkEndData)
}

// PhaseTracer is an optional interface of a [Tracer]: the phases of a
// chunk, children of the chunk's span, one after the other (a chunk that
// fails ends in the phase that failed).
type PhaseTracer interface {
	// TracePhaseStart is called when phase data.Phase begins; the
	// context it returns goes to TracePhaseEnd (and, for the extract
	// phase, to the extractor).
	TracePhaseStart(ctx context.Context, data PhaseStartData) context.Context
	// TracePhaseEnd is called once per TracePhaseStart.
	TracePhaseEnd(ctx context.Context, data PhaseEndData)
}

// RunTracer is an optional interface of a [Tracer]: one span per call of
// backfill.Runner.Run (and of backfill.Runner.Resume, which calls Run), the
// parent of its chunks' spans and of its events.
type RunTracer interface {
	// TraceRunStart is called when Run begins, before the plan.
	TraceRunStart(ctx context.Context, data RunStartData) context.Context
	// TraceRunEnd is called once per TraceRunStart, when Run returns.
	TraceRunEnd(ctx context.Context, data RunEndData)
}

// ThrottleTracer is an optional interface of a [Tracer]: the throttle's
// holds and releases (backfill.Config.Throttles), and the waits of the
// rows-per-second cap (backfill.Config.RowsPerSecond) of this process.
type ThrottleTracer interface {
	// TraceThrottle is called from the throttle's monitor goroutine
	// (holds, releases) or a worker (waits).
	TraceThrottle(ctx context.Context, data ThrottleData)
}

// PauseTracer is an optional interface of a [Tracer]: this call of Run
// paused its run (a throttle's critical level, a quality gate, the run
// reject rate) or found it paused by another process or an operator.
type PauseTracer interface {
	// TracePause is called when this call of Run paused the run (data.Source
	// PauseThrottle or PauseGate, after the manifest recorded the pause)
	// or stopped because another process or an operator paused it
	// (PauseObserved); data.Reason is the pause's reason as the manifest
	// records it. It is called from a worker or the throttle's monitor
	// goroutine, and must not block.
	TracePause(ctx context.Context, data PauseData)
}

// RetryTracer is an optional interface of a [Tracer]: a chunk's attempt
// that failed, or a try that waited (backfill.Config.LockRetries), after its
// chunk's span ended.
type RetryTracer interface {
	// TraceRetry is called once per failed attempt (data.Kind
	// RetryAttempt) and once per try that waited (RetryWait), from the
	// goroutine that ran the chunk, after the chunk's span ended and
	// before the Sleep it reports; data.Final says the chunk is not tried
	// again. It must not block.
	TraceRetry(ctx context.Context, data RetryData)
}

// Phase is a phase of a chunk ([PhaseTracer]).
type Phase string

// The phases of a chunk, in their order. Every chunk is leased in a
// short transaction, extracted outside any transaction, then staged,
// merged and checkpointed in one transaction (see package backfill, "One chunk, one transaction"):
const (
	// PhaseClaim: the lease's short transaction.
	PhaseClaim Phase = "claim"
	// PhaseExtract: the extractor writing into the chunk's spool,
	// outside any transaction.
	PhaseExtract Phase = "extract"
	// PhaseQueued: only when extracting ahead (unless
	// backfill.Config.SerialExtract), and only when it
	// waits: the extracted chunk waits for its worker's previous chunk's
	// transaction to end.
	PhaseQueued Phase = "queued"
	// PhaseStage: the chunk's transaction begins, its lease is fenced,
	// the publish mode's target is prepared, and the spool is copied into
	// staging.
	PhaseStage Phase = "stage"
	// PhaseMerge: the staged rows merged into the target (a chunk of
	// backfill.PublishAtEnd: its staging ended).
	PhaseMerge Phase = "merge"
	// PhaseValidate: the job's validators and the row accounting (not
	// for a chunk of PublishAtEnd, validated when the run publishes).
	PhaseValidate Phase = "validate"
	// PhaseCheckpoint: the chunk's checkpoint and exceptions written in
	// its transaction.
	PhaseCheckpoint Phase = "checkpoint"
	// PhaseCommit: the chunk's COMMIT.
	PhaseCommit Phase = "commit"
)

// ChunkStartData is the start of a chunk's span.
type ChunkStartData struct {
	// BatchID is the run; Job its job's name; Worker backfill.Config.WorkerID.
	BatchID int64
	Job     string
	Worker  string
	// Chunk is the claimed chunk (Seq, ID, bounds: Chunk.Bounds).
	Chunk backfilltype.Chunk
	// Attempt is the chunk's attempt, 1-based, across calls of Run (as
	// [backfilltype.ChunkError.Attempt]).
	Attempt int
	// Start is when the claim began (before this call).
	Start time.Time
}

// Chunk outcomes ([ChunkEndData.Outcome]).
const (
	// OutcomeDone: the chunk committed, done.
	OutcomeDone = "done"
	// OutcomeOpen: the chunk committed but stays open (it ends after the
	// horizon; see [backfilltype.ChunkOpen]).
	OutcomeOpen = "open"
	// OutcomeStaged: the chunk committed as staged (backfill.PublishAtEnd).
	OutcomeStaged = "staged"
	// OutcomeFailed: the attempt failed (Err says why); it is retried or
	// final ([RetryTracer]).
	OutcomeFailed = "failed"
	// OutcomeReleased: the attempt rolled back without an error: its
	// lease was taken over or the run stopped meanwhile (paused,
	// abandoned), or a throttle began to hold during the claim. The
	// chunk stays pending.
	OutcomeReleased = "released"
)

// ChunkEndData is the end of a chunk's span.
type ChunkEndData struct {
	BatchID int64
	Job     string
	Worker  string
	Chunk   backfilltype.Chunk
	Attempt int
	// Outcome is one of OutcomeDone, OutcomeOpen, OutcomeStaged,
	// OutcomeFailed, OutcomeReleased.
	Outcome string
	// Counts are the chunk's row outcomes when it committed (zero
	// otherwise; a staged chunk's are its staging's: the rows are merged,
	// and counted, when the run publishes).
	Counts backfilltype.Counts
	// Duration is from the claim's beginning to the end.
	Duration time.Duration
	// Err is the attempt's error (nil when it committed or was
	// released); a panic of the extractor is an error wrapping
	// [backfilltype.ErrExtractorPanic].
	Err error
}

// PhaseStartData is the start of a chunk's phase.
type PhaseStartData struct {
	BatchID int64
	Chunk   backfilltype.Chunk
	Attempt int
	Phase   Phase
	// Start is when the phase began (the claim's: before the call).
	Start time.Time
}

// PhaseEndData is the end of a chunk's phase.
type PhaseEndData struct {
	BatchID int64
	Chunk   backfilltype.Chunk
	Attempt int
	Phase   Phase
	// Rows are the rows the phase handled, where known: extract, the
	// rows read; merge, the rows the merge accounted for (inserted,
	// updated, unchanged, deduplicated, refused); 0 otherwise.
	Rows int64
	// Duration is the phase's.
	Duration time.Duration
	// Err is the chunk's error when the chunk ended in this phase.
	Err error
}

// RunStartData is the start of a call of backfill.Runner.Run.
type RunStartData struct {
	Job    string
	Worker string
}

// RunEndData is the end of a call of backfill.Runner.Run.
type RunEndData struct {
	Job    string
	Worker string
	// BatchID is the run (0 when Run failed before it existed).
	BatchID int64
	// Status is the run's status when Run returned ("" when unknown).
	Status backfilltype.RunStatus
	// ChunksRun are the chunks this call completed; Counts the run's rows
	// (every call's, from the manifest: Report.Counts).
	ChunksRun int
	Counts    backfilltype.Counts
	Duration  time.Duration
	// Err is what Run returned.
	Err error
}

// Throttle events ([ThrottleData.Event]).
const (
	// ThrottleHold: a signal reached its high watermark; no chunk is
	// claimed until it is released.
	ThrottleHold = "hold"
	// ThrottleRelease: a signal fell below its low watermark (or the call
	// ended while it held); Held says for how long it held.
	ThrottleRelease = "release"
	// ThrottleWait: a worker waited Held for the rows-per-second cap
	// (Signal backfill.RateSignalName).
	ThrottleWait = "wait"
	// ThrottleCritical: a signal reached its critical level; the run is
	// paused ([PauseTracer] too).
	ThrottleCritical = "critical"
)

// ThrottleData is a throttle event of this process.
type ThrottleData struct {
	BatchID int64
	Job     string
	// Event is ThrottleHold, ThrottleRelease, ThrottleWait or
	// ThrottleCritical.
	Event string
	// Signal is the signal's name (backfillthrottle.Signal.Name, or
	// backfill.RateSignalName).
	Signal string
	// Value is the reading; High and Low the watermarks (the cap in rows
	// per second for ThrottleWait).
	Value, High, Low float64
	// Held is how long the hold lasted (ThrottleRelease) or the wait
	// (ThrottleWait); 0 otherwise.
	Held time.Duration
}

// Pause sources ([PauseData.Source]).
const (
	// PauseThrottle: a throttle's critical level paused the run.
	PauseThrottle = "throttle"
	// PauseGate: a quality gate, the run reject rate or a run that loaded
	// no row paused it.
	PauseGate = "gate"
	// PauseObserved: the run was found paused by another process or an
	// operator.
	PauseObserved = "observed"
)

// PauseData is the pause of a run.
type PauseData struct {
	BatchID int64
	Job     string
	// Source is PauseThrottle, PauseGate or PauseObserved.
	Source string
	Reason string
}

// Retry kinds ([RetryData.Kind]).
const (
	// RetryWait: a try of the chunk waited (lock timeout, deadlock,
	// serialization failure, statement timeout: SQLState) and rolled
	// back; it is tried again after Sleep, unless Final.
	RetryWait = "wait"
	// RetryAttempt: an attempt failed; it is tried again after Sleep
	// unless Final (not retryable, or backfill.Config.MaxAttempts reached).
	RetryAttempt = "attempt"
	// RetryFault: the chunk's transaction lost its connection to the
	// server (or the server shut down or terminated its backend:
	// SQLState, "connection" without one) and rolled back; it is tried
	// again after Sleep, without counting toward
	// backfill.Config.MaxAttempts, unless Final (the faults lasted their
	// bound, 2 × backfill.Config.StaleAfter: the call ends, the run stays
	// resumable). Try counts the faults.
	RetryFault = "fault"
)

// RetryData is a failed try or attempt of a chunk.
type RetryData struct {
	BatchID int64
	Job     string
	Chunk   backfilltype.Chunk
	Attempt int
	// Kind is RetryWait, RetryAttempt or RetryFault; Try the 1-based row
	// of backfill.Config.LockRetries of a wait, the 1-based count of a
	// fault (0 for an attempt).
	Kind string
	Try  int
	// SQLState is PostgreSQL's error code ("" when the error is not
	// PostgreSQL's).
	SQLState string
	// Sleep is the pause before the next try or attempt; Final says
	// there is none.
	Sleep time.Duration
	Final bool
	Err   error
}
