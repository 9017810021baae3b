package backfilltest

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// merge is one chunk's merge: the staged rows, a read-only view of the
// target table (taken under Merger.mu) and what the merge decided. The
// mode methods fill res and writes; nothing touches the table until the
// writes are applied on commit.
//
// The semantics are those of the PostgreSQL merger (its merge SQL and
// [pgstore.PGStager.Merge]), which is the reference. What it compares
// comes from [pgstore.CompareColumns], the definition the merge SQL and
// the validators use too:
//
//   - identity: the columns that identify a target row, the table's
//     unique key (Target.Key; in History mode plus ValidFrom);
//   - content: the other staged columns, all written by an insert, and
//     but Lineage.InsertedBy by an update;
//   - tracked: the content that change detection looks at: without the
//     library-filled Target.IngestedAt, Target.HashColumn and lineage
//     and, in Keyless mode, the Derive sources (the raw forms of the key).
//     Exceptions name differing tracked columns; NewerVersionWins orders
//     by their text;
//   - compared: what decides whether two rows differ, NULL-safe (IS
//     DISTINCT FROM): the tracked columns, or only Target.HashColumn when
//     set.
type merge struct {
	t        backfill.Target
	tab      *fakeTable
	names    []string       // staged columns, in TableInfo.Columns order
	staged   map[string]int // staged column -> index in a staged row
	stored   map[string]int // table column -> index in a table row
	tracked  []string
	compared []string
	kept     map[string]bool // staged columns an update leaves as they were (Lineage.InsertedBy)
	rows     []stagedRow     // by row number

	res    backfilltype.MergeResult
	writes map[string][]any // keyOf(tab.info, tab.columns, tab.key, row) -> row to store on commit
	// source is the staged row each write came from (none for History
	// intervals closed); refused the rows the target refuses (see
	// [Merger.AddUnique]), skipped after deduplication.
	source  map[string]int64
	refused map[int64]backfill.Exception
}

// rowView reads a column of a staged or a table row by name.
type rowView func(column string) any

func newMerge(info backfill.TableInfo, tab *fakeTable, rows []stagedRow) (*merge, error) {
	t := info.Target
	m := &merge{t: t, tab: tab, staged: map[string]int{}, stored: map[string]int{}, writes: map[string][]any{}, source: map[string]int64{}}
	for i, c := range tab.columns {
		m.stored[c] = i
	}
	for i, c := range info.Columns {
		if _, ok := m.stored[c.Name]; !ok {
			return nil, fmt.Errorf("backfill: merge: column %q of table %q: %w", c.Name, t.Table, backfill.ErrTargetNotFound)
		}
		m.names = append(m.names, c.Name)
		m.staged[c.Name] = i
	}
	for _, k := range tab.key {
		if _, ok := m.staged[k]; !ok {
			return nil, fmt.Errorf("backfill: merge: unique column %q of table %q is not staged: %w", k, t.Table, backfill.ErrNoUniqueKey)
		}
	}
	if _, ok := m.stored[t.ValidTo]; t.Mode == backfill.History && !ok {
		return nil, fmt.Errorf("backfill: merge: valid_to column %q of table %q: %w", t.ValidTo, t.Table, backfill.ErrTargetNotFound)
	}
	// What the merge compares is the library's one definition, as the
	// PostgreSQL merger's SQL uses it.
	cc := pgstore.CompareColumns(info)
	m.tracked, m.compared = cc.Tracked, cc.Compared
	m.kept = map[string]bool{}
	for _, n := range cc.Content {
		if !slices.Contains(cc.Written, n) {
			m.kept[n] = true
		}
	}
	m.rows = slices.Clone(rows)
	slices.SortStableFunc(m.rows, func(a, b stagedRow) int { return cmp.Compare(a.row, b.row) })
	return m, nil
}

func (m *merge) ofStaged(r stagedRow) rowView {
	return func(c string) any { return r.values[m.staged[c]] }
}
func (m *merge) ofStored(row []any) rowView { return func(c string) any { return row[m.stored[c]] } }

// id is the identity of a staged row, the key of its table row.
func (m *merge) id(r stagedRow) string { return keyOf(m.tab.info, m.names, m.tab.key, r.values) }

// distinct reports whether a and b differ in a compared column.
func (m *merge) distinct(a, b rowView) bool {
	return slices.ContainsFunc(m.compared, func(c string) bool { return !sameValue(a(c), b(c)) })
}

// diffs names, in column order, the tracked columns in which a and b differ.
func (m *merge) diffs(a, b rowView) []string {
	var out []string
	for _, c := range m.tracked {
		if !sameValue(a(c), b(c)) {
			out = append(out, c)
		}
	}
	return out
}

// tableRow returns a new table row: base (nil for none) with the staged
// columns of r set; updating base, those it writes (not kept).
func (m *merge) tableRow(r stagedRow, base []any) []any {
	row := make([]any, len(m.tab.columns))
	copy(row, base)
	for i, c := range m.names {
		if base == nil || !m.kept[c] {
			row[m.stored[c]] = r.values[i]
		}
	}
	return row
}

// newer orders rows for NewerVersionWins: by Target.Version (NULL older
// than any value), then by the text form of the tracked columns (see
// recordText).
func (m *merge) newer(a, b rowView) (int, error) {
	va, vb := a(m.t.Version), b(m.t.Version)
	switch {
	case va == nil && vb == nil:
	case va == nil:
		return -1, nil
	case vb == nil:
		return 1, nil
	default:
		c, err := compareValues(va, vb)
		if err != nil || c != 0 {
			return c, err
		}
	}
	return strings.Compare(m.recordText(a), m.recordText(b)), nil
}

// recordText is the text form of the tracked columns of a row, as
// PostgreSQL's ROW(tracked)::text (see recordText).
func (m *merge) recordText(v rowView) string {
	values := make([]any, len(m.tracked))
	for i, c := range m.tracked {
		values[i] = v(c)
	}
	return recordText(values)
}

// survivor returns the rule that picks, among staged rows of one identity,
// the row that survives deduplication: wins(a, b) reports whether a beats
// b. NewerVersionWins: the newer row (ties: the higher row number);
// otherwise Target.Duplicates.
func (m *merge) survivor() func(a, b stagedRow) (bool, error) {
	switch {
	case m.t.Mode == backfill.Upsert && m.t.Conflict == backfill.NewerVersionWins:
		return func(a, b stagedRow) (bool, error) {
			c, err := m.newer(m.ofStaged(a), m.ofStaged(b))
			return c > 0 || c == 0 && a.row > b.row, err
		}
	case m.t.Duplicates == backfill.KeepFirst:
		return func(a, b stagedRow) (bool, error) { return a.row < b.row, nil }
	default:
		return func(a, b stagedRow) (bool, error) { return a.row > b.row, nil }
	}
}

// dedup keeps one staged row per identity, chosen by wins, and counts the
// others as deduplicated. The survivors are in the order of the first row
// of their identity.
func (m *merge) dedup(wins func(a, b stagedRow) (bool, error)) ([]stagedRow, error) {
	at := map[string]int{} // identity -> index in out
	var out []stagedRow
	for _, r := range m.rows {
		k := m.id(r)
		i, seen := at[k]
		if !seen {
			at[k] = len(out)
			out = append(out, r)
			continue
		}
		m.res.Deduplicated++
		w, err := wins(r, out[i])
		if err != nil {
			return nil, fmt.Errorf("backfill: merge %s: deduplicate: %w", m.t.Table, err)
		}
		if w {
			out[i] = r
		}
	}
	return out, nil
}

// upsert merges in Upsert mode: absent keys are inserted; an existing key
// is updated when its content differs and Target.Conflict lets the staged
// row win (SourceWins: always; TargetWins: never; NewerVersionWins: when
// the staged row is newer), and is unchanged otherwise.
func (m *merge) upsert() error {
	rows, err := m.dedup(m.survivor())
	if err != nil {
		return err
	}
	for _, r := range m.skipRefused(rows) {
		k := m.id(r)
		old, exists := m.tab.rows[k]
		if !exists {
			m.res.Inserted++
			m.writes[k], m.source[k] = m.tableRow(r, nil), r.row
			continue
		}
		s, t := m.ofStaged(r), m.ofStored(old)
		update := m.distinct(s, t)
		switch m.t.Conflict {
		case backfill.TargetWins:
			update = false
		case backfill.NewerVersionWins:
			if update {
				c, err := m.newer(s, t)
				if err != nil {
					return fmt.Errorf("backfill: merge %s: %w", m.t.Table, err)
				}
				update = c > 0
			}
		}
		if update {
			m.res.Updated++
			m.writes[k], m.source[k] = m.tableRow(r, old), r.row
		} else {
			m.res.Unchanged++
		}
	}
	return nil
}

// version is one History version of a business key during a merge.
type version struct {
	row      []any // the committed row until dirty, then a copy
	inserted bool  // staged by this merge, absent from the target
	dirty    bool  // to be written on commit
}

// history merges in History mode: per (Key, ValidFrom), an absent version
// is inserted, an existing one corrected in place when its content differs
// and unchanged otherwise. When a version was inserted, ValidTo of every
// version of the business keys in the chunk becomes the next version's
// ValidFrom (NULL for the last); res.Closed counts the existing versions
// whose ValidTo changed.
func (m *merge) history() error {
	rows, err := m.dedup(m.survivor())
	if err != nil {
		return err
	}
	rows = m.skipRefused(rows)
	// The versions of every business key in the chunk, by identity.
	byKey := map[string]map[string]*version{}
	for _, r := range rows {
		byKey[keyOf(m.tab.info, m.names, m.t.Key, r.values)] = map[string]*version{}
	}
	for id, row := range m.tab.rows {
		if vs := byKey[keyOf(m.tab.info, m.tab.columns, m.t.Key, row)]; vs != nil {
			vs[id] = &version{row: row}
		}
	}
	for _, r := range rows {
		vs, id := byKey[keyOf(m.tab.info, m.names, m.t.Key, r.values)], m.id(r)
		v := vs[id]
		switch {
		case v == nil:
			m.res.Inserted++
			vs[id] = &version{row: m.tableRow(r, nil), inserted: true, dirty: true}
			m.source[id] = r.row
		case m.distinct(m.ofStaged(r), m.ofStored(v.row)):
			m.res.Updated++
			v.row, v.dirty = m.tableRow(r, v.row), true
			m.source[id] = r.row
		default:
			m.res.Unchanged++
		}
	}
	if m.res.Inserted > 0 {
		for _, vs := range byKey {
			if err := m.closeIntervals(vs); err != nil {
				return err
			}
		}
	}
	for _, vs := range byKey {
		for id, v := range vs {
			if v.dirty {
				m.writes[id] = v.row
			}
		}
	}
	return nil
}

// closeIntervals sets ValidTo of the versions of one business key to the
// next version's ValidFrom. Since the versions have distinct ValidFrom, the
// intervals then tile the key's history, which the PostgreSQL merger checks
// afterwards (checkIntervals) and which needs no check here.
func (m *merge) closeIntervals(vs map[string]*version) error {
	from, to := m.stored[m.t.ValidFrom], m.stored[m.t.ValidTo]
	list := make([]*version, 0, len(vs))
	for _, v := range vs {
		list = append(list, v)
	}
	var err error
	slices.SortFunc(list, func(a, b *version) int {
		c, e := compareValues(a.row[from], b.row[from])
		err = cmp.Or(err, e)
		return c
	})
	if err != nil {
		return fmt.Errorf("backfill: merge %s: order versions by %s: %w", m.t.Table, m.t.ValidFrom, err)
	}
	for i, v := range list {
		var next any
		if i+1 < len(list) {
			next = list[i+1].row[from]
		}
		if sameValue(v.row[to], next) {
			continue
		}
		if !v.dirty {
			v.row, v.dirty = slices.Clone(v.row), true
		}
		v.row[to] = next
		if !v.inserted {
			m.res.Closed++
		}
	}
	return nil
}

// appendOnlyOrKeyless merges in AppendOnly and Keyless mode, which differ
// only in what a conflict inside the chunk rejects.
//
// Inside the chunk, per identity, the first row (lowest row number) is
// kept. AppendOnly: later rows with the same content are deduplicated,
// later rows with other content rejected, naming the columns in which
// they differ from the first. Keyless: when any row of the identity has
// other content than the first, every row of it is rejected (the derived
// key is ambiguous), naming every column that differs in the group;
// otherwise the later rows are deduplicated.
//
// Against the target, a kept row whose identity exists with other content
// is rejected; with the same content it is unchanged; absent, it is
// inserted. Nothing is ever updated.
func (m *merge) appendOnlyOrKeyless() error {
	keyless := m.t.Mode == backfill.Keyless
	groups := map[string][]stagedRow{}
	var order []string
	for _, r := range m.rows {
		k := m.id(r)
		if groups[k] == nil {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	var kept []stagedRow
	var inChunk []backfill.Exception
	for _, k := range order {
		g := groups[k]
		first := g[0]
		diffs := make([][]string, len(g))
		var ambiguous []string // the columns that differ in the group, as first seen
		for i, r := range g {
			diffs[i] = m.diffs(m.ofStaged(r), m.ofStaged(first))
			for _, d := range diffs[i] {
				if !slices.Contains(ambiguous, d) {
					ambiguous = append(ambiguous, d)
				}
			}
		}
		for i, r := range g {
			switch {
			case keyless && len(ambiguous) > 0:
				inChunk = append(inChunk, m.reject(r, ambiguous, m.stagedJSON(r),
					fmt.Sprintf("ambiguous derived key: rows %d and others share it with different content", first.row)))
			case i == 0:
				kept = append(kept, r)
			case len(diffs[i]) == 0:
				m.res.Deduplicated++
			default:
				inChunk = append(inChunk, m.reject(r, diffs[i], m.stagedJSON(r),
					fmt.Sprintf("conflicting content for event of row %d in the same chunk: %s differ", first.row, strings.Join(diffs[i], ", "))))
			}
		}
	}
	slices.SortStableFunc(inChunk, func(a, b backfill.Exception) int { return cmp.Compare(a.Row, b.Row) })
	m.res.Rejected = inChunk
	for _, r := range m.skipRefused(kept) {
		k := m.id(r)
		old, exists := m.tab.rows[k]
		switch {
		case !exists:
			m.res.Inserted++
			m.writes[k], m.source[k] = m.tableRow(r, nil), r.row
		case m.distinct(m.ofStaged(r), m.ofStored(old)):
			diffs := m.diffs(m.ofStaged(r), m.ofStored(old))
			reason := "conflicting content for existing event: " + strings.Join(diffs, ", ") + " differ"
			if keyless {
				reason = "ambiguous derived key: an existing row has the same key with different " + strings.Join(diffs, ", ")
			}
			raw := fmt.Sprintf(`{"staged": %s, "existing": %s}`, m.stagedJSON(r), jsonbText(m.tab.columns, old))
			m.res.Rejected = append(m.res.Rejected, m.reject(r, diffs, raw, reason))
		default:
			m.res.Unchanged++
		}
	}
	return nil
}

// stagedJSON renders a staged row as the PostgreSQL merger's to_jsonb of
// the staging row does.
func (m *merge) stagedJSON(r stagedRow) string { return jsonbText(m.names, r.values) }

// reject returns the exception of staged row r: diffs are the differing
// tracked columns, raw the row as JSON.
func (m *merge) reject(r stagedRow, diffs []string, raw, reason string) backfill.Exception {
	return backfill.Exception{Row: r.row, Raw: []byte(raw), Column: strings.Join(diffs, ","),
		Value: pgstore.KeyText(m.t.Key, m.stagedJSON(r)), Reason: reason}
}
