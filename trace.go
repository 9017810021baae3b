package backfill

import (
	"context"
	"errors"
	"time"

	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltrace"
)

// Tracing, in the manner of pgx's tracers: [Config.Tracer] is a
// [backfilltrace.Tracer] (one span per chunk); a tracer that also
// implements [backfilltrace.PhaseTracer], [backfilltrace.RunTracer],
// [backfilltrace.ThrottleTracer], [backfilltrace.PauseTracer] or
// [backfilltrace.RetryTracer] receives those too. The optional interfaces
// are resolved once, by [NewWithDB]. Without a tracer nothing is allocated
// or called.
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
// phase are those of the claim's beginning
// ([backfilltrace.ChunkStartData.Start]), before the calls: adapters that
// record time (OpenTelemetry) take it from the data, not from the clock.

// tracers are a Runner's Config.Tracer and its optional interfaces,
// resolved once by NewWithDB (all nil without a tracer).
type tracers struct {
	chunk    backfilltrace.Tracer
	phase    backfilltrace.PhaseTracer
	run      backfilltrace.RunTracer
	throttle backfilltrace.ThrottleTracer
	pause    backfilltrace.PauseTracer
	retry    backfilltrace.RetryTracer
}

func resolveTracers(t backfilltrace.Tracer) tracers {
	if t == nil {
		return tracers{}
	}
	tr := tracers{chunk: t}
	tr.phase, _ = t.(backfilltrace.PhaseTracer)
	tr.run, _ = t.(backfilltrace.RunTracer)
	tr.throttle, _ = t.(backfilltrace.ThrottleTracer)
	tr.pause, _ = t.(backfilltrace.PauseTracer)
	tr.retry, _ = t.(backfilltrace.RetryTracer)
	return tr
}

// traceRun wraps a call of Run in the run's span.
func (r *Runner) traceRun(ctx context.Context, job Job, run func(context.Context) (Report, error)) (rep Report, err error) {
	rt := r.tracers.run
	if rt == nil {
		return run(ctx)
	}
	begin := time.Now()
	ctx = rt.TraceRunStart(ctx, backfilltrace.RunStartData{Job: job.Name, Worker: r.cfg.WorkerID})
	ended := false
	defer func() {
		if !ended {
			// A panic (in a user's hook, say) still ends the run's span.
			rt.TraceRunEnd(ctx, backfilltrace.RunEndData{Job: job.Name, Worker: r.cfg.WorkerID, Duration: time.Since(begin),
				Err: errors.New("backfill: Run panicked")})
		}
	}()
	rep, err = run(ctx)
	ended = true
	rt.TraceRunEnd(ctx, backfilltrace.RunEndData{Job: job.Name, Worker: r.cfg.WorkerID, BatchID: rep.BatchID, Status: rep.Status,
		ChunksRun: rep.ChunksRun, Counts: rep.Counts, Duration: time.Since(begin), Err: err})
	return rep, err
}

// chunkSpan is the span of a claimed attempt of a chunk and its current
// phase (nil without a tracer: every method does nothing).
type chunkSpan struct {
	tr      *tracers
	base    backfilltrace.ChunkStartData
	ctx     context.Context     // the chunk's
	phase   backfilltrace.Phase // "" before the first
	pctx    context.Context     // the phase's
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
	s := &chunkSpan{tr: tr, base: backfilltrace.ChunkStartData{BatchID: ex.batchID, Job: ex.job.Name, Worker: ex.r.cfg.WorkerID,
		Chunk: c, Attempt: cr.attempt, Start: start}}
	s.ctx = tr.chunk.TraceChunkStart(ctx, s.base)
	cr.span = s
	s.startPhase(backfilltrace.PhaseClaim, start)
	return s.ctx
}

func (s *chunkSpan) startPhase(p backfilltrace.Phase, at time.Time) {
	s.phase, s.pstart, s.rows, s.pctx = p, at, 0, s.ctx
	if s.tr.phase != nil {
		s.pctx = s.tr.phase.TracePhaseStart(s.ctx, backfilltrace.PhaseStartData{BatchID: s.base.BatchID, Chunk: s.base.Chunk,
			Attempt: s.base.Attempt, Phase: p, Start: at})
	}
}

func (s *chunkSpan) endPhase(err error) {
	if s.phase == "" {
		return
	}
	if s.tr.phase != nil {
		s.tr.phase.TracePhaseEnd(s.pctx, backfilltrace.PhaseEndData{BatchID: s.base.BatchID, Chunk: s.base.Chunk, Attempt: s.base.Attempt,
			Phase: s.phase, Rows: s.rows, Duration: time.Since(s.pstart), Err: err})
	}
	s.phase = ""
}

// next ends the current phase and starts p, unless p is the current
// phase. It returns ctx, or the phase's context when traced.
func (s *chunkSpan) next(ctx context.Context, p backfilltrace.Phase) context.Context {
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
		s.outcome = backfilltrace.OutcomeReleased
	}
}

// end ends the current phase and the chunk's span with cr's result and
// err, once.
func (s *chunkSpan) end(cr *chunkRun, err error) {
	if s == nil || s.ended {
		return
	}
	s.ended = true
	d := backfilltrace.ChunkEndData{BatchID: s.base.BatchID, Job: s.base.Job, Worker: s.base.Worker, Chunk: s.base.Chunk,
		Attempt: s.base.Attempt, Duration: time.Since(s.base.Start), Err: err}
	switch {
	case err != nil:
		d.Outcome = backfilltrace.OutcomeFailed
	case s.outcome != "":
		d.Outcome = s.outcome
	case cr.outcome == tryStaged:
		d.Outcome, d.Counts = backfilltrace.OutcomeStaged, cr.res.Counts
	case cr.res.Open:
		d.Outcome, d.Counts = backfilltrace.OutcomeOpen, cr.res.Counts
	default:
		d.Outcome, d.Counts = backfilltrace.OutcomeDone, cr.res.Counts
	}
	s.endPhase(err)
	s.tr.chunk.TraceChunkEnd(s.ctx, d)
}

// traceThrottle reports a throttle event (nothing without a
// ThrottleTracer).
func (ex *execution) traceThrottle(ctx context.Context, d backfilltrace.ThrottleData) {
	if tt := ex.r.tracers.throttle; tt != nil {
		d.BatchID, d.Job = ex.batchID, ex.job.Name
		tt.TraceThrottle(ctx, d)
	}
}

// tracePause reports the pause of the run (nothing without a
// PauseTracer).
func (ex *execution) tracePause(ctx context.Context, source, reason string) {
	if pt := ex.r.tracers.pause; pt != nil {
		pt.TracePause(ctx, backfilltrace.PauseData{BatchID: ex.batchID, Job: ex.job.Name, Source: source, Reason: reason})
	}
}

// traceRetry reports a failed try or attempt of a chunk (nothing without
// a RetryTracer).
func (ex *execution) traceRetry(ctx context.Context, d backfilltrace.RetryData) {
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
