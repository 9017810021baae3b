package backfilltype

import (
	"fmt"
	"strings"
	"time"
)

// Rehearsal is a rehearsal of a job (backfill.Runner.Rehearse): a sample
// of its plan's chunks run on the chunk path in transactions that rolled
// back, what each took, and the projection of the full run, as the
// manifest records it.
type Rehearsal struct {
	// ID is the rehearsal's ID in the manifest (0 before it is recorded).
	ID          int64     `json:"id"`
	Job         string    `json:"job"`
	Fingerprint string    `json:"fingerprint"`
	CodeVersion string    `json:"code_version"`
	Worker      string    `json:"worker"`
	CreatedAt   time.Time `json:"created_at"`
	// ChunksTotal is the number of chunks of the plan.
	ChunksTotal int `json:"chunks_total"`
	// Chunks are the rehearsed chunks, in the order they ran.
	Chunks []RehearsalChunk `json:"chunks"`
	// Forecast projects the full run from them.
	Forecast RehearsalForecast `json:"forecast"`
}

// RehearsalPhases are the durations of a rehearsed chunk's phases, as a
// tracer sees them (backfilltrace.Phase): the extraction into the spool,
// the transaction's start and staging, the merge (with the undo log), the
// validators and the checkpoint. The commit is not rehearsed (the
// transaction rolls back; the forecast adds it: RehearsalForecast.Overhead),
// nor the creation of the run that holds the chunk's checkpoint
// (RehearsalChunk.RunStart).
type RehearsalPhases struct {
	Extract    time.Duration `json:"extract"`
	Stage      time.Duration `json:"stage"`
	Merge      time.Duration `json:"merge"`
	Validate   time.Duration `json:"validate"`
	Checkpoint time.Duration `json:"checkpoint"`
}

// Total is the sum of the phases.
func (p RehearsalPhases) Total() time.Duration {
	return p.Extract + p.Stage + p.Merge + p.Validate + p.Checkpoint
}

// RehearsalLock is a group of the locks a rehearsed chunk's transaction
// held just before its rollback (pg_locks of its backend): the lock's
// type, its relation ("" for none), mode, and how many such locks.
type RehearsalLock struct {
	LockType string `json:"locktype"`
	Relation string `json:"relation,omitempty"`
	Mode     string `json:"mode"`
	Count    int    `json:"count"`
}

// RehearsalChunk is what one rehearsed chunk took. Sizes are bytes;
// growth is measured inside the chunk's transaction before its rollback.
type RehearsalChunk struct {
	Chunk Chunk `json:"chunk"`
	// EstimatedRows is the chunk's estimate (-1 without estimates).
	EstimatedRows int64 `json:"estimated_rows"`
	// Phases are the durations of its phases; Duration their sum.
	Phases   RehearsalPhases `json:"phases"`
	Duration time.Duration   `json:"duration"`
	// Concurrent and ConcurrentDuration are the same when the chunk was
	// rehearsed again beside others, as many at once as the forecast's
	// Concurrency (zero when it is 1 or one chunk was rehearsed): the
	// forecast's duration takes them, for the run's chunks contend so.
	// The other measures are of the chunk rehearsed alone.
	Concurrent         RehearsalPhases `json:"concurrent"`
	ConcurrentDuration time.Duration   `json:"concurrent_duration"`
	// Counts are its rows, as its checkpoint would have recorded them.
	Counts Counts `json:"counts"`
	// WALBytes is the WAL inserted from the transaction's start to just
	// before its rollback (pg_current_wal_insert_lsn: the server's, which
	// includes the WAL of other sessions meanwhile).
	WALBytes int64 `json:"wal_bytes"`
	// Locks are the locks its transaction held before its rollback;
	// LockWait the time its merge waited for the library's key locks
	// (waits that ended granted).
	Locks    []RehearsalLock `json:"locks"`
	LockWait time.Duration   `json:"lock_wait"`
	// TargetBytes and IndexBytes are the growth of the target's table
	// (pg_table_size: heap, TOAST, free space and visibility maps) and of
	// its indexes (pg_indexes_size); UndoBytes that of the undo log
	// (table and indexes; 0 without one).
	TargetBytes int64 `json:"target_bytes"`
	IndexBytes  int64 `json:"index_bytes"`
	UndoBytes   int64 `json:"undo_bytes"`
	// RunStart is the time the chunk's transaction took to create the run
	// that holds its checkpoint (the run's row and its chunks' rows, as a
	// run's start creates them): not counted in Phases.
	RunStart time.Duration `json:"run_start"`
	// RunStartWALBytes is the WAL inserted meanwhile (the server's).
	RunStartWALBytes int64 `json:"run_start_wal_bytes"`
	// TempBytes is the growth of the backend's temporary relations (the
	// chunk's staging table).
	//
	// Growth is of the relations' files: a rolled back chunk leaves its
	// pages (empty once vacuumed), so a chunk rehearsed after another
	// that fit in the pages it left shows none; chunks of many pages
	// measure what they add.
	TempBytes int64 `json:"temp_bytes"`
	// HeapBytes is the peak of the process's Go heap (live and unswept
	// objects, runtime/metrics) while the chunk ran, sampled every few
	// milliseconds; HeapBaseBytes the heap when it started.
	HeapBytes     int64 `json:"heap_bytes"`
	HeapBaseBytes int64 `json:"heap_base_bytes"`
}

// RehearsalForecast projects a full run from a rehearsal's chunks.
//
// With estimates (Basis "rows"), each rehearsed quantity y (duration, WAL,
// growth) is fitted as y = a + b·rows over the rehearsed chunks and
// summed over the plan's chunks at their estimated rows, scaled by the
// rehearsed chunks' rows read per estimated row. Bytes are fitted by
// least squares (through the origin when fewer than two distinct sizes
// or when a fit is negative); durations, from three chunks on, by the
// medians of Theil and Sen, so that one chunk that stalled widens
// DurationHigh without moving Duration. Without estimates (Basis
// "chunks"), a chunk takes the mean of the rehearsed ones (their median
// for the duration).
type RehearsalForecast struct {
	Basis string `json:"basis"`
	// Chunks is the number of chunks projected; Rows their rows.
	Chunks int   `json:"chunks"`
	Rows   int64 `json:"rows"`
	// Concurrency is the number of chunks assumed to run at once.
	Concurrency int `json:"concurrency"`
	// Duration is the run's projected wall time: the chunks' time
	// divided among Concurrency workers. DurationLow and DurationHigh
	// bound it: from the rehearsed chunks' least and most costly rate
	// relative to the fit (at least ±10%), the high end plus the longest
	// projected chunk (the last to finish may run alone). A chunk's time
	// is the one it took beside Concurrency-1 others
	// (RehearsalChunk.ConcurrentDuration) when it was rehearsed so. The
	// three include Overhead. Not rehearsed: a load on the machines that
	// changes between the rehearsal and the run.
	Duration     time.Duration `json:"duration"`
	DurationLow  time.Duration `json:"duration_low"`
	DurationHigh time.Duration `json:"duration_high"`
	// Overhead is what the run pays beyond its chunks' transactions,
	// which a rehearsal rolls back instead of committing: each chunk's
	// lease (a short transaction of its own) and commit, counted as two
	// CommitTime each, divided among the Concurrency workers; and the
	// run's start and end, counted as RunStart and two CommitTime.
	Overhead time.Duration `json:"overhead"`
	// CommitTime is the median time of a short transaction committed by
	// the rehearsal (BEGIN, SELECT txid_current(), COMMIT: three round
	// trips and a commit record, whose WAL a server with fsync and
	// synchronous_commit on flushes to disk before the COMMIT returns).
	CommitTime time.Duration `json:"commit_time"`
	// RunStart is the time a run's creation took (the least
	// RehearsalChunk.RunStart).
	RunStart time.Duration `json:"run_start"`
	// Durability is the server's fsync and synchronous_commit settings
	// at the rehearsal, e.g. "fsync=on synchronous_commit=on".
	Durability string `json:"durability,omitempty"`
	// WALBytes, TargetBytes, IndexBytes and UndoBytes are the projected
	// WAL volume and growth of the target's table, its indexes and the
	// undo log over the whole run.
	WALBytes    int64 `json:"wal_bytes"`
	TargetBytes int64 `json:"target_bytes"`
	IndexBytes  int64 `json:"index_bytes"`
	UndoBytes   int64 `json:"undo_bytes"`
	// HeapBytes is the projected peak Go heap: the least base heap of a
	// rehearsed chunk plus Concurrency times the largest growth of one, at
	// least the highest peak seen. The heap counts garbage not yet
	// collected: a bound to set a memory limit by, not a need.
	HeapBytes int64 `json:"heap_bytes"`
	// WarmExtract: each chunk's extraction was timed on a warm source
	// (backfill.RehearseOptions.WarmExtract).
	WarmExtract bool `json:"warm_extract,omitempty"`
}

// ForecastCheck compares a run with the forecast of the latest rehearsal
// of its job's plan before the run began (Status.Forecast).
type ForecastCheck struct {
	RehearsalID int64             `json:"rehearsal_id"`
	RehearsedAt time.Time         `json:"rehearsed_at"`
	Forecast    RehearsalForecast `json:"forecast"`
	// Duration is the run's elapsed time so far (created to as of), Rows
	// its rows read; Done whether the run completed (a comparison of a
	// run not completed is of its part).
	Duration time.Duration `json:"duration"`
	Rows     int64         `json:"rows"`
	Done     bool          `json:"done"`
	// WALBytes is the WAL the server inserted from the run's creation to
	// its completion, or to its latest chunk's checkpoint while it is not
	// completed: WAL positions (pg_current_wal_insert_lsn) the run records
	// in the transactions that create it, checkpoint each chunk and
	// complete it. It is the server's, as a rehearsal's measures are: it
	// includes the WAL of other sessions meanwhile (and, for a run
	// resumed after a while, of the time between). -1 when the run did
	// not record it (created before the manifest's migration 34).
	WALBytes int64 `json:"wal_bytes"`
	// TargetBytes and IndexBytes are the growth of the target's table
	// (pg_table_size) and of its indexes (pg_indexes_size), summed over
	// its partitions, from the run's creation to its completion, as the
	// run records them in those transactions. -1 before the run completed
	// or when it did not record them.
	TargetBytes int64 `json:"target_bytes"`
	IndexBytes  int64 `json:"index_bytes"`
}

// String is the comparison on one line, e.g. "rehearsal 3 (2026-01-02T03:04:05Z):
// duration 1m0s (forecast 55s, 50s-1m10s, within the forecast), rows 1000
// (forecast 980: -2%), WAL 5000000 B (forecast 5200000 B: +4%), ...": the
// forecast's distance from what the run took, in percent of the latter.
func (f ForecastCheck) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rehearsal %d (%s): duration %s (forecast %s, %s-%s, %s)", f.RehearsalID, f.RehearsedAt.UTC().Format(time.RFC3339),
		f.Duration.Round(time.Millisecond), f.Forecast.Duration.Round(time.Millisecond), f.Forecast.DurationLow.Round(time.Millisecond),
		f.Forecast.DurationHigh.Round(time.Millisecond), within(f.Duration, f.Forecast.DurationLow, f.Forecast.DurationHigh))
	fmt.Fprintf(&b, ", rows %d (forecast %d%s)", f.Rows, f.Forecast.Rows, off(f.Forecast.Rows, f.Rows))
	fmt.Fprintf(&b, ", WAL %s (forecast %d B%s)", measured(f.WALBytes, ""), f.Forecast.WALBytes, off(f.Forecast.WALBytes, f.WALBytes))
	fmt.Fprintf(&b, ", table %s (forecast +%d B%s)", measured(f.TargetBytes, "+"), f.Forecast.TargetBytes, off(f.Forecast.TargetBytes, f.TargetBytes))
	fmt.Fprintf(&b, ", indexes %s (forecast +%d B%s)", measured(f.IndexBytes, "+"), f.Forecast.IndexBytes, off(f.Forecast.IndexBytes, f.IndexBytes))
	fmt.Fprintf(&b, ", undo log forecast +%d B", f.Forecast.UndoBytes)
	if !f.Done {
		b.WriteString(" (run not completed)")
	}
	return b.String()
}

// measured is n bytes prefixed with sign, or "not recorded" for -1.
func measured(n int64, sign string) string {
	if n < 0 {
		return "not recorded"
	}
	return fmt.Sprintf("%s%d B", sign, n)
}

// off is how far forecast is from actual, as ": +12%" (nothing when
// actual is not recorded or 0).
func off(forecast, actual int64) string {
	if actual <= 0 {
		return ""
	}
	return fmt.Sprintf(": %+.1f%%", 100*(float64(forecast)-float64(actual))/float64(actual))
}

func within(d, lo, hi time.Duration) string {
	switch {
	case d < lo:
		return "faster than forecast"
	case d > hi:
		return "slower than forecast"
	default:
		return "within the forecast"
	}
}
