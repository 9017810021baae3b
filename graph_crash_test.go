package backfill_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

func init() {
	childProcess("BACKFILL_GRAPH_CRASH_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, crashGraphConfig())
		if err != nil {
			return err
		}
		_, err = r.RunGraph(context.Background(), crashGraph())
		return err
	})
}

func crashGraphConfig() *backfill.Config {
	return &backfill.Config{Concurrency: 2, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second, ThrottleInterval: 50 * time.Millisecond}
}

// crashGraph is three modules in a chain, each chunk's extraction a
// little slow so that a kill finds chunks in flight.
func crashGraph() backfill.Graph {
	slow := func(backfill.Chunk) error {
		time.Sleep(20 * time.Millisecond)
		return nil
	}
	return backfill.Graph{Name: "crash", Modules: []backfill.Module{
		{Name: "airports", Jobs: []backfill.Job{graphJobOf("cr_airports", 5, slow)}},
		{Name: "flights", Jobs: []backfill.Job{graphJobOf("cr_flights", 10, slow)}, DependsOn: []string{"airports"}},
		{Name: "route_stats", Jobs: []backfill.Job{graphJobOf("cr_route_stats", 5, slow)}, DependsOn: []string{"flights"}},
	}}
}

// TestRunGraphKilledConverges: a RunGraph process killed (SIGKILL) with
// chunks in flight, then a second RunGraph: every module completes,
// every row is loaded once (the done chunks' inserts add up to the
// rows), and no child's chunk started before its parents' overlapping
// chunks were committed, across both processes.
func TestRunGraphKilledConverges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { _ = db.Close() })
	for _, tb := range []string{"cr_airports", "cr_flights", "cr_route_stats"} {
		_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %q (id bigint PRIMARY KEY, v text, backfill_inserted_by bigint, backfill_updated_by bigint)`, tb))
		require.NoError(t, err)
	}
	killChildWhen(t, db, "BACKFILL_GRAPH_CRASH_CHILD", url, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`, 9)
	var done int
	require.NoError(t, db.Get(&done, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`))
	require.Less(t, done, 8+4+8, "the kill left work to do")

	r, err := backfill.New(db, crashGraphConfig())
	require.NoError(t, err)
	rep, err := r.RunGraph(ctx, crashGraph())
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, map[string]string{"airports": "completed", "flights": "completed", "route_stats": "completed"}, moduleStates(rep.Modules))
	for _, tb := range []string{"cr_airports", "cr_flights", "cr_route_stats"} {
		var o struct {
			Rows     int `db:"rows"`
			Inserted int `db:"inserted"`
			Read     int `db:"read"`
		}
		require.NoError(t, db.Get(&o, fmt.Sprintf(`SELECT (SELECT count(*) FROM %q) AS rows,
			(SELECT sum(c.rows_inserted) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.job_name = $1 AND c.status = 'done') AS inserted,
			(SELECT sum(c.rows_read) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.job_name = $1 AND c.status = 'done') AS read`, tb), tb))
		require.Equal(t, 40, o.Rows, tb)
		require.Equal(t, 40, o.Inserted, "%s: every row inserted once", tb)
		require.Equal(t, 40, o.Read, tb)
	}
	requireGraphOrder(t, db, "cr_flights", "cr_airports")
	requireGraphOrder(t, db, "cr_route_stats", "cr_flights")
}
