package backfill_test

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

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
}

// childProcess is the child side of killChildWhen: when env is set, it
// opens the database it names, calls work and exits (1 on error). Call it
// from an init function.
func childProcess(env string, work func(db *sqlx.DB) error) {
	url := os.Getenv(env)
	if url == "" {
		return
	}
	if err := work(sqlx.MustOpen("postgres", url)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}
