package backfill

import "github.com/pgbackfill/backfill/internal/pgstore"

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
	TimeInfinity    = pgstore.TimeInfinity
	TimeNegInfinity = pgstore.TimeNegInfinity
)
