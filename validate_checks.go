package backfill

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"math"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// The built-in validators: each is a small struct whose zero value is a
// useful check (only [ReferentialIntegrity] needs its table named), with
// a Severity (zero value: [SeverityError], a quality gate) and a Name
// (zero value: the check's default name, which is also CheckResult.Check).
// Put them in [Job.Validators]; they run after the chunk's merge, in its
// transaction, and write nothing.
//
// Every check except [CheckExceptionRate] reads the chunk's staging table
// ([ValidationScope.Staging]), so it needs the PostgreSQL merger; without
// a staging table Validate returns an error wrapping [ErrUnsupported]. tx
// must be the chunk's transaction. Evidence: Expected and Actual in words,
// Sample up to 10 offending keys or groups as PostgreSQL prints a row
// ("(acme,42)"), Detail a JSON object with the numbers. A check that
// cannot run returns an error; one that found a defect returns Passed
// false. The design note docs/design/checks-and-fingerprints.md explains
// how the checks join staging with the target.

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
	c, err := pgstore.NewPGCheck(cmp.Or(v.Name, "duplicate_keys"), v.Severity, scope)
	if err != nil {
		return CheckResult{}, err
	}
	cols := v.Columns
	if len(cols) == 0 {
		cols = scope.Info.Identity()
	}
	var a pgstore.SQLArgs
	chunkRows, how, err := c.ChunkRows("c", &a)
	if err != nil {
		return CheckResult{}, err
	}
	q := c.DuplicateKeysSQL(cols, chunkRows, v.AcrossTarget)
	var n int64
	var sample []string
	policy := pgstore.JoinsIfLarge
	if v.AcrossTarget {
		policy = pgstore.JoinsAllowed
	}
	err = c.WithJoins(ctx, tx, policy, func() (err error) {
		n, sample, err = pgstore.CountSample(ctx, tx, q, a...)
		return err
	})
	if err != nil {
		return CheckResult{}, c.Errorf("%w", err)
	}
	return c.Result(n == 0, "0 duplicate keys", fmt.Sprintf("%d duplicate keys", n), sample, map[string]any{
		"columns": cols, "duplicate_keys": n, "chunk_rows": how, "across_target": v.AcrossTarget,
	})
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
	c, err := pgstore.NewPGCheck(cmp.Or(v.Name, "completeness"), v.Severity, scope)
	if err != nil {
		return CheckResult{}, err
	}
	detail := map[string]any{"rejected": scope.Counts.Rejected}
	var sample []string
	add := func(prefix string, s []string) {
		for _, k := range s {
			if len(sample) < pgstore.MaxSample {
				sample = append(sample, prefix+k)
			}
		}
	}
	proof, proven, err := c.ProvenBy(ctx, tx, v.Exact)
	if err != nil {
		return CheckResult{}, err
	}
	// query runs an exact comparison unless the fingerprints proved its
	// answer: nothing missing, nothing different.
	query := func(policy pgstore.JoinPolicy, q string, args ...any) (n int64, sample []string, err error) {
		if proven {
			return 0, nil, nil
		}
		err = c.WithJoins(ctx, tx, policy, func() (err error) {
			n, sample, err = pgstore.CountSample(ctx, tx, q, args...)
			return err
		})
		return n, sample, err
	}
	missingT, s, err := query(pgstore.JoinsIfLarge, c.MissingFromTargetSQL())
	if err != nil {
		return CheckResult{}, c.Errorf("staged rows missing from target: %w", err)
	}
	add("not in target: ", s)
	detail["staged_missing_from_target"] = missingT
	expected := []string{"0 staged rows missing from target"}
	actual := []string{fmt.Sprintf("%d staged rows missing from target", missingT)}
	passed := missingT == 0

	if v.CompareContent {
		wins := c.SourceWins("s", "t")
		var differ int64
		if wins == "false" {
			detail["content"] = "not compared: the target wins every conflict (TargetWins)"
		} else {
			differ, s, err = query(pgstore.JoinsIfLarge, c.DifferingContentSQL(wins))
			if err != nil {
				return CheckResult{}, c.Errorf("content: %w", err)
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
		var a pgstore.SQLArgs
		bounds, err := c.InChunk("t", &a)
		if err != nil {
			return CheckResult{}, err
		}
		missingS, s, err := query(pgstore.JoinsAllowed, c.MissingFromStagingSQL(bounds), a...)
		if err != nil {
			return CheckResult{}, c.Errorf("target rows missing from staging: %w", err)
		}
		add("not in staging: ", s)
		detail["target_missing_from_staging"] = missingS
		expected = append(expected, "0 target rows missing from staging")
		actual = append(actual, fmt.Sprintf("%d target rows missing from staging", missingS))
		passed = passed && missingS == 0
	}
	proof.Evidence(detail)
	return c.Result(passed, strings.Join(expected, "; "), strings.Join(actual, "; "), sample, detail)
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
	// ("sales.customers"), in the form of [Target.Table] (quote a part
	// that holds a dot: `"we.ird".customers`). Required.
	ParentTable string
	// ParentColumns are the referenced columns, in the order of Columns;
	// empty means the same names as Columns. Give the parent an index on
	// them (a primary key or unique constraint does).
	ParentColumns []string
}

// Validate implements [Validator].
func (v ReferentialIntegrity) Validate(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (CheckResult, error) {
	c, err := pgstore.NewPGCheck(cmp.Or(v.Name, "referential_integrity"), v.Severity, scope)
	if err != nil {
		return CheckResult{}, err
	}
	parentCols := pgstore.CmpOrSlice(v.ParentColumns, v.Columns)
	switch {
	case len(v.Columns) == 0:
		return CheckResult{}, c.Errorf("%w: ReferentialIntegrity.Columns is required", ErrInvalidConfig)
	case v.ParentTable == "":
		return CheckResult{}, c.Errorf("%w: ReferentialIntegrity.ParentTable is required", ErrInvalidConfig)
	case len(parentCols) != len(v.Columns):
		return CheckResult{}, c.Errorf("%w: ReferentialIntegrity.ParentColumns has %d columns, Columns %d", ErrInvalidConfig, len(parentCols), len(v.Columns))
	}
	if _, _, err := sqlgen.ParseTable(v.ParentTable); err != nil {
		return CheckResult{}, c.Errorf("%w: ReferentialIntegrity.ParentTable: %w", ErrInvalidConfig, err)
	}
	q := c.OrphansSQL(v.Columns, v.ParentTable, parentCols)
	var n int64
	var sample []string
	err = c.WithJoins(ctx, tx, pgstore.JoinsAllowed, func() (err error) {
		n, sample, err = pgstore.CountSample(ctx, tx, q)
		return err
	})
	if err != nil {
		return CheckResult{}, c.Errorf("%w", err)
	}
	return c.Result(n == 0, "0 orphan rows", fmt.Sprintf("%d orphan rows", n), sample, map[string]any{
		"columns": v.Columns, "parent_table": v.ParentTable, "parent_columns": parentCols, "orphans": n,
	})
}

// Measure is a column that [Aggregates] sums per group.
type Measure = backfilltype.Measure

// Aggregates compares, per group, what was staged with what the target
// holds for the staged identities: the row count, and for each Measure the
// exact sum of its finite values, its counts of NaN, Infinity and
// -Infinity, and its count of NULLs. Counts must match exactly; sums may
// differ by at most the measure's Tolerance. A group is the day of the
// Day column and the values of the Dimensions; the zero value compares
// the chunk's row counts. The target side holds what the merge left, so
// under [TargetWins] and [NewerVersionWins] a staged row that lost shows
// up as a difference. Sample lists the differing groups:
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
	c, err := pgstore.NewPGCheck(cmp.Or(v.Name, "aggregates"), v.Severity, scope)
	if err != nil {
		return CheckResult{}, err
	}
	for _, n := range append(append([]string{v.Day}, v.Dimensions...), pgstore.MeasureColumns(v.Measures)...) {
		if _, ok := c.Cols[n]; n != "" && !ok {
			return CheckResult{}, c.Errorf("%w: column %q is not a staged column of %s", ErrInvalidConfig, n, scope.Info.Target.Table)
		}
	}
	var a pgstore.SQLArgs
	day, zone, err := v.day(c, &a)
	if err != nil {
		return CheckResult{}, err
	}
	for _, m := range v.Measures {
		if m.Tolerance < 0 || math.IsNaN(m.Tolerance) {
			return CheckResult{}, c.Errorf("%w: Measure %q: Tolerance must be a number >= 0", ErrInvalidConfig, m.Column)
		}
	}
	q := c.AggregatesSQL(day, v.Dimensions, v.Measures, &a)
	detail := v.detail(zone)
	proof, proven, err := c.ProvenBy(ctx, tx, v.Exact, append(append([]string{v.Day}, v.Dimensions...), pgstore.MeasureColumns(v.Measures)...)...)
	if err != nil {
		return CheckResult{}, err
	}
	if proven {
		// Equal rows: every group's count, sums and NULL counts are equal.
		detail["differing"], detail["differences"] = 0, []any{}
		proof.Evidence(detail)
		return c.Result(true, "0 differing groups", "0 differing groups (staged and target rows equal by fingerprint)", nil, detail)
	}
	r, err := v.compare(ctx, tx, c, q, a)
	if err != nil {
		return CheckResult{}, c.Errorf("%w", err)
	}
	detail["groups"], detail["differing"], detail["differences"] = r.Groups, r.Differing, r.Differences
	proof.Evidence(detail)
	return c.Result(r.Differing == 0, "0 differing groups", fmt.Sprintf("%d of %d groups differ", r.Differing, r.Groups), r.Sample, detail)
}

// day returns the expression of the Day column's calendar day of an
// alias (nil without Day), and the zone it is taken in ("" for none),
// bound in a.
func (v Aggregates) day(c *pgstore.PGCheck, a *pgstore.SQLArgs) (day func(alias string) string, zone string, err error) {
	if v.Day == "" {
		return nil, "", nil
	}
	switch base := c.Cols[v.Day].BaseType; base {
	case "timestamptz", "":
		z, err := c.Zone()
		if err != nil {
			return nil, "", err
		}
		p := a.Bind(z)
		return func(alias string) string {
			return fmt.Sprintf("date_trunc('day', %s.%s AT TIME ZONE %s::text)::date", alias, sqlgen.Ident(v.Day), p)
		}, z, nil
	case "timestamp":
		return func(alias string) string { return fmt.Sprintf("%s.%s::date", alias, sqlgen.Ident(v.Day)) }, "", nil
	case "date":
		return func(alias string) string { return alias + "." + sqlgen.Ident(v.Day) }, "", nil
	}
	return nil, "", c.Errorf("%w: Aggregates.Day %q is %s, not a timestamp, timestamptz or date", ErrInvalidConfig, v.Day, c.Cols[v.Day].Type)
}

// detail is the evidence every Aggregates result has: the group
// columns, measures, tolerances and zone.
func (v Aggregates) detail(zone string) map[string]any {
	var groupNames []string
	if v.Day != "" {
		groupNames = append(groupNames, "day("+v.Day+")")
	}
	groupNames = append(groupNames, v.Dimensions...)
	tolerances := map[string]float64{}
	for _, m := range v.Measures {
		tolerances[m.Column] = m.Tolerance
	}
	detail := map[string]any{"group_by": pgstore.CmpOrSlice(groupNames, []string{}), "measures": pgstore.MeasureColumns(v.Measures), "tolerances": tolerances}
	if zone != "" {
		detail["zone"] = zone
	}
	return detail
}

// compare runs q (pgstore.AggregatesSQL) with args and collects the differing
// groups, with hash joins for a large chunk and, for float measures,
// extra_float_digits pinned (see aggregatesSideSQL), both undone afterwards.
func (v Aggregates) compare(ctx context.Context, tx sqlx.ExtContext, c *pgstore.PGCheck, q string, args []any) (r pgstore.AggregatesResult, err error) {
	r.Differences = []pgstore.AggregatesDifference{}
	floats := false
	for _, m := range v.Measures {
		if b := c.Cols[m.Column].BaseType; b == "float4" || b == "float8" {
			floats = true
		}
	}
	err = c.WithJoins(ctx, tx, pgstore.JoinsIfLarge, func() (err error) {
		if floats {
			// Shortest exact float text for the sums (see aggregatesSideSQL),
			// whatever the session's setting; undone with the savepoint.
			if _, err := tx.ExecContext(ctx, `SAVEPOINT backfill_floats; SELECT set_config('extra_float_digits', '1', true)`); err != nil {
				return fmt.Errorf("savepoint: %w", err)
			}
			defer func() {
				_, rerr := tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_floats; RELEASE SAVEPOINT backfill_floats`)
				if rerr != nil && err == nil {
					err = fmt.Errorf("rollback to savepoint: %w", rerr)
				}
			}()
		}
		rows, err := tx.QueryxContext(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := v.scan(rows, &r); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	return r, err
}

// scan reads one row of pgstore.AggregatesSQL into r: the group counts, and
// the differing group it lists, if any, with a sample line naming what
// differs.
func (v Aggregates) scan(rows *sqlx.Rows, r *pgstore.AggregatesResult) error {
	var grp sql.NullString
	var sn, tn sql.NullInt64
	var ssv, tsv []sql.NullString
	var szv, tzv pq.Int64Array
	var mbad pq.BoolArray
	if err := rows.Scan(&r.Groups, &r.Differing, &grp, &sn, &tn, pq.Array(&ssv), pq.Array(&tsv), &szv, &tzv, &mbad); err != nil {
		return err
	}
	if !grp.Valid {
		return nil // no differing group
	}
	d := pgstore.AggregatesDifference{Group: grp.String, Staged: pgstore.AggregatesSide{Count: sn.Int64, Sums: map[string]any{}, Nulls: map[string]int64{}},
		Target: pgstore.AggregatesSide{Count: tn.Int64, Sums: map[string]any{}, Nulls: map[string]int64{}}}
	var parts []string
	if sn.Int64 != tn.Int64 {
		parts = append(parts, fmt.Sprintf("count staged %d target %d", sn.Int64, tn.Int64))
	}
	for i, m := range v.Measures {
		d.Staged.Sums[m.Column], d.Target.Sums[m.Column] = pgstore.NullText(ssv[i]), pgstore.NullText(tsv[i])
		d.Staged.Nulls[m.Column], d.Target.Nulls[m.Column] = szv[i], tzv[i]
		if mbad[i] {
			parts = append(parts, fmt.Sprintf("sum(%s) staged %s target %s", m.Column, pgstore.TextOrNull(ssv[i]), pgstore.TextOrNull(tsv[i])))
		}
		if szv[i] != tzv[i] {
			parts = append(parts, fmt.Sprintf("nulls(%s) staged %d target %d", m.Column, szv[i], tzv[i]))
		}
	}
	r.Differences = append(r.Differences, d)
	r.Sample = append(r.Sample, grp.String+": "+strings.Join(parts, ", "))
	return nil
}

// ReplayChangesNothing re-runs the chunk's merge on its staged rows, in a
// savepoint that is rolled back ([backfilldriver.Replayer]), and asserts
// that it would write nothing: 0 inserted, 0 updated, 0 History intervals
// closed. A merge that is not idempotent fails it, such as one into a
// target whose trigger normalises values. It compares as the merge does
// (values by each column's own equality); use [Completeness] with
// CompareContent to compare byte for byte.
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
	name := cmp.Or(v.Name, "replay_changes_nothing")
	rp, ok := scope.Stager.(backfilldriver.Replayer)
	if !ok {
		return CheckResult{}, fmt.Errorf("backfill: validate %s: %w: the chunk's stager (%T) cannot replay its merge", name, ErrUnsupported, scope.Stager)
	}
	var r backfilltype.MergeResult
	replay := func() (err error) {
		r, err = rp.Replay(ctx)
		return err
	}
	c := &pgstore.PGCheck{Name: name, Severity: pgstore.SeverityOr(v.Severity)}
	var err error
	var proof *pgstore.FingerprintProof
	if scope.Staging != "" {
		c, err = pgstore.NewPGCheck(name, v.Severity, scope)
		if err != nil {
			return CheckResult{}, err
		}
		_, memo := scope.Stager.(pgstore.FingerprintMemo)
		if mode := scope.Info.Target.Mode; memo && mode != History {
			// The proof stands in for the replay where the merge's writes
			// follow from row equality alone: it inserts the staged rows
			// whose identity the target lacks and updates those its
			// change detection finds different. History also re-tiles
			// intervals, which the staged rows do not show: it replays.
			var proven bool
			proof, proven, err = c.ProvenBy(ctx, tx, v.Exact)
			if err != nil {
				return CheckResult{}, err
			}
			if proven {
				if mode == Upsert || mode == "" {
					r.Unchanged = proof.Staged.Rows
				}
				return v.result(c, r, proof)
			}
		}
		// A large chunk replays faster with hash joins: as many lookups as
		// rows otherwise.
		err = c.WithJoins(ctx, tx, pgstore.JoinsIfLarge, replay)
	} else {
		err = replay()
	}
	if err != nil {
		return CheckResult{}, fmt.Errorf("backfill: validate %s: %w", name, err)
	}
	return v.result(c, r, proof)
}

func (v ReplayChangesNothing) result(c *pgstore.PGCheck, r backfilltype.MergeResult, proof *pgstore.FingerprintProof) (CheckResult, error) {
	detail := map[string]any{"inserted": r.Inserted, "updated": r.Updated, "unchanged": r.Unchanged, "closed": r.Closed}
	if c.Staging != "" {
		proof.Evidence(detail)
	}
	return c.Result(r.Inserted == 0 && r.Updated == 0 && r.Closed == 0, "0 inserted, 0 updated, 0 closed",
		fmt.Sprintf("%d inserted, %d updated, %d closed", r.Inserted, r.Updated, r.Closed), nil, detail)
}

// DefaultSampleSize is the default of [Sample].N.
const DefaultSampleSize = 100

// Sample compares a deterministic pseudo-random sample of the staged rows
// with their target rows, column by column and NULL-safe (IS DISTINCT
// FROM). The sample is the N staged rows with the smallest
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
	c, err := pgstore.NewPGCheck(cmp.Or(v.Name, "sample"), v.Severity, scope)
	if err != nil {
		return CheckResult{}, err
	}
	if v.N < 0 {
		return CheckResult{}, c.Errorf("%w: Sample.N cannot be less than zero", ErrInvalidConfig)
	}
	n := cmp.Or(v.N, DefaultSampleSize)
	wins := c.SourceWins("s", "t")
	var a pgstore.SQLArgs
	q := c.SampleSQL(n, v.Seed, wins, &a)
	rows, err := tx.QueryxContext(ctx, q, a...)
	if err != nil {
		return CheckResult{}, c.Errorf("%w", err)
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
			return CheckResult{}, c.Errorf("%w", err)
		}
		sampled++
		switch {
		case d.Missing:
			differences = append(differences, d)
			if len(sample) < pgstore.MaxSample {
				sample = append(sample, d.Key+": not in target")
			}
		case len(cols) > 0:
			d.Columns = cols
			differences = append(differences, d)
			if len(sample) < pgstore.MaxSample {
				sample = append(sample, d.Key+": "+strings.Join(cols, ", "))
			}
		}
	}
	if err := rows.Err(); err != nil {
		return CheckResult{}, c.Errorf("%w", err)
	}
	detail := map[string]any{"sampled": sampled, "seed": v.Seed, "differing": len(differences), "differences": differences}
	if wins == "false" {
		detail["content"] = "not compared: the target wins every conflict (TargetWins)"
	} else {
		detail["content_columns"] = c.Content()
	}
	return c.Result(len(differences) == 0, fmt.Sprintf("0 of %d sampled rows differ", sampled),
		fmt.Sprintf("%d of %d sampled rows differ", len(differences), sampled), sample, detail)
}

// CheckExceptionRate is a quality gate on the exception queue of one
// chunk: it fails when the chunk's rejected rows divided by its read rows
// ([ValidationScope.Counts]) exceed MaxRate. A chunk that read nothing
// passes. It needs no database and runs with any merger, the fakes
// included. A rate over the whole run is not checked yet: every chunk is
// judged on its own.
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
	c := &pgstore.PGCheck{Name: cmp.Or(v.Name, "exception_rate"), Severity: pgstore.SeverityOr(v.Severity)}
	if !(v.MaxRate >= 0 && v.MaxRate <= 1) {
		return CheckResult{}, c.Errorf("%w: CheckExceptionRate.MaxRate %v is not between 0 and 1", ErrInvalidConfig, v.MaxRate)
	}
	read, rejected := scope.Counts.Read, scope.Counts.Rejected
	rate := 0.0
	if read > 0 {
		rate = float64(rejected) / float64(read)
	}
	return c.Result(rate <= v.MaxRate, fmt.Sprintf("rejected/read <= %g", v.MaxRate),
		fmt.Sprintf("%g (%d of %d rows rejected)", rate, rejected, read), nil, map[string]any{
			"read": read, "rejected": rejected, "rate": rate, "max_rate": v.MaxRate,
		})
}
