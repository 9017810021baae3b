package backfill

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// freezeProxy forwards TCP connections to a PostgreSQL server and
// freezes every one of them (forwards nothing more, in either direction,
// and keeps the sockets open) right after a client sends the Bind of a
// statement whose text contains trigger: the process behind it is then
// frozen as by SIGSTOP or a stalled host, with that statement executed by
// the server and its transaction open. Its heartbeats, on other
// connections of the same proxy, stop too.
type freezeProxy struct {
	ln      net.Listener
	to      string
	trigger []byte
	frozen  chan struct{} // closed when the trigger fired
	thaw    chan struct{} // closed by the test's cleanup
	fired   atomic.Bool
}

func newFreezeProxy(t *testing.T, to, trigger string) *freezeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &freezeProxy{ln: ln, to: to, trigger: []byte(trigger), frozen: make(chan struct{}), thaw: make(chan struct{})}
	t.Cleanup(func() { close(p.thaw); _ = ln.Close() })
	go p.accept()
	return p
}

func (p *freezeProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

// pipe copies from src to dst until frozen, then waits for the thaw.
func (p *freezeProxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.to)
	if err != nil {
		_ = c.Close()
		return
	}
	defer func() { _ = s.Close(); _ = c.Close() }()
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := s.Read(buf)
			if p.fired.Load() {
				<-p.thaw
				return
			}
			if n > 0 {
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	armed := false
	for {
		n, err := c.Read(buf)
		if p.fired.Load() {
			<-p.thaw
			return
		}
		if n > 0 {
			if _, werr := s.Write(buf[:n]); werr != nil {
				return
			}
			switch {
			case armed && buf[0] == 'B':
				// The Bind (and Execute, Sync) of the trigger statement:
				// lib/pq sends Parse first, then Bind in a second round
				// trip. Freeze from here on.
				if p.fired.CompareAndSwap(false, true) {
					close(p.frozen)
				}
			case bytes.Contains(buf[:n], p.trigger):
				armed = true
			}
		}
		if err != nil {
			return
		}
	}
}

// viaProxy returns u with its host and port replaced by the proxy's.
func viaProxy(t *testing.T, u string, p *freezeProxy) string {
	pu, err := url.Parse(u)
	require.NoError(t, err)
	pu.Host = p.ln.Addr().String()
	return pu.String()
}

// TestFrozenRunRowHolderDoesNotStopOthers: a worker that freezes (a
// stalled host) right after its start locked the run's row must not stop
// the other workers: their chunks (which insert validations, exceptions
// and heartbeats referencing the run's row) go on, and the run is
// finished once the server ends the frozen worker's idle transaction
// (inShortTx's idle_in_transaction_session_timeout, 8 s here). On
// the starting commit the run-row lock was FOR UPDATE, which blocks the
// chunks' foreign-key checks, and no timeout ended it: the healthy worker
// never finished.
func TestFrozenRunRowHolderDoesNotStopOthers(t *testing.T) {
	prev := pgstore.ManifestIdleMS.Swap(8000)
	t.Cleanup(func() { pgstore.ManifestIdleMS.Store(prev) })
	ctx := context.Background()
	u := pgtest.NewURL(t)
	db, err := sqlx.Open("postgres", u)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	pu, err := url.Parse(u)
	require.NoError(t, err)
	// The run's row, locked by a joining worker's StartRun.
	proxy := newFreezeProxy(t, pu.Host, "ORDER BY batch_id DESC LIMIT 1 FOR")

	validated := ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		return CheckResult{Check: "always", Severity: SeverityError, Passed: true, Expected: "ok", Actual: "ok"}, nil
	})
	job := func(hold func(Chunk)) Job {
		j := liveJob(hold)
		j.Validators = []Validator{validated}
		return j
	}
	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	a := liveRunner(t, db, "healthy", nil)
	aDone := goRun(ctx, a, job(func(c Chunk) {
		if c.Seq == 0 {
			close(inFlight)
			<-release
		}
	}))
	<-inFlight

	fdb, err := sqlx.Open("postgres", viaProxy(t, u, proxy)+"&application_name=frozen")
	require.NoError(t, err)
	t.Cleanup(func() { _ = fdb.Close() })
	fctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	f := liveRunner(t, fdb, "frozen", nil)
	_ = goRun(fctx, f, job(nil))
	select {
	case <-proxy.frozen:
	case <-time.After(30 * time.Second):
		t.Fatal("the joining worker never locked the run's row")
	}
	once.Do(func() { close(release) })

	// Every chunk commits while the frozen worker still holds the run's
	// row in its open transaction.
	require.Eventually(t, func() bool { return chunkStatuses(t, db)["done"] == liveChunks }, 30*time.Second, 20*time.Millisecond,
		"the healthy worker's chunks wait on the run's row")
	var holding int
	require.NoError(t, db.Get(&holding, `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = 'frozen' AND state = 'idle in transaction' AND query LIKE '%ORDER BY batch_id DESC LIMIT 1 FOR%'`))
	require.Equal(t, 1, holding, "the frozen worker still holds the run's row")

	var res runResult
	select {
	case res = <-aDone:
	case <-time.After(60 * time.Second):
		var waits []string
		_ = db.Select(&waits, `SELECT format('%s waits on %s: %s', pid, pg_blocking_pids(pid), left(query, 80)) FROM pg_stat_activity
			WHERE cardinality(pg_blocking_pids(pid)) > 0`)
		t.Fatalf("the healthy worker is stuck behind the frozen one: %s", strings.Join(waits, "; "))
	}
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)
	require.Equal(t, liveChunks, res.rep.ChunksRun, "the healthy worker did every chunk")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 10*liveChunks, n)
}

// TestSlowValidatorIsNotFenced: a validator that works in the process for
// longer than StaleAfter (a count in the source, an external call) leaves
// its chunk's transaction idle meanwhile; the worker is healthy (its
// heartbeats go on), so nothing may end that transaction. On the starting
// commit of this fix the chunk's transaction set
// idle_in_transaction_session_timeout = StaleAfter, and the run failed
// with a bad connection.
func TestSlowValidatorIsNotFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "slow", nil) // StaleAfter 1 s
	j := liveJob(nil)
	j.Chunker = IntRange(0, 20, 10)
	j.Validators = []Validator{ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
		time.Sleep(2500 * time.Millisecond) // in the process, between statements
		return CheckResult{Check: "slow", Severity: SeverityError, Passed: true, Expected: "ok", Actual: "ok"}, nil
	})}
	rep, err := r.Run(ctx, j)
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, 2, rep.ChunksRun)
}

// TestRollbackOfRunningRunIsRefused: Rollback without a BatchID while the
// job's latest run is running (chunks pending) refuses, saying what to do,
// and does not pick an older completed batch. On the starting commit of
// this fix the lookup skipped running runs: it rolled back the older
// batch, or said "run not found" when there was none.
func TestRollbackOfRunningRunIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	_, err := db.Exec(`ALTER TABLE live ADD COLUMN backfill_inserted_by bigint, ADD COLUMN backfill_updated_by bigint`)
	require.NoError(t, err)
	r := liveRunner(t, db, "w", nil)
	first := liveJob(nil)
	first.Rollback = RollbackUndoLog
	rep, err := r.Run(ctx, first)
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)

	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	second := liveJob(func(c Chunk) {
		if c.Seq == 0 {
			close(inFlight)
			<-release
		}
	})
	second.Rollback, second.NewRun = RollbackUndoLog, true
	done := goRun(ctx, r, second)
	<-inFlight

	_, err = r.Rollback(ctx, first, RollbackOptions{Actor: "oncall", Why: "bad data"})
	require.Error(t, err)
	require.True(t, errors.Is(err, ErrInvalidConfig), "refused as documented: %v", err)
	require.False(t, errors.Is(err, ErrRunNotFound), "%v", err)
	var status string
	require.NoError(t, db.Get(&status, `SELECT status FROM backfill.runs WHERE batch_id = $1`, rep.BatchID))
	require.Equal(t, string(RunCompleted), status, "the older batch is left alone")

	once.Do(func() { close(release) })
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)
}
