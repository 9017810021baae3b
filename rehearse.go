package backfill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Rehearsal is a rehearsal of a job ([Runner.Rehearse]).
type Rehearsal = backfilltype.Rehearsal

// RehearsalChunk is what one rehearsed chunk took ([Rehearsal.Chunks]).
type RehearsalChunk = backfilltype.RehearsalChunk

// RehearsalForecast is a rehearsal's projection of the full run.
type RehearsalForecast = backfilltype.RehearsalForecast

// ForecastCheck compares a run with its rehearsal's forecast
// ([Status.Forecast]).
type ForecastCheck = backfilltype.ForecastCheck

// RehearseOptions choose the chunks [Runner.Rehearse] runs and how it
// projects the run. The zero value rehearses three chunks: the first,
// middle and last of the plan.
type RehearseOptions struct {
	// Chunks names the chunks to rehearse, each by its ID or its Seq (in
	// decimal), in the order given. Empty: a sample (Sample, Estimate).
	Chunks []string
	// Sample is the number of chunks of the default sample: the chunks at
	// evenly spaced ranks of the plan's chunks ordered by their estimate
	// (with Estimate; 3: the smallest, the median and the largest), or in
	// plan order (without), rehearsed in plan order. 0 means 3; capped at
	// the plan's chunks.
	Sample int
	// Estimate, if not nil, estimates the rows of a chunk of the plan
	// (the count of its source rows, say). It is called once for every
	// chunk of the plan, before any is rehearsed; the estimates choose the
	// sample and weigh the projection (RehearsalForecast.Basis "rows").
	// An error stops the rehearsal. Nil: every chunk is projected at the
	// mean of the rehearsed ones (Basis "chunks").
	Estimate func(ctx context.Context, c Chunk) (int64, error)
	// Concurrency is the number of chunks the projection assumes at
	// once; 0 means Config.Concurrency.
	Concurrency int
	// WarmExtract extracts each rehearsed chunk once, untimed and
	// discarded, before the extraction that is measured and loaded: for
	// an extractor whose cost a run spreads over neighbouring chunks (a
	// cache of a file's blocks or row groups that consecutive chunks
	// share), which a rehearsal of scattered chunks would otherwise pay
	// in full for each. Leave it unset for a source each chunk reads
	// afresh in a run too (a database's rows of another day).
	WarmExtract bool
	// NoRecord leaves the rehearsal out of the manifest.
	NoRecord bool
}

// rehearsalCommits is the number of short transactions a rehearsal
// commits to time one (pgstore.CommitTime).
const rehearsalCommits = 7

// errRehearsed aborts a rehearsed chunk's transaction where its commit
// would be.
var errRehearsed = errors.New("backfill: rehearsed: rolled back")

// Rehearse runs a sample of job's chunks (opts) on the path [Runner.Run]
// runs every chunk on — the extractor reading the source outside any
// transaction, then, in one transaction, staging, the merge into the
// target with the undo log, the validators and the checkpoint — and rolls
// each chunk's transaction back where Run would commit it. It measures
// each chunk ([RehearsalChunk]: its phases' durations, rows, WAL, locks,
// growth of the target, its indexes and the undo log, its staging, the
// Go heap), times a short committed transaction (what each chunk's lease
// and commit cost the run beyond its rolled back transaction: on a
// server with fsync and synchronous_commit on, a WAL flush), projects
// the full run ([RehearsalForecast]) and records the
// rehearsal in the manifest (unless opts.NoRecord); [Runner.Status]
// compares a later run of the same plan with the forecast.
//
// Nothing a rehearsed chunk wrote persists: not its target rows, undo
// log, exceptions or validation results, nor the run its transaction
// created to hold its checkpoint (the job's advisory lock is held while
// it lasts, so a Run of the job starting meanwhile waits for it). The
// rehearsal leaves what a rolled back transaction leaves: dead tuples
// (vacuumed later), relation files grown, sequence values taken by the
// target's serial columns. Rehearse before the run, or after one ended:
// a job whose latest run is running, paused or failed is refused with an
// error wrapping [ErrRunStatus]. A failure of a chunk (its extractor, a
// validator's gate, a rejected row past the limits) ends the rehearsal
// with a [*ChunkError] naming it; nothing is recorded. So does a lock
// another session holds on the target (a LOCK TABLE, a DDL) for longer
// than [Config.LockTimeout]: the error names the sessions holding it.
//
// The job is refused as [Runner.RunChunk] refuses it (a publish mode
// other than per chunk, SkipUnchanged): every chunk is merged. Rehearse
// needs a Runner on PostgreSQL ([New]). Chunks run one at a time, then, with a Concurrency (RehearseOptions, else Config) over 1, again that many at once for the timing (RehearsalChunk.ConcurrentDuration).
func (r *Runner) Rehearse(ctx context.Context, job Job, opts RehearseOptions) (Rehearsal, error) {
	rm, ok := r.cfg.Manifest.(*pgstore.Manifest)
	if _, pg := r.db.(pgstore.PGDB); !pg || !ok {
		return Rehearsal{}, fmt.Errorf("backfill: job %q: %w: Rehearse needs a Runner on PostgreSQL (backfill.New) with its manifest", job.Name, ErrUnsupported)
	}
	if opts.Sample < 0 || opts.Concurrency < 0 {
		return Rehearsal{}, fmt.Errorf("backfill: job %q: %w: RehearseOptions.Sample and Concurrency must not be negative", job.Name, ErrInvalidConfig)
	}
	job, err := engineJob(job)
	if err != nil {
		return Rehearsal{}, err
	}
	rs, err := r.planRun(ctx, job)
	if err != nil {
		return Rehearsal{}, err
	}
	var chunks []Chunk
	for c, err := range rs.plan.AllChunks(ctx) {
		if err != nil {
			return Rehearsal{}, fmt.Errorf("backfill: job %q: chunks: %w", job.Name, err)
		}
		chunks = append(chunks, c)
	}
	var est []int64
	if opts.Estimate != nil {
		est = make([]int64, len(chunks))
		for i, c := range chunks {
			if est[i], err = opts.Estimate(ctx, c); err != nil {
				return Rehearsal{}, fmt.Errorf("backfill: job %q: estimate of chunk %d %s: %w", job.Name, c.Seq, c.ID, err)
			}
		}
	}
	picked, err := rehearsalSample(chunks, est, opts)
	if err != nil {
		return Rehearsal{}, fmt.Errorf("backfill: job %q: %w", job.Name, err)
	}

	newEx := func() *execution {
		ex := &execution{r: r, job: rs.job, info: rs.info, base: rs.info.Target.Table, plan: rs.plan, pub: rs.pub, log: r.cfg.Logger.With("job", job.Name, "rehearsal", true),
			undoTable: rs.undoTable, deliveredTable: rs.deliveredTable, watermark: rs.plan.Watermark, warnings: rs.warnings}
		// A rehearsed chunk runs whole (Config.ChunkTarget's sub-chunks
		// are checkpointed under a lease a rehearsal does not take).
		ex.adapt.once.Do(func() { ex.adapt.why = "a rehearsal runs its chunks whole" })
		return ex
	}
	estOf := func(i int) int64 {
		if est == nil {
			return -1
		}
		return est[i]
	}
	conc := opts.Concurrency
	if conc == 0 {
		conc = r.cfg.Concurrency
	}
	conc = max(conc, 1)
	rh := Rehearsal{Job: job.Name, Fingerprint: rs.plan.Fingerprint, CodeVersion: job.CodeVersion, Worker: r.cfg.WorkerID, ChunksTotal: len(chunks)}
	// The measures: one chunk at a time, so that the WAL and the growth
	// each reads are its own.
	for _, i := range picked {
		rc, err := newEx().rehearseChunk(ctx, rm, chunks[i], estOf(i), opts.WarmExtract, 0)
		if err != nil {
			return Rehearsal{}, err
		}
		rh.Chunks = append(rh.Chunks, rc)
	}
	// The timing: again, conc at a time, as a run's workers contend.
	if conc > 1 && len(picked) > 1 {
		if err := rehearseConcurrently(ctx, rm, newEx, chunks, picked, estOf, opts.WarmExtract, conc, rh.Chunks); err != nil {
			return Rehearsal{}, err
		}
	}
	// The commits the rolled back chunks did not pay: timed on the
	// server, alone.
	pg := r.db.(pgstore.PGDB)
	commit, durability, err := pgstore.CommitTime(ctx, pg.DB, rehearsalCommits)
	if err != nil {
		return Rehearsal{}, fmt.Errorf("backfill: job %q: %w", job.Name, err)
	}
	rh.Forecast = project(rh.Chunks, est, len(chunks), max(conc, 1), commit)
	rh.Forecast.Durability = durability
	rh.Forecast.WarmExtract = opts.WarmExtract
	if opts.NoRecord {
		return rh, nil
	}
	return rm.RecordRehearsal(ctx, r.db, rh)
}

// rehearsalSample returns the indexes in chunks of the chunks to
// rehearse: those opts names, or the default sample (RehearseOptions.Sample).
// est are the chunks' estimates (nil for none).
func rehearsalSample(chunks []Chunk, est []int64, opts RehearseOptions) ([]int, error) {
	if len(chunks) == 0 {
		return nil, fmt.Errorf("%w: the plan has no chunk to rehearse", ErrEmptyScope)
	}
	if len(opts.Chunks) > 0 {
		out := make([]int, 0, len(opts.Chunks))
		for _, name := range opts.Chunks {
			i := slices.IndexFunc(chunks, func(c Chunk) bool { return c.ID == name })
			if seq, err := strconv.Atoi(name); i < 0 && err == nil && seq >= 0 && seq < len(chunks) && chunks[seq].Seq == seq {
				i = seq
			}
			if i < 0 {
				return nil, fmt.Errorf("%w: no chunk %q in the plan (name a chunk by its ID or its Seq, 0 to %d)", ErrInvalidConfig, name, len(chunks)-1)
			}
			if !slices.Contains(out, i) {
				out = append(out, i)
			}
		}
		return out, nil
	}
	n := opts.Sample
	if n == 0 {
		n = 3
	}
	n = min(n, len(chunks))
	order := make([]int, len(chunks))
	for i := range order {
		order[i] = i
	}
	if est != nil {
		// By estimate, then plan order: deterministic among equals.
		slices.SortStableFunc(order, func(a, b int) int {
			switch {
			case est[a] < est[b]:
				return -1
			case est[a] > est[b]:
				return 1
			}
			return 0
		})
	}
	var out []int
	for k := range n {
		rank := 0
		if n > 1 {
			rank = (k*(len(chunks)-1) + (n-1)/2) / (n - 1)
		}
		if i := order[rank]; !slices.Contains(out, i) {
			out = append(out, i)
		}
	}
	// Rehearsed in plan order, as a run takes them: a rolled back chunk
	// leaves its index entries (dead until a vacuum), and a chunk whose
	// keys fall between those of chunks rehearsed before it would split
	// index pages a run, appending in key order, does not split.
	slices.Sort(out)
	return out, nil
}

// rehearseConcurrently rehearses the chunks picked again, conc at a time
// (slots of their own: [pgstore.Manifest.RehearsalRun]), and sets the
// phases each took then in rcs (in picked's order). The first conc-1 of
// them run once more at the end, unmeasured, so that the last measured
// ones too run beside others.
func rehearseConcurrently(ctx context.Context, rm *pgstore.Manifest, newEx func() *execution, chunks []Chunk, picked []int, estOf func(int) int64,
	warm bool, conc int, rcs []RehearsalChunk) error {
	queue := make(chan int, len(picked)+conc)
	for k := range picked {
		queue <- k
	}
	for k := range min(conc-1, len(picked)) {
		queue <- -1 - k // a filler: picked[k] again, unmeasured
	}
	close(queue)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for slot := range conc {
		wg.Go(func() {
			for k := range queue {
				measured := k >= 0
				if !measured {
					k = -1 - k
				}
				i := picked[k]
				rc, err := newEx().rehearseChunk(ctx, rm, chunks[i], estOf(i), warm, slot+1)
				mu.Lock()
				if err != nil && first == nil {
					first = err
					cancel()
				}
				if err == nil && measured {
					rcs[k].Concurrent, rcs[k].ConcurrentDuration = rc.Phases, rc.Duration
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// rehearseChunk runs chunk c (estimate est, -1 for none) on runChunk's
// steps, extract and loadChunk, with its transaction rolled back where
// the commit would be, and returns what it measured. warm extracts it
// once before, untimed (RehearseOptions.WarmExtract); slot tells its
// transaction's run from those of the rehearsal's concurrent others.
func (ex *execution) rehearseChunk(ctx context.Context, rm *pgstore.Manifest, c Chunk, est int64, warm bool, slot int) (rc RehearsalChunk, err error) {
	rc = RehearsalChunk{Chunk: c, EstimatedRows: est}
	if warm {
		x, err := ex.extractSpooled(ctx, c, time.Now(), "", Counts{})
		if err != nil {
			return rc, &ChunkError{Chunk: c, Attempt: 1, Err: err}
		}
		x.close()
	}
	heap := startHeapPeak()
	defer func() { rc.HeapBaseBytes, rc.HeapBytes = heap.stop() }()

	// The chunk's span, with a tracer of the rehearsal's own timing its
	// phases (the Config's tracer sees nothing of a rehearsal).
	rec := &phaseClock{}
	cr := chunkRun{outcome: tryClaimed, attempt: 1, fresh: true}
	cr.span = &chunkSpan{tr: &tracers{chunk: rec, phase: rec}, base: backfilltrace.ChunkStartData{Job: ex.job.Name, Chunk: c, Attempt: 1, Start: time.Now()}, ctx: ctx}
	defer func() {
		cr.span.end(&cr, err)
		rc.Phases = rec.phases
		rc.Duration = rc.Phases.Total()
	}()
	h := &heldLease{cl: backfilldriver.ChunkLease{State: backfilltype.ChunkState{Chunk: c, Status: ChunkPending}}}
	t, err := ex.extract(ctx, &cr, h)
	if err != nil {
		return rc, err
	}
	defer t.x.close()

	cr.span.next(ctx, backfilltrace.PhaseStage)
	tx, err := ex.beginChunk(ctx)
	if err != nil {
		return rc, t.chunkErr(fmt.Errorf("begin chunk transaction: %w", err))
	}
	tx = batched(tx)
	defer func() { _ = tx.Rollback() }()
	// A run's claim sets its chunk transaction's lock_timeout; a
	// rehearsal claims nothing, so it sets the longest of the retry
	// table itself. Without it a session holding a lock on the target
	// (a LOCK TABLE, a DDL) held the rehearsal, and the job's advisory
	// lock with it, for as long as it kept the lock, silently.
	s := ex.r.cfg.txSettings()
	lt := s.TryLockTimeout(len(s.Retries) - 1)
	if lt != "" {
		if _, err := tx.ExecContext(ctx, `SELECT set_config('backfill.lock_timeout', set_config('lock_timeout', $1, true), true)`, lt); err != nil {
			return rc, t.chunkErr(fmt.Errorf("rehearsal: set lock_timeout: %w", err))
		}
		defer func() {
			if code, _, ok := pgstore.WaitCode(ctx, err); ok && code == "55P03" {
				bctx := context.WithoutCancel(ctx)
				bs := pgstore.ConflictingHolders(bctx, ex.r.db, ex.base)
				if len(bs) == 0 {
					bs = pgstore.StrongLockHolders(bctx, ex.r.db)
				}
				held := pgstore.DescribeBlockers(bs)
				if held == "" {
					held = "none seen"
				}
				err = fmt.Errorf("%w; waited lock_timeout %s ms (Config.LockTimeout) for a lock held by: %s; rehearse again once it is released", err, lt, held)
			}
		}()
	}
	// The run that holds the chunk's checkpoint, in the transaction: a
	// run's start, timed apart from the chunk's phases (a phase the
	// clock does not count).
	cr.span.next(ctx, backfilltrace.PhaseQueued)
	start, err := pgstore.WALInsert(ctx, tx)
	if err != nil {
		return rc, t.chunkErr(err)
	}
	began := time.Now()
	run, err := rm.RehearsalRun(ctx, tx, ex.plan, ex.r.cfg.WorkerID, slot)
	if err != nil {
		return rc, err
	}
	rc.RunStart = time.Since(began)
	ex.batchID = run.BatchID
	if b, ok := tx.(*pgstore.BatchTx); ok {
		b.Fresh = true
	}
	cr.span.next(ctx, backfilltrace.PhaseStage)
	before, err := pgstore.MarkRehearsal(ctx, tx, ex.info.Target.Table, ex.undoTable)
	if err != nil {
		return rc, t.chunkErr(err)
	}
	if rc.RunStartWALBytes, err = pgstore.WALSince(ctx, tx, start); err != nil {
		return rc, t.chunkErr(err)
	}
	t.tx, t.pid = tx, before.PID

	measured := false
	hook := func(ctx context.Context, stx *sql.Tx, res ChunkResult) error {
		cr.span.next(ctx, backfilltrace.PhaseCommit) // ends the checkpoint; not counted
		etx := pgstore.ExtTx(stx)
		var herr error
		if rc.WALBytes, herr = pgstore.WALSince(ctx, etx, before.WAL); herr != nil {
			return herr
		}
		if rc.Locks, herr = pgstore.OwnLocks(ctx, etx); herr != nil {
			return herr
		}
		after, herr := pgstore.MarkRehearsal(ctx, etx, ex.info.Target.Table, ex.undoTable)
		if herr != nil {
			return herr
		}
		rc.Counts = res.Counts
		rc.TargetBytes, rc.IndexBytes = after.Table-before.Table, after.Indexes-before.Indexes
		rc.UndoBytes, rc.TempBytes = after.Undo-before.Undo, after.Temp-before.Temp
		measured = true
		return errRehearsed
	}
	err = ex.loadChunk(withBeforeCommit(ctx, hook), t)
	if t.lockWaits != nil {
		t.lockWaits.mu.Lock()
		for _, w := range t.lockWaits.waits {
			rc.LockWait += w.Waited
		}
		t.lockWaits.mu.Unlock()
	}
	if !measured || !errors.Is(err, errRehearsed) {
		if err == nil {
			// Never: every chunk of a rehearsal reaches its BeforeCommit.
			err = t.chunkErr(errors.New("rehearsal: the chunk's transaction ended without reaching its commit"))
		}
		return rc, err
	}
	if rerr := tx.Rollback(); rerr != nil {
		return rc, t.chunkErr(fmt.Errorf("rehearsal: rollback: %w", rerr))
	}
	return rc, nil
}

// phaseClock times the phases of a rehearsed chunk, as a tracer.
type phaseClock struct {
	phases backfilltype.RehearsalPhases
}

func (p *phaseClock) TraceChunkStart(ctx context.Context, _ backfilltrace.ChunkStartData) context.Context {
	return ctx
}

func (p *phaseClock) TraceChunkEnd(context.Context, backfilltrace.ChunkEndData) {}

func (p *phaseClock) TracePhaseStart(ctx context.Context, _ backfilltrace.PhaseStartData) context.Context {
	return ctx
}

func (p *phaseClock) TracePhaseEnd(_ context.Context, d backfilltrace.PhaseEndData) {
	switch d.Phase {
	case backfilltrace.PhaseExtract:
		p.phases.Extract += d.Duration
	case backfilltrace.PhaseStage:
		p.phases.Stage += d.Duration
	case backfilltrace.PhaseMerge:
		p.phases.Merge += d.Duration
	case backfilltrace.PhaseValidate:
		p.phases.Validate += d.Duration
	case backfilltrace.PhaseCheckpoint:
		p.phases.Checkpoint += d.Duration
	}
}

// heapPeak samples the Go heap (runtime/metrics, which stops no world)
// every 2 ms until stop.
type heapPeak struct {
	done chan struct{}
	wg   sync.WaitGroup
	base int64
	peak int64
}

const heapMetric = "/memory/classes/heap/objects:bytes"

func readHeap() int64 {
	s := []metrics.Sample{{Name: heapMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}

func startHeapPeak() *heapPeak {
	h := &heapPeak{done: make(chan struct{}), base: readHeap()}
	h.peak = h.base
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-h.done:
				return
			case <-t.C:
				h.peak = max(h.peak, readHeap())
			}
		}
	}()
	return h
}

// stop ends the sampling and returns the base and the peak.
func (h *heapPeak) stop() (base, peak int64) {
	close(h.done)
	h.wg.Wait()
	return h.base, max(h.peak, readHeap())
}

// project projects a run of n chunks at concurrency conc from the
// rehearsed chunks rcs, commit being the time of a short committed
// transaction; est are the estimates of the plan's n chunks (nil for
// none). See [RehearsalForecast] for the model.
func project(rcs []RehearsalChunk, est []int64, n, conc int, commit time.Duration) RehearsalForecast {
	f := RehearsalForecast{Basis: "chunks", Chunks: n, Concurrency: conc, CommitTime: commit}
	if len(rcs) == 0 || n == 0 {
		return f
	}
	// What the run pays beyond its chunks' transactions: each chunk's
	// lease and commit, spread over the workers; the run's start (its
	// creation, as the quickest rehearsed chunk created it, and a
	// commit) and end (a commit). Its WAL: the run's creation's.
	var startWAL int64
	for i, rc := range rcs {
		if i == 0 || rc.RunStart < f.RunStart {
			f.RunStart, startWAL = rc.RunStart, rc.RunStartWALBytes
		}
	}
	f.Overhead = time.Duration(n)*2*commit/time.Duration(conc) + f.RunStart + 2*commit
	xs := make([]float64, len(rcs))
	var read, estSampled float64
	for i, rc := range rcs {
		xs[i] = float64(rc.Counts.Read)
		read += xs[i]
		estSampled += float64(max(rc.EstimatedRows, 0))
	}
	// sizes: the projected rows of each of the plan's chunks.
	sizes := make([]float64, n)
	if est != nil && estSampled > 0 {
		f.Basis = "rows"
		scale := read / estSampled
		for i := range sizes {
			sizes[i] = float64(est[i]) * scale
		}
	} else {
		for i := range sizes {
			sizes[i] = read / float64(len(rcs))
		}
	}
	var rows float64
	for _, s := range sizes {
		rows += s
	}
	f.Rows = int64(rows + 0.5)
	// total sums a fitted quantity over the plan's chunks; largest is
	// its largest chunk.
	var robust bool
	total := func(y func(RehearsalChunk) float64) (sum, largest float64, fit func(x float64) float64) {
		ys := make([]float64, len(rcs))
		for i, rc := range rcs {
			ys[i] = y(rc)
		}
		fit = fitLine(xs, ys)
		if robust {
			fit = fitRobust(xs, ys)
		}
		if f.Basis == "chunks" {
			var m float64
			for _, v := range ys {
				m += v
			}
			m /= float64(len(ys))
			if robust {
				m = median(ys)
			}
			fit = func(float64) float64 { return m }
		}
		for _, s := range sizes {
			v := fit(s)
			sum += v
			largest = max(largest, v)
		}
		return sum, largest, fit
	}
	// A chunk's time beside others when the timing pass ran.
	took := func(rc RehearsalChunk) float64 {
		if rc.ConcurrentDuration > 0 {
			return float64(rc.ConcurrentDuration)
		}
		return float64(rc.Duration)
	}
	// Durations are fitted robustly: one rehearsed chunk that stalled
	// (a checkpoint, another process's burst) would tilt a least-squares
	// line, and with it every chunk's projection.
	robust = true
	dur, longest, fit := total(took)
	robust = false
	lo, hi := 0.9, 1.1
	for i, rc := range rcs {
		if p := fit(xs[i]); p > 0 {
			r := took(rc) / p
			lo, hi = min(lo, r), max(hi, r)
		}
	}
	f.Duration = time.Duration(dur/float64(conc)) + f.Overhead
	f.DurationLow = time.Duration(dur*lo/float64(conc)) + f.Overhead
	f.DurationHigh = time.Duration(dur*hi/float64(conc)+longest*hi) + f.Overhead
	wal, _, _ := total(func(rc RehearsalChunk) float64 { return float64(rc.WALBytes) })
	wal += float64(startWAL)
	tb, _, _ := total(func(rc RehearsalChunk) float64 { return float64(rc.TargetBytes) })
	ib, _, _ := total(func(rc RehearsalChunk) float64 { return float64(rc.IndexBytes) })
	ub, _, _ := total(func(rc RehearsalChunk) float64 { return float64(rc.UndoBytes) })
	f.WALBytes, f.TargetBytes, f.IndexBytes, f.UndoBytes = int64(wal), int64(tb), int64(ib), int64(ub)
	var base, grow, peak int64
	for i, rc := range rcs {
		if i == 0 || rc.HeapBaseBytes < base {
			base = rc.HeapBaseBytes
		}
		grow = max(grow, rc.HeapBytes-rc.HeapBaseBytes)
		peak = max(peak, rc.HeapBytes)
	}
	f.HeapBytes = max(peak, base+int64(conc)*grow)
	return f
}

// fitRobust fits y = a + b·x as Theil and Sen do: b the median of the
// slopes between every two points with different xs, a the median of
// y - b·x, so that one point of five far off the line (a stalled chunk)
// moves neither. With a or b negative, or fewer than three points, it is
// fitLine.
func fitRobust(xs, ys []float64) func(float64) float64 {
	if len(xs) < 3 {
		return fitLine(xs, ys)
	}
	var slopes []float64
	for i := range xs {
		for j := i + 1; j < len(xs); j++ {
			if xs[i] != xs[j] {
				slopes = append(slopes, (ys[j]-ys[i])/(xs[j]-xs[i]))
			}
		}
	}
	if len(slopes) == 0 {
		return fitLine(xs, ys)
	}
	b := median(slopes)
	rs := make([]float64, len(xs))
	for i := range xs {
		rs[i] = ys[i] - b*xs[i]
	}
	a := median(rs)
	if a < 0 || b < 0 {
		return fitLine(xs, ys)
	}
	return func(x float64) float64 { return a + b*x }
}

// median is the median of vs (the mean of the middle two of an even
// count); vs is not changed.
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// fitLine fits y = a + b·x by least squares, with a, b >= 0: through the
// origin (b = Σy/Σx) when the xs do not differ or the fit's a or b is
// negative, and a constant (the mean) when every x is 0.
func fitLine(xs, ys []float64) func(float64) float64 {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	if sx == 0 {
		m := sy / n
		return func(float64) float64 { return m }
	}
	if d := n*sxx - sx*sx; d > 0 {
		b := (n*sxy - sx*sy) / d
		a := (sy - b*sx) / n
		if a >= 0 && b >= 0 {
			return func(x float64) float64 { return a + b*x }
		}
	}
	b := sy / sx
	return func(x float64) float64 { return b * x }
}
