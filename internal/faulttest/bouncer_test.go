//go:build faults

package faulttest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pgbouncerPath is where Debian's pgbouncer package installs it.
const pgbouncerPath = "/usr/sbin/pgbouncer"

// startBouncer starts PgBouncer in transaction pooling mode in front of
// the server on 127.0.0.1:pgPort, listening on 127.0.0.1 and addrs, and
// returns its port, or 0 (logged) when PgBouncer is not installed. It is
// stopped at the end of t. (The pooler work of issue 12 adds a starter
// to internal/pgtest; this one is the suite's own until then.)
func startBouncer(t *testing.T, pgPort int, addrs []string) int {
	t.Helper()
	bin := pgbouncerPath
	if _, err := os.Stat(bin); err != nil {
		p, err := exec.LookPath("pgbouncer")
		if err != nil {
			t.Logf("pgbouncer: not installed, no worker goes through it")
			return 0
		}
		bin = p
	}
	dir, err := os.MkdirTemp("", "faulttest-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var cred *syscall.Credential
	if os.Geteuid() == 0 { // PgBouncer refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgbouncer: need the postgres user to run it as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	port := freePort(t)
	ini := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d user=postgres

[pgbouncer]
listen_addr = %s
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 500
default_pool_size = 40
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = %s
server_connect_timeout = 5
server_login_retry = 1
`, pgPort, strings.Join(append([]string{"127.0.0.1"}, addrs...), ","), port, filepath.Join(dir, "pgbouncer.log"))
	iniPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(iniPath, []byte(ini), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, iniPath)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer exited at start:\n%s", log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer not listening on %d: %v", port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("pgbouncer: transaction pooling on port %d", port)
	return port
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
