package pacer

import (
	"math"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Window is how far back the call's own rate is read for the
// ceiling of an adaptive throttle without a rows-per-second cap.
const Window = 10 * time.Second

// Pacer is a rows-per-second cap: the rows of a chunk are not known
// before it is read, so a try let through reserves an estimate (the
// recent mean rows of a chunk), settled with the rows it read when it
// ends (a shortfall is credited to the next reservations); a claim waits
// until what was reserved is paid for. The reservation spaces the tries
// of a call's workers evenly at the limited rate rather than letting
// them all through at once, so their commits (and WAL) do not come in
// bursts. It uses a token bucket (golang.org/x/time/rate) whose burst
// is one second of rows.
type Pacer struct {
	mu    sync.Mutex
	lim   *rate.Limiter
	until time.Time
	// est is the recent mean rows of a try (0 before the first);
	// prepaid the estimates reserved by open tries, open their number;
	// credit rows paid for and not read.
	est, prepaid, credit float64
	open                 int
	// The charges of the last adaptWindow, oldest first, for rateOver.
	recent []charged
}

type charged struct {
	at   time.Time
	rows int64
}

func New(perSecond float64) *Pacer {
	return &Pacer{lim: rate.NewLimiter(LimitOf(perSecond), burstOf(perSecond))}
}

// LimitOf is perSecond as a rate.Limit (an infinite rate is rate.Inf).
func LimitOf(perSecond float64) rate.Limit {
	if math.IsInf(perSecond, 1) {
		return rate.Inf
	}
	return rate.Limit(perSecond)
}

func burstOf(perSecond float64) int {
	return int(min(max(math.Ceil(perSecond), 1), math.MaxInt32))
}

func (p *Pacer) SetLimit(now time.Time, perSecond float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := float64(p.lim.Limit()); old != perSecond && p.until.After(now) {
		// What is still owed is paid at the new rate: a lifted cap
		// (Inf) ends the wait, a lowered one lengthens it.
		rest := float64(p.until.Sub(now))
		switch {
		case math.IsInf(perSecond, 1):
			p.until = now
		case !math.IsInf(old, 1) && perSecond > 0:
			p.until = now.Add(time.Duration(min(rest*old/perSecond, float64(time.Hour))))
		}
	}
	if p.lim.Limit() == LimitOf(perSecond) {
		return
	}
	p.lim.SetLimitAt(now, LimitOf(perSecond))
	p.lim.SetBurstAt(now, burstOf(perSecond))
}

func (p *Pacer) Limit() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return float64(p.lim.Limit())
}

// TryAdmit lets a try through at now when what was reserved is paid
// for, reserving its estimate, and returns 0; else it returns how long
// to wait before trying again.
func (p *Pacer) TryAdmit(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.until.Sub(now); d > 0 {
		return d
	}
	p.admitLocked(now)
	return 0
}

func (p *Pacer) admitLocked(now time.Time) {
	p.open++
	if p.est > 0 && !math.IsInf(float64(p.lim.Limit()), 1) {
		p.prepaid += p.est
		p.reserve(now, p.est)
	}
}

// Settle ends a try admitted before, which read n rows: its share of
// the estimates is replaced by n.
func (p *Pacer) Settle(now time.Time, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var e float64
	if p.open > 0 {
		e = p.prepaid / float64(p.open)
		p.prepaid -= e
		p.open--
	}
	if n > 0 {
		p.recent = append(p.recent, charged{now, n})
		if i := slices.IndexFunc(p.recent, func(c charged) bool { return now.Sub(c.at) <= Window }); i > 0 {
			p.recent = slices.Delete(p.recent, 0, i)
		}
		if p.est == 0 {
			p.est = float64(n)
		} else {
			p.est = 0.8*p.est + 0.2*float64(n)
		}
	}
	if d := float64(n) - e; d > 0 {
		p.reserve(now, d)
	} else {
		p.credit -= d
	}
}

// Charge takes n rows at now, as a try let through and settled at
// once, whatever the wait.
func (p *Pacer) Charge(now time.Time, n int64) {
	p.mu.Lock()
	p.open++
	p.mu.Unlock()
	p.Settle(now, n)
}

// reserve takes n rows at now, less the credit: the time from which the
// next claim may start moves past the moment the bucket has paid for
// them.
func (p *Pacer) reserve(now time.Time, rows float64) {
	use := min(p.credit, rows)
	p.credit -= use
	n := int64(math.Ceil(rows - use))
	b := int64(p.lim.Burst())
	for n > 0 {
		k := min(n, b)
		r := p.lim.ReserveN(now, int(k))
		if !r.OK() {
			return
		}
		if at := now.Add(r.DelayFrom(now)); at.After(p.until) {
			p.until = at
		}
		n -= k
	}
}

// RateOver is the rows per second charged over the last d before now
// (over the time since the first charge, when that is shorter).
func (p *Pacer) RateOver(now time.Time, d time.Duration) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var rows int64
	first := now
	for _, c := range p.recent {
		if now.Sub(c.at) <= d {
			rows += c.rows
			if c.at.Before(first) {
				first = c.at
			}
		}
	}
	// The first charge's rows were read before it: count the span from
	// one chunk earlier, at least a second.
	span := max(now.Sub(first), time.Second)
	return float64(rows) / span.Seconds()
}

// Delay is how long a claim at now waits.
func (p *Pacer) Delay(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.until.Sub(now), 0)
}
