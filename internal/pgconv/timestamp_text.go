package pgconv

import (
	"strings"
	"time"
)

// dateTimeText is date/time text as parseDateTime reads it.
type dateTimeText struct {
	year, month, day     int // year astronomical: 0 is 1 BC
	hour, minute, second int
	nsec                 int
	clock, zone          bool // a time of day, a zone offset
	offset               int  // seconds east of UTC
	inf                  int  // +1 'infinity', -1 '-infinity' (no other field set)
	epoch                bool // 'epoch': 1970-01-01 00:00:00 UTC
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
// PostgreSQL's limit). Fractions beyond nanoseconds are truncated. A time
// may be 24:00:00 (the next midnight) and a second 60 (the next minute),
// as PostgreSQL allows. ok is false for anything else.
func parseDateTime(s string) (d dateTimeText, ok bool) {
	if s == "" || strings.IndexByte(Space, s[0]) >= 0 || strings.IndexByte(Space, s[len(s)-1]) >= 0 {
		s = strings.Trim(s, Space)
	}
	if len(s) < 10 {
		if d, ok := specialDateTime(s); ok {
			return d, true
		}
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
// after at most one space.
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
	return true
}

// scanFraction reads the digits of a fraction of a second, truncated to
// nanoseconds; at least one.
func (d *dateTimeText) scanFraction(p *dateTimeScanner) bool {
	start := p.i
	for ; p.digitAt(p.i); p.i++ {
		if p.i-start < 9 {
			d.nsec = d.nsec*10 + int(p.s[p.i]-'0')
		}
	}
	for n := p.i - start; n < 9; n++ {
		d.nsec *= 10
	}
	return p.i > start
}

// scanEra reads an era, AD or BC in any case, after any whitespace, when
// it ends the text.
func (d *dateTimeText) scanEra(p *dateTimeScanner) {
	rest := strings.TrimLeft(p.s[p.i:], Space)
	if len(rest) != 2 {
		return
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

// civil is d's date and time as a time.Time in UTC (its wall clock, the
// offset not applied).
func (d dateTimeText) civil() time.Time {
	return time.Date(d.year, time.Month(d.month), d.day, d.hour, d.minute, d.second, d.nsec, time.UTC)
}
