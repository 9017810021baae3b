package backfill

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/hysteresis"
	"github.com/pgbackfill/backfill/internal/pacer"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// fakeSignal is a signal whose value the test sets; it counts its
// readings.
type fakeSignal struct {
	v     atomic.Uint64
	reads atomic.Int64
}

func (f *fakeSignal) set(v float64) { f.v.Store(math.Float64bits(v)) }
func (f *fakeSignal) Name() string  { return "fake" }
func (f *fakeSignal) Read(context.Context, sqlx.ExtContext, backfillthrottle.SignalScope) (float64, error) {
	f.reads.Add(1)
	return math.Float64frombits(f.v.Load()), nil
}

// throttleRunner is a liveRunner with cfg's throttle settings.
func throttleRunner(t *testing.T, db *sqlx.DB, id string, set func(*Config)) *Runner {
	cfg := &Config{WorkerID: id, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second, RetryBackoff: 10 * time.Millisecond,
		ThrottleInterval: 10 * time.Millisecond}
	set(cfg)
	r, err := New(db, cfg)
	require.NoError(t, err)
	return r
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !f() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(5 * time.Millisecond)
	}
}

// TestThrottleHoldsRecordsPeriodsAndSplitsTime: a signal above High
// holds the run before its first claim (no chunk is read while it
// holds); below Low it releases and the run completes. The hold is one
// throttle period in the manifest, and the run's time split sums up.
func TestThrottleHoldsRecordsPeriodsAndSplitsTime(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	sig := &fakeSignal{}
	sig.set(5)
	var read atomic.Int64
	job := liveJob(func(Chunk) { read.Add(1) })
	r := throttleRunner(t, db, "w1", func(c *Config) {
		c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3, Low: 1}}
	})
	res := goRun(t.Context(), r, job)
	waitFor(t, "the hold's period", func() bool {
		var n int
		// (an error: the manifest is not migrated yet)
		return db.Get(&n, `SELECT count(*) FROM backfill.throttle_periods WHERE ended_at IS NULL`) == nil && n == 1
	})
	require.Zero(t, read.Load(), "a chunk was read while the throttle held")
	sig.set(2) // between the watermarks: still held
	time.Sleep(50 * time.Millisecond)
	require.Zero(t, read.Load(), "released above Low")
	sig.set(0.5)
	out := <-res
	require.NoError(t, out.err)
	require.Equal(t, RunCompleted, out.rep.Status)
	require.EqualValues(t, liveChunks, read.Load())

	ps, err := r.caps.throttlePeriods.ThrottlePeriods(t.Context(), r.db, out.rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ps, 1)
	require.Equal(t, "fake", ps[0].Signal)
	require.Equal(t, 5.0, ps[0].Value)
	require.Equal(t, 3.0, ps[0].High)
	require.Equal(t, 1.0, ps[0].Low)
	require.NotNil(t, ps[0].EndedAt)
	require.Contains(t, ps[0].Reason, "high watermark 3")

	ts, err := r.TimeSplit(t.Context(), out.rep.BatchID)
	require.NoError(t, err)
	require.Positive(t, ts.Throttled["fake"])
	require.Zero(t, ts.Paused)
	require.Equal(t, ts.Total, ts.Working+ts.Paused+ts.Throttled["fake"])
}

// TestThrottleCriticalPausesAndResumeContinues: a reading at the
// critical level pauses the run with the signal in the reason; Run
// returns ErrRunPaused; Resume continues it to the end, and the paused
// time shows in the split.
func TestThrottleCriticalPausesAndResumeContinues(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	sig := &fakeSignal{}
	sig.set(100)
	job := liveJob(nil)
	r := throttleRunner(t, db, "w1", func(c *Config) {
		c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 10, Low: 5, Critical: 50}}
	})
	rep, err := r.Run(t.Context(), job)
	require.ErrorIs(t, err, ErrRunPaused)
	require.Equal(t, RunPaused, rep.Status)
	require.Zero(t, rep.ChunksDone)
	var lastError string
	require.NoError(t, db.Get(&lastError, `SELECT last_error FROM backfill.runs WHERE batch_id = $1`, rep.BatchID))
	require.Contains(t, lastError, "throttle fake: value 100 at or above critical level 50")

	// Still paused for another call while nobody resumed it.
	_, err = r.Run(t.Context(), job)
	require.ErrorIs(t, err, ErrRunPaused)

	sig.set(0)
	rep, err = r.Resume(t.Context(), job, "oncall", "replica caught up")
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, liveChunks, rep.ChunksDone)
	ts, err := r.TimeSplit(t.Context(), rep.BatchID)
	require.NoError(t, err)
	require.Positive(t, ts.Paused)
	require.Equal(t, ts.Total, ts.Working+ts.Paused+ts.Throttled["fake"])
}

// TestJobConcurrencyAcrossRunners: three Runners on separate pools
// (three processes' worth), each with Concurrency 3, never run more than
// JobConcurrency 2 chunks at once between them.
func TestJobConcurrencyAcrossRunners(t *testing.T) {
	t.Parallel()
	url := pgtest.NewURL(t)
	open := func() *sqlx.DB {
		db, err := sqlx.Open("postgres", url)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	db := open()
	_, err := db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	var cur, most, total atomic.Int64
	job := liveJob(func(Chunk) {
		n := cur.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		total.Add(1)
		time.Sleep(20 * time.Millisecond) // overlap, if the cap let it
		cur.Add(-1)
	})
	job.Chunker = IntRange(0, 240, 10) // 24 chunks
	var rs []<-chan runResult
	for i := range 3 {
		r := throttleRunner(t, open(), fmt.Sprint("p", i), func(c *Config) { c.Concurrency = 3; c.JobConcurrency = 2 })
		rs = append(rs, goRun(t.Context(), r, job))
	}
	for _, ch := range rs {
		out := <-ch
		require.NoError(t, out.err)
	}
	require.EqualValues(t, 24, total.Load())
	require.LessOrEqual(t, most.Load(), int64(2), "more chunks at once than JobConcurrency")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 240, n)
}

// TestRowsPerSecondSharedByLiveWorkers: each call takes the job-wide
// rate cap divided by the run's live workers.
func TestRowsPerSecondSharedByLiveWorkers(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	r := throttleRunner(t, db, "w1", func(c *Config) { c.RowsPerSecond = 1000 })
	m := r.cfg.Manifest.(*PGManifest)
	rs, err := r.planRun(t.Context(), liveJob(nil))
	require.NoError(t, err)
	run, _, err := m.StartRun(t.Context(), r.db, rs.plan, "w1", false)
	require.NoError(t, err)
	for _, k := range []string{"a", "b", "c", "d"} {
		require.NoError(t, m.RegisterWorker(t.Context(), r.db, backfilltype.Worker{Key: k, ID: k, BatchID: run.BatchID, Job: "live", StaleAfter: time.Minute}))
	}
	require.NoError(t, m.FinishWorker(t.Context(), r.db, "d"))
	ex := &execution{r: r, batchID: run.BatchID, base: "live", log: r.cfg.Logger}
	th := &throttler{ex: ex, now: time.Now, pace: pacer.New(1000)}
	scope := th.scope(t.Context())
	require.Equal(t, []string{"a", "b", "c"}, scope.WorkerKeys)
	require.InDelta(t, 1000.0/3, th.pace.Limit(), 1e-9)
	require.Equal(t, `"live"`, scope.Table)
}

// TestBuiltinSignalsOnPostgres: every built-in signal's SQL runs on the
// tests' server (no replica, no archiving) and reads sane values; the
// lock-waiters signal counts a session waiting on a lock held by a
// session tagged as one of the run's workers, and only then.
func TestBuiltinSignalsOnPostgres(t *testing.T) {
	t.Parallel()
	sdb := liveDB(t)
	db := Postgres(sdb)
	ctx := t.Context()
	scope := backfillthrottle.SignalScope{BatchID: 1, Table: `"live"`}
	read := func(s backfillthrottle.Signal, sc backfillthrottle.SignalScope) float64 {
		v, err := s.Read(ctx, db, sc)
		require.NoError(t, err, s.Name())
		return v
	}
	require.Zero(t, read(backfillthrottle.ReplicaLagSignal(), scope))
	require.Zero(t, read(backfillthrottle.ArchiveBacklogSignal(), scope))
	require.Zero(t, read(backfillthrottle.AutovacuumSignal(""), scope))
	require.Zero(t, read(backfillthrottle.AutovacuumSignal("public.live"), scope))
	wal := backfillthrottle.WALRateSignal()
	require.Zero(t, read(wal, scope), "first reading")
	_, err := sdb.Exec(`INSERT INTO live SELECT g, repeat('x', 100) FROM generate_series(1, 1000) g`)
	require.NoError(t, err)
	require.Positive(t, read(wal, scope))
	require.Equal(t, 1.0, read(backfillthrottle.SQLSignal("b", `SELECT $1::int > 0`, 3), scope))
	require.Equal(t, 0.0, read(backfillthrottle.SQLSignal("b", `SELECT false`), scope))
	require.Equal(t, 2.5, read(backfillthrottle.SQLSignal("n", `SELECT 2.5::numeric`), scope))
	require.Equal(t, 0.0, read(backfillthrottle.SQLSignal("n", `SELECT NULL::int`), scope))
	require.Equal(t, 0.0, read(backfillthrottle.SQLSignal("n", `SELECT 1 WHERE false`), scope))
	_, err = backfillthrottle.SQLSignal("t", `SELECT 'abc'`).Read(ctx, db, scope)
	require.ErrorContains(t, err, `"abc" is not a number`)
	pr := backfillthrottle.ProbeLatencySignal(`SELECT pg_sleep(0.01)`, 99, time.Minute)
	require.GreaterOrEqual(t, read(pr, scope), 10.0, "milliseconds")

	// A backfill session of worker k1 holds a lock; an application
	// session waits for it.
	lw := backfillthrottle.LockWaitersSignal()
	require.Zero(t, read(lw, backfillthrottle.SignalScope{WorkerKeys: []string{"k1"}}))
	holder, err := sdb.Beginx()
	require.NoError(t, err)
	defer func() { _ = holder.Rollback() }()
	_, err = holder.Exec(`SELECT set_config('application_name', 'backfill k1 test', true)`)
	require.NoError(t, err)
	_, err = holder.Exec(`LOCK TABLE live IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	waiter := make(chan error, 1)
	go func() {
		_, err := sdb.ExecContext(ctx, `SELECT count(*) FROM live`)
		waiter <- err
	}()
	waitFor(t, "the waiter", func() bool { return read(lw, backfillthrottle.SignalScope{WorkerKeys: []string{"k1"}}) == 1 })
	require.Zero(t, read(lw, backfillthrottle.SignalScope{WorkerKeys: []string{"other"}}), "another run's worker")
	require.Equal(t, 1.0, read(lw, backfillthrottle.SignalScope{}), "any backfill session without keys")
	require.NoError(t, holder.Rollback())
	require.NoError(t, <-waiter)
}

// TestRowsPerSecondCapWaitsAndRecords: past its one second of burst,
// the cap makes claims wait for the rows read, and the waits are
// throttle periods of signal rows_per_second in the split.
func TestRowsPerSecondCapWaitsAndRecords(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	r := throttleRunner(t, db, "w1", func(c *Config) { c.RowsPerSecond = 40 }) // 60 rows: 20 past the burst
	rep, err := r.Run(t.Context(), liveJob(nil))
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	ps, err := r.caps.throttlePeriods.ThrottlePeriods(t.Context(), r.db, rep.BatchID)
	require.NoError(t, err)
	require.NotEmpty(t, ps)
	for _, p := range ps {
		require.Equal(t, RateSignalName, p.Signal)
		require.NotNil(t, p.EndedAt)
	}
	ts, err := r.TimeSplit(t.Context(), rep.BatchID)
	require.NoError(t, err)
	require.Positive(t, ts.Throttled[RateSignalName])
	require.Equal(t, ts.Total, ts.Working+ts.Paused+ts.Throttled[RateSignalName])
}

// TestHeldCallStopsWhenRunPausedElsewhere: a call held by a throttle
// stops, with ErrRunPaused, when the run is paused meanwhile (by another
// process's critical throttle or an operator).
func TestHeldCallStopsWhenRunPausedElsewhere(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	sig := &fakeSignal{}
	sig.set(5)
	r := throttleRunner(t, db, "w1", func(c *Config) { c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3}} })
	res := goRun(t.Context(), r, liveJob(nil))
	var batch int64
	waitFor(t, "the hold", func() bool {
		return db.Get(&batch, `SELECT batch_id FROM backfill.throttle_periods WHERE ended_at IS NULL`) == nil
	})
	require.NoError(t, r.cfg.Manifest.(*PGManifest).PauseRun(t.Context(), r.db, batch, "operator pause"))
	out := <-res
	require.ErrorIs(t, out.err, ErrRunPaused)
	require.Equal(t, RunPaused, out.rep.Status)
	require.Zero(t, out.rep.ChunksDone)
}

// TestProbeLatencyTimeoutIsASample: a probe cut off by the reading's
// deadline is a slow sample, not a skipped reading; a failing probe is
// an error.
func TestProbeLatencyTimeoutIsASample(t *testing.T) {
	t.Parallel()
	db := Postgres(pgtest.New(t))
	pr := backfillthrottle.ProbeLatencySignal(`SELECT pg_sleep(5)`, 99, time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	v, err := pr.Read(ctx, db, backfillthrottle.SignalScope{})
	require.NoError(t, err)
	require.GreaterOrEqual(t, v, 50.0, "at least the deadline, in ms")
	_, err = backfillthrottle.ProbeLatencySignal(`SELECT nonsense`, 99, time.Minute).Read(t.Context(), db, backfillthrottle.SignalScope{})
	require.ErrorContains(t, err, "probe_latency")
}

// TestProbeLatencyIncludesCommit: a probe's latency is its
// transaction's, commit included, as an application's is: a write probe
// whose commit takes 200 ms (a deferred constraint trigger sleeping,
// standing for a slow WAL flush) reads at least 200 ms.
func TestProbeLatencyIncludesCommit(t *testing.T) {
	t.Parallel()
	db := Postgres(pgtest.New(t))
	_, err := db.ExecContext(t.Context(), `CREATE TABLE probe_commit (id int);
		CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON probe_commit DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION slow_commit()`)
	require.NoError(t, err)
	pr := backfillthrottle.ProbeLatencySignal(`INSERT INTO probe_commit VALUES (1)`, 99, time.Minute)
	v, err := pr.Read(t.Context(), db, backfillthrottle.SignalScope{})
	require.NoError(t, err)
	require.GreaterOrEqual(t, v, 200.0, "the commit's 200 ms, in ms")
	var n int
	require.NoError(t, sqlx.GetContext(t.Context(), db, &n, `SELECT count(*) FROM probe_commit`))
	require.Equal(t, 1, n, "the probe committed")
}

// TestRaisedSignalHoldsEveryWorkerOfEveryProcess: two Runners on
// separate pools, Concurrency 2 each, work a job; the signal is raised
// mid-run. Once both have recorded their hold, no worker of either
// starts another chunk however many checks follow; lowered, the run
// completes. (Which chunks and how many ran is not asserted: no timing.)
func TestRaisedSignalHoldsEveryWorkerOfEveryProcess(t *testing.T) {
	t.Parallel()
	url := pgtest.NewURL(t)
	open := func() *sqlx.DB {
		db, err := sqlx.Open("postgres", url)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	db := open()
	_, err := db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	sig := &fakeSignal{}
	var started atomic.Int64
	job := liveJob(func(Chunk) {
		started.Add(1)
		time.Sleep(2 * time.Millisecond)
	})
	job.Chunker = IntRange(0, 2000, 10) // 200 chunks
	var rs []<-chan runResult
	for i := range 2 {
		r := throttleRunner(t, open(), fmt.Sprint("p", i), func(c *Config) {
			c.Concurrency = 2
			c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 10, Low: 5}}
		})
		rs = append(rs, goRun(t.Context(), r, job))
	}
	waitFor(t, "work", func() bool { return started.Load() >= 5 })
	sig.set(20)
	waitFor(t, "both processes' holds", func() bool {
		var n int
		return db.Get(&n, `SELECT count(DISTINCT worker_key) FROM backfill.throttle_periods WHERE ended_at IS NULL`) == nil && n == 2
	})
	afterChecks := func(n int64) {
		from := sig.reads.Load()
		waitFor(t, "more checks", func() bool { return sig.reads.Load() >= from+n })
	}
	afterChecks(4) // chunks that passed the check before the hold have begun
	held := started.Load()
	afterChecks(10)
	require.Equal(t, held, started.Load(), "a chunk began while every process held")
	require.Less(t, held, int64(200), "the run ended before the signal was raised")
	sig.set(0)
	for _, ch := range rs {
		out := <-ch
		require.NoError(t, out.err)
	}
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 2000, n)
}

// TestAdaptiveThrottleSlowsWithoutHolding: an adaptive throttle whose
// signal stays above High never holds the run: it cuts the rate, the run
// completes at the cut rate, and its waits are throttle periods of that
// signal (not of rows_per_second) naming the cut. Without a cap, the
// ceiling is the rate the call read before the first cut.
func TestAdaptiveThrottleSlowsWithoutHolding(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, r *Runner, batch int64, wantReason string) {
		ps, err := r.caps.throttlePeriods.ThrottlePeriods(t.Context(), r.db, batch)
		require.NoError(t, err)
		require.NotEmpty(t, ps, "the cut rate made no claim wait")
		for _, p := range ps {
			require.Equal(t, "fake", p.Signal, "reason %q", p.Reason)
			require.Contains(t, p.Reason, wantReason)
			require.NotNil(t, p.EndedAt)
		}
		ts, err := r.TimeSplit(t.Context(), batch)
		require.NoError(t, err)
		require.Positive(t, ts.Throttled["fake"])
		require.Equal(t, ts.Total, ts.Working+ts.Paused+ts.Throttled["fake"])
	}
	t.Run("cap", func(t *testing.T) {
		t.Parallel()
		db := liveDB(t)
		sig := &fakeSignal{}
		sig.set(5) // above High from the first reading to the end
		r := throttleRunner(t, db, "w1", func(c *Config) {
			c.RowsPerSecond = 40 // 60 rows: unthrottled, 20 past the one-second burst
			c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3, Low: 1, MinHold: time.Hour, Adapt: true}}
		})
		rep, err := r.Run(t.Context(), liveJob(nil))
		require.NoError(t, err, "an adaptive throttle held the run")
		require.Equal(t, RunCompleted, rep.Status)
		require.EqualValues(t, 10*liveChunks, rep.Counts.Read)
		check(t, r, rep.BatchID, "rate cut to 20 rows/s (50 % of 40)")
	})
	t.Run("no cap", func(t *testing.T) {
		t.Parallel()
		db := liveDB(t)
		sig := &fakeSignal{}
		sig.set(0)
		r := throttleRunner(t, db, "w1", func(c *Config) {
			c.Concurrency = 1
			c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3, Low: 1, MinHold: time.Hour, Adapt: true}}
		})
		job := liveJob(func(c Chunk) {
			if c.Lo == 30 { // half the run read at full speed
				sig.set(5)
				time.Sleep(50 * time.Millisecond) // a few readings
			}
		})
		rep, err := r.Run(t.Context(), job)
		require.NoError(t, err)
		require.Equal(t, RunCompleted, rep.Status)
		check(t, r, rep.BatchID, "rate cut to ")
	})
	t.Run("high from the start, no cap", func(t *testing.T) {
		t.Parallel()
		db := liveDB(t)
		sig := &fakeSignal{}
		sig.set(5) // the first cut finds nothing read: the first chunk sets the ceiling
		r := throttleRunner(t, db, "w1", func(c *Config) {
			c.Concurrency = 1
			c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3, Low: 1, MinHold: time.Hour, Adapt: true}}
		})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		res := goRun(ctx, r, liveJob(nil))
		waitFor(t, "a wait of the cut rate", func() bool {
			var n int
			return db.Get(&n, `SELECT count(*) FROM backfill.throttle_periods WHERE signal = 'fake'`) == nil && n >= 1
		})
		cancel()
		<-res
	})
}

// flakySignal reads v, or fails while broken.
type flakySignal struct {
	fakeSignal
	broken atomic.Bool
}

func (f *flakySignal) Read(ctx context.Context, db sqlx.ExtContext, s backfillthrottle.SignalScope) (float64, error) {
	if f.broken.Load() {
		f.reads.Add(1)
		return 0, fmt.Errorf("permission denied for view pg_stat_replication")
	}
	return f.fakeSignal.Read(ctx, db, s)
}

// TestUnreadableSignalFailsClosed: a signal that cannot be read at the
// start (a typo in its query, a bad setting) fails the run before any
// claim with ErrInvalidConfig naming the signal; one that stops being
// readable later holds the run (after a few failed readings) until it
// reads again, instead of letting the backfill run unthrottled.
func TestUnreadableSignalFailsClosed(t *testing.T) {
	t.Parallel()
	t.Run("at the start", func(t *testing.T) {
		t.Parallel()
		for _, sig := range []backfillthrottle.Signal{backfillthrottle.SQLSignal("replica_guard", "SELEC 1"), backfillthrottle.ProbeLatencySignal("SELECT 1", 950, time.Second),
			backfillthrottle.ProbeLatencySignal("SELECT 1", 99, 0)} {
			db := liveDB(t)
			r := throttleRunner(t, db, "w1", func(c *Config) { c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 1, Critical: 2}} })
			rep, err := r.Run(t.Context(), liveJob(nil))
			require.ErrorIs(t, err, ErrInvalidConfig, "%s", sig.Name())
			require.ErrorContains(t, err, "throttle signal "+sig.Name()+" cannot be read")
			require.Zero(t, rep.ChunksDone, "%s: chunks were claimed", sig.Name())
		}
	})
	t.Run("later", func(t *testing.T) {
		t.Parallel()
		db := liveDB(t)
		sig := &flakySignal{}
		sig.set(0)
		var read atomic.Int64
		job := liveJob(func(c Chunk) {
			if read.Add(1) == 2 {
				sig.broken.Store(true)
				before := sig.reads.Load()
				for sig.reads.Load() < before+hysteresis.UnreadableAfter+2 {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
		r := throttleRunner(t, db, "w1", func(c *Config) {
			c.Concurrency = 1
			c.Throttles = []backfillthrottle.Throttle{{Signal: sig, High: 3, Low: 1}}
		})
		res := goRun(t.Context(), r, job)
		waitFor(t, "the unreadable signal's hold", func() bool {
			var n int
			return db.Get(&n, `SELECT count(*) FROM backfill.throttle_periods WHERE ended_at IS NULL`) == nil && n == 1
		})
		time.Sleep(50 * time.Millisecond)
		require.EqualValues(t, 2, read.Load(), "a chunk was claimed while the signal could not be read")
		sig.broken.Store(false)
		out := <-res
		require.NoError(t, out.err)
		require.Equal(t, RunCompleted, out.rep.Status)
	})
}
