// Package pgtest gives tests a PostgreSQL database of their own.
//
// A test binary calls [Main] from TestMain. Main uses the server named by
// the DATABASE_URL environment variable when it is set; otherwise it starts a
// throwaway server ([Start]) in a temporary directory from the PostgreSQL
// binaries installed on the machine, and stops it when the tests are done
// (also on SIGINT and SIGTERM).
//
// Each test then calls [New] (or [NewURL]) to get a fresh, empty database,
// created from template0 under a unique name. The database is dropped when
// the test passes and kept when it fails, with its URL logged so that it can
// be inspected (useful with a DATABASE_URL server that outlives the test
// binary; a throwaway server is removed when the binary exits).
//
// When no server can be had, tests that call New are skipped, except when
// [Required] (BACKFILL_REQUIRE_POSTGRES=1, or CI=true), where Main exits
// with status 1 so that the run fails instead of silently skipping.
//
// [NewPoolerURL] gives a fresh database through PgBouncer in transaction
// pooling mode, started on first use in front of the server and stopped by
// Main; without pgbouncer installed such tests are skipped (failed in CI).
//
// Environment: DATABASE_URL (use this server), PG_BIN (directory of initdb
// and postgres), PGTEST_TMPDIR (where throwaway servers live; by default
// /dev/shm when it has room, which makes CREATE DATABASE several times
// faster than on a slow disk), PGBOUNCER (the pgbouncer binary), CI (true:
// fail rather than skip).
package pgtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the "postgres" database/sql driver
	"github.com/pgbackfill/backfill/internal/pgurl"
)

// Timeouts. Generous on purpose: they only bound how long a broken setup
// hangs, they are not assertions about speed.
const (
	startTimeout  = 2 * time.Minute  // Main: initdb + server start
	readyTimeout  = 60 * time.Second // Start: server accepting connections
	stopTimeout   = 30 * time.Second // Stop: fast shutdown before SIGKILL
	adminTimeout  = 60 * time.Second // one CREATE/DROP DATABASE
	portAttempts  = 5                // Start: retries when the port was taken
	logTailBytes  = 4096             // server log tail shown in errors
	tempDirPrefix = "pgtest-"
	ownerFile     = "owner.pid"
)

// Server is a throwaway PostgreSQL server started by [Start] or
// [StartWith]. It listens on 127.0.0.1 (and [Options.ListenAddresses]) on
// a free port and on a unix socket in its temporary directory.
type Server struct {
	dir     string // temporary directory, removed by Stop
	dataDir string
	logPath string
	port    int
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the postmaster has exited
	waitErr error         // set before exited is closed
	bin     string
	cred    *syscall.Credential
	opts    Options

	stopOnce sync.Once
	stopErr  error
}

// URL returns the URL of the server's postgres database, as the postgres
// superuser over TCP.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Port returns the TCP port the server listens on.
func (s *Server) Port() int { return s.port }

// SocketDir returns the directory of the server's unix socket, usable as
// host=DIR in a connection string.
func (s *Server) SocketDir() string { return s.dir }

// LogTail returns the last few KiB of the server's log.
func (s *Server) LogTail() string { return readTail(s.logPath) }

// Stop shuts the server down (fast shutdown, then SIGKILL if it does not
// exit in time) and removes its temporary directory. It is safe to call
// more than once and from several goroutines.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() { s.stopErr = s.stop() })
	return s.stopErr
}

func (s *Server) stop() error {
	var errs []error
	if s.cmd != nil && s.cmd.Process != nil {
		select {
		case <-s.exited:
		default:
			// SIGINT is PostgreSQL's "fast" shutdown: roll back open
			// transactions, disconnect clients, exit.
			_ = s.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-s.exited:
			case <-time.After(stopTimeout):
				// The postmaster runs in its own process group
				// (Setpgid), so this also gets its children.
				_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
				<-s.exited
				errs = append(errs, fmt.Errorf("pgtest: server did not stop within %v, killed it", stopTimeout))
			}
		}
	}
	if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, fmt.Errorf("pgtest: removing %s: %w", s.dir, err))
	}
	return errors.Join(errs...)
}

// RestartImmediate restarts the server as `pg_ctl restart -m immediate`
// does: SIGQUIT to the postmaster, which ends every backend at once
// without a checkpoint (clients see their connections drop), then a start
// on the same data directory and port, which recovers from the WAL. down,
// if not nil, is called once the server is down, before it starts again
// (clients then get "connection refused"). It returns once the server
// accepts connections again. Not safe concurrently with Stop.
func (s *Server) RestartImmediate(ctx context.Context, down func()) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return errors.New("pgtest: restart: server not started")
	}
	_ = s.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
	if down != nil {
		down()
	}
	var (
		next *Server
		err  error
	)
	// The old postmaster's children may hold the port for a moment.
	for attempt := 1; attempt <= portAttempts; attempt++ {
		if next, err = startPostgres(ctx, s.bin, s.dir, s.dataDir, s.cred, s.port, s.opts); err == nil || !errors.Is(err, errPortInUse) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("pgtest: restart: %w", err)
	}
	s.cmd, s.exited = next.cmd, next.exited
	return nil
}

// Start starts a throwaway PostgreSQL server: initdb into a new temporary
// directory (under $PGTEST_TMPDIR, else $TMPDIR, else /dev/shm when it has
// room, else the system temp dir), then postgres with settings that favour
// test speed over durability (fsync off and so on). It returns once the
// server accepts connections. The caller must call [Server.Stop].
//
// The binaries are found through the PG_BIN environment variable, else
// `pg_config --bindir`, else the highest /usr/lib/postgresql/*/bin, else
// PATH. When running as root, initdb and postgres run as the "postgres"
// system user, since PostgreSQL refuses to run as root.
func Start(ctx context.Context) (*Server, error) { return StartWith(ctx, Options{}) }

// Options are the settings of [StartWith] beyond [Start]'s.
type Options struct {
	// ListenAddresses are IPv4 addresses the server listens on besides
	// 127.0.0.1. They must exist on the machine when the server starts
	// (and when it restarts).
	ListenAddresses []string
	// TrustNetworks are CIDR networks (e.g. "10.200.0.0/16") whose
	// clients pg_hba.conf lets in without a password, besides the local
	// ones.
	TrustNetworks []string
	// SynchronousCommit keeps synchronous_commit on (Start turns it off):
	// an acknowledged COMMIT then survives [Server.RestartImmediate],
	// which loses the WAL not yet written. fsync stays off (unless
	// Durable): the machine itself does not crash.
	SynchronousCommit bool
	// Durable keeps production durability: fsync, full_page_writes and
	// synchronous_commit on, for benchmarks beside a live load
	// (cmd/bench/lock, cmd/bench/load's durable runs); its directory is on
	// disk, never in /dev/shm (unless PGTEST_TMPDIR names a directory
	// there).
	Durable bool
}

// BinDir returns the directory of the PostgreSQL binaries the servers
// use (pgbench is there too).
func BinDir() (string, error) { return findBinDir() }

// StartWith is [Start] with opts: more listen addresses, trusted
// networks, synchronous_commit on.
func StartWith(ctx context.Context, opts Options) (srv *Server, err error) {
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	removeStaleDirs()

	dir, err := makeTempDir(cred, opts.Durable)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()

	dataDir := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", dataDir,
		"-A", "trust",
		"-U", "postgres",
		"-E", "UTF8",
		"--locale=C",
		"--no-sync",
	)
	initdb.Dir = dir
	initdb.Env = childEnv()
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb (%s) failed: %w\n%s", initdb.Path, err, tail(out))
	}
	hba := ""
	for _, n := range opts.TrustNetworks {
		hba += fmt.Sprintf("host all all %s trust\n", n)
	}
	if err := appendFile(filepath.Join(dataDir, "pg_hba.conf"), hba); err != nil {
		return nil, err
	}

	for attempt := 1; ; attempt++ {
		srv, err = startPostgres(ctx, bin, dir, dataDir, cred, 0, opts)
		if err == nil || !errors.Is(err, errPortInUse) || attempt == portAttempts {
			return srv, err
		}
	}
}

var errPortInUse = errors.New("port in use")

// startPostgres starts postgres on dataDir, listening on port (0: a free
// one).
func startPostgres(ctx context.Context, bin, dir, dataDir string, cred *syscall.Credential, port int, opts Options) (*Server, error) {
	var err error
	if port == 0 {
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	logPath := filepath.Join(dir, "postgres.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	defer logFile.Close() // the child has its own copy

	syncCommit, fsync := "off", "off"
	if opts.SynchronousCommit || opts.Durable {
		syncCommit = "on"
	}
	if opts.Durable {
		fsync = "on"
	}
	settings := []string{
		"listen_addresses=" + strings.Join(append([]string{"127.0.0.1"}, opts.ListenAddresses...), ","),
		"port=" + strconv.Itoa(port),
		"unix_socket_directories=" + dir,
		"fsync=" + fsync,
		"synchronous_commit=" + syncCommit,
		"full_page_writes=" + fsync,
		"max_connections=200",
		"shared_buffers=128MB",
		"max_wal_size=1GB",
		"checkpoint_timeout=30min",
		"log_min_messages=warning",
		"log_min_error_statement=panic", // keep test errors out of the log
	}
	args := []string{"-D", dataDir}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	// Not CommandContext: ctx bounds the start, not the server's life.
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.Dir = dir
	cmd.Env = childEnv()
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: cred,
		// Own process group: a terminal's ^C reaches the test binary,
		// which stops the server in order, not the server directly.
		Setpgid: true,
		// If the test binary dies without stopping the server (say a
		// go test -timeout panic), the kernel tells the postmaster,
		// which then does an immediate shutdown.
		Pdeathsig: syscall.SIGQUIT,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgtest: starting %s: %w", cmd.Path, err)
	}
	s := &Server{
		dir:     dir,
		dataDir: dataDir,
		logPath: logPath,
		port:    port,
		cmd:     cmd,
		exited:  make(chan struct{}),
		bin:     bin,
		cred:    cred,
		opts:    opts,
	}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()

	if err := s.waitReady(ctx); err != nil {
		logTail := readTail(logPath)
		select {
		case <-s.exited:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-s.exited
		}
		if strings.Contains(logTail, "could not bind") || strings.Contains(logTail, "already in use") {
			return nil, fmt.Errorf("pgtest: port %d: %w", port, errPortInUse)
		}
		return nil, fmt.Errorf("%w\n--- server log (%s) ---\n%s", err, logPath, logTail)
	}
	return s, nil
}

// waitReady polls until the server accepts a connection, the postmaster
// exits, ctx is done or readyTimeout passes.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	db, err := sql.Open("postgres", s.URL()+"&connect_timeout=5")
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer db.Close()
	var last error
	for {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		last = db.PingContext(pctx)
		pcancel()
		if last == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("pgtest: postgres exited during startup: %v", s.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("pgtest: postgres not ready on port %d: %w (last error: %v)", s.port, ctx.Err(), last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// findBinDir returns the directory holding initdb and postgres.
func findBinDir() (string, error) {
	if d := os.Getenv("PG_BIN"); d != "" {
		if !hasServerBinaries(d) {
			return "", fmt.Errorf("pgtest: PG_BIN=%s has no initdb and postgres", d)
		}
		return d, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); hasServerBinaries(d) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		return versionLess(filepath.Base(filepath.Dir(dirs[j])), filepath.Base(filepath.Dir(dirs[i])))
	})
	for _, d := range dirs {
		if hasServerBinaries(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if d := filepath.Dir(p); hasServerBinaries(d) {
			return d, nil
		}
	}
	return "", errors.New("pgtest: no PostgreSQL server binaries (initdb, postgres) found: " +
		"set PG_BIN or DATABASE_URL, or install PostgreSQL (apt-get install postgresql)")
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// versionLess compares dotted version strings numerically ("9.6" < "15").
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		ai, aerr := strconv.Atoi(as[i])
		bi, berr := strconv.Atoi(bs[i])
		if aerr != nil || berr != nil {
			if as[i] != bs[i] {
				return as[i] < bs[i]
			}
			continue
		}
		if ai != bi {
			return ai < bi
		}
	}
	return len(as) < len(bs)
}

// credential returns the postgres system user's credential when running as
// root, and nil otherwise.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root, and PostgreSQL refuses to: "+
			"need the postgres system user to run it as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtest: postgres uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtest: postgres gid %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// makeTempDir creates the server's directory, owned by the user the server
// runs as, and records the creating process for removeStaleDirs. A
// durable server's directory is on disk (not /dev/shm, where fsync costs
// nothing) unless PGTEST_TMPDIR says otherwise.
func makeTempDir(cred *syscall.Credential, durable bool) (string, error) {
	base := baseDir()
	if durable && base == shmDir {
		base = os.TempDir()
	}
	if cred != nil && !othersCanTraverse(base) {
		// The server user must reach its directory; a TMPDIR under
		// root's home would not do.
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, tempDirPrefix)
	if err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("pgtest: %w", err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return "", fmt.Errorf("pgtest: %w", err)
		}
	}
	return dir, nil
}

// shmDir is a RAM-backed file system. On a slow disk, a server in it
// creates a database many times faster (CREATE DATABASE copies ~7 MB).
const (
	shmDir     = "/dev/shm"
	shmMinFree = 2 << 30
)

// baseDir is where server directories go: $PGTEST_TMPDIR if set, else
// $TMPDIR if set, else /dev/shm if it is writable with at least 2 GiB free,
// else the system temp dir.
func baseDir() string {
	if d := os.Getenv("PGTEST_TMPDIR"); d != "" {
		return d
	}
	if os.Getenv("TMPDIR") == "" && shmUsable() {
		return shmDir
	}
	return os.TempDir()
}

func shmUsable() bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs(shmDir, &st); err != nil {
		return false
	}
	if uint64(st.Bavail)*uint64(st.Bsize) < shmMinFree {
		return false
	}
	return syscall.Access(shmDir, 0x2 /* W_OK */) == nil
}

// othersCanTraverse reports whether every directory from / down to dir is
// searchable by any user.
func othersCanTraverse(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

// removeStaleDirs removes the directories of servers whose test binary died
// without stopping them (killed, or a go test -timeout panic): the ones
// whose creating process and postmaster are both gone.
func removeStaleDirs() {
	seen := map[string]bool{}
	for _, base := range []string{baseDir(), os.TempDir(), shmDir, "/tmp"} {
		if seen[base] {
			continue
		}
		seen[base] = true
		dirs, _ := filepath.Glob(filepath.Join(base, tempDirPrefix+"*"))
		for _, d := range dirs {
			owner := readPid(filepath.Join(d, ownerFile))
			if owner == 0 || pidAlive(owner) {
				continue // not (yet) ours to judge, or still in use
			}
			// postmaster.pid exists while the server runs.
			pmFile := filepath.Join(d, "data", "postmaster.pid")
			if fileExists(pmFile) {
				if pm := readPid(pmFile); pm == 0 || pidAlive(pm) {
					continue
				}
			}
			_ = os.RemoveAll(d)
		}
	}
}

// readPid returns the number on the first line of path, or 0.
func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// childEnv is the environment minus PG* variables that could point the
// server or its tools elsewhere, with the C locale.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LANG=C", "LC_ALL=C")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if _, err := f.WriteString(text); err != nil {
		_ = f.Close()
		return fmt.Errorf("pgtest: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}

func readTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > logTailBytes {
		_, _ = f.Seek(-logTailBytes, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

func tail(b []byte) string {
	if len(b) > logTailBytes {
		b = b[len(b)-logTailBytes:]
	}
	return string(b)
}

// ---------------------------------------------------------------------------
// Test binary state: Main, New, NewURL, AdminURL.

var state struct {
	mu          sync.Mutex
	mainCalled  bool
	adminURL    string // "" when no server
	unavailable string // why there is no server
	throwaway   bool   // the server is Main's own, gone when the binary exits
	admin       *sql.DB
	unowned     []string // databases of Database, dropped when Main's tests pass
}

// inCI reports whether the CI environment variable says we run in CI.
func inCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

// Main is for TestMain: func TestMain(m *testing.M) { pgtest.Main(m) }.
//
// It uses DATABASE_URL when set, else starts a throwaway server that it
// stops after the tests (and on SIGINT/SIGTERM). It runs the tests and
// exits with their status. Without a server it exits 1 when [Required]
// (BACKFILL_REQUIRE_POSTGRES=1 or CI=true);
// elsewhere it prints a note and the tests that call New are skipped.
//
// m is usually the *testing.M of TestMain; a wrapper of it that checks
// something after the tests may stand in for it.
func Main(m interface{ Run() int }) {
	os.Exit(run(m))
}

func run(m interface{ Run() int }) int {
	var srv *Server
	adminURL, reason := os.Getenv("DATABASE_URL"), ""
	if adminURL != "" {
		if err := pgurl.Check(adminURL); err != nil {
			adminURL, reason = "", fmt.Sprintf("DATABASE_URL refused: %v", err)
		} else if err := ping(adminURL); err != nil {
			adminURL, reason = "", fmt.Sprintf("DATABASE_URL server unreachable: %v", err)
		}
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		s, err := Start(ctx)
		cancel()
		if err != nil {
			reason = err.Error()
		} else {
			srv, adminURL = s, s.URL()
		}
	}

	state.mu.Lock()
	state.mainCalled, state.adminURL, state.unavailable = true, adminURL, reason
	state.throwaway = srv != nil
	state.mu.Unlock()

	if adminURL == "" {
		if Required(Postgres) {
			fmt.Fprintf(os.Stderr, "pgtest: no PostgreSQL server (BACKFILL_REQUIRE_POSTGRES or CI is set): %s\n", reason)
			return 1
		}
		fmt.Fprintf(os.Stderr, "pgtest: SKIP: no PostgreSQL server, tests that need one are skipped: %s\n", reason)
	}

	if srv != nil {
		stopServer = func() {
			closeAdmin()
			stopPooler()
			_ = srv.Stop()
		}
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		done := make(chan struct{})
		defer func() {
			signal.Stop(sigs)
			close(done)
		}()
		go func() {
			select {
			case sig := <-sigs:
				fmt.Fprintf(os.Stderr, "pgtest: %v: stopping the test server\n", sig)
				stopServer()
				os.Exit(1)
			case <-done:
			}
		}()
		defer func() {
			closeAdmin()
			if err := srv.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}()
	}
	code := m.Run()
	stopPooler()
	dropUnowned(code == 0)
	return code
}

// Database creates a fresh database for code that has no testing.TB, such
// as a runnable example, and returns its URL. It is dropped when the tests
// of [Main] end, if they all passed (kept and listed otherwise, like
// [New]'s). It panics when there is no server.
func Database(prefix string) string {
	state.mu.Lock()
	u := state.adminURL
	if !state.mainCalled {
		u = os.Getenv("DATABASE_URL")
	}
	state.mu.Unlock()
	if u == "" {
		panic("pgtest: no PostgreSQL server for " + prefix)
	}
	name := databaseName(prefix)
	du, err := withDatabase(u, name)
	if err != nil {
		panic(err)
	}
	admin, err := sql.Open("postgres", u)
	if err != nil {
		panic(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+quoteIdent(name)+" TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"); err != nil {
		panic(fmt.Sprintf("pgtest: creating database %s: %v", name, err))
	}
	state.mu.Lock()
	state.unowned = append(state.unowned, name)
	state.mu.Unlock()
	return du
}

// dropUnowned drops the databases of [Database] when passed, or lists
// them as kept.
func dropUnowned(passed bool) {
	state.mu.Lock()
	names, u := state.unowned, state.adminURL
	state.unowned = nil
	state.mu.Unlock()
	if len(names) == 0 || u == "" {
		return
	}
	if !passed {
		fmt.Fprintf(os.Stderr, "pgtest: tests failed, keeping databases %s\n", strings.Join(names, ", "))
		return
	}
	admin, err := sql.Open("postgres", u)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		return
	}
	defer admin.Close()
	for _, name := range names {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+quoteIdent(name)+" WITH (FORCE)"); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: dropping database %s: %v\n", name, err)
		}
		cancel()
	}
}

func ping(u string) error {
	db, err := sql.Open("postgres", u)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

func closeAdmin() {
	state.mu.Lock()
	defer state.mu.Unlock()
	if state.admin != nil {
		_ = state.admin.Close()
		state.admin = nil
	}
}

// AdminURL returns the URL of the server the tests use, connected to its
// maintenance database (DATABASE_URL, or the throwaway server's postgres
// database), or "" when there is none. Without [Main] it is DATABASE_URL.
func AdminURL() string {
	state.mu.Lock()
	defer state.mu.Unlock()
	if !state.mainCalled {
		return os.Getenv("DATABASE_URL")
	}
	return state.adminURL
}

// adminDB returns the shared pool on the admin URL, or skips/fails t.
func adminDB(t testing.TB) (*sql.DB, string) {
	t.Helper()
	state.mu.Lock()
	defer state.mu.Unlock()
	u, reason := state.adminURL, state.unavailable
	if !state.mainCalled {
		u = os.Getenv("DATABASE_URL")
		reason = "DATABASE_URL is unset and TestMain does not call pgtest.Main"
	}
	if u == "" {
		if Required(Postgres) || !state.mainCalled {
			t.Fatalf("pgtest: no PostgreSQL server: %s", reason)
		}
		t.Skipf("pgtest: no PostgreSQL server: %s", reason)
	}
	if state.admin == nil {
		db, err := sql.Open("postgres", u)
		if err != nil {
			t.Fatalf("pgtest: opening %s: %v", redact(u), err)
		}
		db.SetMaxOpenConns(8)
		db.SetMaxIdleConns(8)
		state.admin = db
	}
	return state.admin, u
}

// New creates a fresh database for t and returns an open handle on it (lib/pq
// driver). When t ends the handle is closed and the database dropped if t
// passed, or kept and its URL logged if t failed. Safe for parallel tests.
func New(t testing.TB) *sqlx.DB {
	t.Helper()
	u := NewURL(t)
	db, err := sqlx.Open("postgres", u)
	if err != nil {
		t.Fatalf("pgtest: opening %s: %v", redact(u), err)
	}
	// Registered after NewURL's cleanup, so it runs before the drop.
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("pgtest: connecting to %s: %v", redact(u), err)
	}
	return db
}

// NewURL is [New] returning the URL of the new database instead of a handle,
// for tests that open several connections or start other processes.
func NewURL(t testing.TB) string {
	t.Helper()
	admin, adminURL := adminDB(t)
	name := databaseName(t.Name())
	u, err := withDatabase(adminURL, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	q := "CREATE DATABASE " + quoteIdent(name) +
		" TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"
	if _, err := admin.ExecContext(ctx, q); err != nil {
		t.Fatalf("pgtest: creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		t.Helper()
		release(t, admin, name, u)
	})
	watch(t)
	return u
}

// release ends a database's life with its test: dropped if the test passed,
// kept and logged if it failed.
func release(t testing.TB, admin *sql.DB, name, u string) {
	t.Helper()
	if keepDatabase(t.Failed()) {
		state.mu.Lock()
		throwaway := state.throwaway
		state.mu.Unlock()
		note := ""
		if throwaway {
			note = " (on this test binary's throwaway server, removed when it exits:" +
				" set DATABASE_URL to a server of yours to inspect kept databases)"
		}
		t.Logf("pgtest: test failed, keeping database %s: %s%s", name, redact(u), note)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	// WITH (FORCE) ends connections the code under test leaked.
	_, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+quoteIdent(name)+" WITH (FORCE)")
	if err != nil && strings.Contains(err.Error(), "syntax error") { // before PostgreSQL 13
		_, err = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+quoteIdent(name))
	}
	if err != nil {
		t.Errorf("pgtest: dropping database %s: %v", name, err)
	}
}

// keepDatabase says whether a test's database outlives it.
func keepDatabase(failed bool) bool { return failed }

// databaseName derives a unique database name from a test name:
// pgtest_<sanitized test name>_<random hex>, at most 63 bytes.
func databaseName(testName string) string {
	var b strings.Builder
	lastUnderscore := false
	for _, r := range strings.ToLower(testName) {
		ok := (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9')
		switch {
		case ok:
			b.WriteRune(r)
			lastUnderscore = false
		case !lastUnderscore:
			b.WriteByte('_')
			lastUnderscore = true
		}
	}
	s := strings.Trim(b.String(), "_")
	const maxStem = 63 - len("pgtest_") - len("_") - 12
	if len(s) > maxStem {
		s = strings.TrimRight(s[:maxStem], "_")
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	if s == "" {
		return "pgtest_" + hex.EncodeToString(rnd[:])
	}
	return "pgtest_" + s + "_" + hex.EncodeToString(rnd[:])
}

// withDatabase returns connection string u pointed at database name. u is a
// postgres:// URL or a key=value connection string.
func withDatabase(u, name string) (string, error) {
	if strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://") {
		p, err := url.Parse(u)
		if err != nil {
			return "", fmt.Errorf("parsing DATABASE_URL: %w", err)
		}
		p.Path = "/" + name
		p.RawPath = ""
		return p.String(), nil
	}
	// key=value form: lib/pq lets a later key override an earlier one.
	return strings.TrimSpace(u) + " dbname=" + name, nil
}

// redact hides a password in a URL for logging.
func redact(u string) string {
	if p, err := url.Parse(u); err == nil && p.User != nil {
		return p.Redacted()
	}
	return u
}

func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}
