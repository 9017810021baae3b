package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// PoolerPoolSize is the number of server connections the test pooler
// opens per database (default_pool_size): small, so that the clients of a
// test really share server connections between their transactions.
const PoolerPoolSize = 4

// Pooler is a PgBouncer in transaction pooling mode (pool_mode =
// transaction) in front of a PostgreSQL server, started by [StartPooler].
// It listens on 127.0.0.1 (and [PoolerOptions.ListenAddresses]) on a
// free port. Every database of the server is
// reachable through it under its own name, as the user of the server URL.
//
// PgBouncer 1.18 can exit on its own (a fatal "bad client state" after a
// cancel request whose client went away first, which lib/pq sends when a
// context ends mid-query). The pooler is supervised: when its process
// exits without [Pooler.Stop], it is started again at once on the same
// port with the same configuration, at most 20 times, and
// the cause is written to stderr. Connections open through the dying
// process fail; later ones work.
type Pooler struct {
	dir     string
	port    int
	logPath string
	bin     string
	iniPath string
	cred    *syscall.Credential
	user    string

	// mu guards proc, stopping and restarts: a restart happens only
	// while stopping is false, so Stop, having set it, signals the last
	// process.
	mu       sync.Mutex
	proc     *poolerProc
	stopping bool
	restarts int
	// ready is set once the first process answered: an exit before it
	// is a failed start, not a crash.
	ready atomic.Bool
	// restarted receives the process of each restart once it answers.
	restarted chan *poolerProc

	stopOnce sync.Once
	stopErr  error
}

// poolerRestarts bounds the restarts of a crashed pooler, so that one that
// cannot stay up fails its tests instead of looping.
const poolerRestarts = 20

// poolerProc is one pgbouncer process of a [Pooler].
type poolerProc struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd.Wait returned
	waitErr error         // cmd.Wait's result, once exited is closed
}

// StatementPoolUser is the user whose connections the test pooler pools
// in statement mode (pool_mode = statement), see [NewStatementPoolerURL].
const StatementPoolUser = "pgtest_statement_pool"

// Port returns the TCP port the pooler listens on.
func (p *Pooler) Port() int { return p.port }

// URL returns serverURL (a postgres:// URL of the server the pooler is in
// front of) pointed at the pooler instead: same user, password, database
// and parameters, the pooler's host and port.
func (p *Pooler) URL(serverURL string) (string, error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", fmt.Errorf("pgtest: parsing %s: %w", redact(serverURL), err)
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
	return u.String(), nil
}

// findPgBouncer returns the path of the pgbouncer binary: $PGBOUNCER, else
// pgbouncer on PATH, else /usr/sbin/pgbouncer (Debian's package).
func findPgBouncer() (string, error) {
	if p := os.Getenv("PGBOUNCER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/pgbouncer"
	if fi, err := os.Stat(debian); err == nil && fi.Mode()&0o111 != 0 {
		return debian, nil
	}
	return "", errors.New("pgtest: pgbouncer not found: install it (apt-get install pgbouncer) or set PGBOUNCER")
}

// PoolerOptions are the settings of [StartPooler].
type PoolerOptions struct {
	// ListenAddresses are IPv4 addresses the pooler listens on besides
	// 127.0.0.1; they must exist on the machine.
	ListenAddresses []string
	// PoolSize is the number of server connections per database and
	// user (default_pool_size); 0 means [PoolerPoolSize].
	PoolSize int
}

// StartPooler starts PgBouncer in transaction pooling mode in front of the
// server of serverURL (a postgres:// URL), with opts.PoolSize server
// connections per database, auth_type trust for the URL's user (its
// password, if any, is what PgBouncer logs in to the server with). The
// caller must call [Pooler.Stop]. When running as root, PgBouncer runs as
// the "postgres" system user.
func StartPooler(ctx context.Context, serverURL string, opts PoolerOptions) (p *Pooler, err error) {
	bin, err := findPgBouncer()
	if err != nil {
		return nil, err
	}
	su, err := url.Parse(serverURL)
	if err != nil || su.Hostname() == "" {
		return nil, fmt.Errorf("pgtest: pooler: server URL %s: want postgres://user@host:port/db", redact(serverURL))
	}
	user := su.User.Username()
	if user == "" {
		user = "postgres"
	}
	pass, _ := su.User.Password()
	serverPort := su.Port()
	if serverPort == "" {
		serverPort = "5432"
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := makeTempDir(cred, false)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	quote := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	users := quote(user) + " " + quote(pass) + "\n" + quote(StatementPoolUser) + " \"\"\n"
	if err := writeOwned(filepath.Join(dir, "userlist.txt"), users, cred); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		p, err = startPgBouncer(ctx, bin, dir, su.Hostname(), serverPort, user, cred, opts)
		if err == nil || !errors.Is(err, errPortInUse) || attempt == portAttempts {
			return p, err
		}
	}
}

func writeOwned(path, content string, cred *syscall.Credential) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if cred != nil {
		if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
	}
	return nil
}

func startPgBouncer(ctx context.Context, bin, dir, host, serverPort, user string, cred *syscall.Credential, opts PoolerOptions) (*Pooler, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	poolSize := opts.PoolSize
	if poolSize <= 0 {
		poolSize = PoolerPoolSize
	}
	logPath := filepath.Join(dir, "pgbouncer.log")
	ini := strings.Join([]string{
		"[databases]",
		// Any database name: the server's database of that name.
		fmt.Sprintf("* = host=%s port=%s", host, serverPort),
		"[pgbouncer]",
		"listen_addr = " + strings.Join(append([]string{"127.0.0.1"}, opts.ListenAddresses...), ","),
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(dir, "userlist.txt"),
		"admin_users = " + user,
		"pool_mode = transaction",
		"default_pool_size = " + strconv.Itoa(poolSize),
		"min_pool_size = 0",
		"reserve_pool_size = 0",
		"max_client_conn = 2000",
		"max_db_connections = 0",
		// lib/pq sends extra_float_digits in its startup packet.
		"ignore_startup_parameters = extra_float_digits",
		"server_login_retry = 1",
		"logfile = " + logPath,
		"pidfile = " + filepath.Join(dir, "pgbouncer.pid"),
		"log_connections = 0",
		"log_disconnections = 0",
		// One user whose pools are in statement mode, which refuses
		// transactions ([NewStatementPoolerURL]).
		"[users]",
		StatementPoolUser + " = pool_mode=statement",
		"",
	}, "\n")
	iniPath := filepath.Join(dir, "pgbouncer.ini")
	if err := writeOwned(iniPath, ini, cred); err != nil {
		return nil, err
	}
	_ = os.Remove(logPath)
	p := &Pooler{dir: dir, port: port, logPath: logPath, bin: bin, iniPath: iniPath, cred: cred, user: user,
		restarted: make(chan *poolerProc, poolerRestarts)}
	p.mu.Lock()
	proc, err := p.spawn()
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := p.waitReady(ctx, proc); err != nil {
		logTail := readTail(logPath)
		p.kill()
		if strings.Contains(logTail, "Address already in use") {
			return nil, fmt.Errorf("pgtest: pooler port %d: %w", port, errPortInUse)
		}
		return nil, fmt.Errorf("%w\n--- pgbouncer log ---\n%s", err, logTail)
	}
	p.ready.Store(true)
	return p, nil
}

// spawn starts a pgbouncer process with p's configuration, makes it
// p.proc and supervises it. p.mu must be held.
func (p *Pooler) spawn() (*poolerProc, error) {
	cmd := exec.Command(p.bin, p.iniPath)
	cmd.Dir = p.dir
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: p.cred,
		Setpgid:    true,
		// Gone with the test binary, whatever ends it.
		Pdeathsig: syscall.SIGTERM,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgtest: starting %s: %w", p.bin, err)
	}
	proc := &poolerProc{cmd: cmd, exited: make(chan struct{})}
	p.proc = proc
	go func() {
		proc.waitErr = cmd.Wait()
		close(proc.exited)
		p.restart(proc)
	}()
	return proc, nil
}

// restart starts pgbouncer again after proc exited, unless it was stopped
// on purpose, had not started yet, or has used up its restarts. Its
// clients fail with EOF or "connection refused" and nothing else says why,
// hence the report on stderr.
func (p *Pooler) restart(proc *poolerProc) {
	p.mu.Lock()
	if p.stopping || !p.ready.Load() || p.proc != proc {
		p.mu.Unlock()
		return
	}
	cause := fmt.Sprintf("pgtest: pgbouncer (pid %d, port %d) exited unexpectedly: %v\n--- pgbouncer log ---\n%s\n",
		proc.cmd.Process.Pid, p.port, proc.waitErr, readTail(p.logPath))
	if p.restarts >= poolerRestarts {
		p.mu.Unlock()
		fmt.Fprintf(os.Stderr, "%spgtest: not restarting pgbouncer: %d restarts already\n", cause, poolerRestarts)
		return
	}
	p.restarts++
	n := p.restarts
	// A process killed outright leaves its pidfile behind.
	_ = os.Remove(filepath.Join(p.dir, "pgbouncer.pid"))
	next, err := p.spawn()
	p.mu.Unlock()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%spgtest: restarting pgbouncer: %v\n", cause, err)
		return
	}
	fmt.Fprintf(os.Stderr, "%spgtest: restarting pgbouncer (restart %d of at most %d, pid %d, same port)\n",
		cause, n, poolerRestarts, next.cmd.Process.Pid)
	// Outside p.mu, so that Stop is not held up; an exit meanwhile is
	// next's own goroutine's to handle.
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := p.waitReady(ctx, next); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: restarted pgbouncer (pid %d) not ready: %v\n", next.cmd.Process.Pid, err)
		return
	}
	p.restarted <- next
}

// current returns the pooler's current process.
func (p *Pooler) current() *poolerProc {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc
}

// waitReady polls until the pooler answers a query on the server's
// postgres database.
func (p *Pooler) waitReady(ctx context.Context, proc *poolerProc) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	u := fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", url.User(p.user).String(), p.port)
	db, err := sql.Open("postgres", u)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer db.Close()
	var last error
	for {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		_, last = db.ExecContext(pctx, "SELECT 1")
		pcancel()
		if last == nil {
			return nil
		}
		select {
		case <-proc.exited:
			return fmt.Errorf("pgtest: pgbouncer exited during startup: %v", proc.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("pgtest: pgbouncer not ready on port %d: %w (last error: %v)", p.port, ctx.Err(), last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill stops the pooler with SIGKILL, without a restart.
func (p *Pooler) kill() {
	p.mu.Lock()
	p.stopping = true
	proc := p.proc
	p.mu.Unlock()
	select {
	case <-proc.exited:
	default:
		_ = syscall.Kill(-proc.cmd.Process.Pid, syscall.SIGKILL)
		<-proc.exited
	}
}

// Stop shuts the pooler down (SIGTERM, PgBouncer's immediate shutdown,
// then SIGKILL if it does not exit in time) and removes its directory.
// It is not restarted after. It is safe to call more than once.
func (p *Pooler) Stop() error {
	p.stopOnce.Do(func() {
		var errs []error
		p.mu.Lock()
		p.stopping = true
		proc := p.proc
		p.mu.Unlock()
		select {
		case <-proc.exited:
		default:
			_ = proc.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-proc.exited:
			case <-time.After(stopTimeout):
				p.kill()
				errs = append(errs, fmt.Errorf("pgtest: pgbouncer did not stop within %v, killed it", stopTimeout))
			}
		}
		if err := os.RemoveAll(p.dir); err != nil {
			errs = append(errs, fmt.Errorf("pgtest: removing %s: %w", p.dir, err))
		}
		p.stopErr = errors.Join(errs...)
	})
	return p.stopErr
}

// The test binary's pooler, started by the first NewPoolerURL and stopped
// by Main.
var pooler struct {
	mu          sync.Mutex
	p           *Pooler
	unavailable string // why there is none, once tried
}

// stopPooler stops the test binary's pooler, if one was started.
func stopPooler() {
	pooler.mu.Lock()
	p := pooler.p
	pooler.p = nil
	pooler.mu.Unlock()
	if p != nil {
		if err := p.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
}

// NewPoolerURL creates a fresh database for t, like [NewURL], and returns
// its URL through PgBouncer in transaction pooling mode (pool_mode =
// transaction, [PoolerPoolSize] server connections per database): an
// ordinary connection string, without binary_parameters. The test binary
// starts one PgBouncer, on the first call, in front of its server; [Main]
// stops it. Without pgbouncer installed the test is skipped, or fails
// when [Required] (BACKFILL_REQUIRE_PGBOUNCER=1 or CI=true).
func NewPoolerURL(t testing.TB) string {
	t.Helper()
	direct := NewURL(t)
	_, adminURL := adminDB(t)
	pooler.mu.Lock()
	defer pooler.mu.Unlock()
	if pooler.p == nil && pooler.unavailable == "" {
		state.mu.Lock()
		mainCalled := state.mainCalled
		state.mu.Unlock()
		if !mainCalled {
			t.Fatal("pgtest: NewPoolerURL needs TestMain to call pgtest.Main (which stops the pooler)")
		}
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		p, err := StartPooler(ctx, adminURL, PoolerOptions{})
		cancel()
		if err != nil {
			pooler.unavailable = err.Error()
		} else {
			pooler.p = p
		}
	}
	if pooler.p == nil {
		Missing(t, PgBouncer, "pgtest: no PgBouncer for this test, which runs through a pooler: "+pooler.unavailable)
	}
	u, err := pooler.p.URL(direct)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// NewStatementPoolerURL is [NewPoolerURL] for a pooler in statement mode
// (pool_mode = statement: every statement on any server connection, no
// transaction blocks), as user [StatementPoolUser], a superuser role it
// creates on the server when missing. It needs Main's throwaway server
// (it does not create roles on a DATABASE_URL server): otherwise t is
// skipped.
func NewStatementPoolerURL(t testing.TB) string {
	t.Helper()
	u := NewPoolerURL(t)
	state.mu.Lock()
	throwaway := state.throwaway
	state.mu.Unlock()
	if !throwaway {
		t.Skip("pgtest: a statement-mode pooler needs a role of its own, created only on the throwaway server (DATABASE_URL is set)")
	}
	admin, _ := adminDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	_, err := admin.ExecContext(ctx, `DO $$ BEGIN
		CREATE ROLE `+quoteIdent(StatementPoolUser)+` LOGIN SUPERUSER;
	EXCEPTION WHEN duplicate_object THEN NULL; END $$`)
	if err != nil {
		t.Fatalf("pgtest: creating role %s: %v", StatementPoolUser, err)
	}
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p.User = url.User(StatementPoolUser)
	return p.String()
}
