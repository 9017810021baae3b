package backfill

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// ApprovalPolicy is the approval a job's runs need before they write
// ([Job.Approval]): Approvers distinct approvers (different names and
// different database roles) must approve the run's plan fingerprint; the
// run's author (the actor, Config.WorkerID, and the database role that
// started it) may be one of them only with AuthorMayApprove. The policy
// is part of the plan and its fingerprint (runs.plan->'approval' in
// SQL), so changing it is a plan change like any other.
type ApprovalPolicy = backfilltype.PlanApproval

// Approval is one recorded approval of a run: who (the name given and the
// session's database role), why, when, and the fingerprint approved.
type Approval = backfilltype.Approval

// ApprovalState is a run's approval policy, author and approvals
// ([Runner.Approvals], [Status].Approval).
type ApprovalState = backfilltype.ApprovalState

// RunAwaitingApproval: the run's plan has an [ApprovalPolicy] and fewer
// approvals of its fingerprint than it requires are recorded; no chunk is
// leased and nothing is written until [Runner.Approve] (the SQL function
// approve, "backfill approve") records the last one, which sets it
// running.
const RunAwaitingApproval = backfilltype.RunAwaitingApproval

var (
	// ErrAwaitingApproval is returned by [Runner.Run] with
	// [Config.ReturnOnPause] (by default Run waits for the approval) when
	// the job's run awaits approvals: the message says how many are
	// missing, of which plan fingerprint, and the command that records
	// one.
	ErrAwaitingApproval = backfilltype.ErrAwaitingApproval
	// ErrApprovalRefused is returned by [Runner.Approve] when an approval
	// is refused (a stale fingerprint, the author under a policy that
	// forbids it, the same approver or database role twice, a run that
	// does not await approval); nothing is recorded.
	ErrApprovalRefused = backfilltype.ErrApprovalRefused
)

// validateApproval refuses a negative number of approvers.
func (j Job) validateApproval() error {
	if j.Approval.Approvers < 0 {
		return fmt.Errorf("%w: job %q: Job.Approval.Approvers %d: at least 0 (0: no approval needed)", ErrInvalidConfig, j.Name, j.Approval.Approvers)
	}
	return nil
}

// planApproval is the plan's approval policy of job (nil for none).
func planApproval(job Job) *backfilltype.PlanApproval {
	if job.Approval.Approvers <= 0 {
		return nil
	}
	a := job.Approval
	return &a
}

// Approve records approver's approval of run batchID's plan fingerprint,
// for the reason why, through the manifest's SQL function approve (an
// operator role's: "backfill migrate --grant-operator"), which records it
// in the audit log with the session's database role beside approver. The
// approval that completes the run's [ApprovalPolicy] sets the run running
// and wakes its waiting workers; the next [Runner.Run] of the job works
// it. It returns an error wrapping [ErrApprovalRefused], and records
// nothing, when fingerprint is not the run's (the plan changed: a new run
// with a new fingerprint needs its own approvals), when approver (by name
// or by the session's role) is the run's author and the policy forbids
// it, when approver or the session's role approved the run already, and
// when the run does not await approval (also [ErrRunStatus]). approver and
// why are required ([ErrInvalidConfig]); an unknown batch gives
// [ErrRunNotFound], a role that may not execute approve [ErrPrivilege],
// and a manifest without approvals [ErrUnsupported].
func (r *Runner) Approve(ctx context.Context, batchID int64, fingerprint, approver, why string) error {
	am, err := r.approvalPlane("approve")
	if err != nil {
		return err
	}
	status, err := am.Approve(ctx, r.db, pgstore.ApproveParams{BatchID: batchID, Fingerprint: fingerprint, Approver: approver, Why: why})
	if err != nil {
		return err
	}
	r.cfg.Logger.Info("backfill: approval recorded", "batch_id", batchID, "fingerprint", fingerprint, "approver", approver, "status", status)
	return nil
}

// Approvals returns run batchID's approval state: its status, plan
// fingerprint, policy (nil when the plan has none), author and the
// approvals recorded, oldest first. Errors as [Runner.Approve].
func (r *Runner) Approvals(ctx context.Context, batchID int64) (ApprovalState, error) {
	am, err := r.approvalPlane("approvals")
	if err != nil {
		return ApprovalState{}, err
	}
	return am.Approvals(ctx, r.db, batchID)
}

func (r *Runner) approvalPlane(what string) (pgstore.ApprovalManifest, error) {
	if r.caps.approvals == nil {
		return nil, fmt.Errorf("backfill: %s: %w: approvals need PGManifest", what, ErrUnsupported)
	}
	return r.caps.approvals, nil
}

// awaitingErr is the error of a call whose run awaits approval: what is
// missing and how to approve.
func (r *Runner) awaitingErr(ctx context.Context, job Job, run Run) error {
	st, err := r.Approvals(ctx, run.BatchID)
	if err != nil {
		return errors.Join(fmt.Errorf("backfill: job %q batch %d: %w", job.Name, run.BatchID, ErrAwaitingApproval), err)
	}
	return fmt.Errorf("backfill: job %q batch %d: %w: %s", job.Name, run.BatchID, ErrAwaitingApproval, pgstore.AwaitingText(r.schemaName(), st))
}

// waitApproved waits, reading the run's status every ThrottleInterval,
// while run awaits approval. It returns nil once the run no longer awaits
// approval (the caller starts the call again: it finds the run running,
// or whatever it became), and the call's error when ctx ends or the
// Runner is drained first, or, with endOnSignal, once a signal of the
// Runner's PauseOnSignal arrived. Nothing is leased meanwhile: the run is not
// claimable, and this call is not a registered worker of it.
func (r *Runner) waitApproved(ctx context.Context, job Job, run Run, endOnSignal bool) error {
	// Once: what is missing and how to approve, for a person watching.
	r.cfg.Logger.Warn("backfill: run awaits approval: this call waits for it (claims nothing)", "job", job.Name, "batch_id", run.BatchID,
		"approve", r.awaitingErr(ctx, job, run).Error())
	for {
		st, err := r.caps.control.Control(ctx, r.db, run.BatchID)
		if err == nil && st.Status != RunAwaitingApproval {
			return nil
		}
		if endOnSignal && r.signalledAwaiting(run.BatchID) {
			// The person at this process pressed Ctrl-C.
			return r.awaitingErr(ctx, job, run)
		}
		if err != nil && ctx.Err() == nil {
			r.cfg.Logger.Warn("backfill: reading the run's status failed while awaiting approval; trying again", "error", err)
		}
		select {
		case <-ctx.Done():
			return errors.Join(r.awaitingErr(context.WithoutCancel(ctx), job, run), context.Cause(ctx))
		case <-r.drained:
			return r.awaitingErr(ctx, job, run)
		case <-time.After(r.cfg.throttleInterval()):
		}
	}
}

// ApproveParams are the arguments of [PGManifest.Approve].
type ApproveParams = pgstore.ApproveParams
