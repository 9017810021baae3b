package pgstore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
	"github.com/pgbackfill/backfill/internal/suggest"
)

// maxSample is how many offending keys or groups a CheckResult lists.
const maxSample = 10

// PGCheck is one run of a check: its name, severity and the scope's
// quoted tables.
type PGCheck struct {
	// Name is the check's name: CheckResult.Check, and the name in its
	// errors.
	Name string `json:"-" db:"-"`
	// Severity is CheckResult.Severity, never empty.
	Severity backfilltype.Severity `json:"-" db:"-"`
	scope    backfilldriver.ValidationScope
	target   string // quoted target table
	// Staging is the quoted staging table (scope.Staging).
	Staging string `json:"-" db:"-"`
	// Cols are the staged columns (scope.Info.Columns) by name.
	Cols  map[string]backfilltype.Column `json:"-" db:"-"`
	sizes *[2]int64                      // staging and target sizes in bytes, once known
}

// NewPGCheck returns the run of check name on scope, with severity sev
// (empty: SeverityError). It returns an error wrapping
// [backfilltype.ErrUnsupported] when scope has no staging table, and one
// wrapping [backfilltype.ErrInvalidConfig] when the target has no Key:
// the checks join staging with the target by identity.
func NewPGCheck(name string, sev backfilltype.Severity, scope backfilldriver.ValidationScope) (*PGCheck, error) {
	c := &PGCheck{Name: name, Severity: SeverityOr(sev), scope: scope, target: sqlgen.Table(scope.Info.Target.Table),
		Staging: scope.Staging, Cols: map[string]backfilltype.Column{}}
	if scope.Staging == "" {
		return nil, c.errorf("%w: the merger has no staging table (this check needs PGMerger)", backfilltype.ErrUnsupported)
	}
	if len(scope.Info.Target.Key) == 0 {
		return nil, c.errorf("%w: the target has no Key", backfilltype.ErrInvalidConfig)
	}
	for _, col := range scope.Info.Columns {
		c.Cols[col.Name] = col
	}
	return c, nil
}

// namedColumns checks the names a check's configuration gives: table (in
// the form of Target.Table) must exist and have every column of cols,
// which the check's field role names ("DuplicateKeys.Columns"). Otherwise
// it returns an error wrapping [backfilltype.ErrInvalidConfig] that names
// what is missing with where it was looked for: the search_path and its
// tables, or the table's columns, with the closest name. It reads the
// catalogs only, so that a typo does not abort the chunk's transaction
// with an SQL error.
func (c *PGCheck) namedColumns(ctx context.Context, tx sqlx.ExtContext, role, table string, cols []string) error {
	var have []struct {
		Name string `db:"attname"`
	}
	var rel []int64
	if err := sqlx.SelectContext(ctx, tx, &rel, `SELECT to_regclass($1)::oid::bigint WHERE to_regclass($1) IS NOT NULL`, sqlgen.Table(table)); err != nil {
		return c.errorf("%s: table %q: %w", role, table, err)
	}
	if len(rel) == 0 {
		return c.errorf("%w: %s: table %q: %s", backfilltype.ErrInvalidConfig, role, table, whereTables(ctx, tx, table))
	}
	if err := sqlx.SelectContext(ctx, tx, &have, `SELECT attname::text AS attname FROM pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, rel[0]); err != nil {
		return c.errorf("%s: columns of %q: %w", role, table, err)
	}
	names := make([]string, len(have))
	for i, h := range have {
		names[i] = h.Name
	}
	for _, n := range cols {
		if !slices.Contains(names, n) {
			return c.errorf("%w: %s: column %q of table %q: no such column; %s", backfilltype.ErrInvalidConfig, role, n, table, suggest.List("the table's columns are", n, names))
		}
	}
	return nil
}

// errorf returns an error prefixed "backfill: validate <name>: ".
func (c *PGCheck) errorf(format string, args ...any) error {
	return fmt.Errorf("backfill: validate %s: "+format, append([]any{c.Name}, args...)...)
}

// result returns the check's evidence, with detail marshalled as JSON
// (none: nil).
func (c *PGCheck) result(passed bool, expected, actual string, sample []string, detail map[string]any) (backfilltype.CheckResult, error) {
	r := backfilltype.CheckResult{Check: c.Name, Severity: c.Severity, Passed: passed, Expected: expected, Actual: actual, Sample: sample}
	if detail != nil {
		b, err := json.Marshal(detail)
		if err != nil {
			return backfilltype.CheckResult{}, c.errorf("detail: %w", err)
		}
		r.Detail = b
	}
	return r, nil
}

// SeverityOr returns s, or SeverityError when s is empty: a check's
// severity.
func SeverityOr(s backfilltype.Severity) backfilltype.Severity {
	return cmp.Or(s, backfilltype.SeverityError)
}

// cmpOrSlice returns v, or def when v is empty.
func cmpOrSlice[T any](v, def []T) []T {
	if len(v) == 0 {
		return def
	}
	return v
}

// Zone returns the name of the scope's zone for PostgreSQL.
func (c *PGCheck) Zone() (string, error) {
	loc := c.scope.Zone
	if loc == nil {
		loc = time.UTC
	}
	if loc == time.Local || loc.String() == "Local" {
		return "", c.errorf("%w: Job.Zone is time.Local, whose name PostgreSQL does not know; use time.LoadLocation", backfilltype.ErrInvalidConfig)
	}
	return loc.String(), nil
}

// joinPolicy says which join methods a check's query may use.
type joinPolicy int

const (
	// joinsAsMerged keeps the merge's settings: index nested loops only.
	joinsAsMerged joinPolicy = iota
	// joinsIfLarge allows hash and merge joins when the chunk is large
	// next to the target (see largeChunk).
	joinsIfLarge
	// joinsAllowed always allows them: the query probes staging, which has
	// no index, or a table that may lack one.
	joinsAllowed
)

// largeChunkRatio: a chunk whose staging table is at least 1/8 of the
// target's size joins faster by hashing than by one index lookup per row.
const largeChunkRatio = 8

// largeChunk reports whether the staging table is at least
// 1/largeChunkRatio of the target's size (pg_relation_size, PostgreSQL
// docs, 9.27.7 "Database Object Management Functions": a stat of the
// files, no scan). Then one index lookup per staged row costs more than
// hashing; for a small chunk next to a large target an index lookup per
// row is what keeps checks proportional to the chunk.
func (c *PGCheck) largeChunk(ctx context.Context, tx sqlx.ExtContext) (bool, error) {
	return c.stagingAtLeast(ctx, tx, largeChunkRatio)
}

// stagingAtLeast reports whether the staging table is at least 1/ratio
// of the target's size (pg_relation_size, see largeChunk); the sizes are
// read once per check.
func (c *PGCheck) stagingAtLeast(ctx context.Context, tx sqlx.ExtContext, ratio int64) (bool, error) {
	if c.sizes == nil {
		var sz struct {
			Staging int64 `db:"staging"`
			Target  int64 `db:"target"`
		}
		err := sqlx.GetContext(ctx, tx, &sz, `SELECT pg_relation_size($1::regclass) AS staging, pg_relation_size($2::regclass) AS target`,
			c.Staging, c.target)
		if err != nil {
			return false, fmt.Errorf("table sizes: %w", err)
		}
		c.sizes = &[2]int64{sz.Staging, sz.Target}
	}
	return c.sizes[0]*ratio >= c.sizes[1], nil
}

// withJoins runs fn with hash and merge joins enabled when policy says
// so. The merge turns them off for the rest of the chunk's transaction
// (index nested loops suit its lookups into the target), but a check that
// probes staging, which has no index, from the target side needs them,
// and a large chunk joins faster with them. The settings are made inside
// a savepoint that is rolled back afterwards, restoring them (PostgreSQL
// docs, SET: "The effects of SET or SET LOCAL are also canceled by
// rolling back to a savepoint that is earlier than the command"); tx must
// be a transaction.
func (c *PGCheck) withJoins(ctx context.Context, tx sqlx.ExtContext, policy joinPolicy, fn func() error) (err error) {
	if policy == joinsIfLarge {
		large, err := c.largeChunk(ctx, tx)
		if err != nil {
			return err
		}
		if !large {
			policy = joinsAsMerged
		}
	}
	if policy == joinsAsMerged {
		return fn()
	}
	if _, err := tx.ExecContext(ctx, `SAVEPOINT backfill_validate;
		SELECT set_config('enable_hashjoin', 'on', true), set_config('enable_mergejoin', 'on', true)`); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	defer func() {
		_, rerr := tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_validate; RELEASE SAVEPOINT backfill_validate`)
		if rerr != nil && err == nil {
			err = fmt.Errorf("rollback to savepoint: %w", rerr)
		}
	}()
	return fn()
}

// countSample runs q, which returns (k text, n bigint) rows: offending
// keys, at most maxSample, each with the total count of offenders
// (count(*) OVER ()). It returns the count (0 for no rows) and the keys.
func countSample(ctx context.Context, tx sqlx.ExtContext, q string, args ...any) (int64, []string, error) {
	rows, err := tx.QueryxContext(ctx, q, args...)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	var n int64
	var sample []string
	for rows.Next() {
		var k sql.NullString
		if err := rows.Scan(&k, &n); err != nil {
			return 0, nil, err
		}
		sample = append(sample, k.String)
	}
	return n, sample, errors.Join(rows.Err(), rows.Close())
}
