package backfill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	neturl "net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/hysteresis"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/testwait"
	"github.com/stretchr/testify/require"
)

// TestControlSQLRefusesBadInputAndAudits: the control functions of the
// manifest refuse a missing actor or reason, an unknown knob or a bad
// value (naming the key and value), and impossible transitions, each with
// a clear message; every decision taken is an audit row; the audit log
// refuses UPDATE and DELETE.
func TestControlSQLRefusesBadInputAndAudits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	r.cfg.ReturnOnPause = true
	var batch int64
	_, err := r.Run(ctx, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
			require.NoError(t, r.Pause(ctx, batch, "ann", "first pause"))
		}
	}))
	require.ErrorIs(t, err, ErrRunPaused)
	m := NewPGManifest("")

	sqlErr := func(q string, args ...any) *pq.Error {
		t.Helper()
		_, err := db.Exec(q, args...)
		require.Error(t, err, q)
		var pe *pq.Error
		require.True(t, errors.As(err, &pe), "%v", err)
		return pe
	}
	// Missing actor or reason.
	pe := sqlErr(`SELECT backfill.pause($1::bigint, '', 'why')`, batch)
	require.Equal(t, "22023", string(pe.Code))
	require.Contains(t, pe.Message, "actor is required")
	pe = sqlErr(`SELECT backfill.cancel('live', 'ann', NULL)`)
	require.Contains(t, pe.Message, "reason is required")
	require.ErrorIs(t, m.Pause(ctx, db, batch, "ann", " "), ErrInvalidConfig)
	require.ErrorIs(t, r.Cancel(ctx, batch, "", "x"), ErrInvalidConfig)
	// Impossible transitions.
	pe = sqlErr(`SELECT backfill.pause($1::bigint, 'ann', 'again')`, batch)
	require.Equal(t, "55000", string(pe.Code))
	require.Contains(t, pe.Message, "it is paused")
	require.ErrorIs(t, m.Pause(ctx, db, batch, "ann", "again"), ErrRunStatus)
	require.ErrorIs(t, m.Pause(ctx, db, batch+100, "ann", "none"), ErrRunNotFound)
	pe = sqlErr(`SELECT backfill.resume('nojob', 'ann', 'x')`)
	require.Contains(t, pe.Message, "has no run")
	// Knobs: unknown key, bad values, each named.
	for _, kv := range [][2]string{{"speed", "3"}, {"concurrency", "two"}, {"concurrency", "0"}, {"concurrency", "1.5"},
		{"rows_per_second", "-1"}, {"rows_per_second", "NaN"}, {"throttle.lag.high", "Infinity"}, {"job_concurrency", ""}} {
		err := m.SetKnob(ctx, db, backfilltype.SetKnobParams{BatchID: batch, Key: kv[0], Value: kv[1], Actor: "ann", Why: "tune"})
		require.ErrorIs(t, err, ErrInvalidConfig, "%v", kv)
		require.Contains(t, err.Error(), kv[0])
		require.Contains(t, err.Error(), fmt.Sprintf("%q", kv[1]))
	}
	require.ErrorIs(t, m.SetKnob(ctx, db, backfilltype.SetKnobParams{BatchID: batch, Key: "concurrency", Value: "2", Actor: "ann", Why: ""}), ErrInvalidConfig)

	// Decisions taken: a knob by job name, resume, pause, cancel, resume.
	var v string
	require.NoError(t, db.Get(&v, `SELECT backfill.set_knob('live', 'rows_per_second', ' 250 ', 'bob', 'night')`))
	require.Equal(t, "250", v)
	require.NoError(t, m.SetKnob(ctx, db, backfilltype.SetKnobParams{BatchID: batch, Key: pgstore.KnobThrottleHigh("lag"), Value: "2.5", Actor: "bob", Why: "looser"}))
	st, err := m.Control(ctx, db, batch)
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"rows_per_second": 250, "throttle.lag.high": 2.5}, st.Knobs)
	require.NoError(t, m.SetKnob(ctx, db, backfilltype.SetKnobParams{BatchID: batch, Key: pgstore.KnobThrottleHigh("lag"), Value: "default", Actor: "bob", Why: "back"}))
	require.NoError(t, db.Get(&v, `SELECT backfill.resume($1::bigint, 'bob', 'checked')`, batch))
	require.Equal(t, "running", v)
	require.ErrorIs(t, m.Resume(ctx, db, batch, "bob", "twice"), ErrNotPaused)
	require.NoError(t, db.Get(&v, `SELECT backfill.pause('live', 'bob', 'again')`))
	require.NoError(t, m.Cancel(ctx, db, batch, "carol", "wrong scope"))
	run, err := m.Run(ctx, db, batch)
	require.NoError(t, err)
	require.Equal(t, RunCancelled, run.Status)
	require.NotNil(t, run.FinishedAt)
	require.Contains(t, run.LastError, "carol")
	require.ErrorIs(t, m.Cancel(ctx, db, batch, "carol", "twice"), ErrRunStatus)

	events, err := m.Events(ctx, db, batch)
	require.NoError(t, err)
	var got []string
	for _, e := range events {
		switch e.Kind {
		case "run_paused", "run_resumed_by_operator", "run_cancelled", "knob_set":
			var d map[string]any
			require.NoError(t, json.Unmarshal(e.Detail, &d))
			got = append(got, fmt.Sprintf("%s %s %v", e.Kind, e.Actor, d["why"]))
		}
	}
	require.Equal(t, []string{"run_paused ann first pause", "knob_set bob night", "knob_set bob looser", "knob_set bob back",
		"run_resumed_by_operator bob checked", "run_paused bob again", "run_cancelled carol wrong scope"}, got)

	// Append-only.
	pe = sqlErr(`UPDATE backfill.events SET actor = 'mallory'`)
	require.Contains(t, pe.Message, "append-only")
	pe = sqlErr(`DELETE FROM backfill.events`)
	require.Contains(t, pe.Message, "append-only")
}

// TestControlKnobsApply: the knobs a call reads replace its settings:
// concurrency (capped by Config.Concurrency), job_concurrency,
// rows_per_second and a throttle's watermarks; "default" restores them.
func TestControlKnobsApply(t *testing.T) {
	t.Parallel()
	r := &Runner{cfg: Config{Concurrency: 4, JobConcurrency: 2, RowsPerSecond: 100}, caps: capabilities{control: NewPGManifest("")}}
	ex := &execution{r: r, ctl: newRunControl(), log: discardLogger()}
	th := backfillthrottle.Throttle{Signal: constSignal{"lag"}, High: 10, Low: 5}
	ex.throttle = &throttler{ex: ex, states: []*hysteresis.State{{Throttle: th, ConfigHigh: 10, ConfigLow: 5}}, changed: make(chan struct{})}
	ctx := context.Background()
	ex.applyControl(ctx, backfilltype.ControlState{Status: RunRunning, Knobs: map[string]float64{
		"concurrency": 9, "job_concurrency": 1, "rows_per_second": 7, "throttle.lag.high": 3, "throttle.lag.low": 1, "throttle.other.high": 1}})
	ex.throttle.applyThresholds()
	require.Equal(t, 4, ex.liveConcurrency(), "capped by Config.Concurrency")
	require.Equal(t, 1, ex.liveJobConcurrency())
	require.Equal(t, 7.0, ex.liveRowsPerSecond())
	require.Equal(t, 3.0, ex.throttle.states[0].Throttle.High)
	require.Equal(t, 1.0, ex.throttle.states[0].Throttle.Low)
	ex.applyControl(ctx, backfilltype.ControlState{Status: RunRunning, Knobs: map[string]float64{"concurrency": 2}})
	ex.throttle.applyThresholds()
	require.Equal(t, 2, ex.liveConcurrency())
	require.Equal(t, 2, ex.liveJobConcurrency())
	require.Equal(t, 100.0, ex.liveRowsPerSecond())
	require.Equal(t, 10.0, ex.throttle.states[0].Throttle.High)
	require.False(t, ex.stopped())
	ex.applyControl(ctx, backfilltype.ControlState{Status: RunPaused, Knobs: map[string]float64{}})
	require.True(t, ex.stopped())
	require.Equal(t, RunPaused, ex.haltedAs())
}

type constSignal struct{ name string }

func (s constSignal) Name() string { return s.name }
func (s constSignal) Read(context.Context, sqlx.ExtContext, backfillthrottle.SignalScope) (float64, error) {
	return 0, nil
}

// TestControlConcurrencyKnobLimitsWorkers: a run whose concurrency knob
// is 1 is worked by one chunk at a time although Config.Concurrency is 4.
func TestControlConcurrencyKnobLimitsWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	r.cfg.ReturnOnPause = true
	var batch int64
	_, err := r.Run(ctx, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
			require.NoError(t, r.Pause(ctx, batch, "ann", "tune first"))
		}
	}))
	require.ErrorIs(t, err, ErrRunPaused)
	_, err = db.Exec(`SELECT backfill.set_knob($1::bigint, 'concurrency', '1', 'ann', 'one at a time')`, batch)
	require.NoError(t, err)
	r.cfg.Concurrency = 4
	var inFlight, most atomic.Int32
	rep, err := r.Resume(ctx, liveJob(func(Chunk) {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond)
		inFlight.Add(-1)
	}), "ann", "go")
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, int32(1), most.Load())
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// controlJob loads ids [0, 10*chunks) into table live, chunks of 10;
// each chunk's extraction takes about per.
func controlJob(chunks int, per time.Duration, started *atomic.Int64) Job {
	j := liveJob(nil)
	j.Chunker = IntRange(0, int64(10*chunks), 10)
	j.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		if started != nil {
			started.Add(1)
		}
		for id := c.Lo; id < c.Hi; id++ {
			if err := w.Write(ctx, id, fmt.Sprint("v", id)); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(per):
		}
		return nil
	})
	return j
}

// TestControlPauseResumeCancelAcrossRunners: three runners with their own
// connection pools (one through PgBouncer in transaction mode, one
// LISTENing on a direct connection, one polling) work one run; a pause
// from a separate SQL session stops them all (each returns ErrRunPaused,
// the chunks in flight finished: every chunk done or pending); a resume
// from SQL lets them finish part; a cancel from SQL aborts the chunks in
// flight (each returns ErrRunCancelled, every chunk done or pending, no
// lease left, the target holds exactly the done chunks' rows); a plain
// Run does not restart the cancelled run; Runner.Resume does and
// completes it.
func TestControlPauseResumeCancelAcrossRunners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pooled := pgtest.NewPoolerURL(t)
	pu, err := neturl.Parse(pooled)
	require.NoError(t, err)
	au, err := neturl.Parse(pgtest.AdminURL())
	require.NoError(t, err)
	pu.Host = au.Host
	direct := pu.String()
	ops := sqlx.MustOpen("postgres", direct) // the operator's psql
	t.Cleanup(func() { ops.Close() })
	_, err = ops.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)

	const chunks = 60
	newRunner := func(id, url, listen string) *Runner {
		db := sqlx.MustOpen("postgres", url)
		t.Cleanup(func() { db.Close() })
		r, err := New(db, &Config{WorkerID: id, Concurrency: 2, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 2 * time.Second,
			ThrottleInterval: 50 * time.Millisecond, ListenURL: listen, Logger: discardLogger(), ReturnOnPause: true})
		require.NoError(t, err)
		return r
	}
	runners := []*Runner{newRunner("pooled", pooled, ""), newRunner("listen", direct, direct), newRunner("poll", direct, "")}
	require.NoError(t, NewPGManifest("").Init(ctx, ops))

	var started atomic.Int64
	job := controlJob(chunks, 30*time.Millisecond, &started)
	runAll := func(do func(r *Runner) (Report, error)) []error {
		var wg sync.WaitGroup
		errs := make([]error, len(runners))
		for i, r := range runners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = do(r)
			}()
		}
		wg.Wait()
		return errs
	}
	waitDone := func(n int) int64 {
		for deadline := time.Now().Add(60 * time.Second); ; {
			var b struct {
				Batch int64 `db:"batch_id"`
				Done  int   `db:"done"`
			}
			err := ops.Get(&b, `SELECT r.batch_id, count(*) FILTER (WHERE c.status = 'done') AS done FROM backfill.runs r
				JOIN backfill.chunks c USING (batch_id) WHERE r.job_name = 'live' AND r.status = 'running' GROUP BY r.batch_id`)
			if err == nil && b.Done >= n {
				return b.Batch
			}
			require.True(t, time.Now().Before(deadline), "no progress")
			time.Sleep(10 * time.Millisecond)
		}
	}
	checkChunks := func() map[string]int {
		st := chunkStatuses(t, ops)
		var errs []string
		require.NoError(t, ops.Select(&errs, `SELECT seq || ' ' || status || ': ' || last_error FROM backfill.chunks WHERE last_error <> ''`))
		require.Equal(t, chunks, st["done"]+st["pending"], "every chunk done or pending: %v %v", st, errs)
		var leased, rows, read int64
		require.NoError(t, ops.Get(&leased, `SELECT count(*) FROM backfill.chunks WHERE lease_key IS NOT NULL`))
		require.Zero(t, leased, "no lease left")
		require.NoError(t, ops.Get(&rows, `SELECT count(*) FROM live`))
		require.NoError(t, ops.Get(&read, `SELECT coalesce(sum(rows_inserted), 0) FROM backfill.chunks WHERE status = 'done'`))
		require.Equal(t, read, rows, "the target holds exactly the done chunks' rows")
		return st
	}

	// Pause.
	ch := make(chan []error, 1)
	go func() { ch <- runAll(func(r *Runner) (Report, error) { return r.Run(ctx, job) }) }()
	batch := waitDone(5)
	_, err = ops.Exec(`SELECT backfill.pause($1::bigint, 'oncall', 'replica lag')`, batch)
	require.NoError(t, err)
	for i, err := range <-ch {
		require.ErrorIs(t, err, ErrRunPaused, "runner %d", i)
	}
	st := checkChunks()
	require.Less(t, st["done"], chunks)
	claimed := started.Load()
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, claimed, started.Load(), "nothing claimed after the pause")

	// Resume from SQL; the runners join; cancel from SQL while in flight.
	_, err = ops.Exec(`SELECT backfill.resume('live', 'oncall', 'lag is fine')`)
	require.NoError(t, err)
	go func() { ch <- runAll(func(r *Runner) (Report, error) { return r.Run(ctx, job) }) }()
	waitDone(st["done"] + 5)
	_, err = ops.Exec(`SELECT backfill.cancel($1::bigint, 'oncall', 'wrong scope')`, batch)
	require.NoError(t, err)
	for i, err := range <-ch {
		require.ErrorIs(t, err, ErrRunCancelled, "runner %d", i)
	}
	st = checkChunks()
	require.Less(t, st["done"], chunks)
	var fails int
	require.NoError(t, ops.Get(&fails, `SELECT count(*) FROM backfill.chunks WHERE last_error <> ''`))
	require.Zero(t, fails, "an aborted chunk is no failure")

	// A plain Run does not restart it.
	before := started.Load()
	rep, err := runners[2].Run(ctx, job)
	require.ErrorIs(t, err, ErrRunCancelled)
	require.Equal(t, RunCancelled, rep.Status)
	require.Equal(t, before, started.Load())
	require.Equal(t, st, checkChunks())

	// An explicit resume does.
	rep, err = runners[0].Resume(ctx, job, "oncall", "scope fixed after all")
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, chunks, checkChunks()["done"])
	var kinds []string
	require.NoError(t, ops.Select(&kinds, `SELECT kind || ' ' || actor FROM backfill.events
		WHERE batch_id = $1 AND kind IN ('run_paused', 'run_resumed_by_operator', 'run_cancelled') ORDER BY id`, batch))
	require.Equal(t, []string{"run_paused oncall", "run_resumed_by_operator oncall", "run_cancelled oncall", "run_resumed_by_operator oncall"}, kinds)
}

// TestControlCancelWithJobConcurrency: with Config.JobConcurrency (a cap
// on the run's live leases) a cancel from SQL while a chunk is extracted
// aborts it (its lease is released, the chunk stays pending and its place
// is freed), the run ends cancelled and Run returns ErrRunCancelled;
// nothing is recorded as a failure.
func TestControlCancelWithJobConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r, err := New(db, &Config{WorkerID: "slots", JobConcurrency: 2, ThrottleInterval: 20 * time.Millisecond, Logger: discardLogger()})
	require.NoError(t, err)
	var once sync.Once
	rep, err := r.Run(ctx, liveJob(func(c Chunk) {
		if c.Seq != 2 {
			return
		}
		once.Do(func() {
			_, err := db.Exec(`SELECT backfill.cancel('live', 'ann', 'stop it')`)
			require.NoError(t, err)
		})
		time.Sleep(time.Second) // in flight when the cancel lands; aborted
	}))
	require.ErrorIs(t, err, ErrRunCancelled)
	require.Equal(t, RunCancelled, rep.Status)
	st := chunkStatuses(t, db)
	require.Equal(t, liveChunks, st["done"]+st["pending"], "%v", st)
	require.Equal(t, map[string]int{"done": 2, "pending": liveChunks - 2}, st, "chunks 0 and 1 done, 2 aborted, none claimed after")
	var rows, inserted, fails int64
	require.NoError(t, db.Get(&rows, `SELECT count(*) FROM live`))
	require.NoError(t, db.Get(&inserted, `SELECT coalesce(sum(rows_inserted), 0) FROM backfill.chunks WHERE status = 'done'`))
	require.Equal(t, inserted, rows)
	require.NoError(t, db.Get(&fails, `SELECT count(*) FROM backfill.chunks WHERE last_error <> ''`))
	require.Zero(t, fails)
}

// TestControlCancelAfterPauseAbortsChunkInFlight: a run paused while a
// chunk is in flight lets the chunk finish; a cancel that follows aborts
// it (its extractor's context ends) although the call already stopped on
// the pause. It hung before: a stopped call no longer read the control
// state.
func TestControlCancelAfterPauseAbortsChunkInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	logger, paused := logEvent("backfill: run paused: no more claims; the chunks in flight finish")
	r, err := New(db, &Config{WorkerID: "pause-cancel", ThrottleInterval: 20 * time.Millisecond, Logger: logger})
	require.NoError(t, err)
	status := func() (s string) {
		_ = db.Get(&s, `SELECT status FROM backfill.runs WHERE job_name = 'live'`)
		return s
	}
	aborted := make(chan error, 1)
	job := liveJob(nil)
	inner := job.Extractor
	job.Extractor = ExtractorFunc(func(xctx context.Context, c Chunk, w RowWriter) error {
		if err := inner.Extract(xctx, c, w); err != nil || c.Seq != 0 {
			return err
		}
		_, err := db.Exec(`SELECT backfill.pause('live', 'ann', 'hold on')`)
		require.NoError(t, err)
		// The call sees the pause (its monitor reads the control state
		// every 20 ms) before the cancel lands.
		select {
		case <-paused:
		case <-time.After(testwait.Timeout):
			aborted <- errors.New("the call did not see the pause")
			return nil
		}
		_, err = db.Exec(`SELECT backfill.cancel('live', 'ann', 'stop it')`)
		require.NoError(t, err)
		select {
		case <-xctx.Done():
			aborted <- nil
			return xctx.Err()
		case <-time.After(30 * time.Second):
			aborted <- errors.New("the chunk in flight was not aborted by the cancel")
			return nil
		}
	})
	rep, err := r.Run(ctx, job)
	require.NoError(t, <-aborted)
	require.ErrorIs(t, err, ErrRunCancelled)
	require.Equal(t, RunCancelled, rep.Status)
	require.Equal(t, "cancelled", status())
	st := chunkStatuses(t, db)
	require.Equal(t, map[string]int{"pending": liveChunks}, st, "the aborted chunk rolled back, none claimed after")
}

// TestRateCappedWaitWakesOnControl: a worker waiting on the rows-per-second
// cap (a knob of 1 row/s against chunks of 10 rows: a wait of about 10 s
// per chunk) is woken by a pause (Run returns ErrRunPaused at once, not
// after the wait) and by the cap being lifted (the run goes on at once).
func TestRateCappedWaitWakesOnControl(t *testing.T) {
	t.Parallel()
	for _, action := range []string{"pause", "lift"} {
		t.Run(action, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := liveDB(t)
			logger, knobSeen := logEvent("backfill: live knobs changed")
			r, err := New(db, &Config{WorkerID: "a", Concurrency: 2, ThrottleInterval: 50 * time.Millisecond, Logger: logger})
			require.NoError(t, err)
			// Every chunk's extraction waits until the worker has read the
			// cap, so the run cannot end before the cap has chunks to hold.
			// Chunks of 1,000 rows: at the cap of 1 row/s a single wait
			// would outlast the test's deadline, so only the control can
			// end it.
			job := controlJob(20, time.Millisecond, nil)
			job.Chunker = IntRange(0, 20_000, 1000)
			inner := job.Extractor
			job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
				select {
				case <-knobSeen:
				case <-ctx.Done():
					return ctx.Err()
				}
				return inner.Extract(ctx, c, w)
			})
			ch := goRun(ctx, r, job)
			var batch int64
			waitFor(t, "the run", func() bool { return db.Get(&batch, `SELECT batch_id FROM backfill.runs`) == nil })
			_, err = db.Exec(`SELECT backfill.set_knob($1::bigint, 'rows_per_second', '1', 'ann', 'slow')`, batch)
			require.NoError(t, err)
			waitFor(t, "a wait on the cap", func() bool {
				var n int
				return db.Get(&n, `SELECT count(*) FROM backfill.throttle_periods WHERE ended_at IS NULL AND signal = 'rows_per_second'`) == nil && n > 0
			})
			if action == "pause" {
				_, err = db.Exec(`SELECT backfill.pause($1::bigint, 'ann', 'stop')`, batch)
			} else {
				_, err = db.Exec(`SELECT backfill.set_knob($1::bigint, 'rows_per_second', '0', 'ann', 'lift the cap')`, batch)
			}
			require.NoError(t, err)
			// The run returns (goRun's deadline fails it otherwise) because
			// the control woke the wait.
			res := testwait.Recv(t, "the run to return after the "+action, ch)
			if action == "pause" {
				require.ErrorIs(t, res.err, ErrRunPaused)
			} else {
				require.NoError(t, res.err)
				require.Equal(t, RunCompleted, res.rep.Status)
				var rest int
				require.NoError(t, db.Get(&rest, `SELECT count(*) FROM backfill.throttle_periods WHERE ended_at IS NULL AND signal = 'rows_per_second'`))
				require.Zero(t, rest, "a cap wait still open after the cap was lifted")
			}
		})
	}
}

// TestAuditTrailCannotBeErased: the events table refuses UPDATE, DELETE
// (a run's cascade included) and TRUNCATE; rows_per_second refuses a cap
// between 0 and 1; resuming an old cancelled run by job name or batch is
// refused once a newer run of the job exists.
func TestAuditTrailCannotBeErased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r, err := New(db, &Config{WorkerID: "a", Logger: discardLogger()})
	require.NoError(t, err)
	rep, err := r.Run(ctx, liveJob(nil))
	require.NoError(t, err)
	for _, q := range []string{`UPDATE backfill.events SET actor = 'x'`, `DELETE FROM backfill.events`, `TRUNCATE backfill.events`,
		`DELETE FROM backfill.runs WHERE batch_id = ` + fmt.Sprint(rep.BatchID)} {
		_, err := db.Exec(q)
		require.ErrorContains(t, err, "append-only", q)
	}
	_, err = db.Exec(`SELECT backfill.set_knob($1::bigint, 'rows_per_second', '0.01', 'ann', 'slow')`, rep.BatchID)
	require.Error(t, err, "a completed run's knob")

	// Cancel a run, start a newer one: the old one cannot be resumed.
	older := controlJob(100, 20*time.Millisecond, nil)
	older.Name = "other"
	r2, err := New(db, &Config{WorkerID: "b", Logger: discardLogger()})
	require.NoError(t, err)
	ch := goRun(ctx, r2, older)
	var old int64
	waitFor(t, "the run", func() bool {
		return db.Get(&old, `SELECT batch_id FROM backfill.runs WHERE batch_id <> $1`, rep.BatchID) == nil
	})
	_, err = db.Exec(`SELECT backfill.set_knob($1::bigint, 'rows_per_second', '0.01', 'ann', 'slow')`, old)
	require.ErrorContains(t, err, "at least 1")
	_, err = db.Exec(`SELECT backfill.cancel($1::bigint, 'ann', 'wrong')`, old)
	require.NoError(t, err)
	<-ch
	newer := controlJob(2, time.Millisecond, nil)
	newer.Name, newer.NewRun = "other", true
	_, err = r2.Run(ctx, newer)
	require.NoError(t, err)
	_, err = db.Exec(`SELECT backfill.resume('other', 'ann', 'back')`)
	require.Error(t, err, "resumed the latest run, which is completed")
	_, err = db.Exec(`SELECT backfill.resume($1::bigint, 'ann', 'back')`, old)
	require.ErrorContains(t, err, "a newer run of the job exists")
}

// TestControlConcurrencyKnobLoweredWithExtractAhead: extracting ahead a
// worker slot runs two goroutines, one of which may be waiting for the
// slot's extract stage when the concurrency knob goes down: it must not
// lease a chunk then. Once the knob is 1, one chunk is extracted at a
// time (one slot, whose extractions never overlap).
func TestControlConcurrencyKnobLoweredWithExtractAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	logger, changed := logEvent("backfill: live knobs changed")
	r.cfg.Concurrency, r.cfg.Logger = 2, logger
	var lowered atomic.Bool
	var unseen atomic.Bool
	var inFlight, most atomic.Int32
	job := liveJob(func(c Chunk) {
		if c.Seq == 2 {
			var batch int64
			require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
			_, err := db.Exec(`SELECT backfill.set_knob($1::bigint, 'concurrency', '1', 'ann', 'one at a time')`, batch)
			require.NoError(t, err)
			// The monitor reads the knob within a HeartbeatInterval.
			select {
			case <-changed:
			case <-time.After(testwait.Timeout):
				unseen.Store(true)
			}
			lowered.Store(true)
			return
		}
		counted := lowered.Load()
		if counted {
			n := inFlight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
		}
		time.Sleep(15 * time.Millisecond)
		if counted {
			inFlight.Add(-1)
		}
	})
	job.Chunker = IntRange(0, 1200, 10)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.False(t, unseen.Load(), "the call did not read the knob within %v", testwait.Timeout)
	require.Equal(t, int32(1), most.Load(), "extractions at once after the knob went down to 1")
}

// waitPausedIdle waits until run batch of job "live" is paused with no
// chunk leased and done chunks done; a value on returned (a worker that
// gave up) fails the test.
func waitPausedIdle[T any](t *testing.T, db *sqlx.DB, done int, returned <-chan T) int64 {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; {
		select {
		case v := <-returned:
			t.Fatalf("the worker returned while the run is paused: %v", v)
		default:
		}
		var st struct {
			Batch  int64  `db:"batch_id"`
			Status string `db:"status"`
			Done   int    `db:"done"`
			Leased int    `db:"leased"`
		}
		err := db.Get(&st, `SELECT r.batch_id, r.status, count(*) FILTER (WHERE c.status = 'done') AS done,
			count(*) FILTER (WHERE c.lease_key IS NOT NULL) AS leased
			FROM backfill.runs r JOIN backfill.chunks c USING (batch_id) WHERE r.job_name = 'live' GROUP BY r.batch_id, r.status`)
		if err == nil && st.Status == "paused" && st.Done >= done && st.Leased == 0 {
			return st.Batch
		}
		require.True(t, time.Now().Before(deadline), "the run never paused idle: %+v %v", st, err)
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWorkWaitsWhilePausedFromSQL: a worker process (Work) whose run is
// paused from SQL does not exit: it stays a live worker of the run (the
// status after the resume shows it running, not dead) and, once the run
// is resumed from SQL, works it to the end and exits with ExitDone.
func TestWorkWaitsWhilePausedFromSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	r.cfg.ThrottleInterval = 50 * time.Millisecond
	resumedChunk := make(chan struct{})
	release := make(chan struct{})
	var paused atomic.Bool
	job := liveJob(func(c Chunk) {
		switch {
		case c.Seq == 0:
			_, err := db.Exec(`SELECT backfill.pause('live', 'ann', 'replica lag')`)
			require.NoError(t, err)
			paused.Store(true)
		case paused.Load() && c.Seq == 1:
			close(resumedChunk)
			<-release
		}
	})
	codes := make(chan ExitCode, 1)
	go func() { codes <- Work(ctx, r, job) }()
	batch := waitPausedIdle(t, db, 1, codes)
	var unfinished int
	require.NoError(t, db.Get(&unfinished, `SELECT count(*) FROM backfill.workers WHERE finished_at IS NULL`))
	require.Equal(t, 1, unfinished, "the waiting worker stays registered")

	_, err := db.Exec(`SELECT backfill.resume($1::bigint, 'ann', 'lag is fine')`, batch)
	require.NoError(t, err)
	select {
	case <-resumedChunk:
	case code := <-codes:
		t.Fatalf("Work returned %d instead of working the resumed run", code)
	}
	st, err := r.StatusOf(ctx, batch)
	require.NoError(t, err)
	require.Equal(t, RunRunning, st.Status)
	require.NotEqual(t, LivenessDead, st.Liveness, "a waiting worker is not a dead run")
	close(release)
	require.Equal(t, ExitDone, <-codes)
	require.Equal(t, map[string]int{"done": liveChunks}, chunkStatuses(t, db))
}

// TestRunWaitWhilePaused: by default a call of Run on a run already
// paused waits (it does not return ErrRunPaused) and returns
// ErrRunCancelled when the run is cancelled from SQL meanwhile; with
// Config.ReturnOnPause, Run returns ErrRunPaused with an error that says
// how to resume from SQL and from the CLI.
func TestRunWaitWhilePaused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	r.cfg.ReturnOnPause = true
	_, err := r.Run(ctx, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			_, err := db.Exec(`SELECT backfill.pause('live', 'ann', 'replica lag')`)
			require.NoError(t, err)
		}
	}))
	require.ErrorIs(t, err, ErrRunPaused)
	var batch int64
	require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
	require.Contains(t, err.Error(), fmt.Sprintf("SELECT backfill.resume(%d, 'ACTOR', 'WHY')", batch))
	require.Contains(t, err.Error(), fmt.Sprintf("backfill resume --batch %d", batch))
	require.Contains(t, err.Error(), "paused by ann: replica lag")

	w := liveRunner(t, db, "w2", nil) // the default: waits
	w.cfg.ThrottleInterval = 50 * time.Millisecond
	ch := goRun(ctx, w, liveJob(nil))
	waitPausedIdle(t, db, 1, ch)
	for {
		// The waiting call is registered as a worker.
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.workers WHERE worker_id = 'w2' AND finished_at IS NULL`))
		if n == 1 {
			break
		}
		select {
		case res := <-ch:
			t.Fatalf("Run returned while paused: %v", res.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	_, err = db.Exec(`SELECT backfill.cancel($1::bigint, 'ann', 'wrong scope')`, batch)
	require.NoError(t, err)
	res := <-ch
	require.ErrorIs(t, res.err, ErrRunCancelled)
	require.Contains(t, res.err.Error(), "backfill resume --batch")
}

// TestControlJobConcurrencyKnobLimitsExtractions: a run whose
// job_concurrency knob is 1 extracts one chunk at a time, although
// Config.Concurrency is 4, whether or not the process was started with a
// Config.JobConcurrency (the knob replaces it).
func TestControlJobConcurrencyKnobLimitsExtractions(t *testing.T) {
	t.Parallel()
	for _, jc := range []int{0, 4} {
		t.Run(fmt.Sprint("config_job_concurrency_", jc), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := liveDB(t)
			r := liveRunner(t, db, "w1", nil)
			r.cfg.ReturnOnPause = true
			var batch int64
			_, err := r.Run(ctx, liveJob(func(c Chunk) {
				if c.Seq == 0 {
					require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
					require.NoError(t, r.Pause(ctx, batch, "ann", "tune first"))
				}
			}))
			require.ErrorIs(t, err, ErrRunPaused)
			require.NoError(t, r.SetKnob(ctx, batch, "job_concurrency", "1", "ann", "one at a time"))
			r.cfg.Concurrency, r.cfg.JobConcurrency = 4, jc
			var inFlight, most, calls atomic.Int32
			rep, err := r.Resume(ctx, liveJob(func(Chunk) {
				calls.Add(1)
				n := inFlight.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(20 * time.Millisecond) // the extraction's work
				inFlight.Add(-1)
			}), "ann", "go")
			require.NoError(t, err)
			require.Equal(t, RunCompleted, rep.Status)
			require.Greater(t, calls.Load(), int32(1))
			require.Equal(t, int32(1), most.Load(), "extractions at once with job_concurrency 1")
		})
	}
}

// TestSetKnobRefusesThrottlePairsTheWorkersWouldIgnore: set_knob, through
// SQL or the Runner, refuses a throttle watermark knob that would leave
// the throttle's low watermark above its high one, or both zero, whether
// the other side is a knob or the High and Low a worker of the run was
// configured with; the error names both knobs and both values, and the
// knobs stay as they were.
func TestSetKnobRefusesThrottlePairsTheWorkersWouldIgnore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	r.cfg.ReturnOnPause = true
	r.cfg.Throttles = []backfillthrottle.Throttle{{Signal: constSignal{"lag"}, High: 10, Low: 5}}
	var batch int64
	_, err := r.Run(ctx, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
			require.NoError(t, r.Pause(ctx, batch, "ann", "tune"))
		}
	}))
	require.ErrorIs(t, err, ErrRunPaused)
	knobs := func() map[string]float64 {
		st, err := r.caps.control.Control(ctx, r.db, batch)
		require.NoError(t, err)
		return st.Knobs
	}
	refused := func(key, value string, mention ...string) {
		t.Helper()
		before := knobs()
		err := r.SetKnob(ctx, batch, key, value, "ann", "tune")
		require.ErrorIs(t, err, ErrInvalidConfig, "%s=%s", key, value)
		for _, m := range mention {
			require.Contains(t, err.Error(), m)
		}
		_, err = db.Exec(`SELECT backfill.set_knob($1::bigint, $2, $3, 'ann', 'tune')`, batch, key, value)
		var pe *pq.Error
		require.ErrorAs(t, err, &pe, "%s=%s through SQL", key, value)
		require.Equal(t, "22023", string(pe.Code))
		for _, m := range mention {
			require.Contains(t, pe.Message, m)
		}
		require.Equal(t, before, knobs(), "a refused knob changes nothing")
	}
	set := func(key, value string) {
		t.Helper()
		require.NoError(t, r.SetKnob(ctx, batch, key, value, "ann", "tune"), "%s=%s", key, value)
	}

	// Against the configured watermarks (High 10, Low 5).
	refused("throttle.lag.low", "20", "throttle.lag.low 20 (this knob)", "throttle.lag.high 10 (the High configured by worker 'w1')")
	refused("throttle.lag.high", "3", "throttle.lag.low 5 (the Low configured by worker 'w1')", "throttle.lag.high 3 (this knob)")
	// Against the other knob.
	set("throttle.lag.high", "30")
	set("throttle.lag.low", "20")
	refused("throttle.lag.high", "15", "throttle.lag.low 20 (its knob)", "throttle.lag.high 15 (this knob)")
	// Dropping a knob: back to the configured High 10, below the low knob.
	refused("throttle.lag.high", "default", "throttle.lag.low 20 (its knob)", "throttle.lag.high 10 (the High configured by worker 'w1')")
	set("throttle.lag.low", "default")
	set("throttle.lag.high", "default")
	// Both zero.
	set("throttle.lag.low", "0")
	refused("throttle.lag.high", "0", "throttle.lag.high 0 (this knob)", "throttle.lag.low 0 (its knob)")
	// A signal no worker configured: the knobs alone.
	set("throttle.other.low", "5")
	refused("throttle.other.high", "4", "throttle.other.low 5 (its knob)", "throttle.other.high 4 (this knob)")
	set("throttle.other.high", "5")
	require.Equal(t, map[string]float64{"throttle.lag.low": 0, "throttle.other.low": 5, "throttle.other.high": 5}, knobs())
}

// errSignal reads value, or fails while broken.
type errSignal struct {
	broken bool
	value  float64
}

func (s *errSignal) Name() string { return "flaky" }
func (s *errSignal) Read(context.Context, sqlx.ExtContext, backfillthrottle.SignalScope) (float64, error) {
	if s.broken {
		return 0, errors.New("permission denied for view pg_stat_replication")
	}
	return s.value, nil
}

// TestSignalReadFailuresAsDocumented: what backfillthrottle.Signal.Read's
// documentation says of failed readings after the first: the first
// failures in a row below hysteresis.UnreadableAfter are skipped (the
// throttle keeps its state, held or not), from the UnreadableAfter-th on
// the throttle holds (fails closed, not critical), and the first
// successful reading below Low releases it.
func TestSignalReadFailuresAsDocumented(t *testing.T) {
	t.Parallel()
	require.Equal(t, 3, hysteresis.UnreadableAfter, "Signal.Read's documentation names the third failed reading in a row")
	ctx := context.Background()
	sig := &errSignal{}
	r := &Runner{cfg: Config{Throttles: []backfillthrottle.Throttle{{Signal: sig, High: 10, Low: 5, Critical: 20}}}}
	ex := &execution{r: r, log: discardLogger(), job: Job{Name: "j"}}
	th := newThrottler(ex)
	ex.throttle = th
	th.check(ctx)
	require.False(t, th.holding())

	// Not held: two failures keep it released, the third holds.
	sig.broken = true
	for i := 1; i < hysteresis.UnreadableAfter; i++ {
		th.check(ctx)
		require.False(t, th.holding(), "failed reading %d in a row", i)
	}
	th.check(ctx)
	require.True(t, th.holding(), "failed reading %d in a row", hysteresis.UnreadableAfter)
	require.False(t, ex.stopped(), "an unreadable signal is never critical")
	th.check(ctx)
	require.True(t, th.holding(), "held while it cannot be read")
	sig.broken, sig.value = false, 1
	th.check(ctx)
	require.False(t, th.holding(), "the first reading below Low releases it")

	// Held by a high reading: two failures keep it held, and a success
	// between failures starts the count again.
	sig.value = 12
	th.check(ctx)
	require.True(t, th.holding())
	sig.broken = true
	for i := 1; i < hysteresis.UnreadableAfter; i++ {
		th.check(ctx)
		require.True(t, th.holding(), "held, failed reading %d in a row", i)
	}
	sig.broken, sig.value = false, 1
	th.check(ctx)
	require.False(t, th.holding())
	sig.broken = true
	for i := 1; i < hysteresis.UnreadableAfter; i++ {
		th.check(ctx)
		require.False(t, th.holding(), "failed reading %d in a row after a success", i)
	}
}
