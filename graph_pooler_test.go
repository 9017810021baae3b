package backfill_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// A graph through PgBouncer in transaction mode: the child process's
// side. Its log goes to stderr, which the test reads.
func init() {
	childProcess("BACKFILL_GRAPH_POOLED_CHILD", func(db *sqlx.DB) error {
		logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
		r, err := backfill.New(db, pooledGraphConfig(logger))
		if err != nil {
			return err
		}
		_, err = r.RunGraph(context.Background(), pooledGraph(db, func(v string) { fmt.Fprintln(os.Stderr, pooledViolation+v) }))
		return err
	})
}

// pooledViolation starts a line of the child's stderr that reports a
// child chunk extracted before its parents' rows were committed.
const pooledViolation = "ORDER VIOLATION: "

func pooledGraphConfig(logger *slog.Logger) *backfill.Config {
	return pooledFencing(backfill.Config{Concurrency: 2, ThrottleInterval: 50 * time.Millisecond, Logger: logger})
}

// pooledGraph is three modules: gpool_a, gpool_b after it (chunks twice
// as wide, the highest priority), gpool_c independent; each extraction a little slow so that a
// pause and a kill find chunks in flight. gpool_b's extraction checks, on
// db (the pooler: a statement without parameters, as an operator's), that
// gpool_a's rows of its interval are committed, and reports a miss to
// violation.
func pooledGraph(db *sqlx.DB, violation func(string)) backfill.Graph {
	slow := func(backfill.Chunk) error {
		time.Sleep(30 * time.Millisecond)
		return nil
	}
	afterA := func(c backfill.Chunk) error {
		var n int64
		// Integers of the chunk, not bind parameters: one round trip
		// outside a transaction is safe behind a transaction pooler.
		if err := db.Get(&n, fmt.Sprintf(`SELECT count(*) FROM gpool_a WHERE id >= %d AND id < %d`, c.Lo, c.Hi)); err != nil {
			return err
		}
		if n != c.Hi-c.Lo {
			violation(fmt.Sprintf("gpool_b chunk %s ran with %d of %d rows of gpool_a", c.ID, n, c.Hi-c.Lo))
		}
		return slow(c)
	}
	return backfill.Graph{Name: "gpool", Modules: []backfill.Module{
		{Name: "a", Jobs: []backfill.Job{graphJobOf("gpool_a", 5, slow)}},
		// The highest priority: b's chunks come first among the ready
		// ones, so only the dependency keeps them after a's.
		{Name: "b", Jobs: []backfill.Job{graphJobOf("gpool_b", 10, afterA)}, DependsOn: []string{"a"}, Priority: 10},
		{Name: "c", Jobs: []backfill.Job{graphJobOf("gpool_c", 5, slow)}},
	}}
}

// childLines collects a child's stderr and closes seen at the first
// line containing match.
type childLines struct {
	mu    sync.Mutex
	lines []string
	match string
	seen  chan struct{}
	once  sync.Once
}

func (b *childLines) add(line string) {
	b.mu.Lock()
	b.lines = append(b.lines, line)
	b.mu.Unlock()
	if strings.Contains(line, b.match) {
		b.once.Do(func() { close(b.seen) })
	}
}

func (b *childLines) text() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}

// warnRecorder is a slog.Handler keeping the messages of warnings and
// errors.
type warnRecorder struct {
	mu   *sync.Mutex
	msgs *[]string
}

func (h warnRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h warnRecorder) Handle(_ context.Context, rec slog.Record) error {
	s := rec.Message
	rec.Attrs(func(a slog.Attr) bool {
		s += " " + a.String()
		return true
	})
	h.mu.Lock()
	*h.msgs = append(*h.msgs, s)
	h.mu.Unlock()
	return nil
}
func (h warnRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h warnRecorder) WithGroup(string) slog.Handler      { return h }

// TestThroughPoolerGraphPauseKill runs a graph of three modules (a, b
// after a, c independent) through PgBouncer in transaction mode at
// Concurrency 2 in a child process. An operator pauses the graph's run
// from SQL through the pooler mid-run: the child finishes its chunks in
// flight, holds no lock and claims nothing until the resume (also from
// SQL through the pooler); resumed, it goes on and is killed with SIGKILL
// mid-run. A second RunGraph through the pooler completes every module:
// every row loaded once, every chunk's accounting balanced, no chunk of
// b extracted or started before the overlapping chunks of a were
// committed, no chunk tried again for an error, and no advisory lock left
// on the pooler's server connections.
func TestThroughPoolerGraphPauseKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()
	pooled := pgtest.NewPoolerURL(t)
	// The test's own checks go to the server directly; the operator's
	// statements and the runs go through the pooler.
	db := sqlx.MustOpen("postgres", directURL(t, pooled))
	t.Cleanup(func() { _ = db.Close() })
	pdb := sqlx.MustOpen("postgres", pooled)
	t.Cleanup(func() { _ = pdb.Close() })
	for _, tb := range []string{"gpool_a", "gpool_b", "gpool_c"} {
		db.MustExec(fmt.Sprintf(`CREATE TABLE %q (id bigint PRIMARY KEY, v text, backfill_inserted_by bigint, backfill_updated_by bigint)`, tb))
	}
	const total = 8 + 4 + 8
	count := func(q string) int {
		t.Helper()
		var n int
		require.NoError(t, db.Get(&n, q))
		return n
	}
	doneQ := `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`
	// done is doneQ's count, -1 before the child created the manifest.
	done := func() int {
		var n int
		if err := db.Get(&n, doneQ); err != nil {
			return -1
		}
		return n
	}

	// The child: its stderr read line by line.
	log := &childLines{match: "this call waits for the resume", seen: make(chan struct{})}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BACKFILL_GRAPH_POOLED_CHILD="+pooled)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			log.add(sc.Text())
		}
		close(exited)
	}()
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
		}
	})
	// waitFor polls ok until it holds; the child must not exit
	// meanwhile unless it was killed.
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); !ok(); time.Sleep(2 * time.Millisecond) {
			select {
			case <-exited:
				if !killed {
					t.Fatalf("the child exited while the test waited for %s:\n%s", what, log.text())
				}
			default:
			}
			require.True(t, time.Now().Before(deadline), "waiting for %s; child's log:\n%s", what, log.text())
		}
	}

	// Mid-run, an operator pauses the graph's run through the pooler
	// (no bind parameters: as from psql).
	waitFor("4 chunks done", func() bool { return done() >= 4 })
	_, err = pdb.ExecContext(ctx, `SELECT backfill.pause('gpool', 'ops', 'night check')`)
	require.NoError(t, err)
	select {
	case <-log.seen:
	case <-exited:
		t.Fatalf("the child exited on the pause instead of waiting for the resume:\n%s", log.text())
	case <-time.After(60 * time.Second):
		t.Fatalf("the child did not wait for the resume:\n%s", log.text())
	}
	// Waiting, it holds nothing: no chunk in flight, no advisory lock
	// left on a server connection, no transaction open.
	atPause := count(doneQ)
	require.Less(t, atPause, total, "the pause left work to do")
	require.Zero(t, count(`SELECT count(*) FROM backfill.chunks_in_flight`), "chunks in flight while the child waits for the resume")
	require.Zero(t, count(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`), "advisory locks held while paused")
	r, err := backfill.New(pdb, pooledGraphConfig(nil))
	require.NoError(t, err)
	gst, err := r.GraphStatus(ctx, "gpool")
	require.NoError(t, err)
	require.Equal(t, backfill.RunPaused, gst.Status, "the graph's status through the pooler")
	require.Equal(t, atPause, count(doneQ), "a chunk loaded while the graph waited for the resume")
	_, err = pdb.ExecContext(ctx, `SELECT backfill.resume('gpool', 'ops', 'checked')`)
	require.NoError(t, err)

	// Resumed, it goes on; killed mid-run.
	waitFor("4 more chunks done", func() bool { return count(doneQ) >= atPause+4 })
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed = true
	<-exited // its stderr read to the end
	_ = cmd.Wait()
	// The pooler's server connections outlive the child: wait until none
	// of them works on the database (a COMMIT sent before the kill), so
	// that what the test reads is what the crash left.
	waitFor("the child's transactions to end", func() bool {
		return count(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'`) == 0
	})
	atKill := count(doneQ)
	require.Less(t, atKill, total, "the kill left work to do")
	childLog := log.text()
	var childViolations []string
	for _, l := range strings.Split(childLog, "\n") {
		if strings.HasPrefix(l, pooledViolation) {
			childViolations = append(childViolations, l)
		}
	}
	require.Empty(t, childViolations, "a chunk of b extracted before a's rows of its interval were committed")
	require.NotContains(t, childLog, "graph chunk failed", "a chunk's try failed in the child")
	require.NotContains(t, childLog, "graph job stopped", "a job stopped in the child")

	// The rerun, through the pooler.
	var (
		mu         sync.Mutex
		warnings   []string
		violations []string
	)
	r, err = backfill.New(pdb, pooledGraphConfig(slog.New(warnRecorder{mu: &mu, msgs: &warnings})))
	require.NoError(t, err)
	rep, err := r.RunGraph(ctx, pooledGraph(pdb, func(v string) {
		mu.Lock()
		violations = append(violations, v)
		mu.Unlock()
	}))
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, map[string]string{"a": "completed", "b": "completed", "c": "completed"}, moduleStates(rep.Modules))
	require.Equal(t, total-atKill, rep.Chunks, "the rerun loaded only the chunks not done")
	mu.Lock()
	require.Empty(t, violations)
	for _, w := range warnings {
		require.NotContains(t, w, "graph chunk failed", "a chunk's try failed in the rerun")
		require.NotContains(t, w, "graph job stopped", "a job stopped in the rerun")
	}
	mu.Unlock()

	for _, tb := range []string{"gpool_a", "gpool_b", "gpool_c"} {
		var o struct {
			Rows     int `db:"rows"`
			Inserted int `db:"inserted"`
			Read     int `db:"read"`
			Runs     int `db:"runs"`
		}
		require.NoError(t, db.Get(&o, fmt.Sprintf(`SELECT (SELECT count(*) FROM %q) AS rows,
			(SELECT sum(c.rows_inserted) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.job_name = $1 AND c.status = 'done') AS inserted,
			(SELECT sum(c.rows_read) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.job_name = $1 AND c.status = 'done') AS read,
			(SELECT count(*) FROM backfill.runs WHERE job_name = $1) AS runs`, tb), tb))
		require.Equal(t, 40, o.Rows, tb)
		require.Equal(t, 40, o.Inserted, "%s: every row inserted once", tb)
		require.Equal(t, 40, o.Read, tb)
		require.Equal(t, 1, o.Runs, "%s: the rerun resumed the job's run", tb)
	}
	require.Zero(t, count(`SELECT count(*) FROM backfill.chunks WHERE status <> 'done'
		OR rows_read <> rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated`), "a chunk not done or not balanced")
	require.Equal(t, total, count(`SELECT count(*) FROM backfill.chunks`))
	requireGraphOrder(t, db, "gpool_b", "gpool_a")
	// The operator's pause and resume, through the pooler, are the
	// graph's run's.
	var kinds []string
	require.NoError(t, db.Select(&kinds, `SELECT e.kind FROM backfill.events e JOIN backfill.runs r USING (batch_id)
		WHERE r.job_name = 'gpool' AND e.kind IN ('run_paused', 'run_resumed_by_operator') ORDER BY e.id`))
	require.Equal(t, []string{"run_paused", "run_resumed_by_operator"}, kinds)
	require.Equal(t, 1, count(`SELECT count(*) FROM backfill.runs WHERE job_name = 'gpool'`), "the rerun continued the graph's run")
	require.Zero(t, count(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`), "advisory locks left on the pooler's server connections")
}
