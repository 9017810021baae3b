package backfill

import (
	"time"

	"github.com/pgbackfill/backfill/internal/pgconv"
)

// Values are converted for their columns by internal/pgconv, one
// converter per column resolved when the row writer is built (see
// newRowWriter); this file bridges the package's Column to it.

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

// conv is what value conversion needs of c.
func (c Column) conv() pgconv.Column {
	return pgconv.Column{Name: c.Name, Type: c.Type, BaseType: c.BaseType, MaxLen: c.MaxLen,
		Precision: c.Precision, Scale: c.Scale, NotNull: c.NotNull, Key: c.Key}
}

// convertValue converts v for col (see pgconv.Converter.Convert).
func convertValue(col Column, v any) (any, string) {
	return pgconv.Convert(col.conv(), v)
}

// truncMicro truncates t to whole microseconds, PostgreSQL's precision
// (see pgconv.TruncMicro).
func truncMicro(t time.Time) time.Time {
	return pgconv.TruncMicro(t)
}
