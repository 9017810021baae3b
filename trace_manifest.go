package backfill

import "github.com/pgbackfill/backfill/internal/pgstore"

// ChunkLeased is the status [PGManifest.JobChunks] gives a pending chunk
// whose lease a live worker holds: a chunk in flight (short
// transactions; see doc.go). It is not a status of the manifest's rows.
const ChunkLeased = pgstore.ChunkLeased

// JobChunks is the state of the latest run of a job, as metrics read it
// from the manifest ([PGManifest.JobChunks]): the same from any process.
type JobChunks = pgstore.JobChunks
