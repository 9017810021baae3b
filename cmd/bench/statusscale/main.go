// Command benchstatusscale measures the operator reads of a run at scale:
// it builds a run of -chunks chunks in the manifest (inserted in bulk, in
// the states a live run has: most done with counts, some open, failed,
// pending and leased by a live worker), with 0, then 10,000, then
// 1,000,000 queued exceptions (-exceptions) over many distinct reasons
// and columns, and events (pauses, resumes, throttle warnings, others),
// and times, warm, the median of -reps reads of each:
//
//   - status: Runner.Status (the latest run of the job, then its status);
//   - cli: the data load of "backfill status JOB" (cmd/backfill): the
//     manifest's version and access check, the latest run, its status
//     and its text; a process start and a new connection excluded;
//   - scrape: the manifest read of the Prometheus collector's scrape
//     (contrib/prometheus Collect: PGManifest.JobChunks);
//   - report: the report's data load (contrib/report renders
//     backfill.LoadRunReport).
//
// With -cli PATH (a built cmd/backfill), it also times the whole command
// "PATH status --batch N", process start and connection included, and
// reports it apart. It asserts nothing. make bench-status-scale runs it.
//
//	go run ./cmd/bench/statusscale [-chunks 100000,1000000 -exceptions 0,10000,1000000 -reps 21]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/cmd/bench/internal/benchpg"
)

const job = "bench_status_scale"

func main() {
	chunksFlag := flag.String("chunks", "100000,1000000", "chunk counts of the run, comma-separated")
	excFlag := flag.String("exceptions", "0,10000,1000000", "queued exception counts, comma-separated, increasing")
	reasons := flag.Int("reasons", 200, "distinct reasons of the exceptions (each over 7 columns)")
	events := flag.Int("events", 2000, "events of the run beside its pauses and resumes")
	reps := flag.Int("reps", 21, "timed reads of each kind, after 3 warm-up reads")
	reportMax := flag.Int("report-max", 1000000, "skip the report's data load above this many chunks (0: never skip)")
	cli := flag.String("cli", "", "a built cmd/backfill: also time the whole command \"status --batch N\"")
	fast := flag.Bool("fast", false, "a throwaway server without fsync (the reads are the same; the setup is faster)")
	flag.Parse()
	chunkCounts, err := ints(*chunksFlag)
	if err != nil {
		log.Fatalf("-chunks: %v", err)
	}
	excCounts, err := ints(*excFlag)
	if err != nil || !slices.IsSorted(excCounts) {
		log.Fatalf("-exceptions: increasing counts: %v", err)
	}

	ctx := context.Background()
	db, url, settings, stop, err := benchpg.Open(ctx, *fast, 4)
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	pm := backfill.NewPGManifest("")
	if err := pm.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	_, latest, _ := pm.Version(ctx, db)
	fmt.Printf("## Operator reads at scale (manifest version %d", latest)
	for _, s := range settings {
		fmt.Printf(", %s %s", s.Name, s.Value)
	}
	fmt.Printf(")\n\ncommand: go run ./cmd/bench/statusscale %s\n\n", strings.Join(os.Args[1:], " "))
	fmt.Println("| chunks | exceptions | read | median | min | max | CPU median (server + client) |")
	fmt.Println("|---:|---:|---|---:|---:|---:|---:|")

	// The reads go through one connection, whose backend's CPU time
	// (/proc/PID/schedstat, when the server is on this machine) is
	// counted with this process's: on a busy machine the wall time
	// counts the waits for a CPU, the CPU time does not.
	rdb, err := sqlx.Open("postgres", url)
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()
	rdb.SetMaxOpenConns(1)
	rdb.SetMaxIdleConns(1)
	var backendPID int
	if err := rdb.GetContext(ctx, &backendPID, `SELECT pg_backend_pid()`); err != nil {
		log.Fatal(err)
	}
	cpu := func() (cpuTime, bool) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", backendPID))
		if err != nil {
			return cpuTime{}, false
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return cpuTime{}, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return cpuTime{}, false
		}
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			return cpuTime{}, false
		}
		return cpuTime{server: time.Duration(ns), client: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}, true
	}

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// builder runs the small real run each built run starts from; r reads.
	builder, err := backfill.New(db, &backfill.Config{WorkerID: "benchstatusscale", Logger: logger})
	if err != nil {
		log.Fatal(err)
	}
	r, err := backfill.New(rdb, &backfill.Config{WorkerID: "benchstatusscale", Logger: logger})
	if err != nil {
		log.Fatal(err)
	}
	for _, n := range chunkCounts {
		batch := buildRun(ctx, db, builder, n, *events)
		have := 0
		for _, ne := range excCounts {
			addExceptions(ctx, db, batch, n, have, ne, *reasons)
			have = ne
			db.MustExecContext(ctx, `VACUUM ANALYZE backfill.chunks`)
			db.MustExecContext(ctx, `VACUUM ANALYZE backfill.exceptions`)
			db.MustExecContext(ctx, `UPDATE backfill.workers SET heartbeat_at = now() WHERE batch_id = $1`, batch)
			reads := []struct {
				name string
				fn   func() error
			}{
				{"status (Runner.Status)", func() error {
					_, err := r.Status(ctx, backfill.Job{Name: job})
					return err
				}},
				{"cli (backfill status data load)", func() error { return cliLoad(ctx, rdb, job) }},
				{"scrape (JobChunks)", func() error {
					_, err := pm.JobChunks(ctx, rdb, 0, job)
					return err
				}},
				{"report (LoadRunReport)", func() error {
					if *reportMax > 0 && n > *reportMax {
						return errSkipped
					}
					_, err := backfill.LoadRunReport(ctx, rdb, pm, batch)
					return err
				}},
			}
			for _, rd := range reads {
				d, c, err := timeIt(*reps, rd.fn, cpu)
				if err == errSkipped {
					fmt.Printf("| %d | %d | %s | skipped | | | |\n", n, ne, rd.name)
					continue
				}
				if err != nil {
					log.Fatalf("%s: %v", rd.name, err)
				}
				cs := "n/a"
				if len(c) > 0 {
					slices.SortFunc(c, func(a, b cpuTime) int { return int(a.server + a.client - b.server - b.client) })
					m := c[len(c)/2]
					cs = fmt.Sprintf("%s (%s + %s)", ms(m.server+m.client), ms(m.server), ms(m.client))
				}
				fmt.Printf("| %d | %d | %s | %s | %s | %s | %s |\n", n, ne, rd.name, ms(d[len(d)/2]), ms(d[0]), ms(d[len(d)-1]), cs)
			}
			if *cli != "" {
				d, _, err := timeIt(min(*reps, 7), func() error {
					cmd := exec.Command(*cli, "status", "--batch", strconv.FormatInt(batch, 10))
					cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
					out, err := cmd.CombinedOutput()
					if err != nil {
						return fmt.Errorf("%w: %s", err, out)
					}
					return nil
				}, nil)
				if err != nil {
					log.Fatalf("cli: %v", err)
				}
				fmt.Printf("| %d | %d | %s | %s | %s | %s | |\n", n, ne, "cli process (start + connect + load)", ms(d[len(d)/2]), ms(d[0]), ms(d[len(d)-1]))
			}
		}
	}
}

var errSkipped = fmt.Errorf("skipped")

// cliLoad is what "backfill status JOB" reads: the manifest's version and
// the session's access (globals.manifest), the job's latest run
// (selection.run), its status and its text.
func cliLoad(ctx context.Context, db *sqlx.DB, job string) error {
	m := backfill.NewPGManifest("")
	if _, _, err := m.VersionFor(ctx, db, backfill.ActionRead); err != nil {
		return err
	}
	if err := m.CheckAccess(ctx, db, backfill.ActionRead); err != nil {
		return err
	}
	run, err := m.LatestRun(ctx, db, job)
	if err != nil {
		return err
	}
	st, err := m.Status(ctx, db, run.BatchID)
	if err != nil {
		return err
	}
	_ = st.String()
	return nil
}

// buildRun makes a real run of job (two chunks, run by the library), then
// replaces its chunks with n in bulk and makes it a running run with a
// live worker: 90% done with counts (the last ones checkpointed within
// the recent window), 0.5% open, 1% failed, 8 pending chunks leased by the
// worker, the rest pending; and events.
func buildRun(ctx context.Context, db *sqlx.DB, r *backfill.Runner, n, events int) int64 {
	db.MustExecContext(ctx, `DROP TABLE IF EXISTS bench_status_scale_target`)
	db.MustExecContext(ctx, `CREATE TABLE bench_status_scale_target (id bigint PRIMARY KEY, v int NOT NULL)`)
	// The previous built run goes (its live worker's leases would hold the
	// new run's workers).
	db.MustExecContext(ctx, `DELETE FROM backfill.runs WHERE job_name = $1`, job)
	j := backfill.Job{Name: job, Chunker: backfill.IntRange(0, 2000, 1000), Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "bench_status_scale_target", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, c.Lo, 1)
		})}
	res, err := r.Run(ctx, j)
	if err != nil {
		log.Fatal(err)
	}
	b := res.BatchID
	start := time.Now()
	tx := db.MustBeginTx(ctx, nil)
	tx.MustExecContext(ctx, `DELETE FROM backfill.chunks WHERE batch_id = $1`, b)
	tx.MustExecContext(ctx, `INSERT INTO backfill.workers (worker_key, worker_id, batch_id, job_name, host, pid, stale_after)
		VALUES ('bench-live-' || $1::bigint, 'benchstatusscale', $1::bigint, $2, 'benchhost', 1, interval '1 hour')`, b, job)
	// The run's size first: the report's rollup sizes its buckets by it.
	tx.MustExecContext(ctx, `UPDATE backfill.runs SET status = 'running', finished_at = NULL, chunks_total = $2,
		created_at = now() - interval '1 hour' WHERE batch_id = $1`, b, n)
	done, open, failed := n*90/100, n/200, n/100
	tx.MustExecContext(ctx, `INSERT INTO backfill.chunks (batch_id, seq, chunk_id, kind, lower_bound, upper_bound, lo, hi, status, attempts,
			rows_read, rows_inserted, rows_updated, rows_unchanged, rows_rejected, rows_deduplicated, rows_processed, reads,
			started_at, finished_at, checkpointed_at, worker, lease_key, leased_at, last_error, skipped)
		SELECT $1::bigint, g, 'c' || g, 'int', (g * 1000)::text, (g * 1000 + 1000)::text, g * 1000, g * 1000 + 1000, st, CASE WHEN st = 'pending' THEN 0 ELSE 1 END,
			rd, rd - 40 - rd % 7, 30, rd % 7, 5, 5, rd, CASE WHEN st IN ('done', 'open') THEN 1 ELSE 0 END,
			ts - interval '40 ms', ts, ts, CASE WHEN st = 'pending' THEN '' ELSE 'benchstatusscale' END,
			CASE WHEN lease THEN 'bench-live-' || $1::bigint END, CASE WHEN lease THEN now() END,
			CASE WHEN st = 'failed' THEN 'bench: failed' ELSE '' END, st = 'done' AND g % 10 = 0
		FROM generate_series(0, $2 - 1) g
		CROSS JOIN LATERAL (SELECT CASE WHEN g < $3 THEN 'done' WHEN g < $3 + $4 THEN 'open' WHEN g < $3 + $4 + $5 THEN 'failed' ELSE 'pending' END AS st) s
		CROSS JOIN LATERAL (SELECT s.st = 'pending' AND g < $3 + $4 + $5 + 8 AS lease,
			CASE WHEN s.st IN ('done', 'open', 'failed') THEN 900 + g % 200 ELSE 0 END AS rd,
			CASE WHEN s.st IN ('done', 'open', 'failed') THEN now() - ($3 + $4 + $5 - g) * interval '2 ms' END AS ts) x`,
		b, n, done, open, failed)
	tx.MustExecContext(ctx, `UPDATE backfill.chunks SET rows_read = 0, rows_inserted = 0, rows_updated = 0, rows_unchanged = 0, rows_rejected = 0,
		rows_deduplicated = 0, rows_processed = 0, checkpointed_at = NULL WHERE batch_id = $1 AND status = 'failed'`, b)
	// Events: 10 pauses and resumes, throttle warnings, and others.
	tx.MustExecContext(ctx, `INSERT INTO backfill.events (batch_id, job_name, kind, actor, detail, created_at)
		SELECT $1, $2, CASE WHEN g % 2 = 0 THEN 'run_paused' ELSE 'run_resumed' END, 'bench', '{}', now() - interval '50 minutes' + g * interval '1 minute'
		FROM generate_series(0, 19) g`, b, job)
	tx.MustExecContext(ctx, `INSERT INTO backfill.events (batch_id, job_name, kind, actor, detail, created_at)
		SELECT $1, $2, CASE WHEN g % 100 = 0 THEN 'throttle_signal_inert' ELSE 'chunk_retried' END, 'bench',
			jsonb_build_object('signal', 'sig' || (g % 5), 'chunk', 'c' || g), now() - interval '30 minutes' + g * interval '10 ms'
		FROM generate_series(0, $3 - 1) g`, b, job, events)
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "built run %d: %d chunks in %v\n", b, n, time.Since(start).Round(time.Millisecond))
	return b
}

// addExceptions brings run batch's queued exceptions from have to want,
// over reasons distinct reasons and 7 columns, on its done chunks.
func addExceptions(ctx context.Context, db *sqlx.DB, batch int64, n, have, want, reasons int) {
	if want <= have {
		return
	}
	start := time.Now()
	db.MustExecContext(ctx, `INSERT INTO backfill.exceptions (batch_id, chunk_id, row_number, raw, column_name, value, reason)
		SELECT $1, 'c' || (g % $4), g, jsonb_build_object('id', g, 'v', 'x' || g), 'col_' || (g % 7), 'x' || g,
			'reason ' || (g % $5) || ': value out of range for the column''s type'
		FROM generate_series($2, $3 - 1) g`, batch, have, want, max(n*90/100, 1), reasons)
	fmt.Fprintf(os.Stderr, "exceptions of run %d: %d in %v\n", batch, want, time.Since(start).Round(time.Millisecond))
}

// cpuTime is CPU time spent by the server's backend and by this process.
type cpuTime struct{ server, client time.Duration }

// timeIt runs fn 3 times, then reps times timed, and returns the sorted
// wall times and, when cpu (nil: none) can tell, the CPU times.
func timeIt(reps int, fn func() error, cpu func() (cpuTime, bool)) (wall []time.Duration, cpus []cpuTime, err error) {
	for range 3 {
		if err := fn(); err != nil {
			return nil, nil, err
		}
	}
	for range reps {
		var c0 cpuTime
		ok := cpu != nil
		if ok {
			c0, ok = cpu()
		}
		t := time.Now()
		if err := fn(); err != nil {
			return nil, nil, err
		}
		wall = append(wall, time.Since(t))
		if ok {
			if c1, ok := cpu(); ok {
				cpus = append(cpus, cpuTime{server: c1.server - c0.server, client: c1.client - c0.client})
			}
		}
	}
	slices.Sort(wall)
	return wall, cpus, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}
