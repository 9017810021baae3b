package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/pgurl"
)

// chunkedVariants are the variants of the -rss and -profile loads.
var chunkedVariants = []string{"lib", "base"}

func variantName(v string) string {
	switch v {
	case "lib":
		return "library"
	case "base":
		return "baseline"
	}
	return v
}

// bench is the parent: it owns the benchmark database and runs children.
type bench struct {
	o        options
	server   string // fast, durable or url
	adminURL string
	url      string // the benchmark database
	dbName   string
	db       *sqlx.DB
	exe      string
	out      io.Writer
	facts    facts
}

type facts struct {
	Server      string            `json:"server"`
	Version     string            `json:"version"`
	Settings    map[string]string `json:"settings"`
	NumCPU      int               `json:"nproc"`
	GOMAXPROCS  int               `json:"gomaxprocs"`
	CPU         string            `json:"cpu"`
	MemTotalKiB int64             `json:"mem_total_kib"`
	GoVersion   string            `json:"go_version"`
	Kernel      string            `json:"kernel"`
	Started     time.Time         `json:"started"`
}

func runParent(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	for i, server := range o.servers {
		if i > 0 {
			fmt.Fprintln(os.Stdout)
		}
		b := &bench{o: o, server: server, exe: exe, out: os.Stdout}
		if err := b.run(ctx); err != nil {
			return fmt.Errorf("%s server: %w", server, err)
		}
	}
	return nil
}

// run runs the whole suite, and the extras asked for, on b.server.
func (b *bench) run(ctx context.Context) error {
	o := b.o
	b.facts.Started = time.Now().UTC()
	switch b.server {
	case "url":
		b.adminURL = os.Getenv("DATABASE_URL")
		b.facts.Server = "DATABASE_URL"
		if err := pgurl.Check(b.adminURL); err != nil {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
	default:
		durable := b.server == "durable"
		progress("starting a throwaway %s server (pgtest.StartWith, Durable %t)", b.server, durable)
		sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		srv, err := pgtest.StartWith(sctx, pgtest.Options{Durable: durable})
		cancel()
		if err != nil {
			return err
		}
		defer func() {
			if err := srv.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "benchload:", err)
			}
		}()
		b.adminURL = srv.URL()
		b.facts.Server = "fast: throwaway (pgtest.Start: fsync=off, synchronous_commit=off, full_page_writes=off)"
		if durable {
			b.facts.Server = "durable: throwaway (pgtest.StartWith Durable: fsync, full_page_writes, synchronous_commit on)"
		}
	}
	if err := b.createDB(ctx); err != nil {
		return err
	}
	defer b.dropDB()
	if err := b.gatherFacts(ctx); err != nil {
		return err
	}
	b.printFacts()

	var rs []result
	if !(o.skip && o.skipOnly) {
		var err error
		if rs, err = b.suite(ctx); err != nil { // suite.go
			return err
		}
		b.printSuite(rs)
	}
	if o.skip {
		sm, err := b.skipBench(ctx) // skip.go
		if err != nil {
			return err
		}
		b.printSkip(sm)
	}
	var rss []childResult
	if o.rss {
		var err error
		if rss, err = b.rssCompare(ctx); err != nil {
			return err
		}
		b.printRSS(rss, rs)
	}
	if o.profile != "" {
		if err := b.profileRun(ctx); err != nil {
			return err
		}
	}
	b.printMachine(rs, rss)
	return nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchload: "+format+"\n", args...)
}

// createDB creates a fresh database for the benchmark on the server.
func (b *bench) createDB(ctx context.Context) error {
	admin, err := sqlx.Open("postgres", b.adminURL)
	if err != nil {
		return err
	}
	defer admin.Close()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	b.dbName = "benchload_" + hex.EncodeToString(rnd[:])
	if _, err := admin.ExecContext(ctx, `CREATE DATABASE `+b.dbName+` TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'`); err != nil {
		return fmt.Errorf("creating the benchmark database (the DATABASE_URL role needs CREATEDB): %w", err)
	}
	if b.url, err = withDatabase(b.adminURL, b.dbName); err != nil {
		return err
	}
	if b.db, err = sqlx.Open("postgres", b.url); err != nil {
		return err
	}
	_, err = b.db.ExecContext(ctx, `CREATE SCHEMA `+benchSchema+`;
		CREATE TABLE `+benchSchema+`.base_manifest (run text NOT NULL, chunk_id text NOT NULL, lo bigint NOT NULL, hi bigint NOT NULL,
			rows_read bigint NOT NULL, rows_written bigint NOT NULL, done_at timestamptz NOT NULL, PRIMARY KEY (run, chunk_id))`)
	return err
}

func (b *bench) dropDB() {
	if b.db != nil {
		b.db.Close()
	}
	if b.o.keep && b.facts.Server == "DATABASE_URL" {
		progress("keeping database %s", b.dbName)
		return
	}
	admin, err := sqlx.Open("postgres", b.adminURL)
	if err != nil {
		return
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := admin.ExecContext(ctx, `DROP DATABASE IF EXISTS `+b.dbName+` WITH (FORCE)`); err != nil {
		fmt.Fprintf(os.Stderr, "benchload: dropping database %s: %v\n", b.dbName, err)
	}
}

func (b *bench) gatherFacts(ctx context.Context) error {
	f := &b.facts
	if err := b.db.GetContext(ctx, &f.Version, `SELECT version()`); err != nil {
		return err
	}
	f.Settings = map[string]string{}
	for _, name := range []string{"server_version", "shared_buffers", "work_mem", "maintenance_work_mem", "fsync", "synchronous_commit",
		"full_page_writes", "wal_level", "wal_compression", "data_checksums", "max_wal_size", "autovacuum", "jit"} {
		var v string
		if err := b.db.GetContext(ctx, &v, `SELECT current_setting($1)`, name); err == nil {
			f.Settings[name] = v
		}
	}
	f.NumCPU, f.GOMAXPROCS, f.GoVersion = runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				f.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	f.MemTotalKiB = procStatusKiB("/proc/meminfo", "MemTotal")
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		f.Kernel = strings.TrimSpace(string(b))
	}
	return nil
}

func (b *bench) printFacts() {
	f := b.facts
	w := b.out
	fmt.Fprintf(w, "# benchload on the %s server: the library against a hand-written chunked load, whole processes\n\n", b.server)
	fmt.Fprintf(w, "- command: `%s`\n", commandLine(b.o.args))
	fmt.Fprintf(w, "- PostgreSQL: %s\n", f.Version)
	fmt.Fprintf(w, "- server: %s\n", f.Server)
	keys := make([]string, 0, len(f.Settings))
	for k := range f.Settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var kv []string
	for _, k := range keys {
		kv = append(kv, k+"="+f.Settings[k])
	}
	fmt.Fprintf(w, "- settings: %s\n", strings.Join(kv, ", "))
	fmt.Fprintf(w, "- machine: nproc=%d, GOMAXPROCS=%d, cpu=%q, memory=%.1f GiB, kernel %s, %s, %s/%s; client and server on the same machine\n",
		f.NumCPU, f.GOMAXPROCS, f.CPU, float64(f.MemTotalKiB)/(1<<20), f.Kernel, f.GoVersion, runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(w, "- library defaults in effect: %s\n", libDefaults())
	fmt.Fprintf(w, "- main variant (library defaults): %s; ExtractAhead %s, SkipUnchanged %s (-main-ahead, -main-skip); Concurrency %s (-lib-concurrency)\n",
		mainVariantDoc, optName(b.o.mainAhead), optName(b.o.mainSkip), concurrencyName(b.o.libConcurrency))
	if b.o.libOptions != "" {
		fmt.Fprintf(w, "- EXPERIMENT: the library's sessions run with options %q (-lib-options); the baseline's do not\n", b.o.libOptions)
	}
	fmt.Fprintf(w, "- load: %s rows, %s-row chunks (IntRange over ids; small chunks %s rows), %d rounds\n\n",
		thousands(b.o.rows), thousands(b.o.chunk), thousands(b.o.smallChunk), b.o.runs)
}

// commandLine is the invocation as a shell would take it.
func commandLine(args []string) string {
	parts := []string{"go run ./cmd/bench/load"}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"$`\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

func optName(o optIn) string {
	if o == optDefault {
		return "the library's default"
	}
	return "explicitly " + string(o)
}

func concurrencyName(n int) string {
	if n == 0 {
		return "the library's default"
	}
	return strconv.Itoa(n)
}

func (b *bench) freshTable(ctx context.Context, table string) error {
	_, err := b.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+table+`; `+createTargetSQL(table))
	return err
}

// checkpoint starts each measured window from a checkpoint, so that full
// page images (when full_page_writes is on) hit both variants alike. It
// needs a superuser or pg_checkpoint; without, it is skipped.
func (b *bench) checkpoint(ctx context.Context) {
	_, _ = b.db.ExecContext(ctx, `CHECKPOINT`)
}

func (b *bench) lsn(ctx context.Context) string {
	var s string
	if err := b.db.GetContext(ctx, &s, `SELECT pg_current_wal_lsn()::text`); err != nil {
		progress("pg_current_wal_lsn: %v", err)
	}
	return s
}

func (b *bench) walSince(ctx context.Context, from string) int64 {
	var n int64
	if err := b.db.GetContext(ctx, &n, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, from); err != nil {
		progress("pg_wal_lsn_diff: %v", err)
		return -1
	}
	return n
}

// autovac counts the autovacuum and autoanalyze runs so far on any table
// of the benchmark database, catalogs included (the baseline's temp table
// per chunk churns pg_class and pg_attribute): their WAL lands in whatever
// window they run in.
func (b *bench) autovac(ctx context.Context) int64 {
	var n int64
	_ = b.db.GetContext(ctx, &n, `SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0)::bigint FROM pg_stat_all_tables`)
	return n
}

// quiesce waits (up to a minute) until no autovacuum worker runs, so that
// a measured window does not start in the middle of one.
func (b *bench) quiesce(ctx context.Context) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		var n int
		if err := b.db.GetContext(ctx, &n, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'`); err != nil || n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// child runs one load in a child process and returns its result.
func (b *bench) child(ctx context.Context, c childOpts) (childResult, error) {
	args := []string{"-child=" + c.variant, "-table=" + c.table, "-job=" + c.job,
		fmt.Sprintf("-rows=%d", c.rows), fmt.Sprintf("-chunk=%d", c.chunk), fmt.Sprintf("-lo=%d", c.lo)}
	if c.newRun {
		args = append(args, "-newrun")
	}
	if c.variant == "lib" {
		args = append(args, fmt.Sprintf("-concurrency=%d", b.o.libConcurrency), "-ahead="+string(c.ahead), "-skipunchanged="+string(c.skip))
	}
	if c.restate != 0 {
		args = append(args, fmt.Sprintf("-restate=%d", c.restate))
	}
	if c.byOrder {
		args = append(args, "-byorder", fmt.Sprintf("-correct=%d", c.correct), fmt.Sprintf("-versioned=%t", c.versioned))
	}
	if c.variant == "lib" && b.o.libOptions != "" {
		args = append(args, "-pgoptions="+b.o.libOptions)
	}
	for flagName, v := range map[string]string{"cpuprofile": c.cpuProfile, "breakdown": c.breakdown, "explain": c.explain, "sqlout": c.sqlOut} {
		if v != "" {
			args = append(args, "-"+flagName+"="+v)
		}
	}
	cmd := exec.CommandContext(ctx, b.exe, args...)
	cmd.Env = append(os.Environ(), envURL+"="+b.url)
	cmd.Stderr = os.Stderr
	busy0, start := machineBusyCPU(), time.Now()
	out, err := cmd.Output()
	busy, wall := machineBusyCPU()-busy0, time.Since(start)
	if err != nil {
		return childResult{}, fmt.Errorf("child %s: %w", strings.Join(args, " "), err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), resultPrefix); ok {
			var r childResult
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				return r, fmt.Errorf("child result: %w", err)
			}
			// The whole process, exec to exit.
			r.ProcSeconds = wall.Seconds()
			r.OtherCPU = max(busy-r.UserCPU-r.SysCPU-max(r.ServerCPU, 0), 0)
			return r, nil
		}
	}
	return childResult{}, errors.New("child printed no result line")
}

// machineBusyCPU returns the busy CPU seconds of the whole machine since
// boot (/proc/stat: everything but idle and iowait), or 0.
func machineBusyCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy float64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is already in user
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy / 100 // USER_HZ
}

// rssCompare loads o.rssRows rows with each variant, each in a fresh
// table and a fresh child, for the peak RSS.
func (b *bench) rssCompare(ctx context.Context) ([]childResult, error) {
	var rs []childResult
	for _, n := range b.o.rssRows {
		for _, v := range chunkedVariants {
			table := fmt.Sprintf("%s.rss_%s_%d", benchSchema, v, n)
			if err := b.freshTable(ctx, table); err != nil {
				return nil, err
			}
			progress("rss: %s: %s rows", variantName(v), thousands(n))
			r, err := b.child(ctx, childOpts{variant: v, table: table, job: fmt.Sprintf("benchload-rss-%s-%d", v, n), rows: n, chunk: b.o.chunk})
			if err != nil {
				return nil, err
			}
			if r.Counts.Inserted != n {
				return nil, fmt.Errorf("rss %s: counts %+v, want %d inserted", table, r.Counts, n)
			}
			rs = append(rs, r)
			if _, err := b.db.ExecContext(ctx, `DROP TABLE `+table); err != nil {
				return nil, err
			}
		}
	}
	return rs, nil
}

// withDatabase points connection string u at database name.
func withDatabase(u, name string) (string, error) {
	if strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://") {
		p, err := url.Parse(u)
		if err != nil {
			return "", fmt.Errorf("parsing DATABASE_URL: %w", err)
		}
		p.Path, p.RawPath = "/"+name, ""
		return p.String(), nil
	}
	return strings.TrimSpace(u) + " dbname=" + name, nil
}

// withParams adds connection parameters to u (URL or key=value form).
func withParams(u string, params map[string]string) (string, error) {
	if strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://") {
		p, err := url.Parse(u)
		if err != nil {
			return "", err
		}
		q := p.Query()
		for k, v := range params {
			q.Set(k, v)
		}
		p.RawQuery = q.Encode()
		return p.String(), nil
	}
	var b strings.Builder
	b.WriteString(strings.TrimSpace(u))
	for k, v := range params {
		fmt.Fprintf(&b, " %s='%s'", k, strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v))
	}
	return b.String(), nil
}
