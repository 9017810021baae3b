package pgconv

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
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
// Text PostgreSQL would read otherwise than written is refused: relative
// times ('now', 'today'), whose value depends on when the chunk is
// loaded; forms whose meaning depends on the session's DateStyle
// (01/02/2024) or timezone_abbreviations (EST); a timestamptz without an
// offset (read in the session's TimeZone); a zone on a timestamp without
// time zone, which PostgreSQL would silently ignore (write the wall clock,
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

const (
	reasonDateText        = "invalid date, want YYYY-MM-DD (four or more year digits, optional BC; a time after it is ignored), infinity or -infinity"
	reasonTimestampText   = "invalid timestamp, want YYYY-MM-DD HH:MM:SS[.ffffff] without zone (four or more year digits, optional BC), infinity or -infinity"
	reasonTimestamptzText = "invalid timestamptz, want RFC 3339 with a zone offset (a value without offset would be read in the session's TimeZone)"
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
	if d.zone {
		t = t.Add(-time.Duration(d.offset) * time.Second)
	}
	if t.Before(pgTimeMin) || !t.Before(timeEnd(col)) {
		return nil, timeRangeReason(col)
	}
	t = TruncMicro(t)
	if y := t.Year(); y < 1 || y > 9999 {
		return formatPGTime(col.BaseType, t), ""
	}
	switch col.BaseType {
	case "date":
		if len(s) == len("2006-01-02") && !d.epoch {
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
		d.hour, d.minute, d.second, d.nsec, d.zone = 0, 0, 0, 0, false
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
