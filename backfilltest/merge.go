package backfilltest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgconv"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/suggest"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

// Merger is an in-memory [backfilldriver.Merger] with the merge semantics of
// the PostgreSQL merger under [TestMerger], for every [backfill.Mode] and
// [backfill.ConflictPolicy]: duplicates in a chunk resolved by
// Target.Duplicates, identical rows left unchanged, AppendOnly conflicts
// and Keyless ambiguities returned as rejected rows, rows that violate a
// constraint declared with [Merger.AddUnique] or [Merger.AddCheck] refused
// (returned as rejected rows, up to TableInfo.Chunk.MaxRefused), History
// intervals recomputed, changes applied on commit. Like the PostgreSQL
// merger, a merge holds locks on its business keys until its transaction
// ends, so that merges of the same keys in concurrent transactions see each
// other's rows and the result does not depend on their order. Tables are
// declared with [Merger.AddTable]; values are stored as given (no type
// conversion). Safe for concurrent use.
type Merger struct {
	mu     sync.Mutex
	tables map[string]*fakeTable
	// keyLocks: table and business key -> the transaction (or stager)
	// holding it; released is closed when locks are released
	// (see [Merger.lockKeys]).
	keyLocks map[string]any
	released chan struct{}
	// staging are the persistent staging tables: table name -> chunk
	// Seq -> rows.
	staging map[string]map[int][]stagedRow
	// undo is the undo log: table name -> entries in write order.
	undo map[string][]undoEntry
}

type fakeTable struct {
	columns []string
	info    []backfill.Column // the columns as Prepare describes them
	key     []string          // the unique columns: a merge's identity
	rows    map[string][]any  // keyOf(info, columns, key, row) -> row in column order
	// uniques and checks are the table's other constraints
	// ([Merger.AddUnique], [Merger.AddCheck]).
	uniques []fakeUnique
	checks  []fakeCheck
}

var _ backfill.Merger = (*Merger)(nil)

// NewMerger returns a Merger with no tables.
func NewMerger() *Merger { return &Merger{tables: map[string]*fakeTable{}} }

// AddTable declares table with its columns in order and a unique key (the
// columns of its primary key). Adding an existing table replaces it.
func (m *Merger) AddTable(table string, key []string, columns ...string) {
	cols := make([]backfill.Column, len(columns))
	for i, c := range columns {
		cols[i] = backfill.Column{Name: c}
	}
	m.AddTableColumns(table, key, cols...)
}

// AddTableColumns is [Merger.AddTable] with column descriptions: Prepare
// checks their Type, BaseType and NotNull as the PostgreSQL merger checks
// the catalog's (History's ValidFrom and ValidTo must have the same Type,
// ValidTo must be nullable, a HashColumn must be bytea or text). Only
// Name is required; Key and Computed are ignored.
func (m *Merger) AddTableColumns(table string, key []string, columns ...backfill.Column) {
	info := slices.Clone(columns)
	names := make([]string, len(info))
	for i := range info {
		info[i].Key, info[i].Computed = false, ""
		names[i] = info[i].Name
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tables[table] = &fakeTable{columns: names, info: info, key: slices.Clone(key), rows: map[string][]any{}}
}

// Truncate deletes every committed row of table.
func (m *Merger) Truncate(table string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.tables[table]; t != nil {
		t.rows = map[string][]any{}
	}
}

// Rows returns the committed rows of table in column order, sorted by
// their printed key; nil for an unknown table.
func (m *Merger) Rows(table string) [][]any {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.tables[table]
	if t == nil {
		return nil
	}
	keys := make([]string, 0, len(t.rows))
	for k := range t.rows {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]any, len(keys))
	for i, k := range keys {
		out[i] = slices.Clone(t.rows[k])
	}
	return out
}

// Prepare implements [backfilldriver.Merger.Prepare] with the PostgreSQL
// merger's resolution of a target against the table's columns and unique
// indexes: the table must have been added
// ([backfill.ErrTargetNotFound]) and its key must be the target's identity,
// Target.Key (in History mode plus ValidFrom) ([backfill.ErrNoUniqueKey]).
// Column types are checked only when declared with
// [Merger.AddTableColumns].
func (m *Merger) Prepare(ctx context.Context, db sqlx.ExtContext, t backfill.Target) (backfill.TableInfo, error) {
	if err := ctx.Err(); err != nil {
		return backfill.TableInfo{}, err
	}
	if _, _, err := pgstore.SplitTableName(t.Table); err != nil {
		return backfill.TableInfo{}, fmt.Errorf("backfill: prepare: Target.Table: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	tab := m.tables[t.Table]
	if tab == nil {
		return backfill.TableInfo{}, fmt.Errorf("backfill: prepare: table %q: %w: no such table added to the fake merger (Merger.AddTable); %s",
			t.Table, backfill.ErrTargetNotFound, suggest.List("its tables are", t.Table, slices.Sorted(maps.Keys(m.tables))))
	}
	return pgstore.ResolveTarget(t, slices.Clone(tab.info), [][]string{tab.key})
}

// Stage implements [backfilldriver.Merger.Stage].
func (m *Merger) Stage(ctx context.Context, tx sqlx.ExtContext, info backfill.TableInfo) (backfilldriver.Stager, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &stager{m: m, tx: tx, info: info}, nil
}

type stagedRow struct {
	row    int64
	values []any
}

type stager struct {
	m      *Merger
	tx     sqlx.ExtContext
	info   backfill.TableInfo
	rows   []stagedRow
	merged bool
}

func (s *stager) Add(ctx context.Context, row int64, values []any) error {
	if s.merged {
		return backfill.ErrWriterClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	values = slices.Clone(values)
	for i, col := range s.info.Columns {
		if i < len(values) {
			values[i] = storedForm(col, values[i])
		}
	}
	s.rows = append(s.rows, stagedRow{row, values})
	return nil
}

// storedForm is the value PostgreSQL stores for v, a converted value of
// col, where its text differs from v's: a numeric as numeric prints it
// (numeric(p,s) rounded to s digits; the scale of an unconstrained
// numeric kept), a char(n) padded to n. The fakes store and compare it as
// the PostgreSQL merger does (package backfill, "Equality").
func storedForm(col backfill.Column, v any) any {
	s, ok := v.(string)
	if !ok {
		return v
	}
	switch col.BaseType {
	case "numeric":
		if t, ok := pgconv.NumericText(s, col.Precision, col.Scale); ok {
			return t
		}
	case "bpchar":
		if n := utf8.RuneCountInString(s); col.MaxLen > n {
			return s + strings.Repeat(" ", col.MaxLen-n)
		}
	}
	return v
}

// keyOf renders the key columns of a row (values in names order) as a map
// key, by the equality rule of the PostgreSQL merger (sameValue): times
// are rendered as instants, so that the location and the monotonic clock
// reading do not make two equal times different keys, integers of any
// Go integer type by their value, and a float -0 as 0.
// info describes the columns (the table's, by name; nil when unknown):
// a numeric column's value is its number, 1.0 and 1.00 one key.
func keyOf(info []backfill.Column, names, key []string, values []any) string {
	var b strings.Builder
	for _, k := range key {
		v := values[slices.Index(names, k)]
		if s, ok := v.(string); ok && slices.ContainsFunc(info, func(c backfill.Column) bool { return c.Name == k && c.BaseType == "numeric" }) {
			fmt.Fprintf(&b, "numeric:%s\x00", numericKey(s))
			continue
		}
		if t, ok := v.(time.Time); ok {
			v = t.UTC().Format(time.RFC3339Nano)
		}
		if n, ok := integerText(v); ok {
			fmt.Fprintf(&b, "integer:%s\x00", n)
			continue
		}
		if f, ok := v.(float64); ok && f == 0 {
			v = 0.0 // -0 = 0, as in a float column's unique index
		}
		fmt.Fprintf(&b, "%T:%v\x00", v, v)
	}
	return b.String()
}

// Merge merges the staged rows by the target's mode (the mode methods of
// [merge]) against the committed rows, and writes the changes on commit of
// the fake transaction.
func (s *stager) Merge(ctx context.Context) (backfilltype.MergeResult, error) {
	if s.merged {
		return backfilltype.MergeResult{}, backfill.ErrWriterClosed
	}
	s.merged = true
	if err := ctx.Err(); err != nil {
		return backfilltype.MergeResult{}, err
	}
	if len(s.rows) == 0 {
		return backfilltype.MergeResult{}, nil
	}
	unlock, err := s.lockStaged(ctx)
	if err != nil {
		return backfilltype.MergeResult{}, err
	}
	defer unlock()
	t := s.info.Target
	s.m.mu.Lock()
	tab := s.m.tables[t.Table]
	if tab == nil {
		s.m.mu.Unlock()
		return backfilltype.MergeResult{}, fmt.Errorf("backfill: merge: table %q: %w", t.Table, backfill.ErrTargetNotFound)
	}
	m, err := mergeRefusing(s.info, tab, s.rows)
	var undo []undoEntry
	if err == nil {
		undo = undoEntries(s.info, tab, m.writes)
	}
	s.m.mu.Unlock()
	if err != nil {
		return backfilltype.MergeResult{}, err
	}
	err = apply(s.tx, func() {
		s.m.mu.Lock()
		defer s.m.mu.Unlock()
		for k, row := range m.writes {
			tab.rows[k] = row
		}
		if len(undo) > 0 {
			if s.m.undo == nil {
				s.m.undo = map[string][]undoEntry{}
			}
			s.m.undo[t.Table] = append(s.m.undo[t.Table], undo...)
		}
	})
	return m.res, err
}

func (s *stager) Close() error {
	s.merged = true
	return nil
}
