package backfill

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/stretchr/testify/require"
)

// TestPausedRunReleasesLeaseOfChunkInFlight: a run paused while a chunk
// is extracted (an operator's pause, a gate on another chunk): the
// chunk's fence fails, and its lease is released, so that a resume by a
// new process does the chunk at once. On the commit before this fix the
// lease stayed; the resume neither took it (too young) nor waited for it,
// and returned nil with the run unfinished.
func TestPausedRunReleasesLeaseOfChunkInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r1 := liveRunner(t, db, "w1", nil)
	r1.cfg.StaleAfter, r1.cfg.HeartbeatInterval = 30*time.Second, time.Second
	_, _ = r1.Run(ctx, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			var b int64
			require.NoError(t, db.Get(&b, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
			require.NoError(t, r1.caps.validations.PauseRun(ctx, db, b, "operator pause"))
		}
	}))
	var key sql.NullString
	require.NoError(t, db.Get(&key, `SELECT lease_key FROM backfill.chunks WHERE seq = 0`))
	require.False(t, key.Valid, "the paused chunk's lease is released")

	r2 := liveRunner(t, db, "w2", nil)
	r2.cfg.StaleAfter, r2.cfg.HeartbeatInterval = 30*time.Second, time.Second
	rep, err := r2.Resume(ctx, liveJob(nil), "oncall", "resume after pause")
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, liveChunks, chunkStatuses(t, db)["done"])
}

// TestYoungLeaseOfDeadWorkerIsWaitedFor: a worker killed right after it
// leased a chunk (its heartbeat already past StaleAfter, its lease not
// yet): a new process must wait for that lease until it is stale, then
// take it over, not return with the chunk pending. On the commit before
// this fix the claim judged the lease live and the wait judged it dead:
// the resume returned nil, status running, a chunk pending.
func TestYoungLeaseOfDeadWorkerIsWaitedFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r1 := liveRunner(t, db, "w1", nil)
	rep, err := r1.Run(ctx, liveJob(nil))
	require.NoError(t, err)
	// As after a kill -9: the run running, chunk 0 pending, leased 29 s
	// ago by a worker whose last heartbeat is 31 s old.
	db.MustExec(`UPDATE backfill.runs SET status = 'running', finished_at = NULL WHERE batch_id = $1`, rep.BatchID)
	db.MustExec(`UPDATE backfill.chunks SET status = 'pending', lease_key = 'dead', lease_epoch = lease_epoch + 1,
		leased_at = now() - interval '29 s' WHERE batch_id = $1 AND seq = 0`, rep.BatchID)
	db.MustExec(`DELETE FROM live WHERE id < 10`)
	m := r1.cfg.Manifest.(*PGManifest)
	require.NoError(t, m.RegisterWorker(ctx, r1.db, backfilltype.Worker{Key: "dead", ID: "killed", BatchID: rep.BatchID, Job: "live", StaleAfter: 30 * time.Second}))
	db.MustExec(`UPDATE backfill.workers SET heartbeat_at = now() - interval '31 s' WHERE worker_key = 'dead'`)

	var logs syncBuffer
	r2 := liveRunner(t, db, "w2", &logs)
	r2.cfg.StaleAfter, r2.cfg.HeartbeatInterval = 30*time.Second, time.Second
	rep, err = r2.Run(ctx, liveJob(nil))
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, 1, rep.ChunksRun, "the new process took the lease over")
	require.Contains(t, logs.String(), `"msg":"backfill: waiting for a chunk in flight"`)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 10*liveChunks, n)
}
