package backfill

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/stretchr/testify/require"
)

// guardsNothingLogs returns the signals of the WARN records of logs (JSON
// lines) that say a throttle signal guards nothing, in order.
func guardsNothingLogs(t *testing.T, logs string) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var rec struct {
			Level, Msg, Signal string
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if strings.Contains(rec.Msg, "guards nothing") {
			require.Equal(t, "WARN", rec.Level, line)
			out = append(out, rec.Signal)
		}
	}
	return out
}

// signalEvents returns the kinds and signals of run batch's events of
// whether throttle signals observe what they guard, in order.
func signalEvents(t *testing.T, db *sqlx.DB, batch int64) []string {
	t.Helper()
	var out []string
	require.NoError(t, db.Select(&out, `SELECT kind || ' ' || (detail->>'signal') FROM backfill.events
		WHERE batch_id = $1 AND kind IN ($2, $3) ORDER BY id`, batch, backfilltype.EventSignalInert, backfilltype.EventSignalObserves))
	return out
}

// TestThrottleSignalGuardingNothingWarns: on the tests' server, which has
// no replica, a replica lag throttle guards nothing: the call logs it once
// at WARN, records it once in the audit trail, and Status (and its text)
// shows it; the signals that can observe what they guard there (lock
// waiters and autovacuum, for a superuser, on a table autovacuum serves)
// give no warning.
func TestThrottleSignalGuardingNothingWarns(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	logs := &syncBuffer{}
	r := throttleRunner(t, db, "w1", func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
		// Readings a loaded machine does not cut: these tests are about
		// what the signals observe, not about their deadlines.
		c.ThrottleInterval = time.Second
		c.Throttles = []backfillthrottle.Throttle{
			{Signal: backfillthrottle.ReplicaLagSignal(), High: 10, Low: 2},
			{Signal: backfillthrottle.LockWaitersSignal(), High: 5},
			{Signal: backfillthrottle.AutovacuumSignal(""), High: 1},
		}
	})
	ctx := t.Context()
	job := liveJob(nil)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)

	require.Equal(t, []string{"replica_lag"}, guardsNothingLogs(t, logs.String()))
	require.Equal(t, []string{backfilltype.EventSignalInert + " replica_lag"}, signalEvents(t, db, rep.BatchID))
	st, err := r.Status(ctx, job)
	require.NoError(t, err)
	require.Len(t, st.ThrottleWarnings, 1, "%+v", st.ThrottleWarnings)
	w := st.ThrottleWarnings[0]
	require.Equal(t, "replica_lag", w.Signal)
	require.Contains(t, w.Why, "the server has no replicas")
	require.False(t, w.Since.IsZero())
	require.Contains(t, st.String(), "\nwarning: throttle signal replica_lag guards nothing since ")
}

// TestThrottleSignalWarningClears: an autovacuum throttle on a table with
// autovacuum_enabled = false guards nothing, and Status says so; once
// autovacuum serves the table again, the next call of the run clears the
// warning (an EventSignalObserves after the EventSignalInert) without
// logging it again.
func TestThrottleSignalWarningClears(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	_, err := db.Exec(`ALTER TABLE live SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	logs := &syncBuffer{}
	r := throttleRunner(t, db, "w1", func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
		// Readings a loaded machine does not cut: these tests are about
		// what the signals observe, not about their deadlines.
		c.ThrottleInterval = time.Second
		c.Throttles = []backfillthrottle.Throttle{{Signal: backfillthrottle.AutovacuumSignal(""), High: 1}}
	})
	ctx := t.Context()
	var fail atomic.Bool
	fail.Store(true)
	job := liveJob(func(c Chunk) {})
	inner := job.Extractor
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		if fail.Load() && c.Lo == 0 {
			return fmt.Errorf("fails on purpose: %w", backfilltype.ErrNotRetryable)
		}
		return inner.Extract(ctx, c, w)
	})
	rep, err := r.Run(ctx, job)
	require.Error(t, err, "the first call fails, so that the run goes on in a second call")
	require.Equal(t, []string{"autovacuum"}, guardsNothingLogs(t, logs.String()))
	st, err := r.Status(ctx, job)
	require.NoError(t, err)
	require.Len(t, st.ThrottleWarnings, 1)
	require.Contains(t, st.ThrottleWarnings[0].Why, `autovacuum is off for table "public"."live"`)

	_, err = db.Exec(`ALTER TABLE live SET (autovacuum_enabled = true)`)
	require.NoError(t, err)
	fail.Store(false)
	rep2, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, rep.BatchID, rep2.BatchID, "the same run")
	st, err = r.Status(ctx, job)
	require.NoError(t, err)
	require.Empty(t, st.ThrottleWarnings)
	require.NotContains(t, st.String(), "warning:")
	want := []string{backfilltype.EventSignalInert + " autovacuum", backfilltype.EventSignalObserves + " autovacuum"}
	require.Equal(t, want, signalEvents(t, db, rep.BatchID))
	require.Equal(t, []string{"autovacuum"}, guardsNothingLogs(t, logs.String()), "no second warning")
}

// TestBuiltinSignalsObserve: what each built-in signal answers on the
// tests' server (no replica, archive_mode off) for a superuser and for a
// role without pg_read_all_stats; a custom SQL signal always observes.
func TestBuiltinSignalsObserve(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	ctx := t.Context()
	scope := backfillthrottle.SignalScope{BatchID: 1, Table: `"public"."live"`}
	var archiveMode string
	require.NoError(t, db.Get(&archiveMode, `SELECT current_setting('archive_mode')`))
	ask := func(ex sqlx.ExtContext, s backfillthrottle.Signal, sc backfillthrottle.SignalScope) string {
		t.Helper()
		ok, why, err := s.(backfillthrottle.Observer).Observes(ctx, ex, sc)
		require.NoError(t, err, s.Name())
		require.Equal(t, ok, why == "", "%s: ok %v why %q", s.Name(), ok, why)
		return why
	}
	require.Contains(t, ask(db, backfillthrottle.ReplicaLagSignal(), scope), "the server has no replicas")
	if archiveMode == "off" {
		require.Contains(t, ask(db, backfillthrottle.ArchiveBacklogSignal(), scope), "archive_mode is off")
	}
	require.Empty(t, ask(db, backfillthrottle.AutovacuumSignal(""), scope))
	require.Contains(t, ask(db, backfillthrottle.AutovacuumSignal("public.nope"), scope), `table "public"."nope" does not exist`)
	require.Empty(t, ask(db, backfillthrottle.LockWaitersSignal(), scope))
	require.Empty(t, ask(db, backfillthrottle.SQLSignal("custom", `SELECT 1`), scope))
	_, isObserver := backfillthrottle.WALRateSignal().(backfillthrottle.Observer)
	require.False(t, isObserver, "the WAL rate observes wherever it reads")

	// A role without pg_read_all_stats (the tests' server is shared: the
	// role is named after the database, lower case letters, digits and
	// underscores, which need no quotes).
	var role string
	require.NoError(t, db.Get(&role, `SELECT current_database() || '_nostats'`))
	_, err := db.Exec(`CREATE ROLE ` + role)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP ROLE ` + role) })
	tx, err := db.Beginx()
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = tx.Exec(`SET LOCAL ROLE ` + role)
	require.NoError(t, err)
	require.Contains(t, ask(tx, backfillthrottle.LockWaitersSignal(), scope), "GRANT pg_monitor TO "+role)
	require.Contains(t, ask(tx, backfillthrottle.AutovacuumSignal(""), scope), "GRANT pg_monitor TO "+role)
}
