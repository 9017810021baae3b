package backfilltype

import (
	"encoding/json"
	"time"
)

// Severity says what a failed check does: [SeverityWarn] records it,
// [SeverityError] is a quality gate that halts the run.
type Severity string

const (
	// SeverityWarn records a failed check and lets the chunk commit.
	SeverityWarn Severity = "warn"
	// SeverityError halts the run: the chunk rolls back (nothing of it is
	// published), the run is paused with the reason, and it resumes only
	// by an explicit backfill.Runner.Resume recorded with who and why.
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
	// that an operator accepted for this chunk
	// (backfill.Runner.AcceptGate): the chunk committed despite it, and the
	// result is kept as evidence.
	Accepted bool `json:"accepted,omitempty"`
}

// Validation is one [CheckResult] as recorded in the manifest.
type Validation struct {
	CheckResult
	BatchID   int64     `json:"batch_id"`
	ChunkID   string    `json:"chunk_id"`
	CreatedAt time.Time `json:"created_at"`
	// FailedAttempt is 0 for the results of an attempt that committed, and
	// the attempt number for those of an attempt that a failed gate rolled
	// back (kept outside it, see backfilldriver.ManifestGates).
	FailedAttempt int `json:"failed_attempt,omitempty"`
}

// Measure is a column that backfill.Aggregates sums per group.
type Measure struct {
	// Column is a staged column of a numeric type (integer, numeric,
	// real, double precision).
	Column string
	// Tolerance is the largest absolute difference between the staged
	// and the target sum (of the finite values) that still passes; 0
	// means exact. Sums are exact for every type, floats included (see
	// backfill.Aggregates): 0 never fails for the order of addition.
	Tolerance float64
}
