package backfill

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/hysteresis"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// How a graph runs. RunGraph plans every job of the graph as Run would
// (planRun) and freezes the graph's own plan: the modules with their
// jobs' plan fingerprints, dependencies, priorities, classes and flags.
// The graph's run is a run of the graph's name with that plan and no
// chunks: StartRun creates it, awaiting approval under the graph's
// policy, or continues it, and abandons an unfinished run of another
// plan of the graph (a flag switched, a job changed); its approvals are
// those of approve.go. Once it is running, each enabled module's jobs'
// runs are started (a job's run of another plan is replaced: the graph's
// plan, approved as a whole, covers the change) and a scheduler in this
// process runs their chunks through runPlannedChunk, RunChunk's path:
// lease, extraction, one transaction from the fence to the checkpoint.
// There is no third chunk path.
//
// The order is decided here and enforced by the manifest's state: a
// child's chunk is called only once every overlapping chunk of its
// parents was reported loaded or already done (committed), and a call
// that starts after a crash reads the chunks' states again, so a child
// chunk is never committed before its parents' whatever the process.
// Chunks another process holds come back busy and are asked again after
// a throttle interval. The modules' states (failed, paused, disabled,
// held) are settled from their jobs' runs (backfilltype.SettleModules),
// so a failed or paused module holds its descendants only.

// graphSetup is a graph planned: its modules' jobs planned, the modules'
// flags, and the graph's plan.
type graphSetup struct {
	g       Graph
	order   []int
	enabled []bool
	jobs    [][]runSetup
	plan    Plan
}

// graphJobCheck refuses a job a graph cannot run.
func graphJobCheck(g Graph, m Module, j Job) error {
	switch {
	case j.NewRun:
		return fmt.Errorf("backfill: graph %q: module %q: job %q: %w: Job.NewRun is not for a graph's job (a change of its plan starts its new run with the graph's)", g.Name, m.Name, j.Name, ErrInvalidConfig)
	case j.Approval.Approvers != 0:
		return fmt.Errorf("backfill: graph %q: module %q: job %q: %w: Job.Approval is not for a graph's job: set Graph.Approval", g.Name, m.Name, j.Name, ErrInvalidConfig)
	}
	if _, err := engineJob(j); err != nil {
		return fmt.Errorf("backfill: graph %q: module %q: %w", g.Name, m.Name, err)
	}
	return nil
}

// planGraph validates g, plans its jobs and freezes the graph's plan; it
// writes nothing.
func (r *Runner) planGraph(ctx context.Context, g Graph) (graphSetup, error) {
	order, err := g.validate()
	if err != nil {
		return graphSetup{}, err
	}
	for _, m := range g.Modules {
		for _, j := range m.Jobs {
			if err := graphJobCheck(g, m, j); err != nil {
				return graphSetup{}, err
			}
		}
	}
	gs := graphSetup{g: g, order: order, enabled: make([]bool, len(g.Modules)), jobs: make([][]runSetup, len(g.Modules))}
	for i, m := range g.Modules {
		for _, j := range m.Jobs {
			rs, err := r.planRun(ctx, j)
			if err != nil {
				return graphSetup{}, fmt.Errorf("backfill: graph %q: module %q: %w", g.Name, m.Name, err)
			}
			gs.jobs[i] = append(gs.jobs[i], rs)
		}
	}
	flags := map[string]bool{}
	if pm, _ := r.pgPrivileges(); pm != nil {
		if flags, err = pm.ModuleFlags(ctx, r.db, g.Name); err != nil {
			return graphSetup{}, err
		}
	}
	njobs := 0
	for _, m := range g.Modules {
		njobs += len(m.Jobs)
	}
	gs.plan = Plan{Job: g.Name, Scope: fmt.Sprintf("graph of %d modules, %d jobs", len(g.Modules), njobs), ChunkIDs: []string{}, Chunks: []Chunk{}}
	if g.Approval.Approvers > 0 {
		a := g.Approval
		gs.plan.Approval = &a
	}
	for i, m := range g.Modules {
		en := !m.Disabled
		if f, ok := flags[m.Name]; ok {
			en = f
		}
		gs.enabled[i] = en
		pm := backfilltype.PlanModule{Name: m.Name, DependsOn: append([]string{}, m.DependsOn...), Priority: m.Priority,
			Class: cmp.Or(m.Class, ModuleEssential), Enabled: en}
		for k, j := range m.Jobs {
			pm.Jobs = append(pm.Jobs, backfilltype.PlanModuleJob{Name: j.Name, Fingerprint: gs.jobs[i][k].plan.Fingerprint})
		}
		gs.plan.Modules = append(gs.plan.Modules, pm)
	}
	gs.plan.Fingerprint = gs.plan.ComputeFingerprint()
	return gs, nil
}

// GraphBlueprint: see graph.go.
func (r *Runner) graphBlueprint(ctx context.Context, gs graphSetup) (Blueprint, error) {
	b := backfilltype.PlanBlueprint(gs.plan)
	for i := range gs.g.Modules {
		for k, rs := range gs.jobs[i] {
			jb, err := r.blueprintOf(ctx, rs)
			if err != nil {
				return Blueprint{}, err
			}
			j := jb.Modules[0].Jobs[0]
			j.Fingerprint, j.Chunks = rs.plan.Fingerprint, jb.Scope.Chunks
			b.Modules[i].Jobs[k] = j
			b.Scope.Chunks += jb.Scope.Chunks
			b.Limits = jb.Limits
		}
	}
	bs, ok := r.cfg.Manifest.(blueprintStore)
	if !ok {
		return b, nil
	}
	prev, found, err := bs.PreviousRun(ctx, r.db, b.Job, 0)
	if err != nil {
		return Blueprint{}, err
	}
	if found && prev.Fingerprint == b.Fingerprint {
		b.BatchID, b.Status = prev.BatchID, prev.Status
		if prev, found, err = bs.PreviousRun(ctx, r.db, b.Job, prev.BatchID); err != nil {
			return Blueprint{}, err
		}
	}
	if !found {
		return b, nil
	}
	pb, full, err := bs.RecordedBlueprint(ctx, r.db, prev)
	if err != nil {
		return Blueprint{}, err
	}
	b.Previous = &backfilltype.BlueprintPrevious{BatchID: prev.BatchID, Status: prev.Status, Fingerprint: prev.Fingerprint}
	cur := b
	if !full {
		cur = backfilltype.PlanBlueprint(gs.plan)
	}
	b.Changes = backfilltype.BlueprintDiff(pb, cur)
	return b, nil
}

// recordGraphBlueprint records the blueprint of the graph's run as
// recordBlueprint does a job's: once per content.
func (r *Runner) recordGraphBlueprint(ctx context.Context, gs graphSetup, run Run) error {
	audit := r.caps.audit
	if audit == nil || run.Status != RunRunning && run.Status != RunAwaitingApproval {
		return nil
	}
	b, err := r.graphBlueprint(ctx, gs)
	if err != nil {
		return fmt.Errorf("backfill: graph %q batch %d: blueprint: %w", gs.g.Name, run.BatchID, err)
	}
	return r.recordBlueprintEvent(ctx, audit, run, gs.g.Name, b)
}

// startGraphRun creates or continues the run of the graph's plan; an
// unfinished run of another plan of the graph is abandoned.
func (r *Runner) startGraphRun(ctx context.Context, gs graphSetup) (Run, error) {
	ctx = withFenceWait(ctx, r.fenceWait("start run of graph "+gs.g.Name))
	run, _, err := r.cfg.Manifest.StartRun(ctx, r.db, gs.plan, r.cfg.WorkerID, false)
	if errors.Is(err, ErrPlanChanged) {
		run, _, err = r.cfg.Manifest.StartRun(ctx, r.db, gs.plan, r.cfg.WorkerID, true)
	}
	if err != nil {
		return Run{}, fmt.Errorf("backfill: graph %q: %w", gs.g.Name, err)
	}
	return run, nil
}

// startJobRun creates or continues the run of rs's plan; a run of
// another plan of the job is replaced.
func (r *Runner) startJobRun(ctx context.Context, g Graph, rs runSetup) (Run, error) {
	ctx = withFenceWait(ctx, r.fenceWait("start run of job "+rs.job.Name))
	run, _, err := r.cfg.Manifest.StartRun(ctx, r.db, rs.plan, r.cfg.WorkerID, false)
	if errors.Is(err, ErrPlanChanged) {
		run, _, err = r.cfg.Manifest.StartRun(ctx, r.db, rs.plan, r.cfg.WorkerID, true)
	}
	if err != nil {
		return Run{}, fmt.Errorf("backfill: graph %q: %w", g.Name, err)
	}
	return run, nil
}

// runGraph is one pass of RunGraph; again asks RunGraph to plan and
// start over (the graph's run was approved while this call waited).
func (r *Runner) runGraph(ctx context.Context, g Graph, begin time.Time) (rep GraphReport, again bool, err error) {
	gs, err := r.planGraph(ctx, g)
	if err != nil {
		return GraphReport{}, false, err
	}
	grun, err := r.startGraphRun(ctx, gs)
	if err != nil {
		return GraphReport{}, false, err
	}
	rep = GraphReport{BatchID: grun.BatchID, Fingerprint: gs.plan.Fingerprint, Status: grun.Status}
	if err := r.recordGraphBlueprint(ctx, gs, grun); err != nil {
		return rep, false, err
	}
	switch grun.Status {
	case RunAwaitingApproval:
		aerr := r.awaitingGraphErr(ctx, g.Name, grun)
		if r.cfg.ReturnOnPause || r.caps.control == nil {
			rep.Modules = gs.pendingModules()
			return rep, false, aerr
		}
		if err := r.waitApproved(ctx, Job{Name: g.Name}, grun, true); err != nil {
			return rep, false, err
		}
		return rep, true, nil
	case RunPaused:
		// Paused by an operator (the graph's run): wait for the resume
		// as Run does, unless the caller asked to return on a pause.
		perr := r.pausedErr(Job{Name: g.Name}, grun)
		if r.cfg.ReturnOnPause || r.caps.control == nil {
			return rep, false, perr
		}
		if err := r.waitGraphResumed(ctx, g.Name, grun); err != nil {
			return rep, false, errors.Join(perr, err)
		}
		return rep, true, nil
	case RunRunning, RunCompleted:
	default:
		return rep, false, fmt.Errorf("backfill: graph %q batch %d: %w: the graph's run is %s", g.Name, grun.BatchID, ErrRunStatus, grun.Status)
	}
	s := &graphSched{r: r, gs: gs, grun: grun, log: r.cfg.Logger.With("graph", g.Name, "batch_id", grun.BatchID)}
	if err := s.start(ctx); err != nil {
		return rep, false, err
	}
	runErr := s.run(ctx)
	fctx := context.WithoutCancel(ctx)
	if err := s.refresh(fctx); err != nil {
		return rep, false, errors.Join(runErr, err)
	}
	rep.Modules = s.statuses()
	rep.Chunks = s.loaded
	incomplete := []string{}
	for _, m := range rep.Modules {
		if m.State != backfilltype.ModuleCompleted && m.State != backfilltype.ModuleDisabled {
			incomplete = append(incomplete, fmt.Sprintf("%s %s (%s)", m.Name, m.State, m.Reason))
		}
	}
	if len(incomplete) == 0 && runErr == nil && grun.Status == RunRunning {
		fin, err := r.cfg.Manifest.FinishRun(fctx, r.db, grun.BatchID, false, "")
		if err != nil {
			return rep, false, err
		}
		rep.Status = fin.Status
	}
	rep.Elapsed = time.Since(begin)
	if errors.Is(runErr, ErrRunPaused) && !r.cfg.ReturnOnPause && r.caps.control != nil && ctx.Err() == nil && !r.draining.Load() {
		// The graph's run was paused during the call, the chunks in
		// flight are checkpointed: the next round waits for the resume.
		return rep, true, nil
	}
	if runErr != nil {
		return rep, false, runErr
	}
	if len(incomplete) > 0 {
		return rep, false, fmt.Errorf("backfill: graph %q batch %d: %w: %s", g.Name, grun.BatchID, ErrGraphIncomplete, strings.Join(incomplete, "; "))
	}
	r.cfg.Logger.Info("backfill: graph completed", "graph", g.Name, "batch_id", grun.BatchID, "chunks", rep.Chunks, "elapsed", rep.Elapsed)
	return rep, false, nil
}

// waitGraphResumed waits, reading the graph's run's status every
// ThrottleInterval, while it is paused. It returns nil once the run is no
// longer paused (the caller starts the call again), and an error when
// ctx ends or the Runner is drained first. Nothing is claimed meanwhile.
func (r *Runner) waitGraphResumed(ctx context.Context, graph string, run Run) error {
	r.cfg.Logger.Warn("backfill: graph's run is paused: this call waits for the resume (claims nothing)", "graph", graph, "batch_id", run.BatchID,
		"resume", r.resumeHint(run.BatchID))
	for {
		st, err := r.caps.control.Control(ctx, r.db, run.BatchID)
		if err == nil && st.Status != RunPaused {
			return nil
		}
		if err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("backfill: reading the graph's run failed while paused; trying again", "graph", graph, "error", err)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-r.drained:
			return errors.New("backfill: the Runner was drained (Runner.Drain)")
		case <-time.After(r.cfg.throttleInterval()):
		}
	}
}

// pendingModules is the modules of a graph none of whose jobs started.
func (gs graphSetup) pendingModules() []ModuleStatus {
	ms := make([]ModuleStatus, len(gs.plan.Modules))
	for i, pm := range gs.plan.Modules {
		ms[i] = ModuleStatus{Name: pm.Name, DependsOn: pm.DependsOn, Priority: pm.Priority, Class: pm.Class, Enabled: pm.Enabled, Jobs: []backfilltype.ModuleJobStatus{}}
		for k, j := range pm.Jobs {
			total := gs.jobs[i][k].plan.Len()
			ms[i].Jobs = append(ms[i].Jobs, backfilltype.ModuleJobStatus{Job: j.Name, ChunksTotal: total})
			ms[i].ChunksTotal += total
		}
	}
	backfilltype.SettleModules(ms)
	return ms
}

// awaitingGraphErr is the error of a RunGraph whose graph's run awaits
// approval.
func (r *Runner) awaitingGraphErr(ctx context.Context, graph string, run Run) error {
	st, err := r.Approvals(ctx, run.BatchID)
	if err != nil {
		return errors.Join(fmt.Errorf("backfill: graph %q batch %d: %w", graph, run.BatchID, ErrAwaitingApproval), err)
	}
	return fmt.Errorf("backfill: graph %q batch %d: %w: %s", graph, run.BatchID, ErrAwaitingApproval, pgstore.AwaitingText(r.schemaName(), st))
}

// graphSched runs the chunks of a graph's enabled modules in one call.
type graphSched struct {
	r    *Runner
	gs   graphSetup
	grun Run
	log  *slog.Logger
	mods []*graphMod
	jobs []*graphJob

	// throttle: the states of Config.Throttles and how many hold;
	// periods are the ids of their open throttle periods (0: none).
	states  []*hysteresis.State
	held    int
	periods []int64
	// worker is the call's worker of the graph's run (registered and
	// heartbeating while it runs): its throttle periods tell every
	// process that the call's holds park the deferrable modules
	// (GraphStatus).
	worker *execution
	// shed: while a throttle holds, a deferrable module has chunks
	// left, which the hold parks; the essential modules then keep their
	// concurrency.
	shed      bool
	checkedAt time.Time
	polledAt  time.Time
	// stop says why the call stops claiming (the graph's run no longer
	// running); nil while it runs.
	stop   error
	loaded int
}

type graphMod struct {
	i       int
	m       Module
	enabled bool
	parents []*graphMod
	jobs    []*graphJob
	parked  bool
	// inflight counts the module's chunks in flight; busy says why a
	// chunk of it last came back unloaded (a lock wait on its target,
	// another process holding it: "" since one of its chunks loaded):
	// while it is set, the module runs at most one chunk at a time
	// while other modules have chunks ready (graphSched.run).
	inflight int
	busy     string
}

type graphJob struct {
	mod    *graphMod
	rs     runSetup
	run    Run
	chunks []*graphChunk
	// failure is why this call stopped working the job without the
	// manifest saying so (an error before a chunk's try).
	failure  string
	reason   string
	inflight int
	// loaded counts the chunks of the job this call loaded.
	loaded int
}

type graphChunk struct {
	job      *graphJob
	c        Chunk
	status   ChunkStatus
	attempts int
	rows     int64
	deps     []*graphChunk
	inflight bool
	// notBefore is when the chunk may be tried again (a backoff, or
	// another process holding it).
	notBefore time.Time
}

// done reports whether the chunk was loaded (done, or open: loaded and
// read again by a later run).
func (c *graphChunk) done() bool { return c.status == ChunkDone || c.status == ChunkOpen }

// start starts the runs of the enabled modules' jobs and reads their
// chunks and dependencies.
func (s *graphSched) start(ctx context.Context) error {
	g := s.gs.g
	for i, m := range g.Modules {
		gm := &graphMod{i: i, m: m, enabled: s.gs.enabled[i]}
		s.mods = append(s.mods, gm)
		for k := range m.Jobs {
			gj := &graphJob{mod: gm, rs: s.gs.jobs[i][k]}
			gm.jobs = append(gm.jobs, gj)
			s.jobs = append(s.jobs, gj)
		}
	}
	for _, gm := range s.mods {
		for _, d := range gm.m.DependsOn {
			gm.parents = append(gm.parents, s.mods[g.moduleIndex(d)])
		}
	}
	// A module under a disabled one (even indirectly) is held: its jobs'
	// runs are not started.
	off := make([]bool, len(s.mods))
	for _, i := range s.gs.order {
		gm := s.mods[i]
		off[i] = !gm.enabled
		for _, p := range gm.parents {
			off[i] = off[i] || off[p.i]
		}
	}
	for _, i := range s.gs.order {
		gm := s.mods[i]
		if off[i] {
			continue
		}
		for _, gj := range gm.jobs {
			run, err := s.r.startJobRun(ctx, g, gj.rs)
			if err != nil {
				return err
			}
			gj.run = run
			if err := s.readChunks(ctx, gj); err != nil {
				return err
			}
		}
	}
	for _, gj := range s.jobs {
		for _, p := range gj.mod.parents {
			for _, pj := range p.jobs {
				idx := newSpanIndex(pj.chunks)
				for _, c := range gj.chunks {
					c.deps = idx.overlapping(c, c.deps)
				}
			}
		}
	}
	for _, th := range s.r.cfg.Throttles {
		s.states = append(s.states, &hysteresis.State{Throttle: th, ConfigHigh: th.High, ConfigLow: th.Low})
	}
	s.periods = make([]int64, len(s.states))
	return nil
}

// spanIndex finds the chunks of a parent job that a child's chunk waits
// for: by binary search over the parent's chunks sorted by their lower
// bound when they are all of one range kind and do not overlap (a
// range chunker's), else by comparing every chunk.
type spanIndex struct {
	chunks []*graphChunk
	kind   backfilltype.ChunkKind // KindTime or KindInt when sorted; "" otherwise
}

func newSpanIndex(chunks []*graphChunk) spanIndex {
	sorted := slices.Clone(chunks)
	if len(sorted) == 0 {
		return spanIndex{}
	}
	kind := sorted[0].c.Kind
	if kind != backfilltype.KindTime && kind != backfilltype.KindInt {
		return spanIndex{chunks: chunks}
	}
	for _, c := range sorted {
		if c.c.Kind != kind {
			return spanIndex{chunks: chunks}
		}
	}
	slices.SortFunc(sorted, func(a, b *graphChunk) int { return cmpLower(a.c, b.c) })
	for i := 1; i < len(sorted); i++ {
		if overlaps(sorted[i-1].c, sorted[i].c) {
			return spanIndex{chunks: chunks}
		}
	}
	return spanIndex{chunks: sorted, kind: kind}
}

// cmpLower compares the lower bounds of two chunks of one range kind.
func cmpLower(a, b Chunk) int {
	if a.Kind == backfilltype.KindTime {
		return a.Start.Compare(b.Start)
	}
	return cmp.Compare(a.Lo, b.Lo)
}

// overlapping appends to deps the indexed chunks child c waits for.
func (x spanIndex) overlapping(c *graphChunk, deps []*graphChunk) []*graphChunk {
	if x.kind == "" || c.c.Kind != x.kind {
		for _, p := range x.chunks {
			if overlaps(c.c, p.c) {
				deps = append(deps, p)
			}
		}
		return deps
	}
	// The first chunk that ends after c starts; then on while they start
	// before c ends.
	i, _ := slices.BinarySearchFunc(x.chunks, c, func(p, c *graphChunk) int {
		if overlaps(c.c, p.c) || !endsBefore(p.c, c.c) {
			return 1
		}
		return -1
	})
	for ; i < len(x.chunks) && overlaps(c.c, x.chunks[i].c); i++ {
		deps = append(deps, x.chunks[i])
	}
	return deps
}

// endsBefore reports whether range chunk p ends at or before c starts.
func endsBefore(p, c Chunk) bool {
	if p.Kind == backfilltype.KindTime {
		return !p.End.After(c.Start)
	}
	return p.Hi <= c.Lo
}

// overlaps reports whether child chunk c must wait for parent chunk p:
// their intervals overlap when both are time ranges or both integer
// ranges; chunks of other kinds always wait.
func overlaps(c, p Chunk) bool {
	switch {
	case c.Kind == backfilltype.KindTime && p.Kind == backfilltype.KindTime:
		return c.Start.Before(p.End) && p.Start.Before(c.End)
	case c.Kind == backfilltype.KindInt && p.Kind == backfilltype.KindInt:
		return c.Lo < p.Hi && p.Lo < c.Hi
	}
	return true
}

// readChunks reads gj's run's chunks from the manifest.
func (s *graphSched) readChunks(ctx context.Context, gj *graphJob) error {
	states, err := s.r.cfg.Manifest.Chunks(ctx, s.r.db, gj.run.BatchID)
	if err != nil {
		return fmt.Errorf("backfill: graph %q: job %q batch %d: chunks: %w", s.gs.g.Name, gj.rs.job.Name, gj.run.BatchID, err)
	}
	if gj.chunks == nil {
		for _, st := range states {
			gj.chunks = append(gj.chunks, &graphChunk{job: gj, c: st.Chunk})
		}
	}
	for i, st := range states {
		if i < len(gj.chunks) {
			c := gj.chunks[i]
			c.status, c.attempts, c.rows = st.Status, st.Attempts, st.Read
		}
	}
	return nil
}

// refresh reads the jobs' runs and chunks again (the report's figures).
func (s *graphSched) refresh(ctx context.Context) error {
	for _, gj := range s.jobs {
		if gj.run.BatchID == 0 {
			continue
		}
		if err := s.readChunks(ctx, gj); err != nil {
			return err
		}
		if run, err := s.r.runOf(ctx, gj.run.BatchID); err == nil {
			gj.run.Status = run.Status
			if gj.reason == "" {
				gj.reason = run.LastError
			}
		}
		// Done by this call or another (a process that died after
		// its last chunk): the run is judged and its end recorded.
		s.endJob(ctx, gj)
	}
	return nil
}

// statuses settles the modules' states from what the call knows.
func (s *graphSched) statuses() []ModuleStatus {
	ms := make([]ModuleStatus, len(s.mods))
	for i, gm := range s.mods {
		pm := s.gs.plan.Modules[i]
		m := ModuleStatus{Name: pm.Name, DependsOn: pm.DependsOn, Priority: pm.Priority, Class: pm.Class, Enabled: pm.Enabled, Jobs: []backfilltype.ModuleJobStatus{}}
		for _, gj := range gm.jobs {
			js := backfilltype.ModuleJobStatus{Job: gj.rs.job.Name, BatchID: gj.run.BatchID, Status: gj.run.Status, ChunksTotal: len(gj.chunks)}
			if gj.run.BatchID == 0 {
				// No run (a disabled or held module): its plan's chunks.
				js.ChunksTotal = gj.rs.plan.Len()
			}
			if gj.failure != "" && js.Status == RunRunning {
				js.Status = RunFailed
			}
			for _, c := range gj.chunks {
				if c.done() {
					js.ChunksDone++
					js.Rows += c.rows
				}
			}
			if (js.Status == RunFailed || js.Status == RunPaused) && m.Reason == "" {
				m.Reason = "job " + gj.rs.job.Name + ": " + cmp.Or(gj.failure, gj.reason, string(js.Status))
				m.State = backfilltype.ModuleFailed
				if js.Status == RunPaused {
					m.State = backfilltype.ModulePaused
				}
			}
			m.ChunksDone += js.ChunksDone
			m.ChunksTotal += js.ChunksTotal
			m.Rows += js.Rows
			m.Jobs = append(m.Jobs, js)
		}
		ms[i] = m
	}
	backfilltype.SettleModules(ms)
	for i, gm := range s.mods {
		if gm.parked && (ms[i].State == backfilltype.ModulePending || ms[i].State == backfilltype.ModuleRunning) {
			ms[i].State, ms[i].Reason = backfilltype.ModuleParked, "deferrable: parked while a throttle holds"
		}
		if gm.busy != "" && (ms[i].State == backfilltype.ModulePending || ms[i].State == backfilltype.ModuleRunning) {
			ms[i].Waiting = gm.busy
		}
	}
	return ms
}

// blocked reports whether the modules' chunks may not run now: the
// module is settled failed, paused, disabled or held.
func (s *graphSched) blocked() []bool {
	ms := s.statuses()
	out := make([]bool, len(ms))
	for i, m := range ms {
		switch m.State {
		case backfilltype.ModuleFailed, backfilltype.ModulePaused, backfilltype.ModuleDisabled, backfilltype.ModuleHeld:
			out[i] = true
		}
	}
	return out
}

// graphResult is the outcome of one chunk's call.
type graphResult struct {
	c   *graphChunk
	rep ChunkRunReport
	err error
}

// run runs the chunks until none is left to run now or later, ctx ends,
// or the graph's run stops running. Its error is ctx's, or why the
// graph's run stopped.
func (s *graphSched) run(ctx context.Context) error {
	cfg := s.r.cfg
	interval := cfg.throttleInterval()
	concurrency := max(1, cfg.Concurrency)
	results := make(chan graphResult)
	if s.grun.Status == RunRunning {
		s.worker = &execution{r: s.r, job: Job{Name: s.gs.g.Name}, batchID: s.grun.BatchID, log: s.log}
		s.worker.startWorker(ctx)
		defer s.stopWorker(context.WithoutCancel(ctx))
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	inflight := 0
	for {
		now := time.Now()
		if ctx.Err() == nil && s.stop == nil {
			s.checkThrottle(ctx, now, interval)
			s.pollGraph(ctx, now, interval)
		}
		var ready []*graphChunk
		waiting := false
		if ctx.Err() == nil && s.stop == nil {
			ready, waiting = s.ready(now)
		}
		readyMods := map[*graphMod]bool{}
		for _, c := range ready {
			readyMods[c.job.mod] = true
		}
		for _, c := range ready {
			if inflight >= concurrency {
				break
			}
			if gm := c.job.mod; gm.busy != "" && gm.inflight >= min(1, concurrency-1) && len(readyMods) > 1 {
				// A module whose chunks come back unloaded (waiting
				// on a locked target) takes no more than one slot,
				// none with a concurrency of one, while another
				// module has chunks ready: it cannot hold every slot
				// while independent modules wait.
				continue
			}
			if s.held > 0 && !s.shed && inflight > 0 {
				// A hold sheds deferrable work first: while a
				// deferrable module has chunks left (parked), the
				// essential ones keep their concurrency; with none
				// left to park, they run one chunk at a time.
				break
			}
			if cfg.JobConcurrency > 0 && c.job.inflight >= cfg.JobConcurrency {
				continue
			}
			c.inflight = true
			c.job.inflight++
			c.job.mod.inflight++
			inflight++
			call := ChunkCall{BatchID: c.job.run.BatchID, Seq: c.c.Seq, Final: c.attempts+1 >= cfg.MaxAttempts}
			others := make([]int, 0, len(c.job.chunks)-1)
			for _, o := range c.job.chunks {
				if o != c {
					others = append(others, o.c.Seq)
				}
			}
			// The job's run as now: handle updates it while the chunk
			// runs.
			rs, run := c.job.rs, c.job.run
			wg.Add(1)
			go func() {
				defer wg.Done()
				rep, err := s.r.runPlannedChunk(ctx, rs, run, others, call, false)
				results <- graphResult{c: c, rep: rep, err: err}
			}()
		}
		if inflight == 0 && !waiting {
			return cmp.Or(ctx.Err(), s.stop)
		}
		var tick <-chan time.Time
		var timer *time.Timer
		if waiting {
			timer = time.NewTimer(interval)
			tick = timer.C
		}
		select {
		case res := <-results:
			inflight--
			s.handle(ctx, res)
		case <-tick:
		case <-ctx.Done():
			if inflight == 0 {
				return ctx.Err()
			}
			res := <-results
			inflight--
			s.handle(ctx, res)
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// ready returns the chunks that may run now, the highest priority first
// (ties: the graph's order of modules, then the jobs', then plan order),
// and whether chunks wait for something that passes (a backoff, a
// throttle's hold, another process, a parent's chunk still to run).
func (s *graphSched) ready(now time.Time) ([]*graphChunk, bool) {
	blocked := s.blocked()
	var ready []*graphChunk
	waiting := false
	s.shed = false
	for _, gm := range s.mods {
		gm.parked = false
		if !gm.enabled || blocked[gm.i] {
			continue
		}
		for _, gj := range gm.jobs {
			if gj.run.Status != RunRunning || gj.failure != "" {
				continue
			}
			for _, c := range gj.chunks {
				if c.done() || c.inflight || c.status == "rolled_back" {
					continue
				}
				if s.held > 0 && gm.m.Class == ModuleDeferrable {
					// Deferrable work left: the hold parks it (below,
					// or as it becomes ready).
					s.shed = true
				}
				if now.Before(c.notBefore) {
					waiting = true
					continue
				}
				depsDone := true
				for _, d := range c.deps {
					if !d.done() {
						depsDone = false
						break
					}
				}
				if !depsDone {
					// A parent's chunk still to run (or held: then the
					// module is held and skipped above).
					waiting = true
					continue
				}
				if s.held > 0 && gm.m.Class == ModuleDeferrable {
					gm.parked = true
					waiting = true
					continue
				}
				ready = append(ready, c)
			}
		}
	}
	slices.SortStableFunc(ready, func(a, b *graphChunk) int {
		return cmp.Compare(b.job.mod.m.Priority, a.job.mod.m.Priority)
	})
	if len(ready) > 0 {
		waiting = false
	}
	if !waiting {
		return ready, false
	}
	return ready, true
}

// handle records the outcome of a chunk's call.
func (s *graphSched) handle(ctx context.Context, res graphResult) {
	c, gj := res.c, res.c.job
	c.inflight = false
	gj.inflight--
	gj.mod.inflight--
	cfg := s.r.cfg
	switch res.rep.Outcome {
	case ChunkLoaded:
		c.status, c.rows = ChunkDone, res.rep.Result.Read
		if res.rep.Result.Open {
			c.status = ChunkOpen
		}
		s.loaded++
		gj.loaded++
		gj.mod.busy = ""
		if res.rep.RunStatus != "" {
			gj.run.Status = res.rep.RunStatus
			gj.reason = res.rep.Reason
		}
		s.endJob(ctx, gj)
	case ChunkAlreadyDone:
		c.status = ChunkDone
		s.endJob(ctx, gj)
	case ChunkBusy:
		c.notBefore = time.Now().Add(cfg.throttleInterval())
		gj.mod.busy = cmp.Or(res.rep.Reason, "chunk "+c.c.ID+" held by another process")
	case ChunkRunPaused, ChunkRunEnded:
		gj.run.Status, gj.reason = res.rep.RunStatus, res.rep.Reason
	case ChunkAttemptFailed:
		if ctx.Err() != nil {
			return
		}
		if res.rep.Final {
			gj.run.Status = cmp.Or(res.rep.RunStatus, RunFailed)
			gj.reason = fmt.Sprintf("chunk %s failed: %v", c.c.ID, res.err)
			return
		}
		c.attempts++
		backoff := cfg.RetryBackoff << min(c.attempts-1, 16)
		c.notBefore = time.Now().Add(min(backoff, time.Duration(math.MaxInt64/2)))
		s.log.Warn("backfill: graph chunk failed; tried again", "job", gj.rs.job.Name, "chunk", c.c.ID, "attempt", c.attempts, "error", res.err)
	default:
		// An error before the chunk's try (planning, reading the run):
		// nothing is recorded; the job stops in this call.
		if ctx.Err() != nil {
			return
		}
		gj.failure = fmt.Sprint(res.err)
		s.log.Warn("backfill: graph job stopped in this call", "job", gj.rs.job.Name, "chunk", c.c.ID, "error", res.err)
	}
}

// endJob ends gj's run once every chunk of it is loaded and none is in
// flight, as a call of Run ends its run: judged by the gates Run judges
// a run by at its end ("no row loaded" when this call loaded chunks of
// it, the run reject rate over the batch's totals), then its end
// recorded (Runner.endRun). A gate that fails pauses the run: the
// module is paused and holds its descendants.
func (s *graphSched) endJob(ctx context.Context, gj *graphJob) {
	if gj.run.Status != RunRunning || gj.inflight > 0 || gj.failure != "" || len(gj.chunks) == 0 {
		return
	}
	for _, c := range gj.chunks {
		if !c.done() {
			return
		}
	}
	run, err := s.r.endRun(ctx, gj.rs, gj.run, gj.loaded)
	if err != nil {
		gj.failure = fmt.Sprintf("the end of its run: %v", err)
		s.log.Warn("backfill: graph job's run not ended; the next call tries again", "job", gj.rs.job.Name, "error", err)
		return
	}
	gj.run.Status = run.Status
	if run.Status != RunCompleted {
		gj.reason = run.LastError
	}
}

// pollGraph reads the graph's run's status at most once per interval:
// a run paused by an operator, or abandoned by a flag switched (a plan
// change), stops the call's claims.
func (s *graphSched) pollGraph(ctx context.Context, now time.Time, interval time.Duration) {
	if now.Sub(s.polledAt) < interval {
		return
	}
	s.polledAt = now
	run, err := s.r.runOf(ctx, s.grun.BatchID)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("backfill: reading the graph's run failed; trying again", "error", err)
		}
		return
	}
	switch run.Status {
	case RunRunning, RunCompleted:
	case RunAbandoned:
		s.stop = fmt.Errorf("backfill: graph %q batch %d: %w: the graph's run was abandoned (%s): run the graph again for its new plan", s.gs.g.Name, run.BatchID, ErrPlanChanged, run.LastError)
	case RunPaused:
		s.stop = s.r.pausedErr(Job{Name: s.gs.g.Name}, run)
	default:
		s.stop = fmt.Errorf("backfill: graph %q batch %d: %w: the graph's run is %s", s.gs.g.Name, run.BatchID, ErrRunStatus, run.Status)
	}
}

// checkThrottle reads Config.Throttles' signals at most once per
// interval and counts the holds: while one holds, deferrable modules
// park and essential ones run one chunk at a time. A reading that fails
// keeps the throttle's state; a value at or above Critical holds too
// (a graph's call pauses no run).
func (s *graphSched) checkThrottle(ctx context.Context, now time.Time, interval time.Duration) {
	if len(s.states) == 0 || now.Sub(s.checkedAt) < interval {
		return
	}
	s.checkedAt = now
	for i, h := range s.states {
		if h.Throttle.Signal == nil {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, interval)
		v, err := h.Throttle.Signal.Read(rctx, s.r.db, backfillthrottle.SignalScope{BatchID: s.grun.BatchID})
		cancel()
		if err != nil {
			s.log.Warn("backfill: graph throttle signal unreadable; its state is kept", "signal", h.Throttle.Signal.Name(), "error", err)
			continue
		}
		switch h.Observe(now, v) {
		case hysteresis.Hold:
			s.held++
			s.openPeriod(ctx, i, v)
			s.log.Warn("backfill: graph throttle hold: deferrable modules park first, essential ones run on (one chunk at a time once no deferrable work is left)", "signal", h.Throttle.Signal.Name(), "value", v)
		case hysteresis.Release:
			s.held--
			s.closePeriod(ctx, i, v)
			s.log.Info("backfill: graph throttle release", "signal", h.Throttle.Signal.Name(), "value", v)
		}
	}
}

// openPeriod records the hold of throttle i (its signal read v) as a
// throttle period of the graph's run by the call's worker: while it is
// open and the worker alive, GraphStatus shows the deferrable modules
// parked.
func (s *graphSched) openPeriod(ctx context.Context, i int, v float64) {
	tm := s.r.caps.throttle
	if tm == nil || s.worker == nil || s.worker.worker == nil {
		return
	}
	id, err := tm.OpenPeriod(ctx, s.r.db, holdPeriod(s.grun.BatchID, s.worker.worker.key, s.states[i], v))
	if err != nil {
		s.log.Warn("backfill: graph throttle period not recorded", "signal", s.states[i].Throttle.Signal.Name(), "error", err)
		return
	}
	s.periods[i] = id
}

// closePeriod ends the throttle period of throttle i, its signal at v.
func (s *graphSched) closePeriod(ctx context.Context, i int, v float64) {
	tm := s.r.caps.throttle
	if tm == nil || s.periods[i] == 0 {
		return
	}
	if err := tm.ClosePeriod(ctx, s.r.db, s.periods[i], finite(v)); err != nil {
		s.log.Warn("backfill: graph throttle period not closed", "signal", s.states[i].Throttle.Signal.Name(), "error", err)
	}
	s.periods[i] = 0
}

// stopWorker ends the call's open throttle periods (at the signal's
// last reading) and marks its worker finished.
func (s *graphSched) stopWorker(ctx context.Context) {
	for i, h := range s.states {
		s.closePeriod(ctx, i, h.LastRead)
	}
	s.worker.stopWorker()
}
