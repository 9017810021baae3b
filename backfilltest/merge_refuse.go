package backfilltest

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Rows the target refuses at merge time, as the PostgreSQL merger refuses
// them (see [pgstore.Isolation]): a table may declare unique
// constraints besides its key ([Merger.AddUnique]) and CHECK constraints
// ([Merger.AddCheck]). A merged row that violates one is not written: it
// is returned in MergeResult.Rejected with its row, its identity as
// Value and a Reason with PostgreSQL's message, SQLSTATE and constraint,
// and the rest of the chunk merges. Of two rows that collide on a unique
// constraint, a committed row the merge does not touch wins, then the row
// written first. At most TableInfo.Chunk.MaxRefused rows are refused; the
// next one fails the merge with an error wrapping
// [backfill.ErrTooManyRejects].

// fakeUnique is a unique constraint besides the table's key; NULLs are
// distinct, as in PostgreSQL by default.
type fakeUnique struct {
	name    string
	columns []string
}

// fakeCheck is a CHECK constraint: ok reports whether a row passes.
type fakeCheck struct {
	name string
	ok   func(column func(name string) any) bool
}

// AddUnique declares a unique constraint named name on columns of table,
// besides its key (like CREATE UNIQUE INDEX name ON table (columns)): a
// merged row whose values of columns (all non-NULL) another row holds is
// refused. It panics when the table was not added.
func (m *Merger) AddUnique(table, name string, columns ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.tables[table]
	t.uniques = append(t.uniques, fakeUnique{name: name, columns: slices.Clone(columns)})
}

// AddCheck declares a CHECK constraint named name on table: a merged row
// for which ok returns false is refused. ok reads the row's columns by
// name (nil for NULL) and must treat NULL as PostgreSQL's CHECK does (a
// NULL result passes). It panics when the table was not added.
func (m *Merger) AddCheck(table, name string, ok func(column func(name string) any) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.tables[table]
	t.checks = append(t.checks, fakeCheck{name: name, ok: ok})
}

// run merges by the target's mode.
func (m *merge) run() error {
	switch m.t.Mode {
	case backfill.Upsert, "":
		return m.upsert()
	case backfill.History:
		return m.history()
	case backfill.AppendOnly, backfill.Keyless:
		return m.appendOnlyOrKeyless()
	}
	return fmt.Errorf("backfill: merge %s: mode %q: %w", m.t.Table, m.t.Mode, backfill.ErrInvalidConfig)
}

// mergeRefusing merges rows into tab, refusing rows that violate its other
// constraints: it merges, finds the written rows that violate one, and
// merges again without them (after deduplication, as the PostgreSQL merger
// drops them), until none does.
func mergeRefusing(info backfill.TableInfo, tab *fakeTable, rows []stagedRow) (*merge, error) {
	refused := map[int64]backfill.Exception{}
	for {
		m, err := newMerge(info, tab, rows)
		if err != nil {
			return nil, err
		}
		m.refused = refused
		if err := m.run(); err != nil {
			return nil, err
		}
		bad := m.violations()
		if len(bad) == 0 {
			var out []backfill.Exception
			for _, e := range refused {
				out = append(out, e)
			}
			slices.SortFunc(out, func(a, b backfill.Exception) int { return cmp.Compare(a.Row, b.Row) })
			m.res.Rejected = append(m.res.Rejected, out...)
			return m, nil
		}
		for _, e := range bad {
			if len(refused) >= info.Chunk.MaxRefused {
				identity := slices.Clone(m.t.Key)
				if m.t.Mode == backfill.History {
					identity = append(identity, m.t.ValidFrom)
				}
				return nil, fmt.Errorf("backfill: merge %s: %w: row %d key %s %s; %d rows of this chunk were refused already (Config.MaxMergeRefusals)",
					m.t.Table, backfill.ErrTooManyRejects, e.Row, pgstore.IdentityText(identity, string(e.Raw)), e.Reason, len(refused))
			}
			refused[e.Row] = e
		}
	}
}

// skipRefused drops the refused rows from rows.
func (m *merge) skipRefused(rows []stagedRow) []stagedRow {
	if len(m.refused) == 0 {
		return rows
	}
	return slices.DeleteFunc(rows, func(r stagedRow) bool {
		_, ok := m.refused[r.row]
		return ok
	})
}

// violations returns the exceptions of the written rows that violate a
// CHECK or another unique constraint of the table, by row.
func (m *merge) violations() []backfill.Exception {
	tab := m.tab
	if len(tab.uniques) == 0 && len(tab.checks) == 0 {
		return nil
	}
	byRow := map[int64]stagedRow{}
	for _, r := range m.rows {
		byRow[r.row] = r
	}
	bad := map[int64]backfill.Exception{}
	refuse := func(row int64, columns []string, reason string) {
		if _, ok := bad[row]; ok {
			return
		}
		r := byRow[row]
		raw := m.stagedJSON(r)
		identity := slices.Clone(m.t.Key)
		if m.t.Mode == backfill.History {
			identity = append(identity, m.t.ValidFrom)
		}
		col := strings.Join(columns, ",")
		value, why := pgstore.RefusedValue(identity, col, raw, "refused by the target: "+reason)
		bad[row] = backfill.Exception{Row: row, Raw: []byte(raw), Column: col, Value: value, Reason: why}
	}
	// CHECK constraints come first, as in PostgreSQL (before the row's
	// index entries).
	for k, row := range m.writes {
		src := m.source[k]
		if src == 0 {
			continue
		}
		for _, c := range tab.checks {
			// The columns the check reads are the refusal's columns, in
			// table order, as PostgreSQL's constraint names them.
			var read []string
			stored := m.ofStored(row)
			column := func(name string) any {
				if !slices.Contains(read, name) {
					read = append(read, name)
				}
				return stored(name)
			}
			if !c.ok(column) {
				slices.SortFunc(read, func(a, b string) int { return slices.Index(tab.columns, a) - slices.Index(tab.columns, b) })
				refuse(src, read, fmt.Sprintf("new row for relation %q violates check constraint %q (SQLSTATE 23514); constraint %q", m.t.Table, c.name, c.name))
				break
			}
		}
	}
	// The table after the merge: committed rows, overwritten by the writes.
	final := map[string][]any{}
	for k, row := range tab.rows {
		final[k] = row
	}
	for k, row := range m.writes {
		final[k] = row
	}
	for _, u := range tab.uniques {
		groups := map[string][]string{}
		for k, row := range final {
			if slices.ContainsFunc(u.columns, func(c string) bool { return row[m.stored[c]] == nil }) {
				continue
			}
			v := keyOf(tab.info, tab.columns, u.columns, row)
			groups[v] = append(groups[v], k)
		}
		for _, ids := range groups {
			if len(ids) < 2 {
				continue
			}
			// The winner: a row the merge leaves alone, else the one
			// written first.
			slices.SortFunc(ids, func(a, b string) int {
				return cmp.Or(cmp.Compare(m.source[a], m.source[b]), strings.Compare(a, b))
			})
			for _, id := range ids[1:] {
				if src := m.source[id]; src > 0 {
					row := final[id]
					vals := make([]string, len(u.columns))
					for i, c := range u.columns {
						vals[i] = scalarText(row[m.stored[c]])
					}
					refuse(src, u.columns, fmt.Sprintf("duplicate key value violates unique constraint %q (SQLSTATE 23505); constraint %q; Key (%s)=(%s) already exists.",
						u.name, u.name, strings.Join(u.columns, ", "), strings.Join(vals, ", ")))
				}
			}
		}
	}
	out := make([]backfill.Exception, 0, len(bad))
	for _, e := range bad {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b backfill.Exception) int { return cmp.Compare(a.Row, b.Row) })
	return out
}
