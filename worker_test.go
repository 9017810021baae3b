package backfill

import (
	"bytes"
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/testwait"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// liveChunks is the number of chunks of liveJob.
const liveChunks = 6

// liveJob loads ids [0, 60) into table live in chunks of 10. hold, if not
// nil, is called by the extractor after the chunk's first row; it blocks
// as long as the test wants the chunk in flight.
func liveJob(hold func(c Chunk)) Job {
	return Job{
		Name:    "live",
		Chunker: IntRange(0, 10*liveChunks, 10),
		Extractor: ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, fmt.Sprint("v", id)); err != nil {
					return err
				}
				if id == c.Lo && hold != nil {
					hold(c)
				}
			}
			return nil
		}),
		Rollback: RollbackNone,
		Target:   Target{Table: "live", Key: []string{"id"}},
	}
}

func liveDB(t *testing.T) *sqlx.DB {
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	return db
}

// liveRunner is a runner of worker id with short heartbeats, logging to
// logs (JSON) when not nil.
func liveRunner(t *testing.T, db *sqlx.DB, id string, logs *syncBuffer) *Runner {
	cfg := &Config{WorkerID: id, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second, RetryBackoff: 10 * time.Millisecond}
	if logs != nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	}
	r, err := New(db, cfg)
	require.NoError(t, err)
	return r
}

type runResult struct {
	rep Report
	err error
}

// goRun runs job on a goroutine of its own and sends the result. The
// run ends after testwait.Timeout at the latest: a run that never
// returns (a hold that never releases, a wait never woken) fails its
// test with the context's error rather than hanging until the package
// timeout.
func goRun(ctx context.Context, r *Runner, job Job) <-chan runResult {
	ch := make(chan runResult, 1)
	go func() {
		ctx, cancel := context.WithTimeoutCause(ctx, testwait.Timeout, fmt.Errorf("testwait: the run of job %q did not return within %v", job.Name, testwait.Timeout))
		defer cancel()
		rep, err := r.Run(ctx, job)
		if err != nil && context.Cause(ctx) != nil && ctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		}
		ch <- runResult{rep, err}
	}()
	return ch
}

func chunkStatuses(t *testing.T, db *sqlx.DB) map[string]int {
	var rows []struct {
		Status string `db:"status"`
		N      int    `db:"n"`
	}
	require.NoError(t, db.Select(&rows, `SELECT c.status, count(*) AS n FROM backfill.chunks c JOIN backfill.runs r USING (batch_id)
		WHERE r.job_name = 'live' AND r.status <> 'abandoned' GROUP BY c.status`))
	out := map[string]int{}
	for _, r := range rows {
		out[r.Status] = r.N
	}
	return out
}

// TestJoiningWorkerWorksBesideChunkInFlight: a second process joining a
// running job while a chunk of the first is in flight does its share
// of the chunks at once (it does not wait on the run's row behind the
// chunk), then waits for the chunk in flight, saying so in its log with
// the chunk and its holder, and the run completes when the chunk does.
func TestJoiningWorkerWorksBesideChunkInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	a := liveRunner(t, db, "worker-a", nil)
	aDone := goRun(ctx, a, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			close(inFlight)
			<-release
		}
	}))
	<-inFlight

	var logs syncBuffer
	b := liveRunner(t, db, "worker-b", &logs)
	bDone := goRun(ctx, b, liveJob(nil))
	require.Eventually(t, func() bool { return chunkStatuses(t, db)["done"] == liveChunks-1 },
		30*time.Second, 20*time.Millisecond, "the joining worker does the other chunks while chunk 0 is in flight")
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), `"msg":"backfill: waiting for a chunk in flight"`) &&
			strings.Contains(logs.String(), `"chunk":"int:0/10"`) && strings.Contains(logs.String(), `"holder":"worker-a"`)
	}, 30*time.Second, 20*time.Millisecond, "the waiting worker names the chunk and its holder")
	select {
	case res := <-bDone:
		t.Fatalf("the joining worker returned while a chunk was in flight: %+v", res)
	default:
	}

	once.Do(func() { close(release) })
	ra, rb := <-aDone, <-bDone
	require.NoError(t, ra.err)
	require.NoError(t, rb.err)
	require.Equal(t, RunCompleted, rb.rep.Status)
	require.Equal(t, 1, ra.rep.ChunksRun, "worker a did its chunk in flight")
	require.Equal(t, liveChunks-1, rb.rep.ChunksRun, "worker b did the rest")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 10*liveChunks, n)
	require.Contains(t, logs.String(), `"msg":"backfill: done waiting for chunks in flight"`)
}

// TestFrozenWorkerIsFencedAndCannotCommit: a worker whose heartbeats stop
// while its chunk's transaction is open (frozen: SIGSTOP, a network split)
// is fenced by a waiting worker once its heartbeat is older than
// StaleAfter: its backend is terminated, the waiting worker does its
// chunk, and the run completes. The frozen worker, thawed, cannot commit
// the chunk (its transaction is gone), so the chunk is merged exactly once.
func TestFrozenWorkerIsFencedAndCannotCommit(t *testing.T) {
	// Not parallel: it sets the heartbeat hook of the package.
	ctx := context.Background()
	db := liveDB(t)
	freeze, _ := heartbeatsOff(t, "frozen")

	inFlight, thaw := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(thaw) })
	var firstOnly sync.Once
	var logsA syncBuffer
	a := liveRunner(t, db, "frozen", &logsA)
	aDone := goRun(ctx, a, liveJob(func(c Chunk) {
		if c.Seq != 0 {
			return
		}
		firstOnly.Do(func() {
			freeze(true)
			close(inFlight)
			<-thaw
		})
	}))
	<-inFlight

	var logs syncBuffer
	b := liveRunner(t, db, "healthy", &logs)
	rb := <-goRun(ctx, b, liveJob(nil))
	require.NoError(t, rb.err)
	require.Equal(t, RunCompleted, rb.rep.Status)
	require.Equal(t, liveChunks, rb.rep.ChunksRun, "the healthy worker did every chunk, the frozen one's too")
	t.Logf("longest wait of the healthy worker behind the frozen one: %v (StaleAfter %v)", longestWait(t, logs.String()), b.cfg.StaleAfter)

	workers, err := NewPGManifest("").Workers(ctx, db, rb.rep.BatchID)
	require.NoError(t, err)
	require.Len(t, workers, 2)
	stale := map[string]bool{}
	for _, w := range workers {
		stale[w.ID] = w.Stale
	}
	require.Equal(t, map[string]bool{"frozen": true, "healthy": false}, stale)

	once.Do(func() { close(thaw) })
	ra := <-aDone
	require.Zero(t, ra.rep.ChunksRun, "the fenced worker committed nothing: %v", ra.err)
	// It froze while extracting, outside any transaction: its lease was
	// taken over, and its chunk transaction's fence found no row.
	require.Contains(t, logsA.String(), `"msg":"backfill: chunk's fence failed: its lease was taken over (this worker was stale) or the run stopped meanwhile (paused, abandoned); its transaction rolls back"`)

	var chunk0 struct {
		Worker   string `db:"worker"`
		Inserted int64  `db:"rows_inserted"`
		Status   string `db:"status"`
	}
	require.NoError(t, db.Get(&chunk0, `SELECT worker, rows_inserted, status FROM backfill.chunks WHERE batch_id = $1 AND seq = 0`, rb.rep.BatchID))
	require.Equal(t, "done", chunk0.Status)
	require.Equal(t, "healthy", chunk0.Worker)
	require.Equal(t, int64(10), chunk0.Inserted, "merged once, by the healthy worker")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 10*liveChunks, n)
}

// longestWait is the longest "waited" of the wait records in JSON logs.
func longestWait(t *testing.T, logs string) time.Duration {
	var longest time.Duration
	for _, line := range strings.Split(logs, "\n") {
		var rec struct {
			Msg    string        `json:"msg"`
			Waited time.Duration `json:"waited"`
		}
		if line == "" || json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		longest = max(longest, rec.Waited)
	}
	return longest
}

// TestRunLiveness: the manifest's run_liveness view and RunLiveness say
// running while a worker heartbeats, stalled and then dead as its
// heartbeat ages past StaleAfter and twice it, and the status once the
// run ends; a run left running by a worker that returned is dead.
func TestRunLiveness(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	m := NewPGManifest("")
	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	a := liveRunner(t, db, "worker-a", nil)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	aDone := goRun(cctx, a, liveJob(func(c Chunk) {
		if c.Seq == 2 {
			close(inFlight)
			<-release
		}
	}))
	<-inFlight
	var batch int64
	require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
	lv, err := m.RunLiveness(ctx, db, batch)
	require.NoError(t, err)
	require.Equal(t, LivenessRunning, lv.Liveness)
	require.Equal(t, 1, lv.LiveWorkers)
	require.NotNil(t, lv.LastHeartbeat)

	// The worker's heartbeat as if it stopped 1.5 and 3 StaleAfter ago
	// (its goroutine would refresh it: the hook stops it meanwhile).
	// A heartbeat in flight lands first: the loop is sequential, so once
	// it skipped one, none is in flight.
	freeze, skipped := heartbeatsOff(t, "worker-a")
	freeze(true)
	testwait.Recv(t, "a heartbeat of worker-a skipped by the hook", skipped)
	for _, c := range []struct {
		age  string
		want string
	}{{"1.5 seconds", LivenessStalled}, {"3 seconds", LivenessDead}} {
		_, err := db.Exec(`UPDATE backfill.workers SET heartbeat_at = now() - $1::interval WHERE batch_id = $2`, c.age, batch)
		require.NoError(t, err)
		lv, err := m.RunLiveness(ctx, db, batch)
		require.NoError(t, err)
		require.Equal(t, c.want, lv.Liveness, "heartbeat %s old", c.age)
		// Stalled or dead, no worker works the run: the status says so,
		// since when, and what to do.
		st, err := a.StatusOf(ctx, batch)
		require.NoError(t, err)
		require.Equal(t, c.want, st.Liveness)
		require.Contains(t, st.Waiting, "no live worker since the last heartbeat", "heartbeat %s old", c.age)
		require.Contains(t, st.Waiting, "start a worker", "heartbeat %s old", c.age)
	}
	testHeartbeatsOff.Store(nil)

	// Interrupted: the run stays running, its worker finished: dead.
	cancel()
	once.Do(func() { close(release) })
	ra := testwait.Recv(t, "worker-a's interrupted run", aDone)
	require.ErrorIs(t, ra.err, context.Canceled)
	lv, err = m.RunLiveness(ctx, db, batch)
	require.NoError(t, err)
	require.Equal(t, RunRunning, lv.Status)
	require.Equal(t, LivenessDead, lv.Liveness)
	require.Zero(t, lv.LiveWorkers)

	rep, err := liveRunner(t, db, "worker-b", nil).Run(ctx, liveJob(nil))
	require.NoError(t, err)
	lv, err = m.RunLiveness(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Equal(t, string(RunCompleted), lv.Liveness)
	ws, err := m.Workers(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ws, 2)
	for _, w := range ws {
		require.Equal(t, "finished", w.State, w.ID)
		require.NotNil(t, w.FinishedAt)
	}
}

// TestServerRestartDuringChunk: `pg_ctl restart -m immediate` of the
// server while a chunk is in flight cuts that try's transaction: a
// connection fault, not a failed attempt. The chunk is tried again with
// backoff until the server is back, under the same attempt, and the run
// completes.
func TestServerRestartDuringChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Commits durable across the crash (the throwaway server's default
	// is synchronous_commit off).
	srv, err := pgtest.StartWith(ctx, pgtest.Options{SynchronousCommit: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.Stop()) }()
	db, err := sqlx.Open("postgres", srv.URL())
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)

	var logs syncBuffer
	r, err := New(db, &Config{WorkerID: "w", HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 5 * time.Second,
		RetryBackoff: 20 * time.Millisecond, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, err)
	mid, down := make(chan struct{}), make(chan struct{})
	var first sync.Once
	done := goRun(ctx, r, liveJob(func(c Chunk) {
		if c.Seq == 2 {
			first.Do(func() {
				close(mid)
				<-down // the server is down: this attempt's writes fail
			})
		}
	}))
	<-mid
	// The chunk's transaction cannot begin (or is cut) while the server
	// is down: a fault of the chunk, retried after a pause. Extracting
	// ahead (the default), chunk 2 is extracted while chunk 1's
	// transaction runs: the transaction the restart cuts, or that cannot
	// begin, is chunk 1's or chunk 2's.
	lost := regexp.MustCompile(`"msg":"backfill: chunk's connection to the server was lost; rolled back, retrying after a pause \(not counted toward MaxAttempts\)",[^\n]*"seq":[12],[^\n]*"attempt":1`)
	// The chunk's goroutine logs the fault once it has released the
	// chunk's lease and read the run's control state, each retried up
	// to its own bound while the server is down (seconds): the server
	// comes back once the release was tried, which follows the fault.
	releasing := regexp.MustCompile(`"msg":"backfill: a manifest transaction hit a transient fault; retrying after a pause","what":"release a lease"`)
	require.NoError(t, srv.RestartImmediate(ctx, func() {
		close(down)
		testwait.Until(t, "a fault of a chunk's transaction while the server is down", func() bool {
			l := logs.String()
			return lost.MatchString(l) || releasing.MatchString(l)
		})
	}))
	res := testwait.Recv(t, "the run after the restart", done)
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)
	require.Regexp(t, lost, logs.String(), "the fault of chunk 1's or 2's transaction, at its first attempt")
	require.NotContains(t, logs.String(), `"msg":"chunk failed"`)

	var attempts int
	require.NoError(t, db.Get(&attempts, `SELECT max(attempts) FROM backfill.chunks`))
	require.Equal(t, 1, attempts, "a fault is not an attempt: every chunk is done on its first")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 10*liveChunks, n)
}

// TestConnectionFailuresExhaustAttempts: a chunk that fails with a
// connection-class error at every attempt is retried MaxAttempts times;
// the run then ends failed with the error as its last_error, not running.
func TestConnectionFailuresExhaustAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w", nil)
	job := liveJob(nil)
	inner := job.Extractor
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		if c.Seq == 1 {
			return fmt.Errorf("source: %w", driver.ErrBadConn)
		}
		return inner.Extract(ctx, c, w)
	})
	rep, err := r.Run(ctx, job)
	require.Error(t, err)
	require.Equal(t, RunFailed, rep.Status)
	var run struct {
		Status    string `db:"status"`
		LastError string `db:"last_error"`
	}
	require.NoError(t, db.Get(&run, `SELECT status, last_error FROM backfill.runs WHERE batch_id = $1`, rep.BatchID))
	require.Equal(t, "failed", run.Status)
	require.Contains(t, run.LastError, "bad connection")
	var attempts int
	require.NoError(t, db.Get(&attempts, `SELECT attempts FROM backfill.chunks WHERE batch_id = $1 AND seq = 1`, rep.BatchID))
	require.Equal(t, 3, attempts)
	require.Equal(t, ExitFailed, exitCode(ctx, rep, err))
}

// TestStatementTimeoutNotChargedWithExtractor: a statement_timeout of the
// database shorter than the extractor's time does not cancel the COPY
// that stays open while the extractor runs; the merge's statements run
// under the database's statement_timeout again.
func TestStatementTimeoutNotChargedWithExtractor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", u)
	defer db.Close()
	_, err := db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	var name string
	require.NoError(t, db.Get(&name, `SELECT current_database()`))
	_, err = db.Exec(`ALTER DATABASE "` + name + `" SET statement_timeout = '1s'`)
	require.NoError(t, err)
	db.SetMaxIdleConns(0) // new sessions: they take the database's setting
	db2 := sqlx.MustOpen("postgres", u)
	defer db2.Close()

	r := liveRunner(t, db2, "w", nil)
	job := liveJob(func(c Chunk) {
		if c.Seq == 0 {
			time.Sleep(3 * time.Second) // 3 times the statement_timeout
		}
	})
	job.Chunker = IntRange(0, 20, 10)
	var mu sync.Mutex
	var seen []string
	job.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		var v string
		if err := sqlx.GetContext(ctx, tx, &v, `SELECT current_setting('statement_timeout')`); err != nil {
			return CheckResult{}, err
		}
		mu.Lock()
		seen = append(seen, v)
		mu.Unlock()
		return CheckResult{Check: "timeout", Severity: SeverityWarn, Passed: true}, nil
	})}
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, []string{"1s", "1s"}, seen, "the merge and what follows run under the database's statement_timeout")
}

// TestAbandonWaitsForChunksInFlight: a new run (Job.NewRun) abandons the
// running one at once, without waiting on its row behind chunks in
// flight, but creates the new run only once those chunks ended, saying
// so in its log; a chunk in flight of the abandoned run cannot commit
// its checkpoint, so a worker of an abandoned run never writes over the
// new run.
func TestAbandonWaitsForChunksInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	a := liveRunner(t, db, "old", nil)
	aDone := goRun(ctx, a, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			close(inFlight)
			<-release
		}
	}))
	<-inFlight

	var logs syncBuffer
	b := liveRunner(t, db, "new", &logs)
	job := liveJob(nil)
	job.NewRun, job.CodeVersion = true, "v2"
	bDone := goRun(ctx, b, job)
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), `"what":"start run of job live: wait for the chunks in flight of abandoned batch 1"`) &&
			strings.Contains(logs.String(), `"holder":"old"`)
	}, 30*time.Second, 20*time.Millisecond, "the new run waits for the abandoned run's chunk in flight, and says so")
	var runs []string
	require.NoError(t, db.Select(&runs, `SELECT status FROM backfill.runs ORDER BY batch_id`))
	require.Equal(t, []string{"abandoned"}, runs, "abandoned at once; no new run while its chunk is in flight")

	once.Do(func() { close(release) })
	ra, rb := <-aDone, <-bDone
	require.ErrorIs(t, ra.err, ErrRunAbandoned)
	require.NoError(t, rb.err)
	require.Equal(t, RunCompleted, rb.rep.Status)
	var done int
	require.NoError(t, db.Get(&done, `SELECT count(*) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.status = 'abandoned' AND c.status = 'done'`))
	require.Zero(t, done, "the abandoned run's chunk in flight did not commit")
	require.Equal(t, liveChunks, rb.rep.ChunksDone)
}

// TestWorkersConverge: N workers started at once, each calling Work with
// the same job (as N hosts would), converge on one run: every one exits
// with ExitDone, every chunk is merged exactly once, and each worker is
// recorded finished in the manifest.
func TestWorkersConverge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	const n = 3
	codes := make(chan ExitCode, n)
	for i := range n {
		r := liveRunner(t, db, fmt.Sprint("host-", i), nil)
		r.cfg.Concurrency = 2
		go func() { codes <- Work(ctx, r, liveJob(nil)) }()
	}
	for range n {
		require.Equal(t, ExitDone, <-codes)
	}
	var runs []string
	require.NoError(t, db.Select(&runs, `SELECT status FROM backfill.runs`))
	require.Equal(t, []string{"completed"}, runs, "one run")
	var attempts []int
	require.NoError(t, db.Select(&attempts, `SELECT attempts FROM backfill.chunks ORDER BY seq`))
	require.Equal(t, []int{1, 1, 1, 1, 1, 1}, attempts, "every chunk merged once")
	var inserted int64
	require.NoError(t, db.Get(&inserted, `SELECT sum(rows_inserted) FROM backfill.chunks`))
	require.Equal(t, int64(10*liveChunks), inserted)
	var unfinished int
	require.NoError(t, db.Get(&unfinished, `SELECT count(*) FROM backfill.workers WHERE finished_at IS NULL`))
	require.Zero(t, unfinished)
}

// freezeProxy forwards TCP connections to a PostgreSQL server and
// freezes every one of them (forwards nothing more, in either direction,
// and keeps the sockets open) right after a client sends the Bind of a
// statement whose text contains trigger: the process behind it is then
// frozen as by SIGSTOP or a stalled host, with that statement executed by
// the server and its transaction open. Its heartbeats, on other
// connections of the same proxy, stop too.
type freezeProxy struct {
	ln      net.Listener
	to      string
	trigger []byte
	frozen  chan struct{} // closed when the trigger fired
	thaw    chan struct{} // closed by the test's cleanup
	fired   atomic.Bool
}

func newFreezeProxy(t *testing.T, to, trigger string) *freezeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &freezeProxy{ln: ln, to: to, trigger: []byte(trigger), frozen: make(chan struct{}), thaw: make(chan struct{})}
	t.Cleanup(func() { close(p.thaw); _ = ln.Close() })
	go p.accept()
	return p
}

func (p *freezeProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

// pipe copies from src to dst until frozen, then waits for the thaw.
func (p *freezeProxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.to)
	if err != nil {
		_ = c.Close()
		return
	}
	defer func() { _ = s.Close(); _ = c.Close() }()
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := s.Read(buf)
			if p.fired.Load() {
				<-p.thaw
				return
			}
			if n > 0 {
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	armed := false
	for {
		n, err := c.Read(buf)
		if p.fired.Load() {
			<-p.thaw
			return
		}
		if n > 0 {
			if _, werr := s.Write(buf[:n]); werr != nil {
				return
			}
			switch {
			case armed && buf[0] == 'B':
				// The Bind (and Execute, Sync) of the trigger statement:
				// lib/pq sends Parse first, then Bind in a second round
				// trip. Freeze from here on.
				if p.fired.CompareAndSwap(false, true) {
					close(p.frozen)
				}
			case bytes.Contains(buf[:n], p.trigger):
				armed = true
			}
		}
		if err != nil {
			return
		}
	}
}

// viaProxy returns u with its host and port replaced by the proxy's.
func viaProxy(t *testing.T, u string, p *freezeProxy) string {
	pu, err := url.Parse(u)
	require.NoError(t, err)
	pu.Host = p.ln.Addr().String()
	return pu.String()
}

// TestFrozenRunRowHolderDoesNotStopOthers: a worker that freezes (a
// stalled host) right after its start locked the run's row must not stop
// the other workers: their chunks (which insert validations, exceptions
// and heartbeats referencing the run's row) go on, and the run is
// finished once the server ends the frozen worker's idle transaction
// (inShortTx's idle_in_transaction_session_timeout, 8 s here).
func TestFrozenRunRowHolderDoesNotStopOthers(t *testing.T) {
	prev := pgstore.ManifestIdleMS.Swap(8000)
	t.Cleanup(func() { pgstore.ManifestIdleMS.Store(prev) })
	ctx := context.Background()
	u := pgtest.NewURL(t)
	db, err := sqlx.Open("postgres", u)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	pu, err := url.Parse(u)
	require.NoError(t, err)
	// The run's row, locked by a joining worker's StartRun.
	proxy := newFreezeProxy(t, pu.Host, "ORDER BY batch_id DESC LIMIT 1 FOR")

	validated := ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		return CheckResult{Check: "always", Severity: SeverityError, Passed: true, Expected: "ok", Actual: "ok"}, nil
	})
	job := func(hold func(Chunk)) Job {
		j := liveJob(hold)
		j.Validators = []Validator{validated}
		return j
	}
	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	a := liveRunner(t, db, "healthy", nil)
	aDone := goRun(ctx, a, job(func(c Chunk) {
		if c.Seq == 0 {
			close(inFlight)
			<-release
		}
	}))
	<-inFlight

	fdb, err := sqlx.Open("postgres", viaProxy(t, u, proxy)+"&application_name=frozen")
	require.NoError(t, err)
	t.Cleanup(func() { _ = fdb.Close() })
	fctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	f := liveRunner(t, fdb, "frozen", nil)
	_ = goRun(fctx, f, job(nil))
	select {
	case <-proxy.frozen:
	case <-time.After(30 * time.Second):
		t.Fatal("the joining worker never locked the run's row")
	}
	once.Do(func() { close(release) })

	// Every chunk commits while the frozen worker still holds the run's
	// row in its open transaction.
	require.Eventually(t, func() bool { return chunkStatuses(t, db)["done"] == liveChunks }, 30*time.Second, 20*time.Millisecond,
		"the healthy worker's chunks wait on the run's row")
	var holding int
	require.NoError(t, db.Get(&holding, `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = 'frozen' AND state = 'idle in transaction' AND query LIKE '%ORDER BY batch_id DESC LIMIT 1 FOR%'`))
	require.Equal(t, 1, holding, "the frozen worker still holds the run's row")

	var res runResult
	select {
	case res = <-aDone:
	case <-time.After(60 * time.Second):
		var waits []string
		_ = db.Select(&waits, `SELECT format('%s waits on %s: %s', pid, pg_blocking_pids(pid), left(query, 80)) FROM pg_stat_activity
			WHERE cardinality(pg_blocking_pids(pid)) > 0`)
		t.Fatalf("the healthy worker is stuck behind the frozen one: %s", strings.Join(waits, "; "))
	}
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)
	require.Equal(t, liveChunks, res.rep.ChunksRun, "the healthy worker did every chunk")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 10*liveChunks, n)
}

// TestSlowValidatorIsNotFenced: a validator that works in the process for
// longer than StaleAfter (a count in the source, an external call) leaves
// its chunk's transaction idle meanwhile; the worker is healthy (its
// heartbeats go on), so nothing may end that transaction. On the starting
// commit of this fix the chunk's transaction set
// idle_in_transaction_session_timeout = StaleAfter, and the run failed
// with a bad connection.
func TestSlowValidatorIsNotFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "slow", nil) // StaleAfter 1 s
	j := liveJob(nil)
	j.Chunker = IntRange(0, 20, 10)
	j.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		time.Sleep(2500 * time.Millisecond) // in the process, between statements
		return CheckResult{Check: "slow", Severity: SeverityError, Passed: true, Expected: "ok", Actual: "ok"}, nil
	})}
	rep, err := r.Run(ctx, j)
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, 2, rep.ChunksRun)
}

// TestRollbackOfRunningRunIsRefused: Rollback without a BatchID while the
// job's latest run is running (chunks pending) refuses, saying what to do,
// and does not pick an older completed batch.
func TestRollbackOfRunningRunIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	_, err := db.Exec(`ALTER TABLE live ADD COLUMN backfill_inserted_by bigint, ADD COLUMN backfill_updated_by bigint`)
	require.NoError(t, err)
	r := liveRunner(t, db, "w", nil)
	first := liveJob(nil)
	first.Rollback = RollbackUndoLog
	rep, err := r.Run(ctx, first)
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)

	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	second := liveJob(func(c Chunk) {
		if c.Seq == 0 {
			close(inFlight)
			<-release
		}
	})
	second.Rollback, second.NewRun = RollbackUndoLog, true
	done := goRun(ctx, r, second)
	<-inFlight

	_, err = r.Rollback(ctx, first, RollbackOptions{Actor: "oncall", Why: "bad data"})
	require.Error(t, err)
	require.True(t, errors.Is(err, ErrInvalidConfig), "refused as documented: %v", err)
	require.False(t, errors.Is(err, ErrRunNotFound), "%v", err)
	var status string
	require.NoError(t, db.Get(&status, `SELECT status FROM backfill.runs WHERE batch_id = $1`, rep.BatchID))
	require.Equal(t, string(RunCompleted), status, "the older batch is left alone")

	once.Do(func() { close(release) })
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)
}

// TestDeadWorkerLiveUntilLastLife: a worker that stops heartbeating
// before its first heartbeat (as if killed) was live up to its last sign
// of life (its last chunk checkpoint or lease), not up to its last
// heartbeat only, and not up to when another worker completed the run:
// its work counts as working and the time it lay dead as idle, while it
// is dead (the run_progress view, Runner.TimeSplit) and once the run
// completed. The run's times are moved back 64 seconds and the worker's
// last chunk activity 60 seconds, as if it died 4 seconds in.
func TestDeadWorkerLiveUntilLastLife(t *testing.T) {
	// Not parallel: it sets the heartbeat hook of the package.
	ctx := context.Background()
	db := liveDB(t)
	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	a := liveRunner(t, db, "worker-a", nil)
	// Serial: once chunk 2 is in flight, chunk 1 has committed (extracting
	// ahead, its commit could land after the times below are moved back).
	a.cfg.SerialExtract = true
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	aDone := goRun(cctx, a, liveJob(func(c Chunk) {
		if c.Seq == 2 {
			close(inFlight)
			<-release
		}
	}))
	testwait.Recv(t, "worker-a's chunk 2 in flight", inFlight)
	freeze, skipped := heartbeatsOff(t, "worker-a")
	freeze(true)
	testwait.Recv(t, "a heartbeat of worker-a skipped by the hook", skipped)

	var batch int64
	require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
	for _, q := range []string{
		`UPDATE backfill.runs SET created_at = now() - interval '64 seconds' WHERE batch_id = $1`,
		`UPDATE backfill.workers SET started_at = now() - interval '64 seconds', heartbeat_at = now() - interval '64 seconds' WHERE batch_id = $1`,
		`UPDATE backfill.chunks SET checkpointed_at = now() - interval '60 seconds' WHERE batch_id = $1 AND checkpointed_at IS NOT NULL`,
		`UPDATE backfill.chunks SET leased_at = now() - interval '60 seconds' WHERE batch_id = $1 AND leased_at IS NOT NULL`,
	} {
		_, err := db.Exec(q, batch)
		require.NoError(t, err, q)
	}
	check := func(when string, working, idle float64) {
		t.Helper()
		require.Greater(t, working, 3.0, "%s: working", when)
		require.Less(t, working, 30.0, "%s: working", when)
		require.Greater(t, idle, 40.0, "%s: idle", when)
	}
	st, err := a.StatusOf(ctx, batch)
	require.NoError(t, err)
	check("dead, run_progress", st.Time.WorkingSeconds, st.Time.IdleSeconds)
	split, err := a.TimeSplit(ctx, batch)
	require.NoError(t, err)
	check("dead, TimeSplit", split.Working.Seconds(), split.Idle.Seconds())

	rep, err := liveRunner(t, db, "worker-b", nil).Run(ctx, liveJob(nil))
	require.NoError(t, err)
	require.Equal(t, batch, rep.BatchID)
	st, err = a.StatusOf(ctx, batch)
	require.NoError(t, err)
	check("completed, run_progress", st.Time.WorkingSeconds, st.Time.IdleSeconds)
	split, err = a.TimeSplit(ctx, batch)
	require.NoError(t, err)
	check("completed, TimeSplit", split.Working.Seconds(), split.Idle.Seconds())

	testHeartbeatsOff.Store(nil)
	cancel()
	once.Do(func() { close(release) })
	testwait.Recv(t, "worker-a's run", aDone)
}

// heartbeatsOff installs the package's heartbeat hook for the worker
// whose Config.WorkerID is id: after freeze(true) its heartbeats are
// skipped, as if its process were frozen, until freeze(false); skipped is
// closed at the first heartbeat skipped. t's cleanup removes the hook.
// Not for parallel tests: the hook is the package's.
func heartbeatsOff(t *testing.T, id string) (freeze func(bool), skipped <-chan struct{}) {
	var frozen atomic.Bool
	ch := make(chan struct{})
	var once sync.Once
	off := func(worker string) bool {
		if worker != id || !frozen.Load() {
			return false
		}
		once.Do(func() { close(ch) })
		return true
	}
	testHeartbeatsOff.Store(&off)
	t.Cleanup(func() { testHeartbeatsOff.Store(nil) })
	return frozen.Store, ch
}
