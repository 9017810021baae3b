package backfill

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"golang.org/x/sync/errgroup"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/quote"
	"github.com/pgbackfill/backfill/internal/suggest"
)

// DB is what a [Runner] needs from a database: an executor for
// statements outside chunks and a way to begin a chunk's transaction.
// [Postgres] adapts a *sqlx.DB; backfilltest.NewDB returns an in-memory
// one for tests with fakes.
type DB = backfilldriver.DB

// Postgres adapts db (opened with the "postgres" driver of lib/pq) to [DB].
func Postgres(db *sqlx.DB) DB { return pgstore.PGDB{DB: db} }

// Runner runs jobs. It is safe for concurrent use; several Runners, in one
// or many processes, may run the same job at once: each chunk is claimed by
// exactly one of them.
type Runner struct {
	db  DB
	cfg Config
	// caps are the optional interfaces of cfg.Manifest and cfg.Merger,
	// resolved once by NewWithDB.
	caps capabilities
	// tracers are cfg.Tracer and its optional interfaces.
	tracers tracers
	// noSkipLogged holds the jobs (by name) whose default skipping of
	// unchanged chunks was found impossible and logged ([Runner.skipMode]).
	noSkipLogged sync.Map
	// draining: [Runner.Drain] was called; every call stops claiming.
	// drained is closed then, waking the calls that wait.
	draining atomic.Bool
	drained  chan struct{}
	// mem holds the shares of cfg.MemoryBudget.
	mem memoryShares
	// signalPauses holds, per batch, the "run_paused" event of the pause
	// that a signal of PauseOnSignal made or found (int64 -> int64): a
	// call of Run returns while that pause lasts, rather than wait.
	signalPauses sync.Map
}

// Drain makes every call of r (Run, Work, Resume, a waiting paused call)
// stop claiming chunks, for a process that shuts down without stopping the
// run: the chunks already claimed finish (extracted, merged and
// checkpointed, or rolled back if they fail, as always), and each call
// returns once they are done, with the run left running for the other
// workers. A call ended so returns the run's report with an error
// wrapping [ErrRunIncomplete] (Work: ExitTempFail, 75). It does not wait
// and cannot be undone: r claims nothing more. To bound the time, cancel
// the calls' context after a grace period; the chunks still in flight then
// roll back.
func (r *Runner) Drain() {
	if !r.draining.Swap(true) {
		if r.drained != nil {
			close(r.drained)
		}
		r.cfg.Logger.Info("backfill: draining: no more chunks are claimed; the chunks in flight finish")
	}
}

// New returns a Runner on a PostgreSQL database. cfg may be nil (all
// defaults). It returns an error wrapping [ErrInvalidConfig] naming a bad
// field.
func New(db *sqlx.DB, cfg *Config) (*Runner, error) {
	if db == nil {
		return nil, fmt.Errorf("backfill: new: %w: nil db", ErrInvalidConfig)
	}
	return NewWithDB(Postgres(db), cfg)
}

// NewWithDB returns a Runner on any [DB], such as backfilltest.NewDB for
// tests with fakes. cfg may be nil.
func NewWithDB(db DB, cfg *Config) (*Runner, error) {
	if db == nil {
		return nil, fmt.Errorf("backfill: new: %w: nil db", ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	c.resolveTimeouts()
	c.Concurrency = cmp.Or(c.Concurrency, 1)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 3)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, 100*time.Millisecond)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	c.StaleAfter = cmp.Or(c.StaleAfter, max(DefaultStaleAfter, 3*c.HeartbeatInterval))
	switch {
	case c.MaxRejectsPerChunk == 0:
		c.MaxRejectsPerChunk = DefaultMaxRejectsPerChunk
	case c.MaxRejectsPerChunk < 0:
		c.MaxRejectsPerChunk = 0 // unlimited
	}
	switch {
	case c.MaxStagingRejects == 0:
		c.MaxStagingRejects = DefaultMaxStagingRejects
	case c.MaxStagingRejects < 0:
		c.MaxStagingRejects = 0 // never isolate
	}
	switch {
	case c.MaxMergeRefusals == 0:
		c.MaxMergeRefusals = pgstore.DefaultMaxMergeRefusals
	case c.MaxMergeRefusals < 0:
		c.MaxMergeRefusals = 0 // refuse none
	}
	if c.Manifest == nil {
		c.Manifest = NewPGManifest("")
	}
	if c.Merger == nil {
		c.Merger = pgstore.NewMerger()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.WorkerID == "" {
		host, _ := os.Hostname()
		c.WorkerID = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	caps, err := resolveCapabilities(c.Manifest, c.Merger)
	if err != nil {
		return nil, fmt.Errorf("backfill: new: %w", err)
	}
	if pd, ok := db.(pgstore.PGDB); ok {
		// The short manifest transactions take the Runner's timeouts.
		ts := c.txSettings()
		pd.Settings, pd.Log = &ts, c.Logger
		db = pd
	}
	c.MemoryBudget = cmp.Or(c.MemoryBudget, DefaultMemoryBudget)
	mem := newMemoryShares(c.MemoryBudget)
	if m, ok := c.Merger.(*pgstore.Merger); ok {
		m.SetKeyBudget(mem.keys)
	}
	return &Runner{db: db, cfg: c, caps: caps, tracers: resolveTracers(c.Tracer), drained: make(chan struct{}), mem: mem}, nil
}

func (c *Config) validate() error {
	switch {
	case c.Concurrency < 0:
		return fmt.Errorf("%w: Concurrency cannot be less than zero", ErrInvalidConfig)
	case c.MaxAttempts < 0:
		return fmt.Errorf("%w: MaxAttempts cannot be less than zero", ErrInvalidConfig)
	case c.RetryBackoff < 0:
		return fmt.Errorf("%w: RetryBackoff cannot be less than zero", ErrInvalidConfig)
	case c.MemoryBudget < 0 || c.MemoryBudget > 0 && c.MemoryBudget < minMemoryBudget:
		return fmt.Errorf("%w: MemoryBudget (%d bytes) must be at least %d (32 MiB; 0: the default, %d)", ErrInvalidConfig, c.MemoryBudget, minMemoryBudget, DefaultMemoryBudget)
	case c.HeartbeatInterval < 0 || c.StaleAfter < 0:
		return fmt.Errorf("%w: HeartbeatInterval and StaleAfter cannot be less than zero", ErrInvalidConfig)
	case c.StaleAfter > 0 && c.StaleAfter <= 2*cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval):
		return fmt.Errorf("%w: StaleAfter (%v) must exceed twice HeartbeatInterval (%v)", ErrInvalidConfig, c.StaleAfter, cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval))
	case c.ChunkTarget < 0:
		return fmt.Errorf("%w: ChunkTarget (%v) cannot be less than zero (0: plan chunks run whole)", ErrInvalidConfig, c.ChunkTarget)
	case c.ChunkMinRows < 0:
		return fmt.Errorf("%w: ChunkMinRows (%d) cannot be less than zero (0: the default, %d)", ErrInvalidConfig, c.ChunkMinRows, DefaultChunkMinRows)
	case c.ChunkMaxRows < 0:
		return fmt.Errorf("%w: ChunkMaxRows (%d) cannot be less than zero (0: no cap)", ErrInvalidConfig, c.ChunkMaxRows)
	case c.ChunkMaxRows > 0 && c.ChunkMinRows > c.ChunkMaxRows:
		return fmt.Errorf("%w: ChunkMinRows (%d) exceeds ChunkMaxRows (%d)", ErrInvalidConfig, c.ChunkMinRows, c.ChunkMaxRows)
	}
	if err := c.validateTimeouts(); err != nil {
		return err
	}
	return c.validateThrottles()
}

func (j Job) validate() error {
	switch {
	case j.Name == "":
		return fmt.Errorf("%w: Job.Name is required", ErrInvalidConfig)
	case j.Chunker == nil:
		return fmt.Errorf("%w: Job.Chunker is required (job %q)", ErrInvalidConfig, j.Name)
	case j.Extractor == nil:
		return fmt.Errorf("%w: Job.Extractor is required (job %q)", ErrInvalidConfig, j.Name)
	}
	if err := j.Publish.validate(j.Name, j.ChunkColumn); err != nil {
		return err
	}
	if err := j.validateApproval(); err != nil {
		return err
	}
	return j.Target.Validate()
}

// Run freezes job into a plan and runs its chunks until every chunk is
// done, a chunk fails for good, or ctx is done.
//
// The first call creates a run (a batch ID) in the manifest. A later call
// with the same job name and the same plan resumes it: completed chunks
// are never extracted again, failed chunks are retried. A completed (or
// rolled back) plan is not run again unless [Job.NewRun]: Run then does
// nothing, logs it and returns the run's Report with an error wrapping
// [ErrAlreadyCompleted] (Report.Resumed is false). A changed plan returns
// [ErrPlanChanged] unless [Job.NewRun]. A target with a child by
// inheritance (INHERITS, not partitioning), whose unique index does not
// cover the child's rows, is refused with [ErrInvalidConfig].
//
// Each chunk is leased in a short transaction, extracted outside any
// transaction, then loaded in one transaction: fence, COPY into staging,
// merge, exception queue, checkpoint, commit. Retryable errors
// ([IsRetryable]) are retried up to [Config.MaxAttempts] times; waits and
// connection faults of the chunk's transaction are not attempts (see
// the package documentation, "Transient faults": past their bound the
// call returns a retryable error and the run stays resumable). When a
// chunk fails for good, Run stops claiming, waits for the chunks in
// progress and returns a [*PartialError]; the run's status is failed.
// When ctx is done, chunks in progress roll back and stay pending; the
// returned *PartialError wraps ctx.Err() and the run stays resumable.
//
// A time chunk that ends after the horizon (the watermark of
// [Job.Watermark] taken by this call, or the moment the chunk is read) is
// loaded but left [ChunkOpen]: Run returns with the run still running and
// an error wrapping [ErrChunksOpen] (joined with any other error);
// Report.ChunksOpen and OpenChunks say which, and the next call reads them
// again. Report.Warnings (also logged) flags a scope that reaches into the
// future and a date ChunkColumn under a watermark.
//
// A pause does not end Run: while its run is paused (by an operator from
// SQL, the CLI or [Runner.Pause] in another process, a quality gate or
// the run reject gate, including one that failed on a chunk of this
// call, a throttle's critical level), Run stays a registered,
// heartbeating worker of the run and claims nothing; while it awaits
// approval, Run waits too (nothing leased). It logs once what it waits
// for (who paused and why, or the approvals missing, with the command
// that resumes or approves), and goes on working once the
// run is resumed (SQL function resume, "backfill resume",
// [Runner.Resume], [Runner.AcceptGate]) or approved, within one
// [Config.ThrottleInterval] (at once with [Config.ListenURL]). It
// returns when the run is cancelled (an error wrapping
// [ErrRunCancelled]) or ctx is done (an error wrapping [ErrRunPaused],
// or [ErrAwaitingApproval], and ctx's cause). Two exceptions: a pause
// made by this Runner's [Runner.PauseOnSignal] (the signal of the person
// at this process) makes Run return an error wrapping [ErrRunPaused]
// once the chunks in flight are checkpointed; and [Config.ReturnOnPause]
// makes every pause return so (a gate that failed in this call:
// [ErrGateFailed]; awaiting approval: [ErrAwaitingApproval]). Waiting
// needs the control plane ([PGManifest]); with other manifests Run
// returns on a pause.
func (r *Runner) Run(ctx context.Context, job Job) (Report, error) {
	mode := waitUnlessSignalled
	if r.cfg.ReturnOnPause {
		mode = returnOnPause
	}
	return r.runTraced(ctx, job, mode)
}

// pauseMode says what a call of Run does while its run is paused or
// awaits approval.
type pauseMode uint8

const (
	// returnOnPause: the call returns (Config.ReturnOnPause).
	returnOnPause pauseMode = iota
	// waitUnlessSignalled: the call waits, unless the pause in force is
	// one of this Runner's PauseOnSignal (Run's default).
	waitUnlessSignalled
	// waitAlways: the call waits whoever paused (Work).
	waitAlways
)

// runTraced is Run in its span; mode says whether it waits while the run
// is paused.
func (r *Runner) runTraced(ctx context.Context, job Job, mode pauseMode) (Report, error) {
	wait := mode != returnOnPause
	return r.traceRun(ctx, job, func(ctx context.Context) (Report, error) {
		for {
			rep, err := r.run(ctx, job, mode)
			// A call that ends paused with errors of its own (a quality
			// gate or the run reject gate that failed in it and paused
			// the run, a throttle's critical level) waits in a new call,
			// which starts on the paused run and waits as a registered
			// worker.
			pausedByGate := errors.Is(err, ErrRunPaused) || errors.Is(err, ErrGateFailed)
			if wait && (ctx.Err() != nil || r.draining.Load()) && errors.Is(err, ErrRunPaused) {
				// It waited while paused and ctx ended the wait, or the
				// Runner was drained: say so, not the hint to wait that a
				// call that does not wait gets.
				why, errs := "as the Runner was drained (Runner.Drain)", []error{err}
				if ctx.Err() != nil {
					why, errs = fmt.Sprintf("as its context ended (%v)", context.Cause(ctx)), append(errs, context.Cause(ctx))
				}
				return rep, &stoppedWhilePaused{
					msg: fmt.Sprintf("backfill: job %q batch %d: %v: this call waited while the run was paused and stopped %s; the run stays paused: %s",
						job.Name, rep.BatchID, ErrRunPaused, why, r.resumeHint(rep.BatchID)),
					errs: errs}
			}
			// Resumed already (an operator resumed the run before this
			// call ended): the new call works on at once.
			if !wait || r.caps.control == nil || ctx.Err() != nil || r.draining.Load() || !pausedByGate || (rep.Status != RunPaused && rep.Status != RunRunning) {
				return rep, err
			}
			if mode == waitUnlessSignalled && r.pausedBySignal(ctx, rep.BatchID) {
				// This Runner's PauseOnSignal paused the run: the person
				// at this process wants it to end.
				return rep, err
			}
			r.cfg.Logger.Warn("backfill: run paused while this call worked: this worker waits for it to be resumed", "job", job.Name, "batch_id", rep.BatchID, "reason", err)
		}
	})
}

// stoppedWhilePaused is the error of a call that waited while its run was
// paused until its context ended: its message says so; it wraps the
// call's error (ErrRunPaused) and the context's cause.
type stoppedWhilePaused struct {
	msg  string
	errs []error
}

func (e *stoppedWhilePaused) Error() string   { return e.msg }
func (e *stoppedWhilePaused) Unwrap() []error { return e.errs }

// run is one call of Run inside its span; mode: a call whose run is
// paused waits for its resume as a worker of the run (waitResumed), or
// returns.
func (r *Runner) run(ctx context.Context, job Job, mode pauseMode) (Report, error) {
	begin := time.Now()
	rs, err := r.planRun(ctx, job)
	if err != nil {
		return Report{}, err
	}
	// StartRun waits (logging, fencing) for the chunks in flight of a run
	// it abandons.
	run, resumed, err := r.cfg.Manifest.StartRun(withFenceWait(ctx, r.fenceWait("start run of job "+job.Name)), r.db, rs.plan, r.cfg.WorkerID, job.NewRun)
	if err != nil {
		return Report{}, err
	}
	// The library's transactions for the run name its batch.
	ctx = pgstore.WithPurpose(ctx, "", run.BatchID)
	// Only a run that goes on working is resumed: a completed, rolled back
	// or paused run is returned as it is.
	resumed = resumed && run.Status == RunRunning
	log := r.cfg.Logger.With("job", job.Name, "batch_id", run.BatchID)
	log.Info("backfill run", "resumed", resumed, "status", run.Status, "chunks", rs.plan.Len(), "fingerprint", rs.plan.Fingerprint[:12])
	for _, w := range rs.warnings {
		log.Warn(w)
	}
	if err := r.recordBlueprint(ctx, rs, run); err != nil {
		return Report{}, err
	}
	wait := mode != returnOnPause && r.caps.control != nil
	if run.Status == RunPaused && wait && mode == waitUnlessSignalled && r.pausedBySignal(ctx, run.BatchID) {
		// Paused by this Runner's PauseOnSignal: returned, not waited on.
		wait = false
	}
	if run.Status == RunAwaitingApproval {
		// Nothing is leased until approved: wait, or say what is missing.
		rep, err := r.report(ctx, run, false)
		rep.Warnings = rs.warnings
		if !wait || err != nil {
			return rep, errors.Join(err, r.awaitingErr(ctx, job, run))
		}
		if err := r.waitApproved(ctx, job, run, mode == waitUnlessSignalled); err != nil {
			return rep, err
		}
		return r.run(ctx, job, mode)
	}
	if run.Status == RunPaused && !wait {
		rep, err := r.report(ctx, run, resumed)
		rep.Warnings = rs.warnings
		return rep, errors.Join(err, r.pausedErr(job, run))
	}
	if run.Status == RunCancelled {
		// Terminal until resumed explicitly: a plain Run never restarts it.
		rep, err := r.report(ctx, run, resumed)
		rep.Warnings = rs.warnings
		ex := &execution{r: r, job: job}
		return rep, errors.Join(err, ex.cancelledErr(run))
	}
	ex, err := r.startExecution(ctx, rs, run, log)
	if err != nil {
		return Report{}, err
	}
	finished := run.Status == RunCompleted || run.Status == RunRolledBack
	if !finished {
		// A worker of the run: registered, heartbeating, until the run's
		// end is recorded.
		ex.startWorker(ctx)
		defer ex.stopWorker()
		stopListen := ex.listenControl(ctx)
		ex.startThrottle(ctx)
		ex.notifyProgress(ctx, true)
		if wait {
			ex.wait, ex.endOnSignal = true, mode == waitUnlessSignalled
			ex.pausedMeanwhile(ctx)
		}
		if run.Status == RunPaused {
			// Waits below for the resume.
			ex.halt(RunPaused, run.LastError)
		}
		for {
			ex.run(ctx)
			if !wait || !ex.waitResumed(ctx) {
				break
			}
			ex.notifyProgress(ctx, true)
		}
		ex.stopThrottle()
		stopListen()
	}
	rep, err := ex.finishRun(ctx, run, resumed, finished, begin)
	if !finished {
		ex.notifyProgress(context.WithoutCancel(ctx), true)
	}
	return rep, err
}

// runSetup is what Run decides before the run exists in the manifest.
type runSetup struct {
	job      Job // with its resolved Rollback
	info     TableInfo
	plan     Plan
	pub      publisher
	warnings []string
	// undoTable and deliveredTable are ChunkRef's tables ("" for none).
	undoTable, deliveredTable string
}

// planRun validates job, prepares its target and freezes its plan. It
// refuses a job that needs a capability the Runner lacks, before any run
// is created.
func (r *Runner) planRun(ctx context.Context, job Job) (runSetup, error) {
	if err := job.validate(); err != nil {
		return runSetup{}, err
	}
	rs := runSetup{pub: publisherFor(job.Publish)}
	// A role that lacks privileges on the manifest hears of them together
	// with those on the target, below.
	initErr := r.cfg.Manifest.Init(ctx, r.db)
	if initErr != nil && !errors.Is(initErr, ErrPrivilege) {
		return runSetup{}, initErr
	}
	// A ChunkStreamer's chunks are read as they come, never all held:
	// here once for their checks, in streamPlan for the fingerprint, in
	// the manifest's StartRun for its chunk rows.
	stream, streaming := job.Chunker.(ChunkStreamer)
	var chunks []Chunk
	var last *Chunk // the time chunk that ends last
	var err error
	if streaming {
		last, err = scanChunks(job, stream.ChunkSeq(ctx))
	} else if chunks, err = job.Chunker.Chunks(ctx); err != nil {
		err = fmt.Errorf("backfill: job %q: chunks: %w", job.Name, err)
	} else {
		last, err = scanChunks(job, Plan{Chunks: chunks}.AllChunks(ctx))
	}
	if err != nil {
		return runSetup{}, err
	}
	if err := r.checkTargetSchema(ctx, job); err != nil {
		return runSetup{}, err
	}
	if rs.info, err = r.cfg.Merger.Prepare(ctx, r.db, job.Target); err != nil {
		return runSetup{}, err
	}
	if err := pgstore.RefuseInheritanceParent(rs.info); err != nil {
		return runSetup{}, err
	}
	if err := checkChunkColumn(job, rs.info); err != nil {
		return runSetup{}, err
	}
	if job.Rollback, err = rollbackMechanism(job, rs.info, rs.pub); err != nil {
		return runSetup{}, err
	}
	if err := r.requires(job, rs.pub); err != nil {
		return runSetup{}, err
	}
	if job, err = r.skipMode(job, rs.info); err != nil {
		return runSetup{}, err
	}
	if job.SkipUnchanged && rs.info.TupleIdentity {
		// Row versions are compared under READ COMMITTED chunk
		// transactions only (tupleShapeSQL); under another isolation a
		// DB's Begin starts, values are hashed. After the eligibility:
		// a job refused anyway begins nothing.
		if rs.info.TupleIdentity, err = r.readCommitted(ctx); err != nil {
			return runSetup{}, err
		}
	}
	r.warnVersioner(job)
	// Before the run exists: every missing privilege at once.
	privWarnings, err := r.checkRunPrivileges(ctx, job, rs.info)
	if err != nil {
		return runSetup{}, err
	}
	if initErr != nil {
		return runSetup{}, initErr
	}
	if job.Rollback == RollbackUndoLog {
		rs.undoTable = r.caps.undo.UndoTable()
	}
	// Deliveries are summarised whatever this job's own rollback: they
	// protect the rows of other batches from those batches' rollback.
	if r.caps.undo != nil && r.caps.writesUndo && rs.info.Target.Lineage.UpdatedBy != "" {
		rs.deliveredTable = r.caps.undo.DeliveredTable()
	}
	rs.job = job
	if streaming {
		if rs.plan, err = streamPlan(ctx, job, rs.info, stream); err != nil {
			return runSetup{}, fmt.Errorf("backfill: job %q: chunks: %w", job.Name, err)
		}
	} else {
		rs.plan = NewPlan(job, rs.info, chunks)
	}
	if job.Watermark != nil {
		wm, err := job.Watermark.Watermark(ctx)
		if err != nil {
			return runSetup{}, fmt.Errorf("backfill: job %q: watermark: %w", job.Name, err)
		}
		wm = pgstore.TruncMicro(wm)
		rs.plan.Watermark = &wm
	}
	rs.warnings, err = openScope(job, rs.info, last, rs.plan.Watermark, time.Now(), rs.pub)
	rs.warnings = append(rs.warnings, privWarnings...)
	return rs, err
}

// scanChunks reads every chunk once: it refuses chunk bounds PostgreSQL
// cannot store, and returns the time chunk that ends last (nil for
// none), which openScope judges.
func scanChunks(job Job, chunks iter.Seq2[Chunk, error]) (*Chunk, error) {
	var last *Chunk
	for c, err := range chunks {
		if err != nil {
			return nil, fmt.Errorf("backfill: job %q: chunks: %w", job.Name, err)
		}
		if c.Kind != backfilltype.KindTime {
			continue
		}
		if !c.Start.Equal(pgstore.TruncMicro(c.Start)) || !c.End.Equal(pgstore.TruncMicro(c.End)) {
			return nil, fmt.Errorf("backfill: job %q: %w: chunk %s has a bound finer than a microsecond, which PostgreSQL cannot store", job.Name, ErrInvalidScope, c)
		}
		if last == nil || c.End.After(last.End) {
			last = &c
		}
	}
	return last, nil
}

// checkChunkColumn refuses a ChunkColumn the target does not write.
func checkChunkColumn(job Job, info TableInfo) error {
	if job.ChunkColumn != "" && !slices.ContainsFunc(info.Columns[:info.Written], func(c Column) bool { return c.Name == job.ChunkColumn }) {
		written := make([]string, info.Written)
		for i, c := range info.Columns[:info.Written] {
			written[i] = c.Name
		}
		return fmt.Errorf("backfill: job %q: %w: ChunkColumn %q is not a written column of %q; %s", job.Name, ErrInvalidConfig, job.ChunkColumn, info.Target.Table,
			suggest.List("the written columns are", job.ChunkColumn, written))
	}
	return nil
}

// requires returns an error wrapping [ErrUnsupported] naming the
// capabilities job (with its resolved Rollback) needs and the Runner's
// Manifest or Merger lacks.
func (r *Runner) requires(job Job, pub publisher) error {
	c := r.caps
	err := errors.Join(pub.requires(c),
		need(len(job.Validators) == 0 || c.validations != nil, "ManifestValidations", "Job.Validators record their results in the manifest"),
		need(job.Approval.Approvers == 0 || c.approvals != nil && c.control != nil, "approvals (PGManifest)", "Job.Approval records approvals in the manifest"))
	for _, v := range job.Validators {
		if sc, ok := v.(stagingCheck); ok && !c.tables {
			err = errors.Join(err, need(false, "TableStager", fmt.Sprintf("the built-in check %s (%T) reads the chunk's staging table with SQL, which the merger (%T) does not stage into: "+
				"it needs the PostgreSQL merger (the default Config.Merger); with the fakes of backfilltest, use CheckExceptionRate or a ValidatorFunc", sc.checkName(), v, r.cfg.Merger)))
		}
	}
	if job.Rollback == RollbackUndoLog {
		err = errors.Join(err, need(c.undo != nil, "ManifestUndoLog", "the undo log lives in the manifest's database"),
			need(c.writesUndo, "UndoLogWriter", "the merger writes the undo log"))
	}
	if err != nil {
		return fmt.Errorf("backfill: job %q: %w", job.Name, err)
	}
	return nil
}

// startExecution readies a call of Run on run: the publish mode's
// preparation and the validators' record.
func (r *Runner) startExecution(ctx context.Context, rs runSetup, run Run, log *slog.Logger) (*execution, error) {
	ex := &execution{r: r, job: rs.job, info: rs.info, base: rs.info.Target.Table, plan: rs.plan, pub: rs.pub, batchID: run.BatchID, log: log,
		undoTable: rs.undoTable, deliveredTable: rs.deliveredTable, watermark: rs.plan.Watermark, warnings: rs.warnings}
	if rs.job.SkipUnchanged {
		ex.skipKey = rs.plan.SkipKey(rs.info)
	}
	if r.caps.control != nil {
		ex.ctl = newRunControl()
	}
	if run.Status == RunCompleted || run.Status == RunRolledBack {
		return ex, nil
	}
	if err := ex.pub.prepare(ctx, ex); err != nil {
		return nil, err
	}
	if run.Status == RunRunning {
		warning, accepted, baseline, err := r.recordValidators(ctx, ex.job, run.BatchID)
		if err != nil {
			return nil, fmt.Errorf("backfill: job %q batch %d: validators: %w", ex.job.Name, run.BatchID, err)
		}
		if warning != "" {
			log.Warn(warning)
			ex.warnings = append(ex.warnings, warning)
		}
		ex.accepted, ex.baseline = accepted, baseline
	}
	return ex, nil
}

// run works the chunks of this call, then lets the publish mode finish
// and checks that the run loaded rows.
func (ex *execution) run(ctx context.Context) {
	ex.work(ctx)
	ex.mu.Lock()
	own := len(ex.errs) > 0
	ex.mu.Unlock()
	// A call with errors of its own (a gate of its chunk that paused the
	// run) ends with them and waits in a new call (runTraced): its pause
	// is not one found meanwhile.
	if ex.wait && !own && ex.haltedAs() == "" && ctx.Err() == nil && ex.pausedMeanwhile(ctx) {
		// Paused while this call worked, and perhaps resumed before it
		// read the control state (a claim refused, then the run running
		// again): the call waits and works on, rather than end as if
		// nothing were left.
		ex.halt(RunPaused, "paused meanwhile")
	}
	if ex.haltedAs() != "" {
		// Paused or cancelled meanwhile: nothing is published or judged.
		return
	}
	if len(ex.errs) == 0 {
		ex.pub.finish(ctx, ex)
	}
	ex.judgeLoaded(ctx)
}

// judgeLoaded runs the "no row loaded" gate (checkLoaded) at the end of a
// call that completed chunks without errors; a gate that fails is the
// call's error (the run is paused).
func (ex *execution) judgeLoaded(ctx context.Context) {
	if len(ex.errs) == 0 && ex.doneN > 0 {
		if err := ex.checkLoaded(ctx); err != nil {
			ex.fail(nil, err)
		}
	}
}

// finishRun records the run's state, lets the publish mode publish and
// returns the call's report. finished says the run was completed or
// rolled back before this call.
func (ex *execution) finishRun(ctx context.Context, run Run, resumed, finished bool, begin time.Time) (Report, error) {
	r, job, log := ex.r, ex.job, ex.log
	// Finish with a fresh context: a cancelled run still records its state.
	fctx := context.WithoutCancel(ctx)
	// The run gate once more, over the batch's totals, before the run can
	// be recorded as completed (finalGate).
	if err := ex.finalGate(fctx); err != nil {
		return Report{}, err
	}
	var runErr error
	if len(ex.errs) > 0 {
		runErr = &PartialError{BatchID: run.BatchID, Done: ex.done, DoneCount: ex.doneN, Failed: ex.failed, Errs: ex.errs}
	}
	run, err := ex.recordEnd(fctx, run)
	if err != nil {
		// Not silent: the manifest still says the run is running. The
		// report names the batch, so that the caller (Work) says which.
		return Report{BatchID: run.BatchID, Job: job.Name, Status: run.Status, Resumed: resumed}, errors.Join(runErr, err)
	}
	if run.Status == RunAbandoned {
		runErr = errors.Join(runErr, fmt.Errorf("backfill: job %q batch %d: %w", job.Name, run.BatchID, ErrRunAbandoned))
	}
	if run.Status == RunPaused && runErr == nil {
		// Paused meanwhile by another process (a throttle's critical
		// level) or an operator: not a success.
		runErr = r.pausedErr(job, run)
	}
	if run.Status == RunCancelled {
		// Cancelled meanwhile: the chunks in flight rolled back.
		runErr = errors.Join(runErr, ex.cancelledErr(run))
	}
	published, err := ex.pub.published(fctx, ex, run)
	if errors.Is(err, ErrAlreadyCompleted) {
		// Rolled back while its publish was pending: never published.
		run.Status = RunRolledBack
	}
	if err != nil {
		rep, rerr := ex.report(fctx, run, resumed, begin)
		return rep, errors.Join(runErr, err, rerr)
	}
	rep, err := ex.report(fctx, run, resumed, begin)
	if finished && !published {
		if err == nil && run.Status == RunCompleted && rep.ChunksDone < rep.ChunksTotal && ex.rollbackUnfinished(fctx) {
			// Not completed as a worker's supervisor would read it: part
			// of the batch is withdrawn, and only an operator can decide.
			msg := fmt.Sprintf("a rollback of the batch did not finish (%d of its %d chunks still done): finish it (backfill rollback --batch %d --why WHY, or Runner.RollbackBatch), or start a new run (Job.NewRun)",
				rep.ChunksDone, rep.ChunksTotal, run.BatchID)
			log.Error("backfill run: "+msg, "status", run.Status)
			runErr = errors.Join(runErr, fmt.Errorf("backfill: job %q batch %d: %s", job.Name, run.BatchID, msg))
		} else {
			// Nothing completes silently: a second call on a finished
			// plan did nothing, and says so.
			log.Warn("backfill run already "+string(run.Status)+"; nothing done; set Job.NewRun to restate", "status", run.Status)
			runErr = errors.Join(runErr, fmt.Errorf("%w: job %q batch %d is %s", ErrAlreadyCompleted, job.Name, run.BatchID, run.Status))
		}
	}
	if failed, _ := ex.outcome(); err == nil && rep.Status == RunRunning && !failed && rep.ChunksTotal > 0 && rep.ChunksDone == rep.ChunksTotal {
		// Another worker checkpointed the last chunk between this call's
		// end of the run and its report: complete the run now rather
		// than leave it running with every chunk done, once the run gate
		// has seen that chunk's rejects too.
		if gerr := ex.finalGate(fctx); gerr != nil {
			return rep, errors.Join(runErr, gerr)
		}
		if again, ferr := r.cfg.Manifest.FinishRun(fctx, r.db, run.BatchID, false, ""); ferr == nil && again.Status != RunRunning {
			run = again
			rep, err = ex.report(fctx, run, resumed, begin)
		}
	}
	if rep.ChunksOpen > 0 {
		log.Warn("backfill run not complete: chunks end after the horizon (watermark or now) and are open; the next run reads them again",
			"chunks_open", rep.ChunksOpen, "open", rep.OpenChunks)
		if rep.Status == RunRunning {
			// Not a success: a caller that checks err == nil must not
			// take an unfinished run for a finished one.
			runErr = errors.Join(runErr, fmt.Errorf("backfill: job %q batch %d: %w: %d chunks end after the horizon (watermark or now) and were loaded but not closed: %s",
				job.Name, run.BatchID, ErrChunksOpen, rep.ChunksOpen, strings.Join(rep.OpenChunks, ", ")))
		}
	}
	if rep.Status == RunRunning && runErr == nil && err == nil && rep.ChunksDone+rep.ChunksOpen < rep.ChunksTotal {
		runErr = fmt.Errorf("backfill: job %q batch %d: %w (%d of %d chunks done, %d open)", job.Name, run.BatchID, ErrRunIncomplete,
			rep.ChunksDone, rep.ChunksTotal, rep.ChunksOpen)
	}
	log.Info("backfill run ended", "status", rep.Status, "chunks_done", rep.ChunksDone, "chunks_total", rep.ChunksTotal,
		"chunks_run", rep.ChunksRun, "rows_read", rep.Counts.Read, "elapsed", rep.Elapsed)
	return rep, errors.Join(runErr, err)
}

// outcome says how this call ends its run: failed (with msg, the run's
// last error) or not.
func (ex *execution) outcome() (failed bool, msg string) {
	// A chunk whose quality gate failed paused the run (recordGate) and
	// does not fail it: an operator who resumed the run meanwhile, before
	// this call ended, finds it running, not failed.
	failed, msg = ex.failed != nil && !errors.Is(ex.failed, ErrGateFailed), ""
	if failed {
		msg = ex.failed.Error()
	} else if ex.runGate != nil && ex.r.caps.validations == nil {
		// A manifest that cannot pause the run: the run gate fails it
		// (one that can paused it: an operator who resumed it meanwhile
		// finds it running).
		failed, msg = true, ex.runGate.Error()
	} else if i := slices.IndexFunc(ex.errs, func(e error) bool { return errors.Is(e, ErrInvalidConfig) }); i >= 0 {
		// A deployment error found while the run ran (a throttle signal
		// that cannot be read): restarting cannot help, so the run is
		// not left running as if a worker still worked it.
		failed, msg = true, ex.errs[i].Error()
	}
	return failed, msg
}

// recordEnd records the end of this call on run in the manifest
// (FinishRun) as the call's outcome says, and returns the run as
// recorded: completed when every chunk is done, failed when a chunk
// failed for good or a deployment error stopped the call, else as it
// was. An error says the end could not be recorded; the manifest then
// shows the run as it was.
func (ex *execution) recordEnd(fctx context.Context, run Run) (Run, error) {
	r := ex.r
	failed, msg := ex.outcome()
	// A server restart does not leave the run's end unrecorded.
	// Each try finishes the same batch: a failed try returns no run.
	err := ex.retryConn(fctx, "finish run", func() error {
		ended, err := r.cfg.Manifest.FinishRun(fctx, r.db, run.BatchID, failed, msg)
		if err == nil {
			run = ended
		}
		return err
	})
	if err != nil {
		return run, fmt.Errorf("backfill: job %q batch %d: the end of the run could not be recorded; the manifest still shows it as it was: %w", ex.job.Name, run.BatchID, err)
	}
	return run, nil
}

// endRun judges run, whose chunks a caller found all loaded (loaded of
// them by the caller), as a call of Run judges its run at its end, and
// records its end: the "no row loaded" gate (judgeLoaded, when the
// caller loaded chunks), the run reject gate over the batch's totals
// (finalGate), then the end (recordEnd). A gate that fails pauses the
// run, which is returned paused with its reason. The graph's scheduler
// ends its jobs' runs so, having run their chunks one call each
// (runPlannedChunk).
func (r *Runner) endRun(ctx context.Context, rs runSetup, run Run, loaded int) (Run, error) {
	ctx = pgstore.WithPurpose(context.WithoutCancel(ctx), "", run.BatchID)
	ex, err := r.startExecution(ctx, rs, run, r.cfg.Logger.With("job", rs.job.Name, "batch_id", run.BatchID))
	if err != nil {
		return run, err
	}
	ex.doneN = loaded
	ex.judgeLoaded(ctx)
	if err := ex.finalGate(ctx); err != nil {
		return run, err
	}
	return ex.recordEnd(ctx, run)
}

// finalGate checks the run reject rate over the batch's totals at the end
// of a call that has not failed or stopped on a gate, whatever the call's
// own chunks rejected: after a chunk without rejects, checkRunRejectRate
// reads no totals once the call has read them, trusting the call that
// committed a rejecting chunk to check after it; a worker that died or
// shut down between that chunk's commit and its check, or a call that
// found no chunk left to run, would otherwise let the run complete above
// the rate. A failed gate is recorded as chunkDone records it (the run
// paused, ex.runGate) and finishRun goes on; any other error is returned
// and the run is left as the manifest shows it.
func (ex *execution) finalGate(ctx context.Context) error {
	ex.mu.Lock()
	skip := ex.failed != nil || ex.runGate != nil || ex.stop
	ex.mu.Unlock()
	if skip {
		return nil
	}
	err := ex.checkRunRejectRate(ctx, ChunkResult{}, false)
	if err == nil {
		return nil
	}
	if !errors.Is(err, ErrGateFailed) {
		return fmt.Errorf("backfill: job %q batch %d: the run reject rate could not be checked at the end of the call; the manifest still shows the run as it was: %w", ex.job.Name, ex.batchID, err)
	}
	err = fmt.Errorf("backfill: job %q batch %d: at the end of the call: %w", ex.job.Name, ex.batchID, err)
	ex.fail(nil, err)
	ex.mu.Lock()
	ex.runGate = err
	ex.mu.Unlock()
	return nil
}

// report is the Report of this call on run.
func (ex *execution) report(ctx context.Context, run Run, resumed bool, begin time.Time) (Report, error) {
	rep, err := ex.r.report(ctx, run, resumed)
	rep.ChunksRun = ex.doneN
	rep.Elapsed = time.Since(begin)
	rep.Warnings = ex.warnings
	return rep, err
}

func (r *Runner) report(ctx context.Context, run Run, resumed bool) (Report, error) {
	rep := Report{BatchID: run.BatchID, Job: run.Job, Status: run.Status, Resumed: resumed, ChunksTotal: run.ChunksTotal}
	sum, err := summarizeChunks(ctx, r.cfg.Manifest, r.db, run.BatchID)
	if err != nil {
		return rep, err
	}
	rep.ChunksDone, rep.ChunksOpen, rep.OpenChunks, rep.Counts = sum.Done, sum.Open, sum.OpenIDs, sum.Counts
	rep.ChunksSkipped = sum.Skipped
	if mv := r.caps.validations; mv != nil {
		vs, err := mv.Validations(ctx, r.db, run.BatchID)
		if err != nil {
			return rep, err
		}
		summarizeValidations(&rep, vs)
	}
	return rep, nil
}

// execution is one call of Run: the workers and what they did.
type execution struct {
	r    *Runner
	job  Job
	info TableInfo // the table merged into (publish modes may change it)
	base string    // the job's target table, Target.Table of the prepared job
	plan Plan
	// pub is the job's publish mode.
	pub publisher
	// skipKey is the plan's key of chunk fingerprints (Plan.skipKey;
	// "" without Job.SkipUnchanged).
	skipKey  string
	batchID  int64
	log      *slog.Logger
	warnings []string // the report's

	// progress delivers [ProgressHooks], resolved
	// once by progressOnce.
	progress     *progressNotifier
	progressOnce sync.Once

	// worker is this call's registration (its key leases the call's
	// chunks; nil before startWorker).
	worker *workerCall

	mu sync.Mutex
	// done lists the IDs of the first maxDoneIDs chunks this call
	// completed, doneN counts them all.
	done   []string
	doneN  int
	errs   []error
	failed *ChunkError
	stop   bool
	// wait: the call waits while the run is paused (waitResumed);
	// endOnSignal: except for a pause of the Runner's PauseOnSignal;
	// pausesSeen counts the run's pauses it knows of (pausedMeanwhile).
	wait, endOnSignal bool
	pausesSeen        int
	// halted is the status (paused, cancelled) the run's control state
	// stopped this call with ("" for none; see [runControl]).
	halted RunStatus
	tries  map[int]int // failed attempts per chunk Seq in this call
	// faults are the connection faults of this call's chunks
	// (chunkFaulted), per chunk Seq.
	faults map[int]*chunkFaults
	// waits are the waits of this call's chunks.
	waits chunkWaits
	// undoTable is where the merger logs undo images ("" for none).
	undoTable string
	// deliveredTable is where the merger summarises unchanged deliveries
	// of other batches' rows ("" for none).
	deliveredTable string
	// watermark is the source's high-water mark taken by this call (nil
	// without Job.Watermark): with the time a chunk is read, the horizon
	// after which a chunk is open.
	watermark *time.Time
	// accepted lists, per chunk ID, the failed check results operators
	// accepted (Runner.AcceptGate).
	accepted map[string][]acceptedCheck
	// baseline is the run's read and rejected rows when an operator last
	// resumed it (Resume, AcceptGate; zero if never): the run reject gate
	// and the "no row loaded" pause judge only the rows after it.
	baseline Counts
	// rateChecked: checkRunRejectRate read the run's totals once.
	rateChecked atomic.Bool
	// throttle holds the claims of this call (nil without throttles).
	throttle *throttler
	// ctl is the run's control state as this call applies it (nil
	// without the control plane).
	ctl *runControl
	// leased are the chunks (Seq) this call's goroutines hold a lease on
	// ([execution.runChunk]).
	leased  map[int]bool
	leaseMu sync.Mutex // one lease claim of this call at a time
	// versionMisses are the chunks (Seq) a transaction of this call
	// found must be extracted although their version was their base's:
	// their next lease extracts them ([execution.versionMissed]).
	versionMisses map[int]bool
	// probes count this call's lookups of a base for a probe and their
	// probes ([execution.probeWorth]).
	probes probeCounts
	// runGate is the run reject gate's failure in this call (nil if
	// none): the run is paused, or, with a manifest that cannot pause
	// it, failed.
	runGate error
	// adapt sizes the sub-chunks of adaptive chunks (adapt.go).
	adapt adaptState
}

// open reports whether chunk c, read at started, is still open: a time
// chunk whose end lies after the horizon, the earlier of the watermark
// and started. Rows of its interval may still arrive in the source.
func (ex *execution) open(c Chunk, started time.Time) bool {
	if c.Kind != backfilltype.KindTime {
		return false
	}
	return c.End.After(started) || ex.watermark != nil && c.End.After(*ex.watermark)
}

// openScope returns the warnings about a scope that reaches past the
// horizon (now, or the watermark wm) and about a date-typed ChunkColumn
// under a watermark. Publish modes that cannot read a chunk twice
// (rereads false: PublishAtEnd, PublishPartitionSwap) refuse chunks that end after the
// horizon with [ErrInvalidScope]; so does PublishVersionedView
// (publishesOpen false), which publishes only a completed run, and a run
// with an open chunk never completes: it would load and return nil on
// every call while readers never see the rows.
func openScope(job Job, info TableInfo, last *Chunk, wm *time.Time, now time.Time, pub publisher) ([]string, error) {
	var warnings []string
	if job.Watermark != nil && job.ChunkColumn != "" {
		for _, col := range info.Columns[:info.Written] {
			if col.Name == job.ChunkColumn && col.BaseType == "date" {
				warnings = append(warnings, fmt.Sprintf("ChunkColumn %q is a date while the job has a watermark: a date does not say when on its day a row was added, so rows added later on a day the watermark has reached can be missed; "+
					"chunk on a timestamp column, or let each day's chunk end before the watermark", job.ChunkColumn))
			}
		}
	}
	if last == nil {
		return warnings, nil
	}
	horizon, what := now, "now"
	if wm != nil && wm.Before(now) {
		horizon, what = *wm, "the source watermark"
	}
	if !last.End.After(horizon) {
		return warnings, nil
	}
	if !pub.rereads() {
		return nil, fmt.Errorf("backfill: job %q: %w: the scope ends at %s, after %s (%s); publish mode %s cannot read a chunk twice: end the scope at or before %s",
			job.Name, ErrInvalidScope, last.End.Format(time.RFC3339Nano), what, horizon.Format(time.RFC3339Nano), job.Publish.Mode, horizon.Format(time.RFC3339Nano))
	}
	if !pub.publishesOpen() {
		return nil, fmt.Errorf("backfill: job %q: %w: the scope ends at %s, after %s (%s); publish mode %s publishes a run only when every chunk is final, and a chunk ending after it stays open: end the scope at or before %s",
			job.Name, ErrInvalidScope, last.End.Format(time.RFC3339Nano), what, horizon.Format(time.RFC3339Nano), job.Publish.Mode, horizon.Format(time.RFC3339Nano))
	}
	if last.End.After(now) {
		warnings = append(warnings, fmt.Sprintf("the scope reaches into the future: it ends at %s, after now (%s); chunks that end after the horizon are loaded but left open, not final, and the next run reads them again",
			last.End.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano)))
	} else {
		warnings = append(warnings, fmt.Sprintf("the scope ends at %s, after the source watermark (%s); chunks that end after it are loaded but left open, not final, and the next run reads them again",
			last.End.Format(time.RFC3339Nano), horizon.Format(time.RFC3339Nano)))
	}
	return warnings, nil
}

// publish runs the end-of-run publish ([PublishAtEnd]) and records its
// outcome like chunks'.
func (ex *execution) publish(ctx context.Context) {
	done, err := ex.publishAtEnd(ctx)
	if err == nil {
		for _, res := range done {
			ex.addDone(res.Chunk.ID)
			if h := ex.r.cfg.Hooks; h != nil {
				h.ChunkDone(ctx, ex.batchID, res)
			}
		}
		ex.log.Info("published at end", "chunks", len(done))
		return
	}
	var ge *gateError
	var ce *ChunkError
	switch {
	case errors.As(err, &ge) && errors.As(err, &ce) && ce.Chunk.ID != "":
		// The publish rolled back: keep the chunk's evidence.
		ex.fail(ce, ex.recordGate(ctx, ce, ge, "publish: "+ge.reason))
	case ge != nil:
		var perr error
		if mv := ex.r.caps.validations; mv != nil {
			perr = mv.PauseRun(context.WithoutCancel(ctx), ex.r.db, ex.batchID, "publish: "+ge.reason)
		}
		ex.fail(&ChunkError{Err: ge}, perr)
	case errors.As(err, &ce):
		ex.fail(ce, nil)
	default:
		ex.fail(&ChunkError{Err: fmt.Errorf("publish: %w", err)}, nil)
	}
}

// recordGate keeps, outside the rolled back attempt ce, the evidence of
// the failed gate ge and pauses the run with reason, in one transaction
// of its own when the manifest has [backfilldriver.ManifestGates].
func (ex *execution) recordGate(ctx context.Context, ce *ChunkError, ge *gateError, reason string) error {
	fctx := context.WithoutCancel(ctx)
	if ex.r.caps.gates != nil || ex.r.caps.validations != nil {
		ex.tracePause(fctx, backfilltrace.PauseGate, reason)
	}
	if mg := ex.r.caps.gates; mg != nil {
		for i := range ge.exceptions {
			ge.exceptions[i].BatchID = ex.batchID
		}
		return mg.RecordGateFailure(fctx, ex.r.db, backfilltype.GateFailure{
			BatchID: ex.batchID, ChunkID: ce.Chunk.ID, Attempt: ce.Attempt, Results: ge.results, Exceptions: ge.exceptions, Reason: reason,
		})
	}
	if mv := ex.r.caps.validations; mv != nil {
		return errors.Join(mv.AddValidations(fctx, ex.r.db, ex.batchID, ce.Chunk.ID, ge.results),
			mv.PauseRun(fctx, ex.r.db, ex.batchID, fmt.Sprintf("chunk %s: %s", ce.Chunk.ID, ge.reason)))
	}
	return nil
}

func (ex *execution) stopped() bool {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return ex.stop
}

func (ex *execution) work(ctx context.Context) {
	// A cancel of the run (by the control plane) aborts the chunks in
	// flight through this context; the caller's ctx is left alone.
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if ex.ctl != nil {
		ex.ctl.mu.Lock()
		ex.ctl.cancel = cancel
		ex.ctl.mu.Unlock()
		if ex.cancelled() {
			return
		}
	}
	g, gctx := errgroup.WithContext(wctx)
	// Each worker slot: one goroutine, or two sharing a pipe that extract
	// a chunk while the slot's previous chunk is written ([chunkPipe]).
	ahead := ex.extractAhead()
	for i := range ex.r.cfg.Concurrency {
		var p *chunkPipe
		if ahead {
			p = newChunkPipe(i)
			g.Go(func() error { ex.workSlot(gctx, i, p); return nil })
		}
		g.Go(func() error { ex.workSlot(gctx, i, p); return nil })
	}
	_ = g.Wait()
}

// workSlot claims and runs chunks as worker slot i (of
// Config.Concurrency) until none is left or the call stops; p is the
// slot's pipe (nil: none).
func (ex *execution) workSlot(gctx context.Context, i int, p *chunkPipe) {
	var ws waitState
	for !ex.stopped() && !ex.r.draining.Load() {
		if gctx.Err() != nil {
			if !ex.cancelled() {
				ex.fail(nil, gctx.Err())
			}
			return
		}
		if !ex.waitTurn(gctx, i) {
			// The concurrency knob runs fewer workers, and they found
			// nothing more to claim; or stopped meanwhile.
			return
		}
		if !ex.next(gctx, &ws, p) {
			ex.workerEnded()
			return
		}
	}
}

func (ex *execution) fail(ce *ChunkError, err error) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.stop = true
	if ce != nil {
		if ex.failed == nil {
			ex.failed = ce
		}
		ex.errs = append(ex.errs, ce)
		if err != nil {
			// The chunk's failure could not be recorded (FailChunk,
			// RecordGateFailure): never silent, the caller sees both.
			ex.errs = append(ex.errs, err)
		}
		return
	}
	if !slices.ContainsFunc(ex.errs, func(e error) bool { return errors.Is(e, err) }) {
		ex.errs = append(ex.errs, err)
	}
}

// next claims and runs one chunk; it returns false when no chunk is left
// to claim (nor held by another worker: waitHeld) or the run stops. A
// connection failure before a chunk is claimed is retried (connFailed).
func (ex *execution) next(ctx context.Context, ws *waitState, p *chunkPipe) bool {
	cr, err := ex.runChunk(ctx, p)
	// The slot's stage held by the chunk claimed is left once its outcome
	// is recorded (chunkDone, chunkFailed; [pipeTurn]), at the
	// latest here.
	defer cr.turn.leave()
	// The rate cap: the rows of a chunk done or staged, nothing for a
	// try that claimed nothing or failed ([throttler.settle]).
	if cr.admitted {
		var read int64
		if err == nil && cr.outcome.claimed() {
			read = max(cr.res.Read-cr.settled, 0)
		}
		ex.throttle.settle(read)
	}
	if err != nil && ex.ctl != nil && !ex.cancelled() {
		// The checkpoint refuses a chunk of a run cancelled meanwhile,
		// possibly before this call read the control state: read it now.
		ex.pollControl(context.WithoutCancel(ctx))
	}
	if err != nil && ex.cancelled() {
		// The run was cancelled: the chunk's transaction rolled back (its
		// lease released), it stays pending; no failure is recorded.
		return false
	}
	if err == nil {
		ws.connSince, ws.connFails = time.Time{}, 0
	}
	if cr.outcome != tryNoSlot {
		ws.slotSince = time.Time{}
	}
	switch cr.outcome {
	case tryNoSlot:
		return ex.waitSlot(ctx, ws)
	case tryThrottled, tryFenced, tryRequeued, tryParked:
		return !ex.stopped()
	case tryStaged:
		ex.log.Info("chunk staged", "seq", cr.res.Chunk.Seq, "chunk", cr.res.Chunk.ID, "read", cr.res.Read, "rejected", cr.res.Rejected)
		return true
	case tryDone:
		return ex.chunkDone(ctx, cr.res, cr.fresh, cr.turn)
	}
	// tryNone or tryClaimed: nothing claimed, or an error.
	if err == nil && ex.r.draining.Load() {
		return false
	}
	if err == nil {
		return ex.noneClaimed(ctx, ws)
	}
	if ctx.Err() != nil {
		// Cancelled: the chunk rolled back and stays pending.
		ex.fail(nil, ctx.Err())
		return false
	}
	return ex.tryFailed(ctx, ws, cr, err)
}

// noneClaimed waits after a try that claimed nothing without an error:
// until the first pause of the chunks left is over, or for a chunk held
// by another worker (waitHeld). It returns false when none is left or
// the run stops.
func (ex *execution) noneClaimed(ctx context.Context, ws *waitState) bool {
	if _, d := ex.avoided(); d > 0 && !ex.stopped() {
		// The chunks left are pausing after a wait: claim again
		// when the first pause is over.
		select {
		case <-ctx.Done():
		case <-time.After(min(d, ex.r.pollInterval())):
		}
		return true
	}
	return ex.waitHeld(ctx, ws)
}

// tryFailed handles err, the error of try cr while ctx is live: a
// connection failure before a chunk was claimed (connFailed), a quality
// gate that failed (the run pauses), a wait (chunkWaited) or a failed
// attempt (chunkFailed). It returns false when the run stops.
func (ex *execution) tryFailed(ctx context.Context, ws *waitState, cr chunkRun, err error) bool {
	if err = pgstore.SchemaMissing(ex.r.schemaName(), err); errors.Is(err, backfilltype.ErrSchemaMissing) {
		// The manifest's schema is gone (dropped mid-run): no chunk can
		// be recorded; the run stops, naming the migration.
		ex.fail(nil, err)
		return false
	}
	var ce *ChunkError
	if !errors.As(err, &ce) {
		if backfilltype.IsConnectionError(err) {
			return ex.connFailed(ctx, ws, err)
		}
		ex.fail(nil, err)
		return false
	}
	var ge *gateError
	if errors.As(err, &ge) {
		// The chunk rolled back; keep its evidence (results with their
		// samples, the attempt's rejected rows) and pause the run, in one
		// transaction of their own.
		ex.log.Warn("quality gate failed; run paused", "seq", ce.Chunk.Seq, "chunk", ce.Chunk.ID, "attempt", ce.Attempt,
			"reason", ge.reason, "rejected", len(ge.exceptions))
		ex.fail(ce, ex.recordGate(ctx, ce, ge, ge.reason))
		return false
	}
	if code, ok := chunkFault(ctx, cr, err); ok {
		return ex.chunkFaulted(ctx, ce, cr, code)
	}
	if code, msg, ok := pgstore.WaitCode(ctx, err); ok {
		if ex.chunkWaited(ctx, ce, cr, code, msg) {
			return true
		}
		if errors.Is(err, pgstore.ErrManifestLocked) {
			// The manifest's chunks table (or the chunk's row) stayed
			// locked through the retry table: a wait of the manifest, as
			// a lease's; the run stops with a retryable error naming it,
			// the chunk's attempt not counted.
			ex.fail(nil, fmt.Errorf("%w (a wait on the last row of Config.LockRetries)", err))
			return false
		}
		ce = &ChunkError{Chunk: ce.Chunk, Attempt: ce.Attempt, Err: fmt.Errorf("%w (a wait on the last row of Config.LockRetries)", ce.Err)}
		err = ce
	}
	return ex.chunkFailed(ctx, ce, cr.attempt, err, cr.turn)
}

// maxDoneIDs bounds the chunk IDs a call keeps for [PartialError.Done]:
// a call that runs a million chunks counts them without holding their
// IDs.
const maxDoneIDs = 1 << 16

// addDone records chunk id done by this call; ex.mu is held (or the
// workers are done).
func (ex *execution) addDone(id string) {
	if ex.doneN++; len(ex.done) < maxDoneIDs {
		ex.done = append(ex.done, id)
	}
}

// chunkDone records a committed chunk; it returns false when the run's
// reject rate stops the run. fresh: the chunk was pending when claimed
// (no counts of it were recorded before).
func (ex *execution) chunkDone(ctx context.Context, res ChunkResult, fresh bool, turn *pipeTurn) bool {
	ex.mu.Lock()
	ex.addDone(res.Chunk.ID)
	delete(ex.faults, res.Chunk.Seq)
	ex.mu.Unlock()
	// The slot's stage is left after the run's reject-rate check below:
	// a run it pauses writes no chunk extracted ahead.
	defer turn.leave()
	if res.Open {
		ex.log.Warn("chunk open: it ends after the horizon (watermark or now); loaded, not final, read again by the next run",
			"seq", res.Chunk.Seq, "chunk", res.Chunk.ID, "read", res.Read, "inserted", res.Inserted)
	}
	ex.log.Info("chunk done", "seq", res.Chunk.Seq, "open", res.Open, "skipped", res.Skipped, "chunk", res.Chunk.ID, "read", res.Read, "inserted", res.Inserted,
		"updated", res.Updated, "unchanged", res.Unchanged, "rejected", res.Rejected, "deduplicated", res.Deduplicated,
		"duration", res.FinishedAt.Sub(res.StartedAt))
	if h := ex.r.cfg.Hooks; h != nil {
		h.ChunkDone(ctx, ex.batchID, res)
		ex.notifyProgress(ctx, false)
	}
	if err := ex.checkRunRejectRate(ctx, res, fresh); err != nil {
		if !errors.Is(err, ErrGateFailed) {
			// The check could not run (a shutdown, a connection lost for
			// longer than the reconnect budget, a statement timeout): the
			// call stops as at any other moment, the run is not failed.
			if ctx.Err() != nil {
				err = errors.Join(ctx.Err(), err)
			}
			ex.fail(nil, fmt.Errorf("backfill: job %q batch %d: after chunk %d %s: %w", ex.job.Name, ex.batchID, res.Chunk.Seq, res.Chunk.ID, err))
			return false
		}
		// The chunk is done (listed in PartialError.Done); the run gate
		// paused the run after it: not a chunk failure.
		err = fmt.Errorf("backfill: job %q batch %d: after chunk %d %s: %w", ex.job.Name, ex.batchID, res.Chunk.Seq, res.Chunk.ID, err)
		ex.fail(nil, err)
		ex.mu.Lock()
		ex.runGate = err
		ex.mu.Unlock()
		return false
	}
	// Between chunks: the run's control state (paused or cancelled by an
	// operator, knobs) is read by the next lease's statement, and a try
	// that leases nothing reads it itself ([execution.runChunk], [execution.pollControl]).
	return !ex.stopped()
}

// chunkFailed records a failed attempt of ce's chunk and waits before the
// retry; it returns false when the failure is final.
func (ex *execution) chunkFailed(ctx context.Context, ce *ChunkError, attempt int, err error, turn *pipeTurn) bool {
	ex.mu.Lock()
	if ex.tries == nil {
		ex.tries = map[int]int{}
	}
	ex.tries[ce.Chunk.Seq]++
	tries := ex.tries[ce.Chunk.Seq]
	delete(ex.faults, ce.Chunk.Seq)
	ex.mu.Unlock()
	// MaxAttempts counts the attempts of this call: a resumed run gives a
	// chunk that failed before its full share of retries again.
	final := !IsRetryable(err) || tries >= ex.r.cfg.MaxAttempts
	backoff := ex.r.cfg.RetryBackoff << (tries - 1)
	if final {
		backoff = 0
	} else {
		// This call's other goroutines (Concurrency, extracting ahead) do not
		// claim the chunk before its backoff is over either.
		ex.mu.Lock()
		ex.waits.avoid(ce.Chunk.Seq, time.Now().Add(backoff))
		ex.mu.Unlock()
	}
	ex.traceRetry(ctx, backfilltrace.RetryData{Chunk: ce.Chunk, Attempt: attempt, Kind: backfilltrace.RetryAttempt, Sleep: backoff, Final: final, Err: err})
	ex.log.Warn("chunk failed", "seq", ce.Chunk.Seq, "chunk", ce.Chunk.ID, "attempt", attempt, "final", final, "error", err)
	fctx := context.WithoutCancel(ctx)
	// Recorded once the server is back, when a restart or a dropped
	// connection failed the attempt.
	ferr := ex.retryConn(fctx, "record failed attempt", func() error {
		return ex.r.cfg.Manifest.FailChunk(fctx, ex.r.db, ex.batchID, ce.Chunk.Seq, ce.Err.Error(), final)
	})
	if ferr != nil {
		ex.fail(ce, ferr)
		return false
	}
	if final {
		ex.fail(ce, nil)
	}
	// Recorded: the slot's other chunk goes on, or sees the call stopped.
	turn.leave()
	ex.notifyFailed(ctx, ce, attempt, final)
	if final {
		return false
	}
	select {
	case <-ctx.Done():
	case <-time.After(backoff):
	}
	return true
}

// tryOutcome is how one try of runChunk ended: the single value next
// decodes. tryClaimed is the only outcome that comes with runChunk's
// error (the attempt failed); tryNone comes with or without one (an
// error before any lease); tryNoSlot may come with the lease's error;
// every other outcome comes without an error.
type tryOutcome uint8

const (
	// tryNone: nothing was claimed: none left to lease (or held by
	// other workers), the call stopped, or a step before the lease
	// failed.
	tryNone tryOutcome = iota
	// tryNoSlot: every place under JobConcurrency is taken (as many live
	// leases as it allows).
	tryNoSlot
	// tryThrottled: a throttle began to hold during the claim, or while
	// the chunk waited for the slot's write stage: its lease is released,
	// the chunk stays pending, the worker waits.
	tryThrottled
	// tryParked: the concurrency knob left this worker slot out while its
	// goroutine waited for the slot's extract stage (extracting ahead):
	// nothing was claimed, the slot waits for its turn (waitTurn).
	tryParked
	// tryFenced: the chunk's lease was taken over while it was extracted;
	// its transaction rolled back.
	tryFenced
	// tryRequeued: the chunk was not extracted on its version, and its
	// transaction found it must be: rolled back, its lease released, the
	// next lease extracts it ([execution.versionMissed]).
	tryRequeued
	// tryClaimed: the chunk was leased and its attempt ran, and did not
	// commit: at runChunk's return it comes with the attempt's error.
	tryClaimed
	// tryStaged: the chunk was only staged and committed; the run's
	// publish merges it (PublishAtEnd).
	tryStaged
	// tryDone: the chunk committed (merged, or skipped unchanged).
	tryDone
)

// claimed reports whether o is the outcome of a chunk claimed (leased)
// by the try and not given back: its attempt failed or committed.
func (o tryOutcome) claimed() bool {
	return o == tryClaimed || o == tryStaged || o == tryDone
}

// chunkRun is what runChunk did: its outcome, with which attempt, and
// the chunk's result when it committed; fresh, reread and admitted are
// facts of the try that hold beside any outcome.
type chunkRun struct {
	outcome tryOutcome
	res     ChunkResult
	attempt int
	// lockTimeout is the try's lock_timeout ("" for the session's); seen
	// what the watcher ([execution.watchChunk]) last saw of its backend.
	lockTimeout string
	seen        *watchSeen
	// fresh: the chunk was pending when claimed (checkRunRejectRate).
	fresh bool
	// settled: the rows of the sub-chunks the try committed that the
	// rate cap was settled with between them (adapt.go).
	settled int64
	// admitted: the throttle let the try through (its rate cap reserved
	// an estimate, settled when the try ends).
	admitted bool
	// span is the chunk's trace span (nil without Config.Tracer).
	span *chunkSpan
	// reread: the chunk was claimed open, read again (never skipped,
	// Job.SkipUnchanged).
	reread bool
	// inTx: the try reached the chunk's transaction (write): a
	// connection fault from here on is the transaction's
	// ([execution.chunkFaulted]), not the extractor's.
	inTx bool
	// turn is the slot's write stage when the chunk's transaction ran in
	// a pipeline (nil otherwise; see [chunkPipe]).
	turn *pipeTurn
}

// chunkTry is one attempt of a leased chunk, as the steps of runChunk
// (extract, write), loadChunk and the skip paths pass it along; each
// step takes its context separately. cr, c and started are set when the
// chunk is claimed, x once it is extracted (or found to need no
// extraction: x.sp nil), tx and pid once its transaction holds the
// fence, info and deferred when loadChunk has the publish mode's
// target. A try lives for one call of runChunk: cr is that call's
// record, which the steps update; tx is the chunk's transaction, which
// only loadChunk and the skip paths commit.
type chunkTry struct {
	cr      *chunkRun
	c       Chunk
	started time.Time
	// x is the chunk's spool with the row writer that extracted it, or,
	// for a chunk whose version may spare its extraction
	// ([execution.versionCandidate]), only its version (no spool).
	x   *spooled
	tx  backfilldriver.Tx
	pid int // the backend holding the fence (0: unknown)
	// info is the publish mode's target's table; deferred: the target
	// only stages the chunk (PublishAtEnd).
	info     TableInfo
	deferred bool
	// lockWaits: the merge's lock waits that ended granted, recorded
	// once the transaction has ended ([execution.recordLockWaits]).
	lockWaits *lockWaitRecord
	// sub: c is a sub-chunk of an adapted plan chunk (adapt.go); nil: c
	// is the plan chunk.
	sub *subTry
}

// chunkErr returns err as a failure of t's attempt.
func (t *chunkTry) chunkErr(err error) error {
	return &ChunkError{Chunk: t.c, Attempt: t.cr.attempt, Err: err}
}

// heldLease is a chunk leased by runChunk's lease step: the claim, the
// lease's parameters and when the lease began.
type heldLease struct {
	cl    backfilldriver.ChunkLease
	l     backfilldriver.Lease
	start time.Time
}

// runChunk leases the next chunk and runs it (see the design note docs/design/short-transactions.md):
// the throttle's wait, the lease in a short transaction of its own, the
// extraction outside any transaction into a spool, then the chunk's
// transaction: the fence, the publish mode's target, staging from the
// spool, merge, validation, checkpoint, commit (loadChunk). cr.outcome
// is tryNone (with a nil error) when no chunk was leased; p is the
// worker slot's pipe (nil: none; [chunkPipe]).
func (ex *execution) runChunk(ctx context.Context, p *chunkPipe) (cr chunkRun, err error) {
	// Throttle: the throttles and the rate cap wait here, before the
	// lease ([throttler]).
	if t := ex.throttle; t != nil {
		if err := t.wait(ctx); err != nil {
			return cr, err
		}
		cr.admitted = true
		if ex.stopped() {
			return cr, nil
		}
	}
	// The slot's extract stage, then its write stage before the chunk's
	// transaction ([chunkPipe]); the stage held is left on return.
	turn, ok := p.enterExtract(ctx)
	defer func() {
		// A chunk claimed hands its stage to next, which leaves it once
		// the chunk's outcome is recorded: a failure that stops the call
		// is known before the slot's other goroutine leases or writes.
		if cr.outcome.claimed() {
			cr.turn = turn
		} else {
			turn.leave()
		}
	}()
	if !ok {
		return cr, ctx.Err()
	}
	if p != nil && ex.stopped() {
		// Stopped while this goroutine waited for the stage.
		return cr, nil
	}
	if p != nil && ex.ctl != nil && p.slot >= ex.liveConcurrency() {
		// The concurrency knob was lowered while this goroutine waited
		// for the stage: the slot's other goroutine held it, and this
		// one must not lease a chunk the knob no longer allows.
		cr.outcome = tryParked
		return cr, nil
	}
	if ex.r.draining.Load() {
		// Draining (Runner.Drain): no lease more; the chunks claimed go on.
		return cr, nil
	}
	h, err := ex.lease(ctx, &cr)
	if h == nil {
		return cr, err
	}
	release := true
	defer func() { ex.endLease(ctx, h, release) }()
	if ex.stopped() {
		// A gate failed meanwhile (possibly on this very chunk): lease
		// nothing more until the run is paused.
		return cr, nil
	}
	if ex.throttle.holding() {
		// A throttle began to hold since the wait above: the lease is
		// released (the chunk stays pending) and the worker waits.
		cr.outcome = tryThrottled
		return cr, nil
	}
	cr.outcome, cr.attempt, cr.fresh = tryClaimed, h.cl.State.Attempts+1, h.cl.State.Status == ChunkPending
	ctx = ex.traceChunk(ctx, &cr, h.cl.State.Chunk, h.start)
	defer func() { cr.span.end(&cr, err) }()
	t, err := ex.extract(ctx, &cr, h)
	if err != nil {
		return cr, err
	}
	defer t.x.close()

	// The slot's write stage: the previous chunk leased by the slot is
	// written first ([chunkPipe]). A chunk that waited for it
	// checks again what the lease checked.
	ok, waited := turn.enterWrite(ctx, func() { cr.span.next(ctx, backfilltrace.PhaseQueued) })
	if !ok {
		return cr, t.chunkErr(ctx.Err())
	}
	if waited && (ex.stopped() || ex.throttle.holding()) {
		cr.outcome = tryNone
		if !ex.stopped() {
			cr.outcome = tryThrottled
		}
		cr.span.release()
		return cr, nil
	}
	if t.sub != nil {
		// A plan chunk worked in sub-chunks (adapt.go).
		committed, err := ex.writeSubchunks(ctx, t, h)
		release = !committed
		return cr, err
	}
	committed, err := ex.write(ctx, t, h)
	release = !committed
	// The merge's lock waits that ended granted, recorded now that the
	// chunk's transaction no longer holds its connection.
	ex.recordLockWaits(ctx, t.lockWaits)
	return cr, err
}

// lease leases the next chunk for cr's try in a short transaction of its
// own, avoiding the chunks the call's other goroutines hold or must not
// claim yet. It returns nil when none was leased, with cr.outcome
// tryNoSlot when the job concurrency ([execution.liveJobConcurrency]) has
// no place left, and the lease's error. The chunk leased stays in ex.leased until endLease.
func (ex *execution) lease(ctx context.Context, cr *chunkRun) (*heldLease, error) {
	r := ex.r
	s := r.cfg.txSettings()
	l := backfilldriver.Lease{Key: ex.worker.key, StaleAfter: r.cfg.StaleAfter, LockTimeout: s.TryLockTimeout(0), StmtTimeout: s.StmtSetting(),
		JobConcurrency: ex.liveJobConcurrency()}
	l.Avoid, _ = ex.avoided()

	// Lease. The leases of this call's goroutines share its worker key:
	// one goroutine leases at a time, avoiding the chunks the others
	// hold (a lease of the key that none holds is taken again: a release
	// that failed). The chunk's trace span, once it is leased, starts
	// from here ([execution.traceChunk]).
	leaseStart := time.Now()
	ex.leaseMu.Lock()
	ex.mu.Lock()
	for seq := range ex.leased {
		l.Avoid = append(l.Avoid, seq)
	}
	ex.mu.Unlock()
	cl, ok, full, err := r.caps.workers.LeaseChunk(ctx, r.db, ex.batchID, l)
	if err != nil || !ok {
		ex.leaseMu.Unlock()
		if full {
			cr.outcome = tryNoSlot
		}
		if err == nil {
			// No lease: the run may have been paused or cancelled, which
			// the lease's statement did not report ([execution.pollControl]).
			ex.pollControl(ctx)
		}
		return nil, err
	}
	if r.caps.control != nil && ex.ctl != nil {
		// The control state between two chunks, read by the lease.
		ex.applyControl(ctx, cl.Control)
	}
	ex.mu.Lock()
	if ex.leased == nil {
		ex.leased = map[int]bool{}
	}
	ex.leased[cl.State.Chunk.Seq] = true
	ex.mu.Unlock()
	ex.leaseMu.Unlock()
	return &heldLease{cl: cl, l: l, start: leaseStart}, nil
}

// endLease ends runChunk's hold of lease h: the chunk leaves ex.leased
// and, with release (its transaction did not commit), its lease is
// released.
func (ex *execution) endLease(ctx context.Context, h *heldLease, release bool) {
	seq := h.cl.State.Chunk.Seq
	ex.mu.Lock()
	delete(ex.leased, seq)
	ex.mu.Unlock()
	if release {
		if rerr := ex.r.caps.workers.ReleaseLease(context.WithoutCancel(ctx), ex.r.db, ex.batchID, seq, h.l.Key, h.cl.Epoch); rerr != nil {
			// Not lost: the lease is this worker's, which claims it
			// again, and it ends with the worker's call.
			ex.log.Warn("backfill: releasing a chunk's lease failed", "seq", seq, "error", rerr)
		}
	}
}

// extract is runChunk's extract step for the chunk of lease h, claimed
// by cr: the plan's chunk, its version, and its extraction outside any
// transaction into a spool, unless its version may spare it. It returns
// the chunk's try, whose spool the caller closes; on an error none is
// left open.
func (ex *execution) extract(ctx context.Context, cr *chunkRun, h *heldLease) (*chunkTry, error) {
	c, ok := ex.plan.ChunkOf(h.cl.State.Chunk)
	if !ok {
		return nil, &ChunkError{Chunk: h.cl.State.Chunk, Attempt: cr.attempt, Err: fmt.Errorf("%w: manifest chunk %d %q is not in the plan (or the Chunker's ChunkOf returned another chunk for it)", backfilltype.ErrNotRetryable, h.cl.State.Chunk.Seq, h.cl.State.Chunk.ID)}
	}
	t := &chunkTry{cr: cr, c: c, started: time.Now()}
	cr.reread = h.cl.State.Status == ChunkOpen
	// Adaptive chunks: the plan chunk's next sub-chunk (adapt.go).
	if ok, err := ex.adaptExtract(ctx, t); err != nil {
		return nil, t.chunkErr(err)
	} else if ok {
		return t, nil
	}
	xctx := cr.span.next(ctx, backfilltrace.PhaseExtract)

	// A job with SkipUnchanged and a ChunkVersioner: the chunk's version,
	// before its extraction, and whether its base lets it skip the
	// extraction ([execution.versionCandidate]): then it is not extracted, and
	// its transaction decides.
	version, err := ex.chunkVersion(xctx, c, cr.reread, t.started)
	if err != nil {
		return nil, t.chunkErr(err)
	}
	if ok, err := ex.versionCandidate(xctx, c, version); err != nil {
		return nil, t.chunkErr(err)
	} else if ok {
		t.x = &spooled{skip: &chunkSkip{version: version}}
		return t, nil
	}

	// A job with SkipUnchanged and a ChunkColumn: a chunk whose base
	// recorded its rows' fingerprint as written is extracted first only to
	// fingerprint them ([execution.probe]): unchanged, it is neither
	// converted nor spooled, and its transaction decides.
	if sk, err := ex.probe(xctx, c, cr.reread, t.started, version); err != nil {
		return nil, t.chunkErr(err)
	} else if sk != nil {
		t.x = &spooled{skip: sk}
		cr.span.setRows(sk.probedRows)
		return t, nil
	}

	// Extract, outside any transaction, into a spool.
	if t.x, err = ex.extractSpooled(xctx, c, t.started, version, Counts{}); err != nil {
		return nil, t.chunkErr(err)
	}
	cr.span.setRows(t.x.w.read)
	return t, nil
}

// write is runChunk's write step for try t of lease h: the chunk's
// transaction, fenced first, then loadChunk. committed reports the
// commit; a transaction that did not commit is rolled back before write
// returns. A fence that failed (tryFenced) or a chunk found to need its
// extraction (tryRequeued) is no error.
func (ex *execution) write(ctx context.Context, t *chunkTry, h *heldLease) (committed bool, err error) {
	cr, seq := t.cr, h.cl.State.Chunk.Seq
	// The chunk's transaction.
	cr.span.next(ctx, backfilltrace.PhaseStage)
	cr.inTx = true
	tx, err := ex.beginChunk(ctx)
	if err != nil {
		// An attempt of the chunk: recorded as failed, like a failure
		// inside its transaction.
		return false, t.chunkErr(fmt.Errorf("begin chunk transaction: %w", err))
	}
	tx = batched(tx)
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	// The fence first: the lease still this worker's, the row locked
	// until the commit.
	// Its wait for the chunks table (an operator's LOCK TABLE) is
	// bounded by the try's lock_timeout, a wait of the chunk.
	l := h.l
	l.LockTimeout = ex.r.cfg.txSettings().TryLockTimeout(ex.waitTry(seq))
	cr.lockTimeout = l.LockTimeout
	fenced, pid, ok, err := ex.r.caps.workers.FenceLease(ctx, tx, ex.batchID, seq, h.cl.Epoch, l)
	if err != nil {
		return false, t.chunkErr(err)
	}
	if b, isBatch := tx.(*pgstore.BatchTx); isBatch {
		b.Fresh = ok && fenced.Status == ChunkPending
	}
	if !ok {
		// The deferred release clears the lease only if it is still this
		// worker's at this epoch: a lease taken over is left to its new
		// holder; one left by a run paused or abandoned meanwhile is freed
		// for the run's resume.
		cr.outcome = tryFenced
		cr.span.release()
		ex.log.Warn("backfill: chunk's fence failed: its lease was taken over (this worker was stale) or the run stopped meanwhile (paused, abandoned); its transaction rolls back", "seq", seq, "chunk", t.c.ID)
		return false, nil
	}
	t.tx, t.pid = tx, pid
	err = ex.loadChunk(ctx, t)
	if errors.Is(err, errVersionMissed) {
		// Not extracted on its version, but it must be: its transaction
		// rolls back, its lease is released (deferred) and this call's
		// next lease of it extracts it ([execution.versionCandidate]).
		ex.versionMissed(seq, true)
		cr.outcome = tryRequeued
		cr.span.release()
		return false, nil
	}
	committed = err == nil
	if committed {
		cr.outcome = tryDone
		if t.deferred {
			cr.outcome = tryStaged
		}
	}
	return committed, err
}

// loadChunk runs try t, whose chunk's transaction t.tx holds the fence,
// from the publish mode's target to the commit. A chunk not extracted
// (t.x has no spool) is skipped on its version, or loadChunk returns
// errVersionMissed for runChunk to extract it.
func (ex *execution) loadChunk(ctx context.Context, t *chunkTry) (err error) {
	cr, c, tx := t.cr, t.c, t.tx
	// A retried try waits longer for locks ([LockRetry]).
	if t.pid != 0 {
		if cr.lockTimeout, err = ex.setTryLockTimeout(ctx, tx, c.Seq); err != nil {
			return t.chunkErr(err)
		}
	}

	// Target: where the publish mode loads the chunk.
	tg, err := ex.pub.target(ctx, ex, tx, c)
	if err != nil {
		return t.chunkErr(err)
	}
	t.info, t.deferred = tg.info, tg.deferred

	// Skip: a job with SkipUnchanged checks the spooled rows' and the
	// target rows' fingerprints first ([execution.skipUnchanged]).
	if done, err := ex.trySkip(ctx, t); done {
		return err
	}
	sk := t.x.skip

	// Stage, from the spool.
	stager, w, err := ex.stage(ctx, tx, stageParams{chunk: c, info: tg.info, started: t.started, savepoints: tg.isolate, newStager: tg.newStager, spooled: t.x})
	if err != nil {
		return t.chunkErr(err)
	}
	defer stager.Close()
	cr.span.setRows(w.read)

	// Merge (a deferred chunk's stager only ends its staging). From here
	// to the commit the chunk's statements may wait for locks: a watcher
	// notes the blockers of a wait.
	stopWatch := ex.watchChunk(ctx, t.pid, cr.lockTimeout)
	defer func() { cr.seen = stopWatch() }()
	cr.span.next(ctx, backfilltrace.PhaseMerge)
	mr, err := stager.Merge(ex.chunkLockWaiting(ctx, t))
	if err != nil {
		return t.chunkErr(err)
	}
	if mr.Disagreed > 0 {
		ex.log.Warn("chunks of this run disagree on keys: TargetWins kept the row the first chunk to commit wrote, so the result depends on commit order (Config.Concurrency); give the target a Version and use NewerVersionWins for an order-independent result",
			"seq", c.Seq, "chunk", c.ID, "rows", mr.Disagreed)
	}
	var prior int64 // a sub-chunk's: the rejects of its plan chunk's sub-chunks before it
	if t.sub != nil {
		prior = t.sub.prior.Rejected
	}
	if err := pgstore.TooManyRejects(ex.r.cfg.MaxRejectsPerChunk, c, prior, w.rejected, mr.Rejected); err != nil {
		return t.chunkErr(err)
	}
	if sk != nil {
		if err := ex.recordAfterMerge(ctx, t, sk, w, stager, mr); err != nil {
			return t.chunkErr(err)
		}
	}
	for _, e := range mr.Rejected {
		e.ChunkID = c.ID
		w.exceptions = append(w.exceptions, e)
	}
	cr.res = ChunkResult{
		Chunk: c, Attempt: cr.attempt, StartedAt: t.started, Worker: ex.r.cfg.WorkerID,
		Counts: Counts{Read: w.read, Inserted: mr.Inserted, Updated: mr.Updated, Unchanged: mr.Unchanged,
			Rejected: w.rejected + int64(len(mr.Rejected)), Deduplicated: mr.Deduplicated},
	}

	cr.span.setRows(mr.Inserted + mr.Updated + mr.Unchanged + mr.Deduplicated + int64(len(mr.Rejected)))

	// Validate: the job's checks and the row accounting (a deferred chunk
	// is validated when the run's publish merges it).
	if !tg.deferred {
		cr.span.next(ctx, backfilltrace.PhaseValidate)
		if err := ex.validateChunk(ctx, t, stager, w.exceptions); err != nil {
			return err
		}
	}
	return ex.checkpoint(ctx, t, tg, sk, w.exceptions)
}

// trySkip is loadChunk's skip step for a job with SkipUnchanged: a chunk
// not extracted is skipped on its version or, if it cannot be, missed
// (errVersionMissed); an extracted chunk is skipped when its
// fingerprints are its base's. done reports that loadChunk ends with
// err (the chunk skipped and committed, missed, or failed).
func (ex *execution) trySkip(ctx context.Context, t *chunkTry) (done bool, err error) {
	if t.x.skip == nil {
		return false, nil
	}
	if t.x.sp == nil {
		// Not extracted: its version may spare the extraction
		// ([execution.versionCandidate]); or probed as unchanged, not
		// spooled ([execution.probe]). If not skipped, the chunk goes back
		// to be extracted outside any transaction (runChunk).
		skip := ex.skipByVersion
		if t.x.skip.probed != "" {
			skip = ex.skipByProbe
		}
		if skipped, err := skip(ctx, t); err != nil || skipped {
			return true, err
		}
		return true, errVersionMissed
	}
	if skipped, err := ex.skipUnchanged(ctx, t); err != nil || skipped {
		return true, err
	}
	return false, nil
}

// checkpoint is loadChunk's last step for merged try t, loaded through
// publish target tg: the checkpoint (with sk's fingerprints for a job
// with SkipUnchanged) of the chunk's result and exceptions, then the
// commit.
func (ex *execution) checkpoint(ctx context.Context, t *chunkTry, tg chunkTarget, sk *chunkSkip, exceptions []Exception) (err error) {
	cr := t.cr
	cr.span.next(ctx, backfilltrace.PhaseCheckpoint)
	cr.res.FinishedAt = time.Now()
	cr.res.Open = ex.open(t.c, t.started)
	for i := range exceptions {
		exceptions[i].BatchID = ex.batchID
	}
	if t.sub != nil {
		// A sub-chunk: its own checkpoint, or the plan chunk's sums
		// (adapt.go).
		if done, err := ex.checkpointSub(ctx, t, exceptions); done {
			return err
		}
	}
	if sk != nil {
		// Only chunks published as they commit skip (skipEligible): the
		// checkpoint, with the fingerprints.
		// The skip key is recorded whether or not the merge recorded
		// fingerprints: the newest chunk of the key is the next base.
		rec := sk.record
		rec.SkipKey = ex.skipKey
		err = ex.r.caps.skips.CompleteChunkFingerprinted(ctx, t.tx, ex.batchID, cr.res, exceptions, rec)
	} else {
		err = ex.pub.beforeCommit(ctx, ex, t.tx, tg, cr.res, exceptions)
	}
	if err != nil {
		return t.chunkErr(err)
	}

	// Commit, after the BeforeCommit of a chunk run alone (RunChunk).
	if err := beforeCommit(ctx, t.tx, cr.res); err != nil {
		return t.chunkErr(err)
	}
	cr.span.next(ctx, backfilltrace.PhaseCommit)
	if err := t.tx.Commit(); err != nil {
		return t.chunkErr(fmt.Errorf("commit: %w", err))
	}
	return nil
}

// validateChunk runs the job's validators on try t's merged chunk
// (t.cr.res) in t.tx, records their results there, and checks the row
// accounting. A failed gate stops the claims of this call and returns a
// *ChunkError wrapping a *gateError with the attempt's exceptions.
func (ex *execution) validateChunk(ctx context.Context, t *chunkTry, stager backfilldriver.Stager, exceptions []Exception) error {
	return ex.validateChunkWith(ctx, t, stager, exceptions, ex.job.Validators)
}

// validateChunkWith is validateChunk running validators vs rather than
// the job's (a skipped chunk's: [skipValidators]).
func (ex *execution) validateChunkWith(ctx context.Context, t *chunkTry, stager backfilldriver.Stager, exceptions []Exception, vs []Validator) error {
	res := t.cr.res
	c := res.Chunk
	chunkErr := func(err error) error { return &ChunkError{Chunk: c, Attempt: res.Attempt, Err: err} }
	checks, err := ex.validateWith(ctx, t.tx, ex.validationScope(c, t.info, stager, res.Counts), vs)
	var ge *gateError
	if errors.As(err, &ge) {
		// No worker of this call claims another chunk (this one
		// included, once it rolls back) before the run is paused.
		ex.mu.Lock()
		ex.stop = true
		ex.mu.Unlock()
		// The evidence outlives the rollback: the rows this attempt
		// rejected go with the failed results (see next).
		ge.exceptions = slices.Clone(exceptions)
		return chunkErr(ge)
	}
	if err != nil {
		return chunkErr(err)
	}
	if !res.Balanced() {
		return chunkErr(fmt.Errorf("%w: read %d != inserted %d + updated %d + unchanged %d + rejected %d + deduplicated %d",
			ErrAccounting, res.Read, res.Inserted, res.Updated, res.Unchanged, res.Rejected, res.Deduplicated))
	}
	if len(checks) > 0 {
		// Run refused validators without ManifestValidations.
		if err := ex.r.caps.validations.AddValidations(ctx, t.tx, ex.batchID, c.ID, checks); err != nil {
			return chunkErr(err)
		}
	}
	return nil
}

// gateError is a failed quality gate: the reason, every check's result
// and the exceptions of the attempt it rolled back.
type gateError struct {
	reason     string
	results    []CheckResult
	exceptions []Exception
}

func (e *gateError) Error() string { return ErrGateFailed.Error() + ": " + e.reason }

func (e *gateError) Unwrap() []error { return []error{ErrGateFailed, backfilltype.ErrNotRetryable} }

// Resume resumes the paused run of job (a quality gate failed, see
// [Job.Validators]) after recording in the audit log who resumes it and
// why, then runs it like [Runner.Run]. It also records the run's read and
// rejected rows at this point ([backfilltype.EventGateBaseline]): from then
// on the run reject gate ([Job.MaxRunRejectRate]) and the "no row loaded"
// pause judge only the rows read after the resume, so one Resume gets a run
// past rejects the operator has seen. It returns [ErrNotPaused] when the
// job's latest run is not paused, and [ErrUnsupported] when the manifest
// cannot pause runs.
func (r *Runner) Resume(ctx context.Context, job Job, actor, why string) (Report, error) {
	ctx = pgstore.WithPurpose(ctx, "resume a run", 0)
	mv, audit := r.caps.validations, r.caps.audit
	if mv == nil || audit == nil {
		return Report{}, fmt.Errorf("backfill: resume job %q: %w: pausing needs ManifestValidations and ManifestAudit", job.Name, ErrUnsupported)
	}
	if actor == "" || why == "" {
		return Report{}, fmt.Errorf("backfill: resume job %q: %w: who and why are required", job.Name, ErrInvalidConfig)
	}
	run, err := r.pausedRun(ctx, job, "resume job")
	if err != nil {
		return Report{}, err
	}
	// The run's rows now: the run reject gate and the "no row loaded"
	// pause judge only what is read after this decision. Recorded with
	// the resume, in one transaction.
	baseline, err := r.baselineEvent(ctx, job.Name, run.BatchID, actor)
	if err != nil {
		return Report{}, err
	}
	err = pgstore.InBoundedTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		if err := audit.RecordEvent(ctx, tx, baseline); err != nil {
			return err
		}
		return mv.ResumeRun(ctx, tx, run.BatchID, actor, why)
	})
	if err != nil {
		return Report{}, err
	}
	return r.Run(ctx, job)
}

// rollbackMechanism resolves Job.Rollback against the prepared target.
func rollbackMechanism(job Job, info TableInfo, pub publisher) (RollbackMechanism, error) {
	lineage := info.Target.Lineage.InsertedBy != "" && info.Target.Lineage.UpdatedBy != ""
	if pub.switchesBack() {
		switch job.Rollback {
		case "", RollbackSwitchBack:
			return RollbackSwitchBack, nil
		case RollbackNone:
			return RollbackNone, nil
		}
		return "", fmt.Errorf("backfill: job %q: %w: publish mode %s is rolled back by switching back (RollbackSwitchBack) or not at all", job.Name, ErrInvalidConfig, job.Publish.Mode)
	}
	switch job.Rollback {
	case RollbackSwitchBack:
		return "", fmt.Errorf("backfill: job %q: %w: RollbackSwitchBack needs a versioned-view or partition-swap publish mode", job.Name, ErrInvalidConfig)
	case RollbackNone:
		return RollbackNone, nil
	case RollbackUndoLog:
		if !lineage {
			return "", fmt.Errorf("backfill: job %q: %w: RollbackUndoLog needs the lineage columns (Target.Lineage; bigint backfill_inserted_by and backfill_updated_by by default) on %q", job.Name, ErrInvalidConfig, info.Target.Table)
		}
		return RollbackUndoLog, nil
	case "":
		if lineage {
			return RollbackUndoLog, nil
		}
		return "", fmt.Errorf("backfill: job %q: %w: no rollback mechanism: add lineage columns to %q (bigint backfill_inserted_by, backfill_updated_by) for an undo log, or accept Job.Rollback = RollbackNone", job.Name, ErrInvalidConfig, info.Target.Table)
	}
	return "", fmt.Errorf("backfill: job %q: %w: Job.Rollback %q is not supported", job.Name, ErrInvalidConfig, job.Rollback)
}

// validate runs the job's validators on a merged chunk in tx. A failed
// check of SeverityError returns a *gateError carrying every result.
func (ex *execution) validate(ctx context.Context, tx sqlx.ExtContext, c Chunk, info TableInfo, stager backfilldriver.Stager, counts Counts) ([]CheckResult, error) {
	return ex.validateWith(ctx, tx, ex.validationScope(c, info, stager, counts), ex.job.Validators)
}

// validationScope is the scope of the validators of chunk c, merged into
// info's target through stager with counts, without its staging table,
// which validateWith reads from the stager.
func (ex *execution) validationScope(c Chunk, info TableInfo, stager backfilldriver.Stager, counts Counts) ValidationScope {
	return ValidationScope{BatchID: ex.batchID, Chunk: c, Info: info, ChunkColumn: ex.job.ChunkColumn,
		Zone: cmp.Or(ex.job.Zone, time.UTC), Stager: stager, Counts: counts}
}

// validateWith is validate running validators vs in scope (of
// validationScope).
func (ex *execution) validateWith(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope, vs []Validator) ([]CheckResult, error) {
	if len(vs) == 0 {
		return nil, nil
	}
	c := scope.Chunk
	if st, ok := scope.Stager.(backfilldriver.StagingTabler); ok {
		scope.Staging = st.StagingTable()
	}
	var checks []CheckResult
	gate := ""
	for _, v := range vs {
		cr, err := v.Validate(ctx, tx, scope)
		if err != nil {
			return nil, fmt.Errorf("validate: %w", err)
		}
		if !cr.Passed && cr.Severity == SeverityError && acceptedResult(ex.accepted[c.ID], cr) {
			// An operator accepted this very failure (same check, same
			// evidence) for this chunk; a different verdict fails again.
			cr.Accepted = true
			ex.log.Warn("quality gate failed, accepted by operator", "seq", c.Seq, "chunk", c.ID, "check", cr.Check,
				"expected", cr.Expected, "actual", cr.Actual)
		}
		checks = append(checks, cr)
		if !cr.Passed && cr.Severity == SeverityError && !cr.Accepted && gate == "" {
			gate = fmt.Sprintf("%s: expected %s, got %s", cr.Check, cr.Expected, cr.Actual)
		}
	}
	if gate != "" {
		return checks, &gateError{reason: gate, results: checks}
	}
	return checks, nil
}

// checkRunRejectRate pauses the run when its rejects exceed
// Job.MaxRunRejectRate of its reads (default DefaultMaxRunRejectRate,
// negative: off), over the chunks done so far; res is the chunk just
// done, fresh whether it was pending when claimed.
//
// A fresh chunk without rejects only lowers the rate (its rows add to
// the reads, none to the rejects), so once this call has checked the
// rate, such a chunk needs no read of the run's totals (a statement of
// its own per chunk): the chunk that raised the rate checked it after
// its commit. The first chunk of each call checks whatever it rejected:
// a call that crashed between a chunk's commit and its check is covered.
func (ex *execution) checkRunRejectRate(ctx context.Context, res ChunkResult, fresh bool) error {
	max := ex.job.MaxRunRejectRate
	switch {
	case max < 0:
		return nil
	case max == 0:
		max = DefaultMaxRunRejectRate
	}
	if fresh && res.Rejected == 0 && ex.rateChecked.Load() {
		return nil
	}
	// A server restart or a dropped connection right after the chunk's
	// commit does not fail the run: the check waits for the server.
	var total Counts
	err := ex.retryConn(ctx, "check the run's reject rate", func() (err error) {
		total, err = loadedTotals(ctx, ex.r.cfg.Manifest, ex.r.db, ex.batchID)
		return err
	})
	if err != nil {
		return err
	}
	ex.rateChecked.Store(true)
	// After an operator resumed the run, only the rows read since count:
	// the rejects before were judged by the operator (ex.baseline).
	read, rejected := total.Read-ex.baseline.Read, total.Rejected-ex.baseline.Rejected
	if read <= 0 || float64(rejected)/float64(read) <= max {
		return nil
	}
	reason := fmt.Sprintf("run reject rate %d/%d = %.4f exceeds Job.MaxRunRejectRate %.4f", rejected, read, float64(rejected)/float64(read), max)
	if ex.job.MaxRunRejectRate == 0 {
		reason += " (the default)"
	}
	if ex.baseline.Read > 0 {
		reason += fmt.Sprintf(" (rows read since the run was last resumed, at %d read and %d rejected)", ex.baseline.Read, ex.baseline.Rejected)
	}
	reason += "; " + ex.gateRemedies(true, total.Rejected)
	if mv := ex.r.caps.validations; mv != nil {
		fctx := context.WithoutCancel(ctx)
		if err := ex.retryConn(fctx, "pause the run at its reject rate", func() error { return mv.PauseRun(fctx, ex.r.db, ex.batchID, reason) }); err != nil {
			return err
		}
		ex.tracePause(fctx, backfilltrace.PauseGate, reason)
	}
	return fmt.Errorf("%w: %s", ErrGateFailed, reason)
}

// gateRemedies says what an operator can do about a run the reject gates
// paused (checkRunRejectRate, checkLoaded); rate: the run reject rate's,
// whose limit can be raised; rejected: the run's rejects so far, which a
// resume accepts.
func (ex *execution) gateRemedies(rate bool, rejected int64) string {
	raise := ""
	if rate {
		raise = ", or raise Job.MaxRunRejectRate (negative: off) and resume"
	}
	schema := quote.SchemaFlag(ex.r.schemaName())
	return fmt.Sprintf("inspect the rejected rows (backfill exceptions%s --batch %d), then resume the run to accept the %d rejects so far, "+
		"after which the gate judges only the rows read after the resume "+
		"(Runner.Resume; backfill resume%s --job %s --why TEXT)%s, or roll the batch back (Runner.Rollback; backfill rollback%s --batch %d --why TEXT)",
		schema, ex.batchID, rejected, schema, quote.Shell(ex.job.Name), raise, schema, ex.batchID)
}

// loadedTotaler is a Manifest that sums the rows read and rejected of a
// batch's done and open chunks itself (PGManifest: in one aggregate),
// rather than returning every chunk's state to be summed.
type loadedTotaler interface {
	LoadedTotals(ctx context.Context, db sqlx.ExtContext, batchID int64) (Counts, error)
}

// loadedTotals returns the sum of the counts of batchID's done and open
// chunks; only Read and Rejected are set when m is a loadedTotaler. It
// is called after every chunk (checkRunRejectRate): reading every
// chunk's state there would make each chunk cost in proportion to the
// plan's length.
func loadedTotals(ctx context.Context, m Manifest, db sqlx.ExtContext, batchID int64) (Counts, error) {
	if t, ok := m.(loadedTotaler); ok {
		return t.LoadedTotals(ctx, db, batchID)
	}
	states, err := m.Chunks(ctx, db, batchID)
	if err != nil {
		return Counts{}, err
	}
	var total Counts
	for _, s := range states {
		if s.Status == ChunkDone || s.Status == ChunkOpen {
			total = total.Add(s.Counts)
		}
	}
	return total, nil
}

// chunkSummer is a Manifest that sums a batch's chunks itself
// (PGManifest: in one aggregate), rather than returning every chunk's
// state: a plan of a million chunks is not read into memory to be
// counted.
type chunkSummer interface {
	ChunkSummary(ctx context.Context, db sqlx.ExtContext, batchID int64) (pgstore.ChunkSummary, error)
}

// summarizeChunks returns the summary of batchID's chunks.
func summarizeChunks(ctx context.Context, m Manifest, db sqlx.ExtContext, batchID int64) (pgstore.ChunkSummary, error) {
	if s, ok := m.(chunkSummer); ok {
		return s.ChunkSummary(ctx, db, batchID)
	}
	states, err := m.Chunks(ctx, db, batchID)
	if err != nil {
		return pgstore.ChunkSummary{}, err
	}
	var sum pgstore.ChunkSummary
	for _, s := range states {
		switch s.Status {
		case ChunkDone:
			sum.Done++
			sum.Counts = sum.Counts.Add(s.Counts)
			if s.Skipped {
				sum.Skipped++
			}
		case ChunkOpen:
			sum.Open++
			sum.OpenIDs = append(sum.OpenIDs, s.Chunk.ID)
			sum.Counts = sum.Counts.Add(s.Counts)
			if s.Skipped {
				sum.Skipped++
			}
		default:
			sum.Other++
		}
	}
	return sum, nil
}

// checkLoaded pauses the run when every chunk is done and the chunks read
// rows but loaded none: all of them were rejected. It is called when a
// call of Run completed chunks without failing, so that a run resumed
// after the pause ([Runner.Resume]) completes.
func (ex *execution) checkLoaded(ctx context.Context) error {
	sum, err := summarizeChunks(ctx, ex.r.cfg.Manifest, ex.r.db, ex.batchID)
	if err != nil {
		return err
	}
	// An open chunk is loaded (not final): it does not skip the check.
	if sum.Other > 0 {
		return nil
	}
	total := sum.Counts
	// Only what was read since an operator last resumed the run counts.
	read, rejected := total.Read-ex.baseline.Read, total.Rejected-ex.baseline.Rejected
	if read <= 0 || rejected < read {
		return nil
	}
	reason := fmt.Sprintf("no row loaded: all %d rows read were rejected", read)
	if ex.baseline.Read > 0 {
		reason = fmt.Sprintf("no row loaded: all %d rows read since the run was last resumed were rejected", read)
	}
	reason += "; " + ex.gateRemedies(false, total.Rejected)
	ex.log.Warn("run paused", "reason", reason)
	if mv := ex.r.caps.validations; mv != nil {
		if err := mv.PauseRun(context.WithoutCancel(ctx), ex.r.db, ex.batchID, reason); err != nil {
			return err
		}
		ex.tracePause(ctx, backfilltrace.PauseGate, reason)
	}
	return fmt.Errorf("backfill: job %q batch %d: %w: %s", ex.job.Name, ex.batchID, ErrGateFailed, reason)
}

// rollbackUnfinished reports whether the latest rollback event of the
// call's batch starts a whole batch's rollback that has not finished
// (interrupted between its transactions); false when the audit trail
// cannot be read.
func (ex *execution) rollbackUnfinished(ctx context.Context) bool {
	events, ok := ex.auditEvents(ctx)
	if !ok {
		return false
	}
	for i := len(events) - 1; i >= 0; i-- {
		switch e := events[i]; e.Kind {
		case "rollback", "rollback_chunk":
			return false
		case "rollback_started":
			var d struct {
				Chunk string `json:"chunk"`
			}
			return json.Unmarshal(e.Detail, &d) == nil && d.Chunk == ""
		}
	}
	return false
}
