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

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
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
	rows    map[string][]any  // keyOf(columns, key, row) -> row in column order
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
	s.rows = append(s.rows, stagedRow{row, slices.Clone(values)})
	return nil
}

// keyOf renders the key columns of a row (values in names order) as a map
// key. Times are rendered as instants, so that the location and the
// monotonic clock reading do not make two equal times different keys.
func keyOf(names, key []string, values []any) string {
	var b strings.Builder
	for _, k := range key {
		v := values[slices.Index(names, k)]
		if t, ok := v.(time.Time); ok {
			v = t.UTC().Format(time.RFC3339Nano)
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
