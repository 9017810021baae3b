package backfilltype

import (
	"errors"
	"time"
)

// RunAwaitingApproval: the run's plan has an approval policy
// ([PlanApproval]) and fewer approvals of its fingerprint than the
// policy requires are recorded. No chunk is leased and nothing is written
// to the target until the last approval needed is recorded
// (backfill.Runner.Approve, the SQL function approve), which sets the run
// running.
const RunAwaitingApproval RunStatus = "awaiting_approval"

var (
	// ErrAwaitingApproval is returned by backfill.Runner.Run (with
	// backfill.Config.ReturnOnPause) when the job's run awaits
	// approvals: the message says how many are missing, of which plan
	// fingerprint, and the command that records one.
	ErrAwaitingApproval = errors.New("backfill: run is awaiting approval")
	// ErrApprovalRefused is returned by backfill.Runner.Approve (and the
	// SQL function approve, SQLSTATE 42501 or 55000) when an approval is
	// refused: a fingerprint other than the run's (stale), the author of
	// the run approving under a policy that forbids it, an approver (by
	// name or database role) who already approved, or a run that does not
	// await approval. Nothing is recorded.
	ErrApprovalRefused = errors.New("backfill: approval refused")
)

// PlanApproval is the approval policy frozen in a [Plan]: a run of the
// plan starts [RunAwaitingApproval] and runs once Approvers distinct
// approvers approved its fingerprint. It is part of the fingerprint, so
// changing the policy is a plan change like any other.
type PlanApproval struct {
	// Approvers is how many distinct approvers must approve (at least 1).
	// Distinct means: different names and different database roles
	// (session_user), so that two approvals need two roles.
	Approvers int `json:"approvers"`
	// AuthorMayApprove lets the run's author (the actor who started it,
	// or any session of the database role that started it) approve it.
	AuthorMayApprove bool `json:"author_may_approve,omitempty"`
}

// Approval is one approval recorded for a run.
type Approval struct {
	BatchID int64 `json:"batch_id"`
	// Fingerprint is the plan fingerprint the approver approved; always
	// the run's (an approval of another one is refused).
	Fingerprint string `json:"fingerprint"`
	// Approver is the name the approver gave; DBRole the database role of
	// the session that recorded it (session_user), whatever the name.
	Approver string `json:"approver"`
	DBRole   string `json:"db_role"`
	Reason   string `json:"reason"`
	// CreatedAt is the server's time of the approval.
	CreatedAt time.Time `json:"created_at"`
}

// ApprovalState is a run's approval policy and the approvals recorded.
type ApprovalState struct {
	BatchID     int64     `json:"batch_id"`
	Status      RunStatus `json:"status"`
	Fingerprint string    `json:"fingerprint"`
	// Policy is the run's plan's policy (nil: none, the run needs no
	// approval).
	Policy *PlanApproval `json:"policy,omitempty"`
	// Author and AuthorRole are who started the run: the actor of its
	// run_started event and the database role that recorded it.
	Author     string     `json:"author"`
	AuthorRole string     `json:"author_role"`
	Approvals  []Approval `json:"approvals"`
}

// Missing returns how many more approvals the run needs (0 when none).
func (s ApprovalState) Missing() int {
	if s.Policy == nil || s.Status != RunAwaitingApproval {
		return 0
	}
	return max(s.Policy.Approvers-len(s.Approvals), 0)
}
