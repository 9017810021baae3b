package backfill

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// heldLock is one advisory lock of the two-int key space (pg_locks:
// classid, objid, objsubid 2).
type heldLock struct {
	NS   int32  `db:"classid"`
	Key  int32  `db:"objid"`
	Mode string `db:"mode"`
}

// stageAndMerge merges rows into info's target in a new transaction and
// returns it, uncommitted, with the advisory locks it holds.
func stageAndMerge(t *testing.T, db *sqlx.DB, m *pgstore.Merger, info TableInfo, rows ...[]any) (*sqlx.Tx, []heldLock) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	st, err := m.Stage(ctx, tx, info)
	require.NoError(t, err)
	defer st.Close()
	for i, r := range rows {
		require.NoError(t, st.Add(ctx, int64(i+1), r))
	}
	_, err = st.Merge(ctx)
	require.NoError(t, err)
	var locks []heldLock
	// classid and objid are the int4 keys as oids (unsigned).
	require.NoError(t, tx.Select(&locks, `SELECT (classid::bigint - CASE WHEN classid::bigint > 2147483647 THEN 4294967296 ELSE 0 END)::int AS classid,
			(objid::bigint - CASE WHEN objid::bigint > 2147483647 THEN 4294967296 ELSE 0 END)::int AS objid, mode
		FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND pid = pg_backend_pid() ORDER BY 2`))
	return tx, locks
}

// TestMergeKeyLocks: what a merge locks. A small chunk holds the target's
// lock -1 shared and one exclusive lock per key hash (keys equal under the
// column's collation share one; an integer key's locks cover ranges of
// 4,096 values); a chunk with more key hashes than
// mergeLockKeys, or with keys of a type without a hash function, holds
// lock -1 exclusively and nothing else. Targets have their own namespace.
// A merge of a key waits for the transaction holding its lock.
func TestMergeKeyLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`)
	db.MustExec(`CREATE TABLE a (k text COLLATE ci PRIMARY KEY, v int)`)
	db.MustExec(`CREATE TABLE b (k text PRIMARY KEY, v int)`)
	db.MustExec(`CREATE TABLE bits (k bit(8) PRIMARY KEY, v int)`)
	m := pgstore.NewMerger()
	prep := func(table string) TableInfo {
		info, err := m.Prepare(ctx, db, Target{Table: table, Key: []string{"k"}})
		require.NoError(t, err)
		return info
	}
	a, b, bits := prep("a"), prep("b"), prep("bits")

	tx, locks := stageAndMerge(t, db, m, a, []any{"Apple", 1}, []any{"pear", 2}, []any{"APPLE", 3}, []any{"fig", 4})
	require.NoError(t, tx.Rollback())
	nsA := pgstore.LockNamespace("public.a")
	require.Len(t, locks, 1+3, "apple (both spellings), pear, fig and the target")
	require.Equal(t, heldLock{nsA, pgstore.WholeTarget, "ShareLock"}, locks[0])
	for _, l := range locks[1:] {
		require.Equal(t, nsA, l.NS)
		require.GreaterOrEqual(t, l.Key, int32(0))
		require.Equal(t, "ExclusiveLock", l.Mode)
	}

	many := make([][]any, pgstore.MergeLockKeys+1)
	for i := range many {
		many[i] = []any{fmt.Sprintf("k%d", i), i}
	}
	big, locks := stageAndMerge(t, db, m, b, many...)
	require.Equal(t, []heldLock{{pgstore.LockNamespace("public.b"), pgstore.WholeTarget, "ExclusiveLock"}}, locks, "more keys than mergeLockKeys")

	db.MustExec(`CREATE TABLE ids (k bigint PRIMARY KEY, v int)`)
	ids := prep("ids")
	rows := make([][]any, 10000)
	for i := range rows {
		rows[i] = []any{int64(100000 + i), i}
	}
	tx, locks = stageAndMerge(t, db, m, ids, rows...)
	require.NoError(t, tx.Rollback())
	require.Equal(t, heldLock{pgstore.LockNamespace("public.ids"), pgstore.WholeTarget, "ShareLock"}, locks[0])
	require.Len(t, locks, 1+3, "ids 100,000 to 109,999: the ranges of 4,096 from 98,304, 102,400 and 106,496")

	tx, locks = stageAndMerge(t, db, m, bits, []any{"10101010", 1})
	require.NoError(t, tx.Rollback())
	require.Equal(t, []heldLock{{pgstore.LockNamespace("public.bits"), pgstore.WholeTarget, "ExclusiveLock"}}, locks, "bit has no hash function")

	// Another target does not wait for b's whole-target lock; a key of b
	// does, until b's transaction ends.
	tx, _ = stageAndMerge(t, db, m, a, []any{"k1", 1})
	require.NoError(t, tx.Rollback())
	tx2, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx2.Get(&pid, `SELECT pg_backend_pid()`))
	done := make(chan error, 1)
	go func() {
		st, err := m.Stage(ctx, tx2, b)
		if err == nil {
			defer st.Close()
			err = st.Add(ctx, 1, []any{"k1", 100})
		}
		if err == nil {
			_, err = st.Merge(ctx)
		}
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		require.NoError(t, db.Get(&waiting, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted)`, pid))
		if waiting {
			break
		}
		require.True(t, time.Now().Before(deadline), "the merge of k1 never waited for the transaction holding b")
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, big.Commit())
	require.NoError(t, <-done)
	require.NoError(t, tx2.Commit())
	var v int
	require.NoError(t, db.Get(&v, `SELECT v FROM b WHERE k = 'k1'`))
	require.Equal(t, 100, v, "the waiting merge saw the committed row and updated it")
}
