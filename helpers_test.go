package backfill_test

import (
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(poolerGuard{m}) }

// poolerGuard fails the test binary when the library ran a statement with
// bind parameters outside a transaction on a Postgres DB, which a
// transaction pooler may mix up with another client's:
// every test of the package checks the kind, not only those run through a
// pooler.
type poolerGuard struct{ m *testing.M }

func (g poolerGuard) Run() int {
	code := g.m.Run()
	if bad := backfill.OutsideTxStatements(); len(bad) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: %d statements with parameters ran outside a transaction (unsafe behind a transaction pooler):\n  %s\n",
			len(bad), strings.Join(bad, "\n  "))
		if code == 0 {
			code = 1
		}
	}
	return code
}

// exampleDB returns a fresh database on the tests' server for a runnable
// example (examples have no *testing.T); it is dropped with the server.
func exampleDB(name string) *sqlx.DB {
	return sqlx.MustOpen("postgres", pgtest.Database("example_"+name))
}

// killChildWhen starts this test binary again as a child process with
// env=url (its init runs the work and exits), waits until query on db
// counts at least n, and kills the child with SIGKILL.
func killChildWhen(t *testing.T, db *sqlx.DB, env, url, query string, n int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+url)
	require.NoError(t, cmd.Start())
	deadline := time.Now().Add(60 * time.Second)
	for {
		var got int
		if err := db.Get(&got, query); err == nil && got >= n {
			break
		}
		require.True(t, time.Now().Before(deadline), "child made no progress")
		time.Sleep(2 * time.Millisecond)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	// A COMMIT the child sent just before the kill may still be running
	// in its server process: wait until the child's server processes are
	// gone, so that what the test reads next is what the crash left.
	deadline = time.Now().Add(30 * time.Second)
	for {
		var left int
		require.NoError(t, db.Get(&left, `SELECT count(*) FROM pg_stat_activity WHERE (application_name = $1 OR application_name LIKE 'backfill % ' || $1)`, childAppName(cmd.Process.Pid)))
		if left == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the child's server processes did not end")
		time.Sleep(2 * time.Millisecond)
	}
}

// quickFencing is cfg with a short StaleAfter (2 s, heartbeats every
// 100 ms), for a child killed with SIGKILL and the run that resumes after
// it: a worker's StaleAfter is recorded with it in the manifest, and the
// resuming run takes a killed worker's leased chunks over once its
// heartbeat is older than the larger of the two workers' StaleAfter
// ([backfill.DefaultStaleAfter], 30 s, by default: TestKillDashNine keeps
// the defaults).
func quickFencing(cfg backfill.Config) *backfill.Config {
	cfg.HeartbeatInterval, cfg.StaleAfter = 100*time.Millisecond, 2*time.Second
	return &cfg
}

// childAppName is the application_name of the connections of the child
// process pid (PostgreSQL docs, 20.11.1 "Statement Behavior"); a chunk's
// transaction puts "backfill <worker key> " before it.
func childAppName(pid int) string { return fmt.Sprintf("backfill_test_child_%d", pid) }

// childProcess is the child side of killChildWhen: when env is set, it
// opens the database it names, calls work and exits (1 on error). Call it
// from an init function.
func childProcess(env string, work func(db *sqlx.DB) error) {
	url := os.Getenv(env)
	if url == "" {
		return
	}
	u, err := neturl.Parse(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	q := u.Query()
	q.Set("application_name", childAppName(os.Getpid()))
	u.RawQuery = q.Encode()
	if err := work(sqlx.MustOpen("postgres", u.String())); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}
