package backfill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	neturl "net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgproxy"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/testwait"
)

// cutProxy forwards TCP connections to a PostgreSQL server and cuts one
// client connection once: at the first statement (simple Query or Parse)
// whose text, whitespace folded, contains trigger. With atCommit, it
// forwards the connection's next COMMIT and closes the client's side
// before the server's answer reaches it (the transaction commits, the
// client cannot know); otherwise it closes the connection before the
// statement reaches the server (the transaction rolls back).
type cutProxy struct {
	*pgproxy.Proxy
	trigger  string
	atCommit bool

	mu    sync.Mutex
	armed bool          // the trigger was seen (on some connection)
	fired chan struct{} // closed when the connection was cut
}

func newCutProxy(t *testing.T, to, trigger string, atCommit bool) *cutProxy {
	p := &cutProxy{trigger: trigger, atCommit: atCommit, fired: make(chan struct{})}
	var err error
	p.Proxy, err = pgproxy.Listen("127.0.0.1:0", to, p.hook)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// url returns u (a URL of the proxied server) through the proxy.
func (p *cutProxy) url(t *testing.T, u string) string {
	pu, err := neturl.Parse(u)
	require.NoError(t, err)
	pu.Host = p.Addr().String()
	return pu.String()
}

// hasFired reports whether the connection was cut.
func (p *cutProxy) hasFired() bool {
	select {
	case <-p.fired:
		return true
	default:
		return false
	}
}

// decide returns what to do with statement q of a connection (mine:
// whether this connection saw the trigger), and whether this connection
// now holds the trigger.
func (p *cutProxy) decide(q string, mine bool) (act pgproxy.Action, nowMine bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hasFired() {
		return pgproxy.Forward, false
	}
	if !p.armed && strings.Contains(q, p.trigger) {
		if !p.atCommit {
			close(p.fired)
			return pgproxy.CutBefore, false
		}
		p.armed = true
		return pgproxy.Forward, true
	}
	if mine && q == "COMMIT" {
		// The server commits; its answer finds the client gone.
		close(p.fired)
		return pgproxy.CutAfter, false
	}
	return pgproxy.Forward, mine
}

// hook cuts one connection: its statements (simple Query or Parse) go
// through decide.
func (p *cutProxy) hook() pgproxy.Hook {
	mine := false
	return func(m pgproxy.Message) (act pgproxy.Action) {
		if m.Type != 'Q' && m.Type != 'P' {
			return pgproxy.Forward
		}
		act, mine = p.decide(m.Statement, mine)
		return act
	}
}

// TestManifestTransactionsSurviveCutConnections cuts the runner's
// connection once, at one manifest statement of a run (before it reaches
// the server, or at its transaction's COMMIT, which commits unknown to
// the client), and checks that the run completes in one call: the
// manifest transaction ran again, and did not apply its effect twice (one
// run created, not resumed; one end of the run recorded).
func TestManifestTransactionsSurviveCutConnections(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, trigger string
		atCommit      bool
	}{
		{"version read at start", `AS has_table`, false},
		{"start run commit", `INSERT INTO "backfill".runs`, true},
		{"lease", `"backfill".lease_chunk(`, false},
		{"lease commit", `"backfill".lease_chunk(`, true},
		{"register worker commit", `INSERT INTO "backfill".workers`, true},
		{"finish run commit", `SET status = $2, last_error = $3`, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			u := pgtest.NewURL(t)
			admin := sqlx.MustOpen("postgres", u)
			t.Cleanup(func() { _ = admin.Close() })
			_, err := admin.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
			require.NoError(t, err)
			pu, err := neturl.Parse(u)
			require.NoError(t, err)
			p := newCutProxy(t, pu.Host, tc.trigger, tc.atCommit)
			db := sqlx.MustOpen("postgres", p.url(t, u))
			t.Cleanup(func() { _ = db.Close() })
			logs := &syncBuffer{}
			r, err := New(db, &Config{WorkerID: "cut", HeartbeatInterval: time.Second, StaleAfter: 10 * time.Second, RetryBackoff: 10 * time.Millisecond,
				Logger: slog.New(slog.NewJSONHandler(logs, nil))})
			require.NoError(t, err)

			rep, err := r.Run(ctx, liveJob(nil))
			require.True(t, p.hasFired(), "the proxy never saw %q", tc.trigger)
			require.NoError(t, err, "logs:\n%s", logs)
			require.NotZero(t, rep.BatchID)
			require.Equal(t, RunCompleted, rep.Status)
			require.False(t, rep.Resumed)
			require.Contains(t, logs.String(), "transient fault")
			var st struct {
				Runs      int `db:"runs"`
				Completed int `db:"completed"`
				Resumed   int `db:"resumed"`
				Ends      int `db:"ends"`
				Rows      int `db:"rows"`
				Workers   int `db:"workers"`
			}
			require.NoError(t, admin.Get(&st, `SELECT (SELECT count(*) FROM backfill.runs WHERE job_name = 'live') AS runs,
				(SELECT count(*) FROM backfill.runs WHERE job_name = 'live' AND status = 'completed') AS completed,
				(SELECT count(*) FROM backfill.events WHERE kind = 'run_resumed') AS resumed,
				(SELECT count(*) FROM backfill.events WHERE kind = 'run_completed') AS ends,
				(SELECT count(*) FROM live) AS rows,
				(SELECT count(*) FROM backfill.workers WHERE worker_id = 'cut') AS workers`))
			require.Equal(t, 1, st.Runs, "runs of the job")
			require.Equal(t, 1, st.Completed, "completed runs")
			require.Zero(t, st.Resumed, "run_resumed events")
			require.Equal(t, 1, st.Ends, "run_completed events")
			require.Equal(t, 10*liveChunks, st.Rows)
			require.Equal(t, 1, st.Workers, "the worker's registration")
			require.NotContains(t, logs.String(), "worker not registered")
		})
	}
}

// TestManifestWaitsOutTooManyConnections: the runner's role reaches its
// CONNECTION LIMIT (SQLSTATE 53300, as max_connections used up by other
// clients) because another client holds every slot. The run logs the
// refusal, waits, and completes once the slots are free.
func TestManifestWaitsOutTooManyConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLimitedRole(t)
	const slots = 4
	r.exec(t, fmt.Sprintf(`ALTER ROLE {role} CONNECTION LIMIT %d`, slots))
	db := sqlx.MustOpen("postgres", r.url)
	db.SetMaxOpenConns(slots)
	t.Cleanup(func() { _ = db.Close() })
	// Another client (the same role) holds every slot.
	hog := sqlx.MustOpen("postgres", r.url)
	t.Cleanup(func() { _ = hog.Close() })
	var held []*sqlx.Conn
	for range slots {
		c, err := hog.Connx(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	logs := &syncBuffer{}
	runner, err := New(db, &Config{WorkerID: "limited", HeartbeatInterval: time.Second, StaleAfter: 10 * time.Second, RetryBackoff: 10 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	require.NoError(t, err)
	done := goRun(ctx, runner, liveJob(nil))
	testwait.Until(t, "the run to log its refused connection", func() bool {
		select {
		case res := <-done:
			t.Fatalf("the run returned while every slot was held: %v", res.err)
		default:
		}
		return strings.Contains(logs.String(), `"sqlstate":"53300"`)
	})
	for _, c := range held {
		require.NoError(t, c.Close())
	}
	require.NoError(t, hog.Close())
	res := testwait.Recv(t, "the run", done)
	require.NoError(t, res.err, "logs:\n%s", logs)
	require.Equal(t, RunCompleted, res.rep.Status)
}

// limitedRole is a login role (not a superuser: CONNECTION LIMIT binds
// it) with what a run of liveJob needs, on the test's own database.
type limitedRole struct {
	name, url string
	admin     *sqlx.DB
}

func newLimitedRole(t *testing.T) *limitedRole {
	t.Helper()
	adminURL := pgtest.NewURL(t)
	admin := sqlx.MustOpen("postgres", adminURL)
	name := fmt.Sprintf("lim_%d", time.Now().UnixNano())
	r := &limitedRole{name: name, admin: admin}
	t.Cleanup(func() {
		_, _ = admin.Exec(`DROP OWNED BY ` + name)
		_, _ = admin.Exec(`DROP ROLE ` + name)
		_ = admin.Close()
	})
	r.exec(t, `CREATE ROLE {role} LOGIN PASSWORD 'pw'`)
	require.NoError(t, NewPGManifest("").Init(context.Background(), admin))
	r.exec(t, `CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	r.exec(t, `GRANT USAGE ON SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT USAGE ON ALL SEQUENCES IN SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT EXECUTE ON FUNCTION backfill.record_event(bigint, text, text, text, jsonb), backfill.library_control(bigint, text, text) TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE ON live TO {role}`)
	u, err := neturl.Parse(adminURL)
	require.NoError(t, err)
	u.User = neturl.UserPassword(name, "pw")
	r.url = u.String()
	return r
}

func (r *limitedRole) exec(t *testing.T, q string) {
	t.Helper()
	_, err := r.admin.Exec(strings.ReplaceAll(q, "{role}", r.name))
	require.NoError(t, err, q)
}

// lockManifestTable holds an ACCESS EXCLUSIVE lock on backfill.<table>
// in a transaction of its own (application_name locker) until the
// returned function is called.
func lockManifestTable(t *testing.T, u, table string) (release func()) {
	t.Helper()
	db := sqlx.MustOpen("postgres", u)
	tx, err := db.Beginx()
	require.NoError(t, err)
	_, err = tx.Exec(`SET LOCAL application_name = 'locker'`)
	require.NoError(t, err)
	_, err = tx.Exec(`LOCK TABLE backfill.` + table + ` IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = tx.Rollback()
			_ = db.Close()
		})
	}
	t.Cleanup(release)
	return release
}

// TestManifestLockWaitsBoundedAndNamed: an operator's session holds
// LOCK TABLE backfill.chunks (or runs) IN ACCESS EXCLUSIVE MODE while a
// run starts. Held past the retry table (LockRetries), the run fails
// with a retryable error naming the manifest table and the holder; held
// a shorter time, the run logs the wait with the holder and completes
// once the lock is released.
func TestManifestLockWaitsBoundedAndNamed(t *testing.T) {
	t.Parallel()
	retries := []LockRetry{{Timeout: 50 * time.Millisecond, Sleep: 10 * time.Millisecond}, {Timeout: 50 * time.Millisecond, Sleep: 10 * time.Millisecond},
		{Timeout: 50 * time.Millisecond}}
	// locked returns a runner with retries, logging to logs, on a new
	// database whose manifest table backfill.<table> is locked until
	// release is called.
	locked := func(t *testing.T, table string, retries []LockRetry) (r *Runner, logs *syncBuffer, release func()) {
		u := pgtest.NewURL(t)
		db := sqlx.MustOpen("postgres", u)
		t.Cleanup(func() { _ = db.Close() })
		_, err := db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
		require.NoError(t, err)
		require.NoError(t, NewPGManifest("").Init(context.Background(), db))
		release = lockManifestTable(t, u, table)
		logs = &syncBuffer{}
		r, err = New(db, &Config{WorkerID: "locked", HeartbeatInterval: time.Second, LockTimeout: 50 * time.Millisecond, LockRetries: retries, StaleAfter: 10 * time.Second,
			Logger: slog.New(slog.NewJSONHandler(logs, nil))})
		require.NoError(t, err)
		return r, logs, release
	}
	for _, table := range []string{"chunks", "runs"} {
		t.Run(table+" held past the retries", func(t *testing.T) {
			t.Parallel()
			r, logs, _ := locked(t, table, retries)
			_, err := r.Run(testwait.Context(t, "the run"), liveJob(nil))
			require.Error(t, err)
			require.True(t, IsRetryable(err), "retryable: %v", err)
			require.Contains(t, err.Error(), "AccessExclusiveLock on backfill."+table)
			require.Contains(t, err.Error(), `application_name "locker"`)
			require.Contains(t, logs.String(), "AccessExclusiveLock on backfill."+table)
		})
		t.Run(table+" released", func(t *testing.T) {
			t.Parallel()
			// Enough tries that the release, once the wait is logged,
			// comes before they are used up.
			long := make([]LockRetry, 200)
			for i := range long {
				long[i] = LockRetry{Timeout: 50 * time.Millisecond, Sleep: 50 * time.Millisecond}
			}
			r, logs, release := locked(t, table, long)
			done := goRun(context.Background(), r, liveJob(nil))
			testwait.Until(t, "the run to log its wait for the lock", func() bool {
				return strings.Contains(logs.String(), "AccessExclusiveLock on backfill."+table)
			})
			release()
			res := testwait.Recv(t, "the run", done)
			require.NoError(t, res.err)
			require.Equal(t, RunCompleted, res.rep.Status)
		})
	}
}

// TestManifestReadWaitBounded: a read of the manifest (ChunkSummary,
// which Status and the end of a run use) behind an operator's LOCK TABLE
// backfill.chunks logs its wait, naming the table and the holder, and
// fails with a retryable error once LockRetries is used up, rather than
// waiting as long as the lock is held.
func TestManifestReadWaitBounded(t *testing.T) {
	t.Parallel()
	u := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { _ = db.Close() })
	_, err := db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	logs := &syncBuffer{}
	r, err := New(db, &Config{WorkerID: "reader", HeartbeatInterval: time.Second, LockTimeout: 50 * time.Millisecond, StaleAfter: 10 * time.Second,
		LockRetries: []LockRetry{{Timeout: 50 * time.Millisecond, Sleep: 10 * time.Millisecond}, {Timeout: 50 * time.Millisecond}},
		Logger:      slog.New(slog.NewJSONHandler(logs, nil))})
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), liveJob(nil))
	require.NoError(t, err)
	lockManifestTable(t, u, "chunks")
	done := make(chan error, 1)
	go func() {
		_, err := r.StatusOf(testwait.Context(t, "status"), rep.BatchID)
		done <- err
	}()
	err = testwait.Recv(t, "the status read", done)
	require.Error(t, err)
	require.True(t, IsRetryable(err), "retryable: %v", err)
	require.Contains(t, err.Error(), "AccessExclusiveLock on backfill.chunks")
	require.Contains(t, logs.String(), "AccessExclusiveLock on backfill.chunks")
	require.Contains(t, logs.String(), fmt.Sprintf(`"batch_id":%d`, rep.BatchID))
}

// TestManifestSchemaDroppedNamed: the manifest's schema dropped while a
// run works gives errors that say the schema is missing and to run
// backfill migrate, name the run's batch (not batch 0), and a report
// that names it too.
func TestManifestSchemaDroppedNamed(t *testing.T) {
	t.Parallel()
	db := liveDB(t)
	held := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	job := liveJob(func(c Chunk) {
		once.Do(func() {
			close(held)
			<-release
		})
	})
	r := liveRunner(t, db, "dropped", nil)
	done := goRun(context.Background(), r, job)
	testwait.Recv(t, "a chunk in flight", held)
	_, err := db.Exec(`DROP SCHEMA backfill CASCADE`)
	require.NoError(t, err)
	close(release)
	res := testwait.Recv(t, "the run", done)
	require.Error(t, res.err)
	msg := res.err.Error()
	require.Contains(t, msg, `manifest schema "backfill" is missing`)
	require.Contains(t, msg, "backfill migrate")
	require.NotContains(t, msg, "batch 0")
	require.True(t, errors.Is(res.err, ErrSchemaBehind), "wraps ErrSchemaBehind: %v", res.err)
	require.NotZero(t, res.rep.BatchID, "the report names the batch")
	require.Contains(t, msg, fmt.Sprintf("batch %d", res.rep.BatchID))
}

// TestManifestTransientFaultsBounded: a server that drops every
// connection (a lost network, a server that never comes back) is retried
// within the bound (TxSettings.ConnBudget, 2 x StaleAfter for a Runner),
// each fault logged with the transaction's purpose and batch, and then
// reported as such: a retryable error naming the batch and the bound.
func TestManifestTransientFaultsBounded(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	db := sqlx.MustOpen("postgres", "postgres://postgres@"+ln.Addr().String()+"/db?sslmode=disable&connect_timeout=5")
	t.Cleanup(func() { _ = db.Close() })
	logs := &syncBuffer{}
	pd := pgstore.PGDB{DB: db, Settings: &pgstore.TxSettings{ConnBudget: 300 * time.Millisecond}, Log: slog.New(slog.NewJSONHandler(logs, nil))}
	_, err = pgstore.NewManifest("").Run(context.Background(), pd, 7)
	require.Error(t, err)
	require.True(t, IsRetryable(err), "retryable: %v", err)
	require.Contains(t, err.Error(), "backfill: run 7: ")
	require.Contains(t, err.Error(), "unreachable or refused connections")
	require.ErrorIs(t, err, pgstore.ErrFaultBound)
	require.Contains(t, logs.String(), `"what":"read the run","batch_id":7,"sqlstate":"connection","try":1`)
}
