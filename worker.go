package backfill

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// A call of Run as a worker among many: its registration and heartbeat
// ([backfilldriver.ManifestLeases]), its waits for chunks held by others, and the
// retries of connection failures (a server restart, a dropped
// connection).

// workerCall is this call's registration in the manifest.
type workerCall struct {
	key  string
	stop func()
	// beats counts the heartbeats written (tests).
	beats atomic.Int64
}

// testHeartbeatsOff, when set, makes every heartbeat loop skip its
// writes while it returns true: tests simulate a frozen worker whose
// chunk goroutine blocks while its heartbeats stop.
var testHeartbeatsOff atomic.Pointer[func(workerID string) bool]

// newWorkerKey returns a random worker key (16 hex digits).
func newWorkerKey() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func withFenceWait(ctx context.Context, w backfilldriver.FenceWait) context.Context {
	return context.WithValue(ctx, pgstore.FenceCtxKey{}, w)
}

// fenceWait is how this Runner waits for chunks held by others.
func (r *Runner) fenceWait(what string) backfilldriver.FenceWait {
	return backfilldriver.FenceWait{StaleAfter: r.cfg.StaleAfter, Poll: r.pollInterval(), Log: r.cfg.Logger, What: what}
}

// pollInterval is how often a waiting worker looks again:
// HeartbeatInterval, at most a second.
func (r *Runner) pollInterval() time.Duration {
	return min(r.cfg.HeartbeatInterval, time.Second)
}

// startWorker registers this call as a worker of the run and starts its
// heartbeat. Its chunks are leased under the worker's key. A
// registration that fails is logged, and the run goes on with the key
// unregistered: its leases are live only while younger than StaleAfter
// (no heartbeat keeps them), and a peer cannot tell its chunk
// transactions from a frozen worker's (its fence still keeps a chunk
// taken over from committing).
func (ex *execution) startWorker(ctx context.Context) {
	wm := ex.r.caps.workers
	if pd, ok := ex.r.db.(pgstore.PGDB); ok && pd.DB != nil {
		if n := pd.DB.Stats().MaxOpenConnections; n > 0 && n < ex.r.cfg.Concurrency+2 {
			ex.log.Warn("backfill: the connection pool may starve the heartbeat: MaxOpenConns should be at least Concurrency + 2, or a busy worker may look stale and be fenced",
				"max_open_conns", n, "concurrency", ex.r.cfg.Concurrency)
		}
	}
	host, _ := os.Hostname()
	w := &workerCall{key: newWorkerKey()}
	reg := backfilltype.Worker{Key: w.key, ID: ex.r.cfg.WorkerID, BatchID: ex.batchID, Job: ex.job.Name, Host: host, PID: os.Getpid(), StaleAfter: ex.r.cfg.StaleAfter}
	fctx := context.WithoutCancel(ctx)
	ex.worker = w
	ex.log = ex.log.With("worker_key", w.key)
	if err := ex.retryConn(ctx, "register worker", func() error { return wm.RegisterWorker(fctx, ex.r.db, reg) }); err != nil {
		ex.log.Warn("backfill: worker not registered; its leases last StaleAfter without a heartbeat, and its chunks cannot be told from a frozen worker's", "error", err)
		return
	}
	ex.log.Info("backfill worker registered", "worker", ex.r.cfg.WorkerID, "heartbeat_interval", ex.r.cfg.HeartbeatInterval, "stale_after", ex.r.cfg.StaleAfter)
	if cm := ex.r.caps.control; cm != nil && len(ex.r.cfg.Throttles) > 0 {
		// What set_knob checks a throttle watermark knob against.
		ts := make([]pgstore.ThrottleWatermarks, len(ex.r.cfg.Throttles))
		for i, th := range ex.r.cfg.Throttles {
			ts[i] = pgstore.ThrottleWatermarks{Signal: th.Signal.Name(), High: th.High, Low: th.Low}
		}
		if err := ex.retryConn(ctx, "record throttles", func() error { return cm.RecordThrottles(fctx, ex.r.db, w.key, ts) }); err != nil {
			ex.log.Warn("backfill: the throttles' watermarks not recorded; set_knob cannot check a watermark knob against them", "error", err)
		}
	}
	hctx, cancel := context.WithCancel(fctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(ex.r.cfg.HeartbeatInterval)
		defer t.Stop()
		for {
			select {
			case <-hctx.Done():
				return
			case <-t.C:
			}
			if off := testHeartbeatsOff.Load(); off != nil && (*off)(ex.r.cfg.WorkerID) {
				continue
			}
			if err := wm.Heartbeat(hctx, ex.r.db, w.key); err != nil {
				if hctx.Err() == nil {
					ex.log.Warn("backfill: heartbeat failed", "error", err)
				}
				continue
			}
			w.beats.Add(1)
		}
	}()
	w.stop = func() {
		cancel()
		wg.Wait()
		if err := ex.retryConn(fctx, "finish worker", func() error { return wm.FinishWorker(fctx, ex.r.db, w.key) }); err != nil {
			ex.log.Warn("backfill: worker not marked finished", "error", err)
		}
	}
}

// stopWorker marks this call's worker finished.
func (ex *execution) stopWorker() {
	if ex.worker != nil && ex.worker.stop != nil {
		ex.worker.stop()
	}
}

// waitState is one worker goroutine's wait for chunks held by others,
// and its run of consecutive connection failures.
type waitState struct {
	since     time.Time // zero: not waiting
	connSince time.Time // zero: no connection failure pending
	connFails int
	fenceOff  bool      // pg_terminate_backend refused: wait only
	fenced    time.Time // the last fencing while waiting for a job-wide place
	slotSince time.Time // zero: not waiting for a job-wide place
}

// waitHeld is called when nothing is left to claim. While chunks of the
// running run are held by other workers' transactions, it does not let
// the goroutine return: it logs each held chunk with its holder and the
// wait's duration, fences the holders whose worker is stale (their
// backend terminated, their chunk rolled back and claimable again),
// sleeps a poll interval and reports true, so that the caller claims
// again. It reports false when no chunk is held by others (or the
// manifest cannot tell), and the goroutine ends.
func (ex *execution) waitHeld(ctx context.Context, ws *waitState) bool {
	wm := ex.r.caps.workers
	if ex.worker == nil || ex.stopped() || ctx.Err() != nil {
		return false
	}
	hs, err := wm.Holders(ctx, ex.r.db, ex.batchID, ex.worker.key, ex.r.cfg.StaleAfter, !ws.fenceOff, true)
	if err != nil && pgstore.IsPermission(err) {
		ws.fenceOff = true
		ex.log.Error("backfill: cannot terminate a stale worker's backend: grant the role pg_signal_backend (or run every worker as the same role); waiting instead",
			"error", err)
		hs, err = wm.Holders(ctx, ex.r.db, ex.batchID, ex.worker.key, ex.r.cfg.StaleAfter, false, true)
	}
	if err != nil {
		if backfilltype.IsConnectionError(err) {
			return ex.connFailed(ctx, ws, err)
		}
		ex.log.Warn("backfill: listing chunks in flight failed; not waiting for them", "error", err)
		return false
	}
	if len(hs) == 0 {
		if !ws.since.IsZero() {
			// The chunks waited for are done, or their leases stopped
			// being live since the claim found nothing: claim once more
			// (a lease that went stale in between is taken over).
			ex.log.Info("backfill: done waiting for chunks in flight", "waited", time.Since(ws.since))
			ws.since = time.Time{}
			return true
		}
		return false
	}
	if ws.since.IsZero() {
		ws.since = time.Now()
	}
	for _, h := range hs {
		pgstore.LogHolder(ex.log, "worker: nothing to claim, chunks held by others", ex.batchID, h, time.Since(ws.since))
	}
	select {
	case <-ctx.Done():
	case <-time.After(ex.r.pollInterval()):
	}
	return true
}

// connFailed handles a connection failure outside a chunk's work (begin,
// claim, listing holders): it waits with backoff and reports true while
// the failures have lasted less than the reconnect budget, so that the
// goroutine tries again once the server is back; then false, the error
// recorded.
func (ex *execution) connFailed(ctx context.Context, ws *waitState, err error) bool {
	if ws.connSince.IsZero() {
		ws.connSince = time.Now()
	}
	ws.connFails++
	budget := ex.r.reconnectBudget()
	if time.Since(ws.connSince) > budget || ctx.Err() != nil || errors.Is(err, pgstore.ErrFaultBound) {
		ex.log.Error("backfill: connection lost; giving up", "failures", ws.connFails, "down_for", time.Since(ws.connSince), "error", err)
		ex.fail(nil, err)
		return false
	}
	backoff := ex.r.connBackoff(ws.connFails)
	ex.log.Warn("backfill: connection lost; retrying", "failures", ws.connFails, "down_for", time.Since(ws.connSince), "backoff", backoff, "error", err)
	select {
	case <-ctx.Done():
	case <-time.After(backoff):
	}
	return true
}

// reconnectBudget is how long connection failures are retried: twice
// StaleAfter (a minute by default), time for a server to restart.
func (r *Runner) reconnectBudget() time.Duration { return 2 * r.cfg.StaleAfter }

// connBackoff is the wait before try n+1 after n connection failures:
// RetryBackoff doubled per failure, at most HeartbeatInterval.
func (r *Runner) connBackoff(n int) time.Duration {
	return min(r.cfg.RetryBackoff<<min(n-1, 16), r.cfg.HeartbeatInterval)
}

// retryConn runs f until it succeeds, fails with an error that is not a
// connection failure, or connection failures have lasted the reconnect
// budget; it waits with backoff between tries. It records what the
// library must not lose to a server restart: a chunk's failed attempt,
// the end of a run, a worker's registration.
func (ex *execution) retryConn(ctx context.Context, what string, f func() error) error {
	var since time.Time
	for n := 1; ; n++ {
		err := f()
		// A manifest transaction retries its own faults up to the same
		// bound (pgstore.ErrFaultBound): not again.
		if err == nil || !backfilltype.IsConnectionError(err) || errors.Is(err, pgstore.ErrFaultBound) {
			if err == nil && n > 1 {
				ex.log.Info("backfill: recorded after the connection came back", "what", what, "tries", n, "down_for", time.Since(since))
			}
			return err
		}
		if since.IsZero() {
			since = time.Now()
		}
		if time.Since(since) > ex.r.reconnectBudget() {
			return err
		}
		backoff := ex.r.connBackoff(n)
		ex.log.Warn("backfill: connection lost; retrying", "what", what, "tries", n, "backoff", backoff, "error", err)
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(backoff):
		}
	}
}
