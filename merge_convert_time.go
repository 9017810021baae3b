package backfill

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Dates and times over PostgreSQL's whole range.
//
// PostgreSQL's date, timestamp and timestamptz (PostgreSQL docs, 8.5
// "Date/Time Types") start at 4714-11-24 BC, Julian day 0, and end at
// 5874897-12-31 (date) or 294276-12-31 23:59:59.999999 (timestamps, for
// timestamptz in UTC). Each also holds 'infinity' and '-infinity'. A
// time.Time of any year in that range is stored (Go's year 0 is 1 BC, -1
// is 2 BC, and so on, as in ISO 8601); text in the ISO form PostgreSQL
// prints is read with any number of year digits and an " AD" or " BC"
// suffix. 'infinity' and '-infinity' are written as that text (any case,
// as PostgreSQL reads it) or as the Go sentinels [TimeInfinity] and
// [TimeNegInfinity]; 'epoch' is 1970-01-01 00:00:00 UTC. Values outside
// the range are rejected with a reason naming the column and its range.
//
// Precision: PostgreSQL stores whole microseconds. Text with more
// fractional digits is rounded as PostgreSQL's input rounds it (half to
// even on the double it reads; '2024-12-31 23:59:59.9999999+00' is
// 2025-01-01 00:00:00+00), so that text is stored exactly as an INSERT
// of it would store it. A Go time.Time with nanoseconds is truncated
// toward the past instead (truncMicro): a value just before a chunk's end
// stays in that chunk, and the chunk check and the stored value agree.
// Text for time, timetz and interval columns is read by PostgreSQL itself.
//
// Besides the ISO form, PostgreSQL's compact forms that no session
// setting changes are read: YYYYMMDD and Julian day numbers (J2451187).
// A timestamptz takes a zone offset or an IANA zone name
// (America/New_York), resolved with Go's time zone database (the tzdata
// of the system, or of time/tzdata if the program embeds it) as
// PostgreSQL resolves local times at a transition (wallInstant); for
// times where the two databases disagree (some historical local mean
// times) write an offset.
//
// Text PostgreSQL would read otherwise than written is refused: relative
// times ('now', 'today'), whose value depends on when the chunk is
// loaded; forms whose meaning depends on the session's DateStyle
// (01/02/2024, month names, two-digit years) or timezone_abbreviations
// (EST); a timestamptz without a zone (read in the session's TimeZone); a zone on a timestamp without
// time zone, which PostgreSQL would silently ignore (write the wall clock,
// or a time.Time, which is stored as its wall clock in Job.Zone). A date
// is the date as written: a time and zone after it are ignored, as
// PostgreSQL ignores them.

// TimeInfinity and TimeNegInfinity stand, in a date, timestamp or
// timestamptz column, for PostgreSQL's 'infinity' and '-infinity' (later
// and earlier than every other value). They are instants no column can
// hold otherwise (some 146 billion years from now or ago), compared with
// time.Time.Equal. They also suit lib/pq's pq.EnableInfinityTs, so that
// infinite source values read with lib/pq are written back as such.
var (
	TimeInfinity    = time.Unix(1<<62, 0).UTC()
	TimeNegInfinity = time.Unix(-1<<62, 0).UTC()
)

// PostgreSQL's bounds: the first instant and the first instant after the
// range (src/include/datatype/timestamp.h: DATETIME_MIN_JULIAN,
// DATE_END_JULIAN, TIMESTAMP_END_JULIAN).
var (
	pgTimeMin      = time.Date(-4713, 11, 24, 0, 0, 0, 0, time.UTC)
	pgDateEnd      = time.Date(5874898, 1, 1, 0, 0, 0, 0, time.UTC)
	pgTimestampEnd = time.Date(294277, 1, 1, 0, 0, 0, 0, time.UTC)
)

// timeRangeReason is the reason for a value outside col's range.
func timeRangeReason(col Column) string {
	typ := cmpOr(col.Type, col.BaseType)
	switch col.BaseType {
	case "date":
		return fmt.Sprintf("date out of range: %s column %q holds 4714-11-24 BC to 5874897-12-31 AD, and ±infinity", typ, col.Name)
	case "timestamptz":
		return fmt.Sprintf("timestamp out of range: %s column %q holds 4714-11-24 00:00:00+00 BC to 294276-12-31 23:59:59.999999+00 AD, and ±infinity", typ, col.Name)
	}
	return fmt.Sprintf("timestamp out of range: %s column %q holds 4714-11-24 00:00:00 BC to 294276-12-31 23:59:59.999999 AD, and ±infinity", typ, col.Name)
}

// timeEnd is the first instant after col's range.
func timeEnd(col Column) time.Time {
	if col.BaseType == "date" {
		return pgDateEnd
	}
	return pgTimestampEnd
}

// infinity returns PostgreSQL's text for t when t is one of the
// sentinels.
func infinity(t time.Time) (string, bool) {
	switch {
	case t.Equal(TimeInfinity):
		return "infinity", true
	case t.Equal(TimeNegInfinity):
		return "-infinity", true
	}
	return "", false
}

// convertTime converts a time.Time for a date, timestamp or timestamptz
// column: its civil date (date), its wall clock in its own location
// (timestamp) or its instant in UTC (timestamptz), truncated to
// microseconds. Years 1 to 9999 take the fast path of time.Format.
func convertTime(col Column, x time.Time) (any, string) {
	x = truncMicro(x)
	if col.BaseType == "timestamptz" {
		x = x.UTC()
	}
	if y := x.Year(); y >= 1 && y <= 9999 {
		switch col.BaseType {
		case "date":
			return x.Format("2006-01-02"), ""
		case "timestamp":
			return x.Format("2006-01-02 15:04:05.999999"), ""
		}
		return x.Format(time.RFC3339Nano), ""
	}
	if s, ok := infinity(x); ok {
		return s, ""
	}
	// The same civil fields in UTC, to compare with the bounds.
	civil := time.Date(x.Year(), x.Month(), x.Day(), x.Hour(), x.Minute(), x.Second(), x.Nanosecond(), time.UTC)
	if col.BaseType == "date" {
		civil = time.Date(x.Year(), x.Month(), x.Day(), 0, 0, 0, 0, time.UTC)
	}
	if civil.Before(pgTimeMin) || !civil.Before(timeEnd(col)) {
		return nil, timeRangeReason(col)
	}
	return formatPGTime(col.BaseType, civil), ""
}

// formatPGTime renders t, in UTC and within PostgreSQL's range, as
// PostgreSQL reads it for a column of type base: YYYY-MM-DD (at least
// four year digits), then " HH:MM:SS[.ffffff]" (timestamp) or
// "THH:MM:SS[.ffffff]Z" (timestamptz), then " BC" for years before 1.
func formatPGTime(base string, t time.Time) string {
	y := t.Year()
	bc := y < 1
	if bc {
		y = 1 - y
	}
	b := make([]byte, 0, 40)
	for n := 1000; n > 1 && y < n; n /= 10 {
		b = append(b, '0')
	}
	b = strconv.AppendInt(b, int64(y), 10)
	b = append(b, '-')
	b = append2(b, int(t.Month()))
	b = append(b, '-')
	b = append2(b, t.Day())
	if base != "date" {
		if base == "timestamptz" {
			b = append(b, 'T')
		} else {
			b = append(b, ' ')
		}
		b = append2(b, t.Hour())
		b = append(b, ':')
		b = append2(b, t.Minute())
		b = append(b, ':')
		b = append2(b, t.Second())
		if us := t.Nanosecond() / 1000; us != 0 {
			frac := strconv.Itoa(1_000_000 + us)[1:]
			b = append(b, '.')
			b = append(b, strings.TrimRight(frac, "0")...)
		}
		if base == "timestamptz" {
			b = append(b, 'Z')
		}
	}
	if bc {
		b = append(b, " BC"...)
	}
	return string(b)
}

func append2(b []byte, n int) []byte {
	return append(b, byte('0'+n/10), byte('0'+n%10))
}

// pgSpace is what PostgreSQL's input functions skip around a value.
const pgSpace = " \t\n\r\v\f"

// dateTimeText is date/time text as parseDateTime reads it.
type dateTimeText struct {
	year, month, day     int // year astronomical: 0 is 1 BC
	hour, minute, second int
	nsec                 int
	clock, zone          bool   // a time of day, a zone offset
	offset               int    // seconds east of UTC
	zoneName             string // an IANA zone name instead of an offset
	inf                  int    // +1 'infinity', -1 '-infinity' (no other field set)
	epoch                bool   // 'epoch': 1970-01-01 00:00:00 UTC
	// badField: the text has the form but a field out of its range (year
	// 0, February 30th, 25:00); ok is false.
	badField bool
}

// parseDateTime reads s, surrounded by any whitespace, as
//
//	infinity | -infinity | epoch                 (any case)
//	Y...Y-MM-DD [(T|t|space)HH:MM[:SS[.f...]]] [[space]zone] [[spaces](AD|BC)]
//
// with at least four year digits (fewer read as two-digit years by
// PostgreSQL) and zone Z, z or ±HH[[:]MM[[:]SS]] (at most 15:59:59,
// PostgreSQL's limit). A fraction of a second is rounded to microseconds
// as PostgreSQL rounds it (fracMicros); d.nsec is then a whole number of
// microseconds, up to a whole second (59.9999995 is 60.000000, carried
// into the minute by civil). A time may be 24:00:00 (the next midnight)
// and a second 60 (the next minute), as PostgreSQL allows. ok is false for
// anything else.
func parseDateTime(s string) (d dateTimeText, ok bool) {
	if s == "" || strings.IndexByte(pgSpace, s[0]) >= 0 || strings.IndexByte(pgSpace, s[len(s)-1]) >= 0 {
		s = strings.Trim(s, pgSpace)
	}
	if len(s) < 10 {
		switch strings.ToLower(s) {
		case "infinity":
			d.inf = 1
			return d, true
		case "-infinity":
			d.inf = -1
			return d, true
		case "epoch":
			d.year, d.month, d.day, d.epoch = 1970, 1, 1, true
			return d, true
		}
	}
	if d, ok, handled := compactDate(s); handled {
		return d, ok
	}
	i := 0
	digits := func(min, max int) (int, bool) {
		start, v := i, 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' && i-start < max {
			v = v*10 + int(s[i]-'0')
			i++
		}
		return v, i-start >= min
	}
	at := func(c byte) bool {
		if i < len(s) && s[i] == c {
			i++
			return true
		}
		return false
	}
	var ok1, ok2, ok3 bool
	d.year, ok1 = digits(4, 9)
	if ok1 && i < len(s) && s[i] >= '0' && s[i] <= '9' {
		return d, false // more year digits than any column holds
	}
	if !ok1 || !at('-') {
		return d, false
	}
	yearZero := d.year == 0 // no year 0, AD or BC
	d.month, ok2 = digits(2, 2)
	if !ok2 || !at('-') {
		return d, false
	}
	d.day, ok3 = digits(2, 2)
	if !ok3 {
		return d, false
	}
	if i < len(s) && (s[i] == 'T' || s[i] == 't' || s[i] == ' ') && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' {
		i++
		var okh, okm bool
		d.clock = true
		d.hour, okh = digits(2, 2)
		if !okh || !at(':') {
			return d, false
		}
		d.minute, okm = digits(2, 2)
		if !okm {
			return d, false
		}
		if at(':') {
			var oks bool
			if d.second, oks = digits(2, 2); !oks {
				return d, false
			}
			if at('.') {
				start := i
				for i < len(s) && s[i] >= '0' && s[i] <= '9' {
					i++
				}
				if i == start {
					return d, false
				}
				d.nsec = fracMicros(s[start-1:i]) * 1000
			}
		}
		// The zone, after at most one space.
		j := i
		if j < len(s) && s[j] == ' ' {
			j++
		}
		if j < len(s) && (s[j] == 'Z' || s[j] == 'z' || s[j] == '+' || s[j] == '-') {
			i = j
			d.zone = true
			if !d.parseOffset(s, &i) {
				return d, false
			}
		} else if j < len(s) && (s[j] >= 'A' && s[j] <= 'Z' || s[j] >= 'a' && s[j] <= 'z') {
			// An IANA zone name, Area/Location (America/New_York): not
			// an abbreviation (PST), whose meaning depends on the
			// session's timezone_abbreviations, nor an era.
			k := j
			for k < len(s) && strings.IndexByte(pgSpace, s[k]) < 0 {
				k++
			}
			if name := s[j:k]; strings.IndexByte(name, '/') > 0 {
				d.zone, d.zoneName, i = true, name, k
			}
		}
	}
	// An era, after any whitespace; after a letter (the zone Z) only
	// after whitespace, as PostgreSQL reads "ZBC" as one word.
	if rest := strings.TrimLeft(s[i:], pgSpace); len(rest) == 2 && (len(rest) < len(s)-i || i == 0 || s[i-1] != 'Z' && s[i-1] != 'z') {
		switch strings.ToUpper(rest) {
		case "BC":
			d.year = 1 - d.year
			i = len(s)
		case "AD":
			i = len(s)
		}
	}
	if i != len(s) {
		return d, false
	}
	if yearZero || d.month < 1 || d.month > 12 || d.day < 1 || d.day > daysIn(d.year, d.month) ||
		d.hour > 24 || d.minute > 59 || d.second > 60 ||
		d.hour == 24 && (d.minute != 0 || d.second != 0 || d.nsec != 0) || d.second == 60 && d.nsec != 0 {
		d.badField = true
		return d, false
	}
	return d, true
}

// parseOffset reads a zone offset at s[*i:] into d.
func (d *dateTimeText) parseOffset(s string, i *int) bool {
	switch s[*i] {
	case 'Z', 'z':
		*i++
		return true
	}
	sign := 1
	if s[*i] == '-' {
		sign = -1
	}
	num := func(j int) (int, bool) {
		if j+2 > len(s) || s[j] < '0' || s[j] > '9' || s[j+1] < '0' || s[j+1] > '9' {
			return 0, false
		}
		return int(s[j]-'0')*10 + int(s[j+1]-'0'), true
	}
	hh, ok := num(*i + 1)
	if !ok {
		return false
	}
	*i += 3
	// Then MM and SS, both after a colon or neither.
	colon := *i < len(s) && s[*i] == ':'
	var mm, ss int
	for _, part := range []*int{&mm, &ss} {
		j := *i
		if colon != (j < len(s) && s[j] == ':') {
			break
		}
		if colon {
			j++
		}
		n, ok := num(j)
		if !ok {
			break
		}
		*part, *i = n, j+2
	}
	if hh > 15 || mm > 59 || ss > 59 {
		return false
	}
	d.offset = sign * (hh*3600 + mm*60 + ss)
	return true
}

// fracMicros returns frac, a fraction of a second as text ("." and one
// or more digits), in whole microseconds, rounded as PostgreSQL's
// date/time input rounds it (ParseFractionalSecond in
// src/backend/utils/adt/datetime.c: strtod, then rint(frac * 1000000),
// which rounds half to even in the default rounding mode): so
// .9999995 is 1000000 (the next second) and .1234575 is 123458 but
// .1234565 is 123456, whose double lies below the half. Go's ParseFloat
// and float64 multiplication are the same IEEE 754 operations as C's
// strtod and double multiplication, so the result is PostgreSQL's to the
// bit. Up to six digits the value is exact and read without floats.
func fracMicros(frac string) int {
	if len(frac) <= 7 {
		us := 0
		for _, c := range []byte(frac[1:]) {
			us = us*10 + int(c-'0')
		}
		for n := len(frac) - 1; n < 6; n++ {
			us *= 10
		}
		return us
	}
	f, err := strconv.ParseFloat(frac, 64)
	if err != nil {
		return 0 // not reached: frac is digits
	}
	return int(math.RoundToEven(f * 1e6))
}

// daysIn is the number of days of month m of year y (astronomical, the
// proleptic Gregorian calendar PostgreSQL uses for every year).
func daysIn(y, m int) int {
	switch m {
	case 2:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// compactDate reads s as one of the compact date forms PostgreSQL reads
// whatever its DateStyle: YYYYMMDD (exactly eight digits, ISO 8601 basic)
// and a Julian day number J<digits> (day 0 is 4714-11-24 BC). handled is
// false for any other text.
func compactDate(s string) (d dateTimeText, ok, handled bool) {
	allDigits := func(t string) bool {
		for i := range len(t) {
			if t[i] < '0' || t[i] > '9' {
				return false
			}
		}
		return t != ""
	}
	switch {
	case len(s) >= 2 && len(s) <= 11 && s[0] == 'J' && allDigits(s[1:]):
		jd, _ := strconv.Atoi(s[1:])
		t := pgTimeMin.AddDate(0, 0, jd)
		d.year, d.month, d.day = t.Year(), int(t.Month()), t.Day()
		return d, true, true
	case len(s) == 8 && allDigits(s):
		y, _ := strconv.Atoi(s[:4])
		m, _ := strconv.Atoi(s[4:6])
		day, _ := strconv.Atoi(s[6:])
		d.year, d.month, d.day = y, m, day
		if y == 0 || m < 1 || m > 12 || day < 1 || day > daysIn(y, m) {
			d.badField = true
			return d, false, true
		}
		return d, true, true
	}
	return d, false, false
}

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

// civil is d's date and time as a time.Time in UTC (its wall clock, the
// offset not applied).
func (d dateTimeText) civil() time.Time {
	return time.Date(d.year, time.Month(d.month), d.day, d.hour, d.minute, d.second, d.nsec, time.UTC)
}

// The reasons for date/time text outside the forms taken: they list the
// forms taken exactly. Forms refused although PostgreSQL may read them
// are those whose reading depends on the session (DateStyle: 01/02/2024,
// month names, two-digit years; timezone_abbreviations: PST; TimeZone: a
// timestamptz without zone) or on the clock (now, today).
const (
	reasonDateText = "invalid date: accepted forms are YYYY-MM-DD (four or more year digits; a time and zone after it are ignored), YYYYMMDD, " +
		"Julian day J<number>, each with optional AD/BC, and infinity, -infinity, epoch; forms that depend on DateStyle (01/02/2024, month names, two-digit years) or on the clock (today) are refused"
	reasonTimestampText = "invalid timestamp: accepted forms are YYYY-MM-DD[ |T]HH:MM[:SS[.ffffff]] without zone (four or more year digits), YYYYMMDD, Julian day J<number>, " +
		"each with optional AD/BC, and infinity, -infinity, epoch; a zone is refused (PostgreSQL would ignore it), as are forms that depend on DateStyle or on the clock (now)"
	reasonTimestamptzText = "invalid timestamptz: accepted forms are YYYY-MM-DD[ |T]HH:MM[:SS[.ffffff]] (four or more year digits, optional AD/BC) followed by a zone: " +
		"Z, an offset ±HH[:MM[:SS]], or an IANA name (America/New_York); and infinity, -infinity, epoch. Without a zone the text would be read in the session's TimeZone; " +
		"abbreviations (PST) depend on timezone_abbreviations and are refused"
)

// convertTimeText converts text s (v itself) for a date, timestamp or
// timestamptz column to the form convertTime gives the same value.
func convertTimeText(col Column, s string, v any) (any, string) {
	d, ok := parseDateTime(s)
	if d.badField {
		return nil, fmt.Sprintf("date/time field value out of range: %s column %q holds calendar dates of years 4714 BC (no year 0) and later, hours 00 to 24 (24:00:00 only), seconds 00 to 60",
			cmpOr(col.Type, col.BaseType), col.Name)
	}
	if d.inf != 0 {
		if d.inf > 0 {
			return "infinity", ""
		}
		return "-infinity", ""
	}
	switch col.BaseType {
	case "date":
		if !ok {
			return nil, reasonDateText
		}
		// The date as written: a time of day and a zone after it are
		// ignored, as PostgreSQL's date input ignores them (and as a
		// time.Time gives its civil date).
		d.hour, d.minute, d.second, d.nsec, d.zone = 0, 0, 0, 0, false
	case "timestamp":
		if !ok || d.zone {
			return nil, reasonTimestampText
		}
	default:
		if !ok || !d.zone && !d.epoch {
			return nil, reasonTimestamptzText
		}
	}
	t := d.civil()
	switch {
	case d.zoneName != "":
		loc := loadZone(d.zoneName)
		if loc == nil {
			return nil, fmt.Sprintf("unknown time zone %q: %s column %q takes IANA zone names of Go's time zone database (America/New_York) or offsets", d.zoneName, cmpOr(col.Type, col.BaseType), col.Name)
		}
		t = wallInstant(t, loc)
	case d.zone:
		t = t.Add(-time.Duration(d.offset) * time.Second)
	}
	if t.Before(pgTimeMin) || !t.Before(timeEnd(col)) {
		return nil, timeRangeReason(col)
	}
	// t is whole microseconds already: parseDateTime rounded the
	// fraction as PostgreSQL does.
	if y := t.Year(); y >= 1 && y <= 9999 {
		switch col.BaseType {
		case "date":
			if len(s) == len("2006-01-02") && s[4] == '-' && !d.epoch {
				return v, "" // already YYYY-MM-DD: the string as it came, without boxing it again
			}
			return t.Format("2006-01-02"), ""
		case "timestamp":
			return t.Format("2006-01-02 15:04:05.999999"), ""
		}
		return t.Format(time.RFC3339Nano), ""
	}
	return formatPGTime(col.BaseType, t), ""
}
