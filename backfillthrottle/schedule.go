package backfillthrottle

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/calendar"
)

// Schedule is a set of weekly windows in IANA time zones during which a
// run may work ([ParseSchedule]). As a [Signal] ("schedule") it reads 1
// outside every window and 0 inside, so a [Throttle] with High 1 holds
// the run outside its windows.
type Schedule struct {
	spec    string
	windows []window
	// Now is the clock of Read (tests).
	Now func() time.Time `json:"-" db:"-"`
}

type window struct {
	days       [7]bool // by time.Weekday: the day a window starts
	start, end int     // minutes after midnight; end may be 1440
	loc        *time.Location
}

// ParseSchedule parses spec, one or more windows separated by ";":
//
//	DAYS HH:MM-HH:MM ZONE
//
// DAYS is "*" (every day) or a comma-separated list of days (Mon, Tue,
// Wed, Thu, Fri, Sat, Sun, case-insensitive) and day ranges ("Mon-Fri";
// "Fri-Mon" wraps). The times are local wall-clock times in ZONE, an
// IANA zone name (time.LoadLocation, e.g. "Europe/Berlin", "UTC"); "24:00"
// ends a window at midnight. A window whose end is not after its start
// crosses midnight and ends on the next day: "Mon-Fri 22:00-06:00
// Europe/Berlin" runs from each weekday evening to the next morning
// (Friday's ends Saturday 06:00). Days name the day a window starts. En
// dashes may stand for the hyphens. Windows follow daylight saving time:
// a window is the wall-clock span of its day, so it lasts an hour less or
// more on the nights the clocks change. Each bound is the first instant at
// which ZONE's clock reads that time of that day or later, as the
// boundaries of backfill.Days: a time the clocks skip is the instant they
// skip it (the first instant after the gap, even when the gap swallows
// midnight), a time they read twice is its first occurrence, and "24:00"
// is the start of the next day. So "* 00:00-24:00" covers every instant,
// and a window crossing midnight into a skipped hour ends when the clocks
// jump, not an hour early.
//
// It returns an error wrapping [backfilltype.ErrInvalidConfig] naming the
// bad part.
func ParseSchedule(spec string) (*Schedule, error) {
	s := &Schedule{spec: spec, Now: time.Now}
	norm := strings.NewReplacer("–", "-", "—", "-").Replace(spec)
	for part := range strings.SplitSeq(norm, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		w, err := parseWindow(part)
		if err != nil {
			return nil, fmt.Errorf("%w: schedule %q: window %q: %w", backfilltype.ErrInvalidConfig, spec, part, err)
		}
		s.windows = append(s.windows, w)
	}
	if len(s.windows) == 0 {
		return nil, fmt.Errorf("%w: schedule %q: no window", backfilltype.ErrInvalidConfig, spec)
	}
	return s, nil
}

var dayNames = map[string]time.Weekday{"sun": time.Sunday, "mon": time.Monday, "tue": time.Tuesday, "wed": time.Wednesday,
	"thu": time.Thursday, "fri": time.Friday, "sat": time.Saturday}

func parseWindow(s string) (window, error) {
	var w window
	f := strings.Fields(s)
	if len(f) != 3 {
		return w, fmt.Errorf(`want "DAYS HH:MM-HH:MM ZONE", got %d fields`, len(f))
	}
	if f[0] == "*" {
		w.days = [7]bool{true, true, true, true, true, true, true}
	} else {
		for item := range strings.SplitSeq(f[0], ",") {
			from, to, isRange := strings.Cut(item, "-")
			a, ok := dayNames[strings.ToLower(from)]
			if !ok {
				return w, fmt.Errorf("day %q is not one of Mon Tue Wed Thu Fri Sat Sun", from)
			}
			b := a
			if isRange {
				if b, ok = dayNames[strings.ToLower(to)]; !ok {
					return w, fmt.Errorf("day %q is not one of Mon Tue Wed Thu Fri Sat Sun", to)
				}
			}
			for d := a; ; d = (d + 1) % 7 {
				w.days[d] = true
				if d == b {
					break
				}
			}
		}
	}
	from, to, ok := strings.Cut(f[1], "-")
	if !ok {
		return w, fmt.Errorf("times %q: want HH:MM-HH:MM", f[1])
	}
	var err error
	if w.start, err = parseClock(from); err != nil {
		return w, err
	}
	if w.end, err = parseClock(to); err != nil {
		return w, err
	}
	if w.start == 1440 {
		return w, fmt.Errorf("start 24:00: use 00:00 of the next day")
	}
	if w.start == w.end {
		return w, fmt.Errorf("start and end %s are the same: for a whole day write 00:00-24:00", from)
	}
	if f[2] == "Local" {
		return w, fmt.Errorf(`zone "Local" depends on the host: name an IANA zone`)
	}
	if w.loc, err = time.LoadLocation(f[2]); err != nil {
		return w, fmt.Errorf("zone %q: %w", f[2], err)
	}
	return w, nil
}

func parseClock(s string) (int, error) {
	h, m, ok := strings.Cut(s, ":")
	hh, err1 := strconv.Atoi(h)
	mm, err2 := strconv.Atoi(m)
	digits := func(s string) bool { return len(s) == 2 && s[0] >= '0' && s[0] <= '9' && s[1] >= '0' && s[1] <= '9' }
	if !ok || err1 != nil || err2 != nil || !digits(h) || !digits(m) || hh < 0 || hh > 24 || mm < 0 || mm > 59 || hh == 24 && mm != 0 {
		return 0, fmt.Errorf("time %q: want HH:MM from 00:00 to 24:00", s)
	}
	return hh*60 + mm, nil
}

// Contains reports whether t is inside one of the schedule's windows.
func (s *Schedule) Contains(t time.Time) bool {
	for _, w := range s.windows {
		if w.contains(t) {
			return true
		}
	}
	return false
}

func (w window) contains(t time.Time) bool {
	y, m, d := t.In(w.loc).Date()
	// A window that started today or yesterday (crossing midnight), or
	// tomorrow: where the clocks went back across midnight, t may read
	// today again after tomorrow began.
	for back := -1; back <= 1; back++ {
		day := time.Date(y, m, d-back, 0, 0, 0, 0, time.UTC) // the date, as calendar arithmetic
		if !w.days[day.Weekday()] {
			continue
		}
		endDay := day
		if w.end <= w.start {
			endDay = day.AddDate(0, 0, 1)
		}
		if !t.Before(w.bound(day, w.start)) && t.Before(w.bound(endDay, w.end)) {
			return true
		}
	}
	return false
}

// bound is the instant of a window's bound: the first instant at which
// the zone's clock reads minute minute (1440: the next day's 00:00) of the
// date day (midnight UTC of that date) or later (see ParseSchedule).
func (w window) bound(day time.Time, minute int) time.Time {
	return calendar.FirstAtOrAfter(day.Add(time.Duration(minute)*time.Minute), w.loc)
}

// String returns the spec the schedule was parsed from.
func (s *Schedule) String() string { return s.spec }

// Name implements [Signal]: "schedule".
func (s *Schedule) Name() string { return "schedule" }

// Read implements [Signal]: 1 outside every window, 0 inside. It does
// not touch the database.
func (s *Schedule) Read(context.Context, sqlx.ExtContext, SignalScope) (float64, error) {
	if s.Contains(s.Now()) {
		return 0, nil
	}
	return 1, nil
}

// ScheduleThrottle returns a [Throttle] that holds the run outside the
// windows of spec ([ParseSchedule]): High 1, released as soon as a
// window opens.
func ScheduleThrottle(spec string) (Throttle, error) {
	s, err := ParseSchedule(spec)
	if err != nil {
		return Throttle{}, err
	}
	return Throttle{Signal: s, High: 1, Low: 1}, nil
}
