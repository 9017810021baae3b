package pgstore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/pgbackfill/backfill/internal/spool"
	"hash/maphash"
	"slices"
	"strings"
	"sync"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
	"github.com/pgbackfill/backfill/internal/suggest"
)

// EndStaging ends the chunk's COPY, so that a value PostgreSQL refuses
// shows as the COPY's error before the merge (the Runner then isolates
// it); the error names the target. Merge ends the COPY too, so calling it
// is optional, and a second call does nothing.
func (s *PGStager) EndStaging(ctx context.Context) error {
	if err := s.EndCopy(ctx); err != nil {
		return fmt.Errorf("backfill: stage %s: end copy: %w", s.Info.Target.Table, err)
	}
	return nil
}

// CreateStaging implements [backfilldriver.MergerStaging.CreateStaging].
// The DDL runs in a READ COMMITTED transaction of its own (InTx), not
// under the server's default isolation outside any transaction, after a
// transaction-level advisory lock on the table's name: workers starting
// at once would otherwise race in CREATE TABLE IF NOT EXISTS, which two
// sessions can both pass and then collide on the catalog's unique index
// (23505 on pg_type). The lock is taken with LockName: its waits go to
// the context's LockWaiting.
func (m *Merger) CreateStaging(ctx context.Context, db sqlx.ExtContext, table string, info backfilltype.TableInfo) error {
	ctx = WithPurpose(ctx, "create the staging table", 0)
	return InTx(ctx, db, func(tx sqlx.ExtContext) error {
		if err := LockName(ctx, tx, "stage lock of "+table, "backfill.stage:"+table); err != nil {
			return err
		}
		return createStageTable(ctx, tx, table, info)
	})
}

// StagePersistent implements [backfilldriver.MergerStaging.StagePersistent]
// with COPY.
func (m *Merger) StagePersistent(ctx context.Context, tx sqlx.ExtContext, table string, info backfilltype.TableInfo, seq int) (backfilldriver.PersistentStager, error) {
	return newPersistStager(ctx, tx, table, info, seq)
}

// StageFrom implements [backfilldriver.MergerStaging.StageFrom].
func (m *Merger) StageFrom(ctx context.Context, tx sqlx.ExtContext, info backfilltype.TableInfo, table string, seq int, rows int64) (backfilldriver.Stager, error) {
	st, err := m.Stage(ctx, tx, info)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(info.Columns))
	for i, c := range info.Columns {
		names[i] = c.Name
	}
	if err := st.(*PGStager).fill(ctx, fmt.Sprintf(`SELECT %s, _backfill_row FROM %s WHERE _backfill_seq = $1`, sqlgen.List("", names), table), seq); err != nil {
		st.Close()
		return nil, err
	}
	if n := st.(*PGStager).staged; n != rows {
		st.Close()
		return nil, fmt.Errorf("%w: the staging table holds %d rows, the manifest %d", backfilltype.ErrAccounting, n, rows)
	}
	return st, nil
}

// DropStaging implements [backfilldriver.MergerStaging.DropStaging].
func (m *Merger) DropStaging(ctx context.Context, tx sqlx.ExtContext, table string) error {
	_, err := tx.ExecContext(ctx, `DROP TABLE `+table)
	return err
}

// IsolatesRefusedValues implements [StagingIsolator]: its stagers COPY
// in the chunk's transaction.
func (m *Merger) IsolatesRefusedValues() bool { return true }

// StagesIntoTables implements [backfilldriver.TableStager]: its stagers
// stage into a temporary or persistent table.
func (m *Merger) StagesIntoTables() bool { return true }

// WritesUndoLog implements [backfilldriver.UndoLogWriter].
func (m *Merger) WritesUndoLog() bool { return true }

// fill loads the stager's temporary staging table from query (which must
// select the staged columns then _backfill_row), replacing what it held.
func (s *PGStager) fill(ctx context.Context, query string, args ...any) error {
	if err := s.EndCopy(ctx); err != nil {
		return err
	}
	if _, err := s.tx.ExecContext(ctx, `TRUNCATE `+s.Q.Stage); err != nil {
		return err
	}
	names := make([]string, len(s.Info.Columns))
	for i, c := range s.Info.Columns {
		names[i] = c.Name
	}
	res, err := s.tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (%s, _backfill_row) %s`, s.Q.Stage, sqlgen.List("", names), query), args...)
	if err != nil {
		return err
	}
	s.staged, _ = res.RowsAffected()
	s.track = false // duplicates are found in SQL
	// One transaction merges every chunk: it locks the whole target once
	// rather than accumulate key locks.
	s.lockWhole = true
	return nil
}

// Merger is the PostgreSQL [Merger].
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
// [backfilltype.IsRetryable] reports as retryable: the retried chunk then
// sees the row.
//
// Upsert has a fast path for loads into new ground: when the previous
// chunk merged into the same table (by this merger) inserted every row, the
// next chunk is first tried as a plain INSERT ... SELECT inside a
// savepoint, which skips the per-row lookup; a unique violation rolls back
// to the savepoint and the chunk takes the general path, which it then
// keeps until a chunk is again all inserts. A replay or an overlapping
// load never takes the fast path twice in a row.
type Merger struct {
	// keyBudget, when set, is what the stagers' tracked identities are
	// counted against (SetKeyBudget).
	keyBudget *spool.Budget
	mu        sync.Mutex
	allFresh  map[string]bool // table -> the last chunk merged into it was all inserts
	hashable  map[string]bool // table and key types -> the keys have a hash function (keyHashable)
}

var _ backfilldriver.Merger = (*Merger)(nil)

// NewMerger returns the PostgreSQL merger. It is safe for concurrent use.
func NewMerger() *Merger { return &Merger{allFresh: map[string]bool{}} }

// SetKeyBudget makes the merger's stagers count the identities they
// track to find duplicate keys in Go against b (about trackedKeyBytes a
// key): a stager refused a reservation stops tracking and leaves the
// duplicates to SQL. Without it they track at most maxTrackedKeys. It is
// set once, before the merger is used.
func (m *Merger) SetKeyBudget(b *spool.Budget) { m.keyBudget = b }

func (m *Merger) fresh(table string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.allFresh[table]
}

func (m *Merger) setFresh(table string, v bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.allFresh == nil {
		m.allFresh = map[string]bool{}
	}
	m.allFresh[table] = v
}

// TextCompared lists types without a default btree equality operator,
// compared as text in IS DISTINCT FROM; so are arrays of them and
// composite types (which may contain them).
var TextCompared = map[string]bool{"json": true, "xml": true, "point": true, "line": true, "lseg": true, "box": true, "path": true, "polygon": true, "circle": true}

// Prepare implements [Merger.Prepare]: it reads the table's columns and
// unique indexes from the catalogs (pg_attribute, pg_index; PostgreSQL
// docs, chapter 53) and resolves the target with [ResolveTarget]. When db
// is not a transaction, the catalog reads run in one READ COMMITTED
// transaction of their own (readTx: safe behind a transaction pooler).
func (m *Merger) Prepare(ctx context.Context, db sqlx.ExtContext, t backfilltype.Target) (backfilltype.TableInfo, error) {
	ctx = WithPurpose(ctx, "read the target table", 0)
	var info backfilltype.TableInfo
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		var err error
		info, err = m.prepare(ctx, tx, t)
		return err
	})
	return info, err
}

func (m *Merger) prepare(ctx context.Context, db sqlx.ExtContext, t backfilltype.Target) (backfilltype.TableInfo, error) {
	if err := t.Validate(); err != nil {
		return backfilltype.TableInfo{}, err
	}
	oid, name, err := relation(ctx, db, t.Table)
	if err != nil {
		return backfilltype.TableInfo{}, err
	}
	// The canonical, schema-qualified name: "t" and "public.t" are one
	// target, one plan. Parts holding a dot or a quote are quoted, so
	// that the name parses back to this table and no other.
	t.Table = name
	table, err := tableColumns(ctx, db, oid)
	if err != nil {
		return backfilltype.TableInfo{}, fmt.Errorf("backfill: prepare %s: columns: %w", t.Table, err)
	}
	keys, err := uniqueIndexes(ctx, db, oid)
	if err != nil {
		return backfilltype.TableInfo{}, fmt.Errorf("backfill: prepare %s: indexes: %w", t.Table, err)
	}
	unique := make([][]string, len(keys))
	for i, k := range keys {
		unique[i] = k.Columns
	}
	info, err := ResolveTarget(t, table, unique)
	if err == nil {
		identity := slices.Sorted(slices.Values(info.Identity()))
		for _, k := range keys {
			if slices.Equal(slices.Sorted(slices.Values([]string(k.Columns))), identity) {
				info.KeyIndexes = append(append(info.KeyIndexes, k.Name), k.Parts...)
			}
		}
		if err := prepareDecide(ctx, db, oid, &info); err != nil {
			return backfilltype.TableInfo{}, fmt.Errorf("backfill: prepare %s: partition root: %w", t.Table, err)
		}
		if info.InheritanceChild, err = inheritanceChild(ctx, db, oid); err != nil {
			return backfilltype.TableInfo{}, fmt.Errorf("backfill: prepare %s: inheritance: %w", t.Table, err)
		}
		if t.Mode == backfilltype.History {
			if info.OpenIndexes, err = openVersionIndexes(ctx, db, oid, info.Target.Key); err != nil {
				return backfilltype.TableInfo{}, fmt.Errorf("backfill: prepare %s: partial indexes: %w", t.Table, err)
			}
		}
		if err := prepareInsertOnly(ctx, db, oid, &info); err != nil {
			return backfilltype.TableInfo{}, fmt.Errorf("backfill: prepare %s: privileges: %w", t.Table, err)
		}
	}
	if errors.Is(err, backfilltype.ErrNoUniqueKey) {
		identity := t.Key
		if t.Mode == backfilltype.History {
			identity = append(slices.Clone(t.Key), cmp.Or(t.ValidFrom, "valid_from"))
		}
		return backfilltype.TableInfo{}, fmt.Errorf("%w; add one with CREATE UNIQUE INDEX ON %s (%s)", err, sqlgen.Table(t.Table), sqlgen.List("", identity))
	}
	return info, err
}

// relation finds table in the catalogs: its oid and its canonical,
// SchemaName-qualified name (sqlgen.Qualified). A table that does not exist
// is [backfilltype.ErrTargetNotFound].
func relation(ctx context.Context, db sqlx.ExtContext, table string) (oid int64, name string, err error) {
	var rel []struct {
		OID    int64  `db:"oid"`
		Schema string `db:"nspname"`
		Name   string `db:"relname"`
	}
	if err := sqlx.SelectContext(ctx, db, &rel, `SELECT c.oid::bigint AS oid, n.nspname, c.relname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, sqlgen.Table(table)); err != nil {
		return 0, "", fmt.Errorf("backfill: prepare %s: %w", table, err)
	}
	if len(rel) == 0 {
		return 0, "", fmt.Errorf("backfill: prepare: table %q: %w: %s", table, backfilltype.ErrTargetNotFound, whereTables(ctx, db, table))
	}
	return rel[0].OID, sqlgen.Qualified(rel[0].Schema, rel[0].Name), nil
}

// whereTables says where a table name that names no table was looked
// for: the schema it names, or the session's search_path and the
// schemas of it that exist; then the tables there, with the closest
// to the name. It is part of an error message: when the catalogs cannot
// be read it says only what it knows.
func whereTables(ctx context.Context, db sqlx.ExtContext, table string) string {
	schema, name, err := sqlgen.ParseTable(table)
	if err != nil {
		return "no such table"
	}
	var where string
	var schemas []string
	if schema != "" {
		where, schemas = fmt.Sprintf("no such table in schema %q", schema), []string{schema}
	} else {
		var sp struct {
			Path    string         `db:"path"`
			Schemas pq.StringArray `db:"schemas"`
		}
		if err := sqlx.GetContext(ctx, db, &sp, `SELECT current_setting('search_path') AS path, current_schemas(false)::text[] AS schemas`); err != nil {
			return "no such table in the session's search_path"
		}
		where = fmt.Sprintf("no such table in the session's search_path (%s", sp.Path)
		if len(sp.Schemas) > 0 {
			where += fmt.Sprintf(": schemas %s", strings.Join(sp.Schemas, ", "))
		}
		where += "); qualify the name (schema.table) or set search_path"
		schemas = sp.Schemas
	}
	var rels []struct {
		Schema string `db:"nspname"`
		Name   string `db:"relname"`
	}
	if err := sqlx.SelectContext(ctx, db, &rels, `SELECT n.nspname, c.relname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = ANY($1) AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT c.relispartition
		ORDER BY 1, 2 LIMIT 1000`, pq.StringArray(schemas)); err != nil || len(rels) == 0 {
		return where
	}
	// Listed qualified when they come from more than one schema;
	// compared by their table name.
	shown, bare := make([]string, len(rels)), make([]string, len(rels))
	for i, r := range rels {
		shown[i], bare[i] = r.Name, r.Name
		if schema != "" || len(schemas) > 1 {
			shown[i] = sqlgen.Qualified(r.Schema, r.Name)
		}
	}
	list := suggest.List("tables there:", "", shown)
	if c := suggest.Closest(name, bare); c != "" {
		list += fmt.Sprintf("; did you mean %q?", shown[slices.Index(bare, c)])
	}
	return where + "; " + list
}

// tableColumns reads the columns of the table oid that a merge can write:
// not generated, not GENERATED ALWAYS AS IDENTITY.
func tableColumns(ctx context.Context, db sqlx.ExtContext, oid int64) ([]backfilltype.Column, error) {
	var cols []struct {
		Name      string `db:"attname"`
		Type      string `db:"format_type"`
		Base      string `db:"typname"`
		Typmod    int    `db:"atttypmod"`
		NotNull   bool   `db:"attnotnull"`
		Identity  string `db:"attidentity"`
		Generated string `db:"attgenerated"`
		Elem      string `db:"elem"`
		Kind      string `db:"kind"`
		Collation string `db:"collation"`
		UserType  bool   `db:"user_type"`
		ElemKind  string `db:"elem_kind"`
		UserElem  bool   `db:"user_elem"`
	}
	// Domains are resolved to their base type through every level, and so
	// is an array's element type (an array of a domain over numeric
	// compares its elements as numerics do): what a column is compared
	// and converted by is its base type ([ExactCompare]). An array of a
	// domain names the array of the element's base type ("_numeric"), and
	// its collation is told apart from that base's.
	err := sqlx.SelectContext(ctx, db, &cols, `
		WITH RECURSIVE dom(start, cur) AS (
			SELECT a.atttypid, a.atttypid FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0
			UNION
			SELECT d.start, t.typbasetype FROM dom d JOIN pg_type t ON t.oid = d.cur WHERE t.typtype = 'd'
		), base AS (
			SELECT d.start, d.cur AS base FROM dom d JOIN pg_type t ON t.oid = d.cur WHERE t.typtype <> 'd'
		), edom(start, cur) AS (
			SELECT b.base, t.typelem FROM base b JOIN pg_type t ON t.oid = b.base WHERE t.typcategory = 'A' AND t.typelem <> 0
			UNION
			SELECT d.start, t.typbasetype FROM edom d JOIN pg_type t ON t.oid = d.cur WHERE t.typtype = 'd'
		), elem AS (
			SELECT d.start, d.cur AS elem FROM edom d JOIN pg_type t ON t.oid = d.cur WHERE t.typtype <> 'd'
		)
		SELECT a.attname, format_type(a.atttypid, a.atttypmod),
			CASE WHEN et.oid <> bt.typelem THEN '_' || et.typname ELSE bt.typname END AS typname,
			CASE WHEN ty.typtype = 'd' THEN ty.typtypmod ELSE a.atttypmod END AS atttypmod,
			a.attnotnull, a.attidentity::text AS attidentity, a.attgenerated::text AS attgenerated,
			coalesce(et.typname, '') AS elem, bt.typtype::text AS kind,
			CASE WHEN a.attcollation <> 0 AND a.attcollation <> coalesce(et.typcollation, bt.typcollation)
				THEN quote_ident(cn.nspname) || '.' || quote_ident(co.collname) ELSE '' END AS collation,
			bt.typnamespace <> 'pg_catalog'::regnamespace AS user_type,
			coalesce(et.typtype::text, '') AS elem_kind, coalesce(et.typnamespace <> 'pg_catalog'::regnamespace, false) AS user_elem
		FROM pg_attribute a
		JOIN pg_type ty ON ty.oid = a.atttypid
		JOIN base b ON b.start = a.atttypid
		JOIN pg_type bt ON bt.oid = b.base
		LEFT JOIN elem e ON e.start = b.base
		LEFT JOIN pg_type et ON et.oid = e.elem
		LEFT JOIN pg_collation co ON co.oid = a.attcollation
		LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, oid)
	if err != nil {
		return nil, err
	}
	var table []backfilltype.Column
	for _, c := range cols {
		if c.Generated != "" || c.Identity == "a" {
			continue
		}
		col := backfilltype.Column{Name: c.Name, Type: c.Type, BaseType: c.Base, NotNull: c.NotNull, Collation: c.Collation,
			TextCompare: comparedAsText(c.Base, c.Kind, c.Elem, c.ElemKind),
			Kind:        c.Kind, UserType: c.UserType, ElemKind: c.ElemKind, UserElem: c.UserElem}
		if (c.Base == "varchar" || c.Base == "bpchar") && c.Typmod > 4 {
			col.MaxLen = c.Typmod - 4
		}
		if c.Base == "numeric" && c.Typmod >= 4 {
			// typmod = ((precision << 16) | (scale & 0x7ff)) + 4, the scale a
			// signed 11-bit number (PostgreSQL 15, src/backend/utils/adt/numeric.c).
			m := c.Typmod - 4
			col.Precision = (m >> 16) & 0xffff
			col.Scale = ((m & 0x7ff) ^ 1024) - 1024
		}
		table = append(table, col)
	}
	return table, nil
}

// uniqueIndex is a unique index and its key columns, sorted.
type uniqueIndex struct {
	Name    string         `db:"name"`
	Columns pq.StringArray `db:"columns"`
	// Parts names the indexes of the table's partitions attached to this
	// one (a partitioned index's; none for a plain table's): a unique
	// violation names the partition's index, not this one.
	Parts pq.StringArray `db:"parts"`
}

// uniqueIndexes reads the unique, valid, non-partial indexes on plain
// columns of the table oid (PostgreSQL docs, 11.6 "Unique Indexes"): key
// columns only, INCLUDE columns (after indnkeyatts) do not count.
func uniqueIndexes(ctx context.Context, db sqlx.ExtContext, oid int64) ([]uniqueIndex, error) {
	var keys []uniqueIndex
	err := sqlx.SelectContext(ctx, db, &keys, `
		SELECT c.relname AS name, array_agg(a.attname::text ORDER BY a.attname) AS columns,
			ARRAY(SELECT p.relname::text FROM pg_partition_tree(i.indexrelid::regclass) pt JOIN pg_class p ON p.oid = pt.relid
				WHERE pt.relid <> i.indexrelid ORDER BY 1) AS parts
		FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY ((i.indkey::int2[])[0:i.indnkeyatts - 1])
		WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL
		GROUP BY c.relname, i.indexrelid`, oid)
	return keys, err
}

// inheritanceChild returns a child by inheritance (CREATE TABLE ...
// INHERITS) of the table oid when it is not partitioned, "" for none:
// its scans read the child's rows, but its unique indexes cover only its
// own, so a merge would take a key a child holds for absent and insert
// it again. Prepare records it (TableInfo.InheritanceChild); runs that
// merge into the table are refused (RefuseInheritanceParent), its
// rollbacks are not, which touch the rows by key as the batch wrote
// them. A child added during a run is not seen.
func inheritanceChild(ctx context.Context, db sqlx.ExtContext, oid int64) (string, error) {
	var child string
	err := sqlx.GetContext(ctx, db, &child, `SELECT i.inhrelid::regclass::text FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
		WHERE i.inhparent = $1 AND p.relkind <> 'p' ORDER BY i.inhrelid LIMIT 1`, oid)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return child, err
}

// RefuseInheritanceParent returns an error wrapping
// [backfilltype.ErrInvalidConfig] when info, prepared for a run, is of a
// table with a child by inheritance (inheritanceChild), however the
// [Merger] that prepared it is wrapped.
func RefuseInheritanceParent(info backfilltype.TableInfo) error {
	if info.InheritanceChild == "" {
		return nil
	}
	return fmt.Errorf("backfill: prepare %s: %w: the table has a child by inheritance (%s, INHERITS): its unique indexes do not cover the child's rows, which its scans read; merge into a partitioned table, or into each table", info.Target.Table, backfilltype.ErrInvalidConfig, info.InheritanceChild)
}

// affected runs an INSERT (plain, or a WITH i AS (...) statement that
// returns its count) and returns how many rows it inserted.
func (s *PGStager) affected(ctx context.Context, what, query string) (int64, error) {
	if query == "" {
		return 0, nil
	}
	if !strings.HasPrefix(query, "WITH i AS (") {
		return s.exec(ctx, what, query)
	}
	var n int64
	if err := sqlx.GetContext(ctx, s.tx, &n, query, s.Args(query)...); err != nil {
		return 0, fmt.Errorf("backfill: merge %s: %s: %w", s.Info.Target.Table, what, s.classify(err))
	}
	return n, nil
}

// Args returns the bind parameters of query, a statement that writes the
// undo log or the delivered summary: the chunk's batch and Seq when it
// takes them, and the identity's column names when it takes those
// ($3, the delivered summary's).
func (s *PGStager) Args(query string) []any {
	if !strings.Contains(query, "$1::bigint") {
		return nil
	}
	if strings.Contains(query, "$3::text[]") {
		return []any{s.Info.Chunk.BatchID, s.Info.Chunk.Seq, pq.Array(s.Info.Identity())}
	}
	return []any{s.Info.Chunk.BatchID, s.Info.Chunk.Seq}
}

// Preparer is an executor that prepares statements on its connection
// (*sqlx.Tx, *sql.Tx): COPY FROM STDIN runs through a prepared statement
// of lib/pq, so staging needs one.
type Preparer interface {
	// PrepareContext prepares query, as [sql.Tx.PrepareContext].
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// Stage implements [Merger.Stage]. tx must be able to prepare statements
// (*sqlx.Tx), because COPY FROM STDIN runs through a prepared statement
// of lib/pq.
func (m *Merger) Stage(ctx context.Context, tx sqlx.ExtContext, info backfilltype.TableInfo) (backfilldriver.Stager, error) {
	p, ok := tx.(Preparer)
	if !ok {
		return nil, fmt.Errorf("backfill: stage %s: %w", info.Target.Table, errNotTx)
	}
	q := BuildMergeSQL(info)
	if _, err := tx.ExecContext(ctx, q.create); err != nil {
		return nil, fmt.Errorf("backfill: stage %s: create staging table: %w", info.Target.Table, err)
	}
	st := &PGStager{m: m, tx: tx, Info: info, Q: q, buf: make([]any, len(info.Columns)+1), track: true, seed: maphash.MakeSeed()}
	// With a connection of its own, the COPY starts in CopyRows (or at
	// the first Add outside it).
	if st.rawConn = rawConnOf(tx); st.rawConn == nil {
		stmt, err := p.PrepareContext(ctx, q.copyIn)
		if err != nil {
			return nil, fmt.Errorf("backfill: stage %s: copy: %w", info.Target.Table, err)
		}
		st.copy = stmt
	}
	for _, name := range info.Identity() {
		i := slices.IndexFunc(info.Columns, func(c backfilltype.Column) bool { return c.Name == name })
		st.identity = append(st.identity, i)
		if c := info.Columns[i]; !goEqualIsPGEqual[c.BaseType] || c.Collation != "" {
			st.track = false
		}
	}
	return st, nil
}

// goEqualIsPGEqual lists the types whose converted values (see
// ConvertValue) are equal in Go exactly when PostgreSQL's default equality
// says so; for keys of other types (numeric: 1.0 = 1.00, char(n): trailing
// spaces, citext: case) duplicates are found in SQL only.
var goEqualIsPGEqual = map[string]bool{
	"int2": true, "int4": true, "int8": true, "text": true, "varchar": true, "uuid": true,
	"bool": true, "date": true, "timestamp": true, "timestamptz": true,
}

// keySets recycles the duplicate-detection sets of finished chunks: a
// chunk's set grows to the chunk's size, and the next chunk reuses it.
var keySets = sync.Pool{New: func() any { return make(map[uint64]struct{}, 1024) }}

// releaseKeys returns the set to the pool, emptied.
func (s *PGStager) releaseKeys() {
	if s.reservedKeys > 0 {
		s.m.keyBudget.Release(int64(s.reservedKeys) * trackedKeyBytes)
		s.reservedKeys = 0
	}
	if s.keys != nil {
		if len(s.keys) <= 1<<16 { // large sets are left to the GC
			clear(s.keys)
			keySets.Put(s.keys)
		}
		s.keys = nil
	}
}

// maxTrackedKeys bounds the memory of the in-Go duplicate detection (about
// trackedKeyBytes a key); larger chunks are checked in SQL.
const maxTrackedKeys = 1 << 20

// trackedKeyBytes is what one tracked identity is counted as against the
// merger's key budget: its 8-byte hash in a Go map, with the map's slack.
const trackedKeyBytes = 40

// keyReserveStep is how many identities a stager reserves budget for at a
// time.
const keyReserveStep = 4096

// PGStager is the PostgreSQL merger's [backfilldriver.Stager] of one
// chunk ([Merger.Stage]): it COPYs the chunk's rows into a temporary
// staging table in the chunk's transaction, then merges them into Info's
// target with the statements of Q. It is used by one goroutine.
type PGStager struct {
	m    *Merger
	tx   sqlx.ExtContext
	Info backfilltype.TableInfo `json:"-" db:"-"`
	Q    PGMergeSQL             `json:"-" db:"-"`
	copy *sql.Stmt
	buf  []any
	// The COPY on lib/pq's connection (CopyRows): rawConn is the chunk
	// transaction's connection (nil: none; the COPY runs through copy),
	// raw the COPY while CopyRows runs, copyErr its end's error for the
	// next EndCopy, copied that it ran.
	rawConn rawConner
	raw     *rawCopy
	copyErr error
	copied  bool
	staged  int64
	done    bool
	// lockWhole: the merge locks the whole target, not its keys
	// ([WholeTarget]).
	lockWhole bool

	// In-Go duplicate detection: while track holds, keys has a 64-bit
	// hash of every staged identity; a repeated hash (a duplicate or a
	// collision) sets maybeDup, and only then does Merge ask SQL.
	track    bool
	maybeDup bool
	identity []int // indexes of the identity columns in Columns
	seed     maphash.Seed
	keys     map[uint64]struct{}
	// reservedKeys: how many identities the merger's key budget holds
	// room for on this stager's behalf (given back by releaseKeys).
	reservedKeys int

	// fingerprints computed by the chunk's checks, by target query.
	fingerprints map[string]*FingerprintProof
}

func (s *PGStager) fingerprintMemo() map[string]*FingerprintProof {
	if s.fingerprints == nil {
		s.fingerprints = map[string]*FingerprintProof{}
	}
	return s.fingerprints
}

// trackKey records the identity of values; it returns false when
// tracking is off or found a possible duplicate.
func (s *PGStager) trackKey(values []any) {
	if !s.track || s.maybeDup {
		return
	}
	if s.keys == nil {
		s.keys = keySets.Get().(map[uint64]struct{})
	}
	var h maphash.Hash
	h.SetSeed(s.seed)
	var b [8]byte
	for _, i := range s.identity {
		switch x := values[i].(type) {
		case int64:
			binary.LittleEndian.PutUint64(b[:], uint64(x))
			h.WriteByte('i')
			h.Write(b[:])
		case string:
			binary.LittleEndian.PutUint64(b[:], uint64(len(x)))
			h.WriteByte('s')
			h.Write(b[:])
			h.WriteString(x)
		case bool:
			h.WriteByte('b')
			if x {
				h.WriteByte(1)
			} else {
				h.WriteByte(0)
			}
		default:
			s.track = false
			return
		}
	}
	k := h.Sum64()
	if _, seen := s.keys[k]; seen {
		s.maybeDup = true
		s.releaseKeys()
		return
	}
	if len(s.keys) >= maxTrackedKeys {
		s.track = false
		s.releaseKeys()
		return
	}
	if b := s.m.keyBudget; b != nil && len(s.keys) >= s.reservedKeys {
		if !b.Reserve(keyReserveStep * trackedKeyBytes) {
			s.track = false
			s.releaseKeys()
			return
		}
		s.reservedKeys += keyReserveStep
	}
	s.keys[k] = struct{}{}
}

// Add implements [backfilldriver.Stager.Add]: it sends the row to the
// COPY. It returns [backfilltype.ErrWriterClosed] after Merge or Close; a
// COPY error names the target and the row.
func (s *PGStager) Add(ctx context.Context, row int64, values []any) error {
	if s.done {
		return backfilltype.ErrWriterClosed
	}
	copy(s.buf, values)
	s.buf[len(values)] = row
	var err error
	switch {
	case s.raw != nil:
		err = s.addRaw(ctx)
	case s.copied:
		return backfilltype.ErrWriterClosed
	default:
		if s.copy == nil {
			p, ok := s.tx.(Preparer)
			if !ok {
				return fmt.Errorf("backfill: stage %s: %w", s.Info.Target.Table, errNotTx)
			}
			if s.copy, err = p.PrepareContext(ctx, s.Q.copyIn); err != nil {
				return fmt.Errorf("backfill: stage %s: copy: %w", s.Info.Target.Table, err)
			}
		}
		_, err = s.copy.ExecContext(ctx, s.buf...)
	}
	if err != nil {
		return fmt.Errorf("backfill: stage %s row %d: %w", s.Info.Target.Table, row, err)
	}
	s.trackKey(values)
	s.staged++
	return nil
}

// EndCopy ends the COPY and closes its statement, returning the COPY's
// error (a refused value shows here); once ended, it does nothing.
func (s *PGStager) EndCopy(ctx context.Context) error {
	if s.copy == nil {
		err := s.copyErr
		s.copyErr = nil
		return err
	}
	return finishCopy(ctx, &s.copy)
}

// finishCopy ends the COPY of *stmt, if any, and closes it.
func finishCopy(ctx context.Context, stmt **sql.Stmt) error {
	if *stmt == nil {
		return nil
	}
	_, err := (*stmt).ExecContext(ctx)
	cerr := (*stmt).Close()
	*stmt = nil
	return errors.Join(err, cerr)
}

type pgConflict struct {
	Row      int64          `db:"row"`
	FirstRow int64          `db:"first_row"`
	Diffs    pq.StringArray `db:"diffs"`
	Raw      string         `db:"raw"`
	Existing sql.NullString `db:"existing"`
}

func (s *PGStager) exec(ctx context.Context, what, query string, args ...any) (int64, error) {
	if query == "" {
		return 0, nil
	}
	if len(args) == 0 {
		args = s.Args(query)
	}
	r, err := s.tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, fmt.Errorf("backfill: merge %s: %s: %w", s.Info.Target.Table, what, s.classify(err))
	}
	n, _ := r.RowsAffected()
	return n, nil
}

// Merge implements [backfilldriver.Stager.Merge] in phases: end the COPY,
// take the key locks and the planner settings (beginMerge), settle the rows
// whose identity repeats in the chunk (settleDuplicates), drop the rows
// that conflict with the target (dropTargetConflicts), then write the rest
// (mergeRefusing, which isolates rows the target refuses).
func (s *PGStager) Merge(ctx context.Context) (_ backfilltype.MergeResult, err error) {
	if s.done {
		return backfilltype.MergeResult{}, backfilltype.ErrWriterClosed
	}
	s.done = true
	t := s.Info.Target
	if err := s.EndCopy(ctx); err != nil {
		return backfilltype.MergeResult{}, fmt.Errorf("backfill: stage %s: end copy: %w", t.Table, err)
	}
	var res backfilltype.MergeResult
	if s.staged == 0 {
		return res, nil
	}
	restore, err := s.beginMerge(ctx)
	if err != nil {
		return res, err
	}
	defer func() {
		if err == nil {
			if err = restore(ctx); err != nil {
				err = fmt.Errorf("backfill: merge %s: planner settings: %w", t.Table, err)
			}
		}
	}()
	dup, err := s.settleDuplicates(ctx, &res)
	if err != nil {
		return res, err
	}
	if err := s.dropTargetConflicts(ctx, &res); err != nil {
		return res, err
	}
	return s.mergeRefusing(ctx, res, dup)
}

// beginMerge locks the chunk's keys ([PGStager.lockKeys]) and sets the
// planner settings of the merge's statements; restore undoes those not
// meant to outlast the merge.
func (s *PGStager) beginMerge(ctx context.Context) (restore func(context.Context) error, err error) {
	t := s.Info.Target
	if err := s.lockKeys(ctx); err != nil {
		return nil, fmt.Errorf("backfill: merge %s: lock keys: %w", t.Table, err)
	}
	restore, err = s.PlannerSettings(ctx)
	if err != nil {
		return nil, fmt.Errorf("backfill: merge %s: planner settings: %w", t.Table, err)
	}
	return restore, nil
}

// settleDuplicates finds whether an identity repeats in staging (asking
// SQL only when the in-Go tracking could not rule it out) and, if so,
// deletes the losing rows (Upsert, History) or sorts the repeated rows
// into kept, duplicates and rejected (AppendOnly, Keyless). dup reports
// whether an identity repeated.
func (s *PGStager) settleDuplicates(ctx context.Context, res *backfilltype.MergeResult) (dup bool, err error) {
	t := s.Info.Target
	if !s.track || s.maybeDup {
		if err := sqlx.GetContext(ctx, s.tx, &dup, s.Q.dupCheck); err != nil {
			return false, fmt.Errorf("backfill: merge %s: duplicate check: %w", t.Table, err)
		}
	}
	s.releaseKeys()
	if !dup {
		return false, nil
	}
	if s.Q.dedup != "" {
		n, err := s.exec(ctx, "deduplicate", s.Q.dedup)
		if err != nil {
			return true, err
		}
		res.Deduplicated = n
	}
	if s.Q.inChunkConflicts == "" {
		return true, nil
	}
	var cs []pgConflict
	if err := sqlx.SelectContext(ctx, s.tx, &cs, s.Q.inChunkConflicts); err != nil {
		return true, fmt.Errorf("backfill: merge %s: duplicates in chunk: %w", t.Table, err)
	}
	drop := inChunkConflicts(t, cs, res)
	if len(drop) > 0 {
		if _, err := s.exec(ctx, "drop rows", s.Q.deleteRows, pq.Array(drop)); err != nil {
			return true, err
		}
	}
	return true, nil
}

// inChunkConflicts sorts the rows of repeated identities: in AppendOnly
// the first row wins, later identical rows are duplicates and later
// different rows conflicts; in Keyless any difference makes every row of
// the group ambiguous. It counts duplicates and rejects into res and
// returns the rows to drop from staging.
func inChunkConflicts(t backfilltype.Target, cs []pgConflict, res *backfilltype.MergeResult) (drop []int64) {
	ambiguous := map[int64][]string{} // first row -> columns that differ in the group
	for _, c := range cs {
		for _, d := range c.Diffs {
			if !slices.Contains(ambiguous[c.FirstRow], d) {
				ambiguous[c.FirstRow] = append(ambiguous[c.FirstRow], d)
			}
		}
	}
	for _, c := range cs {
		switch {
		case t.Mode == backfilltype.Keyless && len(ambiguous[c.FirstRow]) > 0:
			res.Rejected = append(res.Rejected, backfilltype.Exception{Row: c.Row, Raw: json.RawMessage(c.Raw), Column: strings.Join(ambiguous[c.FirstRow], ","),
				Value: KeyText(t.Key, c.Raw), Reason: fmt.Sprintf("ambiguous derived key: rows %d and others share it with different content", c.FirstRow)})
			drop = append(drop, c.Row)
		case c.Row == c.FirstRow:
			// AppendOnly keeps the first row; Keyless keeps one of identical rows.
		case len(c.Diffs) == 0:
			res.Deduplicated++
			drop = append(drop, c.Row)
		default:
			res.Rejected = append(res.Rejected, backfilltype.Exception{Row: c.Row, Raw: json.RawMessage(c.Raw), Column: strings.Join(c.Diffs, ","),
				Value: KeyText(t.Key, c.Raw), Reason: fmt.Sprintf("conflicting content for event of row %d in the same chunk: %s differ", c.FirstRow, strings.Join(c.Diffs, ", "))})
			drop = append(drop, c.Row)
		}
	}
	return drop
}

// dropTargetConflicts rejects and drops from staging the rows whose
// identity exists in the target with other content (AppendOnly,
// Keyless).
func (s *PGStager) dropTargetConflicts(ctx context.Context, res *backfilltype.MergeResult) error {
	t := s.Info.Target
	if s.Q.TargetConflicts == "" {
		return nil
	}
	var cs []pgConflict
	if err := sqlx.SelectContext(ctx, s.tx, &cs, s.Q.TargetConflicts); err != nil {
		return fmt.Errorf("backfill: merge %s: conflicts with target: %w", t.Table, err)
	}
	var drop []int64
	for _, c := range cs {
		reason := "conflicting content for existing event: " + strings.Join(c.Diffs, ", ") + " differ"
		if t.Mode == backfilltype.Keyless {
			reason = "ambiguous derived key: an existing row has the same key with different " + strings.Join(c.Diffs, ", ")
		}
		raw := json.RawMessage(fmt.Sprintf(`{"staged": %s, "existing": %s}`, c.Raw, c.Existing.String))
		res.Rejected = append(res.Rejected, backfilltype.Exception{Row: c.Row, Raw: raw, Column: strings.Join(c.Diffs, ","), Value: KeyText(t.Key, c.Raw), Reason: reason})
		drop = append(drop, c.Row)
	}
	if len(drop) > 0 {
		if _, err := s.exec(ctx, "drop conflicts", s.Q.deleteRows, pq.Array(drop)); err != nil {
			return err
		}
	}
	return nil
}

// mergeStaged writes the n rows in staging into the target (deduplicated,
// conflicts dropped) and returns what it did: Inserted, Updated,
// Unchanged, Closed. mergeRefusing calls it for the whole chunk and, when
// the target refuses a row, for parts of it ([Isolation]).
func (s *PGStager) mergeStaged(ctx context.Context, n int64, dup bool) (res backfilltype.MergeResult, err error) {
	t := s.Info.Target
	if s.Q.Upsert != "" && !dup && s.m.fresh(t.Table) {
		ok, err := s.insertFresh(ctx, &res)
		if err != nil {
			return res, err
		}
		if ok {
			if res.Inserted != n {
				return res, fmt.Errorf("backfill: merge %s: %w: %d rows to insert, but %d inserted (a trigger or rule on the target skipped or added rows?)",
					t.Table, backfilltype.ErrAccounting, n, res.Inserted)
			}
			return res, nil
		}
	}
	// Lock the rows to change, so that the statements below decide from
	// their committed versions.
	settled, err := s.lockChanging(ctx, n)
	if err != nil {
		return res, err
	}
	// Chunks of this batch that disagree on a key (TargetWins): counted
	// for the runner's warning, after the key locks, so the other chunk's
	// row is committed and seen.
	if s.Q.disagreed != "" {
		if err := sqlx.GetContext(ctx, s.tx, &res.Disagreed, s.Q.disagreed, s.Info.Chunk.BatchID); err != nil {
			return res, fmt.Errorf("backfill: merge %s: rows other chunks of the batch wrote: %w", t.Table, s.classify(err))
		}
	}
	// Settled: every row found and unchanged, counted by the lock's
	// statement; the upsert would write nothing (upsertLockChanging).
	if !settled {
		if err := s.writeStaged(ctx, n, &res); err != nil {
			return res, err
		}
	}
	// Deferred constraints fire here, inside the caller's savepoint.
	if err := s.checkDeferred(ctx); err != nil {
		return res, err
	}
	if res.Inserted > 0 && s.Q.CloseIntervals != "" {
		if err := s.checkIntervals(ctx); err != nil {
			return res, err
		}
	}
	if s.Q.Upsert != "" {
		s.m.setFresh(t.Table, res.Inserted == n && res.Inserted > 0)
	}
	res.Unchanged = n - res.Updated - res.Inserted
	if res.Unchanged < 0 {
		return res, fmt.Errorf("backfill: merge %s: %w: staged %d, merged %+v", t.Table, backfilltype.ErrAccounting, n, res)
	}
	if settled || !s.Q.upsertDelivers {
		// Otherwise the upsert recorded them.
		if err := s.recordDelivered(ctx, res.Unchanged); err != nil {
			return res, err
		}
	}
	return res, nil
}

// writeStaged runs the mode's writing statements on the n staged rows:
// the one Upsert statement, or update, close intervals (History) and
// insert.
func (s *PGStager) writeStaged(ctx context.Context, n int64, res *backfilltype.MergeResult) (err error) {
	if s.Q.Upsert != "" {
		return s.upsertStaged(ctx, n, res)
	}
	if res.Updated, err = s.exec(ctx, "update", s.Q.Update); err != nil {
		return err
	}
	// Lock the versions whose intervals close first: the closing
	// statement's snapshot (and the prior images it logs) then holds their
	// committed versions (lockClosing).
	if _, err = s.exec(ctx, "lock intervals to close", s.Q.lockClosing); err != nil {
		return err
	}
	if res.Closed, err = s.exec(ctx, "close intervals", s.Q.CloseIntervals); err != nil {
		return err
	}
	res.Inserted, err = s.affected(ctx, "insert", s.Q.Insert)
	return err
}

// upsertStaged runs the Upsert merge of the n staged rows in one
// statement and checks its accounting: counted, not inferred, so that a
// trigger that drops rows (a BEFORE trigger returning NULL) does not pass
// for "unchanged".
func (s *PGStager) upsertStaged(ctx context.Context, n int64, res *backfilltype.MergeResult) error {
	t := s.Info.Target
	var c struct {
		Updated   int64 `db:"updated"`
		Inserted  int64 `db:"inserted"`
		Unchanged int64 `db:"unchanged"`
	}
	if err := sqlx.GetContext(ctx, s.tx, &c, s.Q.Upsert, s.Args(s.Q.Upsert)...); err != nil {
		return fmt.Errorf("backfill: merge %s: upsert: %w", t.Table, s.classify(err))
	}
	if s.Info.InsertOnly && c.Updated > 0 {
		return insertOnlyRefused(s.Info, c.Updated)
	}
	res.Updated, res.Inserted = c.Updated, c.Inserted
	if c.Updated+c.Inserted+c.Unchanged != n {
		return fmt.Errorf("backfill: merge %s: %w: %d rows to merge, but %d inserted + %d updated + %d unchanged (a trigger or rule on the target skipped or added rows?)",
			t.Table, backfilltype.ErrAccounting, n, c.Inserted, c.Updated, c.Unchanged)
	}
	return nil
}

// checkIntervals fails the merge with historyRace when the versions of
// the chunk's keys overlap or leave a gap after it inserted versions
// (History): a concurrent writer of the same keys.
func (s *PGStager) checkIntervals(ctx context.Context) error {
	t := s.Info.Target
	var bad []string
	rows, err := s.tx.QueryxContext(ctx, s.Q.CheckIntervals)
	if err != nil {
		return fmt.Errorf("backfill: merge %s: check intervals: %w", t.Table, err)
	}
	for rows.Next() {
		vals, err := rows.SliceScan()
		if err != nil {
			rows.Close()
			return err
		}
		bad = append(bad, fmt.Sprint(vals...))
	}
	rows.Close()
	if len(bad) > 0 {
		return historyRace(t.Table, bad)
	}
	return nil
}

// PlannerSettings sets, in the chunk's transaction, the settings the
// merge's statements run under, and returns a function that restores
// those not meant to outlast the merge:
//
//   - hash and merge joins off for the rest of the chunk's transaction,
//     so every join of staging with the target is an index nested loop
//     (otherwise a load turns quadratic before the target is analysed);
//   - sequential scans and JIT off for the merge's statements (restored):
//     every lookup goes through the identity's unique index, which
//     ResolveTarget requires, even into a target the planner believes
//     empty; disabling a path lifts every plan's cost over
//     jit_above_cost, so JIT goes off with it;
//   - extra_float_digits at least 1, so floats compared as text are exact;
//   - the caller's statement_timeout and the try's lock_timeout put back
//     from backfill.statement_timeout and backfill.lock_timeout, where the
//     chunk's fence ([Manifest.FenceLease]) kept them while the spool
//     was replayed into COPY (the key locks, [PGStager.lockKeys], put
//     back the lock_timeout of their steps themselves).
//
// The design note docs/design/merge.md explains the alternatives.
func (s *PGStager) PlannerSettings(ctx context.Context) (restore func(context.Context) error, err error) {
	// One statement, one round trip per chunk: the subquery
	// (OFFSET 0 keeps it a subquery, evaluated before the outer target
	// list) keeps enable_seqscan and jit as they were in transaction-local
	// custom settings, and sets the others; the outer list then turns
	// enable_seqscan and jit off. restore puts them back from the saved
	// settings, without parameters (one round trip). Everything is local
	// to the chunk's transaction, as a pooler in transaction mode needs.
	if err := Later(ctx, s.tx, `SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)
		FROM (SELECT set_config('backfill.enable_seqscan', current_setting('enable_seqscan'), true),
			set_config('backfill.jit', current_setting('jit'), true),
			set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
			set_config('extra_float_digits', greatest(current_setting('extra_float_digits')::int, 1)::text, true),
			set_config('statement_timeout', coalesce(nullif(current_setting('backfill.statement_timeout', true), ''), current_setting('statement_timeout')), true),
			set_config('lock_timeout', coalesce(nullif(current_setting('backfill.lock_timeout', true), ''), current_setting('lock_timeout')), true)
			OFFSET 0) x`); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return Later(ctx, s.tx, `SELECT set_config('enable_seqscan', current_setting('backfill.enable_seqscan'), true),
			set_config('jit', current_setting('backfill.jit'), true)`)
	}, nil
}

// StagingTable implements [StagingTabler]: the quoted name of the chunk's
// temporary staging table.
func (s *PGStager) StagingTable() string { return s.Q.Stage }

// Replay implements [Replayer]: it returns what merging the merged staging
// rows again would write. For Upsert it counts it with one read-only join
// (the merge's own decision, evaluated without writing); other modes run
// their merge statements inside a savepoint and roll back to it. After a
// correct merge every count but Unchanged is 0.
func (s *PGStager) Replay(ctx context.Context) (res backfilltype.MergeResult, err error) {
	t := s.Info.Target
	if s.Q.replayCheck != "" {
		var n struct {
			Updated   int64 `db:"updated"`
			Inserted  int64 `db:"inserted"`
			Unchanged int64 `db:"unchanged"`
		}
		if err := sqlx.GetContext(ctx, s.tx, &n, s.Q.replayCheck); err != nil {
			return res, fmt.Errorf("backfill: replay %s: %w", t.Table, err)
		}
		return backfilltype.MergeResult{Inserted: n.Inserted, Updated: n.Updated, Unchanged: n.Unchanged}, nil
	}
	if _, err := s.tx.ExecContext(ctx, `SAVEPOINT backfill_replay`); err != nil {
		return res, fmt.Errorf("backfill: replay %s: savepoint: %w", t.Table, err)
	}
	defer func() {
		if _, rerr := s.tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_replay`); rerr != nil && err == nil {
			err = fmt.Errorf("backfill: replay %s: rollback to savepoint: %w", t.Table, rerr)
		}
	}()
	// The merge's statements under the merge's settings; rolling back to
	// the savepoint restores the check's own.
	if _, err := s.PlannerSettings(ctx); err != nil {
		return res, fmt.Errorf("backfill: replay %s: planner settings: %w", t.Table, err)
	}
	if res.Updated, err = s.exec(ctx, "replay update", s.Q.Update); err != nil {
		return res, err
	}
	if res.Closed, err = s.exec(ctx, "replay close intervals", s.Q.CloseIntervals); err != nil {
		return res, err
	}
	if res.Inserted, err = s.affected(ctx, "replay insert", s.Q.Insert); err != nil {
		return res, err
	}
	return res, nil
}

// classify marks a unique violation of a constraint other than the
// business key's index as not retryable: retrying cannot help, unlike a
// concurrent insert of the same key.
func (s *PGStager) classify(err error) error {
	if e := s.openVersionConflict(err); e != nil {
		return e
	}
	var pe *pq.Error
	if errors.As(err, &pe) && pe.Code == "23505" && !slices.Contains(s.Info.KeyIndexes, pe.Constraint) {
		return fmt.Errorf("%w (%w: unique constraint %q is not the business key's)", err, backfilltype.ErrNotRetryable, pe.Constraint)
	}
	return err
}

// insertFresh tries the chunk as a plain INSERT inside a savepoint. ok is
// false, with the savepoint rolled back, when a key already existed.
func (s *PGStager) insertFresh(ctx context.Context, res *backfilltype.MergeResult) (ok bool, err error) {
	t := s.Info.Target
	if err := Later(ctx, s.tx, `SAVEPOINT backfill_fresh`); err != nil {
		return false, fmt.Errorf("backfill: merge %s: savepoint: %w", t.Table, err)
	}
	n, err := s.affected(ctx, "insert", s.Q.insertAll)
	if err == nil {
		err = s.checkDeferred(ctx)
	}
	if err != nil {
		// Any unique violation: the upsert, which looks each key up,
		// decides. One of the key's index (or of a partition's index
		// attached to it) means the ground is not new; another
		// index's may be a partition's created since Prepare, whose
		// violation is the key's too, or another constraint's, which
		// the upsert then isolates as it would.
		var pe *pq.Error
		if errors.As(err, &pe) && pe.Code == "23505" {
			if _, rerr := s.tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT backfill_fresh`); rerr != nil {
				return false, fmt.Errorf("backfill: merge %s: rollback to savepoint: %w", t.Table, rerr)
			}
			if slices.Contains(s.Info.KeyIndexes, pe.Constraint) {
				s.m.setFresh(t.Table, false)
			}
			return false, nil
		}
		return false, err
	}
	if err := Later(ctx, s.tx, `RELEASE SAVEPOINT backfill_fresh`); err != nil {
		return false, fmt.Errorf("backfill: merge %s: release savepoint: %w", t.Table, err)
	}
	res.Inserted = n
	return true, nil
}

// KeyText renders the key columns of a JSON row as "(a, b)" for messages.
func KeyText(key []string, raw string) string {
	var m map[string]any
	if json.Unmarshal([]byte(raw), &m) != nil {
		return ""
	}
	parts := make([]string, len(key))
	for i, k := range key {
		parts[i] = fmt.Sprint(m[k])
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// Close implements [backfilldriver.Stager.Close]: it closes the COPY's
// statement if it is still open and releases the stager's memory; later
// calls of Add and Merge return [backfilltype.ErrWriterClosed]. It is
// idempotent.
func (s *PGStager) Close() error {
	s.done = true
	s.releaseKeys()
	if s.copy != nil {
		err := s.copy.Close()
		s.copy = nil
		return err
	}
	return nil
}
