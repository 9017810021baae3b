package backfill

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jmoiron/sqlx"
)

// Severity says what a failed check does: [SeverityWarn] records it,
// [SeverityError] is a quality gate that halts the run.
type Severity string

const (
	// SeverityWarn records a failed check and lets the chunk commit.
	SeverityWarn Severity = "warn"
	// SeverityError halts the run: the chunk rolls back (nothing of it is
	// published), the run is paused with the reason, and it resumes only
	// by an explicit [Runner.Resume] recorded with who and why.
	SeverityError Severity = "error"
)

// CheckResult is the evidence of one check on one chunk: what was
// expected, what was found, and a sample of offending keys. Results are
// appended to the manifest, never overwritten.
type CheckResult struct {
	// Check names the check, e.g. "duplicate_keys".
	Check string `json:"check"`
	// Severity is the check's configured severity.
	Severity Severity `json:"severity"`
	// Passed is false when the check found a defect.
	Passed bool `json:"passed"`
	// Expected and Actual describe the measure, e.g. "0 duplicate keys"
	// and "3 duplicate keys".
	Expected string `json:"expected"`
	Actual   string `json:"actual"`
	// Sample lists up to 10 offending keys or groups, as text.
	Sample []string `json:"sample,omitempty"`
	// Detail holds check-specific evidence as a JSON object (optional).
	Detail json.RawMessage `json:"detail,omitempty"`
	// Accepted is set by the runner on a failed check of [SeverityError]
	// that an operator accepted for this chunk ([Runner.AcceptGate]): the
	// chunk committed despite it, and the result is kept as evidence.
	Accepted bool `json:"accepted,omitempty"`
}

// ValidationScope is what a [Validator] checks: one chunk of a run, after
// its merge and before its checkpoint, inside its transaction.
type ValidationScope struct {
	// BatchID is the run's batch ID.
	BatchID int64
	// Chunk is the chunk just merged.
	Chunk Chunk
	// Info is the prepared target.
	Info TableInfo
	// ChunkColumn and Zone are the job's ([Job.ChunkColumn], [Job.Zone]):
	// they bound "the chunk's rows" in the target for checks that need it.
	ChunkColumn string
	Zone        *time.Location
	// Counts are the chunk's row counts so far (read, inserted, ...).
	Counts Counts
	// Staging is the quoted name of the chunk's staging table, holding the
	// rows that were merged (after deduplication and rejections), or ""
	// when the merger has none (the fakes).
	Staging string
	// Stager is the chunk's stager; it implements [Replayer] when the
	// merger can re-run its merge (PGMerger).
	Stager Stager
}

// Validator checks one chunk. Built-ins for PostgreSQL are in
// validate_pg.go. Validators run in [Job.Validators] order, in the chunk's
// transaction: they must not write to the target (a replay check writes
// inside a savepoint and rolls it back).
type Validator interface {
	// Validate checks scope inside tx and returns its evidence. An error
	// means the check could not run (not that it failed); the chunk then
	// fails like any other error.
	Validate(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error)
}

// ValidatorFunc adapts a function to [Validator].
type ValidatorFunc func(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error)

// Validate calls f.
func (f ValidatorFunc) Validate(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error) {
	return f(ctx, tx, scope)
}

// Replayer is implemented by stagers that can run their merge again on
// the same staged rows, for the replay-changes-nothing check. Replay must
// leave no trace: it runs inside a savepoint it rolls back, and returns
// what the merge would have done.
type Replayer interface {
	Replay(ctx context.Context) (MergeResult, error)
}

// StagingTabler is implemented by stagers whose rows live in a table
// (PGMerger): it returns the quoted table name.
type StagingTabler interface {
	StagingTable() string
}

// Validation is one [CheckResult] as recorded in the manifest.
type Validation struct {
	CheckResult
	BatchID   int64     `json:"batch_id"`
	ChunkID   string    `json:"chunk_id"`
	CreatedAt time.Time `json:"created_at"`
	// FailedAttempt is 0 for the results of an attempt that committed, and
	// the attempt number for those of an attempt that a failed gate rolled
	// back (kept outside it, see [ManifestGates]).
	FailedAttempt int `json:"failed_attempt,omitempty"`
}

// ManifestValidations is implemented by manifests that keep validation
// evidence and can pause runs; [PGManifest] and backfilltest.Manifest do.
// [Job.Validators] need it ([ErrUnsupported] otherwise).
type ManifestValidations interface {
	// AddValidations appends results for a chunk, joining db's
	// transaction when db is one.
	AddValidations(ctx context.Context, db sqlx.ExtContext, batchID int64, chunkID string, results []CheckResult) error
	// Validations returns the batch's results in the order recorded.
	Validations(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]Validation, error)
	// PauseRun sets a running run to paused with the reason; claims stop.
	PauseRun(ctx context.Context, db sqlx.ExtContext, batchID int64, reason string) error
	// ResumeRun sets a paused run to running, recording who and why in
	// the audit log; it returns [ErrNotPaused] when the run is not paused.
	ResumeRun(ctx context.Context, db sqlx.ExtContext, batchID int64, actor, why string) error
}
