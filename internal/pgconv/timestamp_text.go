package pgconv

import (
	"math"
	"strconv"
	"strings"
	"time"
)

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
// PostgreSQL's limit), or an IANA zone name Area/Location after at most
// one space; or one of the compact dates compactDate reads. A fraction of
// a second is rounded to microseconds as PostgreSQL rounds it
// (fracMicros); d.nsec is then a whole number of microseconds, up to a
// whole second (59.9999995 is 60.000000, carried into the minute by
// civil). A time may be 24:00:00 (the next midnight) and a second 60 (the
// next minute), as PostgreSQL allows. ok is false for anything else.
func parseDateTime(s string) (d dateTimeText, ok bool) {
	if s == "" || strings.IndexByte(Space, s[0]) >= 0 || strings.IndexByte(Space, s[len(s)-1]) >= 0 {
		s = strings.Trim(s, Space)
	}
	if len(s) < 10 {
		if d, ok := specialDateTime(s); ok {
			return d, true
		}
	}
	if d, ok, handled := compactDate(s); handled {
		return d, ok
	}
	p := &dateTimeScanner{s: s}
	if !d.scanDate(p) {
		return d, false
	}
	yearZero := d.year == 0 // no year 0, AD or BC
	if p.clockFollows() && !d.scanClock(p) {
		return d, false
	}
	d.scanEra(p)
	if p.i != len(s) {
		return d, false
	}
	if yearZero || !d.fieldsInRange() {
		d.badField = true
		return d, false
	}
	return d, true
}

// ReadTime reads s, text Convert returns (or takes) for a date, timestamp
// or timestamptz column, back into a time: the instant when the text has
// a zone (zoned), else its wall clock as a time.Time in UTC, for the
// caller to place in its zone; Infinity and NegInfinity for 'infinity'
// and '-infinity'. The fraction is rounded as Convert rounds it, so that
// the time read is the time stored. ok is false for text Convert refuses
// for every such column, and for an unknown zone name.
func ReadTime(s string) (t time.Time, zoned, ok bool) {
	d, ok := parseDateTime(s)
	switch {
	case !ok:
		return time.Time{}, false, false
	case d.inf > 0:
		return Infinity, true, true
	case d.inf < 0:
		return NegInfinity, true, true
	case d.zoneName != "":
		loc := loadZone(d.zoneName)
		if loc == nil {
			return time.Time{}, false, false
		}
		return wallInstant(d.civil(), loc), true, true
	case d.zone:
		return d.civil().Add(-time.Duration(d.offset) * time.Second), true, true
	}
	return d.civil(), false, true
}

// specialDateTime reads PostgreSQL's special date/time words (any case):
// infinity, -infinity and epoch.
func specialDateTime(s string) (d dateTimeText, ok bool) {
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
	return d, false
}

// dateTimeScanner reads date/time text s from position i.
type dateTimeScanner struct {
	s string
	i int
}

// digits reads at least min and at most max decimal digits.
func (p *dateTimeScanner) digits(min, max int) (int, bool) {
	start, v := p.i, 0
	for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' && p.i-start < max {
		v = v*10 + int(p.s[p.i]-'0')
		p.i++
	}
	return v, p.i-start >= min
}

// at reads c if it comes next.
func (p *dateTimeScanner) at(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

// digitAt reports whether s[j] is a decimal digit.
func (p *dateTimeScanner) digitAt(j int) bool {
	return j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9'
}

// clockFollows reports whether a time of day follows the date: T, t or a
// space, then a digit.
func (p *dateTimeScanner) clockFollows() bool {
	return p.i < len(p.s) && (p.s[p.i] == 'T' || p.s[p.i] == 't' || p.s[p.i] == ' ') && p.digitAt(p.i+1)
}

// scanDate reads Y...Y-MM-DD (four to nine year digits).
func (d *dateTimeText) scanDate(p *dateTimeScanner) bool {
	var ok bool
	if d.year, ok = p.digits(4, 9); !ok || p.digitAt(p.i) {
		return false // too few year digits, or more than any column holds
	}
	if !p.at('-') {
		return false
	}
	if d.month, ok = p.digits(2, 2); !ok || !p.at('-') {
		return false
	}
	d.day, ok = p.digits(2, 2)
	return ok
}

// scanClock reads the separator, HH:MM[:SS[.f...]] and an optional zone
// (an offset or an IANA zone name) after at most one space.
func (d *dateTimeText) scanClock(p *dateTimeScanner) bool {
	p.i++ // T, t or space
	d.clock = true
	var ok bool
	if d.hour, ok = p.digits(2, 2); !ok || !p.at(':') {
		return false
	}
	if d.minute, ok = p.digits(2, 2); !ok {
		return false
	}
	if p.at(':') {
		if d.second, ok = p.digits(2, 2); !ok {
			return false
		}
		if p.at('.') && !d.scanFraction(p) {
			return false
		}
	}
	// The zone, after at most one space.
	j := p.i
	if j < len(p.s) && p.s[j] == ' ' {
		j++
	}
	if j < len(p.s) && strings.IndexByte("Zz+-", p.s[j]) >= 0 {
		p.i = j
		d.zone = true
		return d.parseOffset(p.s, &p.i)
	}
	if j < len(p.s) && (p.s[j] >= 'A' && p.s[j] <= 'Z' || p.s[j] >= 'a' && p.s[j] <= 'z') {
		// An IANA zone name, Area/Location (America/New_York): not an
		// abbreviation (PST), whose meaning depends on the session's
		// timezone_abbreviations, nor an era.
		k := j
		for k < len(p.s) && strings.IndexByte(Space, p.s[k]) < 0 {
			k++
		}
		if name := p.s[j:k]; strings.IndexByte(name, '/') > 0 {
			d.zone, d.zoneName, p.i = true, name, k
		}
	}
	return true
}

// scanFraction reads the digits of a fraction of a second, at least one,
// rounded to microseconds as PostgreSQL rounds them (fracMicros).
func (d *dateTimeText) scanFraction(p *dateTimeScanner) bool {
	start := p.i
	for p.digitAt(p.i) {
		p.i++
	}
	if p.i == start {
		return false
	}
	d.nsec = fracMicros(p.s[start-1:p.i]) * 1000
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

// scanEra reads an era, AD or BC in any case, after any whitespace, when
// it ends the text; after a letter (the zone Z) only after whitespace, as
// PostgreSQL reads "ZBC" as one word.
func (d *dateTimeText) scanEra(p *dateTimeScanner) {
	rest := strings.TrimLeft(p.s[p.i:], Space)
	if len(rest) != 2 {
		return
	}
	if len(rest) == len(p.s)-p.i && p.i > 0 && (p.s[p.i-1] == 'Z' || p.s[p.i-1] == 'z') {
		return // "ZBC": one word
	}
	switch strings.ToUpper(rest) {
	case "BC":
		d.year = 1 - d.year
		p.i = len(p.s)
	case "AD":
		p.i = len(p.s)
	}
}

// fieldsInRange reports whether d's fields are a calendar date and a time
// of day PostgreSQL takes: 24:00:00 exactly, and second 60 without a
// fraction.
func (d *dateTimeText) fieldsInRange() bool {
	return d.month >= 1 && d.month <= 12 && d.day >= 1 && d.day <= daysIn(d.year, d.month) &&
		d.hour <= 24 && d.minute <= 59 && d.second <= 60 &&
		(d.hour != 24 || d.minute == 0 && d.second == 0 && d.nsec == 0) && (d.second != 60 || d.nsec == 0)
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

// civil is d's date and time as a time.Time in UTC (its wall clock, the
// offset not applied).
func (d dateTimeText) civil() time.Time {
	return time.Date(d.year, time.Month(d.month), d.day, d.hour, d.minute, d.second, d.nsec, time.UTC)
}
