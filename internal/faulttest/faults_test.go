//go:build faults

package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the "postgres" database/sql driver

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// Environment of the suite.
const (
	envSeed   = "BACKFILL_FAULTS_SEED"   // reproduce a run: the seed it logged
	envRounds = "BACKFILL_FAULTS_ROUNDS" // rounds of random faults (default 3)
	envLogDir = "BACKFILL_FAULTS_LOGDIR" // keep the workers' logs there (default: a temporary directory)
	// 1: loopback hosts even where network namespaces can be made (the
	// fallback's own check).
	envLoopback = "BACKFILL_FAULTS_LOOPBACK"
)

const (
	numHosts       = 3
	workersPerHost = 2
	// The workers' liveness settings (Config.HeartbeatInterval,
	// Config.StaleAfter): shorter than the defaults (5 s, 30 s), so that
	// fencing happens within the suite's few minutes.
	heartbeatInterval = time.Second
	staleAfter        = 5 * time.Second
	// bound is how long a healthy worker may wait behind a frozen or
	// cut-off one: the documented bound for these settings (doc.go, "Many
	// workers and hosts": StaleAfter + HeartbeatInterval + 1 s; 36 s with
	// the defaults, within a minute).
	bound = staleAfter + heartbeatInterval + time.Second
	// slack is what the assertions allow beyond the bound: the bound's
	// worst case (a holder frozen just after its heartbeat, polls that
	// just miss StaleAfter) reaches it exactly, and each poll and claim
	// takes a few milliseconds more on a machine of 2 cores running 6
	// workers and the server.
	slack = 500 * time.Millisecond
)

// summary is what the suite did, printed at the end for the closing note.
type summary struct {
	mu           sync.Mutex
	mode         string
	pooler       string
	seed         int64
	runs         []string
	faults       map[string]int
	mergedTwice  int
	longestWait  time.Duration
	waitWhere    string
	longestLog   time.Duration // the longest "waited" the workers logged
	logWhere     string
	longestJoin  time.Duration
	joinWhere    string
	workerStarts int
	exitCodes    map[int]int // worker exits by code (-1: killed by the suite)
}

func (s *summary) print(t *testing.T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var kinds []string
	for k, n := range s.faults {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(kinds)
	var b strings.Builder
	fmt.Fprintf(&b, "\n=== fault suite summary (seed %d; reproduce: %s=%d) ===\n", s.seed, envSeed, s.seed)
	fmt.Fprintf(&b, "hosts: %d (%s), %d workers per host, %s\n", numHosts, s.mode, workersPerHost, s.pooler)
	fmt.Fprintf(&b, "runs: %d (%s)\n", len(s.runs), strings.Join(s.runs, "; "))
	fmt.Fprintf(&b, "faults injected: %s\n", strings.Join(kinds, " "))
	fmt.Fprintf(&b, "worker processes started: %d; exits by code: %s\n", s.workerStarts, codesString(s.exitCodes))
	fmt.Fprintf(&b, "chunks merged twice: %d\n", s.mergedTwice)
	fmt.Fprintf(&b, "liveness settings: HeartbeatInterval %v, StaleAfter %v, bound %v\n", heartbeatInterval, staleAfter, bound)
	fmt.Fprintf(&b, "longest wait of a healthy worker behind a frozen or cut-off one, measured outside: %v (%s)\n", s.longestWait.Round(time.Millisecond), s.waitWhere)
	fmt.Fprintf(&b, "longest wait of a healthy worker, from the workers' logs (waited): %v (%s)\n", s.longestLog.Round(time.Millisecond), s.logWhere)
	fmt.Fprintf(&b, "longest wait of a joining worker (start to \"backfill run\"): %v (%s)\n", s.longestJoin.Round(time.Millisecond), s.joinWhere)
	// Printed, not only logged: make test-faults shows it.
	fmt.Print(b.String())
	t.Log(b.String())
}

// suite is the environment shared by the rounds: hosts, server, pooler,
// the worker binary.
type suite struct {
	t         *testing.T
	nw        *network
	srv       *pgtest.Server
	bouncer   int // PgBouncer's port, 0 when none
	workerBin string
	dir       string
	sum       *summary
	rounds    int // databases made
	logDir    string
}

// TestFaults runs the job of this package on worker processes spread over
// simulated hosts while faults are injected, and checks after each round
// that the job converged exactly: every chunk committed exactly once, the
// target equal to an uninterrupted run's, every chunk balanced, no
// healthy worker held up longer than the bound.
func TestFaults(t *testing.T) {
	s, seed := newSuite(t)
	rounds := 3
	if v := os.Getenv(envRounds); v != "" {
		var err error
		if rounds, err = strconv.Atoi(v); err != nil {
			t.Fatalf("%s=%q: %v", envRounds, v, err)
		}
	}
	defer s.sum.print(t)

	for i := range rounds {
		t.Run(fmt.Sprintf("random_round_%d", i+1), func(t *testing.T) {
			s.random(t, seed+int64(i))
		})
	}
	t.Run("sigstop_worker_holding_chunk", func(t *testing.T) { s.frozen(t, seed, "sigstop") })
	if s.nw.mode == "netns" {
		t.Run("network_split_of_worker_holding_chunk", func(t *testing.T) { s.frozen(t, seed, "cut") })
	}
	t.Run("sigstop_random_point_of_chunk", func(t *testing.T) { s.freezeAnywhere(t, seed) })
	t.Run("joining_worker_gets_chunks", func(t *testing.T) { s.joining(t, seed) })
	t.Run("server_restart_no_worker_exits", func(t *testing.T) { s.restartsSurvived(t, seed) })
	if s.bouncer != 0 {
		t.Run("pgbouncer_every_worker", func(t *testing.T) { s.allPooler(t, seed) })
	}
}

// newSuite starts the suite's server (and PgBouncer when installed) on
// the simulated hosts' network and builds the worker program; seed is
// envSeed's, or the time's.
func newSuite(t *testing.T) (*suite, int64) {
	seed := time.Now().UnixNano()
	if v := os.Getenv(envSeed); v != "" {
		var err error
		if seed, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", envSeed, v, err)
		}
	}
	t.Logf("seed %d (reproduce with %s=%d), bound %v", seed, envSeed, seed, bound)

	s := &suite{t: t, dir: t.TempDir(), sum: &summary{seed: seed, faults: map[string]int{}, exitCodes: map[int]int{}}}
	s.workerBin = buildWorker(t, s.dir)
	if d := os.Getenv(envLogDir); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		s.logDir = d
	} else {
		s.logDir = s.dir
	}
	s.nw = newNetwork(t, numHosts)
	s.sum.mode = s.nw.mode
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	trust := []string{}
	if s.nw.subnet != "" {
		trust = append(trust, s.nw.subnet)
	}
	// synchronous_commit on: an immediate restart must not lose an
	// acknowledged COMMIT, which is not the crash the suite simulates.
	srv, err := pgtest.StartWith(ctx, pgtest.Options{ListenAddresses: s.nw.addrs, TrustNetworks: trust, SynchronousCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	s.srv = srv
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Log(err)
		}
	})
	// A pool as large as the workers' connections: the suite tests the
	// library behind a pooler, not a pool that starves its heartbeats.
	p, err := pgtest.StartPooler(ctx, srv.URL(), pgtest.PoolerOptions{ListenAddresses: s.nw.addrs, PoolSize: 40})
	switch {
	case err == nil:
		t.Cleanup(func() {
			if err := p.Stop(); err != nil {
				t.Log(err)
			}
		})
		s.bouncer = p.Port()
		s.sum.pooler = "every second worker through PgBouncer (transaction mode, ordinary URL)"
		t.Logf("pgbouncer: transaction pooling on port %d", s.bouncer)
	case pgtest.Required(pgtest.PgBouncer):
		t.Fatal(err)
	default:
		t.Logf("pgbouncer: %v; no worker goes through it", err)
		s.sum.pooler = "no PgBouncer (not installed)"
	}
	return s, seed
}

// buildWorker builds the worker program into dir.
func buildWorker(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "worker")
	cmd := exec.Command("go", "build", "-o", bin, "./worker")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./worker: %v\n%s", err, out)
	}
	return bin
}

// round is one run of the job under faults, in a database of its own.
type round struct {
	s       *suite
	t       *testing.T
	name    string
	spec    Spec
	dbURL   string // direct, on 127.0.0.1, for the suite's own queries
	db      *sqlx.DB
	workers []*worker
	rng     *rand.Rand

	mu      sync.Mutex
	events  []event
	windows []window
	faults  map[string]int
	exits   []string    // worker exits with a failure, described
	codes   map[int]int // worker exits by code (-1: killed by the suite)

	// mergedPause is the workers' -merged-pause; merged receives their
	// "merged" records (kind merged, dropped when full).
	mergedPause time.Duration
	merged      chan event
}

// window is a time a worker (or a host's workers) was frozen or cut off.
type window struct {
	kind       string // sigstop, cut
	start, end time.Time
	frozen     map[int]bool // workers frozen or cut off
	held       bool         // a frozen worker held a chunk at the start
	seqs       []int        // the chunks the frozen workers held at the start
}

func (r *round) record(e event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *round) noteExit(w *worker, code int, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exits = append(r.exits, fmt.Sprintf("%s exited %d: %s", w.id, code, msg))
}

// noteCode counts an exit of a worker process by its code.
func (r *round) noteCode(code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.codes[code]++
}

func codesString(m map[int]int) string {
	var codes []int
	for c := range m {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var out []string
	for _, c := range codes {
		name := fmt.Sprint(c)
		if c == -1 {
			name = "killed"
		}
		out = append(out, fmt.Sprintf("%s=%d", name, m[c]))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, " ")
}

func (r *round) fault(kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults[kind]++
}

// roundOptions shape a round.
type roundOptions struct {
	chunks, rows int
	sleep        time.Duration
	// allPooler: every worker through PgBouncer, not every second one.
	allPooler bool
	// mergedPause: the workers pause this long between each chunk's
	// merge and its commit, and say so (round.merged).
	mergedPause time.Duration
}

// newRound creates the round's database, runs the reference job
// uninterrupted into table ref, installs the commit log on the manifest's
// chunks and makes the worker slots (not started).
func (s *suite) newRound(t *testing.T, name string, seed int64, o roundOptions) *round {
	t.Helper()
	ctx := context.Background()
	admin, err := sqlx.Open("postgres", s.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	s.rounds++
	dbName := fmt.Sprintf("faults_%d", s.rounds)
	if _, err := admin.ExecContext(ctx, `DROP DATABASE IF EXISTS "`+dbName+`" WITH (FORCE)`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, `CREATE DATABASE "`+dbName+`" TEMPLATE template0`); err != nil {
		t.Fatal(err)
	}
	r := &round{
		s: s, t: t, name: name, rng: rand.New(rand.NewPCG(uint64(seed), 12)), faults: map[string]int{}, codes: map[int]int{},
		spec:        Spec{Name: "faults", Table: "target", Chunks: o.chunks, RowsPerChunk: o.rows, Sleep: o.sleep},
		dbURL:       dbURL("127.0.0.1", s.srv.Port(), dbName, "faulttest"),
		mergedPause: o.mergedPause, merged: make(chan event, 64),
	}
	r.db, err = sqlx.Open("postgres", r.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.db.Close() })

	// The reference: the same job, uninterrupted, into another table.
	ref := r.spec
	ref.Name, ref.Table, ref.Sleep = "reference", "ref", 0
	for _, sp := range []Spec{ref, r.spec} {
		if err := CreateTarget(ctx, r.db, sp.Table, sp); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(s.workerBin, "-url", r.dbURL, "-job", ref.Name, "-table", ref.Table,
		"-chunks", fmt.Sprint(ref.Chunks), "-rows", fmt.Sprint(ref.RowsPerChunk), "-concurrency", "2", "-id", "reference").CombinedOutput()
	if err != nil {
		t.Fatalf("reference run: %v\n%s", err, tailString(string(out), 4000))
	}
	// Every commit of a chunk as done appends its seq to done_log, in the
	// chunk's transaction: a chunk committed twice shows twice.
	if _, err := r.db.ExecContext(ctx, `
		CREATE TABLE done_log (batch_id bigint NOT NULL, seq int NOT NULL, worker text, at timestamptz NOT NULL DEFAULT clock_timestamp());
		CREATE FUNCTION log_done() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO done_log (batch_id, seq, worker) VALUES (NEW.batch_id, NEW.seq, NEW.worker);
			RETURN NULL;
		END $$;
		CREATE TRIGGER log_done AFTER UPDATE ON backfill.chunks FOR EACH ROW
			WHEN (NEW.status = 'done' AND OLD.status IS DISTINCT FROM 'done') EXECUTE FUNCTION log_done();`); err != nil {
		t.Fatal(err)
	}

	for i := range numHosts * workersPerHost {
		h := s.nw.hosts[i%numHosts]
		w := &worker{r: r, idx: i, host: h, id: fmt.Sprintf("host%d/w%d", h.n, i), via: "direct"}
		w.url = dbURL(h.serverAddr, s.srv.Port(), dbName, strings.ReplaceAll(w.id, "/", "-"))
		if s.bouncer != 0 && (o.allPooler || i%2 == 1) {
			w.via = "pgbouncer"
			w.url = dbURL(h.serverAddr, s.bouncer, dbName, strings.ReplaceAll(w.id, "/", "-"))
		}
		w.logPath = workerLogPath(s.logDir, s.rounds, i)
		_ = os.Remove(w.logPath)
		r.workers = append(r.workers, w)
	}
	return r
}

func dbURL(host string, port int, db, app string) string {
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: fmt.Sprintf("%s:%d", host, port), Path: "/" + db}
	q := url.Values{"sslmode": {"disable"}, "connect_timeout": {"10"}, "application_name": {app}}
	u.RawQuery = q.Encode()
	return u.String()
}

// start starts the supervised workers; done is closed once every worker
// exited 0 (or stop was closed).
func (r *round) start(stop <-chan struct{}) (done <-chan struct{}) {
	ch := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range r.workers {
		wg.Go(func() { w.supervise(stop) })
	}
	go func() { wg.Wait(); close(ch) }()
	return ch
}

// teardown ends every worker process.
func (r *round) teardown() {
	for _, w := range r.workers {
		w.signal(syscall.SIGCONT)
		w.signal(syscall.SIGKILL)
	}
	for _, h := range r.s.nw.hosts {
		if h.veth != "" {
			_ = h.setLink(true)
		}
	}
}

// holding returns the running, unfrozen workers whose last event is the
// start of an extraction: they hold a chunk.
func (r *round) holding() []*worker {
	r.mu.Lock()
	last := map[int]event{}
	for _, e := range r.events {
		last[e.worker] = e
	}
	r.mu.Unlock()
	var out []*worker
	for _, w := range r.workers {
		if _, ok := w.running(); ok && last[w.idx].kind == "extract" {
			out = append(out, w)
		}
	}
	return out
}

// pick returns a random running worker: drawn by index, so that a seed
// replays the same choices (whether the worker holds a chunk at that
// moment depends on timing; with the extractor's sleep it mostly does).
func (r *round) pick() *worker {
	i := r.rng.IntN(len(r.workers))
	for k := range r.workers {
		w := r.workers[(i+k)%len(r.workers)]
		if _, ok := w.running(); ok {
			return w
		}
	}
	return nil
}

func (r *round) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.rng.Int64N(int64(hi-lo)))
}

// sleepOrDone waits d unless done closes first (false then).
func sleepOrDone(d time.Duration, done <-chan struct{}) bool {
	select {
	case <-done:
		return false
	case <-time.After(d):
		return true
	}
}

// freeze stops w (SIGSTOP) for d, or cuts its host off for d, and records
// the window.
func (r *round) freeze(kind string, w *worker, d time.Duration, done <-chan struct{}) {
	r.freezeHeld(kind, w, d, done, r.isHolding(w))
}

// freezeHeld is freeze with the caller's word on whether w holds a chunk
// as it is frozen.
func (r *round) freezeHeld(kind string, w *worker, d time.Duration, done <-chan struct{}, held bool) {
	win := window{kind: kind, start: time.Now(), frozen: map[int]bool{}, held: held}
	for _, o := range r.holding() {
		if o == w || (kind == "cut" && o.host == w.host) {
			win.seqs = append(win.seqs, r.lastEvent(o).seq)
		}
	}
	switch kind {
	case "sigstop":
		if !w.signal(syscall.SIGSTOP) {
			return
		}
		win.frozen[w.idx] = true
		r.t.Logf("fault: SIGSTOP %s for %v (holding a chunk: %v)", w.id, d.Round(time.Millisecond), held)
		sleepOrDone(d, done)
		w.signal(syscall.SIGCONT)
	case "cut":
		if err := w.host.setLink(false); err != nil {
			r.t.Errorf("fault: cut host%d: %v", w.host.n, err)
			return
		}
		for _, o := range r.workers {
			if o.host == w.host {
				win.frozen[o.idx] = true
			}
		}
		r.t.Logf("fault: network cut of host%d (%s) for %v", w.host.n, w.host.veth, d.Round(time.Millisecond))
		sleepOrDone(d, done)
		if err := w.host.setLink(true); err != nil {
			r.t.Errorf("fault: restore host%d: %v", w.host.n, err)
		}
	}
	win.end = time.Now()
	r.fault(kind)
	r.mu.Lock()
	r.windows = append(r.windows, win)
	r.mu.Unlock()
}

// chunkEnded reports whether w, since it began chunk seq at began,
// logged that chunk's end (committed, failed, its lease lost) or exited.
func (r *round) chunkEnded(w *worker, seq int, began time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.worker != w.idx || e.at.Before(began) {
			continue
		}
		if e.kind == "exit" || (e.seq == seq && (e.kind == "done" || e.kind == "failed" || e.kind == "lease-lost")) {
			return true
		}
	}
	return false
}

func (r *round) isHolding(w *worker) bool {
	for _, h := range r.holding() {
		if h == w {
			return true
		}
	}
	return false
}

func (r *round) kill(w *worker) {
	if w.signal(syscall.SIGKILL) {
		r.t.Logf("fault: kill -9 %s", w.id)
		r.fault("kill-9")
	}
}

func (r *round) restartServer() {
	r.t.Logf("fault: server restart (pg_ctl restart -m immediate)")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	win := window{kind: "server-restart", start: time.Now()}
	err := r.s.srv.RestartImmediate(ctx, nil)
	win.end = time.Now()
	r.mu.Lock()
	r.windows = append(r.windows, win)
	r.mu.Unlock()
	if err != nil {
		r.t.Errorf("fault: %v", err)
		return
	}
	r.fault("server-restart")
}

// random is a round of random faults: each kind at least once, in a
// random order, at random times, then more until the job is done.
func (s *suite) random(t *testing.T, seed int64) {
	t.Logf("round seed %d", seed)
	r := s.newRound(t, t.Name(), seed, roundOptions{chunks: 60, rows: 2500, sleep: time.Second})
	kinds := []string{"kill-9", "kill-9", "sigstop", "sigstop", "server-restart"}
	if s.nw.mode == "netns" {
		kinds = append(kinds, "cut", "cut")
	}
	r.rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	extra := []string{"kill-9", "sigstop", "cut", "kill-9"}
	stop := make(chan struct{})
	done := r.start(stop)
	defer r.teardown()
	injected := make(chan struct{})
	go func() {
		defer close(injected)
		for i := 0; ; i++ {
			if !sleepOrDone(r.between(time.Second, 3*time.Second), done) {
				return
			}
			kind := ""
			if i < len(kinds) {
				kind = kinds[i]
			} else {
				kind = extra[r.rng.IntN(len(extra))]
				if kind == "cut" && s.nw.mode != "netns" {
					kind = "sigstop"
				}
			}
			w := r.pick()
			if w == nil {
				continue
			}
			switch kind {
			case "kill-9":
				r.kill(w)
			case "sigstop":
				r.freeze("sigstop", w, r.between(time.Second, 4*time.Second), done)
			case "cut":
				r.freeze("cut", w, r.between(2*time.Second, 6*time.Second), done)
			case "server-restart":
				r.restartServer()
			}
		}
	}()
	r.wait(done, stop, 5*time.Minute)
	<-injected
	r.check()
}

// wait waits until every worker exited 0, or fails t after limit.
func (r *round) wait(done <-chan struct{}, stop chan struct{}, limit time.Duration) {
	select {
	case <-done:
	case <-time.After(limit):
		close(stop)
		r.teardown()
		<-done
		r.t.Fatalf("the job did not converge within %v: %s", limit, r.progress())
	}
}

func (r *round) progress() string {
	var st []struct {
		Status string `db:"status"`
		N      int    `db:"n"`
	}
	if err := r.db.Select(&st, `SELECT c.status, count(*) AS n FROM backfill.chunks c JOIN backfill.runs r USING (batch_id)
		WHERE r.job_name = $1 GROUP BY c.status ORDER BY c.status`, r.spec.Name); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("chunks by status %v", st)
}

// waiting lists the sessions of the round's database that wait for a
// lock, with the sessions blocking them.
func (r *round) waiting() string {
	var rows []struct {
		Pid     int    `db:"pid"`
		App     string `db:"application_name"`
		Wait    string `db:"wait"`
		Query   string `db:"query"`
		Blocked string `db:"blocked_by"`
	}
	if err := r.db.Select(&rows, `SELECT pid, application_name, coalesce(wait_event_type || ':' || wait_event, '') AS wait,
		left(regexp_replace(query, '\s+', ' ', 'g'), 120) AS query,
		(SELECT coalesce(string_agg(b.pid || ' ' || b.application_name || ' (' || b.state || ')', ', '), '')
			FROM pg_stat_activity b WHERE b.pid = ANY (pg_blocking_pids(a.pid))) AS blocked_by
		FROM pg_stat_activity a WHERE datname = current_database() AND wait_event_type = 'Lock' ORDER BY pid`); err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, x := range rows {
		fmt.Fprintf(&b, "  %d %s waits (%s) in %q, blocked by %s\n", x.Pid, x.App, x.Wait, x.Query, x.Blocked)
	}
	return b.String()
}

// check asserts the round's end state and adds it to the summary.
func (r *round) check() {
	t := r.t
	t.Helper()
	ctx := context.Background()
	// A pool of its own: the round's may hold connections a server
	// restart cut, whose first use returns the server's FATAL message.
	db, err := sqlx.Open("postgres", r.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var runs []struct {
		BatchID int64  `db:"batch_id"`
		Status  string `db:"status"`
	}
	if err := db.SelectContext(ctx, &runs, `SELECT batch_id, status FROM backfill.runs WHERE job_name = $1`, r.spec.Name); err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 {
		t.Fatalf("runs of the job: %+v, want one (every worker resumes the same batch)", runs)
	}
	batch := runs[0].BatchID
	if runs[0].Status != string(backfill.RunCompleted) {
		t.Errorf("run status %s, want completed (%s)", runs[0].Status, r.progress())
	}

	// Every chunk committed exactly once.
	var twice, never int
	if err := db.GetContext(ctx, &twice, `SELECT count(*) FROM (SELECT seq FROM done_log WHERE batch_id = $1
		GROUP BY seq HAVING count(*) > 1) d`, batch); err != nil {
		t.Fatal(err)
	}
	if err := db.GetContext(ctx, &never, `SELECT count(*) FROM generate_series(0, $2 - 1) s(seq)
		WHERE NOT EXISTS (SELECT FROM done_log d WHERE d.batch_id = $1 AND d.seq = s.seq)`, batch, r.spec.Chunks); err != nil {
		t.Fatal(err)
	}
	if twice != 0 || never != 0 {
		t.Errorf("chunks merged twice: %d, never: %d (want 0 and 0)", twice, never)
	}

	// The target equals the uninterrupted run's, both ways.
	var missing, extra, nTarget, nRef int
	for q, dst := range map[string]*int{
		`SELECT count(*) FROM (SELECT id, name, bucket, amount FROM ref EXCEPT SELECT id, name, bucket, amount FROM target) d`: &missing,
		`SELECT count(*) FROM (SELECT id, name, bucket, amount FROM target EXCEPT SELECT id, name, bucket, amount FROM ref) d`: &extra,
		`SELECT count(*) FROM target`: &nTarget,
		`SELECT count(*) FROM ref`:    &nRef,
	} {
		if err := db.GetContext(ctx, dst, q); err != nil {
			t.Fatal(err)
		}
	}
	if missing != 0 || extra != 0 || nTarget != nRef {
		t.Errorf("target differs from the uninterrupted run: %d rows missing, %d extra, %d rows vs %d", missing, extra, nTarget, nRef)
	}

	// Every chunk balanced, and counted as the uninterrupted run counted
	// it (chunks are disjoint ranges of keys: their counts do not depend
	// on order).
	var unbalanced, differ int
	if err := db.GetContext(ctx, &unbalanced, `SELECT count(*) FROM backfill.chunks WHERE batch_id = $1 AND
		rows_read <> rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated`, batch); err != nil {
		t.Fatal(err)
	}
	if err := db.GetContext(ctx, &differ, `SELECT count(*) FROM backfill.chunks c JOIN backfill.chunks f USING (seq)
		JOIN backfill.runs rr ON rr.batch_id = f.batch_id AND rr.job_name = 'reference'
		WHERE c.batch_id = $1 AND (c.rows_read, c.rows_inserted, c.rows_updated, c.rows_unchanged, c.rows_rejected, c.rows_deduplicated)
			IS DISTINCT FROM (f.rows_read, f.rows_inserted, f.rows_updated, f.rows_unchanged, f.rows_rejected, f.rows_deduplicated)`, batch); err != nil {
		t.Fatal(err)
	}
	if unbalanced != 0 || differ != 0 {
		t.Errorf("chunks unbalanced: %d, counted otherwise than by the uninterrupted run: %d (want 0 and 0)", unbalanced, differ)
	}
	var exFaults, exRef int
	if err := db.GetContext(ctx, &exFaults, `SELECT count(*) FROM backfill.exceptions WHERE batch_id = $1 AND failed_attempt IS NULL`, batch); err != nil {
		t.Fatal(err)
	}
	if err := db.GetContext(ctx, &exRef, `SELECT count(*) FROM backfill.exceptions e JOIN backfill.runs USING (batch_id)
		WHERE job_name = 'reference' AND failed_attempt IS NULL`); err != nil {
		t.Fatal(err)
	}
	if exFaults != exRef {
		t.Errorf("exception queue: %d rows, uninterrupted run: %d", exFaults, exRef)
	}

	wait, where := r.longestHealthyWait(time.Now())
	logWait, logWhere := r.longestLoggedWait()
	joinWait, joinWhere := r.longestJoinWait(time.Now())
	if wait > bound+slack {
		t.Errorf("a healthy worker waited %v behind a frozen or cut-off one, measured outside (%s), bound %v", wait.Round(time.Millisecond), where, bound)
	}
	if logWait > bound+slack {
		t.Errorf("a healthy worker logged a wait of %v (%s), bound %v", logWait.Round(time.Millisecond), logWhere, bound)
	}
	if joinWait > bound+slack {
		t.Errorf("a joining worker took %v to join the run (%s), bound %v", joinWait.Round(time.Millisecond), joinWhere, bound)
	}

	r.mu.Lock()
	starts := 0
	for _, w := range r.workers {
		w.mu.Lock()
		starts += w.starts
		w.mu.Unlock()
	}
	var kinds []string
	for k, n := range r.faults {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(kinds)
	t.Logf("round %s: %d chunks x %d ids, faults %s, worker starts %d, exits by code %s, merged twice %d, longest healthy wait %v outside (%s), %v logged (%s), longest join wait %v (%s)",
		r.name, r.spec.Chunks, r.spec.RowsPerChunk, strings.Join(kinds, " "), starts, codesString(r.codes), twice,
		wait.Round(time.Millisecond), where, logWait.Round(time.Millisecond), logWhere, joinWait.Round(time.Millisecond), joinWhere)
	for _, e := range r.exits {
		t.Logf("  %s", e)
	}
	sum := r.s.sum
	sum.mu.Lock()
	sum.runs = append(sum.runs, fmt.Sprintf("%s: %s", strings.TrimPrefix(r.name, "TestFaults/"), strings.Join(kinds, " ")))
	for k, n := range r.faults {
		sum.faults[k] += n
	}
	sum.mergedTwice += twice
	sum.workerStarts += starts
	for c, n := range r.codes {
		sum.exitCodes[c] += n
	}
	if wait > sum.longestWait || sum.waitWhere == "" {
		sum.longestWait, sum.waitWhere = wait, where
	}
	if logWait > sum.longestLog || sum.logWhere == "" {
		sum.longestLog, sum.logWhere = logWait, logWhere
	}
	if joinWait > sum.longestJoin || sum.joinWhere == "" {
		sum.longestJoin, sum.joinWhere = joinWait, joinWhere
	}
	sum.mu.Unlock()
	r.mu.Unlock()
	if t.Failed() {
		for _, w := range r.workers {
			b, _ := os.ReadFile(w.logPath)
			t.Logf("--- %s (%s) log tail ---\n%s", w.id, w.via, tailString(string(b), 3000))
		}
		t.Logf("--- server log tail ---\n%s", r.s.srv.LogTail())
	}
}

// longestHealthyWait is the longest time a healthy worker (running, not
// frozen or cut off itself) went without progress while another worker
// that held a chunk was frozen or cut off. Progress is a process start,
// the start of an extraction, a chunk committed, an exit; the extractor's
// own sleep is not counted as waiting, nor the time after the frozen
// workers' chunks were claimed again or committed (the healthy worker may
// then wait for a healthy holder of such a chunk). This is measured from
// the outside; longestLoggedWait is what the workers logged.
func (r *round) longestHealthyWait(now time.Time) (time.Duration, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.windows) == 0 {
		return 0, "no freeze"
	}
	per := map[int][]event{}
	for _, e := range r.events {
		switch e.kind {
		case "start", "joined", "extract", "done", "exit":
			per[e.worker] = append(per[e.worker], e)
		}
	}
	var longest time.Duration
	where := "no healthy worker waited"
	for idx, evs := range per {
		running := evs[len(evs)-1].kind != "exit"
		if running {
			evs = append(evs, event{at: now, worker: idx, kind: "now"})
		}
		for i := 1; i < len(evs); i++ {
			a, b := evs[i-1], evs[i]
			if a.kind == "exit" || a.kind == "start" {
				// Not running between these, or joining: a joining
				// worker's wait on the run row is longestJoinWait's.
				continue
			}
			from := a.at
			if a.kind == "extract" {
				from = from.Add(r.spec.Sleep)
			}
			for _, win := range r.windows {
				if !win.held || win.frozen[idx] || b.at.Before(win.start) || a.at.After(win.end) {
					continue
				}
				if r.frozenDuring(idx, a.at, b.at) {
					continue
				}
				// Held up by this window's frozen workers from the
				// freeze (or the gap's start) until their chunks were
				// released, they were thawed, or the gap ended.
				end := b.at
				if win.end.Before(end) {
					end = win.end
				}
				if c, ok := r.released(win); ok && c.Before(end) {
					end = c
				}
				gap := end.Sub(later(from, win.start))
				if gap > longest {
					longest = gap
					where = fmt.Sprintf("%s after %q during a %s of %v", r.workers[idx].id, a.kind, win.kind, win.end.Sub(win.start).Round(time.Millisecond))
				}
			}
		}
	}
	return longest, where
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// frozenOverlap is the longest time within [a, b] that worker idx was
// frozen or cut off in one window.
func (r *round) frozenOverlap(idx int, a, b time.Time) time.Duration {
	var longest time.Duration
	for _, w := range r.windows {
		if !w.frozen[idx] {
			continue
		}
		end := b
		if w.end.Before(end) {
			end = w.end
		}
		if d := end.Sub(later(a, w.start)); d > longest {
			longest = d
		}
	}
	return longest
}

// released returns when the last of the chunks the frozen workers of win
// held was released: claimed by another worker (its extraction began),
// committed or failed.
func (r *round) released(win window) (time.Time, bool) {
	var last time.Time
	for _, seq := range win.seqs {
		var at time.Time
		for _, e := range r.events {
			if e.seq == seq && e.at.After(win.start) && ((e.kind == "extract" && !win.frozen[e.worker]) || e.kind == "done" || e.kind == "failed") {
				at = e.at
				break
			}
		}
		if at.IsZero() {
			return time.Time{}, false
		}
		if at.After(last) {
			last = at
		}
	}
	return last, !last.IsZero()
}

// longestLoggedWait is the longest a worker waited for one holder of one
// chunk by its own log: the library logs each chunk it waits for with
// the holder and how long it has waited ("waited"), once per poll; the
// wait behind a holder runs from the first record naming it to the last,
// plus a poll interval, and counts only while the holder was frozen or
// cut off (a holder thawed in between heartbeats and is healthy again).
// Left out: waits during which the waiting worker was itself frozen or
// cut off (its clock ran on while it could not look), or the server
// restarted.
func (r *round) longestLoggedWait() (time.Duration, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	type key struct {
		worker, episode, seq int
		holder               string
	}
	type span struct {
		first, last event
	}
	spans := map[key]*span{}
	episode, lastWaited := map[int]int{}, map[int]time.Duration{}
	for _, e := range r.events {
		switch {
		case e.kind == "start":
			episode[e.worker]++
			lastWaited[e.worker] = 0
		case e.kind == "wait":
			if e.waited < lastWaited[e.worker] {
				episode[e.worker]++ // a new wait
			}
			lastWaited[e.worker] = e.waited
			if e.holder == "" {
				continue
			}
			k := key{e.worker, episode[e.worker], e.seq, e.holder}
			if sp := spans[k]; sp != nil {
				sp.last = e
			} else {
				spans[k] = &span{first: e, last: e}
			}
		}
	}
	idx := map[string]int{}
	for _, w := range r.workers {
		idx[w.id] = w.idx
	}
	var longest time.Duration
	where := "no worker logged a wait"
	for k, sp := range spans {
		poll := min(heartbeatInterval, time.Second)
		d := sp.last.waited - sp.first.waited + poll
		h, ok := idx[k.holder]
		if !ok {
			continue
		}
		d = min(d, r.frozenOverlap(h, sp.first.at, sp.last.at.Add(poll)))
		if d <= longest || r.frozenDuring(k.worker, sp.first.at, sp.last.at) || r.restartDuring(sp.first.at, sp.last.at) {
			continue
		}
		longest = d
		where = fmt.Sprintf("%s for chunk %d held by %s, waited %v to %v", r.workers[k.worker].id, k.seq, k.holder,
			sp.first.waited.Round(time.Millisecond), sp.last.waited.Round(time.Millisecond))
	}
	return longest, where
}

// restartDuring says whether the server restarted within [a, b].
func (r *round) restartDuring(a, b time.Time) bool {
	for _, w := range r.windows {
		if w.kind == "server-restart" && !b.Before(w.start) && !a.After(w.end) {
			return true
		}
	}
	return false
}

// longestJoinWait is the longest time a worker process took from its
// start until Run began working (the "backfill run" record), leaving out
// joins during which the worker was frozen or cut off itself or the
// server restarted ("a joining worker": the run row is
// no longer a lock a joining worker waits on behind chunks in flight).
func (r *round) longestJoinWait(now time.Time) (time.Duration, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	started := map[int]time.Time{}
	var longest time.Duration
	where := "no worker joined"
	note := func(idx int, at time.Time, why string) {
		if s, ok := started[idx]; ok {
			if r.frozenDuring(idx, s, at) || r.restartDuring(s, at) {
				delete(started, idx)
				return
			}
			if d := at.Sub(s); d > longest {
				longest, where = d, fmt.Sprintf("%s, %s", r.workers[idx].id, why)
			}
			delete(started, idx)
		}
	}
	for _, e := range r.events {
		switch e.kind {
		case "start":
			started[e.worker] = e.at
		case "joined":
			note(e.worker, e.at, "then joined")
		case "exit":
			note(e.worker, e.at, "exited before it joined")
		}
	}
	for idx := range started {
		note(idx, now, "still waiting")
	}
	return longest, where
}

// frozenDuring says whether worker idx was itself frozen or cut off
// within [a, b].
func (r *round) frozenDuring(idx int, a, b time.Time) bool {
	for _, w := range r.windows {
		if w.frozen[idx] && !b.Before(w.start) && !a.After(w.end) {
			return true
		}
	}
	return false
}

// frozen: a worker holding a chunk is frozen (SIGSTOP) or cut off for
// longer than the bound. The others must finish the job without it,
// within the bound, and it must not commit its chunk afterwards.
func (s *suite) frozen(t *testing.T, seed int64, kind string) {
	r := s.newRound(t, t.Name(), seed, roundOptions{chunks: 40, rows: 2500, sleep: 500 * time.Millisecond})
	stop := make(chan struct{})
	done := r.start(stop)
	defer r.teardown()
	// The victim: a worker that has just begun a chunk (its extractor
	// sleeps on), near the end of the run, so that the others run out of
	// chunks to claim and wait for its chunk for about the bound.
	var victim *worker
	var held int
	var began time.Time
	for deadline := time.Now().Add(time.Minute); victim == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if len(r.doneEvents()) < r.spec.Chunks-8 {
			continue
		}
		for _, w := range r.holding() {
			if e := r.lastEvent(w); time.Since(e.at) < r.spec.Sleep/4 {
				victim, held, began = w, e.seq, e.at
				break
			}
		}
	}
	if victim == nil {
		t.Fatal("no worker began a chunk near the end of the run within a minute")
	}
	// Frozen until the run completes, at most twice the bound plus a
	// margin: the run must complete meanwhile.
	hold := 2*bound + 20*time.Second
	completed := make(chan struct{})
	go func() {
		defer close(completed)
		for sleepOrDone(200*time.Millisecond, done) {
			var st string
			if err := r.db.Get(&st, `SELECT status FROM backfill.runs WHERE job_name = $1`, r.spec.Name); err == nil && st == "completed" {
				return
			}
		}
	}()
	freezeDone := make(chan struct{})
	go func() {
		defer close(freezeDone)
		// The victim holds the chunk it began until it logs that chunk's
		// end or exits: lines about its other chunks (a worker that
		// extracts ahead logs the previous chunk's commit after it began
		// this one) do not release it.
		r.freezeHeld(kind, victim, hold, completed, !r.chunkEnded(victim, held, began))
	}()
	<-freezeDone
	select {
	case <-completed:
	default:
		t.Errorf("the run did not complete while %s was frozen for %v (%s); sessions waiting then:\n%s", victim.id, hold, r.progress(), r.waiting())
	}
	thawed := time.Now()
	r.wait(done, stop, 3*time.Minute)
	r.check()
	r.checkFenced(kind, victim, held, thawed)
}

// checkFenced asserts that victim, frozen or cut off while it held chunk
// seq, was fenced by another worker (a frozen one; a cut-off one's
// backend may be ended by the server first, by the TCP keepalives the
// chunk's transaction sets), that another worker committed seq, and that
// victim's own attempt at it failed once it was thawed: a fenced-out
// worker cannot commit (exactly-once checks the effect). With short
// transactions a victim frozen while it extracts holds only a lease:
// another worker takes it over (a new epoch), and the victim, thawed,
// finds its fence gone ("lease was taken over"): that is both its
// fencing and its failed attempt.
func (r *round) checkFenced(kind string, victim *worker, seq int, thawed time.Time) {
	t := r.t
	var by string
	if err := r.db.Get(&by, `SELECT worker FROM done_log d JOIN backfill.runs USING (batch_id) WHERE job_name = $1 AND seq = $2`, r.spec.Name, seq); err != nil {
		t.Fatalf("chunk %d in the commit log: %v", seq, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.windows) == 0 || !r.windows[len(r.windows)-1].held {
		t.Fatalf("%s did not hold chunk %d when it was frozen: the suite chose its victim too late", victim.id, seq)
	}
	fenced, failed := false, false
	for _, e := range r.events {
		if e.kind == "wait" && e.fenced && e.holder == victim.id {
			fenced = true
		}
		if e.worker == victim.idx && e.kind == "failed" && e.seq == seq && !e.at.Before(thawed) {
			failed = true
		}
		if e.worker == victim.idx && e.kind == "lease-lost" && e.seq == seq {
			fenced, failed = true, true
		}
	}
	t.Logf("%s held chunk %d: fenced by another worker %v (else ended by the server), committed by %s, its own attempt failed after the thaw: %v", victim.id, seq, fenced, by, failed)
	if (!fenced && kind == "sigstop") || by == victim.id || !failed {
		t.Errorf("%s, frozen holding chunk %d: fenced by another worker %v (want true), chunk committed by %s (want another worker), its attempt failed after the thaw %v (want true)",
			victim.id, seq, fenced, by, failed)
		// What the victim logged of the chunk, and its last lines: how its
		// attempt ended, if it did.
		b, _ := os.ReadFile(victim.logPath)
		var of []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, fmt.Sprintf(`"seq":%d,`, seq)) {
				of = append(of, l)
			}
		}
		t.Logf("--- %s: its lines of chunk %d ---\n%s\n--- its log tail ---\n%s", victim.id, seq, tailString(strings.Join(of, "\n"), 6000), tailString(string(b), 3000))
	}
}

// lastEvent returns w's last extract, done or exit event.
func (r *round) lastEvent(w *worker) event {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.events) - 1; i >= 0; i-- {
		if e := r.events[i]; e.worker == w.idx && (e.kind == "extract" || e.kind == "done" || e.kind == "exit") {
			return e
		}
	}
	return event{}
}

func (r *round) doneEvents() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []event
	for _, e := range r.events {
		if e.kind == "done" {
			out = append(out, e)
		}
	}
	return out
}

// restartsSurvived: the server restarts twice mid-run; no worker may
// exit because of it (retried with backoff).
func (s *suite) restartsSurvived(t *testing.T, seed int64) {
	r := s.newRound(t, t.Name(), seed, roundOptions{chunks: 40, rows: 2500, sleep: 500 * time.Millisecond})
	stop := make(chan struct{})
	done := r.start(stop)
	defer r.teardown()
	for range 2 {
		if !sleepOrDone(r.between(2*time.Second, 4*time.Second), done) {
			break
		}
		r.restartServer()
	}
	r.wait(done, stop, 3*time.Minute)
	r.check()
	r.mu.Lock()
	defer r.mu.Unlock()
	// A worker retries a manifest transaction's transient faults for
	// 2×StaleAfter; a restart whose recovery outlasts that (a loaded
	// machine) ends the worker with 75, restart later, by contract. Only
	// other exits, or 75 after a shorter outage, are failures.
	var outage time.Duration
	for _, w := range r.windows {
		if w.kind == "server-restart" {
			outage = max(outage, w.end.Sub(w.start))
		}
	}
	exits := r.exits
	if outage >= 2*staleAfter-time.Second {
		exits = slices.DeleteFunc(slices.Clone(exits), func(e string) bool {
			return strings.Contains(e, " exited 75: ") && strings.Contains(e, "transient faults outlasted the bound")
		})
		t.Logf("a restart took %v, about the workers' bound of 2×StaleAfter (%v): %d exits 75 past the bound allowed", outage.Round(time.Millisecond), 2*staleAfter, len(r.exits)-len(exits))
	}
	if len(exits) > 0 {
		t.Errorf("%d worker exits after server restarts (longest restart %v), want 0 (retried with backoff up to MaxAttempts):\n%s", len(exits), outage.Round(time.Millisecond), strings.Join(exits, "\n"))
		for _, w := range r.workers {
			b, _ := os.ReadFile(w.logPath)
			t.Logf("--- %s (%s) log tail ---\n%s", w.id, w.via, tailString(string(b), 6000))
		}
	}
}

// joining: a worker that joins a running job (the others keep chunks in
// flight) must get chunks: it must not wait on the run row for the rest
// of the run.
func (s *suite) joining(t *testing.T, seed int64) {
	r := s.newRound(t, t.Name(), seed, roundOptions{chunks: 60, rows: 2500, sleep: time.Second})
	joiner := r.workers[len(r.workers)-1]
	r.workers = r.workers[:len(r.workers)-1]
	stop := make(chan struct{})
	done := r.start(stop)
	defer r.teardown()
	for deadline := time.Now().Add(time.Minute); len(r.doneEvents()) < 5 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	r.workers = append(r.workers, joiner)
	var pending int
	if err := r.db.Get(&pending, `SELECT count(*) FROM backfill.chunks WHERE status = 'pending'`); err != nil {
		t.Fatal(err)
	}
	joined := make(chan struct{})
	go func() { joiner.supervise(stop); close(joined) }()
	r.wait(done, stop, 3*time.Minute)
	<-joined
	r.check()
	var ran int
	if err := r.db.Get(&ran, `SELECT count(*) FROM done_log WHERE worker = $1`, joiner.id); err != nil {
		t.Fatal(err)
	}
	t.Logf("the joiner started with %d chunks pending and ran %d", pending, ran)
	if ran == 0 {
		t.Errorf("a worker that joined with %d of %d chunks pending ran none of them: it waited on the run row until the end", pending, r.spec.Chunks)
	}
}

// allPooler: every worker goes through PgBouncer in transaction mode
// with an ordinary URL; no worker may fail.
func (s *suite) allPooler(t *testing.T, seed int64) {
	r := s.newRound(t, t.Name(), seed, roundOptions{chunks: 40, rows: 2500, sleep: 100 * time.Millisecond, allPooler: true})
	stop := make(chan struct{})
	done := r.start(stop)
	defer r.teardown()
	r.wait(done, stop, 3*time.Minute)
	r.check()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.exits) > 0 {
		t.Errorf("%d worker failures through PgBouncer with an ordinary URL, want 0:\n%s", len(r.exits), strings.Join(r.exits, "\n"))
	}
}

func tailString(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
