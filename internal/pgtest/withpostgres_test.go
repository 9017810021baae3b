package pgtest

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
)

// scriptEnv is the test's environment without the variables
// with-postgres.sh reads or sets.
func scriptEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "DATABASE_URL", "BACKFILL_KEEP", "BACKFILL_THROWAWAY":
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// reachable reports whether a server answers at url.
func reachable(url string) bool {
	db, err := sqlx.Open("postgres", url+"&connect_timeout=5")
	if err != nil {
		return false
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return db.PingContext(ctx) == nil
}

// TestWithPostgresScript: with-postgres.sh tells its command that the
// server is throwaway (BACKFILL_THROWAWAY=1) and removes it afterwards;
// with BACKFILL_KEEP=1 the server outlives the command, answering, until
// the script gets SIGTERM, and the script still exits with the command's
// status.
func TestWithPostgresScript(t *testing.T) {
	needOwnServer(t)
	t.Parallel()

	first := exec.Command("bash", "with-postgres.sh", "sh", "-c", `echo "$BACKFILL_THROWAWAY $DATABASE_URL"`)
	first.Env = scriptEnv()
	out, err := first.Output()
	if err != nil {
		t.Fatalf("with-postgres.sh: %v", err)
	}
	flag, url, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	if flag != "1" || !strings.HasPrefix(url, "postgres://") {
		t.Fatalf("command saw %q; want BACKFILL_THROWAWAY=1 and a DATABASE_URL", out)
	}
	if reachable(url) {
		t.Errorf("the server at %s still answers after the script ended", url)
	}

	cmd := exec.Command("bash", "with-postgres.sh", "sh", "-c", `echo "$DATABASE_URL"; exit 3`)
	cmd.Env = scriptEnv("BACKFILL_KEEP=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("no URL from the command: %v", err)
	}
	url = strings.TrimSpace(line)
	var said strings.Builder
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		said.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "press Ctrl-C") {
			break
		}
	}
	if !strings.Contains(said.String(), "export DATABASE_URL='"+url+"'") {
		t.Errorf("the script did not print the kept server's URL:\n%s", said.String())
	}
	// The command has exited; the server must still answer.
	if !reachable(url) {
		t.Fatalf("BACKFILL_KEEP=1: the server at %s does not answer after the command ended:\n%s", url, said.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = bufio.NewReader(stderr).ReadString(0) }() // drain
	err = cmd.Wait()
	killed = true
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("script exit: %v; want the command's status 3", err)
	}
	if reachable(url) {
		t.Errorf("the kept server at %s still answers after SIGTERM", url)
	}
}
