package backfillthrottle_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

type goalSignal interface {
	backfillthrottle.Calibrator
	Baseline() time.Duration
	Source() backfillthrottle.GoalSource
}

// readUntilCalibrated reads sig (with between before each reading) until
// its calibration ends, and returns its first value after it.
func readUntilCalibrated(t *testing.T, db sqlx.ExtContext, sig goalSignal, between func()) float64 {
	t.Helper()
	for range 500 {
		if between != nil {
			between()
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		v, err := sig.Read(ctx, db, backfillthrottle.SignalScope{})
		cancel()
		require.NoError(t, err)
		if !sig.Calibrating() {
			return v
		}
		require.Zero(t, v, "a reading while calibrating")
	}
	t.Fatal("the calibration did not end")
	return 0
}

// TestLatencyGoalProbeOnPostgres: the probe's calibration reads a
// baseline from real probes, timed on the server with their commit (a
// deferred trigger sleeping 5 ms at commit stands for a slow WAL flush);
// a probe that fails is an error and leaves no broken connection in the
// pool (one connection: the next reading works).
func TestLatencyGoalProbeOnPostgres(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.SetMaxOpenConns(1)
	_, err := db.ExecContext(t.Context(), `CREATE TABLE goal_probe (id int);
		CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.005); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON goal_probe DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION slow_commit()`)
	require.NoError(t, err)

	bad, err := backfillthrottle.LatencyGoal(`SELECT nonsense`, 0.3, backfillthrottle.GoalOptions{})
	require.NoError(t, err)
	_, err = bad.Signal.Read(t.Context(), db, backfillthrottle.SignalScope{})
	require.ErrorContains(t, err, backfillthrottle.GoalSignalName)

	th, err := backfillthrottle.LatencyGoal(`INSERT INTO goal_probe VALUES (1)`, 0.3,
		backfillthrottle.GoalOptions{Calibrate: 10 * time.Millisecond, Samples: 2, Recalibrate: -1})
	require.NoError(t, err)
	sig := th.Signal.(goalSignal)
	v := readUntilCalibrated(t, db, sig, nil)
	require.Equal(t, backfillthrottle.SourceProbe, sig.Source())
	require.GreaterOrEqual(t, sig.Baseline(), 5*time.Millisecond, "the commit's 5 ms are in the probe's time")
	require.Equal(t, 1.0, v, "the first reading after the calibration: an empty window")
	v, err = sig.Read(t.Context(), db, backfillthrottle.SignalScope{})
	require.NoError(t, err)
	require.Positive(t, v)
	var n int
	require.NoError(t, db.GetContext(t.Context(), &n, `SELECT count(*) FROM goal_probe`))
	require.GreaterOrEqual(t, n, minCalibration+2, "every probe committed")
}

const minCalibration = 10

// TestLatencyGoalStatementsOnPostgres: on a server that loads
// pg_stat_statements, the goal without a probe calibrates on the
// application's statements (another role's: 2 ms each), not on the
// Runner's own (50 ms each, the backfill's role), and reads their mean
// over the baseline afterwards. Without pg_stat_statements that goal is a
// configuration error.
func TestLatencyGoalStatementsOnPostgres(t *testing.T) {
	t.Parallel()
	noExt := pgtest.New(t)
	th, err := backfillthrottle.LatencyGoal("", 0.3, backfillthrottle.GoalOptions{})
	require.NoError(t, err)
	_, err = th.Signal.Read(t.Context(), noExt, backfillthrottle.SignalScope{})
	require.ErrorIs(t, err, backfilltype.ErrInvalidConfig)
	require.ErrorContains(t, err, "pg_stat_statements")

	srv, err := pgtest.StartWith(t.Context(), pgtest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	admin := sqlx.MustOpen("postgres", srv.URL())
	_, err = admin.ExecContext(t.Context(), `ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'`)
	require.NoError(t, err)
	admin.Close()
	require.NoError(t, srv.RestartImmediate(t.Context(), nil))
	db := sqlx.MustOpen("postgres", srv.URL())
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.ExecContext(t.Context(), `CREATE EXTENSION pg_stat_statements; CREATE ROLE goal_app LOGIN`)
	require.NoError(t, err)
	u, err := url.Parse(srv.URL())
	require.NoError(t, err)
	u.User = url.User("goal_app")
	app := sqlx.MustOpen("postgres", u.String())
	t.Cleanup(func() { _ = app.Close() })

	th, err = backfillthrottle.LatencyGoal("", 0.3, backfillthrottle.GoalOptions{Calibrate: 10 * time.Millisecond, Window: 3 * time.Second, Recalibrate: -1})
	require.NoError(t, err)
	sig := th.Signal.(goalSignal)
	work := func() {
		for range 4 {
			_, err := app.ExecContext(t.Context(), `SELECT pg_sleep(0.002)`)
			require.NoError(t, err)
		}
		_, err := db.ExecContext(t.Context(), `SELECT pg_sleep(0.05)`) // the backfill's role
		require.NoError(t, err)
	}
	readUntilCalibrated(t, db, sig, work)
	require.Equal(t, backfillthrottle.SourceStatements, sig.Source())
	require.GreaterOrEqual(t, sig.Baseline(), 2*time.Millisecond, "the application's statements")
	require.Less(t, sig.Baseline(), 20*time.Millisecond, "not the Runner's own 50 ms ones")
	// The application slows down to 8 ms a statement: once half a
	// window has passed since the calibration (readings are 1 until
	// then), the window's mean is above the goal.
	for i := 0; ; i++ {
		require.Less(t, i, 1000, "the slower statements never read above the goal")
		for range 3 {
			_, err := app.ExecContext(t.Context(), `SELECT pg_sleep(0.008)`)
			require.NoError(t, err)
		}
		v, err := sig.Read(t.Context(), db, backfillthrottle.SignalScope{})
		require.NoError(t, err)
		if v > 1.3 {
			break
		}
		require.True(t, v == 1 || v == 0, "1 early in the window (0 if a stalled test calibrated again), not %v", v)
	}
}
