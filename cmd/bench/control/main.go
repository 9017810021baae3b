// Command benchcontrol measures how fast a pause issued from SQL stops
// every worker of several processes, with -procs worker processes (this
// binary re-executed with -child), each a Runner with -concurrency
// workers, running one job whose chunks take about -chunk-time each.
//
// One trial: the parent (a separate connection, as psql would be) calls
// SELECT backfill.pause(batch, ...) and notes the time t the call
// returned (the pause is committed). Measured per trial, from the
// processes' own clocks (one host):
//
//   - observed: the largest (over processes) of the moment the process's
//     Runner logged that the run is paused (its control read, on the
//     notification, at a throttle check or after a chunk) minus t: from
//     then on none of its workers claims;
//   - returned: the largest of the moment its Run returned ErrRunPaused
//     (its chunks in flight finished and checkpointed, the run's end
//     recorded, its report read) minus t;
//   - started after: chunks whose start (chunks.started_at, the
//     worker's clock read after its claim returned) is later than t.
//     The claim itself refuses a run that is not running, so these are
//     claims committed before the pause whose worker read its clock
//     after t (a busy host), never claims made after the pause.
//
// The parent then resumes the run from SQL; the processes, which poll
// the run's status, Run again. After -trials trials it prints p50, p99
// and max of stop, then cancels the run once and checks that every
// chunk is done or pending, with no lease left.
//
// It prints the figures; it makes no assertion. The database is a
// throwaway server started with pgtest.Start (or DATABASE_URL).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/pgurl"
)

const envURL = "BENCHCONTROL_URL"

func main() {
	child := flag.String("child", "", "internal: run as worker process with this worker ID")
	procs := flag.Int("procs", 3, "worker processes")
	conc := flag.Int("concurrency", 2, "Config.Concurrency of each process")
	trials := flag.Int("trials", 20, "pause trials")
	chunkTime := flag.Duration("chunk-time", 50*time.Millisecond, "how long each chunk's extraction takes")
	interval := flag.Duration("interval", backfillthrottle.DefaultThrottleInterval, "Config.ThrottleInterval (the control poll)")
	listen := flag.Bool("listen", true, "Config.ListenURL: LISTEN for control notifications on a direct connection")
	flag.Parse()
	if *child != "" {
		runChild(*child, *conc, *chunkTime, *interval, *listen)
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
	db.MustExec(`DROP SCHEMA IF EXISTS backfill CASCADE`)
	db.MustExec(`DROP TABLE IF EXISTS control_target`)
	db.MustExec(`CREATE TABLE control_target (id bigint PRIMARY KEY, v text NOT NULL)`)
	if err := backfill.NewPGManifest("").Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}

	fmt.Printf("## Pause from SQL: %d processes x Concurrency %d, chunks of ~%v, ThrottleInterval %v, LISTEN %v\n\n",
		*procs, *conc, *chunkTime, *interval, *listen)
	events := make(chan event, 64)
	var wg sync.WaitGroup
	var cmds []*exec.Cmd
	for i := range *procs {
		id := fmt.Sprintf("p%d", i+1)
		cmd := exec.Command(os.Args[0], "-child", id, "-concurrency", strconv.Itoa(*conc), "-chunk-time", chunkTime.String(),
			"-interval", interval.String(), "-listen="+strconv.FormatBool(*listen))
		cmd.Env = append(os.Environ(), envURL+"="+url)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			log.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			log.Fatal(err)
		}
		cmds = append(cmds, cmd)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) == 2 {
					ns, _ := strconv.ParseInt(f[1], 10, 64)
					events <- event{proc: id, what: f[0], at: time.Unix(0, ns)}
				}
			}
		}()
	}
	batch := waitProgress(db, 0, 10)
	var stops, observes []time.Duration
	for trial := range *trials {
		var t time.Time
		if _, err := db.Exec(`SELECT backfill.pause($1::bigint, 'benchcontrol', $2)`, batch, fmt.Sprint("trial ", trial+1)); err != nil {
			log.Fatal(err)
		}
		t = time.Now()
		stop, observed := time.Duration(0), time.Duration(0)
		seen := map[string]bool{}
		var each []string
		for len(seen) < *procs {
			e := <-events
			switch e.what {
			case "observed":
				observed = max(observed, e.at.Sub(t))
				each = append(each, fmt.Sprintf("%s %.1f", e.proc, ms(e.at.Sub(t))))
			case "paused":
				seen[e.proc] = true
				stop = max(stop, e.at.Sub(t))
			}
		}
		var after int
		if err := db.Get(&after, `SELECT count(*) FROM backfill.chunks WHERE batch_id = $1 AND started_at > $2`, batch, t); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("trial %2d: observed by the last process %6.1f ms after the pause (%s); every Run returned %7.1f ms after; chunks started after: %d\n",
			trial+1, ms(observed), strings.Join(each, ", "), ms(stop), after)
		stops = append(stops, stop)
		observes = append(observes, observed)
		var done int
		_ = db.Get(&done, `SELECT count(*) FROM backfill.chunks WHERE batch_id = $1 AND status = 'done'`, batch)
		if _, err := db.Exec(`SELECT backfill.resume($1::bigint, 'benchcontrol', 'next trial')`, batch); err != nil {
			log.Fatal(err)
		}
		waitProgress(db, batch, done+2*(*procs)*(*conc))
	}
	for _, d := range []struct {
		what string
		ds   []time.Duration
	}{{"every process observed the pause (stopped claiming)", observes}, {"every Run returned ErrRunPaused (chunks in flight finished)", stops}} {
		slices.Sort(d.ds)
		q := func(p float64) time.Duration { return d.ds[min(len(d.ds)-1, int(p*float64(len(d.ds))))] }
		fmt.Printf("\n%s, over %d trials: p50 %.1f ms, p99 %.1f ms, max %.1f ms", d.what, len(d.ds), ms(q(0.5)), ms(q(0.99)), ms(d.ds[len(d.ds)-1]))
	}
	fmt.Print("\n\n")

	if _, err := db.Exec(`SELECT backfill.cancel($1::bigint, 'benchcontrol', 'end of the measurement')`, batch); err != nil {
		log.Fatal(err)
	}
	t := time.Now()
	for _, c := range cmds {
		_ = c.Wait()
	}
	wg.Wait()
	var st []struct {
		Status string `db:"status"`
		N      int    `db:"n"`
	}
	if err := db.Select(&st, `SELECT status, count(*) AS n FROM backfill.chunks WHERE batch_id = $1 GROUP BY status ORDER BY status`, batch); err != nil {
		log.Fatal(err)
	}
	var leased, rows, inserted int64
	_ = db.Get(&leased, `SELECT count(*) FROM backfill.chunks WHERE batch_id = $1 AND lease_key IS NOT NULL`, batch)
	_ = db.Get(&rows, `SELECT count(*) FROM control_target`)
	_ = db.Get(&inserted, `SELECT coalesce(sum(rows_inserted), 0) FROM backfill.chunks WHERE batch_id = $1 AND status = 'done'`, batch)
	var status string
	_ = db.Get(&status, `SELECT status FROM backfill.runs WHERE batch_id = $1`, batch)
	fmt.Printf("cancel: every process exited %.1f ms after it; run %s; chunks by status %v; leases left %d; target rows %d = rows inserted by done chunks %d\n",
		ms(time.Since(t)), status, st, leased, rows, inserted)
}

// chunks is the plan's size: enough for every trial.
const chunks = 5000

var outMu sync.Mutex

// say prints one event line of the child protocol.
func say(what string, at time.Time) {
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Println(what, at.UnixNano())
}

// observer reports the moment the Runner logs that its run was paused
// (the control state read by the monitor, after a chunk or on a
// notification): the process stops claiming from then on.
type observer struct{ slog.Handler }

func (o observer) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || o.Handler.Enabled(ctx, l)
}

func (o observer) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "backfill: run paused") {
		say("observed", r.Time)
	}
	if r.Level >= slog.LevelError {
		return o.Handler.Handle(ctx, r)
	}
	return nil
}

func (o observer) WithAttrs(as []slog.Attr) slog.Handler { return observer{o.Handler.WithAttrs(as)} }
func (o observer) WithGroup(g string) slog.Handler       { return observer{o.Handler.WithGroup(g)} }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type event struct {
	proc, what string
	at         time.Time
}

// waitProgress waits until the job's run (batch, or the job's run when 0)
// has n done chunks and returns its batch id.
func waitProgress(db *sqlx.DB, batch int64, n int) int64 {
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var b struct {
			Batch int64 `db:"batch_id"`
			Done  int   `db:"done"`
		}
		err := db.Get(&b, `SELECT r.batch_id, count(*) FILTER (WHERE c.status = 'done') AS done FROM backfill.runs r
			JOIN backfill.chunks c USING (batch_id) WHERE r.job_name = 'control' AND (r.batch_id = $1 OR $1 = 0) GROUP BY r.batch_id`, batch)
		if err == nil && b.Done >= n {
			return b.Batch
		}
	}
	log.Fatal("benchcontrol: no progress")
	return 0
}

func runChild(id string, conc int, chunkTime, interval time.Duration, listen bool) {
	ctx := context.Background()
	url := os.Getenv(envURL)
	db := sqlx.MustOpen("postgres", url)
	defer db.Close()
	db.SetMaxOpenConns(conc + 4)
	// ReturnOnPause: the bench measures when each Run returns on a pause
	// (by default Run waits for the resume).
	cfg := &backfill.Config{WorkerID: id, Concurrency: conc, ThrottleInterval: interval, ReturnOnPause: true,
		Logger: slog.New(observer{slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})})}
	if listen {
		cfg.ListenURL = url
	}
	r, err := backfill.New(db, cfg)
	if err != nil {
		log.Fatal(err)
	}
	job := backfill.Job{
		Name:     "control",
		Chunker:  backfill.IntRange(0, int64(10*chunks), 10),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "control_target", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, "v"); err != nil {
					return err
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(chunkTime):
			}
			return nil
		}),
	}
	for {
		_, err := r.Run(ctx, job)
		now := time.Now()
		switch {
		case errors.Is(err, backfill.ErrRunCancelled):
			say("cancelled", now)
			return
		case errors.Is(err, backfill.ErrRunPaused):
			say("paused", now)
		default:
			log.Fatalf("%s: run: %v", id, err)
		}
		// Paused: wait for a resume (or a cancel), as a supervisor would.
		for {
			time.Sleep(20 * time.Millisecond)
			var status string
			if err := db.Get(&status, `SELECT status FROM backfill.runs WHERE job_name = 'control' ORDER BY batch_id DESC LIMIT 1`); err != nil {
				log.Fatal(err)
			}
			if status == string(backfill.RunRunning) || status == string(backfill.RunCancelled) {
				break
			}
		}
	}
}
