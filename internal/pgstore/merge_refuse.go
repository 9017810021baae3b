package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// Rows the target refuses at merge time (a unique index other than the
// key's, a CHECK, a foreign key, a NOT NULL, a raising trigger, a btree
// row too large, a data error): the merge runs in the savepoint
// backfill_refuse; on a refusal ([PGStager.refusal]) it rolls back and
// [Isolation] finds the refused rows, by set-based pre-checks naming
// suspects and by bisection inside savepoints, so that the rest of the
// chunk merges in row order. Refused rows go to the exception queue, at
// most TableInfo.Chunk.MaxRefused per chunk. Errors not about a row
// (transientClasses, the key's own unique index) still fail the chunk.
// The design note docs/design/merge.md explains the alternatives.

// DefaultMaxMergeRefusals is the default of backfill.Config.MaxMergeRefusals.
const DefaultMaxMergeRefusals = 100

// btreeMaxItem is the largest btree index tuple (bytes) at the default
// 8 kB block size (BTMaxItemSize, src/include/access/nbtree.h): the
// threshold of the oversized-key pre-check, which only names suspects.
const btreeMaxItem = 2704

// mergeRefusing merges the rows left in staging (res holds what the merge
// decided before writing: deduplicated rows, conflicts) and isolates rows
// the target refuses. It returns res completed.
func (s *PGStager) mergeRefusing(ctx context.Context, res backfilltype.MergeResult, dup bool) (backfilltype.MergeResult, error) {
	t := s.Info.Target
	n := s.staged - res.Deduplicated - int64(len(res.Rejected))
	if err := Later(ctx, s.tx, `SAVEPOINT backfill_refuse`); err != nil {
		return res, fmt.Errorf("backfill: merge %s: savepoint: %w", t.Table, err)
	}
	r, err := s.mergeStaged(ctx, n, dup)
	if err == nil {
		if err := Later(ctx, s.tx, `RELEASE SAVEPOINT backfill_refuse`); err != nil {
			return res, fmt.Errorf("backfill: merge %s: release savepoint: %w", t.Table, err)
		}
		res.Inserted, res.Updated, res.Unchanged, res.Closed, res.Disagreed = r.Inserted, r.Updated, r.Unchanged, r.Closed, r.Disagreed
		return res, nil
	}
	pe, ok := s.refusal(err)
	if !ok {
		return res, err
	}
	if rerr := s.rollbackRefuse(ctx); rerr != nil {
		return res, errors.Join(err, rerr)
	}
	if s.historyIndex(ctx, pe) {
		return res, err
	}
	if e := s.statementTrigger(ctx, pe, err); e != nil { // not a row's fault
		return res, e
	}
	iso := &Isolation{S: s, max: s.Info.Chunk.MaxRefused}
	if err := iso.run(ctx, n, pe, err); err != nil {
		return res, err
	}
	s.m.setFresh(t.Table, false)
	res.Inserted, res.Updated, res.Unchanged, res.Closed, res.Disagreed = iso.res.Inserted, iso.res.Updated, iso.res.Unchanged, iso.res.Closed, iso.res.Disagreed
	res.Rejected = append(res.Rejected, iso.refused...)
	return res, nil
}

func (s *PGStager) rollbackRefuse(ctx context.Context) error {
	if _, err := s.tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_refuse; RELEASE SAVEPOINT backfill_refuse`); err != nil {
		return fmt.Errorf("backfill: merge %s: rollback to savepoint: %w", s.Info.Target.Table, err)
	}
	return nil
}

// transientClasses are SQLSTATE classes that are never about a row:
// connection (08), transaction rollback (40), insufficient resources (53),
// object not in prerequisite state (55, lock timeouts), operator
// intervention (57, cancellation and shutdown), system errors (58),
// internal errors (XX).
var transientClasses = []string{"08", "40", "53", "55", "57", "58", "XX"}

// plpgsqlContext finds the PL/pgSQL functions in an error's context
// ("PL/pgSQL function audit_row() line 3 at RAISE").
var plpgsqlContext = regexp.MustCompile(`PL/pgSQL function ([^(\s]+)\(`)

// refusal reports whether err is the target refusing a row of the merge
// (see the top of this file) and returns PostgreSQL's error.
func (s *PGStager) refusal(err error) (*pq.Error, bool) {
	var pe *pq.Error
	if !errors.As(err, &pe) {
		return nil, false
	}
	code := string(pe.Code)
	if len(code) < 2 || slices.Contains(transientClasses, code[:2]) {
		return nil, false
	}
	switch {
	case code == "23505":
		// The business key's own index: a concurrent insert, retried.
		return pe, !slices.Contains(s.Info.KeyIndexes, pe.Constraint)
	case code[:2] == "22", code[:2] == "23", code[:2] == "P0", code == "54000":
		return pe, true
	case plpgsqlContext.MatchString(pe.Where):
		// A trigger (or a function a constraint calls) raised its own
		// SQLSTATE.
		return pe, true
	}
	return nil, false
}

// historyIndex reports whether pe, a refusal, is a unique violation in
// History mode of an index on business key columns only, such as the
// single-open-version index UNIQUE (key) WHERE valid_to IS NULL. The
// merge itself keeps such an invariant (it closes the old version when it
// inserts a new one): a violation is the merge's or a concurrent run's
// doing, not the row's, and fails the chunk as before. Called after the
// rollback to the savepoint, when the transaction can read the catalog.
func (s *PGStager) historyIndex(ctx context.Context, pe *pq.Error) bool {
	t := s.Info.Target
	if t.Mode != backfilltype.History || pe.Code != "23505" || pe.Constraint == "" {
		return false
	}
	var ok bool
	err := sqlx.GetContext(ctx, s.tx, &ok, `SELECT coalesce(bool_and(a.attname::text = ANY ($3::text[])), false)
		FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY ((i.indkey::int2[])[0:i.indnkeyatts - 1])
		WHERE i.indrelid = to_regclass($1) AND c.relname = $2`, sqlgen.Table(t.Table), pe.Constraint, pq.Array(t.Key))
	return err == nil && ok
}

// Isolation finds the rows the target refuses among a chunk's staged
// rows, which it moves to the held table numbered by _backfill_pos.
type Isolation struct {
	S       *PGStager `json:"-" db:"-"`
	max     int
	held    string // the quoted temporary table of the rows to merge
	cols    string // the staging columns, quoted, _backfill_row last
	res     backfilltype.MergeResult
	refused []backfilltype.Exception
	// triggers: function name -> the target's triggers calling it.
	triggers map[string]string
}

// run isolates the refused rows of the n staged rows; first and firstErr
// are the refusal of the merge of them all.
func (iso *Isolation) run(ctx context.Context, n int64, first *pq.Error, firstErr error) error {
	s := iso.S
	t := s.Info.Target
	suffix := strings.TrimSuffix(strings.TrimPrefix(s.Q.Stage, `pg_temp."backfill_stage_`), `"`)
	iso.held = "pg_temp." + sqlgen.Ident("backfill_held_"+suffix)
	names := make([]string, len(s.Info.Columns))
	for i, c := range s.Info.Columns {
		names[i] = c.Name
	}
	iso.cols = sqlgen.List("", names) + ", _backfill_row"
	// Indexed by position: a part is staged by one range scan of it.
	if _, err := s.tx.ExecContext(ctx, fmt.Sprintf(`CREATE TEMP TABLE IF NOT EXISTS %s (LIKE %s, _backfill_pos bigint PRIMARY KEY) ON COMMIT DELETE ROWS; TRUNCATE %s`,
		strings.TrimPrefix(iso.held, "pg_temp."), s.Q.Stage, iso.held)); err != nil {
		return fmt.Errorf("backfill: merge %s: isolate refused rows: %w", t.Table, err)
	}
	suspects := iso.Suspects(ctx)
	if suspects == nil {
		suspects = []int64{} // '{}', not NULL: no row is a suspect
	}
	if _, err := s.tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %[1]s (%[2]s, _backfill_pos)
		SELECT %[2]s, row_number() OVER (ORDER BY _backfill_row = ANY ($1::bigint[]), _backfill_row) FROM %[3]s`,
		iso.held, iso.cols, s.Q.Stage), pq.Array(suspects)); err != nil {
		return fmt.Errorf("backfill: merge %s: isolate refused rows: %w", t.Table, err)
	}
	var k int64 // rows that are not suspects: positions 1..k
	if err := sqlx.GetContext(ctx, s.tx, &k, fmt.Sprintf(`SELECT count(*) FROM %s WHERE NOT _backfill_row = ANY ($1::bigint[])`, iso.held), pq.Array(suspects)); err != nil {
		return fmt.Errorf("backfill: merge %s: isolate refused rows: %w", t.Table, err)
	}
	var known *pq.Error
	if k == n {
		known = first // the merge of these very rows failed already
	}
	if err := iso.bisect(ctx, 1, k+1, known, firstErr); err != nil {
		return err
	}
	for p := k + 1; p <= n; p++ {
		if err := iso.bisect(ctx, p, p+1, nil, nil); err != nil {
			return err
		}
	}
	// Staging holds the merged rows again, for checks and replays.
	if _, err := s.tx.ExecContext(ctx, fmt.Sprintf(`TRUNCATE %[1]s; INSERT INTO %[1]s (%[2]s) SELECT %[2]s FROM %[3]s`, s.Q.Stage, iso.cols, iso.held)); err != nil {
		return fmt.Errorf("backfill: merge %s: restage merged rows: %w", t.Table, err)
	}
	slices.SortStableFunc(iso.refused, func(a, b backfilltype.Exception) int { return int(a.Row - b.Row) })
	return nil
}

// bisect merges the held rows at positions [lo, hi), refusing those the
// target refuses. known, when set, is the refusal of a merge of exactly
// these rows (with err, the error that carried it).
func (iso *Isolation) bisect(ctx context.Context, lo, hi int64, known *pq.Error, knownErr error) error {
	if lo >= hi {
		return nil
	}
	pe, err := known, knownErr
	if pe == nil {
		var r backfilltype.MergeResult
		r, err = iso.try(ctx, lo, hi)
		if err == nil {
			iso.res.Inserted += r.Inserted
			iso.res.Updated += r.Updated
			iso.res.Unchanged += r.Unchanged
			iso.res.Closed += r.Closed
			iso.res.Disagreed += r.Disagreed
			return nil
		}
		var ok bool
		if pe, ok = iso.S.refusal(err); !ok {
			return err
		}
		if rerr := iso.S.rollbackRefuse(ctx); rerr != nil {
			return errors.Join(err, rerr)
		}
		if iso.S.historyIndex(ctx, pe) {
			return err
		}
		if e := iso.S.statementTrigger(ctx, pe, err); e != nil {
			return e
		}
	}
	if hi-lo == 1 {
		return iso.refuse(ctx, lo, pe, err)
	}
	mid := lo + (hi-lo)/2
	if err := iso.bisect(ctx, lo, mid, nil, nil); err != nil {
		return err
	}
	return iso.bisect(ctx, mid, hi, nil, nil)
}

// try stages the held rows at positions [lo, hi) and merges them inside
// the savepoint backfill_refuse, which it releases on success and leaves
// for the caller to roll back on error. Staging is emptied by TRUNCATE,
// not DELETE: deleted rows would stay in it, dead, until the transaction
// ends, and every later merge of the bisection would read them again.
func (iso *Isolation) try(ctx context.Context, lo, hi int64) (backfilltype.MergeResult, error) {
	s := iso.S
	t := s.Info.Target
	if _, err := s.tx.ExecContext(ctx, `SAVEPOINT backfill_refuse; TRUNCATE `+s.Q.Stage); err != nil {
		return backfilltype.MergeResult{}, fmt.Errorf("backfill: merge %s: savepoint: %w", t.Table, err)
	}
	if _, err := s.tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (%s) SELECT %s FROM %s WHERE _backfill_pos >= $1 AND _backfill_pos < $2`,
		s.Q.Stage, iso.cols, iso.cols, iso.held), lo, hi); err != nil {
		return backfilltype.MergeResult{}, fmt.Errorf("backfill: merge %s: stage rows: %w", t.Table, err)
	}
	r, err := s.mergeStaged(ctx, hi-lo, false)
	if err != nil {
		return r, err
	}
	if _, err := s.tx.ExecContext(ctx, `RELEASE SAVEPOINT backfill_refuse`); err != nil {
		return r, fmt.Errorf("backfill: merge %s: release savepoint: %w", t.Table, err)
	}
	return r, nil
}

// refuse queues the held row at pos, which the target refused with pe,
// and drops it from the rows to merge; past the bound it fails instead.
func (iso *Isolation) refuse(ctx context.Context, pos int64, pe *pq.Error, err error) error {
	s := iso.S
	t := s.Info.Target
	var row struct {
		Row int64  `db:"row"`
		Raw string `db:"raw"`
	}
	if err := sqlx.GetContext(ctx, s.tx, &row, fmt.Sprintf(`SELECT _backfill_row AS row, (to_jsonb(h) - '_backfill_row' - '_backfill_pos')::text AS raw FROM %s h WHERE _backfill_pos = $1`, iso.held), pos); err != nil {
		return fmt.Errorf("backfill: merge %s: refused row: %w", t.Table, err)
	}
	key := IdentityText(s.Info.Identity(), row.Raw)
	reason := iso.reason(ctx, pe)
	columns := ""
	if pe.Code == "54000" {
		var advice string
		columns, advice = iso.oversized(ctx, pos, pe)
		reason += advice
	} else {
		columns = iso.refusedColumns(ctx, pe)
	}
	value, reason := RefusedValue(s.Info.Identity(), columns, row.Raw, reason)
	if len(iso.refused) >= iso.max {
		return fmt.Errorf("backfill: merge %s: %w: row %d key %s %s; %d rows of this chunk were refused already (Config.MaxMergeRefusals) (%w: %w)",
			t.Table, backfilltype.ErrTooManyRejects, row.Row, key, reason, len(iso.refused), backfilltype.ErrNotRetryable, err)
	}
	if _, err := s.tx.ExecContext(ctx, fmt.Sprintf(`DELETE FROM %s WHERE _backfill_pos = $1`, iso.held), pos); err != nil {
		return fmt.Errorf("backfill: merge %s: refused row: %w", t.Table, err)
	}
	iso.refused = append(iso.refused, backfilltype.Exception{Row: row.Row, Raw: json.RawMessage(row.Raw), Column: columns, Value: value, Reason: reason})
	return nil
}

// indexRowTooLarge is PostgreSQL's message for an index entry over the
// largest any index can store (INDEX_SIZE_MASK), which names no index.
var indexRowTooLarge = regexp.MustCompile(`^index row requires (\d+) bytes, maximum size is (\d+)`)

// oversized names the index of a refusal for an index entry too large
// (54000) of the held row at pos, and its key columns, comma-separated;
// advice, appended to the reason, says which index and columns and what
// to do. PostgreSQL names the index of an entry over the btree limit; one
// over the limit of every index (8191 bytes) names none, so the row's
// entry for each index of the target is measured (pg_column_size of each
// of its columns or expressions, the values as the row stores them) and
// the largest one over the limit named. Both empty when none is found.
func (iso *Isolation) oversized(ctx context.Context, pos int64, pe *pq.Error) (columns, advice string) {
	name := pe.Constraint
	size := int64(0)
	if name != "" {
		columns = iso.refusedColumns(ctx, pe)
	} else {
		m := indexRowTooLarge.FindStringSubmatch(pe.Message)
		if m == nil { // another limit than an index entry's
			return iso.refusedColumns(ctx, pe), ""
		}
		limit, _ := strconv.ParseInt(m[2], 10, 64)
		name, columns, size = iso.largestEntry(ctx, pos, limit)
		if name == "" {
			return "", ""
		}
	}
	key := slices.Contains(iso.S.Info.KeyIndexes, name)
	var b strings.Builder
	fmt.Fprintf(&b, "; index %s on (%s)", strconv.Quote(name), columns)
	if key {
		b.WriteString(", the business key's index,")
	}
	if size > 0 {
		fmt.Fprintf(&b, " would get an entry of about %d bytes", size)
	} else {
		b.WriteString(" would get an entry over its limit")
	}
	if key {
		b.WriteString(": shorten the key's value, or make the key a hash of it (a key column holding e.g. md5 of the long value)")
	} else {
		fmt.Fprintf(&b, ": shorten the value, or index a hash of it (an index on md5(%s) instead)", columns)
	}
	return columns, b.String()
}

// largestEntry measures the entry the held row at pos would get in each
// valid index of the target and returns the largest over limit (bytes):
// the index's name, its key columns and the size.
// An index whose entry cannot be measured (an expression that fails, a
// column not staged) is skipped; "" when none is left.
func (iso *Isolation) largestEntry(ctx context.Context, pos, limit int64) (name, columns string, size int64) {
	tx := iso.S.tx
	if _, err := tx.ExecContext(ctx, `SAVEPOINT backfill_columns`); err != nil {
		return "", "", 0
	}
	defer func() { _, _ = tx.ExecContext(context.WithoutCancel(ctx), `RELEASE SAVEPOINT backfill_columns`) }()
	var idx []struct {
		Name  string         `db:"name"`
		Key   int            `db:"key"`
		Exprs pq.StringArray `db:"exprs"`
	}
	if err := sqlx.SelectContext(ctx, tx, &idx, `SELECT c.relname::text AS name, i.indnkeyatts AS key,
			ARRAY(SELECT pg_get_indexdef(i.indexrelid, k, true) FROM generate_series(1, i.indnatts) k ORDER BY k) AS exprs
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = to_regclass($1) AND i.indisvalid ORDER BY c.relname`, sqlgen.Table(iso.S.Info.Target.Table)); err != nil {
		_, _ = tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_columns`)
		return "", "", 0
	}
	for _, ix := range idx {
		sizes := make([]string, len(ix.Exprs))
		for i, e := range ix.Exprs {
			sizes[i] = "coalesce(pg_column_size((" + e + ")), 0)"
		}
		var n int64
		if _, err := tx.ExecContext(ctx, `SAVEPOINT backfill_entry`); err != nil {
			return name, columns, size
		}
		err := sqlx.GetContext(ctx, tx, &n, fmt.Sprintf(`SELECT %s FROM %s WHERE _backfill_pos = $1`, strings.Join(sizes, " + "), iso.held), pos)
		if err != nil {
			_, _ = tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_entry`)
		}
		_, _ = tx.ExecContext(context.WithoutCancel(ctx), `RELEASE SAVEPOINT backfill_entry`)
		if err != nil || n <= limit || n <= size {
			continue
		}
		name, columns, size = ix.Name, strings.Join(ix.Exprs[:ix.Key], ","), n
	}
	return name, columns, size
}

// keyDetail is the start of the detail of a unique or foreign key
// violation: "Key (a, b)=(1, 2) already exists."
var keyDetail = regexp.MustCompile(`^Key \((.+?)\)=\(`)

// refusedColumns names the columns of a refusal, comma-separated: the
// column PostgreSQL names, or those of the key in the detail of a unique,
// exclusion or foreign key violation, or else those of the constraint or
// index it names (a CHECK's columns; an index entry over the btree limit,
// 54000, names its index): an index's expressions are written as
// PostgreSQL does. "" when the error names none of these (a trigger).
func (iso *Isolation) refusedColumns(ctx context.Context, pe *pq.Error) string {
	if pe.Column != "" {
		return pe.Column
	}
	if m := keyDetail.FindStringSubmatch(pe.Detail); m != nil {
		return strings.ReplaceAll(m[1], ", ", ",")
	}
	if pe.Constraint == "" {
		return ""
	}
	// A catalog read in the chunk's transaction, in a savepoint: a failure
	// only leaves the columns out.
	tx := iso.S.tx
	if _, err := tx.ExecContext(ctx, `SAVEPOINT backfill_columns`); err != nil {
		return ""
	}
	var cols string
	err := sqlx.GetContext(ctx, tx, &cols, `SELECT coalesce(
		(SELECT string_agg(a.attname::text, ',' ORDER BY k.i)
			FROM pg_constraint co, unnest(co.conkey) WITH ORDINALITY k(attnum, i)
			JOIN pg_attribute a ON a.attnum = k.attnum
			WHERE co.conrelid = to_regclass($1) AND co.conname = $2 AND a.attrelid = co.conrelid),
		(SELECT string_agg(pg_get_indexdef(i.indexrelid, k, true), ',' ORDER BY k)
			FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid, generate_series(1, i.indnkeyatts) k
			WHERE i.indrelid = to_regclass($1) AND c.relname = $2),
		'')`, sqlgen.Table(iso.S.Info.Target.Table), pe.Constraint)
	if err != nil {
		cols = ""
		_, _ = tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_columns`)
	}
	_, _ = tx.ExecContext(context.WithoutCancel(ctx), `RELEASE SAVEPOINT backfill_columns`)
	return cols
}

// reason describes a refusal: PostgreSQL's message and SQLSTATE, the
// constraint, the trigger and the detail.
func (iso *Isolation) reason(ctx context.Context, pe *pq.Error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "refused by the target: %s (SQLSTATE %s)", pe.Message, pe.Code)
	if pe.Constraint != "" {
		fmt.Fprintf(&b, "; constraint %q", pe.Constraint)
	}
	if m := plpgsqlContext.FindAllStringSubmatch(pe.Where, -1); len(m) > 0 {
		// The outermost function is the last in the context.
		fn := m[len(m)-1][1]
		if tg := iso.triggerNames(ctx, fn); tg != "" {
			fmt.Fprintf(&b, "; trigger %s", tg)
		}
		where := strings.Split(pe.Where, "\n")
		fmt.Fprintf(&b, "; in %s", where[len(where)-1])
	}
	if pe.Detail != "" {
		fmt.Fprintf(&b, "; %s", pe.Detail)
	}
	return b.String()
}

// triggerNames returns the quoted names of the target's triggers that
// call the function fn, "" when none (a trigger of another table).
func (iso *Isolation) triggerNames(ctx context.Context, fn string) string {
	if names, ok := iso.triggers[fn]; ok {
		return names
	}
	if iso.triggers == nil {
		iso.triggers = map[string]string{}
	}
	name := fn
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[i+1:]
	}
	var names []string
	// A catalog read in the chunk's transaction, in a savepoint: a failure
	// only leaves the name out.
	tx := iso.S.tx
	if _, err := tx.ExecContext(ctx, `SAVEPOINT backfill_trigger`); err != nil {
		return ""
	}
	err := sqlx.SelectContext(ctx, tx, &names, `SELECT tg.tgname::text FROM pg_trigger tg JOIN pg_proc p ON p.oid = tg.tgfoid
		WHERE tg.tgrelid = to_regclass($1) AND NOT tg.tgisinternal AND p.proname = $2 ORDER BY 1`, sqlgen.Table(iso.S.Info.Target.Table), name)
	if err != nil {
		names = nil
		_, _ = tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_trigger`)
	}
	_, _ = tx.ExecContext(context.WithoutCancel(ctx), `RELEASE SAVEPOINT backfill_trigger`)
	for i, n := range names {
		names[i] = strconv.Quote(n)
	}
	iso.triggers[fn] = strings.Join(names, ", ")
	return iso.triggers[fn]
}

// Suspects runs the set-based pre-checks (see the top of this file) and
// returns the staged rows they name. A pre-check that fails (a CHECK
// expression that errors on a staged row) is skipped: bisection finds
// what it would have.
func (iso *Isolation) Suspects(ctx context.Context) []int64 {
	s := iso.S
	t := s.Info.Target
	target := sqlgen.Table(t.Table)
	staged := map[string]bool{}
	for _, c := range s.Info.Columns {
		staged[c.Name] = true
	}
	all := func(cols []string) bool {
		return len(cols) > 0 && !slices.ContainsFunc(cols, func(c string) bool { return !staged[c] })
	}
	if _, err := s.tx.ExecContext(ctx, `SAVEPOINT backfill_precheck`); err != nil {
		return nil
	}
	var rows []int64
	err := func() error {
		var idx []struct {
			Name    string         `db:"name"`
			Unique  bool           `db:"uniq"`
			Btree   bool           `db:"btree"`
			Key     pq.StringArray `db:"key"`
			Columns pq.StringArray `db:"columns"`
		}
		// Plain (no expression, no predicate) valid indexes: key columns
		// for uniqueness, every column (INCLUDE too) for the size.
		if err := sqlx.SelectContext(ctx, s.tx, &idx, `
			SELECT c.relname AS name, i.indisunique AS uniq, am.amname = 'btree' AS btree,
				array_agg(a.attname::text ORDER BY k.n) FILTER (WHERE k.n <= i.indnkeyatts) AS key,
				array_agg(a.attname::text ORDER BY k.n) AS columns
			FROM pg_index i
			JOIN pg_class c ON c.oid = i.indexrelid
			JOIN pg_am am ON am.oid = c.relam
			CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n)
			JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
			WHERE i.indrelid = to_regclass($1) AND i.indisvalid AND i.indexprs IS NULL AND i.indpred IS NULL
			GROUP BY c.relname, i.indisunique, am.amname`, target); err != nil {
			return err
		}
		var checks []struct {
			Expr    string         `db:"expr"`
			Columns pq.StringArray `db:"columns"`
		}
		if err := sqlx.SelectContext(ctx, s.tx, &checks, `
			SELECT pg_get_expr(co.conbin, co.conrelid) AS expr,
				ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = co.conrelid AND a.attnum = ANY (co.conkey)) AS columns
			FROM pg_constraint co WHERE co.conrelid = to_regclass($1) AND co.contype = 'c'`, target); err != nil {
			return err
		}
		identity := s.Info.Identity()
		var qs []string
		for _, ix := range idx {
			if ix.Btree && all(ix.Columns) {
				sizes := make([]string, len(ix.Columns))
				for i, c := range ix.Columns {
					sizes[i] = "coalesce(pg_column_size(s." + sqlgen.Ident(c) + "), 0)"
				}
				qs = append(qs, fmt.Sprintf(`SELECT s._backfill_row FROM %s s WHERE %s > %d`, s.Q.Stage, strings.Join(sizes, " + "), btreeMaxItem))
			}
			if !ix.Unique || !all(ix.Key) || slices.Contains(s.Info.KeyIndexes, ix.Name) {
				continue
			}
			notNull := make([]string, len(ix.Key))
			for i, c := range ix.Key {
				notNull[i] = "s." + sqlgen.Ident(c) + " IS NOT NULL"
			}
			// A later staged row with an earlier one's values (one sort,
			// not a join of staging with itself: staging has no index),
			// and a staged row with the values of a target row of another
			// identity that the chunk does not write (one index lookup per
			// staged row, through the unique index itself).
			qs = append(qs, fmt.Sprintf(`SELECT x._backfill_row FROM (
					SELECT s._backfill_row, row_number() OVER (PARTITION BY %[4]s ORDER BY s._backfill_row) AS n
					FROM %[1]s s WHERE %[3]s) x WHERE x.n > 1`,
				s.Q.Stage, target, strings.Join(notNull, " AND "), sqlgen.List("s.", ix.Key)),
				fmt.Sprintf(`SELECT s._backfill_row FROM %[1]s s WHERE %[3]s
					AND EXISTS (SELECT 1 FROM %[2]s t WHERE %[4]s AND NOT (%[5]s)
						AND NOT EXISTS (SELECT 1 FROM %[1]s o WHERE %[6]s))`,
					s.Q.Stage, target, strings.Join(notNull, " AND "), sqlgen.Equal("t", "s", ix.Key),
					sqlgen.Equal("t", "s", identity), sqlgen.Equal("o", "t", identity)))
		}
		for _, c := range checks {
			if all(c.Columns) {
				qs = append(qs, fmt.Sprintf(`SELECT s._backfill_row FROM %s s WHERE NOT (%s)`, s.Q.Stage, c.Expr))
			}
		}
		if len(qs) == 0 {
			return nil
		}
		return sqlx.SelectContext(ctx, s.tx, &rows, `SELECT DISTINCT _backfill_row FROM (`+strings.Join(qs, "\nUNION ALL\n")+`) x ORDER BY 1`)
	}()
	if err != nil {
		rows = nil
		_, _ = s.tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_precheck`)
	}
	_, _ = s.tx.ExecContext(context.WithoutCancel(ctx), `RELEASE SAVEPOINT backfill_precheck`)
	return rows
}

// IdentityText renders the identity columns of a JSON row as "(a, b)",
// numbers exactly as PostgreSQL printed them.
func IdentityText(identity []string, raw string) string {
	d := json.NewDecoder(strings.NewReader(raw))
	d.UseNumber()
	var m map[string]any
	if d.Decode(&m) != nil {
		return ""
	}
	parts := make([]string, len(identity))
	for i, k := range identity {
		parts[i] = jsonText(m[k])
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// RefusedValue returns the Value and Reason of the exception of a row the
// target refused (raw, the row as a JSON object, identity its key's
// columns): the values of the refused columns (comma-separated) as the
// value and the row's key added to reason; or, when no column is named or
// one is not a column of the row (an expression index), the key as the
// value and reason as it is.
func RefusedValue(identity []string, columns, raw, reason string) (value, withKey string) {
	key := IdentityText(identity, raw)
	v, ok := columnsText(strings.Split(columns, ","), raw)
	if !ok || columns == "" {
		return key, reason
	}
	if len(key) > maxReasonKey {
		key = ValidPrefix(key, maxReasonKey) + "…" // the reason is indexed; the row keeps the whole key
	}
	return v, reason + "; key " + key
}

// maxReasonKey is how many bytes of a refused row's key its reason shows.
const maxReasonKey = 100

// columnsText returns the values of columns in raw, a row as a JSON
// object: the value of one column as text, several as "(v1, v2)"; false
// when raw lacks one of them (a column of an expression index).
func columnsText(columns []string, raw string) (string, bool) {
	d := json.NewDecoder(strings.NewReader(raw))
	d.UseNumber()
	var m map[string]any
	if d.Decode(&m) != nil || len(columns) == 0 {
		return "", false
	}
	parts := make([]string, len(columns))
	for i, c := range columns {
		v, ok := m[c]
		if !ok {
			return "", false
		}
		parts[i] = jsonText(v)
	}
	if len(parts) == 1 {
		return parts[0], true
	}
	return "(" + strings.Join(parts, ", ") + ")", true
}

// jsonText is a decoded JSON value (UseNumber) as text: NULL for null, a
// string or number as it is, an object or array as compact JSON.
func jsonText(v any) string {
	switch x := v.(type) {
	case nil:
		return "NULL"
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		return strconv.FormatBool(x)
	default:
		b, err := json.Marshal(x)
		if err != nil {
			return fmt.Sprint(x)
		}
		return string(b)
	}
}

// TooManyRejects applies backfill.Config.MaxRejectsPerChunk (max, 0 for no
// limit) to every reject of chunk c: the written rows the row writer or
// the extractor rejected (written of them) and the merge's rejects
// (conflicts, ambiguities, refusals), with prior, the rejects of the
// sub-chunks of c's plan chunk committed before c (0 for a whole chunk).
func TooManyRejects(max int, c backfilltype.Chunk, prior, written int64, merged []backfilltype.Exception) error {
	total := prior + written + int64(len(merged))
	if max <= 0 || total <= int64(max) {
		return nil
	}
	last := ""
	if len(merged) > 0 {
		e := merged[len(merged)-1]
		what := "key"
		if e.Column != "" {
			what = fmt.Sprintf("column %q value", e.Column)
		}
		last = fmt.Sprintf(" (last refused by the merge: row %d %s %s: %s)", e.Row, what, e.Value, e.Reason)
	}
	before := ""
	if prior > 0 {
		before = fmt.Sprintf("%d in its sub-chunks committed before, ", prior)
	}
	return fmt.Errorf("%w: %d in chunk %s, more than %d (Config.MaxRejectsPerChunk): %s%d before the merge, %d by the merge%s",
		backfilltype.ErrTooManyRejects, total, c.ID, max, before, written, len(merged), last)
}
