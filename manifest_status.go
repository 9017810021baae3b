package backfill

import "github.com/pgbackfill/backfill/backfilltype"

// Progress of a run from the manifest: [PGManifest.Status],
// [Runner.Status] and the run_progress and chunks_in_flight views,
// readable from any process and from psql.

// Status is a run's progress as the manifest records it, readable from
// any process ([PGManifest.Status], [Runner.Status]; the run_progress
// view in SQL). Seconds are float64 seconds of the server's clock; rates
// are rows per second. Fields a run cannot give yet (a rate before the
// first checkpoint) are nil.
type Status = backfilltype.Status
