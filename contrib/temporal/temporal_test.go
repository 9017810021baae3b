package backfilltemporal_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	backfilltemporal "github.com/pgbackfill/backfill/contrib/temporal"
)

// childEnv, when set, makes the test binary a worker process of
// TestWorkerKilledMidChunk and TestZombieAttemptIsFenced (see child).
const childEnv = "BACKFILL_TEMPORAL_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	backfilltest.PostgresMain(m)
}

// testTimeout bounds each workflow of the tests.
var testTimeout = 4 * time.Minute

const (
	jobName  = "items"
	rows     = 400
	perChunk = 50
	chunks   = rows / perChunk
)

// params are the job's parameters in the workflow's input.
type params struct {
	Rows int64
}

// createItems creates the target table.
func createItems(t testing.TB, db *sqlx.DB) {
	t.Helper()
	if _, err := db.Exec(`CREATE TABLE items (id bigint PRIMARY KEY, name text,
		backfill_inserted_by bigint, backfill_updated_by bigint)`); err != nil {
		t.Fatal(err)
	}
}

// itemsJob is the job of p: chunks of perChunk ids into items, each row
// written by write (nil: the plain rows).
func itemsJob(p params, extract backfill.ExtractorFunc) backfill.Job {
	if extract == nil {
		extract = writeRows(0, nil)
	}
	return backfill.Job{
		Name:      jobName,
		Chunker:   backfill.IntRange(0, p.Rows, perChunk),
		Extractor: extract,
		Target:    backfill.Target{Table: "items", Key: []string{"id"}, Columns: []string{"id", "name"}},
	}
}

// writeRows writes the rows of a chunk, calling mid (when not nil) once
// half of them are written; mid may block.
func writeRows(_ int, mid func(ctx context.Context, c backfill.Chunk) error) backfill.ExtractorFunc {
	return func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		for id := c.Lo; id < c.Hi; id++ {
			if mid != nil && id == c.Lo+(c.Hi-c.Lo)/2 {
				if err := mid(ctx, c); err != nil {
					return err
				}
			}
			if err := w.Write(ctx, id, fmt.Sprintf("item-%d", id)); err != nil {
				return err
			}
		}
		return nil
	}
}

// jobFunc returns a JobFunc building itemsJob from the input's params.
func jobFunc(extract backfill.ExtractorFunc) backfilltemporal.JobFunc {
	return func(_ context.Context, in backfilltemporal.Input) (backfill.Job, error) {
		var p params
		if err := json.Unmarshal(in.Params, &p); err != nil {
			return backfill.Job{}, fmt.Errorf("params: %w", err)
		}
		return itemsJob(p, extract), nil
	}
}

func input(workers int) backfilltemporal.Input {
	p, _ := json.Marshal(params{Rows: rows})
	return backfilltemporal.Input{Job: jobName, Params: p, Workers: workers,
		// Long enough that a loaded machine never times a live slot out.
		HeartbeatTimeout: time.Minute, StatusEvery: -1}
}

// done counts the chunks committed (ChunkDone), by chunk seq, and logs
// the order of events.
type done struct {
	mu     sync.Mutex
	bySeq  map[int]int
	events []string
	on     func(c backfill.ChunkResult)
}

func newDone() *done { return &done{bySeq: map[int]int{}} }

func (d *done) ChunkDone(_ context.Context, _ int64, r backfill.ChunkResult) {
	d.mu.Lock()
	d.bySeq[r.Chunk.Seq]++
	d.events = append(d.events, fmt.Sprintf("done:%d", r.Chunk.Seq))
	on := d.on
	d.mu.Unlock()
	if on != nil {
		on(r)
	}
}

func (d *done) log(e string) {
	d.mu.Lock()
	d.events = append(d.events, e)
	d.mu.Unlock()
}

func (d *done) index(e string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Index(d.events, e)
}

// config is the Runner's configuration of the tests: short heartbeats, so
// that a dead worker's chunk is taken over soon.
func config(h backfill.Hooks) backfill.Config {
	cfg := backfill.Config{Hooks: h, HeartbeatInterval: 200 * time.Millisecond, StaleAfter: 2 * time.Second,
		ThrottleInterval: 50 * time.Millisecond}
	if os.Getenv("BACKFILL_TEMPORAL_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return cfg
}

// newEnv returns a workflow environment with a's workflow and activities.
func newEnv(t *testing.T, a *backfilltemporal.Activities) *testsuite.TestWorkflowEnvironment {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.SetTestTimeout(5 * time.Minute)
	// The workflow's code yields within the SDK's default 1 s, unless a
	// loaded machine does not schedule it for longer ("potential deadlock
	// detected").
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: time.Minute})
	a.Register(env)
	return env
}

// target returns the rows of items, in key order.
func target(t testing.TB, db *sqlx.DB) []string {
	t.Helper()
	var out []string
	if err := db.Select(&out, `SELECT id || ':' || coalesce(name, 'NULL') FROM items ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	return out
}

// plainTarget runs the job plainly (Runner.Run) into a database of its
// own and returns its target's rows.
func plainTarget(t *testing.T) []string {
	t.Helper()
	db := backfilltest.NewPostgres(t)
	createItems(t, db)
	r, err := backfill.New(db, &backfill.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(context.Background(), itemsJob(params{Rows: rows}, nil)); err != nil {
		t.Fatal(err)
	}
	return target(t, db)
}

// checkLoaded checks a completed run: every row once, the counts
// balanced and all inserts, the target equal to a plain run's.
func checkLoaded(t *testing.T, db *sqlx.DB, p backfilltemporal.Progress) {
	t.Helper()
	if p.Status != backfill.RunCompleted || p.ChunksDone != chunks || p.ChunksTotal != chunks {
		t.Fatalf("progress %+v, want completed with %d/%d chunks", p, chunks, chunks)
	}
	c := p.Rows
	if c.Read != rows || c.Inserted != rows || c.Updated != 0 || c.Unchanged != 0 || c.Rejected != 0 || c.Deduplicated != 0 {
		t.Errorf("counts %+v, want %d read, all inserted", c, rows)
	}
	if c.Read != c.Inserted+c.Updated+c.Unchanged+c.Rejected+c.Deduplicated {
		t.Errorf("counts %+v unbalanced", c)
	}
	var m struct {
		Read     int64 `db:"read"`
		Inserted int64 `db:"inserted"`
		Done     int   `db:"done"`
	}
	if err := db.Get(&m, `SELECT coalesce(sum(rows_read), 0) AS read, coalesce(sum(rows_inserted), 0) AS inserted,
		count(*) FILTER (WHERE status = 'done') AS done FROM backfill.chunks WHERE batch_id = $1`, p.BatchID); err != nil {
		t.Fatal(err)
	}
	if m.Read != rows || m.Inserted != rows || m.Done != chunks {
		t.Errorf("manifest: %+v, want %d read and inserted in %d done chunks", m, rows, chunks)
	}
	got, want := target(t, db), plainTarget(t)
	if !slices.Equal(got, want) {
		t.Errorf("target differs from a plain run's: %d rows, want %d", len(got), len(want))
	}
}

// TestWorkflowRunsTheJob runs the job through the workflow with 2 slots on
// PostgreSQL: each chunk committed once, the target equal to a plain
// run's, and the status query shows the slots done and the run completed.
func TestWorkflowRunsTheJob(t *testing.T) {
	db := backfilltest.NewPostgres(t)
	createItems(t, db)
	d := newDone()
	a := &backfilltemporal.Activities{DB: db, Config: config(d), Job: jobFunc(nil)}
	env := newEnv(t, a)
	// The slots heartbeat with the run's progress as details (the SDK
	// sends at most one heartbeat per 80% of the HeartbeatTimeout, so a
	// short run's later ones are not seen).
	var mu sync.Mutex
	beats := 0
	env.SetOnActivityHeartbeatListener(func(_ *activity.Info, details converter.EncodedValues) {
		var p backfilltemporal.Progress
		if details.Get(&p) == nil {
			mu.Lock()
			beats++
			mu.Unlock()
		}
	})
	env.ExecuteWorkflow(backfilltemporal.WorkflowName, input(2))
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res backfilltemporal.Result
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	checkLoaded(t, db, res.Progress)
	for seq := range chunks {
		if n := d.bySeq[seq]; n != 1 {
			t.Errorf("chunk %d committed %d times", seq, n)
		}
	}
	if len(res.Slots) != 2 || res.Slots[0].ExitCode != backfill.ExitDone || res.Slots[1].ExitCode != backfill.ExitDone {
		t.Errorf("slots %+v, want 2 done", res.Slots)
	}
	mu.Lock()
	if beats == 0 {
		t.Error("no heartbeat with a Progress")
	}
	mu.Unlock()
	v, err := env.QueryWorkflow(backfilltemporal.QueryStatus)
	if err != nil {
		t.Fatal(err)
	}
	var st backfilltemporal.WorkflowStatus
	if err := v.Get(&st); err != nil {
		t.Fatal(err)
	}
	if st.Progress == nil || st.Progress.Status != backfill.RunCompleted || len(st.Slots) != 2 ||
		st.Slots[0].State != "done" || st.Slots[1].State != "done" {
		t.Errorf("status query: %+v", st)
	}
}

// register registers a's workflow and activities on env, with work as
// the slots' activity (a.Work when nil).
func register(env *testsuite.TestWorkflowEnvironment, a *backfilltemporal.Activities,
	work func(context.Context, backfilltemporal.SlotInput) (backfilltemporal.SlotResult, error),
	control func(context.Context, backfilltemporal.ControlInput) (backfilltemporal.Progress, error)) {
	if work == nil {
		work = a.Work
	}
	if control == nil {
		control = a.Control
	}
	env.RegisterWorkflowWithOptions(backfilltemporal.BackfillWorkflow, workflow.RegisterOptions{Name: backfilltemporal.WorkflowName})
	env.RegisterActivityWithOptions(work, activity.RegisterOptions{Name: backfilltemporal.ActivityWork})
	env.RegisterActivityWithOptions(control, activity.RegisterOptions{Name: backfilltemporal.ActivityControl})
	env.RegisterActivityWithOptions(a.Status, activity.RegisterOptions{Name: backfilltemporal.ActivityStatus})
}

func newBareEnv() *testsuite.TestWorkflowEnvironment {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.SetTestTimeout(testTimeout)
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: time.Minute}) // as newEnv
	return env
}

// TestRetriedSlotLoadsNoChunkTwice: the first attempt of slot 0 dies
// mid-chunk (its context cancelled while its third chunk is extracted:
// the chunks in flight roll back) and fails with a retryable error;
// Temporal retries it, and the run completes with every chunk committed
// once, every row inserted once, the target equal to a plain run's.
func TestRetriedSlotLoadsNoChunkTwice(t *testing.T) {
	db := backfilltest.NewPostgres(t)
	createItems(t, db)
	d := newDone()
	a := &backfilltemporal.Activities{DB: db, Config: config(d), Job: jobFunc(nil)}
	var attempts sync.Map // slot -> attempts seen
	work := func(ctx context.Context, in backfilltemporal.SlotInput) (backfilltemporal.SlotResult, error) {
		n, _ := attempts.LoadOrStore(in.Slot, new(int32))
		*n.(*int32) = activity.GetInfo(ctx).Attempt
		if in.Slot != 0 || activity.GetInfo(ctx).Attempt != 1 {
			return a.Work(ctx, in)
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var extracted int
		var mu sync.Mutex
		dying := *a
		dying.Job = jobFunc(writeRows(0, func(ctx context.Context, c backfill.Chunk) error {
			mu.Lock()
			extracted++
			n := extracted
			mu.Unlock()
			if n == 3 {
				cancel()
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}))
		_, err := dying.Work(ctx, in)
		return backfilltemporal.SlotResult{}, fmt.Errorf("worker lost mid-chunk (test; the slot's own error: %v)", err)
	}
	env := newBareEnv()
	register(env, a, work, nil)
	env.ExecuteWorkflow(backfilltemporal.WorkflowName, input(2))
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res backfilltemporal.Result
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if n, _ := attempts.Load(0); n == nil || *n.(*int32) != 2 {
		t.Errorf("slot 0 ran %v attempts, want 2", n)
	}
	checkLoaded(t, db, res.Progress)
	for seq := range chunks {
		if n := d.bySeq[seq]; n != 1 {
			t.Errorf("chunk %d committed %d times", seq, n)
		}
	}
}

// TestWorkerKilledMidChunk: the first attempt of slot 0 is a worker
// process killed with SIGKILL while it extracts a chunk it leased: its
// lease stays until its heartbeat in the manifest is stale, then the
// retried attempt or slot 1 takes the chunk over (a new epoch) and loads
// it. Every chunk is committed once, the target equals a plain run's.
func TestWorkerKilledMidChunk(t *testing.T) { testLostWorker(t, syscall.SIGKILL) }

// TestZombieAttemptIsFenced: the first attempt of slot 0 is a worker
// process frozen (SIGSTOP) while it extracts a chunk, writing other
// content than the job's; Temporal gives up on it and retries the slot,
// the chunk is taken over and loaded, and the run completes. Then the
// zombie wakes up (SIGCONT) and finishes its extraction: its
// transaction's fence finds the lease gone and rolls back, so nothing of
// its content reaches the target, and it ends as a worker of a completed
// run (exit code 0).
func TestZombieAttemptIsFenced(t *testing.T) { testLostWorker(t, syscall.SIGSTOP) }

func testLostWorker(t *testing.T, sig syscall.Signal) {
	url := backfilltest.NewPostgresURL(t)
	db, err := sqlx.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	createItems(t, db)
	d := newDone()
	a := &backfilltemporal.Activities{DB: db, Config: config(d), Job: jobFunc(nil)}

	var (
		cmd   *exec.Cmd
		stdin interface{ Close() error }
		out   *bufio.Scanner
		seq   int
	)
	t.Cleanup(func() {
		if cmd != nil && cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	// reached is closed once the worker process is mid-chunk (or failed
	// to get there): the other slot starts only then, so that it cannot
	// take every chunk while the process starts.
	reached := make(chan struct{})
	var reachedOnce sync.Once
	work := func(ctx context.Context, in backfilltemporal.SlotInput) (backfilltemporal.SlotResult, error) {
		if in.Slot != 0 || activity.GetInfo(ctx).Attempt != 1 {
			if in.Slot != 0 {
				select {
				case <-reached:
				case <-ctx.Done():
					return backfilltemporal.SlotResult{}, ctx.Err()
				}
			}
			return a.Work(ctx, in)
		}
		defer reachedOnce.Do(func() { close(reached) })
		cmd = exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+sig.String(), "BACKFILL_TEMPORAL_CHILD_URL="+url)
		cmd.Stderr = os.Stderr
		// fail ends the test's workflow: the process is killed, so that
		// no live worker holds a chunk the other slot would wait for.
		fail := func(msg string) (backfilltemporal.SlotResult, error) {
			if cmd.Process != nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
			return backfilltemporal.SlotResult{}, temporal.NewNonRetryableApplicationError(msg, "test", nil)
		}
		w, err := cmd.StdinPipe()
		if err != nil {
			return fail(err.Error())
		}
		r, err := cmd.StdoutPipe()
		if err != nil {
			return fail(err.Error())
		}
		if err := cmd.Start(); err != nil {
			return fail(err.Error())
		}
		stdin, out = w, bufio.NewScanner(r)
		seq = -1
		for out.Scan() {
			if s, ok := strings.CutPrefix(out.Text(), "MIDCHUNK "); ok {
				if seq, err = strconv.Atoi(s); err != nil {
					seq = -1
				}
				break
			}
		}
		if seq < 0 {
			return fail("the worker process never reached its chunk")
		}
		if err := cmd.Process.Signal(sig); err != nil {
			return fail(err.Error())
		}
		reachedOnce.Do(func() { close(reached) })
		if sig == syscall.SIGKILL {
			_ = cmd.Wait()
		}
		// What Temporal reports once the attempt's heartbeats stop.
		return backfilltemporal.SlotResult{}, fmt.Errorf("worker process %d lost (%s) mid-chunk", cmd.Process.Pid, sig)
	}
	env := newBareEnv()
	register(env, a, work, nil)
	env.ExecuteWorkflow(backfilltemporal.WorkflowName, input(2))
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res backfilltemporal.Result
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if sig == syscall.SIGSTOP {
		// The zombie wakes up and finishes its chunk.
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if err := stdin.Close(); err != nil {
			t.Fatal(err)
		}
		exit := ""
		for out.Scan() {
			if s, ok := strings.CutPrefix(out.Text(), "EXIT "); ok {
				exit = s
			}
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("worker process: %v", err)
		}
		if exit != "0" {
			t.Errorf("the zombie worker ended with %q, want exit code 0 (the run completed by others)", exit)
		}
	}
	checkLoaded(t, db, res.Progress)
	for s := range chunks {
		if n := d.bySeq[s]; n != 1 {
			t.Errorf("chunk %d committed %d times in the workflow's slots", s, n)
		}
	}
	var epoch int64
	if err := db.Get(&epoch, `SELECT lease_epoch FROM backfill.chunks WHERE batch_id = $1 AND seq = $2`, res.Progress.BatchID, seq); err != nil {
		t.Fatal(err)
	}
	if epoch < 2 {
		t.Errorf("chunk %d: lease_epoch %d, want it taken over (>= 2)", seq, epoch)
	}
	var zombies int
	if err := db.Get(&zombies, `SELECT count(*) FROM items WHERE name LIKE 'zombie%'`); err != nil {
		t.Fatal(err)
	}
	if zombies != 0 {
		t.Errorf("%d rows of the fenced worker reached the target", zombies)
	}
}

// child is the worker process of testLostWorker: slot 0 of the job, run
// through the activity (Activities.Work) in Temporal's activity test
// environment, one chunk at a time; its first chunk writes half its rows
// (named zombie-N under SIGSTOP, so that they would show in the target),
// prints "MIDCHUNK <seq>" and waits for its standard input to close. It
// prints "EXIT <code>" at the end.
func child() int {
	db, err := sqlx.Open("postgres", os.Getenv("BACKFILL_TEMPORAL_CHILD_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	zombie := os.Getenv(childEnv) == syscall.SIGSTOP.String()
	var once sync.Once
	extract := func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		first := false
		once.Do(func() { first = true })
		for id := c.Lo; id < c.Hi; id++ {
			name := fmt.Sprintf("item-%d", id)
			if first && zombie {
				name = fmt.Sprintf("zombie-%d", id)
			}
			if first && id == c.Lo+(c.Hi-c.Lo)/2 {
				fmt.Printf("MIDCHUNK %d\n", c.Seq)
				_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
			}
			if err := w.Write(ctx, id, name); err != nil {
				return err
			}
		}
		return nil
	}
	cfg := config(nil)
	cfg.SerialExtract = true
	a := &backfilltemporal.Activities{DB: db, Config: cfg, Job: jobFunc(extract)}
	var s testsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	env.SetTestTimeout(5 * time.Minute)
	env.RegisterActivityWithOptions(a.Work, activity.RegisterOptions{Name: backfilltemporal.ActivityWork})
	v, err := env.ExecuteActivity(backfilltemporal.ActivityWork, backfilltemporal.SlotInput{Input: input(2), Slot: 0})
	var res backfilltemporal.SlotResult
	if err == nil {
		err = v.Get(&res)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker process:", err)
		fmt.Println("EXIT error")
		return 1
	}
	fmt.Printf("EXIT %d\n", res.ExitCode)
	return 0
}

// signals records the control activities' calls and the order of events.
type signals struct {
	env *testsuite.TestWorkflowEnvironment
	d   *done
	a   *backfilltemporal.Activities

	mu      sync.Mutex
	results map[string]backfilltemporal.Progress
	applied map[string]chan struct{}
}

func (s *signals) control(ctx context.Context, in backfilltemporal.ControlInput) (backfilltemporal.Progress, error) {
	s.d.log("control:" + in.Action)
	p, err := s.a.Control(ctx, in)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		s.results[in.Action] = p
		if c, ok := s.applied[in.Action]; ok {
			close(c)
			delete(s.applied, in.Action)
		}
	}
	return p, err
}

// TestPauseResumeBySignals pauses the run by a signal while a chunk is
// extracted (that chunk finishes, no other starts), resumes it by another
// once that chunk committed; the run completes, the manifest's audit
// events record both with the signals' actor and reason, and the status
// query lists them.
func TestPauseResumeBySignals(t *testing.T) {
	db := backfilltest.NewPostgres(t)
	createItems(t, db)
	d := newDone()
	cfg := config(d)
	cfg.SerialExtract = true
	a := &backfilltemporal.Activities{DB: db, Config: cfg}
	env := newBareEnv()
	s := &signals{env: env, d: d, a: a, results: map[string]backfilltemporal.Progress{},
		applied: map[string]chan struct{}{backfilltemporal.SignalPause: make(chan struct{})}}
	paused := s.applied[backfilltemporal.SignalPause]
	var once sync.Once
	a.Job = jobFunc(writeRows(0, func(ctx context.Context, c backfill.Chunk) error {
		if c.Seq != 3 {
			return nil
		}
		once.Do(func() {
			env.SignalWorkflow(backfilltemporal.SignalPause, backfilltemporal.ControlRequest{Actor: "alice", Reason: "maintenance window"})
			select {
			case <-paused:
			case <-ctx.Done():
			}
		})
		return ctx.Err()
	}))
	d.on = func(r backfill.ChunkResult) {
		if r.Chunk.Seq == 3 {
			env.SignalWorkflow(backfilltemporal.SignalResume, backfilltemporal.ControlRequest{Actor: "bob", Reason: "window over"})
		}
	}
	register(env, a, nil, s.control)
	env.ExecuteWorkflow(backfilltemporal.WorkflowName, input(1))
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res backfilltemporal.Result
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	checkLoaded(t, db, res.Progress)
	if p := s.results[backfilltemporal.SignalPause]; p.Status != backfill.RunPaused {
		t.Errorf("after the pause signal the run is %q, want paused", p.Status)
	}
	if i, j := d.index("control:"+backfilltemporal.SignalResume), d.index("done:4"); i < 0 || j < i {
		t.Errorf("chunk 4 committed before the resume (events %v)", d.events)
	}
	var events []string
	if err := db.Select(&events, `SELECT kind || ' ' || actor || ' ' || coalesce(detail->>'why', '') FROM backfill.events
		WHERE batch_id = $1 AND kind IN ('run_paused', 'run_resumed_by_operator') ORDER BY id`, res.Progress.BatchID); err != nil {
		t.Fatal(err)
	}
	want := []string{"run_paused alice maintenance window", "run_resumed_by_operator bob window over"}
	if !slices.Equal(events, want) {
		t.Errorf("audit events %q, want %q", events, want)
	}
	v, err := env.QueryWorkflow(backfilltemporal.QueryStatus)
	if err != nil {
		t.Fatal(err)
	}
	var st backfilltemporal.WorkflowStatus
	if err := v.Get(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.Controls) != 2 || st.Controls[0].Action != "pause" || st.Controls[0].Actor != "alice" || st.Controls[0].Error != "" ||
		st.Controls[1].Action != "resume" || st.Controls[1].Error != "" {
		t.Errorf("status query's controls: %+v", st.Controls)
	}
}

// TestCancelBySignal cancels the run by a signal while a chunk is
// extracted: the chunks in flight roll back, both slots end, the workflow
// fails with an error of type BackfillCancelled, the run is cancelled in
// the manifest, and the target holds exactly the done chunks' rows.
func TestCancelBySignal(t *testing.T) {
	db := backfilltest.NewPostgres(t)
	createItems(t, db)
	d := newDone()
	a := &backfilltemporal.Activities{DB: db, Config: config(d)}
	env := newBareEnv()
	var once sync.Once
	a.Job = jobFunc(writeRows(0, func(ctx context.Context, c backfill.Chunk) error {
		if c.Seq != 3 {
			return nil
		}
		once.Do(func() {
			env.SignalWorkflow(backfilltemporal.SignalCancel, backfilltemporal.ControlRequest{Actor: "carol", Reason: "wrong scope"})
			select {
			case <-ctx.Done():
			case <-time.After(30 * time.Second):
				// Not told by its context: the chunk's fence refuses it.
			}
		})
		return ctx.Err()
	}))
	register(env, a, nil, nil)
	env.ExecuteWorkflow(backfilltemporal.WorkflowName, input(2))
	err := env.GetWorkflowError()
	var ae *temporal.ApplicationError
	if !errors.As(err, &ae) || ae.Type() != backfilltemporal.ErrTypeCancelled {
		t.Fatalf("workflow error %v, want an application error of type %s", err, backfilltemporal.ErrTypeCancelled)
	}
	var run struct {
		Batch  int64  `db:"batch_id"`
		Status string `db:"status"`
	}
	if err := db.Get(&run, `SELECT batch_id, status FROM backfill.runs WHERE job_name = $1`, jobName); err != nil {
		t.Fatal(err)
	}
	if run.Status != "cancelled" {
		t.Errorf("run %s, want cancelled", run.Status)
	}
	var c struct {
		Done     int   `db:"done"`
		Read     int64 `db:"read"`
		Inserted int64 `db:"inserted"`
	}
	if err := db.Get(&c, `SELECT count(*) FILTER (WHERE status = 'done') AS done, coalesce(sum(rows_read), 0) AS read,
		coalesce(sum(rows_inserted), 0) AS inserted FROM backfill.chunks WHERE batch_id = $1`, run.Batch); err != nil {
		t.Fatal(err)
	}
	if c.Done >= chunks || c.Read != int64(c.Done*perChunk) || c.Inserted != c.Read {
		t.Errorf("chunks %+v, want fewer than %d done, each %d rows inserted", c, chunks, perChunk)
	}
	if n := len(target(t, db)); n != c.Done*perChunk {
		t.Errorf("target holds %d rows, want %d (the done chunks')", n, c.Done*perChunk)
	}
	for s, n := range d.bySeq {
		if n != 1 {
			t.Errorf("chunk %d committed %d times", s, n)
		}
	}
	v, err := env.QueryWorkflow(backfilltemporal.QueryStatus)
	if err != nil {
		t.Fatal(err)
	}
	var st backfilltemporal.WorkflowStatus
	if err := v.Get(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.Controls) != 1 || st.Controls[0].Action != "cancel" || st.Controls[0].Error != "" ||
		st.Slots[0].State != "failed" || st.Slots[1].State != "failed" {
		t.Errorf("status query: %+v", st)
	}
}

// TestStatusOfAJobNeverRun: the status activity of a job that never ran
// fails for good (type BackfillUsage), not retried.
func TestStatusOfAJobNeverRun(t *testing.T) {
	db := backfilltest.NewPostgres(t)
	a := &backfilltemporal.Activities{DB: db, Job: jobFunc(nil)}
	var s testsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	a.RegisterActivities(env)
	_, err := env.ExecuteActivity(backfilltemporal.ActivityStatus, "nothing")
	var ae *temporal.ApplicationError
	if !errors.As(err, &ae) || ae.Type() != backfilltemporal.ErrTypeUsage || !ae.NonRetryable() {
		t.Fatalf("error %v, want a non-retryable application error of type %s", err, backfilltemporal.ErrTypeUsage)
	}
}

// TestWorkflowCancelledThenResumed cancels the workflow (not the run)
// while a chunk is extracted: the slots' chunks in flight roll back, the
// workflow ends cancelled and the run stays running in the manifest; a
// second workflow resumes it and completes it, every chunk committed once
// over both, the target equal to a plain run's.
func TestWorkflowCancelledThenResumed(t *testing.T) {
	db := backfilltest.NewPostgres(t)
	createItems(t, db)
	d := newDone()
	a := &backfilltemporal.Activities{DB: db, Config: config(d)}
	env := newBareEnv()
	var once sync.Once
	a.Job = jobFunc(writeRows(0, func(ctx context.Context, c backfill.Chunk) error {
		if c.Seq != 3 {
			return nil
		}
		once.Do(func() {
			env.CancelWorkflow()
			// The slot hears of it at its next heartbeat.
			<-ctx.Done()
		})
		return ctx.Err()
	}))
	register(env, a, nil, nil)
	in := input(2)
	// Heartbeats every 3.3 s, sent at most every 8 s: the cancellation
	// reaches the slots within about 8 s.
	in.HeartbeatTimeout = 10 * time.Second
	env.ExecuteWorkflow(backfilltemporal.WorkflowName, in)
	if err := env.GetWorkflowError(); !temporal.IsCanceledError(err) {
		t.Fatalf("workflow error %v, want cancelled", err)
	}
	var status string
	if err := db.Get(&status, `SELECT status FROM backfill.runs WHERE job_name = $1`, jobName); err != nil {
		t.Fatal(err)
	}
	if status != "running" {
		t.Fatalf("run %s after the workflow's cancellation, want running", status)
	}

	a.Job = jobFunc(nil)
	env2 := newBareEnv()
	register(env2, a, nil, nil)
	env2.ExecuteWorkflow(backfilltemporal.WorkflowName, input(2))
	if err := env2.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res backfilltemporal.Result
	if err := env2.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	checkLoaded(t, db, res.Progress)
	for seq := range chunks {
		if n := d.bySeq[seq]; n != 1 {
			t.Errorf("chunk %d committed %d times", seq, n)
		}
	}
}
