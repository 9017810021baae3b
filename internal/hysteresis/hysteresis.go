package hysteresis

import (
	"time"

	"github.com/pgbackfill/backfill/backfillthrottle"
)

// Transition is what one reading did to a throttle's state.
type Transition int

const (
	Stay Transition = iota
	Hold
	Release
)

// State is one throttle's state: held since when. It is pure (the
// caller gives the time), so tests drive it with a fake clock.
type State struct {
	Throttle backfillthrottle.Throttle `json:"-" db:"-"`
	// ConfigHigh and cfgLow are the configured watermarks, which the
	// throttle knobs replace while set ([runControl]).
	ConfigHigh, ConfigLow float64   `json:"-" db:"-"`
	Held                  bool      `json:"-" db:"-"`
	Since                 time.Time `json:"-" db:"-"`
	Value                 float64   `json:"-" db:"-"` // the reading that started the hold, then the latest

	// With Adapt: the factor (0, 1] applied to the rate's ceiling, and
	// when it was last cut.
	Factor float64 `json:"-" db:"-"`
	cut    time.Time
	// Fails counts the consecutive readings that failed.
	Fails int `json:"-" db:"-"`
	// Read: some reading of the signal has succeeded.
	Read bool `json:"-" db:"-"`
	// LastRead is the value of the latest reading that succeeded.
	LastRead float64 `json:"-" db:"-"`
}

// UnreadableAfter is how many consecutive failed readings of a signal
// Hold the run (fail closed): a safety signal that cannot be read must
// not let the backfill run at full speed.
const UnreadableAfter = 3

// Adaptive rate steps (Throttle.Adapt).
const (
	AdaptDecrease = 0.5  // the factor a cut multiplies the rate by
	AdaptIncrease = 0.05 // the share of the ceiling regained per second below Low
	AdaptFloor    = 0.01 // the least factor
)

// Adapt takes reading v at now, read every interval, for a throttle
// with Adapt, and returns the transition: hold for a cut of the rate,
// Release when the rate is back at its ceiling, stay otherwise (also
// for a raise short of the ceiling).
func (h *State) Adapt(now time.Time, v float64, interval time.Duration) Transition {
	h.Value = v
	if h.Factor == 0 {
		h.Factor = 1
	}
	switch {
	case v >= h.Throttle.High:
		if !h.cut.IsZero() && now.Sub(h.cut) < max(h.Throttle.MinHold, interval) {
			return Stay
		}
		h.cut = now
		h.Factor = max(h.Factor*AdaptDecrease, AdaptFloor)
		if !h.Held {
			h.Held, h.Since = true, now
		}
		return Hold
	case v < h.Throttle.EffectiveLow() && h.Factor < 1:
		h.Factor = min(h.Factor+AdaptIncrease*interval.Seconds(), 1)
		if h.Factor == 1 {
			h.Held = false
			return Release
		}
	}
	return Stay
}

// Observe takes reading v at now and returns the transition it causes.
func (h *State) Observe(now time.Time, v float64) Transition {
	h.Value = v
	switch {
	case !h.Held && v >= h.Throttle.High:
		h.Held, h.Since = true, now
		return Hold
	case h.Held && v < h.Throttle.EffectiveLow() && now.Sub(h.Since) >= h.Throttle.MinHold:
		h.Held = false
		return Release
	}
	return Stay
}

// Critical reports whether v is at or above the throttle's critical
// level.
func (h *State) Critical(v float64) bool {
	return h.Throttle.Critical > 0 && v >= h.Throttle.Critical
}
