package backfill

import (
	"context"
	"database/sql"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestLostLeaseAfterServerCrash: the lease's commit does not wait for the
// WAL flush (leaseQuery, synchronous_commit off), so a server crash right
// after it can lose the lease, and the next lease of the chunk, by
// another worker, then takes the same lease_epoch number. The worker that
// lost its lease must not commit the chunk: its fence matches the key as
// well as the epoch. The server keeps its WAL unwritten for 10 s
// (wal_writer_delay) and nothing else commits between the lease and the
// crash (long heartbeats), so that the lease is really lost.
func TestLostLeaseAfterServerCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := pgtest.StartWith(ctx, pgtest.Options{SynchronousCommit: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.Stop()) }()
	db, err := sqlx.Open("postgres", srv.URL())
	require.NoError(t, err)
	defer db.Close()
	db.MustExec(`ALTER SYSTEM SET wal_writer_delay = '10s'`)
	db.MustExec(`ALTER SYSTEM SET bgwriter_lru_maxpages = 0`)
	db.MustExec(`SELECT pg_reload_conf()`)
	db.MustExec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)

	cfg := func(id string, logs *syncBuffer) *Config {
		return &Config{WorkerID: id, HeartbeatInterval: 20 * time.Second, StaleAfter: time.Minute,
			RetryBackoff: 20 * time.Millisecond, Logger: slog.New(slog.NewJSONHandler(logs, nil))}
	}
	var logsA, logsB syncBuffer
	ra, err := New(db, cfg("a", &logsA))
	require.NoError(t, err)
	rb, err := New(db, cfg("b", &logsB))
	require.NoError(t, err)

	// A leases chunk 2 and holds in its extraction until released.
	aHolds, releaseA := make(chan struct{}), make(chan struct{})
	var aOnce sync.Once
	doneA := goRun(ctx, ra, liveJob(func(c Chunk) {
		if c.Seq == 2 {
			aOnce.Do(func() { close(aHolds); <-releaseA })
		}
	}))
	<-aHolds
	type lease struct {
		Key   sql.NullString `db:"lease_key"`
		Epoch int64          `db:"lease_epoch"`
	}
	var before, after lease
	require.NoError(t, db.Get(&before, `SELECT lease_key, lease_epoch FROM backfill.chunks WHERE seq = 2`))
	require.True(t, before.Key.Valid, "A's lease is visible once committed")

	require.NoError(t, srv.RestartImmediate(ctx, nil))
	require.Eventually(t, func() bool { return db.PingContext(ctx) == nil }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, db.Get(&after, `SELECT lease_key, lease_epoch FROM backfill.chunks WHERE seq = 2`))
	require.False(t, after.Key.Valid, "A's lease was lost with the crash (its commit was not flushed)")
	require.Equal(t, before.Epoch-1, after.Epoch)

	// B leases chunk 2 at A's lost epoch, under its own key, and holds
	// until A's fence has failed.
	bHolds, releaseB := make(chan struct{}), make(chan struct{})
	var bOnce sync.Once
	doneB := goRun(ctx, rb, liveJob(func(c Chunk) {
		if c.Seq == 2 {
			bOnce.Do(func() { close(bHolds); <-releaseB })
		}
	}))
	<-bHolds
	var taken lease
	require.NoError(t, db.Get(&taken, `SELECT lease_key, lease_epoch FROM backfill.chunks WHERE seq = 2`))
	require.Equal(t, before.Epoch, taken.Epoch, "B's lease reuses the lost epoch number")
	require.NotEqual(t, before.Key.String, taken.Key.String)

	close(releaseA)
	require.Eventually(t, func() bool { return strings.Contains(logsA.String(), "chunk's fence failed") }, 60*time.Second, 20*time.Millisecond,
		"A's fence fails on B's lease of the same epoch")
	close(releaseB)
	resB, resA := <-doneB, <-doneA
	require.NoError(t, resB.err)
	t.Logf("A's run: %v (%s)", resA.err, resA.rep.Status)

	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 10*liveChunks, n)
	var chunks []struct {
		Seq      int    `db:"seq"`
		Status   string `db:"status"`
		Read     int64  `db:"rows_read"`
		Inserted int64  `db:"rows_inserted"`
	}
	require.NoError(t, db.Select(&chunks, `SELECT seq, status, rows_read, rows_inserted FROM backfill.chunks ORDER BY seq`))
	require.Len(t, chunks, liveChunks)
	for _, c := range chunks {
		require.Equal(t, "done", c.Status, "chunk %d", c.Seq)
		require.Equal(t, int64(10), c.Read, "chunk %d read once", c.Seq)
		require.Equal(t, int64(10), c.Inserted, "chunk %d inserted once", c.Seq)
	}
}
