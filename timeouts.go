package backfill

import (
	"cmp"
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Timeouts and the retry of waits (see the package documentation,
// "Beside production").
//
// Every transaction of a chunk sets, locally, lock_timeout (the try's row
// of [Config.LockRetries], at most [Config.LockTimeout]) and keeps the
// statement_timeout of its merge, validation and checkpoint in
// backfill.statement_timeout (the COPY that stays open while the spool is
// replayed is not charged: statement_timeout 0 until the merge puts it
// back). Both are set with the fence statement (FenceLease), the
// lock_timeout in front of it in the same simple query, so that it
// bounds the fence's lock of the manifest's chunks table too: no extra
// round trip, except one set_config on a retried try.
//
// A try that ends with 55P03 (lock timeout), 40P01, 40001 or 57014 (a
// statement timeout, or a cancel by another session; never while ctx is
// done) is a wait, not a failure: the chunk's transaction rolls back, the
// wait is logged and recorded ([backfilldriver.ManifestWaits], a short
// transaction of its own after the rollback) with its blockers, the worker
// sleeps the row's Sleep (jittered ±25 %) while the chunk is skipped by
// this call's other claims, and the chunk is tried again with the next row.
// Waits do not count toward [Config.MaxAttempts]; a wait on the table's
// last row ends the attempt as failed, and the next attempt starts the
// table again. The row of a try is counted per call of Run and per chunk:
// another process that claims the chunk starts at the first row.
//
// The advisory key locks of the merge (see [pgstore.MergeLockKeys]) are
// taken in steps ([pgstore.WaitLock], keylocks.go): a live worker's merge
// of the same keys is waited for beyond the try's lock_timeout (an
// intended wait, its own waits bounded), a stale worker holding them is
// fenced, and a session that is no worker holds them for the try's
// lock_timeout at most: its 55P03 is a wait of the chunk as above.

// LockRetry is one row of [Config.LockRetries]: a try's lock_timeout and,
// when the try waits, the sleep before the next try.
type LockRetry = backfilltype.LockRetry

// DefaultLockTimeout is the default of [Config.LockTimeout].
const DefaultLockTimeout = backfilltype.DefaultLockTimeout

// DefaultLockRetries returns the default retry table for lockTimeout
// (after GitLab's lock retries): lock_timeout lockTimeout/20, /10, /4,
// /2, then lockTimeout four times, with sleeps 1 s, 1 s, 2 s, 5 s, 10 s,
// 10 s, 20 s (the last row's Sleep is not used: a wait on it ends the
// attempt). For the default 2 s: 100 ms/1 s, 200 ms/1 s, 500 ms/2 s,
// 1 s/5 s, 2 s/10 s, 2 s/10 s, 2 s/20 s, 2 s: an attempt waits at most
// 9.8 s in all and sleeps about 49 s before it counts as failed. A
// non-positive lockTimeout gives zero timeouts.
func DefaultLockRetries(lockTimeout time.Duration) []LockRetry {
	return backfilltype.DefaultLockRetries(lockTimeout)
}

func (c *Config) txSettings() pgstore.TxSettings {
	return pgstore.TxSettings{LockTimeout: c.LockTimeout, StmtTimeout: c.StatementTimeout, Retries: c.LockRetries, ConnBudget: 2 * c.StaleAfter}
}

// validateTimeouts checks the timeouts of c.
func (c *Config) validateTimeouts() error {
	for i, r := range c.LockRetries {
		if r.Timeout < 0 || r.Sleep < 0 {
			return fmt.Errorf("%w: LockRetries[%d] has a negative Timeout or Sleep", ErrInvalidConfig, i)
		}
	}
	if c.LockRetries != nil && len(c.LockRetries) == 0 {
		return fmt.Errorf("%w: LockRetries is empty: give at least one row, or nil for the default", ErrInvalidConfig)
	}
	return nil
}

// resolveTimeouts fills in the defaults of the timeouts of c.
func (c *Config) resolveTimeouts() {
	c.LockTimeout = cmp.Or(c.LockTimeout, DefaultLockTimeout)
	if c.LockRetries == nil {
		c.LockRetries = DefaultLockRetries(c.LockTimeout)
	}
}

// chunkWaits is the state of the waits of one call of Run: per chunk
// Seq, the tries of its current attempt that waited, and until when this
// call's claims skip it.
type chunkWaits struct {
	tries     map[int]int
	notBefore map[int]time.Time
}

// avoid keeps this call's claims off chunk seq until t; ex.mu is held.
func (w *chunkWaits) avoid(seq int, t time.Time) {
	if w.notBefore == nil {
		w.notBefore = map[int]time.Time{}
	}
	w.notBefore[seq] = t
}

// waitTry returns the number of tries of chunk seq's current attempt
// that waited (the row of its next try).
func (ex *execution) waitTry(seq int) int {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return ex.waits.tries[seq]
}

// avoided returns the chunks this call's claims skip now (sorted), and
// how long until the first of them may be claimed again (0 for none).
func (ex *execution) avoided() ([]int, time.Duration) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	now := time.Now()
	var seqs []int
	var next time.Duration
	for seq, t := range ex.waits.notBefore {
		if d := t.Sub(now); d > 0 {
			seqs = append(seqs, seq)
			if next == 0 || d < next {
				next = d
			}
		} else {
			delete(ex.waits.notBefore, seq)
		}
	}
	sort.Ints(seqs)
	return seqs, next
}

// setTryLockTimeout sets the lock_timeout of chunk seq's try in tx when
// it is not the first try of its attempt (the claim set the first row's).
func (ex *execution) setTryLockTimeout(ctx context.Context, tx backfilldriver.Tx, seq int) (string, error) {
	s := ex.r.cfg.txSettings()
	n := ex.waitTry(seq)
	lt := s.TryLockTimeout(n)
	if n == 0 || lt == "" {
		return lt, nil
	}
	_, err := tx.ExecContext(ctx, `SELECT set_config('backfill.lock_timeout', set_config('lock_timeout', $1, true), true)`, lt)
	return lt, err
}

// chunkWaited handles a try of ce's chunk that ended with a wait (code,
// msg): it records and logs the wait with what the watcher saw, and
// either sleeps and reports true (the chunk is tried again, not counting
// toward MaxAttempts) or, on the table's last row, returns false with
// final set, and the caller counts the attempt as failed.
func (ex *execution) chunkWaited(ctx context.Context, ce *ChunkError, cr chunkRun, code, msg string) (retry bool) {
	s := ex.r.cfg.txSettings()
	seq := ce.Chunk.Seq
	ex.mu.Lock()
	if ex.waits.tries == nil {
		ex.waits.tries = map[int]int{}
	}
	n := ex.waits.tries[seq]
	final := n+1 >= len(s.Retries)
	sleep := time.Duration(0)
	if final {
		delete(ex.waits.tries, seq)
	} else {
		ex.waits.tries[seq] = n + 1
		sleep = pgstore.Jitter(waitSleep(code, n, s.Retries[n].Sleep))
		ex.waits.avoid(seq, time.Now().Add(sleep))
	}
	ex.mu.Unlock()
	ex.noteWait(ctx, ce, cr, code, msg, n+1, sleep, final)
	if final {
		return false
	}
	select {
	case <-ctx.Done():
	case <-time.After(sleep):
	}
	return true
}

// noteWait logs try (1-based) of ce's chunk, which ended with a wait
// (code, msg), and records it in the manifest's waits with what the
// watcher saw of its blockers; sleep is the pause before the chunk's
// next try, final says the wait ends the attempt as failed.
func (ex *execution) noteWait(ctx context.Context, ce *ChunkError, cr chunkRun, code, msg string, try int, sleep time.Duration, final bool) {
	s := ex.r.cfg.txSettings()
	seq := ce.Chunk.Seq
	w := backfilltype.Wait{BatchID: ex.batchID, Seq: seq, ChunkID: ce.Chunk.ID, Attempt: ce.Attempt, Try: try, SQLState: code, Message: msg,
		LockTimeout: cr.lockTimeout, StatementTimeout: s.StmtSetting(), Sleep: sleep, Final: final, Worker: ex.r.cfg.WorkerID}
	if cr.seen != nil && !cr.seen.at.IsZero() {
		w.Waited = cr.seen.waited + time.Since(cr.seen.at)
		w.Blockers = cr.seen.blockers
	} else if code == "55P03" && cr.lockTimeout != "" {
		var ms int64
		_, _ = fmt.Sscan(cr.lockTimeout, &ms)
		w.Waited = time.Duration(ms) * time.Millisecond
	} else if code == "57014" && s.StmtTimeout > 0 {
		w.Waited = s.StmtTimeout
	}
	if len(w.Blockers) == 0 && code == "55P03" {
		// The watcher samples: a short lock_timeout can end between two
		// samples (or before the first). The sessions still holding a
		// lock on the target that conflicts with the merge's ROW
		// EXCLUSIVE are then named as its blockers.
		w.Blockers = pgstore.ConflictingHolders(context.WithoutCancel(ctx), ex.r.db, ex.base)
		if len(w.Blockers) == 0 {
			// Not the target's: the manifest's tables (the fence's lock
			// of the chunks table) or another relation the chunk locks.
			w.Blockers = pgstore.StrongLockHolders(context.WithoutCancel(ctx), ex.r.db)
		}
	}
	ex.traceRetry(ctx, backfilltrace.RetryData{Chunk: ce.Chunk, Attempt: ce.Attempt, Kind: backfilltrace.RetryWait, Try: try, SQLState: code, Sleep: sleep, Final: final, Err: ce.Err})
	blockers := pgstore.DescribeBlockers(w.Blockers)
	if blockers == "" {
		blockers = "none seen"
	}
	attrs := []any{"seq", seq, "chunk", ce.Chunk.ID, "attempt", ce.Attempt, "try", try, "sqlstate", code, "message", msg,
		"lock_timeout", cr.lockTimeout, "statement_timeout", w.StatementTimeout, "waited", w.Waited, "blockers", blockers}
	if final {
		ex.log.Warn("backfill: chunk waited on the retry table's last row; the attempt counts as failed", attrs...)
	} else {
		ex.log.Warn("backfill: chunk waited; rolled back, retrying after a pause", append(attrs, "sleep", sleep)...)
	}
	if mw := ex.r.caps.waits; mw != nil {
		fctx := context.WithoutCancel(ctx)
		// Append-only, after the chunk's rollback: a crash before it loses
		// only this record (the log line above says it).
		if err := ex.retryConn(fctx, "record wait", func() error { return mw.RecordWait(fctx, ex.r.db, w) }); err != nil {
			ex.log.Warn("backfill: wait not recorded in the manifest", "seq", seq, "chunk", ce.Chunk.ID, "error", err)
		}
	}
}

// conflictSleep is the first sleep after a serialization failure or a
// deadlock, doubled on each try up to the retry table's row.
const conflictSleep = 20 * time.Millisecond

// waitSleep is the sleep before try n+1 of a chunk whose try n ended with
// code, row being the retry table's sleep. A serialization failure
// (40001) or a deadlock (40P01) waited on nobody: the other transaction
// has committed or rolled back by the time the error is raised, so the
// chunk is tried again after a short, growing, jittered pause (the jitter
// moves two chunks that conflicted apart) instead of the table's sleep,
// which gives a lock holder time to finish.
func waitSleep(code string, n int, row time.Duration) time.Duration {
	if code != "40001" && code != "40P01" {
		return row
	}
	return min(row, conflictSleep<<min(n, 10))
}

// watchSeen is what a chunk's watcher last saw of its backend while the
// backend was blocked or running a statement: since when (waited, at the
// local time at) and the sessions blocking it.
type watchSeen struct {
	at       time.Time
	waited   time.Duration
	blockers []backfilltype.Blocker
}

// watchChunk starts watching, from another connection of the pool, the
// chunk's backend pid while its merge, validation and checkpoint run:
// after delay (half the try's shortest timeout, at most 500 ms) it polls
// every quarter of it (10 ms to 250 ms) pg_stat_activity for the
// backend's statement, and, while the backend waits for a lock, the
// sessions pg_blocking_pids names (pgstore.BlockingSessions, as the view switch). The
// returned stop ends the watch and returns what it last saw (nil if
// nothing). Blockers must be read while the backend waits: after its
// timeout they are gone.
func (ex *execution) watchChunk(ctx context.Context, pid int, lockTimeout string) (stop func() *watchSeen) {
	if pid == 0 {
		return func() *watchSeen { return nil }
	}
	timeout := 2 * time.Second
	var ms int64
	if _, err := fmt.Sscan(lockTimeout, &ms); err == nil && ms > 0 {
		timeout = time.Duration(ms) * time.Millisecond
	}
	if st := ex.r.cfg.StatementTimeout; st > 0 {
		timeout = min(timeout, st)
	}
	delay := min(timeout/2, 500*time.Millisecond)
	every := min(max(timeout/4, 10*time.Millisecond), 250*time.Millisecond)
	done := make(chan struct{})
	result := make(chan struct{})
	var mu sync.Mutex
	var last *watchSeen
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(result)
		t := time.NewTimer(delay)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if seen := observeBackend(wctx, ex.r.db, pid); seen != nil {
				mu.Lock()
				last = seen
				mu.Unlock()
			}
			t.Reset(every)
		}
	}()
	return func() *watchSeen {
		close(done)
		cancel()
		// An observation under way is waited for, but not for long: on
		// a pool of few server connections (a pooler's) it may itself
		// wait for one that the chunk's own transaction, still open,
		// holds or that chunks waiting for this one's locks hold.
		select {
		case <-result:
		case <-time.After(watchStopWait):
		}
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}

// watchStopWait bounds how long a watcher's stop waits for the
// observation under way.
const watchStopWait = time.Second

// observeBackend reads what backend pid is doing: how long its current
// statement has waited for a lock (pg_locks.waitstart, PostgreSQL 14) or
// run, and, while it waits for a lock, its blockers. nil when it is idle
// or gone.
func observeBackend(ctx context.Context, db sqlx.ExtContext, pid int) *watchSeen {
	ctx = pgstore.WithPurpose(ctx, "observe the chunk's backend", 0)
	var rows []struct {
		Waited float64 `db:"waited"`
		Lock   bool    `db:"lock"`
	}
	err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = rows[:0]
		return sqlx.SelectContext(ctx, tx, &rows, `SELECT coalesce(a.wait_event_type = 'Lock', false) AS lock,
			extract(epoch FROM clock_timestamp() - coalesce(CASE WHEN a.wait_event_type = 'Lock'
				THEN (SELECT min(l.waitstart) FROM pg_locks l WHERE l.pid = a.pid AND NOT l.granted) END, a.query_start))::float8 AS waited
			FROM pg_stat_activity a WHERE a.pid = $1 AND a.state = 'active'`, pid)
	})
	if err != nil || len(rows) == 0 {
		return nil
	}
	seen := &watchSeen{at: time.Now(), waited: time.Duration(rows[0].Waited * float64(time.Second))}
	if rows[0].Lock {
		seen.blockers = pgstore.BlockingSessions(ctx, db, pid)
	}
	return seen
}
