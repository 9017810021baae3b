package backfillriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
)

// childEnv names the database a child process works on
// (TestKill9RiverWorkerMidChunk): set, the test binary is a River
// worker that blocks inside its first chunk's transaction until killed.
const childEnv = "BACKFILLRIVER_TEST_CHILD"

// childReleaseEnv, set, makes the child's first chunk wait inside its
// transaction until table released has a row, then commit.
const childReleaseEnv = "BACKFILLRIVER_TEST_CHILD_RELEASE"

func TestMain(m *testing.M) {
	if u := os.Getenv(childEnv); u != "" {
		if err := child(u); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	backfilltest.PostgresMain(m)
}

// rows is the source's size: ids 0 to rows-1, in chunks of 100.
const rows = 2000

// fixture is a database with River's tables migrated and a source table
// src: every id once, every 50th id twice (deduplicated), every 97th
// rejected by the extractor.
type fixture struct {
	url string
	db  *sqlx.DB
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	u := backfilltest.NewPostgresURL(t)
	db, err := sqlx.Open("postgres", u)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	migrateRiver(t.Context(), t, db.DB)
	_, err = db.Exec(fmt.Sprintf(`CREATE TABLE src (id bigint, name text);
		INSERT INTO src SELECT i, 'n' || i FROM generate_series(0, %d) i;
		INSERT INTO src SELECT i, 'n' || i FROM generate_series(0, %d, 50) i;
		CREATE TABLE via_river (id bigint PRIMARY KEY, name text);
		CREATE TABLE plain (id bigint PRIMARY KEY, name text);
		CREATE TABLE reached (seq int);
		CREATE TABLE released (at timestamptz)`, rows-1, rows-1))
	require.NoError(t, err)
	return &fixture{url: u, db: db}
}

// migrateRiver applies River's migrations, as an application does once.
func migrateRiver(ctx context.Context, t *testing.T, db *sql.DB) {
	t.Helper()
	m, err := rivermigrate.New(riverdatabasesql.New(db), nil)
	require.NoError(t, err)
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)
}

// job is the job of src into table; block, if not nil, is called before
// each chunk's extraction.
func job(db *sqlx.DB, table string, block func(ctx context.Context, c backfill.Chunk) error) backfill.Job {
	return backfill.Job{
		Name:    "job-" + table,
		Chunker: backfill.IntRange(0, rows, 100),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if block != nil {
				if err := block(ctx, c); err != nil {
					return err
				}
			}
			var rs []struct {
				ID   int64  `db:"id"`
				Name string `db:"name"`
			}
			if err := db.SelectContext(ctx, &rs, `SELECT id, name FROM src WHERE id >= $1 AND id < $2 ORDER BY id`, c.Lo, c.Hi); err != nil {
				return err
			}
			for _, r := range rs {
				var err error
				if r.ID%97 == 0 {
					err = w.Reject(ctx, map[string]any{"id": r.ID, "name": r.Name}, "name", "every 97th is bad")
				} else {
					err = w.Write(ctx, r.ID, r.Name)
				}
				if err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: table, Key: []string{"id"}, Columns: []string{"id", "name"}},
	}
}

// runnerConfig: a dead worker's lease is taken over after 2 seconds.
func runnerConfig() *backfill.Config {
	return &backfill.Config{HeartbeatInterval: 200 * time.Millisecond, StaleAfter: 2 * time.Second}
}

// newClient returns a started River client on db with w on the default
// queue (workers at once); it is stopped when t ends. A job running for
// more than 20 seconds times out, and River rescues it (River rescues
// only jobs with a timeout).
func newClient(t *testing.T, db *sql.DB, w *Worker, workers int) *river.Client[*sql.Tx] {
	t.Helper()
	ws := river.NewWorkers()
	river.AddWorker(ws, w)
	c, err := river.NewClient(riverdatabasesql.New(db), &river.Config{
		Queues:               map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:              ws,
		FetchPollInterval:    50 * time.Millisecond,
		FetchCooldown:        50 * time.Millisecond,
		JobTimeout:           20 * time.Second,
		RescueStuckJobsAfter: 20 * time.Second,
		Logger:               slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
	return c
}

// enqueue enqueues j in one transaction.
func enqueue(t *testing.T, f *fixture, c *river.Client[*sql.Tx], r *backfill.Runner, j backfill.Job) EnqueueResult {
	t.Helper()
	tx, err := f.db.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	res, err := Enqueue(t.Context(), c, tx, r, j, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return res
}

// waitRun waits until run batch has status want (no assertion on how
// long it takes: a deadline only fails a hung test).
func waitRun(t *testing.T, db *sqlx.DB, r *backfill.Runner, batch int64, want backfill.RunStatus) {
	t.Helper()
	deadline := time.Now().Add(4 * time.Minute)
	for {
		st, err := r.StatusOf(t.Context(), batch)
		require.NoError(t, err)
		if st.Status == want {
			return
		}
		if !time.Now().Before(deadline) {
			var jobs []string
			_ = db.Select(&jobs, `SELECT concat_ws(' ', id, args, state, attempt, errors, metadata) FROM river_job WHERE state <> 'completed'`)
			t.Fatalf("run %d is %s (chunks %+v), not %s; River jobs not completed: %v", batch, st.Status, st.Chunks, want, jobs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkLoaded checks run batch of table against a plain Run of the same
// source into table plain: every row once, the counts balanced, the same
// rows, every River job completed.
func checkLoaded(t *testing.T, f *fixture, r *backfill.Runner, batch int64, table string) {
	t.Helper()
	ctx := t.Context()
	plainRep, err := r.Run(ctx, job(f.db, "plain", nil))
	require.NoError(t, err)

	st, err := r.StatusOf(ctx, batch)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, st.Status)
	c := st.Rows
	require.Equal(t, c.Read, c.Inserted+c.Updated+c.Unchanged+c.Rejected+c.Deduplicated, "counts balance: %+v", c)
	require.EqualValues(t, rows+rows/50, c.Read, "every source row read once")
	require.Equal(t, plainRep.Counts.Read, c.Read)
	require.Equal(t, plainRep.Counts.Inserted, c.Inserted)
	require.Equal(t, plainRep.Counts.Rejected, c.Rejected)
	require.Equal(t, plainRep.Counts.Deduplicated, c.Deduplicated)

	var n, distinct int
	require.NoError(t, f.db.Get(&n, fmt.Sprintf(`SELECT count(*) FROM %q`, table)))
	require.NoError(t, f.db.Get(&distinct, fmt.Sprintf(`SELECT count(DISTINCT id) FROM %q`, table)))
	require.Equal(t, n, distinct)
	require.EqualValues(t, c.Inserted, n)
	sum := func(table string) string {
		var s string
		require.NoError(t, f.db.Get(&s, fmt.Sprintf(`SELECT md5(string_agg(id || ':' || name, ',' ORDER BY id)) FROM %q`, table)))
		return s
	}
	require.Equal(t, sum("plain"), sum(table), "the River run's target equals a plain Run's")

	// River's completion of an attempt is not fenced by attempt: the
	// failed attempt of a worker that River rescued while it was alive
	// may set its job retryable after another attempt loaded the chunk.
	// That job runs once more, finds the chunk done and completes.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var waiting []string
		require.NoError(t, f.db.Select(&waiting, `SELECT id || ' ' || state FROM river_job WHERE kind = $1 AND args->>'batch_id' = $2::text AND state NOT IN ('completed', 'cancelled')`,
			Kind, batch))
		if len(waiting) == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "River jobs of the run still wait or run: %v", waiting)
		time.Sleep(50 * time.Millisecond)
	}
	var completed, seqs int
	require.NoError(t, f.db.QueryRow(`SELECT count(*), count(DISTINCT args->>'seq') FROM river_job WHERE kind = $1 AND args->>'batch_id' = $2::text AND state = 'completed'`,
		Kind, batch).Scan(&completed, &seqs))
	require.Equal(t, rows/100, completed, "one completed River job per chunk")
	require.Equal(t, rows/100, seqs, "one completed River job per chunk")
}

// TestEnqueueInOneTransaction: a rolled back Enqueue leaves neither the
// run nor its River jobs; a committed one both, one job per chunk; a
// second Enqueue of the same run inserts nothing.
func TestEnqueueInOneTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r, err := backfill.New(f.db, runnerConfig())
	require.NoError(t, err)
	c, err := river.NewClient(riverdatabasesql.New(f.db.DB), &river.Config{})
	require.NoError(t, err)
	j := job(f.db, "via_river", nil)

	tx, err := f.db.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	res, err := Enqueue(t.Context(), c, tx, r, j, nil)
	require.NoError(t, err)
	require.Equal(t, rows/100, res.Inserted)
	require.NoError(t, tx.Rollback())
	var runs, jobs int
	require.NoError(t, f.db.Get(&runs, `SELECT count(*) FROM backfill.runs`))
	require.NoError(t, f.db.Get(&jobs, `SELECT count(*) FROM river_job`))
	require.Zero(t, runs+jobs, "a rolled back Enqueue leaves no run and no River job")

	res = enqueue(t, f, c, r, j)
	require.Equal(t, rows/100, res.Inserted)
	require.False(t, res.Run.Resumed)
	again := enqueue(t, f, c, r, j)
	require.Equal(t, res.Run.BatchID, again.Run.BatchID)
	require.Zero(t, again.Inserted)
	require.Equal(t, rows/100, again.Skipped)
	require.NoError(t, f.db.Get(&jobs, `SELECT count(*) FROM river_job`))
	require.Equal(t, rows/100, jobs)
}

// TestRiverRunEqualsPlainRun: two River clients (two workers each) run a
// run's chunks; the target equals a plain Run's.
func TestRiverRunEqualsPlainRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r, err := backfill.New(f.db, runnerConfig())
	require.NoError(t, err)
	j := job(f.db, "via_river", nil)
	w, err := NewWorker(r, &Options{BusySnooze: 100 * time.Millisecond}, j)
	require.NoError(t, err)
	c1 := newClient(t, f.db.DB, w, 2)
	newClient(t, f.db.DB, w, 2)
	res := enqueue(t, f, c1, r, j)
	waitRun(t, f.db, r, res.Run.BatchID, backfill.RunCompleted)
	checkLoaded(t, f, r, res.Run.BatchID, "via_river")

	var outputs int
	require.NoError(t, f.db.Get(&outputs, `SELECT count(*) FROM river_job WHERE kind = $1 AND metadata->'output'->>'outcome' = 'loaded'`, Kind))
	require.Equal(t, rows/100, outputs, "each River job records its chunk's counts as its output")
}

// child is the killed worker of TestKill9RiverWorkerMidChunk: one River
// worker whose first chunk, merged and checkpointed, notes its seq in
// table reached (outside its transaction) and blocks before its commit.
func child(u string) error {
	ctx := context.Background()
	db, err := sqlx.Open("postgres", u)
	if err != nil {
		return err
	}
	r, err := backfill.New(db, runnerConfig())
	if err != nil {
		return err
	}
	w, err := NewWorker(r, nil, job(db, "via_river", nil))
	if err != nil {
		return err
	}
	release := os.Getenv(childReleaseEnv) != ""
	var first atomic.Bool
	w.beforeCommit = func(ctx context.Context, args ChunkArgs) error {
		if !first.CompareAndSwap(false, true) {
			return nil
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO reached (seq) VALUES ($1)`, args.Seq); err != nil {
			return err
		}
		if !release {
			select {} // until killed
		}
		// A worker alive past its River timeout: this wait ignores the
		// job's context, which River cancels at the timeout.
		for {
			var n int
			if err := db.GetContext(context.Background(), &n, `SELECT count(*) FROM released`); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ws := river.NewWorkers()
	river.AddWorker(ws, w)
	c, err := river.NewClient(riverdatabasesql.New(db.DB), &river.Config{
		Queues:               map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
		Workers:              ws,
		FetchPollInterval:    50 * time.Millisecond,
		FetchCooldown:        50 * time.Millisecond,
		JobTimeout:           20 * time.Second,
		RescueStuckJobsAfter: 20 * time.Second,
	})
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	select {}
}

// startChild starts the child worker (release: it commits its first
// chunk once table released has a row, else it blocks there until
// killed) and returns once it is inside its first chunk's transaction,
// after the merge and checkpoint, with the chunk's seq.
func startChild(t *testing.T, f *fixture, release bool) (*exec.Cmd, int) {
	t.Helper()
	cu, err := url.Parse(f.url)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+cu.String())
	if release {
		cmd.Env = append(cmd.Env, childReleaseEnv+"=1")
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(2 * time.Minute)
	var seq int
	for {
		if err := f.db.Get(&seq, `SELECT seq FROM reached LIMIT 1`); err == nil {
			return cmd, seq
		} else if !errors.Is(err, sql.ErrNoRows) {
			require.NoError(t, err)
		}
		require.True(t, time.Now().Before(deadline), "the child reached no chunk's commit")
		time.Sleep(10 * time.Millisecond)
	}
}

// waitRescued waits until River rescued the job of chunk seq and ran it
// again, which found the chunk busy and snoozed it.
func waitRescued(t *testing.T, f *fixture, seq int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var snoozed bool
		require.NoError(t, f.db.Get(&snoozed, `SELECT coalesce((metadata->>'snoozes')::int, 0) >= 1 FROM river_job WHERE kind = $1 AND (args->>'seq')::int = $2`, Kind, seq))
		if snoozed {
			return
		}
		require.True(t, time.Now().Before(deadline), "River did not run the stuck job again")
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKill9RiverWorkerMidChunk: of two River workers, one (a child
// process) is killed with SIGKILL inside a chunk's transaction, after its
// merge and checkpoint, before its commit. River rescues its stuck job,
// the other worker takes the chunk's stale lease over and loads it:
// every row once, the target equal to a plain Run's, every River job
// completed.
func TestKill9RiverWorkerMidChunk(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r, err := backfill.New(f.db, runnerConfig())
	require.NoError(t, err)
	// The surviving worker loads its chunks only once the child holds
	// one inside its transaction.
	var reached atomic.Bool
	j := job(f.db, "via_river", func(ctx context.Context, c backfill.Chunk) error {
		for !reached.Load() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		return nil
	})
	w, err := NewWorker(r, &Options{BusySnooze: 200 * time.Millisecond}, j)
	require.NoError(t, err)
	c := newClient(t, f.db.DB, w, 2)
	res := enqueue(t, f, c, r, j)

	cmd, seq := startChild(t, f, false)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	reached.Store(true)

	waitRun(t, f.db, r, res.Run.BatchID, backfill.RunCompleted)
	checkLoaded(t, f, r, res.Run.BatchID, "via_river")
	var attempts int
	require.NoError(t, f.db.Get(&attempts, `SELECT attempt FROM river_job WHERE kind = $1 AND (args->>'seq')::int = $2`, Kind, seq))
	require.GreaterOrEqual(t, attempts, 2, "the killed worker's River job was rescued and run again")
}

// TestRiverJobCancelledMidChunk: a River job cancelled while its chunk is
// extracted rolls the chunk back (pending, nothing loaded) and ends
// cancelled in River; enqueueing the run again inserts a job for that
// chunk only, and the run completes equal to a plain Run.
func TestRiverJobCancelledMidChunk(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r, err := backfill.New(f.db, runnerConfig())
	require.NoError(t, err)
	inChunk := make(chan int, 1)
	var blocked atomic.Bool
	j := job(f.db, "via_river", func(ctx context.Context, c backfill.Chunk) error {
		if c.Seq == 3 && blocked.CompareAndSwap(false, true) {
			inChunk <- c.Seq
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	w, err := NewWorker(r, nil, j)
	require.NoError(t, err)
	c := newClient(t, f.db.DB, w, 2)
	res := enqueue(t, f, c, r, j)
	<-inChunk
	var id int64
	require.NoError(t, f.db.Get(&id, `SELECT id FROM river_job WHERE kind = $1 AND (args->>'seq')::int = 3`, Kind))
	_, err = c.JobCancel(t.Context(), id)
	require.NoError(t, err)

	deadline := time.Now().Add(2 * time.Minute)
	for {
		var state string
		require.NoError(t, f.db.Get(&state, `SELECT state FROM river_job WHERE id = $1`, id))
		if state == "cancelled" {
			break
		}
		require.True(t, time.Now().Before(deadline), "the River job is %s, not cancelled", state)
		time.Sleep(20 * time.Millisecond)
	}
	// The others finish; the cancelled job's chunk stays pending.
	deadline = time.Now().Add(2 * time.Minute)
	for {
		st, err := r.StatusOf(t.Context(), res.Run.BatchID)
		require.NoError(t, err)
		if st.Chunks.Done == rows/100-1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "chunks: %+v", st.Chunks)
		time.Sleep(20 * time.Millisecond)
	}
	var status string
	require.NoError(t, f.db.Get(&status, `SELECT status FROM backfill.chunks WHERE batch_id = $1 AND seq = 3`, res.Run.BatchID))
	require.Equal(t, "pending", status)

	again := enqueue(t, f, c, r, j)
	require.Equal(t, res.Run.BatchID, again.Run.BatchID)
	require.Equal(t, 1, again.Inserted, "only the cancelled job's chunk is enqueued again")
	waitRun(t, f.db, r, res.Run.BatchID, backfill.RunCompleted)
	checkLoaded(t, f, r, res.Run.BatchID, "via_river")
}

// TestPauseFromSQL: a run paused with backfill.pause while its River jobs
// run: the jobs snooze and load nothing more; resumed with
// backfill.resume, the run completes equal to a plain Run.
func TestPauseFromSQL(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r, err := backfill.New(f.db, runnerConfig())
	require.NoError(t, err)
	j := job(f.db, "via_river", nil)
	w, err := NewWorker(r, &Options{PausedSnooze: 100 * time.Millisecond}, j)
	require.NoError(t, err)
	// The run is paused before a worker starts: the first River jobs
	// find it paused.
	c, err := river.NewClient(riverdatabasesql.New(f.db.DB), &river.Config{})
	require.NoError(t, err)
	res := enqueue(t, f, c, r, j)
	_, err = f.db.Exec(`SELECT backfill.pause($1::bigint, 'ops', 'maintenance window')`, res.Run.BatchID)
	require.NoError(t, err)
	newClient(t, f.db.DB, w, 2)

	deadline := time.Now().Add(2 * time.Minute)
	for {
		var snoozed int
		require.NoError(t, f.db.Get(&snoozed, `SELECT count(*) FROM river_job WHERE kind = $1 AND (metadata->>'snoozes')::int >= 2`, Kind))
		if snoozed >= 2 {
			break
		}
		require.True(t, time.Now().Before(deadline), "no River job snoozed twice")
		time.Sleep(20 * time.Millisecond)
	}
	st, err := r.StatusOf(t.Context(), res.Run.BatchID)
	require.NoError(t, err)
	require.Equal(t, backfill.RunPaused, st.Status)
	require.Zero(t, st.Chunks.Done, "a paused run loads nothing")

	_, err = f.db.Exec(`SELECT backfill.resume($1::bigint, 'ops', 'window over')`, res.Run.BatchID)
	require.NoError(t, err)
	waitRun(t, f.db, r, res.Run.BatchID, backfill.RunCompleted)
	checkLoaded(t, f, r, res.Run.BatchID, "via_river")
}

// TestRescueWhileWorkerAlive: a worker goes on past its River job's
// timeout (code that ignores the job's context) inside its chunk's
// transaction, heartbeating. River cancels the job's context, which rolls
// the chunk's transaction back, rescues the job and runs it again on
// another worker, which finds the chunk's lease live and snoozes; the
// slow worker then tries to commit, and cannot. The chunk is merged once,
// by the other worker, and every River job ends completed.
func TestRescueWhileWorkerAlive(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r, err := backfill.New(f.db, runnerConfig())
	require.NoError(t, err)
	j := job(f.db, "via_river", nil)
	ins, err := river.NewClient(riverdatabasesql.New(f.db.DB), &river.Config{})
	require.NoError(t, err)
	res := enqueue(t, f, ins, r, j)
	_, seq := startChild(t, f, true)

	w, err := NewWorker(r, &Options{BusySnooze: 200 * time.Millisecond}, j)
	require.NoError(t, err)
	newClient(t, f.db.DB, w, 2)
	waitRescued(t, f, seq)
	_, err = f.db.Exec(`INSERT INTO released VALUES (now())`)
	require.NoError(t, err)

	waitRun(t, f.db, r, res.Run.BatchID, backfill.RunCompleted)
	checkLoaded(t, f, r, res.Run.BatchID, "via_river")
}

// TestRescueFrozenWorker: a worker frozen (SIGSTOP) inside its chunk's
// transaction stops heartbeating; River rescues its job, another worker
// takes the stale lease over, ends the frozen worker's transaction
// (fencing) and loads the chunk. The frozen worker, thawed, cannot
// commit: the chunk is merged once.
func TestRescueFrozenWorker(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r, err := backfill.New(f.db, runnerConfig())
	require.NoError(t, err)
	j := job(f.db, "via_river", nil)
	ins, err := river.NewClient(riverdatabasesql.New(f.db.DB), &river.Config{})
	require.NoError(t, err)
	res := enqueue(t, f, ins, r, j)
	cmd, _ := startChild(t, f, true)
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))

	w, err := NewWorker(r, &Options{BusySnooze: 200 * time.Millisecond}, j)
	require.NoError(t, err)
	newClient(t, f.db.DB, w, 2)
	waitRun(t, f.db, r, res.Run.BatchID, backfill.RunCompleted)
	// Thawed and released, the frozen worker's transaction is gone.
	_, err = f.db.Exec(`INSERT INTO released VALUES (now())`)
	require.NoError(t, err)
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	checkLoaded(t, f, r, res.Run.BatchID, "via_river")
}
