// Command benchlock measures a backfill beside a live load while a
// session holds ACCESS EXCLUSIVE on the backfill's target: how long the
// backfill waits on the lock, and what the lock and the backfill cost the
// load. pgbench (TPC-B-like, plus one client reading the target) runs on
// a server with production durability (fsync, full_page_writes and
// synchronous_commit on); a backfill of the target starts, and a session
// locks the target for -lock (30 s) mid-run. It reports, without
// asserting anything:
//
//   - the waits of the backfill (the manifest's waits table): how many,
//     the longest lock_timeout and wait, and the blockers named;
//   - whether the run completed, and how long after the lock's release;
//   - the longest time any pgbench session waited for a lock with a
//     backfill session among its blockers (sampled from pg_locks and
//     pg_blocking_pids every 20 ms), and the backfill's own longest lock
//     wait seen so;
//   - pgbench's TPS, p99 and maximum latency (per-transaction logs, -l)
//     before, during and after the lock.
//
// See README.md in this directory. make bench-lock runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/cmd/bench/internal/benchpg"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

type options struct {
	scale       int
	clients     int
	rows        int64
	chunk       int64
	chunkSleep  time.Duration
	concurrency int
	lockAfter   time.Duration
	lock        time.Duration
	lockTimeout time.Duration
	tail        time.Duration
	verbose     bool
}

// fast runs the throwaway server with the test harness's settings
// (fsync and synchronous_commit off) instead of production durability.
var fast = flag.Bool("fast", false, "the throwaway server with fsync and synchronous_commit off (the test server), not production durability")

func main() {
	var o options
	flag.IntVar(&o.scale, "scale", 10, "pgbench scale")
	flag.IntVar(&o.clients, "clients", 4, "pgbench TPC-B-like clients")
	flag.Int64Var(&o.rows, "rows", 200_000, "rows the backfill loads")
	flag.Int64Var(&o.chunk, "chunk", 2_000, "rows per chunk")
	flag.DurationVar(&o.tail, "tail", 60*time.Second, "how long pgbench runs on after the lock's release")
	flag.DurationVar(&o.chunkSleep, "chunk-sleep", 500*time.Millisecond, "the extractor's time per chunk (a slow source)")
	flag.IntVar(&o.concurrency, "concurrency", 2, "the backfill's Config.Concurrency")
	flag.DurationVar(&o.lockAfter, "lock-after", 10*time.Second, "when the locker takes ACCESS EXCLUSIVE, after the backfill starts")
	flag.DurationVar(&o.lock, "lock", 30*time.Second, "how long the locker holds it")
	flag.DurationVar(&o.lockTimeout, "lock-timeout", backfill.DefaultLockTimeout, "the backfill's Config.LockTimeout (default retry table)")
	flag.BoolVar(&o.verbose, "v", false, "log the backfill's warnings (waits) to stderr")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "benchlock:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx := context.Background()
	bin, err := pgtest.BinDir()
	if err != nil {
		return err
	}
	db, url, settings, stop, err := benchpg.Open(ctx, *fast, o.concurrency+8, "fsync", "synchronous_commit", "full_page_writes")
	defer stop()
	if err != nil {
		return err
	}
	if _, err := db.Exec(`DROP TABLE IF EXISTS bench_target; DROP SCHEMA IF EXISTS backfill CASCADE;
		CREATE TABLE bench_target (id bigint PRIMARY KEY, v text NOT NULL, n int NOT NULL);
		INSERT INTO bench_target SELECT g, 'seed', 0 FROM generate_series(0, 999) g`); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "benchlock")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	pgb := filepath.Join(bin, "pgbench")
	conn := benchpg.Conn(url)
	if out, err := exec.CommandContext(ctx, pgb, append(conn, "-i", "-q", "-s", strconv.Itoa(o.scale))...).CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %w\n%s", err, out)
	}
	reader := filepath.Join(work, "reader.sql")
	if err := os.WriteFile(reader, []byte("\\set id random(0, 999)\nSELECT v FROM bench_target WHERE id = :id;\n"), 0o644); err != nil {
		return err
	}

	// Timeline: pgbench 5 s alone, the backfill, the lock at lockAfter
	// for lock, then -tail more of pgbench.
	duration := 5*time.Second + o.lockAfter + o.lock + o.tail
	begin := time.Now()
	pgbenchDone := make(chan error, 2)
	for _, p := range []struct{ app, prefix string }{{"pgbench", "main"}, {"pgbench-reader", "reader"}} {
		args := append(conn, "-n", "-T", strconv.Itoa(int(duration/time.Second)), "-l", "--log-prefix", filepath.Join(work, p.prefix))
		if p.prefix == "main" {
			args = append(args, "-c", strconv.Itoa(o.clients), "-j", "2", "-b", "tpcb-like")
		} else {
			args = append(args, "-c", "1", "-f", reader, "-R", "50")
		}
		cmd := exec.CommandContext(ctx, pgb, args...)
		cmd.Env = append(os.Environ(), "PGAPPNAME="+p.app)
		cmd.Dir = work
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			return err
		}
		go func() {
			err := cmd.Wait()
			if err != nil {
				err = fmt.Errorf("%s: %w\n%s", p.prefix, err, out.String())
			}
			pgbenchDone <- err
		}()
	}
	sctx, stopSampler := context.WithCancel(ctx)
	defer stopSampler()
	samples := sampleLocks(sctx, db)
	time.Sleep(5 * time.Second)

	// The backfill.
	logLevel := slog.LevelError
	if o.verbose {
		logLevel = slog.LevelWarn
	}
	r, err := backfill.New(db, &backfill.Config{Concurrency: o.concurrency, LockTimeout: o.lockTimeout, WorkerID: "benchlock",
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel}))})
	if err != nil {
		return err
	}
	job := backfill.Job{
		Name:    "benchlock",
		Chunker: backfill.IntRange(0, o.rows, o.chunk),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			time.Sleep(o.chunkSleep)
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, fmt.Sprint("v", id), int(id%1000)); err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "bench_target", Key: []string{"id"}},
	}
	bfStart := time.Now()
	type result struct {
		rep backfill.Report
		err error
		at  time.Time
	}
	bfDone := make(chan result, 1)
	go func() {
		rep, err := r.Run(ctx, job)
		bfDone <- result{rep, err, time.Now()}
	}()

	// The locker.
	time.Sleep(o.lockAfter)
	lockConn, err := db.Connx(ctx)
	if err != nil {
		return err
	}
	var lockerPID int
	if err := lockConn.GetContext(ctx, &lockerPID, `SELECT pg_backend_pid() FROM set_config('application_name', 'bench-locker', false)`); err != nil {
		return err
	}
	if _, err := lockConn.ExecContext(ctx, `BEGIN; LOCK TABLE bench_target IN ACCESS EXCLUSIVE MODE`); err != nil {
		return err
	}
	lockStart := time.Now()
	time.Sleep(o.lock)
	if _, err := lockConn.ExecContext(ctx, `COMMIT`); err != nil {
		return err
	}
	lockEnd := time.Now()
	_ = lockConn.Close()
	res := <-bfDone
	// pgbench runs to the end of its -T (its logs are complete then).
	for range 2 {
		if err := <-pgbenchDone; err != nil {
			return err
		}
	}
	end := time.Now()
	stopSampler()
	s := <-samples

	waits, werr := backfill.NewPGManifest("").Waits(ctx, db, res.rep.BatchID)
	lat, err := benchpg.ReadLogs(filepath.Join(work, "main"))
	if err != nil {
		return err
	}
	rlat, err := benchpg.ReadLogs(filepath.Join(work, "reader"))
	if err != nil {
		return err
	}

	fmt.Printf("# benchlock: a backfill beside pgbench, the target locked ACCESS EXCLUSIVE for %v\n\n", o.lock)
	for _, st := range settings {
		fmt.Printf("- %s = %s\n", st.Name, st.Value)
	}
	fmt.Printf("- pgbench: scale %d, %d TPC-B-like clients (-j 2), plus 1 client reading one target row at 50 tx/s\n", o.scale, o.clients)
	fmt.Printf("- backfill: %d rows in chunks of %d, Concurrency %d, extractor %v per chunk, LockTimeout %v (default retry table: %s)\n\n",
		o.rows, o.chunk, o.concurrency, o.chunkSleep, o.lockTimeout, describeTable(backfill.DefaultLockRetries(o.lockTimeout)))
	fmt.Printf("## Backfill\n\n")
	fmt.Printf("- status %s, %d/%d chunks, error: %v\n", res.rep.Status, res.rep.ChunksDone, res.rep.ChunksTotal, res.err)
	fmt.Printf("- ran %v; lock held %v (from %v to %v after the start); completed %v after the release\n",
		res.at.Sub(bfStart).Round(time.Millisecond), lockEnd.Sub(lockStart).Round(time.Millisecond),
		lockStart.Sub(bfStart).Round(time.Millisecond), lockEnd.Sub(bfStart).Round(time.Millisecond), res.at.Sub(lockEnd).Round(time.Millisecond))
	fmt.Printf("- rows/s overall: %.0f\n", float64(res.rep.Counts.Read)/res.at.Sub(bfStart).Seconds())
	if werr != nil {
		fmt.Printf("- waits: %v\n", werr)
	} else {
		var maxWaited time.Duration
		maxTimeout, named, final := 0, 0, 0
		codes := map[string]int{}
		for _, w := range waits {
			maxWaited = max(maxWaited, w.Waited)
			if n, err := strconv.Atoi(w.LockTimeout); err == nil {
				maxTimeout = max(maxTimeout, n)
			}
			for _, b := range w.Blockers {
				if b.PID == lockerPID && b.ApplicationName == "bench-locker" {
					named++
					break
				}
			}
			if w.Final {
				final++
			}
			codes[w.SQLState]++
		}
		fmt.Printf("- waits recorded (manifest waits table): %d %v; longest lock_timeout %d ms; longest wait %v; %d name the locker (pid %d, application_name bench-locker); %d ended an attempt\n",
			len(waits), codes, maxTimeout, maxWaited.Round(time.Millisecond), named, lockerPID, final)
		if len(waits) > 0 {
			fmt.Printf("- first blocker recorded: %s\n", firstBlocker(waits))
		}
	}
	fmt.Printf("- backfill sessions' longest lock wait, sampled every 20 ms: %v\n\n", s.backfillMax.Round(time.Millisecond))
	fmt.Printf("## pgbench\n\n")
	fmt.Printf("- longest lock wait of a pgbench session with a backfill session among its blockers (pg_blocking_pids, sampled every 20 ms): %v (%d samples)\n",
		s.appByBackfillMax.Round(time.Millisecond), s.appByBackfillN)
	fmt.Printf("- longest lock wait of a pgbench session behind anyone (the locker included): %v\n\n", s.appAnyMax.Round(time.Millisecond))
	fmt.Println("| window | TPC-B tx | TPS | p99 latency | max latency | reader tx | reader max latency |")
	fmt.Println("|---|---|---|---|---|---|---|")
	windows := []struct {
		name     string
		from, to time.Time
	}{
		{"alone (before the backfill)", begin, bfStart},
		{"backfill, target not locked", bfStart, lockStart},
		{"target locked", lockStart, lockEnd},
		{"after the release, backfill running", lockEnd, res.at},
		{"after the backfill", res.at, end},
	}
	for _, w := range windows {
		a, b := benchpg.Window(lat, w.from, w.to), benchpg.Window(rlat, w.from, w.to)
		secs := w.to.Sub(w.from).Seconds()
		fmt.Printf("| %s | %d | %.0f | %s | %s | %d | %s |\n", w.name, len(a), float64(len(a))/math.Max(secs, 0.001),
			benchpg.Pct(a, 0.99), benchpg.Pct(a, 1), len(b), benchpg.Pct(b, 1))
	}
	return nil
}

func describeTable(rs []backfill.LockRetry) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%v/%v", r.Timeout, r.Sleep)
	}
	return strings.Join(parts, ", ")
}

func firstBlocker(ws []backfilltype.Wait) string {
	for _, w := range ws {
		if len(w.Blockers) > 0 {
			b := w.Blockers[0]
			return fmt.Sprintf("chunk %d try %d (%s, lock_timeout %s ms, waited %v): pid %d application_name %q state %q query %q",
				w.Seq, w.Try, w.SQLState, w.LockTimeout, w.Waited.Round(time.Millisecond), b.PID, b.ApplicationName, b.State, b.Query)
		}
	}
	return "none"
}

// lockSamples are the longest lock waits seen by sampleLocks.
type lockSamples struct {
	appByBackfillMax time.Duration
	appByBackfillN   int
	appAnyMax        time.Duration
	backfillMax      time.Duration
}

// sampleLocks samples every 20 ms the sessions waiting for a lock
// (pg_locks.waitstart) with their blockers (pg_blocking_pids), until ctx
// ends; then it sends the longest waits seen.
func sampleLocks(ctx context.Context, db *sqlx.DB) <-chan lockSamples {
	out := make(chan lockSamples, 1)
	go func() {
		var s lockSamples
		defer func() { out <- s }()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var rows []struct {
				App        string  `db:"app"`
				Waited     float64 `db:"waited"`
				ByBackfill bool    `db:"by_backfill"`
			}
			err := db.SelectContext(ctx, &rows, `SELECT a.application_name AS app,
				extract(epoch FROM clock_timestamp() - min(l.waitstart))::float8 AS waited,
				EXISTS (SELECT 1 FROM unnest(pg_blocking_pids(a.pid)) b(pid) JOIN pg_stat_activity ba ON ba.pid = b.pid
					WHERE ba.application_name LIKE 'backfill %') AS by_backfill
				FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid AND NOT l.granted AND l.waitstart IS NOT NULL
				WHERE a.application_name LIKE 'pgbench%' OR a.application_name LIKE 'backfill %'
				GROUP BY a.pid, a.application_name`)
			if err != nil {
				continue
			}
			for _, r := range rows {
				d := time.Duration(r.Waited * float64(time.Second))
				switch {
				case strings.HasPrefix(r.App, "backfill "):
					s.backfillMax = max(s.backfillMax, d)
				default:
					s.appAnyMax = max(s.appAnyMax, d)
					if r.ByBackfill {
						s.appByBackfillN++
						s.appByBackfillMax = max(s.appByBackfillMax, d)
					}
				}
			}
		}
	}()
	return out
}
