//go:build faults

package faulttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgproxy"
)

// TestManifestFaults runs the job on the suite's workers while faults
// hit the manifest's transactions, not only the chunks': COMMITs of any
// transaction of the library cut at random (the server commits, the
// worker never hears it), and max_connections used up by another client
// for 10 s mid-run. Each round must converge to the golden state (the
// suite's checks), and no worker may exit with anything but a retryable
// outcome (0, or 75 to be restarted).
func TestManifestFaults(t *testing.T) {
	s, seed := newSuite(t)
	defer s.sum.print(t)
	t.Run("commit_cuts_of_any_transaction", func(t *testing.T) { s.commitCuts(t, seed) })
	t.Run("max_connections_used_up_10s", func(t *testing.T) { s.connectionsUsedUp(t, seed) })
}

// commitProxy forwards the workers' connections to the server and cuts a
// connection right after it forwarded a COMMIT: the first COMMIT of each
// kind of transaction (so that the start and the end of the run, seen a
// few times a round, are cut too), then one in every. The server
// commits; the client's side is closed before the answer reaches it.
// Each cut is counted by the kind of the transaction it ended (its
// statements).
type commitProxy struct {
	*pgproxy.Proxy
	every int

	mu      sync.Mutex
	rng     *rand.Rand
	commits int
	seen    map[string]int // COMMITs by kind
	cuts    map[string]int
	others  map[string]int // the first statements of transactions of no kind
}

func newCommitProxy(t *testing.T, to string, every int, seed int64) *commitProxy {
	p := &commitProxy{every: every, rng: rand.New(rand.NewPCG(uint64(seed), 7)), cuts: map[string]int{}, seen: map[string]int{}, others: map[string]int{}}
	var err error
	p.Proxy, err = pgproxy.Listen("0.0.0.0:0", to, p.hook)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func (p *commitProxy) port() int { return p.Addr().(*net.TCPAddr).Port }

// txKind names a transaction by its statements.
func txKind(stmts []string) string {
	all := strings.Join(stmts, "\n")
	for _, k := range []struct{ kind, needle string }{
		{"start run (create)", `INSERT INTO "backfill".runs`},
		{"start run (resume)", `hashtextextended('backfill.job:'`},
		{"finish run", `SET status = $2, last_error = $3`},
		{"register worker", `INSERT INTO "backfill".workers`},
		{"finish worker", `state = 'finished'`},
		{"chunk", `CREATE TEMP TABLE`},
		{"chunk", `COPY `},
		{"lease", `SET lease_key = $3`},
		{"heartbeat", `SET heartbeat_at = now()`},
		{"fail chunk", `SET attempts = attempts + 1`},
		{"record wait", `INSERT INTO "backfill".waits`},
		{"event", `record_event(`},
		{"throttle", `"backfill".throttle`},
	} {
		if strings.Contains(all, k.needle) {
			return k.kind
		}
	}
	return "other (reads, control)"
}

func (p *commitProxy) cut(stmts []string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.commits++
	kind := txKind(stmts)
	p.seen[kind]++
	if kind == "other (reads, control)" && len(stmts) > 0 {
		p.others[stmts[min(1, len(stmts)-1)][:min(60, len(stmts[min(1, len(stmts)-1)]))]]++
	}
	if p.seen[kind] > 1 && p.rng.IntN(p.every) != 0 {
		return false
	}
	p.cuts[kind]++
	return true
}

func (p *commitProxy) figures() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var kinds, others []string
	n := 0
	for k, c := range p.cuts {
		kinds = append(kinds, fmt.Sprintf("%s=%d/%d", k, c, p.seen[k]))
		n += c
	}
	for k, c := range p.others {
		others = append(others, fmt.Sprintf("%d %s", c, k))
	}
	sort.Strings(kinds)
	sort.Strings(others)
	return fmt.Sprintf("%d COMMITs forwarded, %d cut (cut/seen by kind): %s; other transactions by statement: %s", p.commits, n,
		strings.Join(kinds, " "), strings.Join(others, "; "))
}

// hook collects the statements of each transaction of one connection
// and asks cut at its COMMIT.
func (p *commitProxy) hook() pgproxy.Hook {
	var stmts []string // of the transaction in progress
	return func(m pgproxy.Message) pgproxy.Action {
		switch m.Type {
		case 'Q':
			switch q := m.Statement; {
			case strings.HasPrefix(q, "BEGIN"):
				stmts = stmts[:0]
			case q == "COMMIT":
				cut := p.cut(stmts)
				stmts = stmts[:0]
				if cut {
					// The server commits; its answer finds the client gone.
					return pgproxy.CutAfter
				}
			default:
				stmts = append(stmts, q)
			}
		case 'P':
			stmts = append(stmts, m.Statement)
		}
		return pgproxy.Forward
	}
}

// checkExits fails the round for a worker exit that is not retryable:
// 1 (failed) or 64 (usage); 75 (restart later) is what a worker whose
// fault outlasted its bound returns, and the supervisor restarts it.
func (r *round) checkExits() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.t.Logf("worker exits by code: %s", codesString(r.codes))
	var bad []string
	for _, e := range r.exits {
		if !strings.Contains(e, fmt.Sprintf(" exited %d:", backfill.ExitTempFail)) {
			bad = append(bad, e)
		}
	}
	if len(bad) > 0 {
		r.t.Errorf("%d worker exits that are not retryable (want none: 0, or 75 to resume later):\n%s", len(bad), strings.Join(bad, "\n"))
		for _, w := range r.workers {
			b, _ := os.ReadFile(w.logPath)
			r.t.Logf("--- %s (%s) log tail ---\n%s", w.id, w.via, tailString(string(b), 4000))
		}
	}
}

// dbName is the round's database.
func (r *round) dbName() string {
	u, err := url.Parse(r.dbURL)
	if err != nil {
		r.t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// logCount counts the lines of the round's worker logs that contain s.
func (r *round) logCount(s string) int {
	n := 0
	for _, w := range r.workers {
		b, _ := os.ReadFile(w.logPath)
		n += strings.Count(string(b), s)
	}
	return n
}

// commitCuts: every worker goes through a proxy that cuts one COMMIT in
// twelve, of any transaction (a chunk's, a lease, the start or end of
// the run, a heartbeat, a worker's registration).
func (s *suite) commitCuts(t *testing.T, seed int64) {
	r := s.newRound(t, t.Name(), seed, roundOptions{chunks: 40, rows: 2500, sleep: 100 * time.Millisecond})
	p := newCommitProxy(t, fmt.Sprintf("127.0.0.1:%d", s.srv.Port()), 12, seed)
	for _, w := range r.workers {
		w.via = "commit-cutting proxy"
		w.url = dbURL(w.host.serverAddr, p.port(), r.dbName(),
			strings.ReplaceAll(w.id, "/", "-"))
	}
	stop := make(chan struct{})
	began := time.Now()
	done := r.start(stop)
	defer r.teardown()
	r.wait(done, stop, 4*time.Minute)
	t.Logf("converged in %v; %s; transient-fault retries logged: %d", time.Since(began).Round(time.Millisecond), p.figures(),
		r.logCount("a manifest transaction hit a transient fault"))
	r.check()
	r.checkExits()
}

// connectionsUsedUp: mid-run, another client takes every connection
// slot of the server (max_connections, the superuser's reserved ones
// too), ends the workers' sessions so that each must connect again, and
// holds the slots 10 s. Every worker connects directly.
func (s *suite) connectionsUsedUp(t *testing.T, seed int64) {
	r := s.newRound(t, t.Name(), seed, roundOptions{chunks: 40, rows: 2500, sleep: 200 * time.Millisecond})
	for _, w := range r.workers {
		w.via = "direct"
		w.url = dbURL(w.host.serverAddr, s.srv.Port(), r.dbName(),
			strings.ReplaceAll(w.id, "/", "-"))
	}
	stop := make(chan struct{})
	began := time.Now()
	done := r.start(stop)
	defer r.teardown()
	for deadline := time.Now().Add(time.Minute); len(r.doneEvents()) < 5 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	ctx := context.Background()
	hog, err := sqlx.Open("postgres", r.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer hog.Close()
	var held []*sqlx.Conn
	// grab takes every free slot, until refused for d after its last
	// slot (the sessions terminated free theirs a moment later).
	grab := func(d time.Duration) {
		for last := time.Now(); ; {
			c, err := hog.Connx(ctx)
			var pe *pq.Error
			switch {
			case err == nil:
				held = append(held, c)
				last = time.Now()
			case errors.As(err, &pe) && pe.Code == "53300":
				if time.Since(last) >= d {
					return
				}
				time.Sleep(time.Millisecond)
			default:
				t.Fatalf("hog connection: %v", err)
			}
		}
	}
	grab(0)
	// The workers' sessions end: each must connect again, into no slot.
	if _, err := held[0].ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE 'host%'`); err != nil {
		t.Fatal(err)
	}
	grab(time.Second)
	full := time.Now()
	time.Sleep(10 * time.Second) // the fault's length
	for _, c := range held {
		_ = c.Close()
	}
	_ = hog.Close()
	t.Logf("held %d connections for %v", len(held), time.Since(full).Round(time.Millisecond))
	r.wait(done, stop, 4*time.Minute)
	t.Logf("converged in %v; 53300 refusals logged by the workers: %d", time.Since(began).Round(time.Millisecond),
		r.logCount("53300"))
	r.check()
	r.checkExits()
}
