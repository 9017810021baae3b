package pgconv

import (
	"fmt"
	"strconv"
	"time"
)

// convertInterval converts v for an interval column: a time.Duration or
// text.
func convertInterval(col *Column, v, src any) (any, string) {
	if d, ok := src.(time.Duration); ok {
		return formatInterval(d), ""
	}
	if s, ok := textOf(v, src); ok {
		return textValue(s)
	}
	return nil, fmt.Sprintf("Go type %T is not supported for column type %s; write time.Duration or text", src, typeName(col, col.BaseType))
}

// formatInterval renders d as interval input: whole microseconds,
// PostgreSQL's precision, truncated toward the past like TruncMicro (so
// that t + d, truncated, is t + the stored interval for a stored t).
func formatInterval(d time.Duration) string {
	us := int64(d / time.Microsecond)
	if d%time.Microsecond < 0 {
		us--
	}
	return strconv.FormatInt(us, 10) + " microseconds"
}
