package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
)

func TestMain(m *testing.M) { Main(m) }

// databaseExists asks the admin database whether name exists.
func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	admin, err := sqlx.Open("postgres", AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var n int
	if err := admin.Get(&n, "SELECT count(*) FROM pg_database WHERE datname = $1", name); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func TestParallelDatabasesAreIsolated(t *testing.T) {
	adminDB(t) // skip here, not in the subtests, when there is no server
	var mu sync.Mutex
	names := map[string]string{} // subtest -> database

	t.Run("group", func(t *testing.T) {
		for _, marker := range []string{"a", "b"} {
			t.Run(marker, func(t *testing.T) {
				t.Parallel()
				db := New(t)
				var name string
				if err := db.Get(&name, "SELECT current_database()"); err != nil {
					t.Fatal(err)
				}
				if !strings.HasPrefix(name, "pgtest_") || !strings.Contains(name, "group_"+marker+"_") {
					t.Errorf("database name %q does not come from the test name", name)
				}
				mu.Lock()
				names[marker] = name
				mu.Unlock()

				// Same table name in both: fails if they share a database.
				db.MustExec("CREATE TABLE items (v text NOT NULL)")
				db.MustExec("INSERT INTO items VALUES ($1)", marker)
				var got []string
				if err := db.Select(&got, "SELECT v FROM items"); err != nil {
					t.Fatal(err)
				}
				if len(got) != 1 || got[0] != marker {
					t.Errorf("items = %v, want [%s]", got, marker)
				}
				var enc, collate string
				if err := db.QueryRow("SELECT pg_encoding_to_char(encoding), datcollate FROM pg_database WHERE datname = current_database()").Scan(&enc, &collate); err != nil {
					t.Fatal(err)
				}
				if enc != "UTF8" || collate != "C" {
					t.Errorf("encoding %s collate %s, want UTF8 and C", enc, collate)
				}
			})
		}
	})

	if len(names) != 2 || names["a"] == names["b"] {
		t.Fatalf("databases = %v, want two distinct ones", names)
	}
	if t.Failed() {
		return
	}
	// Both subtests passed, so both databases are gone.
	for _, name := range names {
		if databaseExists(t, name) {
			t.Errorf("database %s of a passed test still exists", name)
		}
	}
}

func TestNewURLSeveralConnections(t *testing.T) {
	u := NewURL(t)
	w, err := sqlx.Open("postgres", u)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := sqlx.Open("postgres", u)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w.MustExec("CREATE TABLE t (x int)")
	w.MustExec("INSERT INTO t VALUES (42)")
	var x int
	if err := r.Get(&x, "SELECT x FROM t"); err != nil {
		t.Fatal(err)
	}
	if x != 42 {
		t.Fatalf("x = %d, want 42", x)
	}
}

// fakeTB stands in for a finished test whose outcome the test chooses.
type fakeTB struct {
	testing.TB
	failed bool
	logs   []string
	errs   []string
}

func (f *fakeTB) Failed() bool { return f.failed }
func (f *fakeTB) Logf(format string, args ...any) {
	f.logs = append(f.logs, fmt.Sprintf(format, args...))
}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}

func TestReleaseKeepsFailedDropsPassed(t *testing.T) {
	if keepDatabase(false) || !keepDatabase(true) {
		t.Fatal("keepDatabase: want keep exactly when the test failed")
	}
	admin, adminURL := adminDB(t)
	for _, failed := range []bool{false, true} {
		name := databaseName(t.Name())
		u, err := withDatabase(adminURL, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec("CREATE DATABASE " + quoteIdent(name) + " TEMPLATE template0"); err != nil {
			t.Fatal(err)
		}
		// A leaked connection must not stop the drop.
		leak, err := sqlx.Connect("postgres", u)
		if err != nil {
			t.Fatal(err)
		}
		f := &fakeTB{TB: t, failed: failed}
		release(f, admin, name, u)
		_ = leak.Close()

		if len(f.errs) > 0 {
			t.Errorf("failed=%v: errors %v", failed, f.errs)
		}
		exists := databaseExists(t, name)
		if failed {
			if !exists {
				t.Errorf("database of a failed test was dropped")
			}
			if len(f.logs) != 1 || !strings.Contains(f.logs[0], u) {
				t.Errorf("logs = %q, want one line with %s", f.logs, u)
			}
			if _, err := admin.Exec("DROP DATABASE " + quoteIdent(name) + " WITH (FORCE)"); err != nil {
				t.Fatal(err)
			}
		} else {
			if exists {
				t.Errorf("database of a passed test was kept")
			}
			if len(f.logs) != 0 {
				t.Errorf("logs = %q, want none", f.logs)
			}
		}
	}
}

func TestDatabaseName(t *testing.T) {
	seen := map[string]bool{}
	for _, in := range []string{
		"TestX",
		"TestX/sub_test#01",
		"Test With Spaces/ünïcode/" + strings.Repeat("Long", 40),
		"",
		"///",
	} {
		for i := 0; i < 3; i++ {
			got := databaseName(in)
			if len(got) > 63 {
				t.Errorf("databaseName(%q) = %q: longer than 63 bytes", in, got)
			}
			if !strings.HasPrefix(got, "pgtest_") {
				t.Errorf("databaseName(%q) = %q: no pgtest_ prefix", in, got)
			}
			for _, r := range got {
				if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
					t.Errorf("databaseName(%q) = %q: bad character %q", in, got, r)
				}
			}
			if seen[got] {
				t.Errorf("databaseName(%q) = %q: repeated", in, got)
			}
			seen[got] = true
		}
	}
	if got := databaseName("TestX/sub_test#01"); !strings.HasPrefix(got, "pgtest_testx_sub_test_01_") {
		t.Errorf("databaseName = %q", got)
	}
}

func TestWithDatabase(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "postgres://postgres@127.0.0.1:5432/x?sslmode=disable"},
		{"postgresql://u:p@h/", "postgresql://u:p@h/x"},
		{"host=/tmp dbname=postgres", "host=/tmp dbname=postgres dbname=x"},
	} {
		got, err := withDatabase(tc.in, "x")
		if err != nil || got != tc.want {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestVersionLess(t *testing.T) {
	if !versionLess("9.6", "15") || versionLess("15", "9.6") || !versionLess("15", "16") || versionLess("16", "16") {
		t.Error("versionLess orders versions wrongly")
	}
}

// needOwnServer skips t in -short, or without the server binaries (fails
// it in CI): t starts a server of its own.
func needOwnServer(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a server of its own")
	}
	if _, err := findBinDir(); err != nil {
		Missing(t, Postgres, err.Error())
	}
}

// TestStartStop starts a second server of its own: slower, so not in -short.
func TestStartStop(t *testing.T) {
	needOwnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = srv.Stop()
		}
	}()
	want := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", srv.Port())
	if srv.URL() != want {
		t.Errorf("URL = %q, want %q", srv.URL(), want)
	}
	for _, u := range []string{srv.URL(), "host=" + srv.SocketDir() + fmt.Sprintf(" port=%d user=postgres dbname=postgres sslmode=disable", srv.Port())} {
		db, err := sqlx.Connect("postgres", u)
		if err != nil {
			t.Fatalf("connecting with %q: %v", u, err)
		}
		var fsync string
		if err := db.Get(&fsync, "SHOW fsync"); err != nil {
			t.Fatal(err)
		}
		if fsync != "off" {
			t.Errorf("fsync = %s, want off", fsync)
		}
		_ = db.Close()
	}
	pid := srv.cmd.Process.Pid
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if err := srv.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if pidAlive(pid) {
		t.Errorf("postmaster %d still running after Stop", pid)
	}
	if _, err := os.Stat(srv.SocketDir()); !os.IsNotExist(err) {
		t.Errorf("temp dir %s not removed: %v", srv.SocketDir(), err)
	}
}

// cleanupTB runs a test's cleanups when told to, not at its end.
type cleanupTB struct {
	testing.TB
	fns []func()
}

func (c *cleanupTB) Cleanup(f func()) { c.fns = append(c.fns, f) }
func (c *cleanupTB) Failed() bool     { return false }
func (c *cleanupTB) finish() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
}

// BenchmarkNew measures a database's whole life: New (CREATE DATABASE and
// connect), one query, and the cleanup that drops it.
func BenchmarkNew(b *testing.B) {
	for i := 0; i < b.N; i++ {
		tb := &cleanupTB{TB: b}
		db := New(tb)
		db.MustExec("SELECT 1")
		tb.finish()
	}
}

// TestPoolerSharesServerConnections: the pooler is in transaction mode
// with a small pool, so that many clients share few server processes.
func TestPoolerSharesServerConnections(t *testing.T) {
	u := NewPoolerURL(t)
	const clients = 3 * PoolerPoolSize
	var (
		mu   sync.Mutex
		pids = map[int]bool{}
		wg   sync.WaitGroup
		errs = make(chan error, clients)
	)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := sqlx.Open("postgres", u)
			if err != nil {
				errs <- err
				return
			}
			defer db.Close()
			for j := 0; j < 20; j++ {
				var pid int
				// In a transaction, with a sleep, so that clients
				// overlap and wait for a server connection.
				tx, err := db.Beginx()
				if err != nil {
					errs <- err
					return
				}
				if err := tx.Get(&pid, "SELECT pg_backend_pid() FROM pg_sleep(0.001)"); err != nil {
					errs <- err
					return
				}
				if err := tx.Commit(); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				pids[pid] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(pids) > PoolerPoolSize {
		t.Fatalf("%d clients used %d server processes, want at most the pool size %d", clients, len(pids), PoolerPoolSize)
	}
}

// TestStartWithRestartImmediate: a server of StartWith listens on its
// extra address, trusts the networks given, keeps synchronous_commit on,
// and a committed row survives RestartImmediate, which cuts the
// connections open at the time; a pooler listens on its extra address
// with its pool size.
func TestStartWithRestartImmediate(t *testing.T) {
	t.Parallel()
	needOwnServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// 127.0.0.2 is on the loopback interface of any Linux machine.
	srv, err := StartWith(ctx, Options{ListenAddresses: []string{"127.0.0.2"}, TrustNetworks: []string{"10.255.255.0/30"}, SynchronousCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	}()
	other := strings.Replace(srv.URL(), "127.0.0.1", "127.0.0.2", 1)
	db, err := sqlx.Open("postgres", other)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	var sc string
	var hba int
	if err := db.GetContext(ctx, &sc, `SHOW synchronous_commit`); err != nil {
		t.Fatal(err)
	}
	if err := db.GetContext(ctx, &hba, `SELECT count(*) FROM pg_hba_file_rules WHERE address = '10.255.255.0'`); err != nil {
		t.Fatal(err)
	}
	if sc != "on" || hba != 1 {
		t.Fatalf("synchronous_commit = %s (want on), pg_hba rules for the trusted network: %d (want 1)", sc, hba)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	var before, v, after int
	if err := db.GetContext(ctx, &before, `SELECT pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	if err := srv.RestartImmediate(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// The pooled connection was cut: database/sql retries on a new one
	// (driver.ErrBadConn) or the first query fails; the second must work.
	if err := db.GetContext(ctx, &v, `SELECT v FROM t`); err != nil {
		if err := db.GetContext(ctx, &v, `SELECT v FROM t`); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.GetContext(ctx, &after, `SELECT pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	if v != 42 || after == before {
		t.Fatalf("after the restart on 127.0.0.2: v = %d (want 42), backend %d (before %d, want another)", v, after, before)
	}

	p, err := StartPooler(ctx, srv.URL(), PoolerOptions{ListenAddresses: []string{"127.0.0.2"}, PoolSize: 7})
	if err != nil {
		if _, ferr := findPgBouncer(); ferr != nil {
			Missing(t, PgBouncer, ferr.Error())
		}
		t.Fatal(err)
	}
	defer func() {
		if err := p.Stop(); err != nil {
			t.Error(err)
		}
	}()
	pu, err := p.URL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	pdb, err := sqlx.Open("postgres", strings.Replace(pu, "127.0.0.1", "127.0.0.2", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer pdb.Close()
	if err := pdb.GetContext(ctx, &v, `SELECT v FROM t`); err != nil || v != 42 {
		t.Fatalf("through the pooler on 127.0.0.2: v = %d, %v", v, err)
	}
	ini, err := os.ReadFile(filepath.Join(p.dir, "pgbouncer.ini"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ini), "default_pool_size = 7\n") {
		t.Fatalf("pool size not set:\n%s", ini)
	}
}

// TestDeadlineEndsAHungTest runs itself in a child process with a
// deadline of 2 s, where it takes a database and hangs: the child exits
// 1 naming the test and its deadline, long before its package timeout.
func TestDeadlineEndsAHungTest(t *testing.T) {
	if os.Getenv("PGTEST_HANG") == "1" {
		NewURL(t)
		select {}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDeadlineEndsAHungTest$", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), "PGTEST_HANG=1", "BACKFILL_TEST_DEADLINE=2s")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("the hung child ended with %v, want exit status 1; output:\n%s", err, out)
	}
	if !strings.Contains(string(out), "pgtest: FAIL: TestDeadlineEndsAHungTest passed its deadline of 2s") {
		t.Fatalf("the child's output does not name the test and its deadline:\n%s", out)
	}
}

// TestPoolerRestartsAfterItsProcessDies: a pooler whose pgbouncer is
// killed (SIGKILL, as when it exits on a fatal error) is started again on
// the same port, and a new connection through its URL works; after Stop
// it stays down.
func TestPoolerRestartsAfterItsProcessDies(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	direct := NewURL(t)
	p, err := StartPooler(ctx, AdminURL(), PoolerOptions{})
	if err != nil {
		if _, ferr := findPgBouncer(); ferr != nil {
			Missing(t, PgBouncer, ferr.Error())
		}
		t.Fatal(err)
	}
	defer p.Stop()
	u, err := p.URL(direct)
	if err != nil {
		t.Fatal(err)
	}
	query := func() error {
		db, err := sqlx.Open("postgres", u)
		if err != nil {
			return err
		}
		defer db.Close()
		var one int
		return db.GetContext(ctx, &one, `SELECT 1`)
	}
	if err := query(); err != nil {
		t.Fatalf("before the kill: %v", err)
	}
	for round := 1; round <= 2; round++ {
		dead := p.current()
		if err := syscall.Kill(-dead.cmd.Process.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-dead.exited
		var next *poolerProc
		select {
		case next = <-p.restarted:
		case <-ctx.Done():
			t.Fatalf("round %d: pgbouncer was not restarted after SIGKILL", round)
		}
		if next == dead || next != p.current() {
			t.Fatalf("round %d: the restarted process is not the pooler's current one", round)
		}
		if err := query(); err != nil {
			t.Fatalf("round %d: a new connection after the restart: %v", round, err)
		}
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	last := p.current()
	<-last.exited
	p.mu.Lock()
	restarts := p.restarts
	p.mu.Unlock()
	if restarts != 2 || len(p.restarted) != 0 {
		t.Fatalf("after Stop: %d restarts (want 2), %d pending", restarts, len(p.restarted))
	}
	if err := query(); err == nil {
		t.Fatal("a connection through a stopped pooler succeeded")
	}
}
