package pgstore

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
	"github.com/pgbackfill/backfill/internal/sqlgen"
	"github.com/pgbackfill/backfill/internal/suggest"
)

// AggregatesParams are the settings of backfill.Aggregates.
type AggregatesParams struct {
	// Name is CheckResult.Check; empty means "aggregates".
	Name string
	// Severity is CheckResult.Severity; empty means SeverityError.
	Severity backfilltype.Severity
	// Day, if set, names a staged timestamptz, timestamp or date column
	// whose calendar day is the first group column (see
	// [PGCheck.AggregatesDay]).
	Day string
	// Dimensions are further staged columns to group by.
	Dimensions []string
	// Measures are the columns summed per group.
	Measures []backfilltype.Measure
	// Exact computes the groups' figures even when the chunk's
	// fingerprints show the staged and target rows equal.
	Exact bool
}

// Aggregates compares, per group (p.Day's day, then p.Dimensions), the
// staged rows with the target rows of the staged identities: the row
// count, and per Measure the exact sum of its finite values, its counts
// of NaN, Infinity and -Infinity, and its count of NULLs. Counts must be
// equal, sums within the measure's Tolerance; it passes when no group
// differs. Unless p.Exact, equal fingerprints covering Day, Dimensions
// and Measures pass it without computing the groups. Sample lists up to
// 10 differing groups ("(2024-03-01,EU): sum(amount) staged 35.00
// target 30.00"); Detail holds the group columns, measures, tolerances,
// zone, the counts of groups and every difference. It returns an error
// wrapping [backfilltype.ErrInvalidConfig] for a column that is not
// staged, a Day column of another type, a negative or NaN Tolerance, or
// a Day on a timestamptz column with a zone PostgreSQL cannot name.
func Aggregates(ctx context.Context, tx sqlx.ExtContext, scope backfilldriver.ValidationScope, p AggregatesParams) (backfilltype.CheckResult, error) {
	c, err := NewPGCheck(cmp.Or(p.Name, "aggregates"), p.Severity, scope)
	if err != nil {
		return backfilltype.CheckResult{}, err
	}
	for _, n := range append(append([]string{p.Day}, p.Dimensions...), measureColumns(p.Measures)...) {
		if _, ok := c.Cols[n]; n != "" && !ok {
			staged := make([]string, len(scope.Info.Columns))
			for i, col := range scope.Info.Columns {
				staged[i] = col.Name
			}
			return backfilltype.CheckResult{}, c.errorf("%w: column %q is not a staged column of %s; %s", backfilltype.ErrInvalidConfig, n, scope.Info.Target.Table,
				suggest.List("the staged columns are", n, staged))
		}
	}
	var a SQLArgs
	day, zone, err := c.AggregatesDay(p.Day, &a)
	if err != nil {
		return backfilltype.CheckResult{}, err
	}
	for _, m := range p.Measures {
		if m.Tolerance < 0 || math.IsNaN(m.Tolerance) {
			return backfilltype.CheckResult{}, c.errorf("%w: Measure %q: Tolerance must be a number >= 0", backfilltype.ErrInvalidConfig, m.Column)
		}
	}
	q := c.AggregatesSQL(day, p.Dimensions, p.Measures, &a)
	detail := aggregatesDetail(p, zone)
	proof, proven, err := c.provenBy(ctx, tx, p.Exact, append(append([]string{p.Day}, p.Dimensions...), measureColumns(p.Measures)...)...)
	if err != nil {
		return backfilltype.CheckResult{}, err
	}
	if proven {
		// Equal rows: every group's count, sums and NULL counts are equal.
		detail["differing"], detail["differences"] = 0, []any{}
		proof.Evidence(detail)
		return c.result(true, "0 differing groups", "0 differing groups (staged and target rows equal by fingerprint)", nil, detail)
	}
	r, err := compareAggregates(ctx, tx, c, p.Dimensions, p.Measures, q, a)
	if err != nil {
		return backfilltype.CheckResult{}, c.errorf("%w", err)
	}
	detail["groups"], detail["differing"], detail["differences"] = r.Groups, r.Differing, r.Differences
	proof.Evidence(detail)
	return c.result(r.Differing == 0, "0 differing groups", fmt.Sprintf("%d of %d groups differ", r.Differing, r.Groups), r.Sample, detail)
}

// AggregatesDay returns the expression of the calendar day of staged
// column col (Aggregates' Day) of an alias, and the zone it is taken in
// ("" for none), binding the zone in a: for timestamptz the day in the
// scope's zone, date_trunc('day', col AT TIME ZONE zone); a timestamp's
// date; a date itself. With col "" it returns a nil expression. It
// returns an error wrapping [backfilltype.ErrInvalidConfig] for a column
// of another type, or a timestamptz one when the scope's zone is
// time.Local.
func (c *PGCheck) AggregatesDay(col string, a *SQLArgs) (day func(alias string) string, zone string, err error) {
	if col == "" {
		return nil, "", nil
	}
	switch base := c.Cols[col].BaseType; base {
	case "timestamptz", "":
		z, err := c.Zone()
		if err != nil {
			return nil, "", err
		}
		p := a.Bind(z)
		return func(alias string) string {
			return fmt.Sprintf("date_trunc('day', %s.%s AT TIME ZONE %s::text)::date", alias, sqlgen.Ident(col), p)
		}, z, nil
	case "timestamp":
		return func(alias string) string { return fmt.Sprintf("%s.%s::date", alias, sqlgen.Ident(col)) }, "", nil
	case "date":
		return func(alias string) string { return alias + "." + sqlgen.Ident(col) }, "", nil
	}
	return nil, "", c.errorf("%w: Aggregates.Day %q is %s, not a timestamp, timestamptz or date", backfilltype.ErrInvalidConfig, col, c.Cols[col].Type)
}

// aggregatesDetail is the evidence every Aggregates result has: the group
// columns, measures, tolerances and zone.
func aggregatesDetail(p AggregatesParams, zone string) map[string]any {
	var groupNames []string
	if p.Day != "" {
		groupNames = append(groupNames, "day("+p.Day+")")
	}
	groupNames = append(groupNames, p.Dimensions...)
	tolerances := map[string]float64{}
	for _, m := range p.Measures {
		tolerances[m.Column] = m.Tolerance
	}
	detail := map[string]any{"group_by": cmpOrSlice(groupNames, []string{}), "measures": measureColumns(p.Measures), "tolerances": tolerances}
	if zone != "" {
		detail["zone"] = zone
	}
	return detail
}

// compareAggregates runs q (AggregatesSQL of measures) with args and
// collects the differing groups, with hash joins for a large chunk and,
// for float measures and dimensions grouped by their text (groupForm),
// extra_float_digits pinned (see aggregatesSideSQL), both undone
// afterwards.
func compareAggregates(ctx context.Context, tx sqlx.ExtContext, c *PGCheck, dims []string, measures []backfilltype.Measure, q string, args []any) (r aggregatesResult, err error) {
	r.Differences = []aggregatesDifference{}
	floats := false
	for _, m := range measures {
		if b := c.Cols[m.Column].BaseType; b == "float4" || b == "float8" {
			floats = true
		}
	}
	for _, d := range dims {
		if col := c.Cols[d]; !exactEquality(col) && col.BaseType != "" && !c.collated(d) {
			floats = true // a float's text, in the dimension, is exact
		}
	}
	err = c.withJoins(ctx, tx, joinsIfLarge, func() (err error) {
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
			if err := scanAggregates(rows, measures, &r); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	return r, err
}

// scanAggregates reads one row of AggregatesSQL of measures into r: the
// group counts, and the differing group it lists, if any, with a sample
// line naming what differs.
func scanAggregates(rows *sqlx.Rows, measures []backfilltype.Measure, r *aggregatesResult) error {
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
	d := aggregatesDifference{Group: grp.String, Staged: aggregatesSide{Count: sn.Int64, Sums: map[string]any{}, Nulls: map[string]int64{}},
		Target: aggregatesSide{Count: tn.Int64, Sums: map[string]any{}, Nulls: map[string]int64{}}}
	var parts []string
	if sn.Int64 != tn.Int64 {
		parts = append(parts, fmt.Sprintf("count staged %d target %d", sn.Int64, tn.Int64))
	}
	for i, m := range measures {
		d.Staged.Sums[m.Column], d.Target.Sums[m.Column] = nullText(ssv[i]), nullText(tsv[i])
		d.Staged.Nulls[m.Column], d.Target.Nulls[m.Column] = szv[i], tzv[i]
		if mbad[i] {
			parts = append(parts, fmt.Sprintf("sum(%s) staged %s target %s", m.Column, textOrNull(ssv[i]), textOrNull(tsv[i])))
		}
		if szv[i] != tzv[i] {
			parts = append(parts, fmt.Sprintf("nulls(%s) staged %d target %d", m.Column, szv[i], tzv[i]))
		}
	}
	r.Differences = append(r.Differences, d)
	r.Sample = append(r.Sample, grp.String+": "+strings.Join(parts, ", "))
	return nil
}

// aggregatesSide is one side's figures of a differing group.
type aggregatesSide struct {
	Count int64            `json:"count"`
	Sums  map[string]any   `json:"sums,omitempty"`
	Nulls map[string]int64 `json:"nulls,omitempty"`
}

// aggregatesDifference is a differing group in the evidence.
type aggregatesDifference struct {
	Group  string         `json:"group"`
	Staged aggregatesSide `json:"staged"`
	Target aggregatesSide `json:"target"`
}

// aggregatesResult is what the comparison of the groups found.
type aggregatesResult struct {
	Groups, Differing int64                  `json:"-" db:"-"`
	Differences       []aggregatesDifference `json:"-" db:"-"`
	Sample            []string               `json:"-" db:"-"`
}

// measureColumns returns the columns of ms.
func measureColumns(ms []backfilltype.Measure) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Column
	}
	return out
}

// nullText returns s as a JSON value: its text, or nil for NULL.
func nullText(s sql.NullString) any {
	if !s.Valid {
		return nil
	}
	return s.String
}

// textOrNull returns s's text, or "NULL".
func textOrNull(s sql.NullString) string {
	if !s.Valid {
		return "NULL"
	}
	return s.String
}
