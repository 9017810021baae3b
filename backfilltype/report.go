package backfilltype

import (
	"time"
)

// RunReport is the report of one run: its plan, its totals, its chunks
// in at most [ReportMaxBuckets] buckets in plan order (rows, rejects,
// durations, rates), the distribution of chunk durations, its notable
// chunks (the slowest, the failed, those with the most rejects, those in
// flight), where the run's time went (working, throttled, paused), the
// waits of its chunks, its exceptions, its validation evidence and its
// audit trail. [LoadRunReport] reads it from a [Manifest] in a bounded
// number of rows whatever the number of chunks or exceptions (a rollup
// kept with the chunks, migration 27). Its JSON form (the json tags) is
// stable: fields are added, never renamed (before 1.0, version 0.x
// replaced the list of every chunk, "chunks", and the rows/s over time,
// "throughput", by "buckets", "notable_chunks" and "chunk_workers").
// Times are UTC, durations are seconds (fields named *_seconds), rates
// rows per second.
type RunReport struct {
	// GeneratedAt is when the report was read (the server's clock).
	GeneratedAt time.Time `json:"generated_at"`
	// Schema is the manifest's schema.
	Schema string `json:"schema"`
	// Plan is the run's plan and who started it.
	Plan ReportPlan `json:"plan"`
	// Totals sums the chunks: the same counts as the run's status.
	Totals ReportTotals `json:"totals"`
	// Buckets are every chunk of the run in at most [ReportMaxBuckets]
	// buckets of consecutive chunks, in plan order.
	Buckets ReportBuckets `json:"buckets"`
	// Notable are a bounded selection of chunks worth a look, in plan
	// (Seq) order, each with why ([ReportChunk.Notable]).
	Notable []ReportChunk `json:"notable_chunks"`
	// ChunkWorkers sums the chunks by the worker that completed them
	// (the busiest first; "" for the chunks no worker completed).
	ChunkWorkers []ReportChunkWorker `json:"chunk_workers"`
	// Workers are the processes (calls of backfill.Runner.Run) that worked on
	// the run, in the order they started.
	Workers []ReportWorker `json:"workers"`
	// Durations is the distribution of the timed chunks' durations, with
	// a histogram of bins in a geometric progression.
	Durations ReportDurations `json:"chunk_durations"`
	// Time is how the run's time split into working, throttled and paused.
	Time ReportTime `json:"time"`
	// Waits are the tries of chunks that waited on a lock or a timeout
	// and were retried.
	Waits ReportWaits `json:"waits"`
	// Exceptions are the rows not loaded, by reason and column.
	Exceptions ReportExceptions `json:"exceptions"`
	// Validations is the validation evidence.
	Validations ReportValidations `json:"validations"`
	// Events is the run's audit trail, in order: every event, or when
	// there are more than [ReportMaxEvents], the first and the last
	// ReportMaxEvents/2, and EventsOmitted is true (the events between
	// them are in the manifest: backfill events).
	Events        []Event `json:"events"`
	EventsOmitted bool    `json:"events_omitted,omitempty"`
	// Forecast compares the run with the forecast of the latest
	// rehearsal of its plan before it (nil for none), as [Status.Forecast].
	Forecast *ForecastCheck `json:"forecast,omitempty"`
	// Graph is, for the run of a graph of modules (backfill.Runner.RunGraph),
	// the progress of each of its modules, as backfill.Runner.GraphStatus
	// reads it (nil for a job's run).
	Graph *GraphStatus `json:"graph,omitempty"`
}

// Report limits: how much of a run a [RunReport] lists. Its counts and
// sums always cover everything.
const (
	// ReportMaxBuckets is the most buckets of [ReportBuckets]: the
	// chunks per bucket are the smallest power of two that gives at most
	// this many.
	ReportMaxBuckets = 512
	// ReportNotableSlowest is how many of the slowest chunks (the
	// longest FinishedAt - StartedAt) [RunReport.Notable] lists.
	ReportNotableSlowest = 10
	// ReportNotableRejects is how many of the chunks with the most
	// rejected rows it lists.
	ReportNotableRejects = 10
	// ReportNotableFailed is how many failed chunks it lists, the first
	// in plan order.
	ReportNotableFailed = 100
	// ReportNotableInFlight is how many chunks in flight (leased) it
	// lists, the first in plan order.
	ReportNotableInFlight = 100
	// ReportMaxEvents is how many events of the audit trail
	// [RunReport].Events lists at most: the first and the last half.
	ReportMaxEvents = 500
)

// ReportPlan is the plan summary of a [RunReport].
type ReportPlan struct {
	BatchID     int64  `json:"batch_id"`
	Job         string `json:"job"`
	Source      string `json:"source"`
	CodeVersion string `json:"code_version"`
	Fingerprint string `json:"fingerprint"`
	// Scope is the plan's description of its scope; ScopeLower and
	// ScopeUpper are the bounds of its first and last chunk.
	Scope      string `json:"scope"`
	ScopeLower string `json:"scope_lower"`
	ScopeUpper string `json:"scope_upper"`
	// ChunkKind is the kind of the chunks ("time", "int", "list").
	ChunkKind   string     `json:"chunk_kind"`
	ChunksTotal int        `json:"chunks_total"`
	Target      PlanTarget `json:"target"`
	// Rollback is the rollback mechanism decided before writing.
	Rollback RollbackMechanism `json:"rollback"`
	Publish  string            `json:"publish"`
	Time     *PlanTime         `json:"time,omitempty"`
	Status   RunStatus         `json:"status"`
	// StartedBy is the worker or person who created the run.
	StartedBy  string     `json:"started_by"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	LastError  string     `json:"last_error,omitempty"`
	Watermark  *time.Time `json:"watermark,omitempty"`
	// Calls counts the calls that started or resumed the run.
	Calls int `json:"calls"`
}

// ReportTotals sums the chunks of a [RunReport]: its chunk and row
// counts are those of the run's status (backfill.Status).
type ReportTotals struct {
	// ChunksByStatus counts the chunks by [ChunkStatus].
	ChunksByStatus map[string]int `json:"chunks_by_status"`
	// ChunksSkipped counts the done chunks whose staging and merge were
	// skipped, their rows unchanged (backfill.Job.SkipUnchanged,
	// [ReportChunk.Skipped]); they are among the done ones.
	ChunksSkipped int `json:"chunks_skipped"`
	// Rows sums the counts of the checkpointed chunks (done or open), as
	// the status does.
	Rows Counts `json:"rows"`
	// Attempts sums the chunks' attempts.
	Attempts int `json:"attempts"`
	// Workers is how many distinct workers completed chunks.
	Workers int `json:"workers"`
	// TimedChunks counts the chunks with a start and a finish;
	// BusySeconds sums their durations (FinishedAt - StartedAt).
	TimedChunks int     `json:"timed_chunks"`
	BusySeconds float64 `json:"busy_seconds"`
	// RowsPerSecond is Rows.Read over the run's working time
	// ([ReportTime].WorkingSeconds; 0 before any).
	RowsPerSecond float64 `json:"rows_per_second"`
}

// ReportBuckets are the chunks of a run in buckets of ChunksPerBucket
// consecutive chunks in plan order (a power of two; the last bucket
// may be shorter), the empty buckets left out. Every chunk of the run
// counts in one bucket: the buckets' Chunks add up to the run's chunks,
// their Rows to [ReportTotals].Rows.
type ReportBuckets struct {
	ChunksPerBucket int            `json:"chunks_per_bucket"`
	Buckets         []ReportBucket `json:"buckets"`
}

// ReportBucket is one bucket of [ReportBuckets]: the chunks of Seq
// FirstSeq to LastSeq (the chunks' bounds are in the manifest: backfill
// chunks).
type ReportBucket struct {
	FirstSeq int `json:"first_seq"`
	LastSeq  int `json:"last_seq"`
	// Chunks counts the bucket's chunks, ChunksByStatus by
	// [ChunkStatus].
	Chunks         int            `json:"chunks"`
	ChunksByStatus map[string]int `json:"chunks_by_status"`
	Attempts       int            `json:"attempts"`
	// Rows sums the counts of its checkpointed chunks (done or open).
	Rows Counts `json:"rows"`
	// TimedChunks counts its chunks with a start and a finish,
	// BusySeconds sums their durations, MeanSeconds is their mean (0
	// when none).
	TimedChunks int     `json:"timed_chunks"`
	BusySeconds float64 `json:"busy_seconds"`
	MeanSeconds float64 `json:"mean_seconds"`
	// RowsPerSecond is the rows read by its timed chunks over
	// BusySeconds: the rate of one chunk at a time (0 when none).
	RowsPerSecond float64 `json:"rows_per_second"`
}

// ReportChunkWorker sums the chunks that one worker completed
// (backfill.Config.WorkerID; "" for chunks not completed).
type ReportChunkWorker struct {
	Worker string `json:"worker"`
	Chunks int    `json:"chunks"`
	// Rows sums the counts of its checkpointed chunks (done or open).
	Rows Counts `json:"rows"`
	// BusySeconds sums the durations of its timed chunks.
	BusySeconds float64 `json:"busy_seconds"`
}

// ReportChunk is one notable chunk of a [RunReport].
type ReportChunk struct {
	Seq   int    `json:"seq"`
	ID    string `json:"id"`
	Lower string `json:"lower"`
	Upper string `json:"upper"`
	// Status is the chunk's [ChunkStatus] (or "staged",
	// "rolled_back").
	Status   string `json:"status"`
	Attempts int    `json:"attempts"`
	// Worker is the backfill.Config.WorkerID that completed it ("" if none).
	Worker string `json:"worker"`
	// StartedAt and FinishedAt are the worker's clock (the times the
	// library recorded at the chunk's start and end), unlike the
	// server-clock times of the run, its events and its throttle holds.
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// DurationSeconds is FinishedAt - StartedAt (0 when either is unset).
	DurationSeconds float64 `json:"duration_seconds"`
	Counts          Counts  `json:"counts"`
	LastError       string  `json:"last_error,omitempty"`
	// Skipped is true when the chunk's latest checkpoint skipped its
	// staging and merge, its rows unchanged since the load it was compared
	// with (backfill.Job.SkipUnchanged, [ChunkState.Skipped]).
	Skipped bool `json:"skipped"`
	// InFlight is true when a worker holds the chunk's lease.
	InFlight bool `json:"in_flight,omitempty"`
	// Notable says why the chunk is listed, one or more of "slowest"
	// (among the [ReportNotableSlowest] longest), "most_rejects" (among
	// the [ReportNotableRejects] with the most rejected rows), "failed",
	// "in_flight".
	Notable []string `json:"notable"`
}

// ReportWorker is one worker (one call of backfill.Runner.Run) of a run.
type ReportWorker struct {
	WorkerID    string     `db:"worker_id" json:"worker_id"`
	Host        string     `db:"host" json:"host"`
	PID         int        `db:"pid" json:"pid"`
	State       string     `db:"state" json:"state"`
	StartedAt   time.Time  `db:"started_at" json:"started_at"`
	HeartbeatAt time.Time  `db:"heartbeat_at" json:"heartbeat_at"`
	FinishedAt  *time.Time `db:"finished_at" json:"finished_at,omitempty"`
}

// ReportDurations is the distribution of chunk durations (seconds) of the
// chunks that have a start and a finish. Count, Min, Max and Mean are
// exact; the percentiles are read from the histogram: the upper bound of
// the bin that holds them (at most Max), within 19% above the exact
// value (or 1 ms).
type ReportDurations struct {
	Count int     `json:"count"`
	Min   float64 `json:"min_seconds"`
	Mean  float64 `json:"mean_seconds"`
	P50   float64 `json:"p50_seconds"`
	P90   float64 `json:"p90_seconds"`
	P99   float64 `json:"p99_seconds"`
	Max   float64 `json:"max_seconds"`
	// Bins is the histogram: bins of durations from 2^(k/4) ms to
	// 2^((k+1)/4) ms (the first from 0), the empty ones left out, in
	// order.
	Bins []ReportBin `json:"bins"`
}

// ReportBin is one bin of a histogram: Count values in [From, To)
// seconds (the last bin includes To).
type ReportBin struct {
	From  float64 `json:"from_seconds"`
	To    float64 `json:"to_seconds"`
	Count int     `json:"count"`
}

// ReportTime is the split of a run's time ([TimeSplit]: the same as the
// status's, [StatusTime]) in seconds, with its throttle holds.
// TotalSeconds = WorkingSeconds + PausedSeconds + IdleSeconds + the sum
// of ThrottledSeconds (by signal).
type ReportTime struct {
	Start          time.Time `json:"start"`
	End            time.Time `json:"end"`
	TotalSeconds   float64   `json:"total_seconds"`
	WorkingSeconds float64   `json:"working_seconds"`
	PausedSeconds  float64   `json:"paused_seconds"`
	// IdleSeconds is the time no worker of the run was alive (between
	// calls of Run, a dead run, a cancelled run until it was resumed).
	IdleSeconds      float64            `json:"idle_seconds"`
	ThrottledSeconds map[string]float64 `json:"throttled_seconds"`
	// Paused are the spans the run was paused (from each "run_paused"
	// event to the run's next event of another "run_..." kind, or End).
	Paused []ReportSpan `json:"paused"`
	// Signals sums the throttle holds per signal, by name.
	Signals []ReportSignal `json:"signals"`
	// Periods are the first throttle holds, in the order they started;
	// PeriodsTotal counts them all.
	Periods      []ReportThrottle `json:"periods"`
	PeriodsTotal int              `json:"periods_total"`
}

// ReportSpan is a span of time.
type ReportSpan struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}

// ReportSignal sums the holds of one throttle signal. HeldSeconds adds
// every worker's holds (so it may exceed the run's throttled time, which
// counts each instant once).
type ReportSignal struct {
	Signal      string  `json:"signal"`
	Holds       int     `json:"holds"`
	HeldSeconds float64 `json:"held_seconds"`
	MaxValue    float64 `json:"max_value"`
}

// ReportThrottle is one hold of a throttle by one worker.
type ReportThrottle struct {
	Signal    string    `json:"signal"`
	Reason    string    `json:"reason"`
	Value     float64   `json:"value"`
	High      float64   `json:"high"`
	Low       float64   `json:"low"`
	StartedAt time.Time `json:"started_at"`
	// EndedAt is the recorded end, or the end assumed for a hold still
	// open ([ThrottlePeriod].Ended); Open reports the latter.
	EndedAt time.Time `json:"ended_at"`
	Open    bool      `json:"open,omitempty"`
}

// ReportWaits summarises the waits ([Wait]) of a run's chunks.
type ReportWaits struct {
	Total         int     `json:"total"`
	WaitedSeconds float64 `json:"waited_seconds"`
	// Final counts the waits that ended their attempt as failed.
	Final int `json:"final"`
	// BySQLState counts the waits by SQLSTATE.
	BySQLState map[string]int `json:"by_sqlstate"`
	// Longest are the longest waits, with the sessions that blocked them,
	// in [Wait]'s own JSON form (its waited and sleep are
	// nanoseconds).
	Longest []Wait `json:"longest"`
}

// ReportExceptions summarises a run's exception queue.
type ReportExceptions struct {
	// Total counts the rows in the queue; FailedAttempts the rows kept as
	// evidence of attempts a failed quality gate rolled back.
	Total          int64 `db:"total" json:"total"`
	FailedAttempts int64 `db:"failed_attempts" json:"failed_attempts"`
	// Groups are the (reason, column) groups, the largest first (at most
	// 100); GroupsTotal counts them all.
	Groups      []ReportExceptionGroup `db:"-" json:"groups"`
	GroupsTotal int                    `db:"groups_total" json:"groups_total"`
}

// ReportExceptionGroup is the exceptions of one reason and column, with a
// few examples (the first recorded).
type ReportExceptionGroup struct {
	Reason   string      `json:"reason"`
	Column   string      `json:"column"`
	Count    int64       `json:"count"`
	Examples []Exception `json:"examples"`
}

// ReportValidations is a run's validation evidence: a summary per check
// and the failed results.
type ReportValidations struct {
	Checks []ReportCheck `json:"checks"`
	// Failures are the first failed results (at most 100), including
	// those of rolled back attempts and accepted ones; FailuresTotal
	// counts them all.
	Failures      []Validation `json:"failures"`
	FailuresTotal int          `json:"failures_total"`
}

// ReportCheck sums the results of one check over the run's chunks.
// Results of attempts a failed gate rolled back count in FailedAttempts
// only.
type ReportCheck struct {
	Check    string   `db:"check" json:"check"`
	Severity Severity `db:"severity" json:"severity"`
	Results  int      `db:"results" json:"results"`
	Passed   int      `db:"passed" json:"passed"`
	Failed   int      `db:"failed" json:"failed"`
	Accepted int      `db:"accepted" json:"accepted"`
	// FailedAttempts counts results of rolled back attempts.
	FailedAttempts int `db:"failed_attempts" json:"failed_attempts"`
}
