package backfilltest

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

// Merger is an in-memory [backfill.Merger] with the merge semantics of
// [backfill.PGMerger] under [TestMerger]: duplicates in a chunk resolved
// by Target.Duplicates, identical rows left unchanged, changes applied on
// commit. Tables are declared with [Merger.AddTable]; values are stored as
// given (no type conversion). Safe for concurrent use.
type Merger struct {
	mu     sync.Mutex
	tables map[string]*fakeTable
}

type fakeTable struct {
	columns []string
	key     []string
	rows    map[string][]any // key -> row in column order
}

var _ backfill.Merger = (*Merger)(nil)

// NewMerger returns a Merger with no tables.
func NewMerger() *Merger { return &Merger{tables: map[string]*fakeTable{}} }

// AddTable declares table with its columns in order and a unique key (the
// columns of its primary key). Adding an existing table replaces it.
func (m *Merger) AddTable(table string, key []string, columns ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tables[table] = &fakeTable{columns: slices.Clone(columns), key: slices.Clone(key), rows: map[string][]any{}}
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

// Prepare implements [backfill.Merger.Prepare]: the table must have been
// added ([backfill.ErrTargetNotFound]) and its key must be Target.Key
// ([backfill.ErrNoUniqueKey]).
func (m *Merger) Prepare(ctx context.Context, db sqlx.ExtContext, t backfill.Target) (backfill.TableInfo, error) {
	if err := ctx.Err(); err != nil {
		return backfill.TableInfo{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	tab := m.tables[t.Table]
	if tab == nil {
		return backfill.TableInfo{}, fmt.Errorf("backfill: prepare: table %q: %w", t.Table, backfill.ErrTargetNotFound)
	}
	cols := make([]backfill.Column, len(tab.columns))
	for i, c := range tab.columns {
		cols[i] = backfill.Column{Name: c}
	}
	return backfill.ResolveTarget(t, cols, [][]string{tab.key})
}

// Stage implements [backfill.Merger.Stage].
func (m *Merger) Stage(ctx context.Context, tx sqlx.ExtContext, info backfill.TableInfo) (backfill.Stager, error) {
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

func keyOf(names, key []string, values []any) string {
	var b strings.Builder
	for _, k := range key {
		i := slices.Index(names, k)
		fmt.Fprintf(&b, "%T:%v\x00", values[i], values[i])
	}
	return b.String()
}

func (s *stager) Merge(ctx context.Context) (backfill.MergeResult, error) {
	if s.merged {
		return backfill.MergeResult{}, backfill.ErrWriterClosed
	}
	s.merged = true
	if err := ctx.Err(); err != nil {
		return backfill.MergeResult{}, err
	}
	var res backfill.MergeResult
	t := s.info.Target
	names := make([]string, len(s.info.Columns))
	for i, c := range s.info.Columns {
		names[i] = c.Name
	}
	// Resolve duplicates: keep the last (or first) row of each key.
	winner := map[string]stagedRow{}
	var order []string
	for _, r := range s.rows {
		k := keyOf(names, t.Key, r.values)
		w, seen := winner[k]
		switch {
		case !seen:
			winner[k] = r
			order = append(order, k)
		case (t.Duplicates == backfill.KeepFirst) == (r.row < w.row):
			winner[k] = r
			res.Deduplicated++
		default:
			res.Deduplicated++
		}
	}
	s.m.mu.Lock()
	tab := s.m.tables[t.Table]
	if tab == nil {
		s.m.mu.Unlock()
		return res, fmt.Errorf("backfill: merge: table %q: %w", t.Table, backfill.ErrTargetNotFound)
	}
	type change struct {
		key string
		row []any
	}
	var changes []change
	for _, k := range order {
		in := winner[k].values
		old, exists := tab.rows[k]
		row := make([]any, len(tab.columns))
		if exists {
			copy(row, old)
		}
		for i, c := range names {
			row[slices.Index(tab.columns, c)] = in[i]
		}
		switch {
		case !exists:
			res.Inserted++
		case reflect.DeepEqual(old, row):
			res.Unchanged++
			continue
		default:
			res.Updated++
		}
		changes = append(changes, change{k, row})
	}
	s.m.mu.Unlock()
	err := apply(s.tx, func() {
		s.m.mu.Lock()
		defer s.m.mu.Unlock()
		for _, c := range changes {
			tab.rows[c.key] = c.row
		}
	})
	return res, err
}

func (s *stager) Close() error {
	s.merged = true
	return nil
}
