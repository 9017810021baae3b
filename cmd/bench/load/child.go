package main

import (
	"bufio"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill"
)

// envURL passes the benchmark database's URL from the parent to a child
// (not on the command line, where ps would show a password).
const envURL = "BENCHLOAD_URL"

// resultPrefix starts the one line of JSON a child prints on stdout.
const resultPrefix = "BENCHLOAD_RESULT "

// childOpts are the flags of a child process: one load of one variant.
type childOpts struct {
	variant     string // "lib" or "base"
	table       string // schema-qualified target
	job         string // library job name / baseline run label
	lo, rows    int64
	chunk       int64
	newRun      bool   // library: Job.NewRun (a replay of a completed plan)
	cpuProfile  string // write a CPU profile of the load here
	breakdown   string // write a per-phase time breakdown here (adds timers)
	explain     string // capture auto_explain plans of every statement here
	sqlOut      string // write the SQL statements the load issued here (JSON)
	pgOptions   string // PostgreSQL startup options ("-c name=value ...") of the load's connections
	concurrency int    // library: Config.Concurrency (0: the library's default)
	ahead       optIn  // library: Config.ExtractAhead (options.go)
	skip        optIn  // library: Job.SkipUnchanged (options.go)
	// restate > 0 adds restate to the quantity of every restateEvery-th
	// chunk's rows (a restatement); correct > 0 changes, in those chunks,
	// every correctEvery-th row once more (-byorder only).
	restate int
	correct int
	// byOrder chunks by order_no with ChunkColumn order_no (skip.go).
	byOrder bool
	// versioned: the extractor is a backfill.ChunkVersioner (skip.go).
	versioned bool
}

// childResult is what a child reports about its load.
type childResult struct {
	Variant string  `json:"variant"`
	Rows    int64   `json:"rows"`
	Seconds float64 `json:"seconds"`
	// UserCPU and SysCPU are the child's own CPU seconds for the whole
	// process (getrusage), ServerCPU the CPU seconds of its PostgreSQL
	// backends (from /proc, -1 when the server is not local).
	UserCPU   float64 `json:"user_cpu_s"`
	SysCPU    float64 `json:"sys_cpu_s"`
	ServerCPU float64 `json:"server_cpu_s"`
	// VmHWMKiB is the peak resident set size from /proc/self/status.
	VmHWMKiB   int64  `json:"vmhwm_kib"`
	TotalAlloc uint64 `json:"total_alloc_bytes"`
	NumGC      uint32 `json:"num_gc"`
	// Counts: the library's run report; for the baseline Read is the rows
	// sent, Inserted the rows the INSERT ... ON CONFLICT reported as
	// written (inserted or updated), Unchanged the rest.
	Counts backfill.Counts `json:"counts"`
	// OtherCPU is set by the parent: the CPU seconds the rest of the
	// machine used while the child ran (all busy CPU time in /proc/stat
	// minus the child's and its backends'): other processes competing for
	// the same cores. Large values make the timings unreliable.
	OtherCPU float64 `json:"other_cpu_s"`
	// ChunksSkipped is the library's Report.ChunksSkipped.
	ChunksSkipped int `json:"chunks_skipped,omitempty"`
	// ProcSeconds is set by the parent: the wall time of the whole child
	// process, from exec to exit (process start, connecting, the plan,
	// run setup, the load and the finish). Seconds is the load alone,
	// timed inside the child from after connecting.
	ProcSeconds float64 `json:"process_seconds"`
}

func runChild(o childOpts) error {
	ctx := context.Background()
	url := os.Getenv(envURL)
	if url == "" {
		return errors.New("child: " + envURL + " is not set")
	}
	app := fmt.Sprintf("benchload-%s-%d", o.variant, os.Getpid())
	var notices *noticeLog
	if o.explain != "" {
		notices = &noticeLog{}
	}
	db, be, err := openDB(ctx, url, app, o.pgOptions, notices)
	if err != nil {
		return err
	}
	defer db.Close()
	// The pool must keep every connection to the end, so that the server
	// CPU of all of them can be read.
	db.SetMaxIdleConns(16)

	var st *stats
	if o.breakdown != "" || o.sqlOut != "" {
		st = newStats()
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	res := childResult{Variant: o.variant, Rows: o.rows}
	start := time.Now()
	switch o.variant {
	case "lib":
		res.Counts, res.ChunksSkipped, err = loadLib(ctx, db, o, st)
	case "base":
		res.Counts, err = loadBase(ctx, db, o, st)
	default:
		err = fmt.Errorf("child: unknown variant %q", o.variant)
	}
	wall := time.Since(start)
	res.Seconds = wall.Seconds()
	if o.cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	if err != nil {
		return fmt.Errorf("child %s %s: %w", o.variant, o.table, err)
	}
	res.ServerCPU = be.total() // servercpu.go

	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		res.UserCPU = time.Duration(ru.Utime.Nano()).Seconds()
		res.SysCPU = time.Duration(ru.Stime.Nano()).Seconds()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.TotalAlloc, res.NumGC = ms.TotalAlloc, ms.NumGC
	res.VmHWMKiB = procStatusKiB("/proc/self/status", "VmHWM")

	if st != nil && o.breakdown != "" {
		if err := os.WriteFile(o.breakdown, []byte(st.report(o.variant, wall, res)), 0o644); err != nil {
			return err
		}
	}
	if st != nil && o.sqlOut != "" {
		b, _ := json.MarshalIndent(st.sqlTexts(), "", "  ")
		if err := os.WriteFile(o.sqlOut, b, 0o644); err != nil {
			return err
		}
	}
	if notices != nil {
		if err := os.WriteFile(o.explain, []byte(notices.String()), 0o644); err != nil {
			return err
		}
	}
	b, _ := json.Marshal(res)
	fmt.Println(resultPrefix + string(b))
	return nil
}

// openDB opens a lib/pq pool on url. With notices, every statement's plan
// is captured through auto_explain (loaded per session: needs a superuser,
// as on the throwaway server), sent to the client as NOTICEs.
func openDB(ctx context.Context, url, app, options string, notices *noticeLog) (*sqlx.DB, *backends, error) {
	params := map[string]string{"application_name": app}
	if notices != nil {
		options += " -c session_preload_libraries=auto_explain -c auto_explain.log_min_duration=0" +
			" -c auto_explain.log_analyze=on -c auto_explain.log_buffers=on -c auto_explain.log_level=notice"
	}
	if options = strings.TrimSpace(options); options != "" {
		params["options"] = options
	}
	u, err := withParams(url, params)
	if err != nil {
		return nil, nil, err
	}
	conn, err := pq.NewConnector(u)
	if err != nil {
		return nil, nil, fmt.Errorf("connector: %w", err)
	}
	var inner driver.Connector = conn
	if notices != nil {
		inner = pq.ConnectorWithNoticeHandler(conn, notices.add)
	}
	be := newBackends(inner)
	sdb := sql.OpenDB(be)
	db := sqlx.NewDb(sdb, "postgres")
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		be.total()
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	return db, be, nil
}

// loadLib loads [lo, lo+rows) with the library: IntRange chunks, the
// zero Config and a Job with only what a user must give, plus the
// variant's opt-ins (options.go).
func loadLib(ctx context.Context, db *sqlx.DB, o childOpts, st *stats) (backfill.Counts, int, error) {
	cfg := &backfill.Config{}
	if o.concurrency > 0 {
		cfg.Concurrency = o.concurrency
	}
	setExtractAhead(cfg, o.ahead)
	var r *backfill.Runner
	var err error
	if st != nil {
		// Same runner, with every statement and the stager's calls timed.
		cfg.Merger = &timedMerger{inner: pgstore.NewMerger(), st: st}
		r, err = backfill.NewWithDB(&timedDB{DB: db, st: st}, cfg)
	} else {
		r, err = backfill.New(db, cfg)
	}
	if err != nil {
		return backfill.Counts{}, 0, err
	}
	job := backfill.Job{
		Name:        o.job,
		Source:      "benchload",
		CodeVersion: "benchload-1",
		Chunker:     backfill.IntRange(o.lo, o.lo+o.rows, o.chunk),
		Extractor:   generator{st: st, lo: o.lo, chunk: o.chunk, restate: o.restate},
		Target:      backfill.Target{Table: o.table, Key: keyColumns, Columns: allColumns},
		NewRun:      o.newRun,
		// Rollback unset: the target has the default lineage columns, so
		// the library keeps its default undo log.
	}
	setSkipUnchanged(&job, o.skip)
	if o.byOrder {
		job.Chunker, job.Extractor = byOrderJob(o) // skip.go
		if o.versioned {
			job.Extractor = versionedOrders{job.Extractor.(orderGenerator)}
		}
		job.ChunkColumn = "order_no"
	}
	rep, err := r.Run(ctx, job)
	if err != nil {
		return rep.Counts, rep.ChunksSkipped, err
	}
	if rep.Status != backfill.RunCompleted || rep.ChunksRun != rep.ChunksTotal {
		return rep.Counts, rep.ChunksSkipped, fmt.Errorf("run %d: status %s, %d of %d chunks run", rep.BatchID, rep.Status, rep.ChunksRun, rep.ChunksTotal)
	}
	return rep.Counts, rep.ChunksSkipped, nil
}

// generator is the library's Extractor: the rows of ids [c.Lo, c.Hi),
// with restate added to the quantity of every row of every restateEvery-th
// chunk (counted from lo in chunks of chunk ids) when restate > 0.
type generator struct {
	st        *stats
	lo, chunk int64
	restate   int
}

func (g generator) Extract(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	vals := make([]any, len(allColumns))
	var buf []byte
	if g.restate > 0 {
		changed := ((c.Lo-g.lo)/max(g.chunk, 1))%restateEvery == 0
		for id := c.Lo; id < c.Hi; id++ {
			buf = genRow(id, vals, buf)
			if changed {
				vals[5] = vals[5].(int) + g.restate
			}
			if err := w.Write(ctx, vals...); err != nil {
				return err
			}
		}
		return nil
	}
	if g.st == nil {
		for id := c.Lo; id < c.Hi; id++ {
			buf = genRow(id, vals, buf)
			if err := w.Write(ctx, vals...); err != nil {
				return err
			}
		}
		return nil
	}
	start := time.Now()
	var gen time.Duration
	for id := c.Lo; id < c.Hi; id++ {
		t := time.Now()
		buf = genRow(id, vals, buf)
		gen += time.Since(t)
		if err := w.Write(ctx, vals...); err != nil {
			return err
		}
	}
	g.st.add("extract: Extractor.Extract (generate + RowWriter.Write)", "", time.Since(start), 1)
	g.st.add("generate rows (benchmark generator)", "extract: Extractor.Extract (generate + RowWriter.Write)", gen, c.Hi-c.Lo)
	return nil
}

// baselineSQL is the hand-written chunk: staging, ON CONFLICT merge,
// manifest row.
type baselineSQL struct{ create, copyIn, merge, manifest string }

func newBaselineSQL(table string) baselineSQL {
	cols := strings.Join(allColumns, ", ")
	sets := make([]string, len(nonKeyColumns))
	lhs := make([]string, len(nonKeyColumns))
	rhs := make([]string, len(nonKeyColumns))
	for i, c := range nonKeyColumns {
		sets[i] = c + " = EXCLUDED." + c
		lhs[i] = "t." + c
		rhs[i] = "EXCLUDED." + c
	}
	return baselineSQL{
		create: `CREATE TEMP TABLE staging (LIKE ` + table + `) ON COMMIT DROP`,
		copyIn: `COPY staging (` + cols + `) FROM STDIN`,
		merge: fmt.Sprintf(`INSERT INTO %s AS t (%s) SELECT %s FROM staging ON CONFLICT (%s) DO UPDATE SET %s WHERE (%s) IS DISTINCT FROM (%s)`,
			table, cols, cols, strings.Join(keyColumns, ", "), strings.Join(sets, ", "), strings.Join(lhs, ", "), strings.Join(rhs, ", ")),
		manifest: `INSERT INTO ` + benchSchema + `.base_manifest (run, chunk_id, lo, hi, rows_read, rows_written, done_at) VALUES ($1, $2, $3, $4, $5, $6, now())`,
	}
}

// loadBase loads [lo, lo+rows) the hand-written way: per chunk, in one
// transaction, a temp staging table, COPY, INSERT ... ON CONFLICT DO UPDATE
// ... WHERE IS DISTINCT FROM, one manifest row, commit.
func loadBase(ctx context.Context, db *sqlx.DB, o childOpts, st *stats) (backfill.Counts, error) {
	q := newBaselineSQL(o.table)
	var total backfill.Counts
	vals := make([]any, len(allColumns))
	var buf []byte
	timed := func(key, parent string, f func() error) error {
		if st == nil {
			return f()
		}
		t := time.Now()
		err := f()
		st.add(key, parent, time.Since(t), 1)
		return err
	}
	if st != nil {
		st.sql("baseline: create staging", q.create)
		st.sql("baseline: copy", q.copyIn)
		st.sql("baseline: merge", q.merge)
		st.sql("baseline: manifest", q.manifest)
	}
	hi := o.lo + o.rows
	for lo := o.lo; lo < hi; lo += o.chunk {
		chi := min(lo+o.chunk, hi)
		var tx *sql.Tx
		err := timed("begin", "", func() (err error) { tx, err = db.BeginTx(ctx, nil); return err })
		if err != nil {
			return total, err
		}
		var written int64
		err = func() error {
			if err := timed("CREATE TEMP TABLE staging (LIKE target) ON COMMIT DROP", "", func() error {
				_, err := tx.ExecContext(ctx, q.create)
				return err
			}); err != nil {
				return fmt.Errorf("create staging: %w", err)
			}
			var stmt *sql.Stmt
			if err := timed("prepare COPY", "", func() (err error) { stmt, err = tx.PrepareContext(ctx, q.copyIn); return err }); err != nil {
				return fmt.Errorf("copy: %w", err)
			}
			defer stmt.Close()
			rowsKey := "COPY rows (generate + stmt.Exec per row)"
			var gen time.Duration
			err := timed(rowsKey, "", func() error {
				for id := lo; id < chi; id++ {
					var t time.Time
					if st != nil {
						t = time.Now()
					}
					buf = genRow(id, vals, buf)
					if st != nil {
						gen += time.Since(t)
					}
					if _, err := stmt.ExecContext(ctx, vals...); err != nil {
						return fmt.Errorf("copy row %d: %w", id, err)
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			if st != nil {
				st.add("generate rows (benchmark generator)", rowsKey, gen, chi-lo)
			}
			if err := timed("end COPY (flush)", "", func() error {
				if _, err := stmt.ExecContext(ctx); err != nil {
					return err
				}
				return stmt.Close()
			}); err != nil {
				return fmt.Errorf("end copy: %w", err)
			}
			if err := timed("INSERT ... ON CONFLICT DO UPDATE ... WHERE IS DISTINCT FROM", "", func() error {
				r, err := tx.ExecContext(ctx, q.merge)
				if err == nil {
					written, err = r.RowsAffected()
				}
				return err
			}); err != nil {
				return fmt.Errorf("merge: %w", err)
			}
			if err := timed("manifest INSERT", "", func() error {
				_, err := tx.ExecContext(ctx, q.manifest, o.job, fmt.Sprintf("int:%d/%d", lo, chi), lo, chi, chi-lo, written)
				return err
			}); err != nil {
				return fmt.Errorf("manifest: %w", err)
			}
			return timed("commit", "", tx.Commit)
		}()
		if err != nil {
			_ = tx.Rollback()
			return total, fmt.Errorf("chunk [%d, %d): %w", lo, chi, err)
		}
		total = total.Add(backfill.Counts{Read: chi - lo, Inserted: written, Unchanged: chi - lo - written})
	}
	return total, nil
}

// procStatusKiB returns a "kB" field of a /proc/<pid>/status file, or -1.
func procStatusKiB(path, field string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return -1
		}
		return v
	}
	return -1
}

// noticeLog collects the NOTICEs of a pool (auto_explain plans).
type noticeLog struct {
	mu  sync.Mutex
	buf strings.Builder
	n   int
}

func (l *noticeLog) add(e *pq.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	fmt.Fprintf(&l.buf, "-- notice %d\n%s\n\n", l.n, e.Message)
}

func (l *noticeLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
