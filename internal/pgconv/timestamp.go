package pgconv

import (
	"cmp"
	"fmt"
	"strconv"
	"time"
)

// convertTimestamp converts v for a date, timestamp or timestamptz
// column: a time.Time or text.
func convertTimestamp(col *Column, v, _ any) (any, string) {
	switch x := v.(type) {
	case time.Time:
		return convertTime(col, x)
	case string:
		return convertTimeText(col, x, v)
	}
	name := col.BaseType
	if name == "timestamptz" {
		name = "timestamp with time zone"
	}
	return nil, wrongType(v, name)
}

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
// as PostgreSQL reads it) or as the Go sentinels Infinity and
// NegInfinity; 'epoch' is 1970-01-01 00:00:00 UTC. Values outside
// the range are rejected with a reason naming the column and its range.
//
// Precision: PostgreSQL stores whole microseconds. Text with more
// fractional digits is rounded as PostgreSQL's input rounds it (half to
// even on the double it reads; '2024-12-31 23:59:59.9999999+00' is
// 2025-01-01 00:00:00+00), so that text is stored exactly as an INSERT
// of it would store it. A Go time.Time with nanoseconds is truncated
// toward the past instead (TruncMicro): a value just before a chunk's end
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
// (EST); a timestamptz without a zone (read in the session's TimeZone); a
// zone on a timestamp without time zone, which PostgreSQL would silently ignore (write the wall clock,
// or a time.Time, which is stored as its wall clock in Job.Zone). A date
// is the date as written: a time and zone after it are ignored, as
// PostgreSQL ignores them.

// Infinity and NegInfinity (the values of backfill.TimeInfinity and
// TimeNegInfinity) stand, in a date, timestamp or
// timestamptz column, for PostgreSQL's 'infinity' and '-infinity' (later
// and earlier than every other value). They are instants no column can
// hold otherwise (some 146 billion years from now or ago), compared with
// time.Time.Equal. They also suit lib/pq's pq.EnableInfinityTs, so that
// infinite source values read with lib/pq are written back as such.
var (
	Infinity    = time.Unix(1<<62, 0).UTC()
	NegInfinity = time.Unix(-1<<62, 0).UTC()
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
func timeRangeReason(col *Column) string {
	typ := cmp.Or(col.Type, col.BaseType)
	switch col.BaseType {
	case "date":
		return fmt.Sprintf("date out of range: %s column %q holds 4714-11-24 BC to 5874897-12-31 AD, and ±infinity", typ, col.Name)
	case "timestamptz":
		return fmt.Sprintf("timestamp out of range: %s column %q holds 4714-11-24 00:00:00+00 BC to 294276-12-31 23:59:59.999999+00 AD, and ±infinity", typ, col.Name)
	}
	return fmt.Sprintf("timestamp out of range: %s column %q holds 4714-11-24 00:00:00 BC to 294276-12-31 23:59:59.999999 AD, and ±infinity", typ, col.Name)
}

// timeEnd is the first instant after col's range.
func timeEnd(col *Column) time.Time {
	if col.BaseType == "date" {
		return pgDateEnd
	}
	return pgTimestampEnd
}

// infinity returns PostgreSQL's text for t when t is one of the
// sentinels.
func infinity(t time.Time) (string, bool) {
	switch {
	case t.Equal(Infinity):
		return "infinity", true
	case t.Equal(NegInfinity):
		return "-infinity", true
	}
	return "", false
}

// convertTime converts a time.Time for a date, timestamp or timestamptz
// column: its civil date (date), its wall clock in its own location
// (timestamp) or its instant in UTC (timestamptz), truncated to
// microseconds. Years 1 to 9999 take the fast path of time.Format.
func convertTime(col *Column, x time.Time) (any, string) {
	x = TruncMicro(x)
	if col.BaseType == "timestamptz" {
		x = x.UTC()
	}
	if y := x.Year(); y >= 1 && y <= 9999 {
		// The common case, in the same form as below (time.Format's
		// layouts "2006-01-02", "2006-01-02 15:04:05.999999" and
		// RFC3339Nano in UTC print the same text, at several times the
		// cost).
		return formatPGTime(col.BaseType, x), ""
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
	// The date and the clock computed once each (t.Year, t.Month, t.Day,
	// t.Hour... each compute them again).
	y, mo, d := t.Date()
	bc := y < 1
	if bc {
		y = 1 - y
	}
	var buf [48]byte
	b := buf[:0]
	for n := 1000; n > 1 && y < n; n /= 10 {
		b = append(b, '0')
	}
	b = strconv.AppendInt(b, int64(y), 10)
	b = append(b, '-')
	b = append2(b, int(mo))
	b = append(b, '-')
	b = append2(b, d)
	if base != "date" {
		if base == "timestamptz" {
			b = append(b, 'T')
		} else {
			b = append(b, ' ')
		}
		h, mi, sec := t.Clock()
		b = append2(b, h)
		b = append(b, ':')
		b = append2(b, mi)
		b = append(b, ':')
		b = append2(b, sec)
		if us := t.Nanosecond() / 1000; us != 0 {
			// Six digits, without the trailing zeros.
			var frac [6]byte
			for i := 5; i >= 0; i-- {
				frac[i] = byte('0' + us%10)
				us /= 10
			}
			n := 6
			for frac[n-1] == '0' {
				n--
			}
			b = append(b, '.')
			b = append(b, frac[:n]...)
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
func convertTimeText(col *Column, s string, v any) (any, string) {
	d, ok := parseDateTime(s)
	switch {
	case d.badField:
		return nil, fmt.Sprintf("date/time field value out of range: %s column %q holds calendar dates of years 4714 BC (no year 0) and later, hours 00 to 24 (24:00:00 only), seconds 00 to 60",
			cmp.Or(col.Type, col.BaseType), col.Name)
	case d.inf > 0:
		return "infinity", ""
	case d.inf < 0:
		return "-infinity", ""
	}
	if reason := d.fitColumn(col, ok); reason != "" {
		return nil, reason
	}
	t := d.civil()
	switch {
	case d.zoneName != "":
		loc := loadZone(d.zoneName)
		if loc == nil {
			return nil, fmt.Sprintf("unknown time zone %q: %s column %q takes IANA zone names of Go's time zone database (America/New_York) or offsets", d.zoneName, cmp.Or(col.Type, col.BaseType), col.Name)
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
	if y := t.Year(); y < 1 || y > 9999 {
		return formatPGTime(col.BaseType, t), ""
	}
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

// fitColumn says why text read as d (ok: it has the form) cannot be
// stored in col, "" when it can: a date takes any date/time text, whose
// time and zone it ignores (so d loses them); a timestamp takes no zone;
// a timestamptz needs one (or epoch).
func (d *dateTimeText) fitColumn(col *Column, ok bool) string {
	switch col.BaseType {
	case "date":
		if !ok {
			return reasonDateText
		}
		// The date as written: a time of day and a zone after it are
		// ignored, as PostgreSQL's date input ignores them (and as a
		// time.Time gives its civil date).
		d.hour, d.minute, d.second, d.nsec, d.zone, d.zoneName = 0, 0, 0, 0, false, ""
	case "timestamp":
		if !ok || d.zone {
			return reasonTimestampText
		}
	default:
		if !ok || !d.zone && !d.epoch {
			return reasonTimestamptzText
		}
	}
	return ""
}
