package backfillthrottle_test

import (
	"archive/zip"
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the zones, where the host has none

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfillthrottle"
)

// TestScheduleAcrossAMidnightGap: Sao Paulo skipped 2018-11-04 00:00-01:00
// (03:00Z, from UTC-3 to UTC-2). A whole-day window leaves no hole, and a
// Saturday window to 00:30, a time that did not exist, ends when the
// clocks jumped, at 01:00 local.
func TestScheduleAcrossAMidnightGap(t *testing.T) {
	t.Parallel()
	jump := time.Date(2018, 11, 4, 3, 0, 0, 0, time.UTC)
	whole, err := backfillthrottle.ParseSchedule("* 00:00-24:00 America/Sao_Paulo")
	require.NoError(t, err)
	for u := jump.Add(-3 * time.Hour); u.Before(jump.Add(3 * time.Hour)); u = u.Add(time.Minute) {
		require.True(t, whole.Contains(u), "00:00-24:00 at %s", u)
	}
	sat, err := backfillthrottle.ParseSchedule("Sat 20:00-00:30 America/Sao_Paulo")
	require.NoError(t, err)
	require.True(t, sat.Contains(time.Date(2018, 11, 3, 23, 0, 0, 0, time.UTC)), "Sat 20:00 BRT")
	require.False(t, sat.Contains(time.Date(2018, 11, 3, 22, 59, 0, 0, time.UTC)), "Sat 19:59 BRT")
	require.True(t, sat.Contains(jump.Add(-time.Nanosecond)), "Sat 23:59:59.999999999 BRT")
	require.False(t, sat.Contains(jump), "Sun 01:00 BRST, the first instant after the gap")
}

// zoneNames lists the IANA zones of the Go distribution's zone database
// ($GOROOT/lib/time/zoneinfo.zip, the data time/tzdata embeds), or else
// of the host's tzdata.zi; nil when neither is there.
func zoneNames(t *testing.T) []string {
	t.Helper()
	goroot := os.Getenv("GOROOT")
	if goroot == "" {
		if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
			goroot = strings.TrimSpace(string(out))
		}
	}
	if goroot != "" {
		if z, err := zip.OpenReader(filepath.Join(goroot, "lib", "time", "zoneinfo.zip")); err == nil {
			defer z.Close()
			var names []string
			for _, f := range z.File {
				names = append(names, f.Name)
			}
			return names
		}
	}
	f, err := os.Open("/usr/share/zoneinfo/tzdata.zi")
	if err != nil {
		return nil
	}
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "Z name ..." is a zone, "L target name" a link.
		switch fs := strings.Fields(sc.Text()); {
		case len(fs) >= 2 && fs[0] == "Z":
			names = append(names, fs[1])
		case len(fs) >= 3 && fs[0] == "L":
			names = append(names, fs[2])
		}
	}
	return names
}

// wallTime is a reading of a zone's clock: a date and a time of day, as
// a time in UTC, so that readings compare in calendar order.
func wallTime(u time.Time, loc *time.Location) time.Time {
	l := u.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
}

var weekdays = []string{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"}

func clock(minute int) string { return fmt.Sprintf("%02d:%02d", minute/60, minute%60) }

// TestScheduleAcrossEveryOffsetChange: in every IANA zone whose offset
// changed between 2000 and 2030, around every change: a window
// 00:00-24:00 covers every instant; a window that crosses midnight and
// ends at a reading at or near the change (in a gap, in a repeated hour,
// at either edge) ends at the first instant at which the clock reads that
// time or later; and a window starting there starts at that instant.
func TestScheduleAcrossEveryOffsetChange(t *testing.T) {
	t.Parallel()
	names := zoneNames(t)
	if len(names) == 0 {
		t.Skip("no list of the IANA zones: neither $GOROOT/lib/time/zoneinfo.zip nor /usr/share/zoneinfo/tzdata.zi")
	}
	from, until := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	zones, changes := 0, 0
	seen := map[string]bool{} // the zones' changes: a link or an alias is checked once
	for _, name := range names {
		loc, err := time.LoadLocation(name)
		if err != nil || name == "Local" {
			continue
		}
		var trs []time.Time
		var key strings.Builder
		for u := from; u.Before(until); {
			_, end := u.In(loc).ZoneBounds()
			if end.IsZero() || !end.After(u) || !end.Before(until) {
				break
			}
			u = end
			_, before := end.Add(-time.Nanosecond).Zone()
			_, after := end.Zone()
			if before == after {
				continue // the name or DST flag changed, not the clock
			}
			trs = append(trs, end)
			fmt.Fprintf(&key, "%d:%d:%d ", end.Unix(), before, after)
		}
		if len(trs) == 0 || seen[key.String()] {
			continue
		}
		seen[key.String()] = true
		whole, err := backfillthrottle.ParseSchedule("* 00:00-24:00 " + name)
		require.NoError(t, err, name)
		zones++
		changes += len(trs)
		for _, tr := range trs {
			checkChange(t, name, loc, whole, tr)
		}
	}
	t.Logf("%d zones with distinct offset changes, %d changes checked", zones, changes)
	require.Positive(t, changes)
}

// checkChange checks the windows around the offset change at instant tr
// in zone name.
func checkChange(t *testing.T, name string, loc *time.Location, whole *backfillthrottle.Schedule, tr time.Time) {
	t.Helper()
	for _, d := range []time.Duration{-26 * time.Hour, -2 * time.Hour, -time.Hour, -time.Second, -time.Nanosecond, 0,
		time.Nanosecond, time.Second, time.Hour, 2 * time.Hour, 26 * time.Hour} {
		require.True(t, whole.Contains(tr.Add(d)), "%s: 00:00-24:00 at %s (change at %s)", name, tr.Add(d), tr)
	}
	// Readings at the edges of the change and between them, to the minute.
	w1, w2 := wallTime(tr.Add(-time.Nanosecond), loc), wallTime(tr, loc)
	lo, hi := w1, w2
	if hi.Before(lo) {
		lo, hi = hi, lo
	}
	if hi.Sub(lo) > 6*time.Hour {
		// Not daylight saving time but a zone moving across the date
		// line (Pacific/Apia skipped 2011-12-30): the windows of the
		// skipped day are empty, and only the coverage above applies.
		return
	}
	var readings []time.Time
	for _, r := range []time.Time{lo, lo.Add(hi.Sub(lo) / 2), hi, hi.Add(time.Minute)} {
		r = r.Add(time.Minute - time.Nanosecond).Truncate(time.Minute) // the next whole minute, or r
		if !slices.ContainsFunc(readings, r.Equal) {
			readings = append(readings, r)
		}
	}
	for _, r := range readings {
		minute := r.Hour()*60 + r.Minute()
		// The first instant at which the clock reads r or later.
		first := func(u time.Time) bool { return !wallTime(u, loc).Before(r) }
		// A window ending at r, crossing midnight from the day before; or
		// at 24:00 when r is midnight.
		var specs []string
		if minute < 1439 {
			specs = append(specs, fmt.Sprintf("%s %s-%s %s", weekdays[r.AddDate(0, 0, -1).Weekday()], clock(minute+1), clock(minute), name))
		}
		if minute == 0 {
			specs = append(specs, fmt.Sprintf("%s 12:00-24:00 %s", weekdays[r.AddDate(0, 0, -1).Weekday()], name))
		}
		for _, spec := range specs {
			s, err := backfillthrottle.ParseSchedule(spec)
			require.NoError(t, err, spec)
			f := flip(t, s, tr.Add(-6*time.Hour), tr.Add(6*time.Hour), true)
			require.True(t, first(f) && !first(f.Add(-time.Nanosecond)), "%s: ends at %s (reads %s), want the first instant reading %s or later (change at %s)",
				spec, f, wallTime(f, loc), r, tr)
		}
		// A window starting at r, lasting about a day.
		{
			spec := fmt.Sprintf("%s %s-%s %s", weekdays[r.Weekday()], clock(minute), clock((minute+1439)%1440), name)
			s, err := backfillthrottle.ParseSchedule(spec)
			require.NoError(t, err, spec)
			f := flip(t, s, tr.Add(-6*time.Hour), tr.Add(6*time.Hour), false)
			require.True(t, first(f) && !first(f.Add(-time.Nanosecond)), "%s: starts at %s (reads %s), want the first instant reading %s or later (change at %s)",
				spec, f, wallTime(f, loc), r, tr)
		}
	}
}

// flip returns the instant in (lo, hi] at which s.Contains turns from
// was to !was, found by bisection on whole seconds (lo and hi are, and so
// are the offset changes and the readings of the tests' windows), then
// checked to the nanosecond; Contains must be was at lo and !was at hi.
func flip(t *testing.T, s *backfillthrottle.Schedule, lo, hi time.Time, was bool) time.Time {
	t.Helper()
	require.Equal(t, was, s.Contains(lo), "%s at %s", s, lo)
	require.Equal(t, !was, s.Contains(hi), "%s at %s", s, hi)
	for hi.Sub(lo) > time.Second {
		mid := lo.Add(hi.Sub(lo) / 2).Truncate(time.Second)
		if s.Contains(mid) == was {
			lo = mid
		} else {
			hi = mid
		}
	}
	require.Equal(t, was, s.Contains(hi.Add(-time.Nanosecond)), "%s at %s: Contains changes within the second before %s", s, hi.Add(-time.Nanosecond), hi)
	return hi
}
