package backfilltype

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
)

// ModuleClass is how a module of a graph behaves under load: essential
// modules keep running while a throttle holds (one chunk at a time once
// no deferrable work is left to park), deferrable ones park until it
// releases.
type ModuleClass string

const (
	// ModuleEssential modules run while a throttle holds, one chunk at a
	// time. The default ("" is essential).
	ModuleEssential ModuleClass = "essential"
	// ModuleDeferrable modules claim no chunk while a throttle holds.
	ModuleDeferrable ModuleClass = "deferrable"
)

// EventModuleFlag: a module of a graph was enabled or disabled
// (backfill.Runner.SetModuleEnabled, the SQL function set_module_flag,
// "backfill module enable|disable"), recorded on the graph's latest run;
// Actor is the name given, DBRole the session's role; Detail holds
// "graph", "module", "old" and "new" (booleans: enabled before and
// after), "why", and "abandoned" (the batch of the graph's run awaiting
// approval the switch abandoned, when one did).
const EventModuleFlag = "module_flag_set"

// PlanModule is one module of a graph's frozen plan (the runs.plan of the
// graph's run, under "modules"): its jobs with the fingerprints of their
// plans, its dependencies, priority, class and flag. All of it is part of
// the graph's fingerprint.
type PlanModule struct {
	Name      string          `json:"name"`
	Jobs      []PlanModuleJob `json:"jobs"`
	DependsOn []string        `json:"depends_on"`
	Priority  int             `json:"priority"`
	Class     ModuleClass     `json:"class"`
	Enabled   bool            `json:"enabled"`
}

// PlanModuleJob is one job of a [PlanModule] and its plan's fingerprint.
type PlanModuleJob struct {
	Name        string `json:"name"`
	Fingerprint string `json:"fingerprint"`
}

// ModuleState is the state of a module of a graph ([ModuleStatus]).
type ModuleState string

const (
	// ModulePending: enabled, nothing of it loaded yet, nothing holds it.
	ModulePending ModuleState = "pending"
	// ModuleRunning: some of its chunks are loaded, not all.
	ModuleRunning ModuleState = "running"
	// ModuleHeld: an ancestor module (ModuleStatus.HeldBy) is failed,
	// paused or disabled: none of its chunks run until it is not.
	ModuleHeld ModuleState = "held"
	// ModuleParked: a deferrable module waiting for a throttle's hold to
	// release.
	ModuleParked ModuleState = "parked"
	// ModulePaused: one of its jobs' runs is paused (an operator, a
	// validation gate, a throttle's critical level); its descendants are
	// held.
	ModulePaused ModuleState = "paused"
	// ModuleDisabled: its flag is off; its jobs do not run and its
	// descendants are held.
	ModuleDisabled ModuleState = "disabled"
	// ModuleCompleted: every chunk of every job of it is loaded.
	ModuleCompleted ModuleState = "completed"
	// ModuleFailed: a chunk of one of its jobs failed for good; its
	// descendants are held.
	ModuleFailed ModuleState = "failed"
)

// ModuleStatus is the progress of one module of a graph.
type ModuleStatus struct {
	Name      string      `json:"name"`
	DependsOn []string    `json:"depends_on"`
	Priority  int         `json:"priority"`
	Class     ModuleClass `json:"class"`
	Enabled   bool        `json:"enabled"`
	State     ModuleState `json:"state"`
	// HeldBy names the ancestor module that holds a held module (its
	// nearest one that is failed, paused or disabled).
	HeldBy string `json:"held_by,omitempty"`
	// Reason says why a module is failed, paused, held or parked.
	Reason string `json:"reason,omitempty"`
	// Waiting says, when the manifest knows, what a pending or running
	// module's chunks wait for: a chunk of one of its jobs waiting for a
	// lock now, or the latest recorded wait (a lock timeout) of a chunk
	// not loaded since, with the session that blocks it; "" otherwise.
	Waiting string `json:"waiting,omitempty"`
	// ChunksDone and ChunksTotal count the chunks of the module's jobs'
	// runs (done or open count as done); Rows the rows they read. A
	// job with no run of its plan yet (the graph awaits approval, or its
	// module has not started) counts the chunks of its plan, from the
	// blueprint recorded for the graph's run.
	ChunksDone  int   `json:"chunks_done"`
	ChunksTotal int   `json:"chunks_total"`
	Rows        int64 `json:"rows"`
	// Jobs are the module's jobs and their runs, in the module's order.
	Jobs []ModuleJobStatus `json:"jobs"`
}

// ModuleJobStatus is one job of a module and its run (BatchID 0: no run
// of the job's plan yet: ChunksTotal is then its plan's, when known).
type ModuleJobStatus struct {
	Job         string    `json:"job"`
	BatchID     int64     `json:"batch_id,omitempty"`
	Status      RunStatus `json:"status,omitempty"`
	ChunksDone  int       `json:"chunks_done"`
	ChunksTotal int       `json:"chunks_total"`
	Rows        int64     `json:"rows"`
}

// GraphStatus is the progress of a graph of modules: its latest run (the
// run of the graph's plan: BatchID, Status, Fingerprint) and each of its
// modules, in the graph's order.
type GraphStatus struct {
	Graph       string    `json:"graph"`
	BatchID     int64     `json:"batch_id"`
	Status      RunStatus `json:"status"`
	Fingerprint string    `json:"fingerprint"`
	// Approval is the graph's run's approval policy, author and
	// approvals so far (nil when the graph has no approval policy).
	Approval *ApprovalState `json:"approval,omitempty"`
	// Waiting says what the graph's run waits for before any module
	// runs: the approvals missing and the commands that record one
	// (awaiting approval); "" otherwise.
	Waiting string         `json:"waiting,omitempty"`
	Modules []ModuleStatus `json:"modules"`
}

// SettleModules sets the State, HeldBy and Reason of each module of ms
// (a graph's modules, each with its Enabled flag and its jobs' runs set)
// from its flag and its jobs' runs: disabled; failed when a job's run is
// failed, cancelled, abandoned or rolled back; paused when one is
// paused; completed when every job's run is; running when a chunk is
// done; pending otherwise. Then every pending or running module whose
// ancestor is failed, paused, disabled or held is held, HeldBy
// naming the nearest such ancestor that is not itself held. A Reason
// already set is kept for failed and paused modules.
func SettleModules(ms []ModuleStatus) {
	index := make(map[string]int, len(ms))
	for i, m := range ms {
		index[m.Name] = i
	}
	for i := range ms {
		m := &ms[i]
		m.HeldBy = ""
		switch {
		case !m.Enabled:
			m.State, m.Reason = ModuleDisabled, "disabled"
			continue
		}
		state, reason := ModuleCompleted, ""
		for _, j := range m.Jobs {
			switch j.Status {
			case RunFailed, RunCancelled, RunAbandoned, RunRolledBack:
				if state != ModuleFailed {
					state, reason = ModuleFailed, "job "+j.Job+"'s run is "+string(j.Status)
				}
			case RunPaused:
				if state != ModuleFailed {
					state, reason = ModulePaused, "job "+j.Job+"'s run is paused"
				}
			case RunCompleted:
			default:
				if state == ModuleCompleted {
					state = ModulePending
				}
			}
		}
		if state == ModulePending && m.ChunksDone > 0 {
			state = ModuleRunning
		}
		if (state == ModuleFailed || state == ModulePaused) && m.Reason != "" && m.State == state {
			reason = m.Reason
		}
		m.State, m.Reason = state, reason
	}
	// Held: in dependency order, so that a parent is settled first.
	settled := make([]bool, len(ms))
	var settle func(i int)
	settle = func(i int) {
		if settled[i] {
			return
		}
		settled[i] = true
		m := &ms[i]
		for _, d := range m.DependsOn {
			p, ok := index[d]
			if !ok {
				continue
			}
			settle(p)
			if m.State != ModulePending && m.State != ModuleRunning {
				continue
			}
			switch pm := ms[p]; pm.State {
			case ModuleHeld:
				m.HeldBy = pm.HeldBy
			case ModuleFailed, ModulePaused, ModuleDisabled:
				m.HeldBy = pm.Name
			}
			if m.HeldBy != "" {
				m.State, m.Reason = ModuleHeld, "held by module "+m.HeldBy+" ("+string(ms[index[m.HeldBy]].State)+")"
			}
		}
	}
	for i := range ms {
		settle(i)
	}
}

// IsGraphPlan reports whether plan, a run's plan as the manifest stores
// it (runs.plan), is a graph's: it lists modules.
func IsGraphPlan(plan []byte) bool {
	var p struct {
		Modules []json.RawMessage `json:"modules"`
	}
	return json.Unmarshal(plan, &p) == nil && len(p.Modules) > 0
}

// Text returns the graph's status as text: its run, its approvals and
// what it waits for, then one line per module: state (and the ancestor
// that holds it), chunks done of total, rows, class, priority, flag and
// dependencies, then why a module is not running and what it waits for.
func (s GraphStatus) Text() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "graph %s: batch %d, %s, fingerprint %s\n", s.Graph, s.BatchID, s.Status, s.Fingerprint)
	if a := s.Approval; a != nil && a.Policy != nil {
		fmt.Fprintf(&sb, "approvals %d of %d of plan fingerprint %s (author %s, role %s)\n", len(a.Approvals), a.Policy.Approvers, a.Fingerprint, shown(a.Author), shown(a.AuthorRole))
		for _, ap := range a.Approvals {
			fmt.Fprintf(&sb, "  %s by %s (role %s): %s\n", ap.CreatedAt.UTC().Format("2006-01-02 15:04:05Z"), shown(ap.Approver), shown(ap.DBRole), shown(ap.Reason))
		}
	}
	if s.Waiting != "" {
		sb.WriteString(oneLine(s.Waiting) + "\n")
	}
	w := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "MODULE\tSTATE\tCHUNKS\tROWS\tCLASS\tPRIORITY\tENABLED\tDEPENDS ON")
	for _, m := range s.Modules {
		state := string(m.State)
		if m.HeldBy != "" {
			state += " by " + m.HeldBy
		}
		deps := strings.Join(m.DependsOn, ", ")
		if deps == "" {
			deps = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%d/%d\t%d\t%s\t%d\t%t\t%s\n", m.Name, state, m.ChunksDone, m.ChunksTotal, m.Rows, m.Class, m.Priority, m.Enabled, deps)
	}
	_ = w.Flush()
	for _, m := range s.Modules {
		if m.Reason != "" && m.State != ModuleCompleted {
			fmt.Fprintf(&sb, "%s: %s\n", m.Name, m.Reason)
		}
		if m.Waiting != "" {
			fmt.Fprintf(&sb, "%s: waiting: %s\n", m.Name, oneLine(m.Waiting))
		}
	}
	return sb.String()
}
