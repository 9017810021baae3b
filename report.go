package backfill

import (
	"context"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// The run report: everything the manifest knows about one run, gathered
// for a person (contrib/report renders it as one HTML file) or a machine
// (its JSON form, the "JSON twin" of that file). It is read from the
// manifest alone, so it needs neither the job's code nor the process that
// ran it: any machine with the database's URL can produce it.

// RunReport is the report of one run: its plan, its totals (the counts
// of its status), its chunks in at most [backfilltype.ReportMaxBuckets] buckets in plan
// order (rows, rejects, durations, rates), the distribution of chunk
// durations, its notable chunks (the slowest, the failed, those with the
// most rejects, those in flight; at most the backfilltype.ReportNotable*
// limits), the chunks by worker, where the run's
// time went (working, throttled, paused), the waits of its chunks, its
// exceptions, its validation evidence and its audit trail.
// [LoadRunReport] reads it from a [PGManifest]. Its JSON form (the json
// tags) is stable: fields are added, never renamed. Times are UTC,
// durations are seconds (fields named *_seconds), rates rows per second.
type RunReport = backfilltype.RunReport

// LoadRunReport reads the report of run batchID from manifest m (whose
// tables db reaches): a handful of queries, each reading a bounded number
// of rows (rollups kept with the chunks and the exceptions, and indexes),
// whatever the number of chunks or exceptions. It needs only the manifest, not the job's code. db may be a
// transaction; otherwise each part is read in a read-only transaction
// of its own, so the parts of a live run's report may be read moments
// apart. It returns an error wrapping [ErrRunNotFound] when there is no
// such run.
func LoadRunReport(ctx context.Context, db sqlx.ExtContext, m *PGManifest, batchID int64) (RunReport, error) {
	return pgstore.LoadRunReport(ctx, db, m, batchID)
}
