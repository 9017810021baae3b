package backfill

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// The run report: everything the manifest knows about one run, gathered
// for a person (contrib/report renders it as one HTML file) or a machine
// (its JSON form, the "JSON twin" of that file). It is read from the
// manifest alone, so it needs neither the job's code nor the process that
// ran it: any machine with the database's URL can produce it.

// RunReport is the report of one run: its plan, every chunk with its
// timing and counts, the throughput over time, the distribution of chunk
// durations, where the run's time went (working, throttled, paused), the
// waits of its chunks, its exceptions, its validation evidence and its
// audit trail. [LoadRunReport] reads it from a [PGManifest]. Its JSON
// form (the json tags) is stable: fields are added, never renamed. Times
// are UTC, durations are seconds (fields named *_seconds), rates rows per
// second.
type RunReport = pgstore.RunReport

// ReportPlan is the plan summary of a [RunReport].
type ReportPlan = pgstore.ReportPlan

// ReportTotals sums the chunks of a [RunReport].
type ReportTotals = pgstore.ReportTotals

// ReportChunk is one chunk of a [RunReport].
type ReportChunk = pgstore.ReportChunk

// ReportWorker is one worker (one call of [Runner.Run]) of a run.
type ReportWorker = pgstore.ReportWorker

// ReportThroughput is the rows/s series of a [RunReport]: buckets of
// BucketSeconds from Start.
type ReportThroughput = pgstore.ReportThroughput

// ReportRate is one bucket of [ReportThroughput]: the rows read within
// [Start, Start+BucketSeconds) and their rate.
type ReportRate = pgstore.ReportRate

// ReportDurations is the distribution of chunk durations (seconds) of the
// chunks that have a start and a finish.
type ReportDurations = pgstore.ReportDurations

// ReportBin is one bin of a histogram: Count values in [From, To)
// seconds (the last bin includes To).
type ReportBin = pgstore.ReportBin

// ReportTime is the split of a run's time ([TimeSplit]) in seconds, with
// its throttle holds.
type ReportTime = pgstore.ReportTime

// ReportSpan is a span of time.
type ReportSpan = pgstore.ReportSpan

// ReportSignal sums the holds of one throttle signal. HeldSeconds adds
// every worker's holds (so it may exceed the run's throttled time, which
// counts each instant once).
type ReportSignal = pgstore.ReportSignal

// ReportThrottle is one hold of a throttle by one worker.
type ReportThrottle = pgstore.ReportThrottle

// ReportWaits summarises the waits ([Wait]) of a run's chunks.
type ReportWaits = pgstore.ReportWaits

// ReportExceptions summarises a run's exception queue.
type ReportExceptions = pgstore.ReportExceptions

// ReportExceptionGroup is the exceptions of one reason and column, with a
// few examples (the first recorded).
type ReportExceptionGroup = pgstore.ReportExceptionGroup

// ReportValidations is a run's validation evidence: a summary per check
// and the failed results.
type ReportValidations = pgstore.ReportValidations

// ReportCheck sums the results of one check over the run's chunks.
// Results of attempts a failed gate rolled back count in FailedAttempts
// only.
type ReportCheck = pgstore.ReportCheck

// LoadRunReport reads the report of run batchID from manifest m (whose
// tables db reaches): a handful of queries, whatever the number of
// chunks. It needs only the manifest, not the job's code. db may be a
// transaction; otherwise each part is read in a read-only transaction
// of its own, so the parts of a live run's report may be read moments
// apart. It returns an error wrapping [ErrRunNotFound] when there is no
// such run.
func LoadRunReport(ctx context.Context, db sqlx.ExtContext, m *PGManifest, batchID int64) (RunReport, error) {
	return pgstore.LoadRunReport(ctx, db, m, batchID)
}
