package backfillthrottle

import "time"

// GoalState exposes the pure state of LatencyGoal's signal to the
// external tests: Observe records a reading's samples at now and returns
// the signal's value, as Read does after reading its source.
type GoalState struct{ s *goalState }

// NewGoalState is the state of a probe (mean false: the percentile) or
// of the statements (mean true), for a goal of rise 0.3.
func NewGoalState(o GoalOptions, mean bool) GoalState {
	return GoalState{newGoalState(o.withDefaults(), 0.3, mean)}
}

// Observe takes probes' latencies.
func (g GoalState) Observe(now time.Time, took ...time.Duration) float64 {
	ss := make([]sample, len(took))
	for i, d := range took {
		ss[i] = sample{d: d, n: 1}
	}
	return g.s.observe(now, ss)
}

// ObserveStatements takes the total time of n statements.
func (g GoalState) ObserveStatements(now time.Time, total time.Duration, n float64) float64 {
	return g.s.observe(now, []sample{{d: total, n: n}})
}

func (g GoalState) Calibrating() bool       { return g.s.calibrating }
func (g GoalState) Baseline() time.Duration { return g.s.baseline }
