package backfillthrottle

import (
	"fmt"
	"math"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
)

// DefaultThrottleInterval is how often a call of backfill.Runner.Run reads its
// throttles' signals when backfill.Config.ThrottleInterval is zero: a raised
// signal holds every worker within about this long (a reading, then the
// next claim of each worker), well under a second.
const DefaultThrottleInterval = 500 * time.Millisecond

// Throttle holds the claims of a run while its Signal is high.
//
// Hysteresis: the throttle holds when a reading is at or above High, and
// releases only when a reading is below Low AND the hold has lasted at
// least MinHold; a value sitting at the threshold therefore causes at most
// one hold and one release per MinHold. While held, no worker of the call
// claims a chunk (chunks in progress finish). Each hold is recorded in the
// manifest ([backfilltype.ThrottlePeriod]) and logged with its value and
// watermarks.
//
// A reading at or above Critical (when Critical > 0) pauses the run (status
// paused, the reason naming the signal and its value): every worker of
// every process stops claiming, Run returns an error wrapping
// [backfilltype.ErrRunPaused], and a person resumes it with
// backfill.Runner.Resume.
type Throttle struct {
	// Signal is what is watched. Required.
	Signal Signal
	// High is the value at or above which the throttle holds. Required:
	// High and Low may not both be zero.
	High float64
	// Low is the value below which a hold may end. Zero means High (no
	// band: a reading below High releases, after MinHold). Must not
	// exceed High.
	Low float64
	// MinHold is the least a hold lasts, whatever the readings. Default
	// 0: a hold ends at the first reading below Low.
	MinHold time.Duration
	// Critical, when > 0, is the value at or above which the run is
	// paused until a person resumes it. It must be at least High.
	Critical float64
	// Adapt makes the throttle proportional instead of on/off: it never
	// holds the claims, it steers the call's rows per second (AIMD, as
	// TCP's congestion control does). A reading at or above High halves the
	// rate (at most once per max(MinHold, Config.ThrottleInterval), so that
	// a signal read over a window is not cut again for the same excess);
	// each reading below Low raises it by 5 % of its ceiling per second of
	// ThrottleInterval, until it is back at the ceiling. The ceiling is the
	// call's share of backfill.Config.RowsPerSecond or, without a cap, the
	// highest rate the call read over 10 s while no cut was in force (as
	// of the latest cut made at full speed).
	// The rate never falls below 1 % of the ceiling (Critical is for
	// stopping). The waits the cut rate causes are recorded as throttle
	// periods of this signal (each wait of at least ThrottleInterval), so
	// the run's time split counts only the time spent waiting. Default
	// false: on/off with hysteresis.
	//
	// Use it for signals that grow smoothly with the backfill's pace
	// (probe latency, replica lag, WAL rate), where holding and
	// releasing would make the backfill alternate between full speed and
	// none.
	Adapt bool
}

// EffectiveLow returns the watermark below which a hold is released, in
// the signal's unit: Low, or High when Low is 0 (unset).
func (t Throttle) EffectiveLow() float64 {
	if t.Low == 0 {
		return t.High
	}
	return t.Low
}

// Validate checks t as entry i of backfill.Config.Throttles (i names it
// in the message): it returns an error wrapping
// [backfilltype.ErrInvalidConfig] when Signal is nil, a watermark is NaN,
// High and Low are both 0, [Throttle.EffectiveLow] exceeds High, MinHold
// is negative, or Critical is set (non-zero) below High; nil otherwise.
// backfill.NewWithDB calls it for every throttle.
func (t Throttle) Validate(i int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: Throttles[%d]: "+format, append([]any{backfilltype.ErrInvalidConfig, i}, args...)...)
	}
	switch {
	case t.Signal == nil:
		return bad("Signal is required")
	case math.IsNaN(t.High) || math.IsNaN(t.Low) || math.IsNaN(t.Critical):
		return bad("NaN watermark (signal %s)", t.Signal.Name())
	case t.High == 0 && t.Low == 0:
		return bad("High is required (signal %s)", t.Signal.Name())
	case t.EffectiveLow() > t.High:
		return bad("Low (%v) exceeds High (%v) (signal %s)", t.Low, t.High, t.Signal.Name())
	case t.MinHold < 0:
		return bad("MinHold cannot be less than zero (signal %s)", t.Signal.Name())
	case t.Critical != 0 && t.Critical < t.High:
		return bad("Critical (%v) is below High (%v) (signal %s)", t.Critical, t.High, t.Signal.Name())
	}
	return nil
}
