package backfill

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
)

// Graphs of modules. A backfill made of parts that depend on each other
// (airports, then flights, then statistics built from both) is a [Graph]
// of [Module]s, each one or more jobs, frozen into one plan whose
// fingerprint covers the modules, their dependencies, priorities,
// classes, flags and every job's own plan fingerprint. [Runner.RunGraph]
// runs it on the chunk path of [Runner.RunChunk]; each job keeps its own
// run, chunks and rollback, and the graph's own run (a run of the graph's
// name with no chunks) carries the graph's plan and its approvals.

// ModuleClass is how a module behaves under a throttle's hold:
// [ModuleDeferrable] parks until the hold releases, [ModuleEssential]
// (the default) keeps running: a hold sheds the deferrable modules' work
// first, and only when none is left does it slow the essential ones to
// one chunk at a time.
type ModuleClass = backfilltype.ModuleClass

const (
	// ModuleEssential: runs while a throttle holds, with its concurrency
	// while deferrable modules have chunks left (they park), one chunk
	// at a time once they have none (the default: a Module with Class
	// "").
	ModuleEssential = backfilltype.ModuleEssential
	// ModuleDeferrable: claims no chunk while a throttle holds.
	ModuleDeferrable = backfilltype.ModuleDeferrable
)

// Module is one part of a [Graph]: jobs that are processed, validated
// and rolled back together, after the modules they depend on.
type Module struct {
	// Name names the module within its graph: required, unique, at most
	// 200 bytes.
	Name string
	// Jobs are the module's jobs: at least one, each a job of this
	// module alone (by name) in the graph. A module's jobs do not wait
	// for each other (split jobs that do into modules); each must publish
	// per chunk, and may not set SkipUnchanged, NewRun or Approval (the
	// graph's Approval governs): [ErrInvalidConfig] or [ErrUnsupported]
	// otherwise, naming the module and the job.
	Jobs []Job
	// DependsOn names the modules this one depends on (its parents): a
	// chunk of this module runs only after the chunks of every parent
	// that overlap it have been loaded (committed). Two chunks are
	// compared by their bounds when both are time ranges or both integer
	// ranges; otherwise the module waits for its parents' every chunk.
	// Each name must be a module of the graph, and the dependencies may
	// not form a cycle.
	DependsOn []string
	// Priority orders the chunks ready to run: higher first. Default 0;
	// ties go to the module listed first.
	Priority int
	// Class is the module's behaviour under a throttle's hold ("" is
	// ModuleEssential).
	Class ModuleClass
	// Disabled is the module's flag until one is switched: a disabled
	// module's jobs do not run (no run of them is started), and the
	// modules that depend on it, even indirectly, are held. Its jobs are
	// still planned (their targets must exist): their plans'
	// fingerprints are part of the graph's. Once a flag is switched for the graph's
	// module ([Runner.SetModuleEnabled], the SQL function
	// set_module_flag, "backfill module enable|disable"), the latest
	// switch recorded in the manifest wins over this field.
	Disabled bool
}

// Graph is a backfill made of modules with dependencies: one frozen plan
// ([Runner.RunGraph], [Runner.GraphBlueprint]).
type Graph struct {
	// Name names the graph: its run is a run of this name in the
	// manifest, so it may not be the name of one of its jobs. Required.
	Name string
	// Modules are the graph's modules, at least one; their order breaks
	// ties of Priority and is the order of blueprints and status.
	Modules []Module
	// Approval makes each run of the graph's plan await approvals of its
	// fingerprint ([Runner.Approve] with the graph's run's batch ID, the
	// SQL function approve, "backfill approve") before any module's job
	// starts. Zero: no approval needed.
	Approval ApprovalPolicy
}

// ModuleStatus is the progress of one module: its state (pending,
// running, held by an ancestor, parked, paused, disabled, completed,
// failed), chunks done of total, rows read, its jobs' runs, and what its
// chunks wait for when the manifest knows.
type ModuleStatus = backfilltype.ModuleStatus

// GraphStatus is a graph's latest run and the progress of each of its
// modules ([Runner.GraphStatus]).
type GraphStatus = backfilltype.GraphStatus

// GraphReport is the outcome of [Runner.RunGraph].
type GraphReport struct {
	// BatchID, Fingerprint and Status are the graph's run's: its plan's
	// fingerprint (what approvals bind to) and its status after the
	// call (completed when every enabled module completed).
	BatchID     int64
	Fingerprint string
	Status      RunStatus
	// Modules is each module's progress after the call, in the graph's
	// order.
	Modules []ModuleStatus
	// Chunks is how many chunks this call loaded.
	Chunks  int
	Elapsed time.Duration
}

// ErrGraphIncomplete is returned by [Runner.RunGraph] when it returns
// with enabled modules not completed: failed, paused (by an operator, a
// validation gate, a throttle's critical level) or held by such an
// ancestor or by a disabled one. The message names each of them and
// what holds it; the report's Modules say the same. The modules that
// nothing held ran to their end.
var ErrGraphIncomplete = errors.New("backfill: graph incomplete")

// RunGraph freezes g into one plan (each job prepared and planned as
// [Runner.Run] would, the modules with their dependencies, priorities,
// classes and flags) and runs it: it creates or continues the graph's
// run (a run named g.Name with no chunks of its own), and then each
// enabled module's jobs' runs, and runs their chunks in this process on
// the path of [Runner.RunChunk], up to Config.Concurrency at once (and
// Config.JobConcurrency per job): a chunk only once the chunks of its
// module's parents that overlap it have been loaded, the ready chunk of
// the highest Priority first; a module whose chunks come back unloaded
// (waiting on a locked target, held by another process) takes at most one
// of the slots while other modules have chunks ready (none with a
// Concurrency of 1). Once a job's chunks are all loaded, its run is
// judged and ended as [Runner.Run] ends a run: the "no row loaded" gate
// and the run reject gate over the batch's totals
// ([Job.MaxRunRejectRate]) pause it when they fail. A module that fails,
// is paused or is gated holds only the modules that depend on it; the
// others run on. While one of Config.Throttles holds, deferrable modules
// park (the load a hold sheds first) and essential ones run on, with
// their concurrency while parked deferrable work is left and one chunk
// at a time once none is; each hold is recorded as a throttle period of
// the graph's run by a worker of it that the call registers.
//
// It refuses before writing anything, with an error wrapping
// [ErrInvalidConfig] that names the culprit: an empty graph or module,
// duplicate module names, a job in two modules, a dependency on an
// unknown module, a cycle (its modules in order). A plan that differs
// from the graph's latest run's (a job's plan, a flag, a dependency)
// starts a new run of the graph, with a new fingerprint; an unfinished
// run of the old plan is abandoned, and with it its approvals. With
// g.Approval, the graph's run awaits approvals and RunGraph waits for
// them, as [Runner.Run] does, before any job's run exists (with
// Config.ReturnOnPause, or a manifest without the control plane, it
// returns [ErrAwaitingApproval]). Likewise, while the graph's run is
// paused by an operator (the SQL function pause, "backfill pause" or
// [Runner.Pause] on the graph's name), RunGraph claims nothing, lets the
// chunks in flight finish and waits for the resume; with
// Config.ReturnOnPause, or a manifest without the control plane, it
// returns an error wrapping [ErrRunPaused] that says how to resume. It
// returns [ErrGraphIncomplete] when enabled
// modules are left failed, paused or held; a call again resumes them
// (failed chunks are tried again). Runs of a graph converge after a
// crash: a chunk of a child is never committed before the overlapping
// chunks of its parents, whichever process runs them.
func (r *Runner) RunGraph(ctx context.Context, g Graph) (GraphReport, error) {
	begin := time.Now()
	for {
		rep, again, err := r.runGraph(ctx, g, begin)
		if !again {
			return rep, err
		}
	}
}

// GraphBlueprint returns g's blueprint as a run of it would start now,
// writing nothing (as [Runner.Blueprint] does for a job): Job is the
// graph's name, Fingerprint the graph's, Modules list each module with
// its dependencies, priority, class, flag and jobs, Scope sums the jobs'
// chunks, and Changes what differs from the graph's previous run's plan
// (a flag switched shows as `module.NAME.enabled: "false" -> "true"`).
// Errors as [Runner.RunGraph]'s refusals.
func (r *Runner) GraphBlueprint(ctx context.Context, g Graph) (Blueprint, error) {
	gs, err := r.planGraph(ctx, g)
	if err != nil {
		return Blueprint{}, err
	}
	b, err := r.graphBlueprint(ctx, gs)
	if err != nil {
		return Blueprint{}, fmt.Errorf("backfill: blueprint of graph %q: %w", g.Name, err)
	}
	return b, nil
}

// GraphStatus returns the progress of the graph named graph, from the
// manifest: its latest run with its approvals (and, awaiting approval,
// what is missing and the command that records an approval), and per
// module its state, the ancestor that holds it, chunks done of total
// (a job whose run has not started counts its plan's chunks, from the
// blueprint recorded for the graph's run) and rows, read from the runs
// of its jobs' plans, and what its chunks wait for (a lock on its
// target, with the session that holds it) when the manifest knows. A
// deferrable module with chunks left is parked while a live call of
// [Runner.RunGraph] holds on a throttle (its hold is a throttle period of
// the graph's run). It needs a [PGManifest]; a graph with no run gives
// [ErrRunNotFound].
func (r *Runner) GraphStatus(ctx context.Context, graph string) (GraphStatus, error) {
	pm, _ := r.pgPrivileges()
	if pm == nil {
		return GraphStatus{}, fmt.Errorf("backfill: status of graph %q: %w: needs PGManifest", graph, ErrUnsupported)
	}
	return pm.GraphStatus(ctx, r.db, graph)
}

// SetModuleEnabled switches module of graph on (enabled) or off, as
// actor for the reason why, through the manifest's SQL function
// set_module_flag (an operator role's: "backfill migrate
// --grant-operator"). The switch is a plan change: it is recorded in
// the audit log of the graph's latest run (event
// [backfilltype.EventModuleFlag], with the old and new value and the
// session's database role), the graph's unfinished run (awaiting
// approval, running, paused or failed) is abandoned (its approvals
// cannot complete; a RunGraph in progress lets its chunks in flight
// finish and returns [ErrPlanChanged]), and the next
// [Runner.RunGraph] plans the graph with the new flag: a new
// fingerprint, which needs its own approvals. Switching to the value the
// flag has changes nothing and records nothing. actor and why are
// required ([ErrInvalidConfig]); a graph with no run, or a module it
// does not have, gives [ErrRunNotFound]; a role that may not execute
// set_module_flag [ErrPrivilege]; a manifest other than [PGManifest]
// [ErrUnsupported].
func (r *Runner) SetModuleEnabled(ctx context.Context, graph, module string, enabled bool, actor, why string) error {
	pm, _ := r.pgPrivileges()
	if pm == nil {
		return fmt.Errorf("backfill: set module %q of graph %q: %w: module flags need PGManifest", module, graph, ErrUnsupported)
	}
	if err := pm.Init(ctx, r.db); err != nil {
		return err
	}
	res, err := pm.SetModuleFlag(ctx, r.db, graph, module, enabled, actor, why)
	if err != nil {
		return err
	}
	r.cfg.Logger.Info("backfill: module flag", "graph", graph, "module", module, "enabled", enabled, "result", res, "actor", actor)
	return nil
}

// validate refuses a graph that cannot be planned, naming the culprit;
// it returns the modules in dependency order (parents first, ties in
// the graph's order) as indexes into g.Modules.
func (g Graph) validate() ([]int, error) {
	bad := func(format string, args ...any) ([]int, error) {
		return nil, fmt.Errorf("backfill: graph %q: %w: %s", g.Name, ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if g.Name == "" {
		return bad("Graph.Name is required")
	}
	if len(g.Modules) == 0 {
		return bad("no modules")
	}
	if g.Approval.Approvers < 0 {
		return bad("Graph.Approval.Approvers %d: at least 0 (0: no approval needed)", g.Approval.Approvers)
	}
	index := make(map[string]int, len(g.Modules))
	jobIn := map[string]string{}
	for i, m := range g.Modules {
		switch {
		case m.Name == "":
			return bad("module %d has no name", i)
		case len(m.Name) > 200:
			return bad("module name %.40q...: longer than 200 bytes", m.Name)
		case m.Class != "" && m.Class != ModuleEssential && m.Class != ModuleDeferrable:
			return bad("module %q: Class %q: want %q or %q", m.Name, m.Class, ModuleEssential, ModuleDeferrable)
		}
		if _, dup := index[m.Name]; dup {
			return bad("duplicate module name %q", m.Name)
		}
		index[m.Name] = i
		if len(m.Jobs) == 0 {
			return bad("module %q is empty: it has no jobs", m.Name)
		}
		for _, j := range m.Jobs {
			if j.Name == g.Name {
				return bad("module %q: job %q has the graph's name (the graph's run is a run of that name)", m.Name, j.Name)
			}
			if other, dup := jobIn[j.Name]; dup {
				if other == m.Name {
					return bad("job %q is twice in module %q", j.Name, m.Name)
				}
				return bad("job %q is in two modules: %q and %q", j.Name, other, m.Name)
			}
			jobIn[j.Name] = m.Name
		}
	}
	for _, m := range g.Modules {
		for _, d := range m.DependsOn {
			if _, ok := index[d]; !ok {
				return bad("module %q depends on unknown module %q", m.Name, d)
			}
		}
	}
	if c := g.cycle(index); c != nil {
		return bad("the dependencies form a cycle: %s (each depends on the next)", joinNames(c, " -> "))
	}
	return g.order(index), nil
}

// cycle returns the modules of a dependency cycle of g in order, each
// depending on the next, the first repeated at the end (nil: none). The search starts from the
// modules in the graph's order, so the cycle reported is stable.
func (g Graph) cycle(index map[string]int) []string {
	const (
		unseen = iota
		onPath
		finished
	)
	state := make([]int, len(g.Modules))
	var path []int
	var found []string
	var visit func(i int) bool
	visit = func(i int) bool {
		state[i] = onPath
		path = append(path, i)
		for _, d := range g.Modules[i].DependsOn {
			j := index[d]
			switch state[j] {
			case onPath:
				start := 0
				for k, p := range path {
					if p == j {
						start = k
					}
				}
				for _, p := range path[start:] {
					found = append(found, g.Modules[p].Name)
				}
				found = append(found, g.Modules[j].Name)
				return true
			case unseen:
				if visit(j) {
					return true
				}
			}
		}
		path = path[:len(path)-1]
		state[i] = finished
		return false
	}
	for i := range g.Modules {
		if state[i] == unseen && visit(i) {
			return found
		}
	}
	return nil
}

// order returns g's modules parents first, ties in the graph's order
// (g has no cycle).
func (g Graph) order(index map[string]int) []int {
	done := make([]bool, len(g.Modules))
	out := make([]int, 0, len(g.Modules))
	for len(out) < len(g.Modules) {
		for i, m := range g.Modules {
			if done[i] {
				continue
			}
			ready := true
			for _, d := range m.DependsOn {
				if !done[index[d]] {
					ready = false
					break
				}
			}
			if ready {
				done[i] = true
				out = append(out, i)
				break
			}
		}
	}
	return out
}

// descendants returns the modules that depend on module m (index), even
// indirectly, and m itself, as a set of indexes.
func (g Graph) descendants(m int) map[int]bool {
	set := map[int]bool{m: true}
	for changed := true; changed; {
		changed = false
		for i, mod := range g.Modules {
			if set[i] {
				continue
			}
			for _, d := range mod.DependsOn {
				if set[g.moduleIndex(d)] {
					set[i], changed = true, true
					break
				}
			}
		}
	}
	return set
}

// moduleIndex is the index of module name in g (-1: none).
func (g Graph) moduleIndex(name string) int {
	for i, m := range g.Modules {
		if m.Name == name {
			return i
		}
	}
	return -1
}

func joinNames(names []string, sep string) string {
	s := ""
	for i, n := range names {
		if i > 0 {
			s += sep
		}
		s += fmt.Sprintf("%q", n)
	}
	return s
}
