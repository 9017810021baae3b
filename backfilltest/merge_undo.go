package backfilltest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// The fake undo log. A merge of a chunk whose ChunkRef names an undo table
// records, with the changes and on commit of the same fake transaction, one
// entry per row it writes: the key of a row it inserted, or the prior image
// of a row it updated. A rollback ([Merger.UndoRollback]) restores them
// chunk by chunk in reverse commit order, as the PostgreSQL merger's does from its
// undo table, and refuses rows that later batches changed (lineage
// UpdatedBy) unless forced. The fakes keep no summary of unchanged
// deliveries ([Manifest.DeliveredTable]), and do not roll back History
// targets.

// undoEntry is one row a chunk's merge wrote.
type undoEntry struct {
	batch  int64
	seq    int
	key    string // the table's row key (keyOf)
	insert bool
	before []any // the prior image of an updated row
}

var (
	_ backfilldriver.UndoLogWriter  = (*Merger)(nil)
	_ backfilldriver.MergerRollback = (*Merger)(nil)
	_ pgstore.ChunkOrder            = (*undoRollback)(nil)
)

// WritesUndoLog implements [backfilldriver.UndoLogWriter]: it returns true.
func (m *Merger) WritesUndoLog() bool { return true }

// undoEntries returns the entries for the writes of a merge of info's
// chunk into tab; m.mu must be held.
func undoEntries(info backfill.TableInfo, tab *fakeTable, writes map[string][]any) []undoEntry {
	if info.Chunk.UndoTable == "" || len(writes) == 0 {
		return nil
	}
	out := make([]undoEntry, 0, len(writes))
	for k := range writes {
		old, ok := tab.rows[k]
		out = append(out, undoEntry{batch: info.Chunk.BatchID, seq: info.Chunk.Seq, key: k, insert: !ok, before: slices.Clone(old)})
	}
	slices.SortFunc(out, func(a, b undoEntry) int { return strings.Compare(a.key, b.key) })
	return out
}

// UndoRollback implements [backfilldriver.MergerRollback] with the fake undo
// log; man keeps the bookkeeping (any [backfilldriver.ManifestRollback]). A
// History target is refused with [backfill.ErrUnsupported].
func (m *Merger) UndoRollback(ctx context.Context, db sqlx.ExtContext, man backfilldriver.ManifestRollback, info backfill.TableInfo, scope backfilltype.RollbackScope) (backfilldriver.UndoRollback, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := info.Target
	if t.Mode == backfill.History {
		return nil, fmt.Errorf("backfill: rollback %s: %w: the fake merger does not roll back History targets", t.Table, backfill.ErrUnsupported)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	tab := m.tables[t.Table]
	if tab == nil {
		return nil, fmt.Errorf("backfill: rollback: table %q: %w", t.Table, backfill.ErrTargetNotFound)
	}
	u := &undoRollback{m: m, man: man, table: t.Table, scope: scope, ib: -1, ub: -1}
	for i, c := range tab.columns {
		switch c {
		case t.Lineage.InsertedBy:
			u.ib = i
		case t.Lineage.UpdatedBy:
			u.ub = i
		}
	}
	if u.ib < 0 || u.ub < 0 {
		return nil, fmt.Errorf("backfill: rollback %s: %w: no lineage columns", t.Table, backfill.ErrInvalidConfig)
	}
	u.identity = pgstore.CompareColumns(info).Identity
	for _, c := range u.identity {
		u.idx = append(u.idx, slices.Index(tab.columns, c))
	}
	return u, nil
}

// undoRollback is a rollback of the fake undo log.
type undoRollback struct {
	m        *Merger
	man      backfilldriver.ManifestRollback
	table    string
	scope    backfilltype.RollbackScope
	ib, ub   int // lineage columns
	identity []string
	idx      []int // identity columns in the table
}

// undoPlan is what rolling back some chunks would do, against the committed
// rows: restore (key -> prior image, the earliest of the chunks) and
// delete; conflicts lists rows a later batch changed (key -> batch).
type undoPlan struct {
	restore   map[string][]any
	delete    map[string]bool
	conflicts map[string]int64
}

// plan computes what rolling back seqs does; whole adds the rows the
// batch inserted by lineage. m.mu must be held.
func (u *undoRollback) plan(seqs []int, whole, force bool) undoPlan {
	tab, b := u.m.tables[u.table], u.scope.BatchID
	p := undoPlan{restore: map[string][]any{}, delete: map[string]bool{}, conflicts: map[string]int64{}}
	// consider records row as a conflict when a batch other than b (and
	// not excluded) changed it last, or a NULL lineage, as PostgreSQL's
	// IS DISTINCT FROM; it reports whether the rollback touches the row.
	consider := func(k string, row []any) bool {
		by, ok := row[u.ub].(int64)
		mine := ok && by == b
		if !mine && !(ok && slices.Contains(u.scope.Exclude, by)) {
			p.conflicts[k] = by
		}
		return mine || force
	}
	// Entries of the later chunks first: the earliest image wins.
	for _, seq := range seqs {
		log := u.m.undo[u.table]
		for i := len(log) - 1; i >= 0; i-- {
			e := log[i]
			if e.batch != b || e.seq != seq {
				continue
			}
			row, ok := tab.rows[e.key]
			if !ok || !consider(e.key, row) {
				continue
			}
			if e.insert {
				p.delete[e.key] = true
			} else {
				p.restore[e.key] = e.before
			}
		}
	}
	if whole {
		for k, row := range tab.rows {
			if by, ok := row[u.ib].(int64); ok && by == b && consider(k, row) {
				p.delete[k] = true
			}
		}
	}
	return p
}

// keyJSON renders a table row's identity as PostgreSQL renders the jsonb.
func (u *undoRollback) keyJSON(k string) string {
	row := u.m.tables[u.table].rows[k]
	vals := make([]any, len(u.idx))
	for i, j := range u.idx {
		vals[i] = row[j]
	}
	return jsonbText(u.identity, vals)
}

// Conflicts implements [backfilldriver.UndoRollback.Conflicts].
func (u *undoRollback) Conflicts(ctx context.Context, db sqlx.ExtContext) (backfill.RollbackConflicts, error) {
	if err := ctx.Err(); err != nil {
		return backfill.RollbackConflicts{}, err
	}
	u.m.mu.Lock()
	defer u.m.mu.Unlock()
	p := u.plan(u.scope.Seqs, u.scope.Chunk == nil, false)
	c := backfill.RollbackConflicts{Changed: int64(len(p.conflicts))}
	for k, by := range p.conflicts {
		c.Rows = append(c.Rows, backfill.RollbackConflict{Key: u.keyJSON(k), Batch: by})
		if by != 0 && !slices.Contains(c.Batches, by) {
			c.Batches = append(c.Batches, by)
		}
	}
	slices.SortFunc(c.Rows, func(a, b backfill.RollbackConflict) int { return strings.Compare(a.Key, b.Key) })
	c.Rows = c.Rows[:min(100, len(c.Rows))]
	return c, nil
}

// Preview implements [backfilldriver.UndoRollback.Preview].
func (u *undoRollback) Preview(ctx context.Context, db sqlx.ExtContext, force bool) (deleted, restored int64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	u.m.mu.Lock()
	defer u.m.mu.Unlock()
	p := u.plan(u.scope.Seqs, u.scope.Chunk == nil, force)
	return int64(len(p.delete)), int64(len(p.restore)), nil
}

// RollBackChunk implements [backfilldriver.UndoRollback.RollBackChunk]; the
// rows change on commit of tx.
func (u *undoRollback) RollBackChunk(ctx context.Context, tx sqlx.ExtContext, seq int, force bool) (deleted, restored int64, done bool, err error) {
	if done, err = u.man.RollBackChunk(ctx, tx, u.scope.BatchID, seq); err != nil || !done {
		return 0, 0, false, err
	}
	u.m.mu.Lock()
	p := u.plan([]int{seq}, false, force)
	u.m.mu.Unlock()
	return int64(len(p.delete)), int64(len(p.restore)), true, u.write(tx, p)
}

// OrderChunks puts the chunks of the scope in reverse commit order, as
// the PostgreSQL merger's rollback does: the fake log is appended on
// commit, so the chunk with the last entry committed last. Chunks that
// logged nothing come last, in the scope's order.
func (u *undoRollback) OrderChunks(ctx context.Context, db sqlx.ExtContext) ([]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	u.m.mu.Lock()
	defer u.m.mu.Unlock()
	last := map[int]int{}
	for i, e := range u.m.undo[u.table] {
		if e.batch == u.scope.BatchID {
			last[e.seq] = i + 1
		}
	}
	seqs := slices.Clone(u.scope.Seqs)
	slices.SortStableFunc(seqs, func(a, b int) int { return cmp.Compare(last[b], last[a]) })
	u.scope.Seqs = seqs
	return seqs, nil
}

// Finish implements [backfilldriver.UndoRollback.Finish].
func (u *undoRollback) Finish(ctx context.Context, tx sqlx.ExtContext, whole, force bool, event func(deleted int64) backfilltype.Event) (deleted int64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if whole {
		u.m.mu.Lock()
		p := u.plan(nil, true, force)
		u.m.mu.Unlock()
		deleted = int64(len(p.delete))
		if err := u.write(tx, undoPlan{delete: p.delete}); err != nil {
			return 0, err
		}
		if err := u.man.RollBackRun(ctx, tx, u.scope.BatchID); err != nil {
			return 0, err
		}
	}
	return deleted, u.man.RecordEvent(ctx, tx, event(deleted))
}

// write applies p's restores and deletes on commit of tx.
func (u *undoRollback) write(tx sqlx.ExtContext, p undoPlan) error {
	return apply(tx, func() {
		u.m.mu.Lock()
		defer u.m.mu.Unlock()
		tab := u.m.tables[u.table]
		for k, row := range p.restore {
			tab.rows[k] = slices.Clone(row)
		}
		for k := range p.delete {
			delete(tab.rows, k)
		}
	})
}
