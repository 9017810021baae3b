package backfilltest

import (
	"context"
	"database/sql"
)

// The fake's key locks, as the PostgreSQL merger's advisory locks (see
// [pgstore.MergeLockKeys]): a merge locks the business keys (Target.Key) of
// its staged rows before it reads the table, and holds them until its
// transaction ends, so that two transactions merging the same key run one
// after the other and the second decides from the first one's committed
// rows. A merge takes all its keys at once, so merges never wait for each
// other in a cycle.

// lockKeys waits until no other owner holds any of keys of table, then
// takes them for owner (a *Tx, or the stager of a merge outside one).
func (m *Merger) lockKeys(ctx context.Context, owner any, table string, keys []string) error {
	for {
		m.mu.Lock()
		if m.keyLocks == nil {
			m.keyLocks = map[string]any{}
			m.released = make(chan struct{})
		}
		free := true
		for _, k := range keys {
			if o, held := m.keyLocks[table+"\x00"+k]; held && o != owner {
				free = false
				break
			}
		}
		if free {
			for _, k := range keys {
				m.keyLocks[table+"\x00"+k] = owner
			}
			m.mu.Unlock()
			return nil
		}
		wait := m.released
		m.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// unlockKeys releases every key lock of owner and wakes the waiters.
func (m *Merger) unlockKeys(owner any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, o := range m.keyLocks {
		if o == owner {
			delete(m.keyLocks, k)
			n++
		}
	}
	if n > 0 {
		close(m.released)
		m.released = make(chan struct{})
	}
}

// lockStaged takes the key locks of the staged rows: until the end of the
// fake transaction, or, outside one, until the returned function runs.
func (s *stager) lockStaged(ctx context.Context) (unlock func(), err error) {
	t := s.info.Target
	names := make([]string, len(s.info.Columns))
	for i, c := range s.info.Columns {
		names[i] = c.Name
	}
	seen := map[string]bool{}
	var keys []string
	for _, r := range s.rows {
		if k := keyOf(s.info.Columns, names, t.Key, r.values); !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	var owner any = s
	tx, inTx := s.tx.(*Tx)
	if inTx {
		owner = tx
	}
	if err := s.m.lockKeys(ctx, owner, t.Table, keys); err != nil {
		return nil, err
	}
	if !inTx {
		return func() { s.m.unlockKeys(owner) }, nil
	}
	if !tx.OnEnd(func() { s.m.unlockKeys(owner) }) {
		s.m.unlockKeys(owner)
		return nil, sql.ErrTxDone
	}
	return func() {}, nil
}
