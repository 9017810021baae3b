package backfill_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// untilLoaded is a throttle signal that reads 1 (load) until table holds
// n rows, 0 after.
type untilLoaded struct {
	table string
	n     int
}

func (s untilLoaded) Name() string { return "until_" + s.table }

func (s untilLoaded) Read(ctx context.Context, db sqlx.ExtContext, _ backfillthrottle.SignalScope) (float64, error) {
	var n int
	if err := sqlx.GetContext(ctx, db, &n, `SELECT count(*) FROM `+s.table); err != nil {
		return 0, err
	}
	if n < s.n {
		return 1, nil
	}
	return 0, nil
}

// TestGraphThrottleParksDeferrable: while a throttle holds, the
// deferrable module (of the higher priority) parks and the essential
// one runs, one chunk at a time; once the hold releases the deferrable
// one runs. Asserted from the manifest's chunk times, not from timing.
func TestGraphThrottleParksDeferrable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	g := backfill.Graph{Name: "load", Modules: []backfill.Module{
		{Name: "reports", Jobs: []backfill.Job{graphTable(t, db, "th_reports", 5, nil)}, Class: backfill.ModuleDeferrable, Priority: 10},
		{Name: "orders", Jobs: []backfill.Job{graphTable(t, db, "th_orders", 5, nil)}},
	}}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 3, ThrottleInterval: 10 * time.Millisecond,
		Throttles: []backfillthrottle.Throttle{{Signal: untilLoaded{table: "th_orders", n: 40}, High: 1, Low: 0.5}}})
	require.NoError(t, err)
	rep, err := r.RunGraph(ctx, g)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"reports": "completed", "orders": "completed"}, moduleStates(rep.Modules))

	var o struct {
		Early   int `db:"early"`
		Overlap int `db:"overlap"`
		Orders  int `db:"orders"`
	}
	require.NoError(t, db.Get(&o, `WITH c AS (SELECT r.job_name, c.started_at, c.finished_at FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE c.status = 'done')
		SELECT (SELECT count(*) FROM c d WHERE d.job_name = 'th_reports' AND d.started_at < (SELECT max(finished_at) FROM c WHERE job_name = 'th_orders')) AS early,
			(SELECT count(*) FROM c a, c b WHERE a.job_name = 'th_orders' AND b.job_name = 'th_orders' AND a.started_at < b.started_at AND b.started_at < a.finished_at) AS overlap,
			(SELECT count(*) FROM c WHERE job_name = 'th_orders') AS orders`))
	require.Equal(t, 8, o.Orders)
	require.Zero(t, o.Early, "a deferrable chunk started while the throttle held")
	require.Zero(t, o.Overlap, "essential chunks ran more than one at a time under the hold")
}
