package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/quote"
)

// ApprovalManifest is the approval of runs as the Runner uses it
// ([Manifest]).
type ApprovalManifest interface {
	// Approve records an approval ([Manifest.Approve]).
	Approve(ctx context.Context, db sqlx.ExtContext, p ApproveParams) (backfilltype.RunStatus, error)
	// Approvals returns a run's approval state ([Manifest.Approvals]).
	Approvals(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.ApprovalState, error)
}

var _ ApprovalManifest = (*Manifest)(nil)

// ApproveParams are the arguments of [Manifest.Approve].
type ApproveParams struct {
	BatchID int64
	// Fingerprint is the plan fingerprint the approver reviewed.
	Fingerprint string
	// Approver is the approver's name; Why the reason. Both required.
	Approver, Why string
}

// initialStatus is the status a new run of plan is created with.
func initialStatus(plan backfilltype.Plan) backfilltype.RunStatus {
	if plan.Approval != nil && plan.Approval.Approvers > 0 {
		return backfilltype.RunAwaitingApproval
	}
	return backfilltype.RunRunning
}

// Approve records p's approval of run p.BatchID through the SQL function
// approve, in a short transaction of its own, and returns the run's
// status after it: running when it was the last approval the policy
// needs (the workers waiting are notified), else awaiting_approval. A
// refused approval records nothing and gives an error wrapping
// [backfilltype.ErrApprovalRefused] that says why: a fingerprint that is
// not the run's, the author approving under a policy that forbids it,
// an approver whose name or database role approved already; a run that
// does not await approval also wraps [backfilltype.ErrRunStatus]. A
// missing approver or reason, or one over its cap, gives
// [backfilltype.ErrInvalidConfig]; an unknown batch
// [backfilltype.ErrRunNotFound]; a role that may not execute approve (not
// an operator) [backfilltype.ErrPrivilege].
func (m *Manifest) Approve(ctx context.Context, db sqlx.ExtContext, p ApproveParams) (backfilltype.RunStatus, error) {
	ctx = m.purpose(ctx, "approve a run", p.BatchID)
	approver, why := ManifestText(p.Approver), ManifestText(p.Why)
	if err := controlCaps("approve", approver, why); err != nil {
		return "", fmt.Errorf("backfill: approve run %d: %w", p.BatchID, err)
	}
	var status string
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		if err := m.controlPrivilege(ctx, tx, "approve(bigint, text, text, text)"); err != nil {
			return err
		}
		return sqlx.GetContext(ctx, tx, &status, m.SQL(`SELECT {s}.approve($1::bigint, $2::text, $3::text, $4::text)`),
			p.BatchID, ManifestText(p.Fingerprint), approver, why)
	})
	if err != nil {
		return "", fmt.Errorf("backfill: approve run %d: %w", p.BatchID, approveError(err))
	}
	return backfilltype.RunStatus(status), nil
}

// approveError maps the SQLSTATEs of approve to sentinels: its refusals
// (BFA01 stale fingerprint, BFA02 author, BFA03 the same approver twice,
// 55000 a run not awaiting approval) to ErrApprovalRefused.
func approveError(err error) error {
	var pe *pq.Error
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "BFA01", "BFA02", "BFA03":
		return fmt.Errorf("%w: %s", backfilltype.ErrApprovalRefused, pe.Message)
	case "55000":
		return fmt.Errorf("%w: %w: %s", backfilltype.ErrApprovalRefused, backfilltype.ErrRunStatus, pe.Message)
	}
	return controlError(err, false)
}

// Approvals returns run batchID's approval state: its status, plan
// fingerprint and policy, its author (the run_started event's actor and
// role) and the approvals recorded (approval_recorded events), oldest
// first. An unknown batch gives [backfilltype.ErrRunNotFound].
func (m *Manifest) Approvals(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.ApprovalState, error) {
	ctx = m.purpose(ctx, "read the run's approvals", batchID)
	var st backfilltype.ApprovalState
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		var runs []struct {
			Status      string  `db:"status"`
			Fingerprint string  `db:"plan_fingerprint"`
			Policy      *string `db:"policy"`
			Author      string  `db:"author"`
			AuthorRole  string  `db:"author_role"`
		}
		if err := sqlx.SelectContext(ctx, tx, &runs, m.SQL(`SELECT r.status, r.plan_fingerprint, (r.plan->'approval')::text AS policy,
			coalesce(e.actor, '') AS author, coalesce(e.db_role, '') AS author_role
			FROM {s}.runs r LEFT JOIN LATERAL (SELECT actor, db_role FROM {s}.events
				WHERE batch_id = r.batch_id AND kind = 'run_started' ORDER BY id LIMIT 1) e ON true
			WHERE r.batch_id = $1`), batchID); err != nil {
			return err
		}
		if len(runs) == 0 {
			return backfilltype.ErrRunNotFound
		}
		run := runs[0]
		st = backfilltype.ApprovalState{BatchID: batchID, Status: backfilltype.RunStatus(run.Status), Fingerprint: run.Fingerprint,
			Author: run.Author, AuthorRole: run.AuthorRole, Approvals: []backfilltype.Approval{}}
		if run.Policy != nil && *run.Policy != "null" {
			st.Policy = &backfilltype.PlanApproval{}
			if err := json.Unmarshal([]byte(*run.Policy), st.Policy); err != nil {
				return fmt.Errorf("approval policy: %w", err)
			}
		}
		var rows []struct {
			Actor       string    `db:"actor"`
			DBRole      string    `db:"db_role"`
			Fingerprint string    `db:"fingerprint"`
			Why         string    `db:"why"`
			CreatedAt   time.Time `db:"created_at"`
		}
		if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT actor, coalesce(db_role, '') AS db_role,
			coalesce(detail->>'fingerprint', '') AS fingerprint, coalesce(detail->>'why', '') AS why, created_at
			FROM {s}.events WHERE batch_id = $1 AND kind = 'approval_recorded' ORDER BY id`), batchID); err != nil {
			return err
		}
		for _, a := range rows {
			st.Approvals = append(st.Approvals, backfilltype.Approval{BatchID: batchID, Fingerprint: a.Fingerprint, Approver: a.Actor,
				DBRole: a.DBRole, Reason: a.Why, CreatedAt: a.CreatedAt})
		}
		return nil
	})
	if err != nil {
		return backfilltype.ApprovalState{}, fmt.Errorf("backfill: approvals of run %d: %w", batchID, err)
	}
	return st, nil
}

// statusApproval sets s.Approval to the run's approval state when its
// plan has a policy, and, for a run awaiting approval, s.Waiting to what
// is missing and the command that records an approval.
func (m *Manifest) statusApproval(ctx context.Context, db sqlx.ExtContext, s *backfilltype.Status) error {
	st, err := m.Approvals(ctx, db, s.BatchID)
	if err != nil {
		return err
	}
	if st.Policy == nil {
		return nil
	}
	s.Approval = &st
	if s.Status == backfilltype.RunAwaitingApproval {
		s.ETASeconds, s.ETARate, s.ETABasis = nil, nil, ""
		s.Waiting = AwaitingText(m.Schema(), st)
	}
	return nil
}

// AwaitingText says what a run awaiting approval misses and how to
// approve it (in SQL, with the CLI).
func AwaitingText(schema string, st backfilltype.ApprovalState) string {
	required := 0
	if st.Policy != nil {
		required = st.Policy.Approvers
	}
	author := "the author may approve"
	if st.Policy != nil && !st.Policy.AuthorMayApprove {
		author = fmt.Sprintf("not by its author %s (role %s)", st.Author, st.AuthorRole)
	}
	return fmt.Sprintf("awaiting approval: %d of %d approvals of plan fingerprint %s recorded, %d missing (each by another approver and database role; %s): "+
		"review it (backfill plan%s --batch %d), then approve with backfill approve%s --batch %d --fingerprint %s --approver NAME --reason WHY, or SELECT %s.approve(%d, '%s', 'NAME', 'WHY')",
		len(st.Approvals), required, st.Fingerprint, st.Missing(), author,
		quote.SchemaFlag(schema), st.BatchID, quote.SchemaFlag(schema), st.BatchID, st.Fingerprint, quote.SQLIdent(schema), st.BatchID, st.Fingerprint)
}
