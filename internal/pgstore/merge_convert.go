package pgstore

import (
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgconv"
)

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

// ConvertValue converts v for col (see pgconv.Converter.Convert).
func ConvertValue(col backfilltype.Column, v any) (any, string) {
	return pgconv.Convert(col.Conv(), v)
}

// TruncMicro truncates t to whole microseconds, PostgreSQL's precision
// (see pgconv.TruncMicro).
func TruncMicro(t time.Time) time.Time {
	return pgconv.TruncMicro(t)
}
