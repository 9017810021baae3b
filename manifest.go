package backfill

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jmoiron/sqlx"
)

// RunStatus is the state of a run (one batch) in the manifest.
type RunStatus string

const (
	// RunRunning: chunks remain to be done; running the job resumes it.
	RunRunning RunStatus = "running"
	// RunCompleted: every chunk is done.
	RunCompleted RunStatus = "completed"
	// RunFailed: a chunk failed for good; running the job again retries
	// the failed chunks and resumes.
	RunFailed RunStatus = "failed"
	// RunPaused: a quality gate failed, a throttle reached its critical
	// level, or an operator paused the run ([PGManifest.Pause], the SQL
	// function pause); nothing more is claimed (chunks in flight finish)
	// until [Runner.Resume] or the SQL function resume records who resumed
	// it and why.
	RunPaused RunStatus = "paused"
	// RunRolledBack: the run's changes were withdrawn by a rollback.
	RunRolledBack RunStatus = "rolled_back"
	// RunAbandoned: a newer run of the same job was started with
	// [Job.NewRun]; this run will not be resumed. Its completed chunks
	// stay in the target.
	RunAbandoned RunStatus = "abandoned"
	// RunCancelled: an operator cancelled the run ([PGManifest.Cancel],
	// the SQL function cancel): its chunks in flight rolled back (pending
	// again), its done chunks stay in the target. Terminal until resumed
	// explicitly ([Runner.Resume], the SQL function resume): [Runner.Run]
	// returns [ErrRunCancelled] and does not restart it; [Job.NewRun]
	// starts a new run beside it. [Runner.Rollback] can withdraw it.
	RunCancelled RunStatus = "cancelled"
)

// ChunkStatus is the state of one chunk of a run.
type ChunkStatus string

const (
	// ChunkPending: not yet completed (never tried, or a retryable attempt
	// failed, or its worker crashed). Claimable.
	ChunkPending ChunkStatus = "pending"
	// ChunkDone: merged and checkpointed; never extracted again by this run.
	ChunkDone ChunkStatus = "done"
	// ChunkFailed: the last attempt failed for good; reset to pending when
	// the run is resumed.
	ChunkFailed ChunkStatus = "failed"
	// ChunkOpen: merged and checkpointed, but not final: the chunk's end
	// lay after the run's horizon (the watermark of [Job.Watermark], or
	// the time the chunk was read), so rows of its interval may still
	// arrive in the source. It is not claimed again in the same call; the
	// next [Runner.Run] or [Runner.Resume] of the run sets it pending and
	// reads it again. Its counts and exceptions always describe the chunk
	// as it stands, not the sum of its reads: each read replaces the
	// exceptions of the one before, and its counts combine with the
	// chunk's as [Counts.Reread] says (Read is the latest read's; rows
	// an earlier read inserted or changed stay counted as such). A run
	// with an open chunk is not completed: [Runner.Run] returns
	// [ErrChunksOpen], and [Runner.Rollback] can withdraw it.
	ChunkOpen ChunkStatus = "open"
)

// Plan is a job frozen at the start of a run: scope, chunks, target and
// code version. Its Fingerprint (hex SHA-256 of the canonical JSON of every
// field but Chunks' Seq) decides whether a later call resumes the run.
type Plan struct {
	Job         string     `json:"job"`
	Source      string     `json:"source"`
	CodeVersion string     `json:"code_version"`
	Scope       string     `json:"scope"`
	Target      PlanTarget `json:"target"`
	// ChunkIDs lists the chunk IDs in order; the chunks themselves are
	// rows of the manifest. A plan frozen from a [ChunkStreamer] has none
	// (null in its JSON form, the runs.plan of [PGManifest]): its
	// fingerprint hashes its chunks' IDs as if they were listed here,
	// and the manifest's chunk rows list them.
	ChunkIDs []string `json:"chunk_ids"`
	// Publish is the job's publish mode and view ("" per chunk).
	Publish string `json:"publish,omitempty"`
	// Rollback is the job's rollback mechanism, decided before writing.
	Rollback RollbackMechanism `json:"rollback,omitempty"`
	// Time records the job's time declarations (omitted when none).
	Time *PlanTime `json:"time,omitempty"`
	// Chunks are the plan's chunks (not part of the JSON form). A plan a
	// Runner froze from a [ChunkStreamer] holds none, and no ChunkIDs
	// either (its fingerprint is the same): use [Plan.Len] and
	// [Plan.AllChunks].
	Chunks []Chunk `json:"-"`
	// Watermark is the source's high-water mark taken when the run was
	// created ([Job.Watermark]); not part of the fingerprint.
	Watermark *time.Time `json:"-"`
	// Fingerprint is set by [NewPlan].
	Fingerprint string `json:"-"`

	// stream gives the chunks of a plan frozen from a ChunkStreamer
	// (Chunks and ChunkIDs nil), n their number.
	stream ChunkStreamer
	n      int
}

// PlanTarget is the frozen description of a [Target]. Fields that do not
// apply to the mode are empty (and omitted from the JSON form, so plans of
// older versions keep their fingerprints).
type PlanTarget struct {
	Table      string          `json:"table"`
	Key        []string        `json:"key"`
	Columns    []string        `json:"columns"`
	Mode       Mode            `json:"mode"`
	Duplicates DuplicatePolicy `json:"duplicates"`
	Conflict   ConflictPolicy  `json:"conflict,omitempty"`
	Version    string          `json:"version,omitempty"`
	ValidFrom  string          `json:"valid_from,omitempty"`
	ValidTo    string          `json:"valid_to,omitempty"`
	Derive     []string        `json:"derive,omitempty"`
	HashColumn string          `json:"hash_column,omitempty"`
	InsertedBy string          `json:"inserted_by,omitempty"`
	UpdatedBy  string          `json:"updated_by,omitempty"`
}

// PlanTime is the frozen time declarations of a [Job].
type PlanTime struct {
	ChunkColumn string      `json:"chunk_column,omitempty"`
	Zone        string      `json:"zone,omitempty"`
	DateMeaning DateMeaning `json:"date_meaning,omitempty"`
	EventTime   string      `json:"event_time,omitempty"`
	ModifiedAt  string      `json:"modified_at,omitempty"`
	IngestedAt  string      `json:"ingested_at,omitempty"`
}

// Run is one run (one batch) as recorded in the manifest.
type Run struct {
	BatchID     int64           `db:"batch_id"`
	Job         string          `db:"job_name"`
	Source      string          `db:"source"`
	CodeVersion string          `db:"code_version"`
	Fingerprint string          `db:"plan_fingerprint"`
	Plan        json.RawMessage `db:"plan"`
	// ScopeLower and ScopeUpper are the bounds of the first and last chunk.
	ScopeLower  string     `db:"scope_lower"`
	ScopeUpper  string     `db:"scope_upper"`
	Status      RunStatus  `db:"status"`
	ChunksTotal int        `db:"chunks_total"`
	Worker      string     `db:"started_by"`
	CreatedAt   time.Time  `db:"created_at"`
	FinishedAt  *time.Time `db:"finished_at"`
	LastError   string     `db:"last_error"`
	// Watermark is the source's high-water mark recorded at creation, if
	// the job has a [Job.Watermark].
	Watermark *time.Time `db:"watermark"`
}

// ChunkState is one chunk of a run as recorded in the manifest.
type ChunkState struct {
	BatchID int64
	Chunk   Chunk
	Status  ChunkStatus
	// Attempts counts failed attempts recorded with FailChunk, plus the
	// completing one for done chunks. An attempt cut short by a crash
	// leaves no trace (its transaction never committed).
	Attempts int
	Counts
	StartedAt  *time.Time
	FinishedAt *time.Time
	LastError  string
	// Worker is the [Config.WorkerID] that completed the chunk.
	Worker string
	// Skipped is true when the chunk's latest checkpoint skipped its
	// staging and merge, its rows unchanged since the load it compared
	// with ([Job.SkipUnchanged], [ChunkResult.Skipped]).
	Skipped bool
}

// Exception is one row of the exception queue: a row that was not loaded,
// with the reason.
type Exception struct {
	BatchID int64  `db:"batch_id" json:"batch_id"`
	ChunkID string `db:"chunk_id" json:"chunk_id"`
	// Row is the 1-based row number within the chunk, in extraction order.
	Row int64 `db:"row_number" json:"row"`
	// Raw is the row as JSON: an object of column name to value for rows
	// given to Write, the extractor's value for rows given to Reject.
	Raw json.RawMessage `db:"raw" json:"raw"`
	// Column names the offending column ("" if none).
	Column string `db:"column_name" json:"column"`
	// Value is the offending value as text.
	Value string `db:"value" json:"value"`
	// Reason says why the row was not loaded.
	Reason string `db:"reason" json:"reason"`
	// FailedAttempt is 0 for the exception queue, and the attempt number
	// for a row of a chunk attempt that a failed quality gate rolled back:
	// such rows are evidence ([ManifestGates.FailedAttemptExceptions]),
	// not part of the queue, since the chunk is read again.
	FailedAttempt int       `db:"failed_attempt" json:"failed_attempt,omitempty"`
	CreatedAt     time.Time `db:"created_at" json:"created_at"`
}

// Manifest is the durable ledger of runs, chunks and the exception queue.
//
// Every method takes the executor to use: the Runner passes the chunk's
// transaction to ClaimChunk and CompleteChunk so that the checkpoint
// commits, or rolls back, with the merge. Implementations must be safe for
// concurrent use by several goroutines and several processes.
// [PGManifest] is the PostgreSQL implementation; backfilltest.Manifest the
// in-memory fake; backfilltest.TestManifest the conformance suite.
type Manifest interface {
	// Init creates or upgrades the manifest's storage. Idempotent and safe
	// to call concurrently.
	Init(ctx context.Context, db sqlx.ExtContext) error
	// StartRun finds the run of plan.Job to continue or creates a new one.
	// An incomplete (running or failed) run with the same fingerprint is
	// resumed (its failed and open chunks become pending again) and
	// resumed is true.
	// A completed run with the same fingerprint is returned as it is,
	// resumed true, unless newRun. An incomplete run with another
	// fingerprint gives [ErrPlanChanged] naming the changed fields, unless
	// newRun, which marks it abandoned and creates a new run.
	StartRun(ctx context.Context, db sqlx.ExtContext, plan Plan, worker string, newRun bool) (run Run, resumed bool, err error)
	// ClaimChunk locks the lowest-Seq pending chunk of the batch (or open
	// chunk left open by an earlier call of the run, see [ChunkOpen]) that
	// no other transaction holds (FOR UPDATE SKIP LOCKED) and returns it; ok is
	// false when none is left or the run is not running (abandoned,
	// completed, failed, paused): a worker of an abandoned run stops.
	// The run's row is not locked: the run may change status while a
	// claimed chunk is in flight; the checkpoint (CompleteChunk) refuses a
	// chunk of a run abandoned or rolled back meanwhile, and whoever
	// abandons or rolls back a run waits for its chunks in flight. The lock lasts until tx ends: it is the
	// chunk's lease, released by commit, rollback or the death of the
	// connection, so a crashed worker never blocks a resume.
	ClaimChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64) (c ChunkState, ok bool, err error)
	// CompleteChunk marks a claimed chunk done (or [ChunkOpen] when r.Open)
	// with its counts and whether it was skipped (r.Skipped, then
	// [ChunkState.Skipped]) and appends its exceptions, in tx. A chunk read
	// before and still open replaces its exceptions with these and
	// combines its counts with r's by [Counts.Reread], in tx.
	// It returns an error wrapping [ErrAccounting] if r does not balance.
	CompleteChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, r ChunkResult, exceptions []Exception) error
	// FailChunk records a failed attempt outside the chunk's (rolled back)
	// transaction; final marks the chunk failed, otherwise it stays pending.
	// An open chunk stays open (it holds rows of its earlier reads).
	FailChunk(ctx context.Context, db sqlx.ExtContext, batchID int64, seq int, msg string, final bool) error
	// FinishRun sets the run's status to completed when every chunk is
	// done (an open chunk is not), or to failed with msg when failed is true; otherwise it leaves
	// the run running. It returns the resulting run.
	FinishRun(ctx context.Context, db sqlx.ExtContext, batchID int64, failed bool, msg string) (Run, error)
	// Chunks returns the batch's chunks in Seq order.
	Chunks(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]ChunkState, error)
	// Exceptions returns the batch's exception queue in (chunk Seq, Row) order.
	Exceptions(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]Exception, error)
}

// Event is one entry of the manifest's audit log: run starts, resumes,
// completions, handoffs, operator decisions (pause, resume, approve,
// rollback) with who and why. Entries are appended, never changed.
type Event struct {
	ID      int64  `db:"id" json:"id"`
	BatchID int64  `db:"batch_id" json:"batch_id"`
	Job     string `db:"job_name" json:"job"`
	// Kind names what happened: "run_started", "run_resumed",
	// "run_abandoned", "run_completed", "run_failed", "handoff", ...
	Kind string `db:"kind" json:"kind"`
	// Actor is who did it: a worker ID or an operator's name.
	Actor string `db:"actor" json:"actor"`
	// Detail is a JSON object with the event's data (reason, counts, ...).
	Detail    json.RawMessage `db:"detail" json:"detail"`
	CreatedAt time.Time       `db:"created_at" json:"created_at"`
}

// ManifestAudit is implemented by manifests that keep an audit log and
// look runs up by job name; [PGManifest] and backfilltest.Manifest do.
// Features that record operator decisions ([Runner.Handoff]) need it and
// return [ErrUnsupported] without it.
type ManifestAudit interface {
	// RecordEvent appends e (ID and CreatedAt are set by the manifest). It
	// joins db's transaction when db is one.
	RecordEvent(ctx context.Context, db sqlx.ExtContext, e Event) error
	// Events returns the events of batchID in order.
	Events(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]Event, error)
	// LatestRun returns the newest run of job with one of the statuses
	// (any status when none is given), or [ErrRunNotFound].
	LatestRun(ctx context.Context, db sqlx.ExtContext, job string, statuses ...RunStatus) (Run, error)
}
