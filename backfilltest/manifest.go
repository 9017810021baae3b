package backfilltest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

// Manifest is an in-memory [backfilldriver.Manifest] that behaves like
// [backfill.PGManifest] under [TestManifest]. It registers workers and
// leases chunks across transactions ([backfilldriver.ManifestLeases]), so
// that a Runner on it takes the path it takes on PostgreSQL: lease,
// extract outside any transaction, then one transaction from the fence to
// the commit. Claims and fences are exclusive until their transaction ends
// (like FOR UPDATE SKIP LOCKED), and completions and exceptions become
// visible on commit. Safe for concurrent use.
type Manifest struct {
	mu     sync.Mutex
	runs   []*fakeRun // index = batch ID - 1
	events []backfilltype.Event
	// waits are the recorded waits (RecordWait), nextWait the last ID.
	waits    []backfilltype.Wait
	nextWait int64
	// workers are the registered workers by key (RegisterWorker).
	workers map[string]*fakeWorker
	// subchunks are the sub-chunks committed per plan chunk
	// (CompleteSubchunk).
	subchunks map[subchunkKey][]backfilltype.Subchunk
}

type fakeRun struct {
	run    backfill.Run
	plan   backfill.Plan
	chunks []backfilltype.ChunkState
	locked map[int]*Tx
	// lockKey is the worker key of the transaction that locks a chunk,
	// per Seq, when FenceLease locked it (Holders).
	lockKey map[int]string
	// leases are the chunks' leases, per Seq (LeaseChunk).
	leases      map[int]*fakeLease
	calls       int         // calls that started or resumed the run
	openCall    map[int]int // chunk Seq -> the call that left it open
	exceptions  []backfill.Exception
	validations []backfilltype.Validation
	// failedExceptions are the exceptions of attempts a failed gate
	// rolled back (RecordGateFailure).
	failedExceptions []backfill.Exception
	// staged counts the staged rows per chunk Seq (StageChunk).
	staged map[int]int64
	// fingerprints are the chunks' recorded fingerprints, per Seq
	// (backfilldriver.ManifestSkips).
	fingerprints map[int]backfilldriver.ChunkFingerprints
}

var (
	_ backfill.Manifest                  = (*Manifest)(nil)
	_ backfilldriver.ManifestAudit       = (*Manifest)(nil)
	_ backfilldriver.ManifestValidations = (*Manifest)(nil)
	_ backfilldriver.ManifestGates       = (*Manifest)(nil)
)

// NewManifest returns an empty in-memory manifest.
func NewManifest() *Manifest { return &Manifest{} }

// Init does nothing and returns nil.
func (m *Manifest) Init(ctx context.Context, db sqlx.ExtContext) error { return ctx.Err() }

// event appends an audit-log entry; m.mu must be held.
func (m *Manifest) event(batchID int64, job, kind, actor string) {
	m.events = append(m.events, backfilltype.Event{ID: int64(len(m.events) + 1), BatchID: batchID, Job: job, Kind: kind,
		Actor: pgstore.ManifestText(actor), Detail: []byte("{}"), CreatedAt: time.Now()})
}

// RecordEvent implements [backfilldriver.ManifestAudit.RecordEvent]; in a fake
// transaction the event is appended on commit.
func (m *Manifest) RecordEvent(ctx context.Context, db sqlx.ExtContext, e backfilltype.Event) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(e.Detail) == 0 {
		e.Detail = []byte("{}")
	}
	// Free text as PostgreSQL stores it (see pgstore.ManifestText).
	e.Actor, e.Detail = pgstore.ManifestText(e.Actor), pgstore.ManifestJSON(e.Detail)
	return apply(db, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		e.ID, e.CreatedAt = int64(len(m.events)+1), time.Now()
		m.events = append(m.events, e)
	})
}

// Events implements [backfilldriver.ManifestAudit.Events].
func (m *Manifest) Events(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []backfilltype.Event
	for _, e := range m.events {
		if e.BatchID == batchID {
			out = append(out, e)
		}
	}
	return out, nil
}

// LatestRun implements [backfilldriver.ManifestAudit.LatestRun].
func (m *Manifest) LatestRun(ctx context.Context, db sqlx.ExtContext, job string, statuses ...backfill.RunStatus) (backfill.Run, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := len(m.runs) - 1; i >= 0; i-- {
		r := m.runs[i].run
		if r.Job == job && (len(statuses) == 0 || slices.Contains(statuses, r.Status)) {
			return r, nil
		}
	}
	return backfill.Run{}, fmt.Errorf("backfill: latest run of job %q with status %v: %w", job, statuses, backfill.ErrRunNotFound)
}

// StartRun implements [backfilldriver.Manifest.StartRun].
func (m *Manifest) StartRun(ctx context.Context, db sqlx.ExtContext, plan backfill.Plan, worker string, newRun bool) (backfill.Run, bool, error) {
	if err := ctx.Err(); err != nil {
		return backfill.Run{}, false, err
	}
	worker = pgstore.ManifestText(worker)
	m.mu.Lock()
	defer m.mu.Unlock()
	var prev *fakeRun
	for i := len(m.runs) - 1; i >= 0; i-- {
		if r := m.runs[i]; r.run.Job == plan.Job && r.run.Status != backfill.RunAbandoned {
			prev = r
			break
		}
	}
	if prev != nil {
		same := prev.run.Fingerprint == plan.Fingerprint
		switch {
		case same && !newRun:
			if prev.run.Status != backfill.RunCompleted && prev.run.Status != backfill.RunPaused && prev.run.Status != backfill.RunRolledBack && prev.run.Status != backfill.RunCancelled {
				for i := range prev.chunks {
					if prev.chunks[i].Status == backfill.ChunkFailed {
						prev.chunks[i].Status = backfill.ChunkPending
					}
				}
				prev.run.Status = backfill.RunRunning
				prev.run.LastError = ""
				prev.calls++
				m.event(prev.run.BatchID, plan.Job, "run_resumed", worker)
			}
			return prev.run, true, nil
		case !same && !newRun:
			diff := backfilltype.PlanDiff(prev.plan, plan)
			return backfill.Run{}, false, fmt.Errorf("backfill: start run of job %q: %w: job %q batch %d was planned differently (%v); set Job.NewRun to start a new run",
				plan.Job, backfill.ErrPlanChanged, plan.Job, prev.run.BatchID, diff)
		}
		if st := prev.run.Status; st == backfill.RunRunning || st == backfill.RunFailed || st == backfill.RunPaused {
			prev.run.Status = backfill.RunAbandoned
			m.event(prev.run.BatchID, plan.Job, "run_abandoned", worker)
		}
	}
	pj, err := json.Marshal(plan)
	if err != nil {
		return backfill.Run{}, false, err
	}
	id := int64(len(m.runs) + 1)
	r := &fakeRun{plan: plan, locked: map[int]*Tx{}, calls: 1, openCall: map[int]int{}}
	r.run = backfill.Run{BatchID: id, Job: plan.Job, Source: plan.Source, CodeVersion: plan.CodeVersion,
		Fingerprint: plan.Fingerprint, Plan: pj, Status: backfill.RunRunning, ChunksTotal: plan.Len(),
		Worker: worker, CreatedAt: time.Now(), Watermark: plan.Watermark}
	for c, err := range plan.AllChunks(ctx) {
		if err != nil {
			return backfill.Run{}, false, fmt.Errorf("backfill: start run of job %q: chunks: %w", plan.Job, err)
		}
		r.chunks = append(r.chunks, backfilltype.ChunkState{BatchID: id, Chunk: c, Status: backfill.ChunkPending})
	}
	if n := len(r.chunks); n > 0 {
		r.run.ScopeLower, _ = r.chunks[0].Chunk.Bounds()
		last := r.chunks[n-1].Chunk
		_, r.run.ScopeUpper = last.Bounds()
		if last.Kind == backfilltype.KindList {
			r.run.ScopeUpper = last.Item
		}
	}
	m.runs = append(m.runs, r)
	m.event(id, plan.Job, "run_started", worker)
	return r.run, false, nil
}

func (m *Manifest) get(batchID int64) (*fakeRun, error) {
	if batchID < 1 || batchID > int64(len(m.runs)) {
		return nil, fmt.Errorf("backfill: batch %d: %w", batchID, backfill.ErrRunNotFound)
	}
	return m.runs[batchID-1], nil
}

// ClaimChunk implements [backfilldriver.Manifest.ClaimChunk]. tx must be a
// fake [*Tx]; the claim lasts until it ends.
func (m *Manifest) ClaimChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64) (backfilltype.ChunkState, bool, error) {
	if err := ctx.Err(); err != nil {
		return backfilltype.ChunkState{}, false, err
	}
	ftx, ok := tx.(*Tx)
	if !ok {
		return backfilltype.ChunkState{}, false, fmt.Errorf("backfilltest: claim chunk: executor %T is not a *backfilltest.Tx", tx)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return backfilltype.ChunkState{}, false, err
	}
	if r.run.Status != backfill.RunRunning {
		return backfilltype.ChunkState{}, false, nil
	}
	for i, c := range r.chunks {
		// An open chunk is read again once per later call of the run.
		if c.Status != backfill.ChunkPending && (c.Status != backfill.ChunkOpen || r.openCall[i] >= r.calls) {
			continue
		}
		if owner, held := r.locked[i]; held && owner != ftx {
			continue
		}
		r.locked[i] = ftx
		seq := i
		if !ftx.OnEnd(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			if r.locked[seq] == ftx {
				delete(r.locked, seq)
			}
		}) {
			delete(r.locked, i)
			return backfilltype.ChunkState{}, false, fmt.Errorf("backfilltest: claim chunk: transaction already ended")
		}
		return c, true, nil
	}
	return backfilltype.ChunkState{}, false, nil
}

// CompleteChunk implements [backfilldriver.Manifest.CompleteChunk].
func (m *Manifest) CompleteChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, res backfill.ChunkResult, exceptions []backfill.Exception) error {
	return m.completeChunk(ctx, tx, batchID, res, exceptions, backfilldriver.ChunkFingerprints{})
}

// completeChunk is CompleteChunk recording fp (none when zero).
func (m *Manifest) completeChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, res backfill.ChunkResult, exceptions []backfill.Exception, fp backfilldriver.ChunkFingerprints) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !res.Balanced() {
		return fmt.Errorf("backfill: complete chunk %s: %w: %+v", res.Chunk.ID, backfill.ErrAccounting, res.Counts)
	}
	m.mu.Lock()
	r, err := m.get(batchID)
	if err == nil && (res.Chunk.Seq < 0 || res.Chunk.Seq >= len(r.chunks) ||
		!slices.Contains([]backfill.ChunkStatus{backfill.ChunkPending, chunkStaged, backfill.ChunkOpen}, r.chunks[res.Chunk.Seq].Status)) {
		err = fmt.Errorf("backfill: complete chunk %s of batch %d: chunk is not pending (completed by another worker?)", res.Chunk.ID, batchID)
	}
	m.mu.Unlock()
	if err != nil {
		return err
	}
	ex := slices.Clone(exceptions)
	now := time.Now()
	for i := range ex {
		ex[i] = pgstore.ManifestException(ex[i])
		ex[i].BatchID, ex[i].ChunkID, ex[i].CreatedAt = batchID, res.Chunk.ID, now
	}
	return apply(tx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		c := &r.chunks[res.Chunk.Seq]
		if c.Status == backfill.ChunkOpen {
			// Read before: the chunk's counts and exception queue are
			// those of the rows as they stand (see Counts.Reread).
			c.Counts = c.Counts.Reread(res.Counts)
			r.exceptions = slices.DeleteFunc(r.exceptions, func(e backfill.Exception) bool { return e.ChunkID == res.Chunk.ID })
		} else {
			c.Counts = res.Counts
		}
		c.Status = backfill.ChunkDone
		delete(r.openCall, res.Chunk.Seq)
		if res.Open {
			c.Status = backfill.ChunkOpen
			r.openCall[res.Chunk.Seq] = r.calls
		}
		c.Attempts++
		c.Skipped = res.Skipped
		st, fin := res.StartedAt, res.FinishedAt
		c.StartedAt, c.FinishedAt, c.LastError, c.Worker = &st, &fin, "", pgstore.ManifestText(res.Worker)
		r.exceptions = append(r.exceptions, ex...)
		if r.fingerprints == nil {
			r.fingerprints = map[int]backfilldriver.ChunkFingerprints{}
		}
		delete(r.fingerprints, res.Chunk.Seq)
		if !fp.IsZero() || fp.SkipKey != "" {
			fp.BatchID, fp.Counts = 0, backfill.Counts{}
			r.fingerprints[res.Chunk.Seq] = fp
		}
	})
}

// FailChunk implements [backfilldriver.Manifest.FailChunk].
func (m *Manifest) FailChunk(ctx context.Context, db sqlx.ExtContext, batchID int64, seq int, msg string, final bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return err
	}
	if seq < 0 || seq >= len(r.chunks) || r.chunks[seq].Status == backfill.ChunkDone {
		return nil
	}
	c := &r.chunks[seq]
	c.Attempts++
	c.LastError = pgstore.ManifestText(msg)
	if c.Status == backfill.ChunkOpen {
		return nil // it holds rows of its earlier reads
	}
	c.Status = backfill.ChunkPending
	if final {
		c.Status = backfill.ChunkFailed
	}
	return nil
}

// FinishRun implements [backfilldriver.Manifest.FinishRun].
func (m *Manifest) FinishRun(ctx context.Context, db sqlx.ExtContext, batchID int64, failed bool, msg string) (backfill.Run, error) {
	msg = pgstore.ManifestText(msg)
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return backfill.Run{}, err
	}
	switch r.run.Status {
	case backfill.RunCompleted, backfill.RunAbandoned, backfill.RunPaused, backfill.RunRolledBack, backfill.RunCancelled:
		return r.run, nil
	}
	open := 0
	for _, c := range r.chunks {
		if c.Status != backfill.ChunkDone {
			open++
		}
	}
	switch {
	case open == 0:
		now := time.Now()
		r.run.Status, r.run.FinishedAt, r.run.LastError = backfill.RunCompleted, &now, msg
	case failed:
		r.run.Status, r.run.LastError = backfill.RunFailed, msg
	default:
		return r.run, nil
	}
	m.event(batchID, r.run.Job, "run_"+string(r.run.Status), "")
	return r.run, nil
}

// Chunks implements [backfilldriver.Manifest.Chunks].
func (m *Manifest) Chunks(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.ChunkState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return nil, err
	}
	return slices.Clone(r.chunks), nil
}

// Exceptions implements [backfilldriver.Manifest.Exceptions].
func (m *Manifest) Exceptions(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfill.Exception, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return nil, err
	}
	seq := map[string]int{}
	for _, c := range r.chunks {
		seq[c.Chunk.ID] = c.Chunk.Seq
	}
	out := slices.Clone(r.exceptions)
	slices.SortStableFunc(out, func(a, b backfill.Exception) int {
		if d := seq[a.ChunkID] - seq[b.ChunkID]; d != 0 {
			return d
		}
		return int(a.Row - b.Row)
	})
	return out, nil
}

// AddValidations implements [backfilldriver.ManifestValidations.AddValidations].
func (m *Manifest) AddValidations(ctx context.Context, db sqlx.ExtContext, batchID int64, chunkID string, results []backfill.CheckResult) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	r, err := m.get(batchID)
	m.mu.Unlock()
	if err != nil {
		return err
	}
	now := time.Now()
	vs := make([]backfilltype.Validation, len(results))
	for i, cr := range results {
		vs[i] = backfilltype.Validation{CheckResult: pgstore.ManifestCheckResult(cr), BatchID: batchID, ChunkID: chunkID, CreatedAt: now}
	}
	return apply(db, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		r.validations = append(r.validations, vs...)
	})
}

// Validations implements [backfilldriver.ManifestValidations.Validations].
func (m *Manifest) Validations(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Validation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return nil, err
	}
	return slices.Clone(r.validations), nil
}

// RecordGateFailure implements [backfilldriver.ManifestGates.RecordGateFailure]:
// the results, the exceptions and the pause are applied together.
func (m *Manifest) RecordGateFailure(ctx context.Context, db sqlx.ExtContext, p backfilltype.GateFailure) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	reason := pgstore.ManifestText(p.Reason)
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(p.BatchID)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, cr := range p.Results {
		r.validations = append(r.validations, backfilltype.Validation{CheckResult: pgstore.ManifestCheckResult(cr), BatchID: p.BatchID, ChunkID: p.ChunkID, CreatedAt: now, FailedAttempt: p.Attempt})
	}
	for _, e := range p.Exceptions {
		e = pgstore.ManifestException(e)
		e.BatchID, e.ChunkID, e.CreatedAt, e.FailedAttempt = p.BatchID, p.ChunkID, now, p.Attempt
		r.failedExceptions = append(r.failedExceptions, e)
	}
	for i := range r.chunks {
		if c := &r.chunks[i]; c.Chunk.ID == p.ChunkID && c.Status != backfill.ChunkDone {
			c.Attempts++
			c.LastError = "quality gate failed: " + reason
		}
	}
	if r.run.Status == backfill.RunRunning || r.run.Status == backfill.RunFailed {
		r.run.Status, r.run.LastError = backfill.RunPaused, fmt.Sprintf("chunk %s: %s", p.ChunkID, reason)
		m.event(p.BatchID, r.run.Job, "run_paused", "")
	}
	return nil
}

// FailedAttemptExceptions implements
// [backfilldriver.ManifestGates.FailedAttemptExceptions].
func (m *Manifest) FailedAttemptExceptions(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfill.Exception, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return nil, err
	}
	seq := map[string]int{}
	for _, c := range r.chunks {
		seq[c.Chunk.ID] = c.Chunk.Seq
	}
	out := slices.Clone(r.failedExceptions)
	slices.SortStableFunc(out, func(a, b backfill.Exception) int {
		if d := seq[a.ChunkID] - seq[b.ChunkID]; d != 0 {
			return d
		}
		if d := a.FailedAttempt - b.FailedAttempt; d != 0 {
			return d
		}
		return int(a.Row - b.Row)
	})
	return out, nil
}

// PauseRun implements [backfilldriver.ManifestValidations.PauseRun].
func (m *Manifest) PauseRun(ctx context.Context, db sqlx.ExtContext, batchID int64, reason string) error {
	reason = pgstore.ManifestText(reason)
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return err
	}
	if r.run.Status == backfill.RunRunning || r.run.Status == backfill.RunFailed {
		r.run.Status, r.run.LastError = backfill.RunPaused, reason
		m.event(batchID, r.run.Job, "run_paused", "")
	}
	return nil
}

// ResumeRun implements [backfilldriver.ManifestValidations.ResumeRun].
func (m *Manifest) ResumeRun(ctx context.Context, db sqlx.ExtContext, batchID int64, actor, why string) error {
	actor, why = pgstore.ManifestText(actor), pgstore.ManifestText(why)
	m.mu.Lock()
	defer m.mu.Unlock()
	r, err := m.get(batchID)
	if err != nil {
		return err
	}
	if r.run.Status != backfill.RunPaused && r.run.Status != backfill.RunCancelled {
		return fmt.Errorf("backfill: resume run %d: %w", batchID, backfill.ErrNotPaused)
	}
	r.run.Status, r.run.LastError = backfill.RunRunning, ""
	// The rows the resume accepts (the reject gate's baseline): the run's
	// totals of its done and open chunks, as PostgreSQL's resume records.
	var read, rejected int64
	for _, c := range r.chunks {
		if c.Status == backfill.ChunkDone || c.Status == backfill.ChunkOpen {
			read += c.Counts.Read
			rejected += c.Counts.Rejected
		}
	}
	m.events = append(m.events, backfilltype.Event{ID: int64(len(m.events) + 1), BatchID: batchID, Job: r.run.Job,
		Kind: "run_resumed_by_operator", Actor: actor, Detail: mustJSON(map[string]any{"why": why, "read": read, "rejected": rejected}), CreatedAt: time.Now()})
	return nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
