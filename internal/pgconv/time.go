package pgconv

import (
	"fmt"
	"time"
)

// convertTimeOfDay converts v for a time or timetz column: a time.Time
// or text.
func convertTimeOfDay(col *Column, v, src any) (any, string) {
	if x, ok := v.(time.Time); ok {
		// The wall clock of x in its own location (as lib/pq reads a
		// time column: on 0000-01-01), with its offset for timetz.
		if col.BaseType == "time" {
			return TruncMicro(x).Format("15:04:05.999999"), ""
		}
		return TruncMicro(x).Format("15:04:05.999999-07:00:00"), ""
	}
	if s, ok := textOf(v, src); ok {
		return textValue(s)
	}
	return nil, fmt.Sprintf("Go type %T is not supported for column type %s; write time.Time or text", src, typeName(col, col.BaseType))
}

// TruncMicro truncates t to whole microseconds, PostgreSQL's precision
// (PostgreSQL docs, 8.5 "Date/Time Types"). The rule is truncation, toward
// the past, never rounding: a value just below a chunk's end stays in that
// chunk, and the chunk check and the stored value agree. Nanosecond
// sources are normalised this way; coarser sources (milliseconds,
// seconds) are exact.
func TruncMicro(t time.Time) time.Time {
	// The same as t.Truncate(time.Microsecond), without its division:
	// whole seconds are whole microseconds since the zero time, so the
	// nanoseconds below the microsecond are what truncation removes.
	t = t.Round(0) // drop the monotonic reading, as Truncate does
	if ns := t.Nanosecond() % 1000; ns != 0 {
		t = t.Add(-time.Duration(ns))
	}
	return t
}
