package backfill

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
)

// Severity says what a failed check does: [SeverityWarn] records it,
// [SeverityError] is a quality gate that halts the run.
type Severity = backfilltype.Severity

const (
	// SeverityWarn records a failed check and lets the chunk commit.
	SeverityWarn = backfilltype.SeverityWarn
	// SeverityError halts the run: the chunk rolls back (nothing of it is
	// published), the run is paused with the reason, and it resumes only
	// by an explicit [Runner.Resume] recorded with who and why.
	SeverityError = backfilltype.SeverityError
)

// CheckResult is the evidence of one check on one chunk: what was
// expected, what was found, and a sample of offending keys. Results are
// appended to the manifest, never overwritten.
type CheckResult = backfilltype.CheckResult

// ValidationScope is what a [Validator] checks: one chunk of a run, after
// its merge and before its checkpoint, inside its transaction.
type ValidationScope = backfilldriver.ValidationScope

// Validator checks one chunk. The built-ins for PostgreSQL are
// [DuplicateKeys], [Completeness], [ReferentialIntegrity], [Aggregates],
// [ReplayChangesNothing], [Sample] and [CheckExceptionRate]. Validators run
// in [Job.Validators] order, in the chunk's transaction: they must not
// write to the target (a replay check writes inside a savepoint and rolls
// it back).
type Validator = backfilldriver.Validator

// ValidatorFunc adapts a function to [Validator].
type ValidatorFunc func(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error)

// Validate calls f.
func (f ValidatorFunc) Validate(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error) {
	return f(ctx, tx, scope)
}
