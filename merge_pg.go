package backfill

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// PGMerger is the PostgreSQL [Merger].
//
// Staging is a temporary table per connection and target shape, created
// with ON COMMIT DELETE ROWS (PostgreSQL docs, CREATE TABLE, "ON COMMIT"),
// filled with COPY FROM STDIN. The merge is set-based and writes only what
// changed: duplicates inside the chunk are deleted from staging by the
// Target.Duplicates rule, then
//
//	UPDATE target t SET ... FROM staging s WHERE <key equal> AND (t.cols) IS DISTINCT FROM (s.cols)
//	INSERT INTO target SELECT ... FROM staging s WHERE NOT EXISTS (<same key in target>)
//
// so replaying an identical chunk rewrites, locks and WAL-logs no target
// row (unlike INSERT ... ON CONFLICT DO UPDATE ... WHERE, which locks every
// conflicting row). A concurrent insert of the same key by another
// transaction makes the INSERT fail with unique_violation, which
// [IsRetryable] reports as retryable: the retried chunk then sees the row.
type PGMerger struct{}

var _ Merger = (*PGMerger)(nil)

// NewPGMerger returns the PostgreSQL merger.
func NewPGMerger() *PGMerger { return &PGMerger{} }

// textCompared lists types without a default btree equality operator,
// compared as text in IS DISTINCT FROM.
var textCompared = map[string]bool{"json": true, "xml": true, "point": true, "line": true, "lseg": true, "box": true, "path": true, "polygon": true, "circle": true}

// Prepare implements [Merger.Prepare].
func (m *PGMerger) Prepare(ctx context.Context, db sqlx.ExtContext, t Target) (TableInfo, error) {
	if err := t.validate(); err != nil {
		return TableInfo{}, err
	}
	t.Mode = cmpOr(t.Mode, Upsert)
	t.Duplicates = cmpOr(t.Duplicates, KeepLast)
	var oid sql.NullInt64
	if err := sqlx.GetContext(ctx, db, &oid, `SELECT to_regclass($1)::oid::bigint`, sqlgen.Table(t.Table)); err != nil {
		return TableInfo{}, fmt.Errorf("backfill: prepare %s: %w", t.Table, err)
	}
	if !oid.Valid {
		return TableInfo{}, fmt.Errorf("backfill: prepare: table %q: %w", t.Table, ErrTargetNotFound)
	}
	var cols []struct {
		Name      string `db:"attname"`
		Type      string `db:"format_type"`
		Base      string `db:"typname"`
		Typmod    int    `db:"atttypmod"`
		NotNull   bool   `db:"attnotnull"`
		Identity  string `db:"attidentity"`
		Generated string `db:"attgenerated"`
	}
	err := sqlx.SelectContext(ctx, db, &cols, `
		SELECT a.attname, format_type(a.atttypid, a.atttypmod),
			coalesce(bt.typname, ty.typname) AS typname,
			CASE WHEN ty.typtype = 'd' THEN ty.typtypmod ELSE a.atttypmod END AS atttypmod,
			a.attnotnull, a.attidentity::text AS attidentity, a.attgenerated::text AS attgenerated
		FROM pg_attribute a
		JOIN pg_type ty ON ty.oid = a.atttypid
		LEFT JOIN pg_type bt ON ty.typtype = 'd' AND bt.oid = ty.typbasetype
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, oid.Int64)
	if err != nil {
		return TableInfo{}, fmt.Errorf("backfill: prepare %s: columns: %w", t.Table, err)
	}
	byName := map[string]Column{}
	var all []string
	for _, c := range cols {
		col := Column{Name: c.Name, Type: c.Type, BaseType: c.Base, NotNull: c.NotNull}
		if (c.Base == "varchar" || c.Base == "bpchar") && c.Typmod > 4 {
			col.MaxLen = c.Typmod - 4
		}
		byName[c.Name] = col
		if c.Generated == "" && c.Identity != "a" {
			all = append(all, c.Name)
		}
	}
	if len(t.Columns) == 0 {
		t.Columns = all
	}
	info := TableInfo{Target: t}
	for _, name := range t.Columns {
		col, ok := byName[name]
		if !ok {
			return TableInfo{}, fmt.Errorf("backfill: prepare: column %q of table %q: %w", name, t.Table, ErrTargetNotFound)
		}
		col.Key = slices.Contains(t.Key, name)
		info.Columns = append(info.Columns, col)
	}
	for _, k := range t.Key {
		if !slices.Contains(t.Columns, k) {
			return TableInfo{}, fmt.Errorf("backfill: prepare %s: %w: key column %q is not in Target.Columns", t.Table, ErrInvalidConfig, k)
		}
	}
	// A unique, non-partial, plain-column index whose columns are exactly
	// the key (PostgreSQL docs, 11.6 "Unique Indexes"; pg_index).
	var keys []pq.StringArray
	err = sqlx.SelectContext(ctx, db, &keys, `
		SELECT array_agg(a.attname::text ORDER BY a.attname)
		FROM pg_index i
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL
		GROUP BY i.indexrelid`, oid.Int64)
	if err != nil {
		return TableInfo{}, fmt.Errorf("backfill: prepare %s: indexes: %w", t.Table, err)
	}
	want := slices.Sorted(slices.Values(t.Key))
	found := false
	for _, k := range keys {
		if slices.Equal([]string(k), want) {
			found = true
		}
	}
	if !found {
		return TableInfo{}, fmt.Errorf("backfill: prepare: table %q key (%s): %w; add one with CREATE UNIQUE INDEX ON %s (%s)",
			t.Table, strings.Join(t.Key, ", "), ErrNoUniqueKey, sqlgen.Table(t.Table), sqlgen.List("", t.Key))
	}
	return info, nil
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// pgMergeSQL is the generated SQL of one target shape.
type pgMergeSQL struct {
	stage, create, copyIn, dupCheck, dedup, update, insert string
}

func buildMergeSQL(info TableInfo) pgMergeSQL {
	t := info.Target
	names := make([]string, len(info.Columns))
	var nonKey []string
	var defs []string
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00", t.Table)
	for i, c := range info.Columns {
		names[i] = c.Name
		if !c.Key {
			nonKey = append(nonKey, c.Name)
		}
		defs = append(defs, sqlgen.Ident(c.Name)+" "+c.Type)
		fmt.Fprintf(h, "%s\x00%s\x00%t\x00", c.Name, c.Type, c.Key)
	}
	stage := "pg_temp." + sqlgen.Ident("backfill_stage_"+hex.EncodeToString(h.Sum(nil))[:16])
	target := sqlgen.Table(t.Table)
	var q pgMergeSQL
	q.stage = stage
	q.create = fmt.Sprintf(`CREATE TEMP TABLE IF NOT EXISTS %s (%s, _backfill_row bigint NOT NULL) ON COMMIT DELETE ROWS`,
		stage[len("pg_temp."):], strings.Join(defs, ", "))
	q.copyIn = fmt.Sprintf(`COPY %s (%s, _backfill_row) FROM STDIN`, stage, sqlgen.List("", names))
	q.dupCheck = fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s GROUP BY %s HAVING count(*) > 1)`, stage, sqlgen.List("", t.Key))
	cmpOp := ">" // KeepLast: delete rows that a later row of the same key supersedes
	if t.Duplicates == KeepFirst {
		cmpOp = "<"
	}
	q.dedup = fmt.Sprintf(`DELETE FROM %s s USING %s d WHERE %s AND d._backfill_row %s s._backfill_row`,
		stage, stage, sqlgen.Equal("s", "d", t.Key), cmpOp)
	if len(nonKey) > 0 {
		sets := make([]string, len(nonKey))
		lhs := make([]string, len(nonKey))
		rhs := make([]string, len(nonKey))
		for i, n := range nonKey {
			sets[i] = sqlgen.Ident(n) + " = s." + sqlgen.Ident(n)
			lhs[i], rhs[i] = "t."+sqlgen.Ident(n), "s."+sqlgen.Ident(n)
			for _, c := range info.Columns {
				if c.Name == n && textCompared[c.BaseType] {
					lhs[i] += "::text"
					rhs[i] += "::text"
				}
			}
		}
		q.update = fmt.Sprintf(`UPDATE %s t SET %s FROM %s s WHERE %s AND ROW(%s) IS DISTINCT FROM ROW(%s)`,
			target, strings.Join(sets, ", "), stage, sqlgen.Equal("t", "s", t.Key), strings.Join(lhs, ", "), strings.Join(rhs, ", "))
	}
	q.insert = fmt.Sprintf(`INSERT INTO %s (%s) SELECT %s FROM %s s WHERE NOT EXISTS (SELECT 1 FROM %s t WHERE %s)`,
		target, sqlgen.List("", names), sqlgen.List("s.", names), stage, target, sqlgen.Equal("t", "s", t.Key))
	return q
}

type preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// Stage implements [Merger.Stage]. tx must be able to prepare statements
// (*sqlx.Tx), because COPY FROM STDIN runs through a prepared statement
// of lib/pq.
func (m *PGMerger) Stage(ctx context.Context, tx sqlx.ExtContext, info TableInfo) (Stager, error) {
	p, ok := tx.(preparer)
	if !ok {
		return nil, fmt.Errorf("backfill: stage %s: %w", info.Target.Table, errNotTx)
	}
	q := buildMergeSQL(info)
	if _, err := tx.ExecContext(ctx, q.create); err != nil {
		return nil, fmt.Errorf("backfill: stage %s: create staging table: %w", info.Target.Table, err)
	}
	stmt, err := p.PrepareContext(ctx, q.copyIn)
	if err != nil {
		return nil, fmt.Errorf("backfill: stage %s: copy: %w", info.Target.Table, err)
	}
	return &pgStager{tx: tx, info: info, q: q, copy: stmt, buf: make([]any, len(info.Columns)+1)}, nil
}

type pgStager struct {
	tx     sqlx.ExtContext
	info   TableInfo
	q      pgMergeSQL
	copy   *sql.Stmt
	buf    []any
	staged int64
	done   bool
}

func (s *pgStager) Add(ctx context.Context, row int64, values []any) error {
	if s.done {
		return ErrWriterClosed
	}
	copy(s.buf, values)
	s.buf[len(values)] = row
	if _, err := s.copy.ExecContext(ctx, s.buf...); err != nil {
		return fmt.Errorf("backfill: stage %s row %d: %w", s.info.Target.Table, row, err)
	}
	s.staged++
	return nil
}

func (s *pgStager) endCopy(ctx context.Context) error {
	if s.copy == nil {
		return nil
	}
	_, err := s.copy.ExecContext(ctx)
	cerr := s.copy.Close()
	s.copy = nil
	return errors.Join(err, cerr)
}

func (s *pgStager) Merge(ctx context.Context) (MergeResult, error) {
	if s.done {
		return MergeResult{}, ErrWriterClosed
	}
	s.done = true
	table := s.info.Target.Table
	if err := s.endCopy(ctx); err != nil {
		return MergeResult{}, fmt.Errorf("backfill: stage %s: end copy: %w", table, err)
	}
	var res MergeResult
	if s.staged == 0 {
		return res, nil
	}
	var dup bool
	if err := sqlx.GetContext(ctx, s.tx, &dup, s.q.dupCheck); err != nil {
		return res, fmt.Errorf("backfill: merge %s: duplicate check: %w", table, err)
	}
	if dup {
		r, err := s.tx.ExecContext(ctx, s.q.dedup)
		if err != nil {
			return res, fmt.Errorf("backfill: merge %s: deduplicate: %w", table, err)
		}
		res.Deduplicated, _ = r.RowsAffected()
	}
	if s.q.update != "" {
		r, err := s.tx.ExecContext(ctx, s.q.update)
		if err != nil {
			return res, fmt.Errorf("backfill: merge %s: update: %w", table, err)
		}
		res.Updated, _ = r.RowsAffected()
	}
	r, err := s.tx.ExecContext(ctx, s.q.insert)
	if err != nil {
		return res, fmt.Errorf("backfill: merge %s: insert: %w", table, err)
	}
	res.Inserted, _ = r.RowsAffected()
	res.Unchanged = s.staged - res.Deduplicated - res.Updated - res.Inserted
	if res.Unchanged < 0 {
		return res, fmt.Errorf("backfill: merge %s: %w: staged %d, merged %+v", table, ErrAccounting, s.staged, res)
	}
	return res, nil
}

func (s *pgStager) Close() error {
	s.done = true
	if s.copy != nil {
		err := s.copy.Close()
		s.copy = nil
		return err
	}
	return nil
}
