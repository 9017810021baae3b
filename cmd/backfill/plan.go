package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgbackfill/backfill"
)

func newPlanCmd(g *globals) *cobra.Command {
	var sel selection
	cmd := &cobra.Command{
		Use:   "plan [JOB] [--batch N]",
		Short: "Show a run's blueprint: scope, targets, success metrics, fallback path, limits, and what changed since the job's previous plan",
		Long: `plan prints the blueprint recorded for a run (the job's latest run, or
--batch N) when it was started: the document reviewers approve. In a
fixed order: the plan fingerprint approvals bind to, code version and
source; the scope and chunking (chunker, first and last chunk, their
number, an estimate of the rows); the modules and their jobs, each with
its target table, business key, columns and identity mode, validators
with their thresholds (the success metrics), publish mode, rollback
mechanism and what a rollback restores (the fallback path); the
throttles and limits of the Runner that started it; the approval policy;
a rehearsal's forecast when one exists. Then what changed since the
job's previous run: scope, code version, validators, target columns,
policy, limits. A run started by an older version, which recorded no
blueprint, shows its plan's fields only.

The operator CLI has no extractor: it shows what the manifest recorded.
A job's blueprint before any run is Runner.Blueprint in Go. With --json:
one backfill.Blueprint document.`,
		Example: `  backfill plan flights
  backfill plan --batch 12 --json`,
		Args: sel.args("plan"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := sel.check(); err != nil {
				return err
			}
			ctx := cmd.Context()
			db, m, err := g.manifest(ctx, backfill.ActionRead)
			if err != nil {
				return err
			}
			defer db.Close()
			run, err := sel.run(ctx, db, m)
			if err != nil {
				return err
			}
			b, err := m.RunBlueprint(ctx, db, run)
			if err != nil {
				return err
			}
			return g.print(b, b.Text())
		},
	}
	sel.flags(cmd.Flags())
	return cmd
}

// approveResult is what approve prints with --json.
type approveResult struct {
	BatchID     int64  `json:"batch_id"`
	Job         string `json:"job"`
	Fingerprint string `json:"fingerprint"`
	Approver    string `json:"approver"`
	Reason      string `json:"reason"`
	// Status is the run's status after the approval; Approvals and
	// Required count its approvals and what its policy requires.
	Status    backfill.RunStatus `json:"status"`
	Approvals int                `json:"approvals"`
	Required  int                `json:"required"`
}

func newApproveCmd(g *globals) *cobra.Command {
	var (
		sel                           selection
		fingerprint, approver, reason string
	)
	cmd := &cobra.Command{
		Use:   "approve (--job NAME | --batch N) --fingerprint FP --reason TEXT [--approver NAME]",
		Short: "Approve a run awaiting approval, bound to its plan's fingerprint",
		Long: `approve records an approval of a run awaiting approval (a job with an
approval policy, Job.Approval) through the manifest's SQL function
approve, as an operator role: the approver's name (--approver, default
the OS user@host) and the session's database role are recorded in the
audit trail with --reason, which is required. --fingerprint is the plan
fingerprint the approver reviewed ("backfill plan" shows it): an approval
of another fingerprint is refused as stale (the plan changed: review the
new one). The author of the run (its starter's name or role) may not
approve under a policy that forbids it, and one approver (by name or by
role) approves once. The approval that completes the policy sets the run
running: its workers start within about a second.`,
		Example: `  backfill plan flights
  backfill approve --job flights --fingerprint 3e6c6e1d... --reason "blueprint reviewed with analytics"`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("%w: approve takes no arguments, got %q", errUsage, args)
			}
			if err := sel.check(); err != nil {
				return err
			}
			if strings.TrimSpace(reason) == "" {
				return fmt.Errorf("%w: approve needs --reason TEXT, recorded in the audit trail with the approver", errUsage)
			}
			if strings.TrimSpace(fingerprint) == "" {
				return fmt.Errorf("%w: approve needs --fingerprint FP, the plan fingerprint reviewed (backfill plan shows it)", errUsage)
			}
			if approver == "" {
				approver = osActor()
			}
			ctx := cmd.Context()
			db, m, err := g.manifest(ctx, backfill.ActionControl, "approve(bigint, text, text, text)")
			if err != nil {
				return err
			}
			defer db.Close()
			run, err := sel.run(ctx, db, m)
			if err != nil {
				return err
			}
			status, err := m.Approve(ctx, db, backfill.ApproveParams{BatchID: run.BatchID, Fingerprint: fingerprint, Approver: approver, Why: reason})
			if err != nil {
				if errors.Is(err, backfill.ErrInvalidConfig) {
					return fmt.Errorf("%w: %w", errUsage, err)
				}
				return err
			}
			st, err := m.Approvals(ctx, db, run.BatchID)
			if err != nil {
				return err
			}
			res := approveResult{BatchID: run.BatchID, Job: run.Job, Fingerprint: fingerprint, Approver: approver, Reason: reason,
				Status: status, Approvals: len(st.Approvals)}
			if st.Policy != nil {
				res.Required = st.Policy.Approvers
			}
			return g.print(res, fmt.Sprintf("approved %s batch %d (fingerprint %s) by %s: %s\n%d of %d approvals; now %s\n",
				run.Job, run.BatchID, fingerprint, approver, reason, res.Approvals, res.Required, status))
		},
	}
	sel.flags(cmd.Flags())
	cmd.Flags().StringVar(&fingerprint, "fingerprint", "", "the plan fingerprint approved (required)")
	cmd.Flags().StringVar(&approver, "approver", "", "who approves, recorded in the audit trail (default the OS user@host)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded in the audit trail (required)")
	return cmd
}
