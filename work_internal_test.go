package backfill

import (
	"context"
	"database/sql/driver"
	"fmt"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/stretchr/testify/require"
)

// TestExitCodeOfDeploymentErrors: what a restart cannot fix (a missing
// privilege, a manifest behind its version, a refused login, a pooler in
// statement mode) is ExitUsage, not ExitFailed ("see last_error": there is
// no run) nor ExitTempFail (a scheduler would restart it forever); a lost
// connection, and lock waits or faults past their bound (IsRetryable),
// are ExitTempFail.
func TestExitCodeOfDeploymentErrors(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		err  error
		want ExitCode
	}{
		{"privilege", fmt.Errorf("backfill: job %q: %w", "j", &PrivilegeError{Role: "loader", Missing: []backfilltype.Privilege{{Object: "TABLE t", Privilege: "INSERT"}}}), ExitUsage},
		{"schema behind", fmt.Errorf("backfill: manifest init: %w: schema at 11", ErrSchemaBehind), ExitUsage},
		{"statement pooler", fmt.Errorf("%w: %w: drops the connection at BEGIN", pgstore.ErrStatementPooler, driver.ErrBadConn), ExitUsage},
		{"wrong password", &pq.Error{Code: "28P01", Message: `password authentication failed for user "loader"`}, ExitUsage},
		{"wrong password through PgBouncer", &pq.Error{Code: "08P01", Message: `password authentication failed for user "loader"`}, ExitUsage},
		{"connection lost", fmt.Errorf("begin: %w", driver.ErrBadConn), ExitTempFail},
		{"server shutting down", &pq.Error{Code: "57P01", Message: "terminating connection due to administrator command"}, ExitTempFail},
		{"paused by an operator", fmt.Errorf("backfill: job %q batch 1: %w: paused by ann: lag", "j", ErrRunPaused), ExitTempFail},
		{"cancelled by an operator", fmt.Errorf("backfill: job %q batch 1: %w: cancelled by ann: scope", "j", ErrRunCancelled), ExitCancelled},
		{"chunks still pending", fmt.Errorf("backfill: job %q batch 1: %w (5 of 6 chunks done, 0 open)", "j", ErrRunIncomplete), ExitTempFail},
		{"manifest lock waits used up", fmt.Errorf("backfill: lease a chunk of batch 1: waited for locks 8 times: %w",
			&pq.Error{Code: "55P03", Message: `canceling statement due to lock timeout`}), ExitTempFail},
		{"faults past their bound", fmt.Errorf("backfill: batch 1: %w: %w", pgstore.ErrFaultBound, &pq.Error{Code: "53300", Message: "too many connections"}), ExitTempFail},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, exitCode(ctx, Report{}, c.err))
		})
	}
}

// TestKilledWorkerIsLostWhenRunEnds: a worker that stopped heartbeating
// (kill -9 leaves its row "working" forever) is marked lost when the run
// ends; a live worker's row is left to its own finish.
func TestKilledWorkerIsLostWhenRunEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w", nil)
	rep, err := r.Run(ctx, liveJob(nil))
	require.NoError(t, err)
	m := r.cfg.Manifest.(*PGManifest)
	// A worker of the run that died before the end, and one still alive.
	require.NoError(t, m.RegisterWorker(ctx, r.db, backfilltype.Worker{Key: "dead", ID: "killed", BatchID: rep.BatchID, Job: "live", StaleAfter: time.Second}))
	require.NoError(t, m.RegisterWorker(ctx, r.db, backfilltype.Worker{Key: "alive", ID: "alive", BatchID: rep.BatchID, Job: "live", StaleAfter: time.Hour}))
	_, err = db.Exec(`UPDATE backfill.workers SET heartbeat_at = now() - interval '1 minute' WHERE worker_key IN ('dead', 'alive')`)
	require.NoError(t, err)
	_, err = db.Exec(`UPDATE backfill.runs SET status = 'running' WHERE batch_id = $1`, rep.BatchID)
	require.NoError(t, err)
	_, err = m.FinishRun(ctx, r.db, rep.BatchID, false, "")
	require.NoError(t, err)
	ws, err := m.Workers(ctx, r.db, rep.BatchID)
	require.NoError(t, err)
	states := map[string]string{}
	for _, w := range ws {
		states[w.Key] = w.State
	}
	require.Equal(t, "lost", states["dead"])
	require.Equal(t, "working", states["alive"])
	require.Equal(t, "finished", states[ws[len(ws)-1].Key], "the run's own worker finished itself")
}
