package backfilltype

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"iter"
	"slices"
	"time"
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
	// level, or an operator paused the run (backfill.PGManifest.Pause, the
	// SQL function pause); nothing more is claimed (chunks in flight
	// finish) until backfill.Runner.Resume or the SQL function resume
	// records who resumed it and why.
	RunPaused RunStatus = "paused"
	// RunRolledBack: the run's changes were withdrawn by a rollback.
	RunRolledBack RunStatus = "rolled_back"
	// RunAbandoned: a newer run of the same job was started with
	// backfill.Job.NewRun; this run will not be resumed. Its completed chunks
	// stay in the target.
	RunAbandoned RunStatus = "abandoned"
	// RunCancelled: an operator cancelled the run
	// (backfill.PGManifest.Cancel, the SQL function cancel): its chunks in
	// flight rolled back (pending again), its done chunks stay in the
	// target. Terminal until resumed explicitly (backfill.Runner.Resume,
	// the SQL function resume): backfill.Runner.Run returns
	// [ErrRunCancelled] and does not restart it; backfill.Job.NewRun starts
	// a new run beside it. backfill.Runner.Rollback can withdraw it.
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
	// lay after the run's horizon (the watermark of backfill.Job.Watermark,
	// or the time the chunk was read), so rows of its interval may still
	// arrive in the source. It is not claimed again in the same call; the
	// next backfill.Runner.Run or backfill.Runner.Resume of the run sets it
	// pending and reads it again. Its counts and exceptions always describe
	// the chunk as it stands, not the sum of its reads: each read replaces
	// the exceptions of the one before, and its counts combine with the
	// chunk's as [Counts.Reread] says (Read is the latest read's; rows an
	// earlier read inserted or changed stay counted as such). A run with an
	// open chunk is not completed: backfill.Runner.Run returns
	// [ErrChunksOpen], and backfill.Runner.Rollback can withdraw it.
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
	// (null in its JSON form, the runs.plan of backfill.Manifest): its
	// fingerprint hashes its chunks' IDs as if they were listed here,
	// and the manifest's chunk rows list them.
	ChunkIDs []string `json:"chunk_ids"`
	// Publish is the job's publish mode and view ("" per chunk).
	Publish string `json:"publish,omitempty"`
	// Rollback is the job's rollback mechanism, decided before writing.
	Rollback RollbackMechanism `json:"rollback,omitempty"`
	// Time records the job's time declarations (omitted when none).
	Time *PlanTime `json:"time,omitempty"`
	// Approval is the job's approval policy (omitted when none): a run of
	// the plan awaits approvals of its fingerprint before it writes
	// ([RunAwaitingApproval]).
	Approval *PlanApproval `json:"approval,omitempty"`
	// Modules are the modules of a graph's plan (omitted for a job's):
	// a graph's run has no chunks; its jobs have runs of their own.
	Modules []PlanModule `json:"modules,omitempty"`
	// Chunks are the plan's chunks (not part of the JSON form). A plan a
	// Runner froze from a [ChunkStreamer] holds none, and no ChunkIDs
	// either (its fingerprint is the same): use [Plan.Len] and
	// [Plan.AllChunks].
	Chunks []Chunk `json:"-"`
	// Watermark is the source's high-water mark taken when the run was
	// created (backfill.Job.Watermark); not part of the fingerprint.
	Watermark *time.Time `json:"-"`
	// Fingerprint is set by backfill.NewPlan.
	Fingerprint string `json:"-"`

	// Stream gives the chunks of a plan frozen from a ChunkStreamer
	// (Chunks and ChunkIDs nil), n their number.
	Stream ChunkStreamer `json:"-" db:"-"`
	N      int           `json:"-" db:"-"`
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

// PlanTime is the frozen time declarations of a backfill.Job.
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
	// the job has a backfill.Job.Watermark.
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
	// Worker is the backfill.Config.WorkerID that completed the chunk.
	Worker string
	// Skipped is true when the chunk's latest checkpoint skipped its
	// staging and merge, its rows unchanged since the load it compared
	// with (backfill.Job.SkipUnchanged, [ChunkResult.Skipped]).
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
	// such rows are evidence
	// (backfilldriver.ManifestGates.FailedAttemptExceptions), not part of
	// the queue, since the chunk is read again.
	FailedAttempt int       `db:"failed_attempt" json:"failed_attempt,omitempty"`
	CreatedAt     time.Time `db:"created_at" json:"created_at"`
}

// Event is one entry of the manifest's audit log: run starts, resumes,
// completions, handoffs, operator decisions (pause, resume, approve,
// rollback) with who and why. Entries are appended, never changed.
type Event struct {
	ID      int64  `db:"id" json:"id"`
	BatchID int64  `db:"batch_id" json:"batch_id"`
	Job     string `db:"job_name" json:"job"`
	// Kind names what happened: "run_started" (Detail: "fingerprint",
	// "chunks", and "to": the status it started in), "run_resumed",
	// "run_abandoned", "run_completed", "run_failed", "handoff",
	// [EventApprovalRecorded], [EventBlueprint],
	// [EventRollbackPreviewed], ... ([ReplayControl] replays them).
	Kind string `db:"kind" json:"kind"`
	// Actor is who did it: a worker ID or an operator's name, as given.
	Actor string `db:"actor" json:"actor"`
	// DBRole is the database role of the session that recorded it
	// (PostgreSQL's session_user, set by the manifest whatever the
	// caller gives); "" for the events recorded before manifest version
	// 23 and in manifests that do not record it.
	DBRole string `db:"db_role" json:"db_role,omitempty"`
	// Detail is a JSON object with the event's data (reason, counts, ...).
	Detail    json.RawMessage `db:"detail" json:"detail"`
	CreatedAt time.Time       `db:"created_at" json:"created_at"`
}

// Len returns the number of chunks of the plan: of Chunks, of a plan
// read back from the manifest's JSON form (its ChunkIDs, none for a plan
// frozen from a [ChunkStreamer]), or of a plan a Runner froze from a
// [ChunkStreamer], whose Chunks is nil.
func (p Plan) Len() int {
	switch {
	case p.Chunks != nil:
		return len(p.Chunks)
	case p.ChunkIDs != nil:
		return len(p.ChunkIDs)
	}
	return p.N
}

// AllChunks yields the plan's chunks in Seq order: Chunks, or, for a plan
// a Runner froze from a [ChunkStreamer], the chunker's chunks one at a
// time (a backfill.Manifest inserts a long plan's chunks this way, without
// holding them all). An error of the chunker is yielded with a zero
// Chunk and ends the sequence.
func (p Plan) AllChunks(ctx context.Context) iter.Seq2[Chunk, error] {
	if p.Stream == nil {
		return func(yield func(Chunk, error) bool) {
			for _, c := range p.Chunks {
				if !yield(c, nil) {
					return
				}
			}
		}
	}
	return p.Stream.ChunkSeq(ctx)
}

// ChunkOf returns the plan's chunk that the manifest recorded as c, or
// false when c is not the plan's chunk of its Seq. A streamer's ChunkOf
// is held to its contract: the chunk it returns must be c itself (Seq,
// ID, kind and bounds), or the run would extract one chunk and
// checkpoint another.
func (p Plan) ChunkOf(c Chunk) (Chunk, bool) {
	if p.Stream != nil {
		got, ok := p.Stream.ChunkOf(c)
		if !ok || !isRecordedChunk(got, c) {
			return Chunk{}, false
		}
		return got, true
	}
	if c.Seq < 0 || c.Seq >= len(p.Chunks) || p.Chunks[c.Seq].ID != c.ID {
		return Chunk{}, false
	}
	return p.Chunks[c.Seq], true
}

// ComputeFingerprint returns the hex SHA-256 (64 lowercase hex digits) of
// the plan's JSON form: the fields with a json tag (job, source, code
// version, scope, target, chunk IDs, publish, rollback and time
// declarations), not Chunks, Watermark, Fingerprint, Stream or N. It
// neither sets nor reads p.Fingerprint. backfill.NewPlan sets Fingerprint
// to it. A plan frozen from a [ChunkStreamer] has nil ChunkIDs: its
// Fingerprint, which hashes the streamed chunk IDs in their place, is not
// what ComputeFingerprint returns for it. It cannot fail (the JSON form
// holds only strings and slices of them); it panics if encoding/json
// ever refuses it.
func (p Plan) ComputeFingerprint() string {
	b, err := json.Marshal(p)
	if err != nil { // only plain strings and slices: cannot happen
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// SkipKey is the key under which a replay with backfill.Job.SkipUnchanged
// looks up a chunk's base load (ManifestSkips.BaseFingerprints): the hex
// SHA-256 of the plan's JSON form without its scope and chunk IDs (the job
// name, source, code version, target table, key, written columns, mode,
// duplicate and conflict policies, version, validity columns, derived keys,
// hash column, lineage columns, rollback mechanism, publish mode and time
// declarations), and of the declared type and collation of every column of
// info, the table merged into. Two runs of a job with the same key
// determine a chunk's merge the same way from the same rows, so the chunk
// (its ID names its bounds) may skip on the other's fingerprints whatever
// scope either run covered: a replay of part of a loaded range, or of a
// range extended by new chunks, skips the chunks already loaded. Any other
// field of the plan changes the key: nothing skips on a base loaded
// otherwise.
func (p Plan) SkipKey(info TableInfo) string {
	type column struct {
		Name      string `json:"name"`
		Type      string `json:"type"`
		BaseType  string `json:"base_type"`
		Collation string `json:"collation,omitempty"`
	}
	k := struct {
		Plan    Plan     `json:"plan"`
		Columns []column `json:"columns"`
	}{Plan: p}
	k.Plan.Scope, k.Plan.ChunkIDs = "", nil
	for _, c := range info.Columns {
		k.Columns = append(k.Columns, column{Name: c.Name, Type: c.Type, BaseType: c.BaseType, Collation: c.Collation})
	}
	b, err := json.Marshal(k)
	if err != nil { // only plain strings and slices: cannot happen
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// chunkIDs yields the plan's chunk IDs, from ChunkIDs, Chunks or its
// ChunkStreamer; nil when the plan does not know them (read back from
// the JSON form of a plan frozen from a ChunkStreamer). A chunker's
// error ends the IDs.
func (p Plan) chunkIDs() iter.Seq[string] {
	switch {
	case p.ChunkIDs != nil:
		return slices.Values(p.ChunkIDs)
	case p.Chunks == nil && p.Stream == nil:
		return nil
	}
	return func(yield func(string) bool) {
		for c, err := range p.AllChunks(context.Background()) {
			if err != nil || !yield(c.ID) {
				return
			}
		}
	}
}
