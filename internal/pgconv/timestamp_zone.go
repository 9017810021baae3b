package pgconv

import (
	"sync"
	"time"
)

// zones caches loaded locations by IANA name (time.LoadLocation reads
// the zone file on every call): *time.Location, or nil for an unknown
// name.
var zones sync.Map

// loadZone returns the location of an IANA zone name, nil if unknown.
func loadZone(name string) *time.Location {
	if l, ok := zones.Load(name); ok {
		return l.(*time.Location)
	}
	l, err := time.LoadLocation(name)
	if err != nil || name == "Local" {
		l = nil
	}
	zones.Store(name, l)
	return l
}

// wallInstant returns the instant of wall clock w (its fields, in UTC) in
// loc, resolved as PostgreSQL resolves a local time at a transition
// (DetermineTimeZoneOffsetInternal in src/backend/utils/adt/datetime.c):
// a time that does not exist (in a spring-forward gap) takes the offset
// before the transition, an ambiguous one (a fall-back overlap) the
// offset after it. time.Date resolves these otherwise.
func wallInstant(w time.Time, loc *time.Location) time.Time {
	offAt := func(u time.Time) int {
		_, o := u.In(loc).Zone()
		return o
	}
	before, after := offAt(w.Add(-24*time.Hour)), offAt(w.Add(24*time.Hour))
	c1, c2 := w.Add(-time.Duration(before)*time.Second), w.Add(-time.Duration(after)*time.Second)
	v1, v2 := offAt(c1) == before, offAt(c2) == after
	switch {
	case v2:
		return c2 // valid with the later offset: unique, or ambiguous (PostgreSQL takes "after")
	case v1:
		return c1
	}
	return c1 // in a gap: the offset before the transition
}
