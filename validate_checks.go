package backfill

import (
	"cmp"
	"context"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// The built-in validators: each is a small struct whose zero value is a
// useful check (only [ReferentialIntegrity] needs its table named), with
// a Severity (zero value: [SeverityError], a quality gate) and a Name
// (zero value: the check's default name, which is also CheckResult.Check).
// Put them in [Job.Validators]; they run after the chunk's merge, in its
// transaction, and write nothing.
//
// Every check except [CheckExceptionRate] reads the chunk's staging table
// ([backfilldriver.ValidationScope.Staging]), so it needs the PostgreSQL
// merger: a Runner whose merger does not stage into tables
// ([backfilldriver.TableStager]; the fakes of backfilltest) refuses a job
// with one of them before any work, with an error wrapping
// [ErrUnsupported], and without a staging table Validate returns such an
// error. tx must be the chunk's transaction. Evidence: Expected
// and Actual in words, Sample up to 10 offending keys or groups as
// PostgreSQL prints a row ("(acme,42)"), Detail a JSON object with the
// numbers. A check that cannot run returns an error; one that found a
// defect returns Passed false. The design note
// docs/design/checks-and-fingerprints.md explains how the checks join
// staging with the target.

// stagingCheck is a built-in check that reads the chunk's staging table
// with SQL: a Runner whose merger does not stage into tables
// ([backfilldriver.TableStager]) refuses a job with one before any work.
type stagingCheck interface {
	// checkName is the check's name, as in CheckResult.Check.
	checkName() string
}

var (
	_ stagingCheck = DuplicateKeys{}
	_ stagingCheck = Completeness{}
	_ stagingCheck = ReferentialIntegrity{}
	_ stagingCheck = Aggregates{}
	_ stagingCheck = ReplayChangesNothing{}
	_ stagingCheck = Sample{}
)

func (v DuplicateKeys) checkName() string        { return cmp.Or(v.Name, "duplicate_keys") }
func (v Completeness) checkName() string         { return cmp.Or(v.Name, "completeness") }
func (v ReferentialIntegrity) checkName() string { return cmp.Or(v.Name, "referential_integrity") }
func (v Aggregates) checkName() string           { return cmp.Or(v.Name, "aggregates") }
func (v ReplayChangesNothing) checkName() string { return cmp.Or(v.Name, "replay_changes_nothing") }
func (v Sample) checkName() string               { return cmp.Or(v.Name, "sample") }

var (
	_ Validator = DuplicateKeys{}
	_ Validator = Completeness{}
	_ Validator = ReferentialIntegrity{}
	_ Validator = Aggregates{}
	_ Validator = ReplayChangesNothing{}
	_ Validator = Sample{}
	_ Validator = CheckExceptionRate{}
)

// DuplicateKeys finds business keys that occur more than once in the
// target among the chunk's rows. The chunk's rows are the target rows
// whose [Job.ChunkColumn] value lies in the chunk's half-open interval
// when the job has a ChunkColumn, and otherwise the target rows whose
// identity is in staging.
//
// With the default Columns (the identity: Key, plus ValidFrom in History
// mode) the check cannot fail while the target's unique index exists; it
// is meant for another candidate key, such as a natural key next to a
// surrogate key: DuplicateKeys{Columns: []string{"order_no"}}. Rows with a
// NULL in any of Columns are not duplicates of each other, as in a UNIQUE
// constraint (PostgreSQL docs, 5.5.3 "Unique Constraints").
//
// Evidence: Actual counts the distinct keys that repeat; Sample lists
// them with their row counts, "(o-17): 2 rows". Like every built-in check
// but [CheckExceptionRate], it reads the chunk's staging table, in the
// chunk's transaction: it needs the PostgreSQL merger (an error wrapping
// [ErrUnsupported] otherwise).
type DuplicateKeys struct {
	// Severity is what a failure does; empty means [SeverityError].
	Severity Severity
	// Name is CheckResult.Check; empty means "duplicate_keys".
	Name string
	// Columns is the candidate key checked, target column names; empty
	// means the identity.
	Columns []string
	// AcrossTarget also counts a key of the chunk's rows as duplicate when
	// its other occurrence lies outside the chunk (an earlier chunk or
	// older data). It looks up every key of the chunk in the whole
	// target: give the target an index on Columns.
	AcrossTarget bool
}

// Validate implements [Validator].
func (v DuplicateKeys) Validate(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error) {
	return pgstore.DuplicateKeys(ctx, tx, scope, pgstore.DuplicateKeysParams{Name: v.Name, Severity: v.Severity, Columns: v.Columns, AcrossTarget: v.AcrossTarget})
}

// Completeness compares staging with the target in both directions, by
// identity (NULL-safely; anti-joins with NOT EXISTS):
//
//   - staged rows whose identity is missing from the target (expected 0).
//     Only the identity is compared: under [TargetWins] or
//     [NewerVersionWins] a staged row may legitimately lose;
//   - target rows of the chunk (its [Job.ChunkColumn] interval) whose
//     identity is missing from staging: rows the source no longer has, or
//     rows the chunk rejected. Without a ChunkColumn this direction is
//     skipped and Detail says so; an index on it keeps it proportional to
//     the chunk.
//
// Rows are the same row and hold the same content by the rule of the
// package documentation's "Equality", which the merge follows too: a key
// spelled otherwise (numeric 1.0 for 1.00, another case under a
// case-insensitive collation) is the row the merge found, and content is
// compared by stored value.
//
// With CompareContent, rows present on both sides must also hold the same
// content wherever the mode says the staged row wins. Sample entries say
// which direction ("not in target: (42)", "differs: (44): amount, qty").
// Unless Exact, equal fingerprints of the staged and target rows (shared
// with [Aggregates] and [ReplayChangesNothing]) pass the check without its
// joins (Detail "method": "fingerprint"); rows that differ only cost the
// joins, never a wrong verdict. It needs the PostgreSQL merger's staging
// table.
type Completeness struct {
	// Severity is what a failure does; empty means [SeverityError].
	Severity Severity
	// Name is CheckResult.Check; empty means "completeness".
	Name string
	// CompareContent also compares the content of the rows present on
	// both sides (see above).
	CompareContent bool
	// Exact runs the anti-joins even when the chunk's fingerprints show
	// the staged and target rows equal (see above).
	Exact bool
}

// Validate implements [Validator].
func (v Completeness) Validate(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error) {
	return pgstore.Completeness(ctx, tx, scope, pgstore.CompletenessParams{Name: v.Name, Severity: v.Severity, CompareContent: v.CompareContent, Exact: v.Exact})
}

// ReferentialIntegrity finds orphans: target rows of the chunk (the target
// rows whose identity is in staging) whose Columns hold a key that
// ParentTable lacks in ParentColumns. It is the check of a foreign key
// (PostgreSQL docs, 5.5.5 "Foreign Keys") for targets that cannot have
// one, such as a parent loaded later or in another database's copy. A row
// with a NULL in any of Columns is not an orphan (MATCH SIMPLE). It needs
// the PostgreSQL merger's staging table.
//
// Sample lists orphan rows with their missing parent key:
// "(42) -> (7)". Validate returns an error wrapping [ErrInvalidConfig]
// when Columns or ParentTable is empty or ParentColumns has another
// length than Columns.
type ReferentialIntegrity struct {
	// Severity is what a failure does; empty means [SeverityError].
	Severity Severity
	// Name is CheckResult.Check; empty means "referential_integrity".
	Name string
	// Columns are the target's referencing columns. Required.
	Columns []string
	// ParentTable is the referenced table, optionally schema-qualified
	// ("sales.customers"), in the form of [backfilltype.Target.Table]
	// (quote a part that holds a dot: `"we.ird".customers`). Required.
	ParentTable string
	// ParentColumns are the referenced columns, in the order of Columns;
	// empty means the same names as Columns. Give the parent an index on
	// them (a primary key or unique constraint does).
	ParentColumns []string
}

// Validate implements [Validator].
func (v ReferentialIntegrity) Validate(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error) {
	return pgstore.ReferentialIntegrity(ctx, tx, scope, pgstore.ReferentialIntegrityParams{Name: v.Name, Severity: v.Severity,
		Columns: v.Columns, ParentTable: v.ParentTable, ParentColumns: v.ParentColumns})
}

// Measure is a column that [Aggregates] sums per group.
type Measure = backfilltype.Measure

// Aggregates compares, per group, what was staged with what the target
// holds for the staged identities: the row count, and for each Measure the
// exact sum of its finite values, its counts of NaN, Infinity and
// -Infinity, and its count of NULLs. Counts must match exactly; sums may
// differ by at most the measure's Tolerance. A group is the day of the
// Day column and the values of the Dimensions, by the package
// documentation's "Equality": a Dimension that is content groups by the
// value it stores (numeric 1.5 and 1.50 are two groups, 'a' and 'A' under
// a case-insensitive collation too); a Dimension that is a key column
// (Key, or ValidFrom in [History]) groups a staged row by the key its
// target row stores, the row it merged into, so that a replay spelling
// the key otherwise (numeric 1.00 for 1.0, 'ABC' for 'abc' under a
// case-insensitive collation, an upper-case uuid) or a chunk repeating a
// key spelled otherwise falls into that row's group. The Day of a
// timestamptz is its instant's day in [Job.Zone], whatever zone the value
// was spelled in. The zero value compares the chunk's row counts. The
// target side holds what the merge left, so under [TargetWins] and
// [NewerVersionWins] a staged row that lost shows up as a difference.
// Sample lists the differing groups:
// "(2024-03-01,EU): sum(amount) staged 35.00 target 30.00".
//
// Validate returns an error wrapping [ErrInvalidConfig] for a column that
// is not staged, a Day column that is not a timestamp, timestamptz or
// date, a negative or NaN Tolerance, or a Day on a timestamptz column when
// [Job.Zone] is [time.Local]. Unless Exact, equal fingerprints (see
// [Completeness]) covering the Day, Dimensions and Measures pass the check
// without computing the groups. It needs the PostgreSQL merger's staging
// table.
type Aggregates struct {
	// Severity is what a failure does; empty means [SeverityError].
	Severity Severity
	// Name is CheckResult.Check; empty means "aggregates".
	Name string
	// Day, if set, names a staged timestamptz, timestamp or date column
	// whose calendar day is the first group column: for timestamptz the
	// day in [Job.Zone], date_trunc('day', col AT TIME ZONE zone) with
	// the zone as a bind parameter (PostgreSQL docs, 9.9.4 "AT TIME
	// ZONE"); a timestamp holds wall clocks in Job.Zone already and
	// gives its date; a date is its own day.
	Day string
	// Dimensions are further staged columns to group by (region, product
	// line, ...). Raw SQL expressions are not accepted.
	Dimensions []string
	// Measures are the columns summed per group.
	Measures []Measure
	// Exact computes the groups' figures even when the chunk's
	// fingerprints show the staged and target rows equal (see
	// [Completeness]), so that the evidence lists every group.
	Exact bool
}

// Validate implements [Validator].
func (v Aggregates) Validate(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error) {
	return pgstore.Aggregates(ctx, tx, scope, pgstore.AggregatesParams{Name: v.Name, Severity: v.Severity,
		Day: v.Day, Dimensions: v.Dimensions, Measures: v.Measures, Exact: v.Exact})
}

// ReplayChangesNothing re-runs the chunk's merge on its staged rows, in a
// savepoint that is rolled back ([backfilldriver.Replayer]), and asserts
// that it would write nothing: 0 inserted, 0 updated, 0 History intervals
// closed. A merge that is not idempotent fails it, such as one into a
// target whose trigger normalises values. It compares as the merge does,
// by the rule of the package documentation's "Equality", as every check
// does.
//
// Unless Exact, in every mode but History, equal fingerprints of the
// staged and target rows (see [Completeness]) stand in for the replay:
// Detail then says "method": "fingerprint" and counts every staged row as
// unchanged. History always replays: its merge also re-tiles validity
// intervals. With a stager that is not a Replayer Validate returns an
// error wrapping [ErrUnsupported], never a pass. Detail holds the
// replay's counts; there is no Sample.
type ReplayChangesNothing struct {
	// Severity is what a failure does; empty means [SeverityError].
	Severity Severity
	// Name is CheckResult.Check; empty means "replay_changes_nothing".
	Name string
	// Exact replays the merge even when the chunk's fingerprints prove
	// what it would write (see above).
	Exact bool
}

// Validate implements [Validator].
func (v ReplayChangesNothing) Validate(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error) {
	return pgstore.ReplayChangesNothing(ctx, tx, scope, pgstore.ReplayChangesNothingParams{Name: v.Name, Severity: v.Severity, Exact: v.Exact})
}

// DefaultSampleSize is the default of [Sample].N: 100 rows.
const DefaultSampleSize = pgstore.DefaultSampleSize

// Sample compares a deterministic pseudo-random sample of the staged rows
// with their target rows, column by column and NULL-safe (IS DISTINCT
// FROM), by the rule of the package documentation's "Equality". The sample is the N staged rows with the smallest
// md5(identity text || Seed) (PostgreSQL docs, 9.4 "String Functions"):
// the same rows for the same data and seed, spread over the chunk
// whatever the extractor's order. Compared are the columns of
// [Completeness] with CompareContent, where the mode says the staged row
// wins; a sampled row missing from the target is a difference too. It
// needs the PostgreSQL merger's staging table.
//
// Sample lists "(42): amount, qty" per differing row, "(43): not in
// target" per missing one; Detail holds the sample size, the seed and the
// differences. Validate returns an error wrapping [ErrInvalidConfig] for
// a negative N.
type Sample struct {
	// Severity is what a failure does; empty means [SeverityError].
	Severity Severity
	// Name is CheckResult.Check; empty means "sample".
	Name string
	// N is how many staged rows to compare; 0 means [DefaultSampleSize].
	N int
	// Seed selects the sample; runs with the same seed sample the same
	// keys.
	Seed int64
}

// Validate implements [Validator].
func (v Sample) Validate(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error) {
	return pgstore.Sample(ctx, tx, scope, pgstore.SampleParams{Name: v.Name, Severity: v.Severity, N: v.N, Seed: v.Seed})
}

// CheckExceptionRate is a quality gate on the exception queue of one
// chunk: it fails when the chunk's rejected rows divided by its read rows
// ([backfilldriver.ValidationScope.Counts]) exceed MaxRate. A chunk that
// read nothing passes. It needs no database and runs with any merger, the
// fakes included. A rate over the whole run is not checked yet: every chunk
// is judged on its own.
//
// Validate returns an error wrapping [ErrInvalidConfig] when MaxRate is
// not between 0 and 1.
type CheckExceptionRate struct {
	// Severity is what a failure does; empty means [SeverityError].
	Severity Severity
	// Name is CheckResult.Check; empty means "exception_rate".
	Name string
	// MaxRate is the largest share of rejected rows that passes, from 0
	// (the zero value: no rejected row at all) to 1.
	MaxRate float64
}

// Validate implements [Validator].
func (v CheckExceptionRate) Validate(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error) {
	return pgstore.CheckExceptionRate(scope, pgstore.CheckExceptionRateParams{Name: v.Name, Severity: v.Severity, MaxRate: v.MaxRate})
}
