// Package backfillthrottle holds what a backfill uses to stay out of
// live traffic's way: a [Throttle] pairs a [Signal] (replica lag, WAL
// rate, lock waiters, autovacuum, archive backlog, a latency probe, any
// SQL) with high and low watermarks, and a [Schedule] holds a run to
// time windows. Throttles are set in backfill.Config.Throttles; every
// worker process reads the same signals, so a hold applies to the whole
// job.
package backfillthrottle
