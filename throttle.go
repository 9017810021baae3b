package backfill

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jmoiron/sqlx"
)

// Throttles (see doc.go, "Throttles"): signals read before each claim,
// each with a high and a low watermark and a minimum hold, so that a
// value sitting at a threshold does not make the run flap; an optional
// critical level that pauses the run; a rows-per-second cap and a
// job-wide concurrency cap that hold across processes.

// DefaultThrottleInterval is how often a call of [Runner.Run] reads its
// throttles' signals when [Config.ThrottleInterval] is zero: a raised
// signal holds every worker within about this long (a reading, then the
// next claim of each worker), well under a second.
const DefaultThrottleInterval = 500 * time.Millisecond

// Signal is a measurement a [Throttle] watches: replica lag, WAL rate,
// the latency of a probe query, a schedule. Read is called every
// [Config.ThrottleInterval] by one goroutine per call of [Runner.Run]
// (never concurrently for one Signal value), with a context that ends
// after that interval. The built-in signals are [ReplicaLagSignal],
// [WALRateSignal], [ArchiveBacklogSignal], [AutovacuumSignal],
// [LockWaitersSignal], [ProbeLatencySignal], [SQLSignal] and a
// [Schedule] ([ScheduleThrottle]).
type Signal interface {
	// Name names the signal in logs and in the manifest's throttle
	// periods (e.g. "replica_lag").
	Name() string
	// Read returns the signal's value now, in the signal's unit. db is
	// the Runner's database; a Read with bind parameters must run them
	// in a transaction (behind a transaction pooler). An error is logged
	// and the reading skipped: the throttle keeps its state.
	Read(ctx context.Context, db sqlx.ExtContext, scope SignalScope) (float64, error)
}

// SignalScope is what a [Signal] may need to know about the run it is
// read for.
type SignalScope struct {
	// BatchID is the run's batch.
	BatchID int64
	// Table is the run's target table, quoted and schema-qualified
	// ("public"."orders" style, for to_regclass).
	Table string
	// WorkerKeys are the keys of the run's registered workers
	// ([Worker.Key]); their chunk transactions carry application_name
	// "backfill <key> ...". Empty when the manifest has no workers.
	WorkerKeys []string
}

// Throttle holds the claims of a run while its Signal is high.
//
// Hysteresis: the throttle holds when a reading is at or above High,
// and releases only when a reading is below Low AND the hold has lasted
// at least MinHold; a value sitting at the threshold therefore causes at
// most one hold and one release per MinHold. While held, no worker of the
// call claims a chunk (chunks in progress finish). Each hold is recorded
// in the manifest ([ThrottlePeriod]) and logged with its value and
// watermarks.
//
// A reading at or above Critical (when Critical > 0) pauses the run
// (status paused, the reason naming the signal and its value): every
// worker of every process stops claiming, Run returns an error wrapping
// [ErrRunPaused], and a person resumes it with [Runner.Resume].
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
	// TCP's congestion control does). A reading at or above High halves
	// the rate (at most once per max(MinHold, Config.ThrottleInterval),
	// so that a signal read over a window is not cut again for the same
	// excess); each reading below Low raises it by 5 % of its ceiling per
	// second of ThrottleInterval, until it is back at the ceiling. The
	// ceiling is the call's share of [Config.RowsPerSecond] or, without a
	// cap, the highest rate the call read over its last 10 s before the
	// first cut. The rate never falls below 1 % of the ceiling (Critical
	// is for stopping). The waits the cut rate causes are recorded as
	// throttle periods of this signal (each wait of at least
	// ThrottleInterval), so the run's time split counts only the time
	// spent waiting. Default false: on/off with hysteresis.
	//
	// Use it for signals that grow smoothly with the backfill's pace
	// (probe latency, replica lag, WAL rate), where holding and
	// releasing would make the backfill alternate between full speed and
	// none.
	Adapt bool
}

func (t Throttle) low() float64 {
	if t.Low == 0 {
		return t.High
	}
	return t.Low
}

func (t Throttle) validate(i int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: Throttles[%d]: "+format, append([]any{ErrInvalidConfig, i}, args...)...)
	}
	switch {
	case t.Signal == nil:
		return bad("Signal is required")
	case math.IsNaN(t.High) || math.IsNaN(t.Low) || math.IsNaN(t.Critical):
		return bad("NaN watermark (signal %s)", t.Signal.Name())
	case t.High == 0 && t.Low == 0:
		return bad("High is required (signal %s)", t.Signal.Name())
	case t.low() > t.High:
		return bad("Low (%v) exceeds High (%v) (signal %s)", t.Low, t.High, t.Signal.Name())
	case t.MinHold < 0:
		return bad("MinHold cannot be less than zero (signal %s)", t.Signal.Name())
	case t.Critical != 0 && t.Critical < t.High:
		return bad("Critical (%v) is below High (%v) (signal %s)", t.Critical, t.High, t.Signal.Name())
	}
	return nil
}

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
	th Throttle
	// cfgHigh and cfgLow are the configured watermarks, which the
	// throttle knobs replace while set (backfill_control.go).
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
	case v < h.th.low() && h.factor < 1:
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
	case h.held && v < h.th.low() && now.Sub(h.since) >= h.th.MinHold:
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
