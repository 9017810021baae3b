// Package backfillthrottle holds what a backfill uses to stay out of
// live traffic's way: a [Throttle] pairs a [Signal] (replica lag, WAL
// rate, lock waiters, autovacuum, archive backlog, a latency probe, any
// SQL) with high and low watermarks, and a [Schedule] holds a run to
// time windows. [LatencyGoal] is a whole throttle made from a goal ("the
// application's latency may rise 30 %"): it measures its own baseline
// while the backfill is held. Throttles are set in
// backfill.Config.Throttles; every worker process reads the same
// signals, so a hold applies to the whole job.
package backfillthrottle
