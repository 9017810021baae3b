package calendar

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// zones have offsets and transitions on whole minutes from 1950 on, so
// that scanning minute marks finds every reading and every change.
var zones = []string{"UTC", "America/New_York", "America/Santiago", "America/Havana", "Asia/Beirut",
	"Australia/Lord_Howe", "Pacific/Apia", "Asia/Kolkata", "Asia/Kathmandu", "Europe/Amsterdam", "Pacific/Chatham"}

func load(tb testing.TB, name string) *time.Location {
	tb.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(tb, err)
	return loc
}

// reading is t's wall clock in loc as a time in UTC.
func reading(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
}

// TestDayStartKnownDays: midnight where it occurs, the transition where
// a change skips midnight, the first of two midnights, and the next day
// for a date the zone skipped.
func TestDayStartKnownDays(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		zone string
		y    int
		m    time.Month
		d    int
		want string
	}{
		{"America/New_York", 2024, 3, 10, "2024-03-10T00:00:00-05:00"},
		{"America/New_York", 2024, 3, 11, "2024-03-11T00:00:00-04:00"},
		{"America/Santiago", 2024, 9, 8, "2024-09-08T01:00:00-03:00"}, // 00:00 skipped
		{"America/Havana", 2024, 11, 3, "2024-11-03T00:00:00-04:00"},  // the first of two midnights
		{"Pacific/Apia", 2011, 12, 30, "2011-12-31T00:00:00+14:00"},   // skipped date
		{"UTC", 2024, 2, 30, "2024-03-01T00:00:00Z"},                  // normalised
	} {
		loc := load(t, c.zone)
		got := DayStart(c.y, c.m, c.d, loc)
		require.Equal(t, c.want, got.Format(time.RFC3339), "%s %d-%d-%d", c.zone, c.y, c.m, c.d)
	}
	loc := load(t, "America/Santiago")
	require.True(t, MonthStart(2024, 9, loc).Equal(DayStart(2024, 9, 1, loc)))
	require.True(t, MonthStart(2024, 13, loc).Equal(DayStart(2025, 1, 1, loc)))
}

// TestFirstAtOrAfterIsEarliest: the instant reads w or later, and no
// earlier instant (scanned at every minute mark over two days before it,
// where readings peak and offsets change) does.
func TestFirstAtOrAfterIsEarliest(t *testing.T) {
	t.Parallel()
	lo := time.Date(1950, 1, 1, 0, 0, 0, 0, time.UTC).Unix() / 60
	hi := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).Unix() / 60
	rapid.Check(t, func(rt *rapid.T) {
		loc := load(t, rapid.SampledFrom(zones).Draw(rt, "zone"))
		w := time.Unix(rapid.Int64Range(lo, hi).Draw(rt, "minute")*60, 0).UTC()
		got := FirstAtOrAfter(w, loc)
		require.Equal(rt, loc, got.Location())
		require.False(rt, reading(got, loc).Before(w), "%v reads before %v", got, w)
		for m := got.Truncate(time.Minute); m.After(got.Add(-2 * maxOffset)); m = m.Add(-time.Minute) {
			if b := m.Add(-time.Nanosecond); b.Before(got) {
				require.True(rt, reading(b, loc).Before(w), "%v, before %v, reads %v, not before %v", b, got, reading(b, loc), w)
			}
		}
	})
}

// TestNextHourIsNextBoundary: the next instant strictly after t at which
// the clock reads a whole hour or the offset changes, and no minute mark
// between is one.
func TestNextHourIsNextBoundary(t *testing.T) {
	t.Parallel()
	lo := time.Date(1950, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	hi := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	boundary := func(b time.Time) bool {
		_, m, s := b.Clock()
		return m == 0 && s == 0 && b.Nanosecond() == 0 || Offset(b) != Offset(b.Add(-time.Nanosecond))
	}
	rapid.Check(t, func(rt *rapid.T) {
		loc := load(t, rapid.SampledFrom(zones).Draw(rt, "zone"))
		at := time.UnixMicro(rapid.Int64Range(lo, hi).Draw(rt, "at")).In(loc)
		got := NextHour(at)
		require.True(rt, got.After(at))
		require.LessOrEqual(rt, got.Sub(at), time.Hour)
		require.True(rt, boundary(got), "%v after %v is no boundary", got, at)
		for m := at.Truncate(time.Minute).Add(time.Minute); m.Before(got); m = m.Add(time.Minute) {
			require.False(rt, m.After(at) && boundary(m), "%v lies between %v and %v", m, at, got)
		}
	})
}

// TestZoneEndExtrapolatedLeapYear: on December 31 of a leap year after
// the zone data, where time.Time.ZoneBounds gives an end at or before t,
// ZoneEnd gives one after t with the offset unchanged up to it.
func TestZoneEndExtrapolatedLeapYear(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"America/New_York", "Europe/Amsterdam", "Australia/Lord_Howe"} {
		loc := load(t, name)
		at := time.Date(2096, 12, 31, 12, 0, 0, 0, loc)
		e := ZoneEnd(at)
		require.True(t, e.After(at), "%s: %v", name, e)
		require.Equal(t, Offset(at), Offset(e.Add(-time.Second)), name)
		for d := at; d.Before(e); d = d.Add(time.Hour) {
			require.Equal(t, Offset(at), Offset(d), "%s %v", name, d)
		}
	}
	// A zone that never changes has no end.
	require.True(t, ZoneEnd(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero())
}
