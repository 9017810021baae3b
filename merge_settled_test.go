package backfill

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestUpsertSettledByLock: a replay of unchanged Upsert chunks is decided
// by the statement that locks the rows to change, which looks every
// staged key up once; the upsert, whose join would look every key up a
// second time, runs only for the chunks with something to write (issue
// 15: half of an unchanged replay's merge). The counts stay exact, and
// a chunk with a changed, a deleted and an unchanged row still updates,
// inserts and locks as before.
func TestUpsertSettledByLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	sdb := &stmtDB{DB: Postgres(db)}
	r, err := NewWithDB(sdb, &Config{WorkerID: "settled"})
	require.NoError(t, err)
	job := liveJob(nil)
	job.Chunker = IntRange(0, 30, 10)
	_, err = r.Run(ctx, job)
	require.NoError(t, err)

	// upserts counts, per chunk transaction with a staging COPY, the
	// upsert statements it ran.
	upserts := func() (perChunk []int) {
		sdb.mu.Lock()
		defer sdb.mu.Unlock()
		for _, tx := range sdb.txs {
			copied, n := false, 0
			for _, q := range tx.stmts {
				copied = copied || strings.HasPrefix(q, "COPY ") && !strings.Contains(q, `"backfill".chunks`)
				if strings.Contains(q, "WITH j AS MATERIALIZED") {
					n++
				}
			}
			if copied {
				perChunk = append(perChunk, n)
			}
		}
		sdb.txs = nil
		return perChunk
	}
	upserts()

	job.NewRun = true
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, Counts{Read: 30, Unchanged: 30}, rep.Counts)
	require.Equal(t, []int{0, 0, 0}, upserts(), "upserts per chunk of an unchanged replay")

	// Chunk [10, 20): one row changed, one deleted.
	_, err = db.Exec(`UPDATE live SET v = 'changed' WHERE id = 12; DELETE FROM live WHERE id = 15`)
	require.NoError(t, err)
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, Counts{Read: 30, Inserted: 1, Updated: 1, Unchanged: 28}, rep.Counts)
	require.Equal(t, []int{0, 1, 0}, upserts(), "upserts per chunk of a replay with one chunk to change")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live WHERE v = 'v' || id`))
	require.Equal(t, 30, n)

	// Only a deleted row: nothing to lock, one to insert.
	_, err = db.Exec(`DELETE FROM live WHERE id = 25`)
	require.NoError(t, err)
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, Counts{Read: 30, Inserted: 1, Unchanged: 29}, rep.Counts)
	require.Equal(t, []int{0, 0, 1}, upserts())
}

// TestUpsertSettledConcurrentDelete: a row that differs in the lock
// statement's snapshot and that another transaction deletes while the
// lock waits for it is not settled as unchanged: the upsert decides it
// from a new snapshot and inserts it again, as it did before the lock
// statement settled chunks.
func TestUpsertSettledConcurrentDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r, err := New(db, &Config{WorkerID: "settled-delete"})
	require.NoError(t, err)
	job := liveJob(nil)
	job.Chunker = IntRange(0, 10, 10)
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	_, err = db.Exec(`UPDATE live SET v = 'changed' WHERE id = 5`)
	require.NoError(t, err)

	other, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = other.Rollback() }()
	_, err = other.Exec(`DELETE FROM live WHERE id = 5`)
	require.NoError(t, err)

	job.NewRun = true
	done := goRun(ctx, r, job)
	// The lock statement waits for the deleting transaction's row lock.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE OF t%'`))
		return n == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, other.Commit())
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, Counts{Read: 10, Inserted: 1, Unchanged: 9}, res.rep.Counts)
	var v string
	require.NoError(t, db.Get(&v, `SELECT v FROM live WHERE id = 5`))
	require.Equal(t, "v5", v)
}
