// Package backfilltrace holds the tracing hooks of a backfill run: the
// [Tracer] set in backfill.Config.Tracer, the optional tracers it may
// also implement ([RunTracer], [PhaseTracer], [ThrottleTracer],
// [PauseTracer], [RetryTracer]), looked up once when the Runner is built,
// and the data each hook receives.
//
// contrib/otel adapts these hooks to OpenTelemetry spans and metrics;
// implement them directly for anything else.
package backfilltrace
