// Command throttlereact measures how throttles react, with two worker
// processes (this binary re-executed with -child) running one job, each
// with Concurrency 2 and a SQLSignal that reads a control row the parent
// sets:
//
//  1. reaction: the parent raises the signal (recording the server's
//     clock_timestamp) and reads, per process, when its hold began
//     (throttle_periods.started_at) and when its last chunk began
//     (chunks.started_at, from the same host's clock): every worker of
//     both processes holds once both are at most one check interval
//     after the raise. Repeated -trials times; the largest is reported.
//  2. flapping: the signal sits at the threshold (alternating just above
//     and just below High every 20 ms) for -sit, read every -sit-interval;
//     the holds per process are counted, with MinHold -min-hold and no
//     band (Low = High, the worst case), then with MinHold 0 for
//     contrast.
//
// It prints the figures; it makes no assertion. The database is a
// throwaway server started with pgtest.Start (or DATABASE_URL).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/pgurl"
)

const envURL = "THROTTLEREACT_URL"

func main() {
	child := flag.String("child", "", "internal: run as worker process with this worker ID")
	job := flag.String("job", "react", "internal: job name")
	interval := flag.Duration("interval", backfillthrottle.DefaultThrottleInterval, "Config.ThrottleInterval of the reaction phase")
	sitInterval := flag.Duration("sit-interval", 100*time.Millisecond, "Config.ThrottleInterval of the flapping phase (short: many readings)")
	minHold := flag.Duration("min-hold", 2*time.Second, "Throttle.MinHold of the flapping phase")
	sit := flag.Duration("sit", 10*time.Second, "how long the signal sits at the threshold")
	trials := flag.Int("trials", 5, "reaction trials")
	flag.Parse()
	if *child != "" {
		runChild(*child, *job, *interval, *minHold)
		return
	}
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if err := pgurl.Check(url); url != "" && err != nil {
		log.Fatalf("DATABASE_URL: %v", err)
	}
	if url == "" {
		srv, err := pgtest.Start(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer func() { _ = srv.Stop() }()
		url = srv.URL()
	}
	db := sqlx.MustOpen("postgres", url)
	defer db.Close()
	db.MustExec(`DROP TABLE IF EXISTS react_target, react_ctl`)
	db.MustExec(`CREATE TABLE react_target (id bigint PRIMARY KEY, v text NOT NULL)`)
	db.MustExec(`CREATE TABLE react_ctl (v float8 NOT NULL, raised_at timestamptz)`)
	db.MustExec(`INSERT INTO react_ctl VALUES (0, NULL)`)
	if err := backfill.NewPGManifest("").Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}

	fmt.Printf("## Throttle reaction (2 processes x Concurrency 2, ThrottleInterval %v)\n\n", *interval)
	stop := start(url, "react", *interval, 0)
	worst := time.Duration(0)
	waitWorking(db, "react")
	for i := range *trials {
		var raised time.Time
		db.MustExec(`UPDATE react_ctl SET v = 100, raised_at = clock_timestamp()`)
		if err := db.Get(&raised, `SELECT raised_at FROM react_ctl`); err != nil {
			log.Fatal(err)
		}
		time.Sleep(*interval + 2*time.Second)
		type row struct {
			Worker    string    `db:"worker_id"`
			HoldAt    time.Time `db:"hold_at"`
			LastChunk time.Time `db:"last_chunk"`
		}
		var rows []row
		if err := db.Select(&rows, `SELECT w.worker_id, min(p.started_at) AS hold_at,
				(SELECT max(c.started_at) FROM backfill.chunks c WHERE c.batch_id = w.batch_id AND c.worker = w.worker_id) AS last_chunk
			FROM backfill.workers w JOIN backfill.throttle_periods p ON p.worker_key = w.worker_key AND p.started_at >= $1
			WHERE w.job_name = 'react' AND w.state = 'working' GROUP BY w.worker_id, w.batch_id ORDER BY 1`, raised); err != nil {
			log.Fatal(err)
		}
		if len(rows) != 2 {
			log.Fatalf("trial %d: %d processes held, want 2", i, len(rows))
		}
		for _, r := range rows {
			hold := r.HoldAt.Sub(raised)
			last := max(r.LastChunk.Sub(raised), 0)
			worst = max(worst, hold, last)
			fmt.Printf("trial %d: process %s held %v after the raise; its last chunk began %v after the raise\n",
				i+1, r.Worker, hold.Round(time.Millisecond), last.Round(time.Millisecond))
		}
		db.MustExec(`UPDATE react_ctl SET v = 0`)
		waitWorking(db, "react")
	}
	stop()
	fmt.Printf("\nReaction: every worker of both processes held within %v of the raise (check interval %v).\n\n", worst.Round(time.Millisecond), *interval)

	fmt.Printf("## Signal sitting at the threshold for %v (High 50, Low = High: no band; ThrottleInterval %v)\n\n", *sit, *sitInterval)
	for _, mh := range []time.Duration{*minHold, 0} {
		jobName := "sit_" + strconv.FormatInt(mh.Milliseconds(), 10)
		db.MustExec(`UPDATE react_ctl SET v = 0`)
		stop := start(url, jobName, *sitInterval, mh)
		waitWorking(db, jobName)
		var from time.Time
		if err := db.Get(&from, `SELECT clock_timestamp()`); err != nil {
			log.Fatal(err)
		}
		end := time.Now().Add(*sit)
		for up := true; time.Now().Before(end); up = !up {
			v := 49.9
			if up {
				v = 50.1
			}
			db.MustExec(`UPDATE react_ctl SET v = $1`, v)
			time.Sleep(20 * time.Millisecond)
		}
		var counts []struct {
			Worker string `db:"worker_id"`
			Holds  int    `db:"holds"`
		}
		if err := db.Select(&counts, `SELECT w.worker_id, count(*) AS holds FROM backfill.throttle_periods p
			JOIN backfill.workers w ON w.worker_key = p.worker_key
			WHERE w.job_name = $1 AND p.started_at >= $2 GROUP BY 1 ORDER BY 1`, jobName, from); err != nil {
			log.Fatal(err)
		}
		stop()
		bound := "unbounded"
		if mh > 0 {
			bound = fmt.Sprintf("at most %d (one per hold period)", int(*sit/mh)+1)
		}
		for _, c := range counts {
			fmt.Printf("MinHold %v: process %s: %d holds (and releases) in %v; %s\n", mh, c.Worker, c.Holds, *sit, bound)
		}
	}
}

// start starts the two worker processes of job; stop kills them.
func start(url, job string, interval, minHold time.Duration) (stop func()) {
	var cmds []*exec.Cmd
	for i := range 2 {
		cmd := exec.Command(os.Args[0], "-child", fmt.Sprintf("p%d", i), "-job", job, "-interval", interval.String(), "-min-hold", minHold.String())
		cmd.Env = append(os.Environ(), envURL+"="+url)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			log.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	return func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
}

// waitWorking waits until both processes of job have begun a chunk in
// the last half second.
func waitWorking(db *sqlx.DB, job string) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		err := db.Get(&n, `SELECT count(DISTINCT c.worker) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id)
			WHERE r.job_name = $1 AND r.status = 'running' AND c.started_at > now() - interval '500 ms'`, job)
		if err == nil && n == 2 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Fatalf("job %s: the two processes are not working", job)
}

func runChild(id, job string, interval, minHold time.Duration) {
	db := sqlx.MustOpen("postgres", os.Getenv(envURL))
	db.SetMaxOpenConns(6)
	r, err := backfill.New(db, &backfill.Config{
		WorkerID: id, Concurrency: 2, ThrottleInterval: interval,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		Throttles: []backfillthrottle.Throttle{{
			Signal: backfillthrottle.SQLSignal("ctl", `SELECT v FROM react_ctl`),
			High:   50, MinHold: minHold,
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	_, err = r.Run(context.Background(), backfill.Job{
		Name:    job,
		Chunker: backfill.IntRange(0, 2_000_000, 100), // 20,000 chunks: never done while measured
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			time.Sleep(10 * time.Millisecond) // a chunk of work
			return w.Write(ctx, c.Lo, "x")
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "react_target", Key: []string{"id"}},
	})
	if err != nil {
		log.Print(err)
	}
}
