package backfill

import (
	"time"

	"github.com/pgbackfill/backfill/backfillthrottle"
)

// Throttles (see the package documentation, "Throttles"): signals read
// before each claim, each with a high and a low watermark and a minimum
// hold, so that a value sitting at a threshold does not make the run flap;
// an optional critical level that pauses the run; a rows-per-second cap and
// a job-wide concurrency cap that hold across processes.

// transition is what one reading did to a throttle's state.
type transition int

const (
	stay transition = iota
	hold
	release
)

// hysteresis is one throttle's state: held since when. It is pure (the
// caller gives the time), so tests drive it with a fake clock.
type hysteresis struct {
	th backfillthrottle.Throttle
	// cfgHigh and cfgLow are the configured watermarks, which the
	// throttle knobs replace while set ([runControl]).
	cfgHigh, cfgLow float64
	held            bool
	since           time.Time
	value           float64 // the reading that started the hold, then the latest

	// With Adapt: the factor (0, 1] applied to the rate's ceiling, and
	// when it was last cut.
	factor float64
	cut    time.Time
	// fails counts the consecutive readings that failed.
	fails int
}

// unreadableAfter is how many consecutive failed readings of a signal
// hold the run (fail closed): a safety signal that cannot be read must
// not let the backfill run at full speed.
const unreadableAfter = 3

// Adaptive rate steps (Throttle.Adapt).
const (
	adaptDecrease = 0.5  // the factor a cut multiplies the rate by
	adaptIncrease = 0.05 // the share of the ceiling regained per second below Low
	adaptFloor    = 0.01 // the least factor
)

// adapt takes reading v at now, read every interval, for a throttle
// with Adapt, and returns the transition: hold for a cut of the rate,
// release when the rate is back at its ceiling, stay otherwise (also
// for a raise short of the ceiling).
func (h *hysteresis) adapt(now time.Time, v float64, interval time.Duration) transition {
	h.value = v
	if h.factor == 0 {
		h.factor = 1
	}
	switch {
	case v >= h.th.High:
		if !h.cut.IsZero() && now.Sub(h.cut) < max(h.th.MinHold, interval) {
			return stay
		}
		h.cut = now
		h.factor = max(h.factor*adaptDecrease, adaptFloor)
		if !h.held {
			h.held, h.since = true, now
		}
		return hold
	case v < h.th.EffectiveLow() && h.factor < 1:
		h.factor = min(h.factor+adaptIncrease*interval.Seconds(), 1)
		if h.factor == 1 {
			h.held = false
			return release
		}
	}
	return stay
}

// observe takes reading v at now and returns the transition it causes.
func (h *hysteresis) observe(now time.Time, v float64) transition {
	h.value = v
	switch {
	case !h.held && v >= h.th.High:
		h.held, h.since = true, now
		return hold
	case h.held && v < h.th.EffectiveLow() && now.Sub(h.since) >= h.th.MinHold:
		h.held = false
		return release
	}
	return stay
}

// critical reports whether v is at or above the throttle's critical
// level.
func (h *hysteresis) critical(v float64) bool {
	return h.th.Critical > 0 && v >= h.th.Critical
}
