package backfill

import (
	"context"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/stretchr/testify/require"
)

// TestOpenThrottlePeriodOfKilledWorkerEndsAtItsLastHeartbeat: a worker
// killed (kill -9) during a hold never ends its throttle period; the
// period is read as ending at the worker's last heartbeat once that is
// stale, not as growing forever, so the run's time split stays right.
// A live worker's open period ends now.
func TestOpenThrottlePeriodOfKilledWorkerEndsAtItsLastHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w", nil)
	rep, err := r.Run(ctx, liveJob(nil))
	require.NoError(t, err)
	m := r.cfg.Manifest.(*PGManifest)
	for _, k := range []string{"killed", "alive"} {
		require.NoError(t, m.RegisterWorker(ctx, r.db, backfilltype.Worker{Key: k, ID: k, BatchID: rep.BatchID, Job: "live", StaleAfter: 10 * time.Second}))
	}
	db.MustExec(`UPDATE backfill.workers SET heartbeat_at = now() - interval '1 hour' WHERE worker_key = 'killed'`)
	db.MustExec(`INSERT INTO backfill.throttle_periods (batch_id, worker_key, signal, reason, value, high, low, started_at)
		VALUES ($1, 'killed', 'lag', 'held', 5, 1, 1, now() - interval '2 hours'), ($1, 'alive', 'lag', 'held', 5, 1, 1, now() - interval '2 hours')`, rep.BatchID)
	ps, err := m.ThrottlePeriods(ctx, r.db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ps, 2)
	got := map[string]time.Duration{}
	for _, p := range ps {
		require.Nil(t, p.EndedAt, "never ended by its worker")
		got[p.WorkerKey] = p.Ended.Sub(p.StartedAt)
	}
	require.InDelta(t, time.Hour.Seconds(), got["killed"].Seconds(), 60, "ends at the killed worker's last heartbeat")
	require.InDelta(t, (2 * time.Hour).Seconds(), got["alive"].Seconds(), 60, "a live worker's hold lasts until now")
}
