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

// variants are the loads measured side by side, alternating: the
// library, the hand-written chunked baseline, and "once": one COPY and
// one merge of all rows in one transaction (the baseline's statements
// with a single chunk), the practical limit of any chunked load.
var variants = []string{"lib", "base", "once"}

// chunkedVariants are the variants of the -rss and -profile loads.
var chunkedVariants = []string{"lib", "base"}

func variantName(v string) string {
	switch v {
	case "lib":
		return "library"
	case "base":
		return "baseline"
	case "once":
		return "one COPY + merge"
	}
	return v
}

// childVariant is the child's -child value of variant v, and its rows per
// chunk.
func (b *bench) childVariant(v string) (string, int64) {
	if v == "once" {
		return "base", b.o.rows
	}
	return v, b.o.chunk
}

// bench is the parent: it owns the benchmark database and runs children.
type bench struct {
	o        options
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

// measurement is one run of one variant: a first load and a replay.
type measurement struct {
	Variant   string      `json:"variant"`
	Run       int         `json:"run"`
	Load      childResult `json:"load"`
	Replay    childResult `json:"replay"`
	LoadWAL   int64       `json:"load_wal_bytes"`
	ReplayWAL int64       `json:"replay_wal_bytes"`
	// Autovacuum and autoanalyze runs in the benchmark database seen
	// during each window (their WAL is in the window's figure).
	LoadAutovac   int64 `json:"load_autovacuum_runs"`
	ReplayAutovac int64 `json:"replay_autovacuum_runs"`
}

func runParent(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	b := &bench{o: o, exe: exe, out: os.Stdout}
	b.facts.Started = time.Now().UTC()
	b.adminURL = os.Getenv("DATABASE_URL")
	b.facts.Server = "DATABASE_URL"
	if b.adminURL != "" {
		if err := pgurl.Check(b.adminURL); err != nil {
			return fmt.Errorf("DATABASE_URL: %w", err)
		}
	}
	if b.adminURL == "" {
		progress("DATABASE_URL is unset: starting a throwaway server (pgtest.Start)")
		sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		srv, err := pgtest.StartWith(sctx, pgtest.Options{Durable: o.durable})
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
		b.facts.Server = "throwaway (pgtest.Start: fsync=off, synchronous_commit=off, full_page_writes=off)"
		if o.durable {
			b.facts.Server = "throwaway, durable (pgtest.StartWith Durable: fsync, full_page_writes, synchronous_commit on)"
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

	var ms []measurement
	if !(o.skip && o.skipOnly) {
		if ms, err = b.endToEnd(ctx); err != nil {
			return err
		}
		b.printEndToEnd(ms)
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
		if rss, err = b.rssCompare(ctx); err != nil {
			return err
		}
		b.printRSS(rss, ms)
	}
	if o.profile != "" {
		if err := b.profileRun(ctx); err != nil {
			return err
		}
	}
	b.printMachine(ms, rss)
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
	fmt.Fprintf(w, "# benchload: library vs hand-written chunked load\n\n")
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
	fmt.Fprintf(w, "- machine: nproc=%d, GOMAXPROCS=%d, cpu=%q, memory=%.1f GiB, kernel %s, %s, %s/%s\n",
		f.NumCPU, f.GOMAXPROCS, f.CPU, float64(f.MemTotalKiB)/(1<<20), f.Kernel, f.GoVersion, runtime.GOOS, runtime.GOARCH)
	if b.o.libOptions != "" {
		fmt.Fprintf(w, "- EXPERIMENT: the library's sessions run with options %q (-lib-options); the baseline's do not\n", b.o.libOptions)
	}
	fmt.Fprintf(w, "- load: %s rows, %s-row chunks (IntRange over ids), %d runs per variant alternating, library Concurrency %d, extract ahead %t (baseline sequential); client and server on the same machine\n\n",
		thousands(b.o.rows), thousands(b.o.chunk), b.o.runs, b.o.libConcurrency, b.o.extractAhead)
}

// endToEnd runs each variant o.runs times, alternating, each into a fresh
// table: first load, then a replay of the same range.
func (b *bench) endToEnd(ctx context.Context) ([]measurement, error) {
	var ms []measurement
	for i := 1; i <= b.o.runs; i++ {
		var tables []string
		for _, v := range variants {
			m, err := b.measure(ctx, v, i)
			if err != nil {
				return nil, err
			}
			ms = append(ms, m)
			tables = append(tables, tableName(v, i))
		}
		if i == 1 {
			// Every variant must have loaded exactly the same rows.
			for _, other := range tables[1:] {
				var d1, d2 int64
				q := `SELECT (SELECT count(*) FROM (TABLE %[1]s EXCEPT ALL TABLE %[2]s) x), (SELECT count(*) FROM (TABLE %[2]s EXCEPT ALL TABLE %[1]s) y)`
				if err := b.db.QueryRowContext(ctx, fmt.Sprintf(q, tables[0], other)).Scan(&d1, &d2); err != nil {
					return nil, err
				}
				if d1 != 0 || d2 != 0 {
					return nil, fmt.Errorf("%s and %s differ: %d and %d rows only in one of them", tables[0], other, d1, d2)
				}
				progress("run 1: %s and %s hold identical rows", tables[0], other)
			}
		}
		for _, t := range tables {
			if _, err := b.db.ExecContext(ctx, `DROP TABLE `+t); err != nil {
				return nil, err
			}
		}
	}
	return ms, nil
}

func tableName(v string, run int) string { return fmt.Sprintf("%s.%s_%d", benchSchema, v, run) }

func (b *bench) measure(ctx context.Context, v string, run int) (measurement, error) {
	m := measurement{Variant: v, Run: run}
	table := tableName(v, run)
	if err := b.freshTable(ctx, table); err != nil {
		return m, err
	}
	job := fmt.Sprintf("benchload-%s-%d", v, run)
	cv, chunk := b.childVariant(v)
	c := childOpts{variant: cv, table: table, job: job, rows: b.o.rows, chunk: chunk}

	b.quiesce(ctx)
	b.checkpoint(ctx)
	lsn0, av0 := b.lsn(ctx), b.autovac(ctx)
	progress("run %d: %s: first load of %s rows", run, variantName(v), thousands(b.o.rows))
	var err error
	if m.Load, err = b.child(ctx, c); err != nil {
		return m, err
	}
	m.LoadWAL, m.LoadAutovac = b.walSince(ctx, lsn0), b.autovac(ctx)-av0
	want := int64(b.o.rows)
	if m.Load.Counts.Read != want || m.Load.Counts.Inserted != want {
		return m, fmt.Errorf("%s first load: counts %+v, want %d read and inserted", table, m.Load.Counts, want)
	}
	var n int64
	if err := b.db.GetContext(ctx, &n, `SELECT count(*) FROM `+table); err != nil || n != want {
		return m, fmt.Errorf("%s holds %d rows after the first load, want %d (%v)", table, n, want, err)
	}

	// The replay measures what the merge writes, not maintenance owed by
	// the first load (hint bits, visibility map): vacuum first, as
	// autovacuum would have by the time a backfill is replayed.
	if _, err := b.db.ExecContext(ctx, `VACUUM (ANALYZE) `+table); err != nil {
		return m, err
	}
	b.quiesce(ctx)
	b.checkpoint(ctx)
	lsn2, av2 := b.lsn(ctx), b.autovac(ctx)
	progress("run %d: %s: replay", run, variantName(v))
	c.newRun = true
	if cv == "base" {
		c.job += "-replay"
	}
	if m.Replay, err = b.child(ctx, c); err != nil {
		return m, err
	}
	m.ReplayWAL, m.ReplayAutovac = b.walSince(ctx, lsn2), b.autovac(ctx)-av2
	if m.Replay.Counts.Read != want || m.Replay.Counts.Unchanged != want {
		return m, fmt.Errorf("%s replay: counts %+v, want %d read and unchanged", table, m.Replay.Counts, want)
	}
	progress("run %d: %s: load %.0f rows/s, WAL %s; replay %.0f rows/s, WAL %s; peak RSS %.1f MiB",
		run, variantName(v), float64(want)/m.Load.Seconds, mib(m.LoadWAL), float64(want)/m.Replay.Seconds, mib(m.ReplayWAL), float64(m.Load.VmHWMKiB)/1024)
	return m, nil
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
		args = append(args, fmt.Sprintf("-concurrency=%d", b.o.libConcurrency), fmt.Sprintf("-ahead=%t", b.o.extractAhead))
	}
	if c.byOrder {
		args = append(args, "-byorder", fmt.Sprintf("-skipunchanged=%t", c.skipUnchanged), fmt.Sprintf("-restate=%d", c.restate),
			fmt.Sprintf("-correct=%d", c.correct), fmt.Sprintf("-versioned=%t", c.versioned))
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
			// Scaled to the load's own wall time (the window also holds
			// the child's start and connection).
			r.OtherCPU = (busy - r.UserCPU - r.SysCPU - max(r.ServerCPU, 0)) * r.Seconds / wall.Seconds()
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
