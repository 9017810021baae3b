package backfill

import (
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Progress of a run from the manifest (issue 14, "Progress from the
// manifest"): [PGManifest.Status], [Runner.Status] and the run_progress
// and chunks_in_flight views, readable from any process and from psql.

// StatusWindow describes the recent window of [Status.RecentRate]: the
// last StatusWindowSeconds of wall time or the last StatusWindowChunks
// checkpoints, whichever reaches further back; its rate is per second of
// working time within it.
const (
	StatusWindowSeconds = pgstore.StatusWindowSeconds
	StatusWindowChunks  = pgstore.StatusWindowChunks
)

// Status is a run's progress as the manifest records it, readable from
// any process ([PGManifest.Status], [Runner.Status]; the run_progress
// view in SQL). Seconds are float64 seconds of the server's clock; rates
// are rows per second. Fields a run cannot give yet (a rate before the
// first checkpoint) are nil.
type Status = backfilltype.Status

// StatusChunks counts a run's chunks by [ChunkStatus].
type StatusChunks = backfilltype.StatusChunks

// StatusTime splits a run's time in seconds: Total = Working + Throttled
// + Paused + Idle. Each instant counts once: paused (from a "run_paused"
// event to the run's next event of another "run_..." kind), else
// throttled (any worker's throttle held), else idle (no worker of the run
// was alive: between calls of Run, after a crash), else working. A run
// with no registered worker has no idle time.
type StatusTime = backfilltype.StatusTime

// ChunkInFlight is a chunk being worked (the chunks_in_flight view).
type ChunkInFlight = backfilltype.ChunkInFlight

// ExceptionCount is the number of rows of a run's exception queue with
// one reason and column.
type ExceptionCount = backfilltype.ExceptionCount
