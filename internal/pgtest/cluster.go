package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Cluster is a throwaway PostgreSQL server managed with pg_ctl, for tests
// that restart it (a crash: [Cluster.RestartImmediate]) or need it on more
// addresses than 127.0.0.1. It runs with [Start]'s test-speed settings,
// except that synchronous_commit stays on. Unlike a [Server], it is not a child of the test
// binary: the caller must call [Cluster.Stop] (a later [StartCluster]
// stops the clusters of test binaries that died without doing so).
type Cluster struct {
	bin     string
	dir     string
	dataDir string
	logPath string
	port    int
	cred    *syscall.Credential
}

// ClusterOptions are the settings of [StartCluster].
type ClusterOptions struct {
	// ListenAddresses are IPv4 addresses the server listens on besides
	// 127.0.0.1. They must exist on the machine when the server starts.
	ListenAddresses []string
	// TrustNetworks are CIDR networks (e.g. "10.200.0.0/16") whose
	// clients pg_hba.conf lets in without a password, besides the local
	// ones.
	TrustNetworks []string
	// Durable keeps production durability: fsync and full_page_writes on
	// (and synchronous_commit on, as always), for benchmarks beside a
	// live load (internal/benchlock).
	Durable bool
}

// BinDir returns the directory of the PostgreSQL binaries the clusters
// use (pgbench is there too).
func BinDir() (string, error) { return findBinDir() }

// StartCluster runs initdb into a new temporary directory and starts the
// server with pg_ctl on a free port. It returns once the server accepts
// connections. As root, the server runs as the "postgres" system user.
func StartCluster(ctx context.Context, opts ClusterOptions) (c *Cluster, err error) {
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(bin, "pg_ctl")); err != nil {
		return nil, fmt.Errorf("pgtest: no pg_ctl beside initdb: %w", err)
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	stopStaleClusters(bin, cred)
	removeStaleDirs()
	dir, err := makeTempDir(cred)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	c = &Cluster{bin: bin, dir: dir, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "postgres.log"), cred: cred}
	if out, err := c.command(ctx, "initdb", "-D", c.dataDir, "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb failed: %w\n%s", err, tail(out))
	}
	hba := ""
	for _, n := range opts.TrustNetworks {
		hba += fmt.Sprintf("host all all %s trust\n", n)
	}
	if err := appendFile(filepath.Join(c.dataDir, "pg_hba.conf"), hba); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		c.port, err = freePort()
		if err != nil {
			return nil, err
		}
		conf := fmt.Sprintf("\n# pgtest.StartCluster\nlisten_addresses = '%s'\nport = %d\nunix_socket_directories = '%s'\n",
			strings.Join(append([]string{"127.0.0.1"}, opts.ListenAddresses...), ","), c.port, dir)
		// Unlike Start's server, synchronous_commit stays on: an immediate
		// restart loses WAL not yet written, and a suite that crashes the
		// server must not see an acknowledged COMMIT vanish (fsync can stay
		// off: the machine itself does not crash).
		durability := []string{"fsync = off", "full_page_writes = off"}
		if opts.Durable {
			durability = []string{"fsync = on", "full_page_writes = on", "synchronous_commit = on"}
		}
		for _, s := range append(durability,
			"max_connections = 300", "shared_buffers = 128MB", "max_wal_size = 1GB", "checkpoint_timeout = 30min",
			"log_min_messages = warning", "log_min_error_statement = panic") {
			conf += s + "\n"
		}
		if err := appendFile(filepath.Join(c.dataDir, "postgresql.conf"), conf); err != nil {
			return nil, err
		}
		out, err := c.ctl(ctx, "start")
		if err == nil {
			return c, nil
		}
		if attempt == portAttempts || !strings.Contains(readTail(c.logPath), "already in use") {
			return nil, fmt.Errorf("pgtest: pg_ctl start: %w\n%s\n--- server log ---\n%s", err, out, readTail(c.logPath))
		}
	}
}

// URL returns the URL of the server's postgres database as the postgres
// superuser over TCP on 127.0.0.1.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port returns the TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// Dir returns the cluster's temporary directory (data directory, server
// log, unix socket), owned by the user the server runs as.
func (c *Cluster) Dir() string { return c.dir }

// LogTail returns the last few KiB of the server's log.
func (c *Cluster) LogTail() string { return readTail(c.logPath) }

// RestartImmediate crashes the server and starts it again:
// pg_ctl restart -m immediate. Every connection is cut without a
// shutdown checkpoint and the server recovers from the WAL at start, as
// after a power loss of the server's host. It returns once the server
// accepts connections again.
func (c *Cluster) RestartImmediate(ctx context.Context) error {
	if out, err := c.ctl(ctx, "restart", "-m", "immediate"); err != nil {
		return fmt.Errorf("pgtest: pg_ctl restart -m immediate: %w\n%s\n--- server log ---\n%s", err, out, readTail(c.logPath))
	}
	return nil
}

// Stop stops the server (immediate shutdown: a throwaway server needs no
// checkpoint) and removes its directory.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	var err error
	if out, cerr := c.ctl(ctx, "stop", "-m", "immediate"); cerr != nil && fileExists(filepath.Join(c.dataDir, "postmaster.pid")) {
		err = fmt.Errorf("pgtest: pg_ctl stop: %w\n%s", cerr, out)
	}
	if rerr := os.RemoveAll(c.dir); rerr != nil && err == nil {
		err = fmt.Errorf("pgtest: removing %s: %w", c.dir, rerr)
	}
	return err
}

// ctl runs pg_ctl on the cluster, waiting for the operation to finish.
func (c *Cluster) ctl(ctx context.Context, args ...string) ([]byte, error) {
	args = append([]string{"-D", c.dataDir, "-l", c.logPath, "-w", "-t", strconv.Itoa(int(readyTimeout / time.Second))}, args...)
	cmd := c.command(ctx, "pg_ctl", args...)
	// pg_ctl's server must not keep the output pipes open (it outlives the
	// command): its output goes to the log file (-l), and ours to a file.
	outPath := filepath.Join(c.dir, "pg_ctl.out")
	f, err := os.OpenFile(outPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o666)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	err = cmd.Run()
	out, _ := os.ReadFile(outPath)
	return out, err
}

// command is one of the PostgreSQL binaries, run as the server's user.
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	cmd.Env = childEnv()
	// Own process group, so that a terminal's ^C reaches the test binary
	// only, which stops the cluster in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true}
	return cmd
}

// stopStaleClusters stops the clusters of test binaries that died without
// stopping them (their owner.pid process is gone, their postmaster is
// not); removeStaleDirs then removes their directories.
func stopStaleClusters(bin string, cred *syscall.Credential) {
	dirs, _ := filepath.Glob(filepath.Join(baseDir(), tempDirPrefix+"*"))
	for _, d := range dirs {
		if owner := readPid(filepath.Join(d, ownerFile)); owner == 0 || pidAlive(owner) {
			continue
		}
		pm := readPid(filepath.Join(d, "data", "postmaster.pid"))
		if pm == 0 || !pidAlive(pm) {
			continue
		}
		c := &Cluster{bin: bin, dir: d, dataDir: filepath.Join(d, "data"), logPath: filepath.Join(d, "postgres.log"), cred: cred}
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		_, _ = c.ctl(ctx, "stop", "-m", "immediate")
		cancel()
	}
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
