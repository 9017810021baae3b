// Package calendar places calendar boundaries on instants in an IANA
// location, exactly across daylight-saving and other offset changes: the
// first instant a wall-clock reading occurs (the start of a day or a
// month, where time.Date may pick either side of a transition), the next
// whole hour or offset change, and the end of a zone period (where Go's
// time.Time.ZoneBounds misreports the last day of an extrapolated leap
// year).
package calendar

import "time"

// DayStart returns the start of day d of month m of year y in loc (d and
// m may be out of range and are normalised as by time.Date): the first
// instant at which loc's clock reads that date, which is midnight unless
// a transition skips it. For a date loc skips entirely it is the start
// of the next date that occurs.
func DayStart(y int, m time.Month, d int, loc *time.Location) time.Time {
	// time.Date normalises out-of-range months and days: "October 32
	// converts to November 1". UTC has no gaps, so this is plain calendar
	// arithmetic.
	return FirstAtOrAfter(time.Date(y, m, d, 0, 0, 0, 0, time.UTC), loc)
}

// MonthStart returns the start of month m of year y in loc (m may be out
// of range), the start of its first day as DayStart defines it.
func MonthStart(y int, m time.Month, loc *time.Location) time.Time {
	return DayStart(y, m, 1, loc)
}

// maxOffset bounds the UTC offset of any zone period, with a wide margin:
// real offsets, local mean time included, stay within ±16 hours.
const maxOffset = 48 * time.Hour

// FirstAtOrAfter returns, in loc, the earliest instant at which loc's clock
// reads the wall-clock time w or later. w carries the wall-clock reading as
// a time in UTC.
//
// Within one zone period [p, e) with offset o the clock reads t+o, which
// increases with t, so the earliest candidate there is max(p, w-o), valid if
// before e. Periods are scanned in order from well before w, and the first
// valid candidate is the earliest. This is exact where time.Date is not:
// for a reading that does not exist it returns the instant of the
// transition that skipped it, and for a reading that occurs twice it
// returns the first.
func FirstAtOrAfter(w time.Time, loc *time.Location) time.Time {
	p := w.Add(-maxOffset).In(loc)
	for {
		_, off := p.Zone()
		e := ZoneEnd(p)
		cand := w.Add(-time.Duration(off) * time.Second)
		if cand.Before(p) {
			cand = p
		}
		if e.IsZero() || cand.Before(e) {
			return cand.In(loc)
		}
		p = e
	}
}

// NextHour returns the first instant strictly after t, in t's location, at
// which the clock reads a whole hour or the UTC offset changes.
func NextHour(t time.Time) time.Time {
	for {
		_, off := t.Zone()
		e := ZoneEnd(t)
		o := time.Duration(off) * time.Second
		// Truncate rounds down to a multiple of an hour since the zero
		// time, which is itself on the hour, so this is the wall clock's
		// next whole hour, as an instant under offset o.
		cand := t.UTC().Add(o).Truncate(time.Hour).Add(time.Hour).Add(-o).In(t.Location())
		if e.IsZero() || cand.Before(e) {
			return cand
		}
		if _, off2 := e.Zone(); off2 != off || cand.Equal(e) {
			return e
		}
		// The period ending at e changes only the zone's name or DST flag,
		// or is a year boundary of an extrapolated rule (see ZoneEnd), not
		// the offset: the clock runs on, look past it.
		t = e
	}
}

// ZoneEnd returns the end of the zone period that contains t: an instant
// after t at or before the next change of t's zone, or the zero time if the
// zone never changes again. The end may also be a point where nothing
// changes; callers compare offsets.
//
// It is [time.Time.ZoneBounds] with one correction. For instants after the
// last transition listed in the zone data, Go extrapolates the zone's TZ
// rule one year at a time, and outside the daylight-saving period reports
// the end of that year as start+365 days (time/zoneinfo.go, tzset). On
// December 31 of a leap year that end is at or before t. No transition
// happens on that day, so the period runs on to January 1 UTC; should the
// offset differ there after all, the change is found by bisection.
func ZoneEnd(t time.Time) time.Time {
	_, e := t.ZoneBounds()
	if e.IsZero() || e.After(t) {
		return e
	}
	e = time.Date(t.UTC().Year()+1, time.January, 1, 0, 0, 0, 0, time.UTC).In(t.Location())
	if Offset(e) == Offset(t) {
		return e
	}
	// Zone data changes offsets on whole seconds. Invariant: the offset at
	// lo is t's, the offset at hi is not.
	lo, hi := t.Truncate(time.Second), e
	for hi.Sub(lo) > time.Second {
		mid := lo.Add(hi.Sub(lo) / 2).Truncate(time.Second)
		if Offset(mid) == Offset(t) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

// Offset returns t's UTC offset in seconds.
func Offset(t time.Time) int {
	_, off := t.Zone()
	return off
}
