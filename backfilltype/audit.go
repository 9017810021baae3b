package backfilltype

import "encoding/json"

// EventRollbackPreviewed: a rollback was previewed by a named actor
// (backfill.RollbackOptions.Preview with an Actor).
const EventRollbackPreviewed = "rollback_previewed"

// EventApprovalRecorded: an approval of the run's plan fingerprint
// (backfill.Runner.Approve, the SQL function approve); Actor is the
// approver's name, DBRole the session's role; Detail holds "why",
// "fingerprint", "approvals" (with this one), "required", and the run's
// status before and after ("from", "to").
const EventApprovalRecorded = "approval_recorded"

// ReplayedControl is a run's control state as its audit log tells it
// ([ReplayControl]).
type ReplayedControl struct {
	Status RunStatus
	Knobs  map[string]float64
	// Approvals are the approvals recorded, oldest first, as "name@role".
	Approvals []string
	// Modules are the module flags switched on the run, a graph's
	// ([EventModuleFlag]): module name to enabled, the latest switch of
	// each; nil when none was.
	Modules map[string]bool
}

// ReplayControl replays the audit log of one run (its events in order)
// into the run's control state: the status each decision left it in
// (run_started, run_resumed, run_paused, run_resumed_by_operator,
// run_cancelled, run_completed, run_failed, run_abandoned,
// approval_recorded, a whole batch's rollback), the live knobs
// (knob_set; a null value drops the knob), the approvals and a graph's
// module flags (module_flag_set). Events that
// decide nothing about control (chunk evidence, blueprints, validators)
// are skipped.
func ReplayControl(events []Event) ReplayedControl {
	st := ReplayedControl{Knobs: map[string]float64{}, Approvals: []string{}}
	for _, e := range events {
		var d struct {
			To    RunStatus `json:"to"`
			Key   string    `json:"key"`
			Value *float64  `json:"value"`
			Chunk string    `json:"chunk"`
			// A module flag's.
			Module string `json:"module"`
			New    *bool  `json:"new"`
		}
		_ = json.Unmarshal(e.Detail, &d)
		switch e.Kind {
		case "run_started":
			st.Status = RunRunning
			if d.To != "" {
				st.Status = d.To
			}
		case "run_resumed", "run_resumed_by_operator":
			st.Status = RunRunning
		case "run_paused":
			st.Status = RunPaused
		case "run_cancelled":
			st.Status = RunCancelled
		case "run_completed":
			st.Status = RunCompleted
		case "run_failed":
			st.Status = RunFailed
		case "run_abandoned":
			st.Status = RunAbandoned
		case "rollback":
			st.Status = RunRolledBack
		case EventApprovalRecorded:
			st.Approvals = append(st.Approvals, e.Actor+"@"+e.DBRole)
			if d.To != "" {
				st.Status = d.To
			}
		case EventModuleFlag:
			if d.Module != "" && d.New != nil {
				if st.Modules == nil {
					st.Modules = map[string]bool{}
				}
				st.Modules[d.Module] = *d.New
			}
		case "knob_set":
			if d.Value == nil {
				delete(st.Knobs, d.Key)
			} else {
				st.Knobs[d.Key] = *d.Value
			}
		}
	}
	return st
}
