package pgstore

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// The work of the built-in checks of package backfill (DuplicateKeys,
// Completeness, ReferentialIntegrity, Aggregates, ReplayChangesNothing,
// Sample, CheckExceptionRate): one function per check, whose params
// carry the check's settings. The checks' types, and their documentation
// for users, stay in package backfill, whose Validate methods call these.
//
// Each function but CheckExceptionRate runs in tx, which must be the
// chunk's transaction, after the chunk's merge; it writes nothing (its
// planner settings are made in savepoints it rolls back). Each returns
// the check's evidence (CheckResult with Check, Severity, Expected,
// Actual, Sample and a JSON Detail), with Passed false for a defect it
// found, or an error, prefixed "backfill: validate <name>: ", when the
// check could not run. A check that reads staging returns an error
// wrapping [backfilltype.ErrUnsupported] when scope has no staging table,
// and one wrapping [backfilltype.ErrInvalidConfig] when the target has no
// Key.

// DefaultSampleSize is the number of staged rows [Sample] compares when
// SampleParams.N is 0.
const DefaultSampleSize = 100

// DuplicateKeysParams are the settings of backfill.DuplicateKeys.
type DuplicateKeysParams struct {
	// Name is CheckResult.Check; empty means "duplicate_keys".
	Name string
	// Severity is CheckResult.Severity; empty means SeverityError.
	Severity backfilltype.Severity
	// Columns is the candidate key checked, target column names; empty
	// means the identity.
	Columns []string
	// AcrossTarget also counts a key of the chunk's rows whose other
	// occurrence lies outside the chunk.
	AcrossTarget bool
}

// DuplicateKeys counts the keys of p.Columns that occur more than once
// among the chunk's target rows (by ChunkColumn interval, or by staged
// identity without one; with AcrossTarget, against the whole target) and
// passes when there are none. Sample lists up to 10 keys with their
// row counts; Detail holds the columns, the count, how the chunk's rows
// were selected and AcrossTarget.
func DuplicateKeys(ctx context.Context, tx sqlx.ExtContext, scope backfilldriver.ValidationScope, p DuplicateKeysParams) (backfilltype.CheckResult, error) {
	c, err := NewPGCheck(cmp.Or(p.Name, "duplicate_keys"), p.Severity, scope)
	if err != nil {
		return backfilltype.CheckResult{}, err
	}
	cols := p.Columns
	if len(cols) == 0 {
		cols = scope.Info.Identity()
	} else if err := c.namedColumns(ctx, tx, "DuplicateKeys.Columns", scope.Info.Target.Table, cols); err != nil {
		return backfilltype.CheckResult{}, err
	}
	var a SQLArgs
	chunkRows, how, err := c.ChunkRows("c", &a)
	if err != nil {
		return backfilltype.CheckResult{}, err
	}
	q := c.DuplicateKeysSQL(cols, chunkRows, p.AcrossTarget)
	var n int64
	var sample []string
	policy := joinsIfLarge
	if p.AcrossTarget {
		policy = joinsAllowed
	}
	err = c.withJoins(ctx, tx, policy, func() (err error) {
		n, sample, err = countSample(ctx, tx, q, a...)
		return err
	})
	if err != nil {
		return backfilltype.CheckResult{}, c.errorf("%w", err)
	}
	return c.result(n == 0, "0 duplicate keys", fmt.Sprintf("%d duplicate keys", n), sample, map[string]any{
		"columns": cols, "duplicate_keys": n, "chunk_rows": how, "across_target": p.AcrossTarget,
	})
}

// CompletenessParams are the settings of backfill.Completeness.
type CompletenessParams struct {
	// Name is CheckResult.Check; empty means "completeness".
	Name string
	// Severity is CheckResult.Severity; empty means SeverityError.
	Severity backfilltype.Severity
	// CompareContent also compares the content of the rows present on
	// both sides, where the mode says the staged row wins.
	CompareContent bool
	// Exact runs the comparisons even when the chunk's fingerprints show
	// the staged and target rows equal.
	Exact bool
}

// Completeness compares staging with the target by identity: staged rows
// missing from the target, with CompareContent rows whose content
// differs, and, when scope has a ChunkColumn, the chunk's target rows
// missing from staging. It passes when every count is 0. Unless p.Exact,
// equal fingerprints prove the counts 0 without running the comparisons.
// Sample prefixes each key with its direction ("not in target: ",
// "differs: ", "not in staging: "); Detail holds the counts, the content
// columns, the rejected rows and the fingerprint evidence ("method").
func Completeness(ctx context.Context, tx sqlx.ExtContext, scope backfilldriver.ValidationScope, p CompletenessParams) (backfilltype.CheckResult, error) {
	c, err := NewPGCheck(cmp.Or(p.Name, "completeness"), p.Severity, scope)
	if err != nil {
		return backfilltype.CheckResult{}, err
	}
	detail := map[string]any{"rejected": scope.Counts.Rejected}
	var sample []string
	add := func(prefix string, s []string) {
		for _, k := range s {
			if len(sample) < maxSample {
				sample = append(sample, prefix+k)
			}
		}
	}
	proof, proven, err := c.provenBy(ctx, tx, p.Exact)
	if err != nil {
		return backfilltype.CheckResult{}, err
	}
	// query runs an exact comparison unless the fingerprints proved its
	// answer: nothing missing, nothing different.
	query := func(policy joinPolicy, q string, args ...any) (n int64, sample []string, err error) {
		if proven {
			return 0, nil, nil
		}
		err = c.withJoins(ctx, tx, policy, func() (err error) {
			n, sample, err = countSample(ctx, tx, q, args...)
			return err
		})
		return n, sample, err
	}
	missingT, s, err := query(joinsIfLarge, c.MissingFromTargetSQL())
	if err != nil {
		return backfilltype.CheckResult{}, c.errorf("staged rows missing from target: %w", err)
	}
	add("not in target: ", s)
	detail["staged_missing_from_target"] = missingT
	expected := []string{"0 staged rows missing from target"}
	actual := []string{fmt.Sprintf("%d staged rows missing from target", missingT)}
	passed := missingT == 0

	if p.CompareContent {
		wins := c.SourceWins("s", "t")
		var differ int64
		if wins == "false" {
			detail["content"] = "not compared: the target wins every conflict (TargetWins)"
		} else {
			differ, s, err = query(joinsIfLarge, c.DifferingContentSQL(wins))
			if err != nil {
				return backfilltype.CheckResult{}, c.errorf("content: %w", err)
			}
			add("differs: ", s)
			detail["content_columns"] = c.Content()
		}
		detail["differing"] = differ
		expected = append(expected, "0 rows with other content")
		actual = append(actual, fmt.Sprintf("%d rows with other content", differ))
		passed = passed && differ == 0
	}

	if scope.ChunkColumn == "" {
		detail["target_to_staging"] = "skipped: Job.ChunkColumn is not set, so the chunk's target rows are unknown"
		expected = append(expected, "target rows not checked (no ChunkColumn)")
		actual = append(actual, "target rows not checked (no ChunkColumn)")
	} else {
		var a SQLArgs
		bounds, err := c.InChunk("t", &a)
		if err != nil {
			return backfilltype.CheckResult{}, err
		}
		missingS, s, err := query(joinsAllowed, c.MissingFromStagingSQL(bounds), a...)
		if err != nil {
			return backfilltype.CheckResult{}, c.errorf("target rows missing from staging: %w", err)
		}
		add("not in staging: ", s)
		detail["target_missing_from_staging"] = missingS
		expected = append(expected, "0 target rows missing from staging")
		actual = append(actual, fmt.Sprintf("%d target rows missing from staging", missingS))
		passed = passed && missingS == 0
	}
	proof.Evidence(detail)
	return c.result(passed, strings.Join(expected, "; "), strings.Join(actual, "; "), sample, detail)
}

// ReferentialIntegrityParams are the settings of
// backfill.ReferentialIntegrity.
type ReferentialIntegrityParams struct {
	// Name is CheckResult.Check; empty means "referential_integrity".
	Name string
	// Severity is CheckResult.Severity; empty means SeverityError.
	Severity backfilltype.Severity
	// Columns are the target's referencing columns. Required.
	Columns []string
	// ParentTable is the referenced table, in the form of
	// backfilltype.Target.Table. Required.
	ParentTable string
	// ParentColumns are the referenced columns, in the order of Columns;
	// empty means the names of Columns.
	ParentColumns []string
}

// ReferentialIntegrity counts the orphans among the target rows of the
// staged identities: rows whose p.Columns, all not NULL, name no row of
// p.ParentTable in p.ParentColumns. It passes when there are none; Sample
// lists up to 10 orphans with their missing parent key, Detail the
// settings and the count. It returns an error wrapping
// [backfilltype.ErrInvalidConfig] when Columns or ParentTable is empty,
// ParentColumns has another length than Columns, or ParentTable does not
// parse as a table name.
func ReferentialIntegrity(ctx context.Context, tx sqlx.ExtContext, scope backfilldriver.ValidationScope, p ReferentialIntegrityParams) (backfilltype.CheckResult, error) {
	c, err := NewPGCheck(cmp.Or(p.Name, "referential_integrity"), p.Severity, scope)
	if err != nil {
		return backfilltype.CheckResult{}, err
	}
	parentCols := cmpOrSlice(p.ParentColumns, p.Columns)
	switch {
	case len(p.Columns) == 0:
		return backfilltype.CheckResult{}, c.errorf("%w: ReferentialIntegrity.Columns is required", backfilltype.ErrInvalidConfig)
	case p.ParentTable == "":
		return backfilltype.CheckResult{}, c.errorf("%w: ReferentialIntegrity.ParentTable is required", backfilltype.ErrInvalidConfig)
	case len(parentCols) != len(p.Columns):
		return backfilltype.CheckResult{}, c.errorf("%w: ReferentialIntegrity.ParentColumns has %d columns, Columns %d", backfilltype.ErrInvalidConfig, len(parentCols), len(p.Columns))
	}
	if _, _, err := sqlgen.ParseTable(p.ParentTable); err != nil {
		return backfilltype.CheckResult{}, c.errorf("%w: ReferentialIntegrity.ParentTable: %w", backfilltype.ErrInvalidConfig, err)
	}
	if err := c.namedColumns(ctx, tx, "ReferentialIntegrity.Columns", scope.Info.Target.Table, p.Columns); err != nil {
		return backfilltype.CheckResult{}, err
	}
	if err := c.namedColumns(ctx, tx, "ReferentialIntegrity.ParentTable and ParentColumns", p.ParentTable, parentCols); err != nil {
		return backfilltype.CheckResult{}, err
	}
	q := c.OrphansSQL(p.Columns, p.ParentTable, parentCols)
	var n int64
	var sample []string
	err = c.withJoins(ctx, tx, joinsAllowed, func() (err error) {
		n, sample, err = countSample(ctx, tx, q)
		return err
	})
	if err != nil {
		return backfilltype.CheckResult{}, c.errorf("%w", err)
	}
	return c.result(n == 0, "0 orphan rows", fmt.Sprintf("%d orphan rows", n), sample, map[string]any{
		"columns": p.Columns, "parent_table": p.ParentTable, "parent_columns": parentCols, "orphans": n,
	})
}

// ReplayChangesNothingParams are the settings of
// backfill.ReplayChangesNothing.
type ReplayChangesNothingParams struct {
	// Name is CheckResult.Check; empty means "replay_changes_nothing".
	Name string
	// Severity is CheckResult.Severity; empty means SeverityError.
	Severity backfilltype.Severity
	// Exact replays the merge even when the chunk's fingerprints prove
	// what it would write.
	Exact bool
}

// ReplayChangesNothing replays the chunk's merge through scope.Stager
// ([backfilldriver.Replayer], which rolls its writes back) and passes
// when the replay would insert, update and close nothing. With a staging
// table, unless p.Exact or the mode is History, equal fingerprints stand
// in for the replay (with the stager's fingerprint memo only), and a
// large chunk replays with hash joins. Detail holds the replay's counts
// and, with a staging table, the fingerprint evidence; there is no Sample.
// It needs no staging table, but returns an error wrapping
// [backfilltype.ErrUnsupported] when the stager is not a Replayer.
func ReplayChangesNothing(ctx context.Context, tx sqlx.ExtContext, scope backfilldriver.ValidationScope, p ReplayChangesNothingParams) (backfilltype.CheckResult, error) {
	name := cmp.Or(p.Name, "replay_changes_nothing")
	rp, ok := scope.Stager.(backfilldriver.Replayer)
	if !ok {
		return backfilltype.CheckResult{}, fmt.Errorf("backfill: validate %s: %w: the chunk's stager (%T) cannot replay its merge", name, backfilltype.ErrUnsupported, scope.Stager)
	}
	var r backfilltype.MergeResult
	replay := func() (err error) {
		r, err = rp.Replay(ctx)
		return err
	}
	c := &PGCheck{Name: name, Severity: SeverityOr(p.Severity)}
	var err error
	var proof *FingerprintProof
	if scope.Staging != "" {
		c, err = NewPGCheck(name, p.Severity, scope)
		if err != nil {
			return backfilltype.CheckResult{}, err
		}
		_, memo := scope.Stager.(fingerprintKeeper)
		if mode := scope.Info.Target.Mode; memo && mode != backfilltype.History {
			// The proof stands in for the replay where the merge's writes
			// follow from row equality alone: it inserts the staged rows
			// whose identity the target lacks and updates those its
			// change detection finds different. History also re-tiles
			// intervals, which the staged rows do not show: it replays.
			var proven bool
			proof, proven, err = c.provenBy(ctx, tx, p.Exact)
			if err != nil {
				return backfilltype.CheckResult{}, err
			}
			if proven {
				if mode == backfilltype.Upsert || mode == "" {
					r.Unchanged = proof.Staged.Rows
				}
				return replayResult(c, r, proof)
			}
		}
		// A large chunk replays faster with hash joins: as many lookups as
		// rows otherwise.
		err = c.withJoins(ctx, tx, joinsIfLarge, replay)
	} else {
		err = replay()
	}
	if err != nil {
		return backfilltype.CheckResult{}, fmt.Errorf("backfill: validate %s: %w", name, err)
	}
	return replayResult(c, r, proof)
}

// replayResult is ReplayChangesNothing's evidence of the replay's (or the
// proof's) counts r.
func replayResult(c *PGCheck, r backfilltype.MergeResult, proof *FingerprintProof) (backfilltype.CheckResult, error) {
	detail := map[string]any{"inserted": r.Inserted, "updated": r.Updated, "unchanged": r.Unchanged, "closed": r.Closed}
	if c.Staging != "" {
		proof.Evidence(detail)
	}
	return c.result(r.Inserted == 0 && r.Updated == 0 && r.Closed == 0, "0 inserted, 0 updated, 0 closed",
		fmt.Sprintf("%d inserted, %d updated, %d closed", r.Inserted, r.Updated, r.Closed), nil, detail)
}

// SampleParams are the settings of backfill.Sample.
type SampleParams struct {
	// Name is CheckResult.Check; empty means "sample".
	Name string
	// Severity is CheckResult.Severity; empty means SeverityError.
	Severity backfilltype.Severity
	// N is how many staged rows to compare; 0 means DefaultSampleSize.
	N int
	// Seed selects the sample.
	Seed int64
}

// Sample compares the p.N staged rows with the smallest md5(identity
// text || Seed) with their target rows, on the content columns where the
// mode says the staged row wins, and passes when none differs or is
// missing from the target. Sample lists up to 10 differing rows
// ("(42): amount, qty", "(43): not in target"); Detail holds the sample
// size, the seed and every difference. It returns an error wrapping
// [backfilltype.ErrInvalidConfig] for a negative N.
func Sample(ctx context.Context, tx sqlx.ExtContext, scope backfilldriver.ValidationScope, p SampleParams) (backfilltype.CheckResult, error) {
	c, err := NewPGCheck(cmp.Or(p.Name, "sample"), p.Severity, scope)
	if err != nil {
		return backfilltype.CheckResult{}, err
	}
	if p.N < 0 {
		return backfilltype.CheckResult{}, c.errorf("%w: Sample.N cannot be less than zero", backfilltype.ErrInvalidConfig)
	}
	n := cmp.Or(p.N, DefaultSampleSize)
	wins := c.SourceWins("s", "t")
	var a SQLArgs
	q := c.SampleSQL(n, p.Seed, wins, &a)
	rows, err := tx.QueryxContext(ctx, q, a...)
	if err != nil {
		return backfilltype.CheckResult{}, c.errorf("%w", err)
	}
	defer rows.Close()
	type difference struct {
		Key     string   `json:"key"`
		Missing bool     `json:"missing,omitempty"`
		Columns []string `json:"columns,omitempty"`
	}
	differences := []difference{}
	var sampled int64
	var sample []string
	for rows.Next() {
		var d difference
		var cols pq.StringArray
		if err := rows.Scan(&d.Key, &d.Missing, &cols); err != nil {
			return backfilltype.CheckResult{}, c.errorf("%w", err)
		}
		sampled++
		switch {
		case d.Missing:
			differences = append(differences, d)
			if len(sample) < maxSample {
				sample = append(sample, d.Key+": not in target")
			}
		case len(cols) > 0:
			d.Columns = cols
			differences = append(differences, d)
			if len(sample) < maxSample {
				sample = append(sample, d.Key+": "+strings.Join(cols, ", "))
			}
		}
	}
	if err := rows.Err(); err != nil {
		return backfilltype.CheckResult{}, c.errorf("%w", err)
	}
	detail := map[string]any{"sampled": sampled, "seed": p.Seed, "differing": len(differences), "differences": differences}
	if wins == "false" {
		detail["content"] = "not compared: the target wins every conflict (TargetWins)"
	} else {
		detail["content_columns"] = c.Content()
	}
	return c.result(len(differences) == 0, fmt.Sprintf("0 of %d sampled rows differ", sampled),
		fmt.Sprintf("%d of %d sampled rows differ", len(differences), sampled), sample, detail)
}

// CheckExceptionRateParams are the settings of backfill.CheckExceptionRate.
type CheckExceptionRateParams struct {
	// Name is CheckResult.Check; empty means "exception_rate".
	Name string
	// Severity is CheckResult.Severity; empty means SeverityError.
	Severity backfilltype.Severity
	// MaxRate is the largest share of rejected rows that passes, from 0
	// to 1.
	MaxRate float64
}

// CheckExceptionRate passes when the chunk's rejected rows divided by its
// read rows (scope.Counts; 0 for a chunk that read nothing) are at most
// p.MaxRate. It reads no database and needs no staging table; Detail
// holds the counts, the rate and MaxRate. It returns an error wrapping
// [backfilltype.ErrInvalidConfig] when MaxRate is not between 0 and 1.
func CheckExceptionRate(scope backfilldriver.ValidationScope, p CheckExceptionRateParams) (backfilltype.CheckResult, error) {
	c := &PGCheck{Name: cmp.Or(p.Name, "exception_rate"), Severity: SeverityOr(p.Severity)}
	if !(p.MaxRate >= 0 && p.MaxRate <= 1) {
		return backfilltype.CheckResult{}, c.errorf("%w: CheckExceptionRate.MaxRate %v is not between 0 and 1", backfilltype.ErrInvalidConfig, p.MaxRate)
	}
	read, rejected := scope.Counts.Read, scope.Counts.Rejected
	rate := 0.0
	if read > 0 {
		rate = float64(rejected) / float64(read)
	}
	return c.result(rate <= p.MaxRate, fmt.Sprintf("rejected/read <= %g", p.MaxRate),
		fmt.Sprintf("%g (%d of %d rows rejected)", rate, rejected, read), nil, map[string]any{
			"read": read, "rejected": rejected, "rate": rate, "max_rate": p.MaxRate,
		})
}
