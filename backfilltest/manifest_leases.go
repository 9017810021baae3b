package backfilltest

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

var _ backfilldriver.ManifestLeases = (*Manifest)(nil)

// fakeWorker is a registered worker (RegisterWorker), as the PostgreSQL
// manifest's workers table keeps it.
type fakeWorker struct {
	w         backfilltype.Worker
	heartbeat time.Time
	finished  bool
}

// fakeLease is a chunk's lease: its key ("" when free), the epoch of its
// last lease (kept when the lease is cleared) and when it was taken.
type fakeLease struct {
	key   string
	epoch int64
	at    time.Time
}

// RegisterWorker implements [backfilldriver.ManifestLeases.RegisterWorker]
// in memory.
func (m *Manifest) RegisterWorker(ctx context.Context, db sqlx.ExtContext, w backfilltype.Worker) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.get(w.BatchID); err != nil {
		return fmt.Errorf("backfilltest: register worker %q: %w", w.Key, err)
	}
	if _, ok := m.workers[w.Key]; ok {
		return fmt.Errorf("backfilltest: register worker %q: the key is already registered", w.Key)
	}
	if m.workers == nil {
		m.workers = map[string]*fakeWorker{}
	}
	now := time.Now()
	w.ID, w.Host = pgstore.ManifestText(w.ID), pgstore.ManifestText(w.Host)
	w.StartedAt, w.HeartbeatAt, w.FinishedAt, w.State = now, now, nil, "working"
	m.workers[w.Key] = &fakeWorker{w: w, heartbeat: now}
	return nil
}

// Heartbeat implements [backfilldriver.ManifestLeases.Heartbeat].
func (m *Manifest) Heartbeat(ctx context.Context, db sqlx.ExtContext, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if w, ok := m.workers[key]; ok && !w.finished {
		w.heartbeat = time.Now()
	}
	return nil
}

// FinishWorker implements [backfilldriver.ManifestLeases.FinishWorker].
func (m *Manifest) FinishWorker(ctx context.Context, db sqlx.ExtContext, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if w, ok := m.workers[key]; ok {
		now := time.Now()
		w.heartbeat, w.finished = now, true
		w.w.FinishedAt, w.w.State = &now, "finished"
	}
	return nil
}

// liveLease reports whether the lease of chunk seq of r is live for an
// asker whose stale bound is staleAfter: held, and younger than
// staleAfter or of an unfinished worker that heartbeated within the
// greater of its own bound and staleAfter. m.mu is held.
func (m *Manifest) liveLease(r *fakeRun, seq int, staleAfter time.Duration, now time.Time) bool {
	l := r.leases[seq]
	if l == nil || l.key == "" {
		return false
	}
	if now.Sub(l.at) <= staleAfter {
		return true
	}
	w, ok := m.workers[l.key]
	return ok && !w.finished && now.Sub(w.heartbeat) <= max(w.w.StaleAfter, staleAfter)
}

// claimable reports whether chunk seq of r may be claimed: pending, or
// open and left open by an earlier call of the run. m.mu is held.
func claimable(r *fakeRun, seq int) bool {
	switch r.chunks[seq].Status {
	case backfill.ChunkPending:
		return true
	case backfill.ChunkOpen:
		return r.openCall[seq] < r.calls
	}
	return false
}

// LeaseChunk implements [backfilldriver.ManifestLeases.LeaseChunk] in
// memory, as the PostgreSQL manifest's lease statement does: the
// lowest-Seq claimable chunk not in l.Avoid, not locked by a
// transaction, whose lease is free, not live or l.Key's own, and with
// l.JobConcurrency only while fewer chunks hold a live lease.
func (m *Manifest) LeaseChunk(ctx context.Context, db sqlx.ExtContext, batchID int64, l backfilldriver.Lease) (backfilldriver.ChunkLease, bool, bool, error) {
	if err := ctx.Err(); err != nil {
		return backfilldriver.ChunkLease{}, false, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return backfilldriver.ChunkLease{}, false, false, fmt.Errorf("backfill: lease chunk of batch %d: %w", batchID, err)
	}
	now := time.Now()
	if l.JobConcurrency > 0 {
		n := 0
		for seq := range r.chunks {
			if m.liveLease(r, seq, l.StaleAfter, now) {
				n++
			}
		}
		if n >= l.JobConcurrency {
			return backfilldriver.ChunkLease{}, false, true, nil
		}
	}
	if r.run.Status != backfill.RunRunning {
		return backfilldriver.ChunkLease{}, false, false, nil
	}
	for seq := range r.chunks {
		if !claimable(r, seq) || slices.Contains(l.Avoid, seq) {
			continue
		}
		if _, held := r.locked[seq]; held {
			continue // SKIP LOCKED
		}
		if r.leases[seq] != nil && r.leases[seq].key != l.Key && m.liveLease(r, seq, l.StaleAfter, now) {
			continue
		}
		if r.leases == nil {
			r.leases = map[int]*fakeLease{}
		}
		le := r.leases[seq]
		if le == nil {
			le = &fakeLease{}
			r.leases[seq] = le
		}
		le.key, le.epoch, le.at = l.Key, le.epoch+1, now
		ctl := backfilltype.ControlState{Status: r.run.Status, Reason: r.run.LastError, Knobs: map[string]float64{}}
		return backfilldriver.ChunkLease{State: r.chunks[seq], Epoch: le.epoch, Control: ctl}, true, false, nil
	}
	return backfilldriver.ChunkLease{}, false, false, nil
}

// FenceLease implements [backfilldriver.ManifestLeases.FenceLease]. tx
// must be a fake [*Tx]: the chunk stays locked by it until it ends (a
// chunk locked by another transaction is waited for), and its lease is
// cleared when it commits. pid is 0.
func (m *Manifest) FenceLease(ctx context.Context, tx sqlx.ExtContext, batchID int64, seq int, epoch int64, l backfilldriver.Lease) (backfilltype.ChunkState, int, bool, error) {
	ftx, ok := tx.(*Tx)
	if !ok {
		return backfilltype.ChunkState{}, 0, false, fmt.Errorf("backfilltest: fence chunk %d: executor %T is not a *backfilltest.Tx", seq, tx)
	}
	for {
		if err := ctx.Err(); err != nil {
			return backfilltype.ChunkState{}, 0, false, err
		}
		st, ok, wait, err := m.fence(ftx, batchID, seq, epoch, l.Key)
		if !wait {
			return st, 0, ok, err
		}
		// The chunk is locked by another transaction: wait for its end,
		// as FOR UPDATE does, then look again.
		select {
		case <-ctx.Done():
		case <-time.After(time.Millisecond):
		}
	}
}

// fence is one try of FenceLease; wait reports that another transaction
// locks the chunk.
func (m *Manifest) fence(ftx *Tx, batchID int64, seq int, epoch int64, key string) (st backfilltype.ChunkState, ok, wait bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return st, false, false, fmt.Errorf("backfill: fence chunk %d of batch %d: %w", seq, batchID, err)
	}
	if seq < 0 || seq >= len(r.chunks) {
		return st, false, false, nil
	}
	if owner, held := r.locked[seq]; held && owner != ftx {
		return st, false, true, nil
	}
	le := r.leases[seq]
	if le == nil || le.key != key || le.epoch != epoch {
		return st, false, false, nil // taken over, or released
	}
	if s := r.run.Status; s != backfill.RunRunning && s != backfill.RunPaused || !claimable(r, seq) {
		return st, false, false, nil
	}
	r.locked[seq] = ftx
	if r.lockKey == nil {
		r.lockKey = map[int]string{}
	}
	r.lockKey[seq] = key
	if !ftx.OnEnd(func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if r.locked[seq] == ftx {
			delete(r.locked, seq)
			delete(r.lockKey, seq)
		}
	}) {
		delete(r.locked, seq)
		delete(r.lockKey, seq)
		return st, false, false, fmt.Errorf("backfilltest: fence chunk %d: transaction already ended", seq)
	}
	// The lease ends with the commit; a rollback leaves it to key. Before
	// the transaction's end functions, which release the lock.
	ftx.OnCommit(func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if le := r.leases[seq]; le != nil && le.key == key && le.epoch == epoch {
			le.key, le.at = "", time.Time{}
		}
	})
	return r.chunks[seq], true, false, nil
}

// ReleaseLease implements [backfilldriver.ManifestLeases.ReleaseLease].
func (m *Manifest) ReleaseLease(ctx context.Context, db sqlx.ExtContext, batchID int64, seq int, key string, epoch int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return fmt.Errorf("backfill: release the lease of chunk %d of batch %d: %w", seq, batchID, err)
	}
	if le := r.leases[seq]; le != nil && le.key == key && le.epoch == epoch {
		le.key, le.at = "", time.Time{}
	}
	return nil
}

// Holders implements [backfilldriver.ManifestLeases.Holders] in memory:
// the chunks locked by fake transactions (their worker known when
// FenceLease locked them), then those with a live lease. With fence, the
// transaction of a stale registered worker is rolled back, as
// pg_terminate_backend ends its backend. PID is always 0.
func (m *Manifest) Holders(ctx context.Context, db sqlx.ExtContext, batchID int64, self string, staleAfter time.Duration, fence, running bool) ([]backfilldriver.ChunkHolder, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out, ended, err := m.holders(batchID, self, staleAfter, fence, running)
	// Outside m.mu: a transaction's end functions take it.
	for _, tx := range ended {
		_ = tx.Rollback()
	}
	return out, err
}

func (m *Manifest) holders(batchID int64, self string, staleAfter time.Duration, fence, running bool) ([]backfilldriver.ChunkHolder, []*Tx, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return nil, nil, fmt.Errorf("backfill: chunks in flight of batch %d: %w", batchID, err)
	}
	if running && r.run.Status != backfill.RunRunning {
		return nil, nil, nil
	}
	now := time.Now()
	// who fills in a holder's worker: registered, or unknown.
	who := func(h *backfilldriver.ChunkHolder, key string) *fakeWorker {
		h.AgeSec = -1
		w, ok := m.workers[key]
		if !ok {
			return nil
		}
		h.WorkerID, h.Host, h.OSPID = w.w.ID, w.w.Host, w.w.PID
		h.AgeSec = now.Sub(w.heartbeat).Seconds()
		return w
	}
	var out []backfilldriver.ChunkHolder
	var ended []*Tx
	for seq, c := range r.chunks {
		if c.Status != backfill.ChunkPending && c.Status != backfill.ChunkOpen {
			continue
		}
		if tx, held := r.locked[seq]; held {
			key := r.lockKey[seq]
			h := backfilldriver.ChunkHolder{Seq: seq, ChunkID: c.Chunk.ID}
			if w := who(&h, key); w != nil {
				h.WorkerKey = key
				h.Stale = w.finished || now.Sub(w.heartbeat) > max(w.w.StaleAfter, staleAfter)
				h.Terminated = fence && key != self && h.Stale
			} else if key != "" {
				h.WorkerID = "backfill " + key + " "
			}
			if self == "" || h.WorkerKey != self {
				out = append(out, h)
				if h.Terminated {
					ended = append(ended, tx)
				}
			}
		}
		if le := r.leases[seq]; le != nil && (self == "" || le.key != self) && m.liveLease(r, seq, staleAfter, now) {
			h := backfilldriver.ChunkHolder{Seq: seq, ChunkID: c.Chunk.ID, WorkerKey: le.key}
			who(&h, le.key)
			out = append(out, h)
		}
	}
	return out, ended, nil
}

// WaitInFlight implements [backfilldriver.ManifestLeases.WaitInFlight] in
// memory: it polls every w.Poll (at least a millisecond) until no pending
// or open chunk of the run is locked by a transaction or leased by a live
// lease of another key than w.Self, logging the holders and fencing the
// stale ones meanwhile.
func (m *Manifest) WaitInFlight(ctx context.Context, db sqlx.ExtContext, batchID int64, w backfilldriver.FenceWait) error {
	begin := time.Now()
	log := cmp.Or(w.Log, slog.New(slog.DiscardHandler))
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		locked, leased, err := m.inFlight(batchID, w.Self, w.StaleAfter)
		if err != nil {
			return fmt.Errorf("backfill: wait for the chunks in flight of batch %d: %w", batchID, err)
		}
		if locked == 0 && leased == 0 {
			if n > 0 {
				log.Info("backfill: chunks in flight ended", "what", w.What, "batch_id", batchID, "waited", time.Since(begin))
			}
			return nil
		}
		hs, err := m.Holders(ctx, db, batchID, w.Self, w.StaleAfter, locked > 0, false)
		if err != nil {
			log.Warn("backfill: listing chunks in flight failed", "batch_id", batchID, "error", err)
		}
		for _, h := range hs {
			pgstore.LogHolder(log, w.What, batchID, h, time.Since(begin))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(max(w.Poll, time.Millisecond)):
		}
	}
}

// inFlight counts the pending or open chunks of run batchID locked by a
// transaction, and those leased by a live lease of another key than self.
func (m *Manifest) inFlight(batchID int64, self string, staleAfter time.Duration) (locked, leased int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return 0, 0, err
	}
	now := time.Now()
	for seq, c := range r.chunks {
		if c.Status != backfill.ChunkPending && c.Status != backfill.ChunkOpen {
			continue
		}
		if _, held := r.locked[seq]; held {
			locked++
		}
		if le := r.leases[seq]; le != nil && le.key != self && m.liveLease(r, seq, staleAfter, now) {
			leased++
		}
	}
	return locked, leased, nil
}
