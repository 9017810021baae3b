package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	corev1 "k8s.io/api/core/v1"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// execEnv, set in a child of the test binary, makes it the worker.
const execEnv = "BACKFILL_K8S_TEST_WORKER"

// TestMain runs the worker when the test binary is started as one
// (startWorker), the tests otherwise.
func TestMain(m *testing.M) {
	if os.Getenv(execEnv) == "1" {
		os.Exit(int(runMain()))
	}
	pgtest.Main(m)
}

// cluster is a database set up as the example sets it up: ../roles.sql
// run by the administrator, then, as the owner (no superuser), the
// ConfigMap's target.sql and the manifest's migration with the loader's
// and the operator's grants (the migrate Job); the workers log in as the
// loader, the operator's actions as the on-call role.
type cluster struct {
	admin     *sqlx.DB // the test server's administrator
	owner     *sqlx.DB
	oncall    *sqlx.DB
	loaderURL string
	loader    string
}

// exampleRoles matches the role names of ../roles.sql and the manifests.
var exampleRoles = regexp.MustCompile(`\b(backfill_owner|backfill_loader|backfill_operator|oncall)\b`)

// newCluster sets up a fresh database with roles of its own: the names of
// ../roles.sql with a suffix (roles are the server's, shared by tests).
func newCluster(t *testing.T) cluster {
	t.Helper()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	admin := sqlx.MustOpen("postgres", u)
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	suffix := "_" + hex.EncodeToString(b)
	rename := func(sql string) string { return exampleRoles.ReplaceAllString(sql, "${1}"+suffix) }
	var c cluster
	c.admin, c.loader = admin, loaderRole+suffix
	t.Cleanup(func() {
		for _, db := range []*sqlx.DB{c.owner, c.oncall} {
			if db != nil {
				db.Close()
			}
		}
		for _, r := range []string{ownerRole, loaderRole, operatorRole, "oncall"} {
			_, _ = admin.Exec(`DROP OWNED BY ` + r + suffix)
			_, _ = admin.Exec(`DROP ROLE IF EXISTS ` + r + suffix)
		}
		admin.Close()
	})
	exec := func(db *sqlx.DB, q string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var database string
	if err := admin.GetContext(ctx, &database, `SELECT current_database()`); err != nil {
		t.Fatal(err)
	}
	roles, err := os.ReadFile("../roles.sql")
	if err != nil {
		t.Fatal(err)
	}
	exec(admin, strings.ReplaceAll(rename(string(roles)), "DATABASE app ", `DATABASE "`+database+`" `))
	// TEMPORARY by roles.sql's grant only, not through PUBLIC.
	exec(admin, `REVOKE TEMPORARY ON DATABASE "`+database+`" FROM PUBLIC`)
	as := func(role string) (*sqlx.DB, string) {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		pu.User = url.UserPassword(role+suffix, "change-me")
		return sqlx.MustOpen("postgres", pu.String()), pu.String()
	}
	c.owner, _ = as(ownerRole)
	c.oncall, _ = as("oncall")
	_, c.loaderURL = as(loaderRole)

	// The migrate Job, as the owner: target.sql, then
	// backfill migrate --grant LOADER --grant-operator OPERATOR.
	sql := find[*corev1.ConfigMap](t, loadManifests(t, manifestsDir), "ConfigMap", sqlConfigMap).Data["target.sql"]
	exec(c.owner, rename(sql))
	if _, err := backfill.NewPGManifest("").MigrateGrantRoles(ctx, c.owner, []string{c.loader}, []string{operatorRole + suffix}); err != nil {
		t.Fatalf("migrate as the owner: %v", err)
	}
	return c
}

// worker is a worker process: the test binary started as the worker.
type worker struct {
	cmd  *exec.Cmd
	logs bytes.Buffer
	done chan struct{}
	err  error
}

// startWorker starts a worker with the loader's URL and env (NAME=value).
func (c cluster) startWorker(t *testing.T, env ...string) *worker {
	t.Helper()
	w := &worker{done: make(chan struct{})}
	w.cmd = exec.Command(os.Args[0])
	w.cmd.Env = append(os.Environ(), execEnv+"=1", envDatabaseURL+"="+c.loaderURL)
	w.cmd.Env = append(w.cmd.Env, env...)
	w.cmd.Stderr = &w.logs
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { w.err = w.cmd.Wait(); close(w.done) }()
	t.Cleanup(func() {
		select {
		case <-w.done:
		default:
			_ = w.cmd.Process.Kill()
			<-w.done
		}
	})
	return w
}

// wait returns the worker's exit code; the test fails if it runs longer
// than limit.
func (w *worker) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(limit):
		_ = w.cmd.Process.Kill()
		<-w.done
		t.Fatalf("worker still running after %v; its log:\n%s", limit, w.logs.String())
	}
	var ee *exec.ExitError
	if w.err != nil && !errors.As(w.err, &ee) {
		t.Fatal(w.err)
	}
	return w.cmd.ProcessState.ExitCode()
}

// expect fails t unless the worker exits with want within limit.
func (w *worker) expect(t *testing.T, want backfill.ExitCode, limit time.Duration) {
	t.Helper()
	if got := w.wait(t, limit); got != int(want) {
		t.Fatalf("worker exited %d, want %d; its log:\n%s", got, want, w.logs.String())
	}
	lines := strings.Split(strings.TrimSpace(w.logs.String()), "\n")
	t.Logf("exit %d: %s", want, lines[len(lines)-1])
}

// status is the job's latest run as the manifest records it.
func (c cluster) status(t *testing.T, job string) backfill.Status {
	t.Helper()
	st, err := backfill.NewPGManifest("").JobStatus(context.Background(), c.admin, job)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// asOperator runs q as the on-call role, a member of the operator role,
// as "backfill pause" or "backfill cancel" from the on-call pod would.
func (c cluster) asOperator(t *testing.T, q string) {
	t.Helper()
	if _, err := c.oncall.Exec(q); err != nil {
		t.Fatalf("%s as the on-call role: %v", q, err)
	}
}

// waitChunksDone waits until the job's run has n chunks done.
func (c cluster) waitChunksDone(t *testing.T, job string, n int) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		var done int
		_ = c.admin.Get(&done, `SELECT coalesce(max(chunks_done), 0) FROM backfill.run_progress WHERE job_name = $1`, job)
		if done >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %d chunks done after 2 minutes, want %d", job, done, n)
		}
	}
}

// TestWorkerExitCodes runs the worker as the pods do, as the loader after
// the migrate Job's setup, and checks each exit code the worker Job's
// podFailurePolicy maps: 64 for a bad deployment, 75 on SIGTERM (the
// chunks in flight released, within the grace period), 0 once resumed to
// the end by two workers, no exit while the run is paused but 75 at once
// on SIGTERM then, 3 after an operator's cancel (again at once on
// a restart), 1 when a chunk fails for good.
func TestWorkerExitCodes(t *testing.T) {
	c := newCluster(t)
	const limit = 2 * time.Minute

	t.Run("usage", func(t *testing.T) {
		c.startWorker(t, envJob+"=k8s-usage", envTable+"=no_such_table").expect(t, backfill.ExitUsage, limit)
		c.startWorker(t, envConcurrency+"=zero").expect(t, backfill.ExitUsage, limit)
	})

	t.Run("sigterm-then-done", func(t *testing.T) {
		job := []string{envJob + "=k8s-sigterm", envIDs + "=20000", envChunkRows + "=500", envConcurrency + "=2"}
		w := c.startWorker(t, append(job, envExtractDelay+"=300ms")...)
		c.waitChunksDone(t, "k8s-sigterm", 2)
		sent := time.Now()
		if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		w.expect(t, backfill.ExitTempFail, limit)
		took := time.Since(sent)
		t.Logf("SIGTERM to exit: %v", took.Round(time.Millisecond))
		if took > 30*time.Second {
			t.Errorf("the worker took %v to exit after SIGTERM", took)
		}
		st := c.status(t, "k8s-sigterm")
		if st.Status != backfill.RunRunning || st.Chunks.InFlight != 0 || st.Chunks.Done == st.Chunks.Total {
			t.Fatalf("after SIGTERM: run %s, chunks %+v; want running, none in flight, not all done", st.Status, st.Chunks)
		}
		// The Job's replacement pods resume the run.
		a, b := c.startWorker(t, job...), c.startWorker(t, job...)
		a.expect(t, backfill.ExitDone, limit)
		b.expect(t, backfill.ExitDone, limit)
		var n int
		if err := c.admin.Get(&n, `SELECT count(*) FROM demo_events WHERE id < 20000`); err != nil || n != 20000 {
			t.Fatalf("demo_events holds %d rows (%v), want 20000", n, err)
		}
		// A pod started after the run completed exits 0 at once.
		c.startWorker(t, job...).expect(t, backfill.ExitDone, limit)
	})

	t.Run("paused-then-sigterm", func(t *testing.T) {
		job := []string{envJob + "=k8s-paused", envIDs + "=20000", envChunkRows + "=500"}
		w := c.startWorker(t, append(job, envExtractDelay+"=300ms")...)
		c.waitChunksDone(t, "k8s-paused", 1)
		c.asOperator(t, `SELECT backfill.pause('k8s-paused', 'oncall', 'test: replica lag')`)
		// A paused run does not end Work: once its chunks in flight are
		// checkpointed, the pod stays, a live worker.
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
			st := c.status(t, "k8s-paused")
			if st.Status == backfill.RunPaused && st.Chunks.InFlight == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("paused run: %s, chunks %+v after a minute; want paused, none in flight", st.Status, st.Chunks)
			}
		}
		select {
		case <-w.done:
			t.Fatalf("the worker exited while the run was paused; its log:\n%s", w.logs.String())
		case <-time.After(time.Second):
		}
		if st := c.status(t, "k8s-paused"); st.LiveWorkers != 1 {
			t.Fatalf("paused run: %d live workers, want 1 (the waiting worker)", st.LiveWorkers)
		}
		// A pod deleted during the pause still stops at once.
		sent := time.Now()
		if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		w.expect(t, backfill.ExitTempFail, limit)
		t.Logf("SIGTERM to exit while paused: %v", time.Since(sent).Round(time.Millisecond))
		if st := c.status(t, "k8s-paused"); st.Status != backfill.RunPaused || st.LiveWorkers != 0 {
			t.Fatalf("after SIGTERM: run %s, %d live workers; want paused, none", st.Status, st.LiveWorkers)
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		job := []string{envJob + "=k8s-cancel", envIDs + "=20000", envChunkRows + "=500"}
		w := c.startWorker(t, append(job, envExtractDelay+"=300ms")...)
		c.waitChunksDone(t, "k8s-cancel", 1)
		// As the operator role ("backfill cancel" from the on-call pod).
		c.asOperator(t, `SELECT backfill.cancel('k8s-cancel', 'oncall', 'test: wrong scope')`)
		w.expect(t, backfill.ExitCancelled, limit)
		// A restart does not resume a cancelled run.
		c.startWorker(t, job...).expect(t, backfill.ExitCancelled, limit)
	})

	t.Run("failed", func(t *testing.T) {
		// Every row of ids 1000 and above is refused by the target: far
		// more than a chunk may refuse, so those chunks fail for good.
		c.owner.MustExec(`CREATE TABLE demo_refused (LIKE demo_events INCLUDING ALL, CHECK (id < 1000))`)
		c.owner.MustExec(`GRANT SELECT, INSERT, UPDATE, DELETE ON demo_refused TO ` + c.loader)
		c.startWorker(t, envJob+"=k8s-failed", envTable+"=demo_refused", envIDs+"=3000", envChunkRows+"=1000", envConcurrency+"=1").
			expect(t, backfill.ExitFailed, limit)
	})
}
