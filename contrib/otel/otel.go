// Package backfillotel adapts the tracer of [backfill] ([backfilltrace.Tracer]
// and its optional interfaces) to OpenTelemetry: spans for runs, chunks and
// their phases, events for throttles, pauses and retries, and metrics.
//
//	t, err := backfillotel.New() // the global providers, or With... options
//	r, err := backfill.New(db, &backfill.Config{Tracer: t})
//
// Spans (instrumentation scope [ScopeName]):
//
//   - "backfill.run": one call of Runner.Run, attributes backfill.job,
//     backfill.worker, and at its end backfill.batch_id,
//     backfill.run.status, backfill.chunks_run and the run's rows;
//   - "backfill.chunk": one claimed attempt of a chunk, a child of its
//     run's span, attributes backfill.batch_id, backfill.job,
//     backfill.chunk.seq, backfill.chunk.id, backfill.chunk.lower,
//     backfill.chunk.upper, backfill.chunk.attempt, backfill.worker, and at
//     its end backfill.chunk.outcome and its rows (backfill.rows.read,
//     .inserted, .updated, .unchanged, .rejected, .deduplicated);
//   - "backfill.claim", "backfill.extract", "backfill.stage",
//     "backfill.merge", "backfill.validate", "backfill.checkpoint",
//     "backfill.commit": the chunk's phases, children of its span, with
//     backfill.rows where the phase counts rows.
//
// A span whose work failed records the error and has status Error.
// Events on the run's span: "backfill.throttle" (backfill.throttle.event
// hold, release, wait or critical; backfill.throttle.signal, .value,
// .high, .low, .held_seconds), "backfill.pause" (backfill.pause.source,
// .reason) and "backfill.retry" (backfill.retry.kind, db.response.status_code
// with the SQLSTATE, backfill.retry.final, .sleep_seconds).
//
// Metrics:
//
//   - backfill.rows (counter, {row}): rows of committed chunks, by
//     backfill.job and backfill.outcome (read, inserted, updated,
//     unchanged, rejected, deduplicated);
//   - backfill.chunks (counter, {chunk}): ended chunk attempts, by
//     backfill.job and backfill.chunk.outcome;
//   - backfill.chunk.duration (histogram, s): from claim to end, by
//     backfill.job and backfill.chunk.outcome;
//   - backfill.throttle.duration (counter, s): time held by each signal
//     (releases) and waited for the rows-per-second cap, by backfill.job
//     and backfill.throttle.signal;
//   - backfill.retries (counter): failed tries and attempts, by
//     backfill.job, backfill.retry.kind, db.response.status_code and
//     backfill.retry.final;
//   - backfill.exceptions (counter, {row}): rows sent to the exception
//     queue by committed chunks, by backfill.job;
//   - backfill.pauses (counter): pauses, by backfill.job and
//     backfill.pause.source.
//
// Counts are this process's: chunk counts by status across processes are
// in the manifest (see contrib/prometheus, or PGManifest.JobChunks).
package backfillotel

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgbackfill/backfill/backfilltrace"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgbackfill/backfill"
)

// ScopeName is the instrumentation scope of the spans and metrics.
const ScopeName = "github.com/pgbackfill/backfill/contrib/otel"

// Tracer is a [backfilltrace.Tracer] with every optional interface, producing
// OpenTelemetry spans, events and metrics. Safe for concurrent use; one
// Tracer may serve several Runners.
type Tracer struct {
	tracer trace.Tracer

	rows       metric.Int64Counter
	chunks     metric.Int64Counter
	duration   metric.Float64Histogram
	throttled  metric.Float64Counter
	retries    metric.Int64Counter
	exceptions metric.Int64Counter
	pauses     metric.Int64Counter
}

var _ interface {
	backfilltrace.Tracer
	backfilltrace.PhaseTracer
	backfilltrace.RunTracer
	backfilltrace.ThrottleTracer
	backfilltrace.PauseTracer
	backfilltrace.RetryTracer
} = (*Tracer)(nil)

// Option configures [New].
type Option func(*options)

type options struct {
	tp trace.TracerProvider
	mp metric.MeterProvider
}

// WithTracerProvider sets the provider of the spans (default: the global
// one, otel.GetTracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option { return func(o *options) { o.tp = tp } }

// WithMeterProvider sets the provider of the metrics (default: the global
// one, otel.GetMeterProvider).
func WithMeterProvider(mp metric.MeterProvider) Option { return func(o *options) { o.mp = mp } }

// New returns a Tracer. It returns an error when an instrument cannot be
// created by the meter provider.
func New(opts ...Option) (*Tracer, error) {
	o := options{}
	for _, f := range opts {
		f(&o)
	}
	if o.tp == nil {
		o.tp = otel.GetTracerProvider()
	}
	if o.mp == nil {
		o.mp = otel.GetMeterProvider()
	}
	m := o.mp.Meter(ScopeName)
	t := &Tracer{tracer: o.tp.Tracer(ScopeName)}
	var errs []error
	var e error
	t.rows, e = m.Int64Counter("backfill.rows", metric.WithUnit("{row}"),
		metric.WithDescription("Rows of committed chunks, by outcome (read, inserted, updated, unchanged, rejected, deduplicated)."))
	errs = append(errs, e)
	t.chunks, e = m.Int64Counter("backfill.chunks", metric.WithUnit("{chunk}"),
		metric.WithDescription("Ended chunk attempts, by outcome."))
	errs = append(errs, e)
	t.duration, e = m.Float64Histogram("backfill.chunk.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of a chunk attempt, from its claim to its end."),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
	errs = append(errs, e)
	t.throttled, e = m.Float64Counter("backfill.throttle.duration", metric.WithUnit("s"),
		metric.WithDescription("Time claims were held by a throttle signal, or waited for the rows-per-second cap."))
	errs = append(errs, e)
	t.retries, e = m.Int64Counter("backfill.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Failed tries (waits) and attempts of chunks, by kind and SQLSTATE."))
	errs = append(errs, e)
	t.exceptions, e = m.Int64Counter("backfill.exceptions", metric.WithUnit("{row}"),
		metric.WithDescription("Rows sent to the exception queue by committed chunks."))
	errs = append(errs, e)
	t.pauses, e = m.Int64Counter("backfill.pauses", metric.WithUnit("{pause}"),
		metric.WithDescription("Pauses of runs seen by this process, by source."))
	errs = append(errs, e)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("backfillotel: new: %w", err)
	}
	return t, nil
}

// The attribute keys.
const (
	keyJob       = attribute.Key("backfill.job")
	keyBatch     = attribute.Key("backfill.batch_id")
	keyWorker    = attribute.Key("backfill.worker")
	keyOutcome   = attribute.Key("backfill.outcome")
	keyChunkOut  = attribute.Key("backfill.chunk.outcome")
	keySignal    = attribute.Key("backfill.throttle.signal")
	keyRetryKind = attribute.Key("backfill.retry.kind")
	keyFinal     = attribute.Key("backfill.retry.final")
	keySQLState  = attribute.Key("db.response.status_code")
	keySource    = attribute.Key("backfill.pause.source")
)

// TraceRunStart starts the span "backfill.run".
func (t *Tracer) TraceRunStart(ctx context.Context, d backfilltrace.RunStartData) context.Context {
	ctx, _ = t.tracer.Start(ctx, "backfill.run", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(keyJob.String(d.Job), keyWorker.String(d.Worker)))
	return ctx
}

// TraceRunEnd ends the span of the run.
func (t *Tracer) TraceRunEnd(ctx context.Context, d backfilltrace.RunEndData) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(keyBatch.Int64(d.BatchID), attribute.String("backfill.run.status", string(d.Status)),
		attribute.Int("backfill.chunks_run", d.ChunksRun))
	span.SetAttributes(rowAttrs(d.Counts)...)
	endSpan(span, d.Err)
}

// TraceChunkStart starts the span "backfill.chunk", at the claim's
// beginning.
func (t *Tracer) TraceChunkStart(ctx context.Context, d backfilltrace.ChunkStartData) context.Context {
	lo, hi := d.Chunk.Bounds()
	ctx, _ = t.tracer.Start(ctx, "backfill.chunk", trace.WithTimestamp(d.Start),
		trace.WithAttributes(keyBatch.Int64(d.BatchID), keyJob.String(d.Job), keyWorker.String(d.Worker),
			attribute.Int("backfill.chunk.seq", d.Chunk.Seq), attribute.String("backfill.chunk.id", d.Chunk.ID),
			attribute.String("backfill.chunk.lower", lo), attribute.String("backfill.chunk.upper", hi),
			attribute.Int("backfill.chunk.attempt", d.Attempt)))
	return ctx
}

// TraceChunkEnd ends the chunk's span and records its metrics.
func (t *Tracer) TraceChunkEnd(ctx context.Context, d backfilltrace.ChunkEndData) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(keyChunkOut.String(d.Outcome))
	span.SetAttributes(rowAttrs(d.Counts)...)
	endSpan(span, d.Err)

	job := keyJob.String(d.Job)
	out := metric.WithAttributes(job, keyChunkOut.String(d.Outcome))
	t.chunks.Add(ctx, 1, out)
	t.duration.Record(ctx, d.Duration.Seconds(), out)
	if d.Outcome == backfilltrace.OutcomeFailed || d.Outcome == backfilltrace.OutcomeReleased {
		return
	}
	for _, o := range outcomes(d.Counts) {
		if o.n != 0 {
			t.rows.Add(ctx, o.n, metric.WithAttributes(job, keyOutcome.String(o.name)))
		}
	}
	if d.Counts.Rejected > 0 {
		t.exceptions.Add(ctx, d.Counts.Rejected, metric.WithAttributes(job))
	}
}

// TracePhaseStart starts the phase's span, "backfill." and the phase.
func (t *Tracer) TracePhaseStart(ctx context.Context, d backfilltrace.PhaseStartData) context.Context {
	ctx, _ = t.tracer.Start(ctx, "backfill."+string(d.Phase), trace.WithTimestamp(d.Start))
	return ctx
}

// TracePhaseEnd ends the phase's span.
func (t *Tracer) TracePhaseEnd(ctx context.Context, d backfilltrace.PhaseEndData) {
	span := trace.SpanFromContext(ctx)
	if d.Rows != 0 {
		span.SetAttributes(attribute.Int64("backfill.rows", d.Rows))
	}
	endSpan(span, d.Err)
}

// TraceThrottle adds the event "backfill.throttle" to the run's span and
// counts the time held.
func (t *Tracer) TraceThrottle(ctx context.Context, d backfilltrace.ThrottleData) {
	trace.SpanFromContext(ctx).AddEvent("backfill.throttle", trace.WithAttributes(
		attribute.String("backfill.throttle.event", d.Event), keySignal.String(d.Signal),
		attribute.Float64("backfill.throttle.value", d.Value), attribute.Float64("backfill.throttle.high", d.High),
		attribute.Float64("backfill.throttle.low", d.Low), attribute.Float64("backfill.throttle.held_seconds", d.Held.Seconds())))
	if d.Held > 0 {
		t.throttled.Add(ctx, d.Held.Seconds(), metric.WithAttributes(keyJob.String(d.Job), keySignal.String(d.Signal)))
	}
}

// TracePause adds the event "backfill.pause" to the run's span and counts
// it.
func (t *Tracer) TracePause(ctx context.Context, d backfilltrace.PauseData) {
	trace.SpanFromContext(ctx).AddEvent("backfill.pause", trace.WithAttributes(keySource.String(d.Source),
		attribute.String("backfill.pause.reason", d.Reason)))
	t.pauses.Add(ctx, 1, metric.WithAttributes(keyJob.String(d.Job), keySource.String(d.Source)))
}

// TraceRetry adds the event "backfill.retry" to the run's span and counts
// it.
func (t *Tracer) TraceRetry(ctx context.Context, d backfilltrace.RetryData) {
	attrs := []attribute.KeyValue{keyRetryKind.String(d.Kind), keySQLState.String(d.SQLState), keyFinal.Bool(d.Final)}
	ev := append(attrs, attribute.Int("backfill.chunk.seq", d.Chunk.Seq), attribute.Int("backfill.chunk.attempt", d.Attempt),
		attribute.Float64("backfill.retry.sleep_seconds", d.Sleep.Seconds()))
	if d.Err != nil {
		ev = append(ev, attribute.String("exception.message", d.Err.Error()))
	}
	trace.SpanFromContext(ctx).AddEvent("backfill.retry", trace.WithAttributes(ev...))
	t.retries.Add(ctx, 1, metric.WithAttributes(append(attrs, keyJob.String(d.Job))...))
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

type outcome struct {
	name string
	n    int64
}

func outcomes(c backfill.Counts) []outcome {
	return []outcome{{"read", c.Read}, {"inserted", c.Inserted}, {"updated", c.Updated}, {"unchanged", c.Unchanged},
		{"rejected", c.Rejected}, {"deduplicated", c.Deduplicated}}
}

func rowAttrs(c backfill.Counts) []attribute.KeyValue {
	var out []attribute.KeyValue
	for _, o := range outcomes(c) {
		out = append(out, attribute.Int64("backfill.rows."+o.name, o.n))
	}
	return out
}
