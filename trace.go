package backfill

import (
	"context"
	"errors"
	"time"

	"github.com/lib/pq"
)

// Tracing, in the manner of pgx's tracers: [Config.Tracer] is a [Tracer]
// (one span per chunk); a tracer that also implements [PhaseTracer],
// [RunTracer], [ThrottleTracer], [PauseTracer] or [RetryTracer] receives
// those too. The optional interfaces are resolved once, by [NewWithDB].
// Without a tracer nothing is allocated or called.
//
// Every Start is followed by exactly one End with the context Start
// returned, whatever happens between them: an error, a retry, a panic
// of the extractor (an error of the chunk), a cancelled context, a
// throttle or a pause. Spans nest as
//
//	run (RunTracer)
//	└── chunk (Tracer), one per claimed attempt of a chunk
//	    └── phases (PhaseTracer), one after the other:
//	        claim, extract, stage, merge, validate, checkpoint, commit
//
// and events (throttle, pause, retry) are reported with the context of
// the run (a retry: after its chunk's span ended).
//
// The chunk's span starts once a chunk is claimed: a worker that finds
// nothing to claim reports nothing. Its start time and that of its claim
// phase are those of the claim's beginning ([TraceChunkStartData.Start]),
// before the calls: adapters that record time (OpenTelemetry) take it
// from the data, not from the clock.

// Tracer traces the chunks of a [Runner] ([Config.Tracer]). Its methods
// are called from the goroutine running the chunk; implementations must
// be safe for concurrent use when Concurrency > 1, and must not block.
type Tracer interface {
	// TraceChunkStart is called when a chunk was claimed, before its
	// other phases; the context it returns is passed to the chunk's
	// phases (and to the extractor) and to TraceChunkEnd.
	TraceChunkStart(ctx context.Context, data TraceChunkStartData) context.Context
	// TraceChunkEnd is called once per TraceChunkStart, when the
	// attempt committed or ended without a commit.
	TraceChunkEnd(ctx context.Context, data TraceChunkEndData)
}

// PhaseTracer is an optional interface of a [Tracer]: the phases of a
// chunk, children of the chunk's span, one after the other (a chunk that
// fails ends in the phase that failed).
type PhaseTracer interface {
	// TracePhaseStart is called when phase data.Phase begins; the
	// context it returns goes to TracePhaseEnd (and, for the extract
	// phase, to the extractor).
	TracePhaseStart(ctx context.Context, data TracePhaseStartData) context.Context
	// TracePhaseEnd is called once per TracePhaseStart.
	TracePhaseEnd(ctx context.Context, data TracePhaseEndData)
}

// RunTracer is an optional interface of a [Tracer]: one span per call of
// [Runner.Run] (and of [Runner.Resume], which calls Run), the parent of
// its chunks' spans and of its events.
type RunTracer interface {
	// TraceRunStart is called when Run begins, before the plan.
	TraceRunStart(ctx context.Context, data TraceRunStartData) context.Context
	// TraceRunEnd is called once per TraceRunStart, when Run returns.
	TraceRunEnd(ctx context.Context, data TraceRunEndData)
}

// ThrottleTracer is an optional interface of a [Tracer]: the throttle's
// holds and releases ([Config.Throttles]), and the waits of the
// rows-per-second cap ([Config.RowsPerSecond]) of this process.
type ThrottleTracer interface {
	// TraceThrottle is called from the throttle's monitor goroutine
	// (holds, releases) or a worker (waits).
	TraceThrottle(ctx context.Context, data TraceThrottleData)
}

// PauseTracer is an optional interface of a [Tracer]: this call of Run
// paused its run (a throttle's critical level, a quality gate, the run
// reject rate) or found it paused by another process or an operator.
type PauseTracer interface {
	TracePause(ctx context.Context, data TracePauseData)
}

// RetryTracer is an optional interface of a [Tracer]: a chunk's attempt
// that failed, or a try that waited ([Config.LockRetries]), after its
// chunk's span ended.
type RetryTracer interface {
	TraceRetry(ctx context.Context, data TraceRetryData)
}

// TracePhase is a phase of a chunk ([PhaseTracer]).
type TracePhase string

// The phases of a chunk, in their order. A chunk runs either leased (a
// manifest that leases chunks, the default [PGManifest] with a
// registered worker; see doc.go) or in one transaction
// ([Config.JobConcurrency], or a manifest without leases):
const (
	// PhaseClaim: leased, the lease's short transaction; in one
	// transaction, its BEGIN, the job's slot, the claim, and the publish
	// mode's target.
	PhaseClaim TracePhase = "claim"
	// PhaseExtract: leased, the extractor writing into the chunk's spool,
	// outside any transaction; in one transaction, the extractor
	// streaming into staging (COPY), which this phase then includes.
	PhaseExtract TracePhase = "extract"
	// PhaseQueued: leased with [Config.ExtractAhead] only, and only when
	// it waits: the extracted chunk waits for its worker's previous
	// chunk's transaction to end.
	PhaseQueued TracePhase = "queued"
	// PhaseStage: leased only: the chunk's transaction begins, its lease
	// is fenced, and the spool is copied into staging.
	PhaseStage TracePhase = "stage"
	// PhaseMerge: the staged rows merged into the target (a chunk of
	// [PublishAtEnd]: its staging ended).
	PhaseMerge TracePhase = "merge"
	// PhaseValidate: the job's validators and the row accounting (not
	// for a chunk of PublishAtEnd, validated when the run publishes).
	PhaseValidate TracePhase = "validate"
	// PhaseCheckpoint: the chunk's checkpoint and exceptions written in
	// its transaction.
	PhaseCheckpoint TracePhase = "checkpoint"
	// PhaseCommit: the chunk's COMMIT.
	PhaseCommit TracePhase = "commit"
)

// TraceChunkStartData is the start of a chunk's span.
type TraceChunkStartData struct {
	// BatchID is the run; Job its job's name; Worker [Config.WorkerID].
	BatchID int64
	Job     string
	Worker  string
	// Chunk is the claimed chunk (Seq, ID, bounds: Chunk.Bounds).
	Chunk Chunk
	// Attempt is the chunk's attempt, 1-based, across calls of Run (as
	// [ChunkError.Attempt]).
	Attempt int
	// Start is when the claim began (before this call).
	Start time.Time
}

// Chunk outcomes ([TraceChunkEndData.Outcome]).
const (
	// OutcomeDone: the chunk committed, done.
	OutcomeDone = "done"
	// OutcomeOpen: the chunk committed but stays open (it ends after the
	// horizon; see [ChunkOpen]).
	OutcomeOpen = "open"
	// OutcomeStaged: the chunk committed as staged ([PublishAtEnd]).
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

// TraceChunkEndData is the end of a chunk's span.
type TraceChunkEndData struct {
	BatchID int64
	Job     string
	Worker  string
	Chunk   Chunk
	Attempt int
	// Outcome is one of OutcomeDone, OutcomeOpen, OutcomeStaged,
	// OutcomeFailed, OutcomeReleased.
	Outcome string
	// Counts are the chunk's row outcomes when it committed (zero
	// otherwise; a staged chunk's are its staging's: the rows are merged,
	// and counted, when the run publishes).
	Counts Counts
	// Duration is from the claim's beginning to the end.
	Duration time.Duration
	// Err is the attempt's error (nil when it committed or was
	// released); a panic of the extractor is an error wrapping
	// [ErrExtractorPanic].
	Err error
}

// TracePhaseStartData is the start of a chunk's phase.
type TracePhaseStartData struct {
	BatchID int64
	Chunk   Chunk
	Attempt int
	Phase   TracePhase
	// Start is when the phase began (the claim's: before the call).
	Start time.Time
}

// TracePhaseEndData is the end of a chunk's phase.
type TracePhaseEndData struct {
	BatchID int64
	Chunk   Chunk
	Attempt int
	Phase   TracePhase
	// Rows are the rows the phase handled, where known: extract, the
	// rows read; merge, the rows the merge accounted for (inserted,
	// updated, unchanged, deduplicated, refused); 0 otherwise.
	Rows int64
	// Duration is the phase's.
	Duration time.Duration
	// Err is the chunk's error when the chunk ended in this phase.
	Err error
}

// TraceRunStartData is the start of a call of [Runner.Run].
type TraceRunStartData struct {
	Job    string
	Worker string
}

// TraceRunEndData is the end of a call of [Runner.Run].
type TraceRunEndData struct {
	Job    string
	Worker string
	// BatchID is the run (0 when Run failed before it existed).
	BatchID int64
	// Status is the run's status when Run returned ("" when unknown).
	Status RunStatus
	// ChunksRun are the chunks this call completed; Counts the run's rows
	// (every call's, from the manifest: Report.Counts).
	ChunksRun int
	Counts    Counts
	Duration  time.Duration
	// Err is what Run returned.
	Err error
}

// Throttle events ([TraceThrottleData.Event]).
const (
	// ThrottleHold: a signal reached its high watermark; no chunk is
	// claimed until it is released.
	ThrottleHold = "hold"
	// ThrottleRelease: a signal fell below its low watermark (or the call
	// ended while it held); Held says for how long it held.
	ThrottleRelease = "release"
	// ThrottleWait: a worker waited Held for the rows-per-second cap
	// (Signal [RateSignalName]).
	ThrottleWait = "wait"
	// ThrottleCritical: a signal reached its critical level; the run is
	// paused ([PauseTracer] too).
	ThrottleCritical = "critical"
)

// TraceThrottleData is a throttle event of this process.
type TraceThrottleData struct {
	BatchID int64
	Job     string
	// Event is ThrottleHold, ThrottleRelease, ThrottleWait or
	// ThrottleCritical.
	Event string
	// Signal is the signal's name ([Signal.Name], or [RateSignalName]).
	Signal string
	// Value is the reading; High and Low the watermarks (the cap in rows
	// per second for ThrottleWait).
	Value, High, Low float64
	// Held is how long the hold lasted (ThrottleRelease) or the wait
	// (ThrottleWait); 0 otherwise.
	Held time.Duration
}

// Pause sources ([TracePauseData.Source]).
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

// TracePauseData is the pause of a run.
type TracePauseData struct {
	BatchID int64
	Job     string
	// Source is PauseThrottle, PauseGate or PauseObserved.
	Source string
	Reason string
}

// Retry kinds ([TraceRetryData.Kind]).
const (
	// RetryWait: a try of the chunk waited (lock timeout, deadlock,
	// serialization failure, statement timeout: SQLState) and rolled
	// back; it is tried again after Sleep, unless Final.
	RetryWait = "wait"
	// RetryAttempt: an attempt failed; it is tried again after Sleep
	// unless Final (not retryable, or [Config.MaxAttempts] reached).
	RetryAttempt = "attempt"
)

// TraceRetryData is a failed try or attempt of a chunk.
type TraceRetryData struct {
	BatchID int64
	Job     string
	Chunk   Chunk
	Attempt int
	// Kind is RetryWait or RetryAttempt; Try the 1-based row of
	// [Config.LockRetries] of a wait (0 for an attempt).
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

// tracers are a Runner's Config.Tracer and its optional interfaces,
// resolved once by NewWithDB (all nil without a tracer).
type tracers struct {
	chunk    Tracer
	phase    PhaseTracer
	run      RunTracer
	throttle ThrottleTracer
	pause    PauseTracer
	retry    RetryTracer
}

func resolveTracers(t Tracer) tracers {
	if t == nil {
		return tracers{}
	}
	tr := tracers{chunk: t}
	tr.phase, _ = t.(PhaseTracer)
	tr.run, _ = t.(RunTracer)
	tr.throttle, _ = t.(ThrottleTracer)
	tr.pause, _ = t.(PauseTracer)
	tr.retry, _ = t.(RetryTracer)
	return tr
}

// traceRun wraps a call of Run in the run's span.
func (r *Runner) traceRun(ctx context.Context, job Job, run func(context.Context) (Report, error)) (rep Report, err error) {
	rt := r.tracers.run
	if rt == nil {
		return run(ctx)
	}
	begin := time.Now()
	ctx = rt.TraceRunStart(ctx, TraceRunStartData{Job: job.Name, Worker: r.cfg.WorkerID})
	ended := false
	defer func() {
		if !ended {
			// A panic (in a user's hook, say) still ends the run's span.
			rt.TraceRunEnd(ctx, TraceRunEndData{Job: job.Name, Worker: r.cfg.WorkerID, Duration: time.Since(begin),
				Err: errors.New("backfill: Run panicked")})
		}
	}()
	rep, err = run(ctx)
	ended = true
	rt.TraceRunEnd(ctx, TraceRunEndData{Job: job.Name, Worker: r.cfg.WorkerID, BatchID: rep.BatchID, Status: rep.Status,
		ChunksRun: rep.ChunksRun, Counts: rep.Counts, Duration: time.Since(begin), Err: err})
	return rep, err
}

// chunkSpan is the span of a claimed attempt of a chunk and its current
// phase (nil without a tracer: every method does nothing).
type chunkSpan struct {
	tr      *tracers
	base    TraceChunkStartData
	ctx     context.Context // the chunk's
	phase   TracePhase      // "" before the first
	pctx    context.Context // the phase's
	pstart  time.Time
	rows    int64 // the current phase's rows
	ended   bool
	outcome string
}

// traceChunk starts the span of chunk c's attempt, claimed since start,
// and its claim phase. It returns ctx, with the chunk's span when traced.
func (ex *execution) traceChunk(ctx context.Context, cr *chunkRun, c Chunk, start time.Time) context.Context {
	tr := &ex.r.tracers
	if tr.chunk == nil {
		return ctx
	}
	s := &chunkSpan{tr: tr, base: TraceChunkStartData{BatchID: ex.batchID, Job: ex.job.Name, Worker: ex.r.cfg.WorkerID,
		Chunk: c, Attempt: cr.attempt, Start: start}}
	s.ctx = tr.chunk.TraceChunkStart(ctx, s.base)
	cr.span = s
	s.startPhase(PhaseClaim, start)
	return s.ctx
}

func (s *chunkSpan) startPhase(p TracePhase, at time.Time) {
	s.phase, s.pstart, s.rows, s.pctx = p, at, 0, s.ctx
	if s.tr.phase != nil {
		s.pctx = s.tr.phase.TracePhaseStart(s.ctx, TracePhaseStartData{BatchID: s.base.BatchID, Chunk: s.base.Chunk,
			Attempt: s.base.Attempt, Phase: p, Start: at})
	}
}

func (s *chunkSpan) endPhase(err error) {
	if s.phase == "" {
		return
	}
	if s.tr.phase != nil {
		s.tr.phase.TracePhaseEnd(s.pctx, TracePhaseEndData{BatchID: s.base.BatchID, Chunk: s.base.Chunk, Attempt: s.base.Attempt,
			Phase: s.phase, Rows: s.rows, Duration: time.Since(s.pstart), Err: err})
	}
	s.phase = ""
}

// next ends the current phase and starts p, unless p is the current
// phase. It returns ctx, or the phase's context when traced.
func (s *chunkSpan) next(ctx context.Context, p TracePhase) context.Context {
	if s == nil || s.ended {
		return ctx
	}
	if s.phase != p {
		s.endPhase(nil)
		s.startPhase(p, time.Now())
	}
	return s.pctx
}

// setRows sets the rows of the current phase.
func (s *chunkSpan) setRows(n int64) {
	if s != nil {
		s.rows = n
	}
}

// release marks the attempt as rolled back without an error (fenced,
// throttled, stopped).
func (s *chunkSpan) release() {
	if s != nil {
		s.outcome = OutcomeReleased
	}
}

// end ends the current phase and the chunk's span with cr's result and
// err, once.
func (s *chunkSpan) end(cr *chunkRun, err error) {
	if s == nil || s.ended {
		return
	}
	s.ended = true
	d := TraceChunkEndData{BatchID: s.base.BatchID, Job: s.base.Job, Worker: s.base.Worker, Chunk: s.base.Chunk,
		Attempt: s.base.Attempt, Duration: time.Since(s.base.Start), Err: err}
	switch {
	case err != nil:
		d.Outcome = OutcomeFailed
	case s.outcome != "":
		d.Outcome = s.outcome
	case cr.staged:
		d.Outcome, d.Counts = OutcomeStaged, cr.res.Counts
	case cr.res.Open:
		d.Outcome, d.Counts = OutcomeOpen, cr.res.Counts
	default:
		d.Outcome, d.Counts = OutcomeDone, cr.res.Counts
	}
	s.endPhase(err)
	s.tr.chunk.TraceChunkEnd(s.ctx, d)
}

// traceThrottle reports a throttle event (nothing without a
// ThrottleTracer).
func (ex *execution) traceThrottle(ctx context.Context, d TraceThrottleData) {
	if tt := ex.r.tracers.throttle; tt != nil {
		d.BatchID, d.Job = ex.batchID, ex.job.Name
		tt.TraceThrottle(ctx, d)
	}
}

// tracePause reports the pause of the run (nothing without a
// PauseTracer).
func (ex *execution) tracePause(ctx context.Context, source, reason string) {
	if pt := ex.r.tracers.pause; pt != nil {
		pt.TracePause(ctx, TracePauseData{BatchID: ex.batchID, Job: ex.job.Name, Source: source, Reason: reason})
	}
}

// traceRetry reports a failed try or attempt of a chunk (nothing without
// a RetryTracer).
func (ex *execution) traceRetry(ctx context.Context, d TraceRetryData) {
	rt := ex.r.tracers.retry
	if rt == nil {
		return
	}
	d.BatchID, d.Job = ex.batchID, ex.job.Name
	if d.SQLState == "" {
		var pe *pq.Error
		if errors.As(d.Err, &pe) {
			d.SQLState = string(pe.Code)
		}
	}
	rt.TraceRetry(ctx, d)
}
