package backfill

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// RollbackBatch rolls back batch batchID exactly as [Runner.Rollback]
// does with the job, but without the job's code: what the rollback needs
// of the job is rebuilt from the plan the manifest recorded when the run
// started (see [PlanJob]), so an operator can withdraw a batch from any
// machine with only the database (the backfill command's rollback).
// opts.BatchID must be 0 or batchID; every other option means what it
// means for Rollback (ChunkID, Force, Preview, Actor and Why). A versioned
// view is switched back with the default Publish.LockTimeout and
// LockRetries.
//
// Errors: [ErrInvalidConfig] for a batchID that is not positive;
// [ErrRunNotFound] for an unknown batch; [ErrPlanIncomplete], naming the
// missing field, when the plan lacks what the batch's rollback mechanism
// and publish mode need; otherwise those of Rollback.
func (r *Runner) RollbackBatch(ctx context.Context, batchID int64, opts RollbackOptions) (RollbackReport, error) {
	if batchID <= 0 {
		return RollbackReport{}, fmt.Errorf("backfill: rollback of batch %d: %w: a batch ID is positive", batchID, ErrInvalidConfig)
	}
	if opts.BatchID != 0 && opts.BatchID != batchID {
		return RollbackReport{}, fmt.Errorf("backfill: rollback of batch %d: %w: RollbackOptions.BatchID is %d", batchID, ErrInvalidConfig, opts.BatchID)
	}
	if err := need(r.caps.rollback != nil, "ManifestRollback", "the manifest keeps the rollback's bookkeeping"); err != nil {
		return RollbackReport{}, fmt.Errorf("backfill: rollback of batch %d: %w", batchID, err)
	}
	if err := r.cfg.Manifest.Init(ctx, r.db); err != nil {
		return RollbackReport{}, err
	}
	run, err := r.caps.rollback.Run(ctx, r.db, batchID)
	if err != nil {
		return RollbackReport{}, err
	}
	job, err := runJob(run)
	if err != nil {
		return RollbackReport{}, err
	}
	opts.BatchID = batchID
	return r.Rollback(ctx, job, opts)
}

// runJob is PlanJob of run's recorded plan.
func runJob(run Run) (Job, error) {
	var plan Plan
	if err := json.Unmarshal(run.Plan, &plan); err != nil {
		return Job{}, fmt.Errorf("backfill: rollback of batch %d: plan: %w", run.BatchID, err)
	}
	if plan.Job == "" {
		plan.Job = run.Job
	}
	job, err := PlanJob(plan)
	if err != nil {
		return Job{}, fmt.Errorf("backfill: rollback of batch %d: %w", run.BatchID, err)
	}
	return job, nil
}

// PlanJob rebuilds from a recorded plan the part of its [Job] that
// [Runner.Rollback] reads: Name, Target (table, key, columns, mode,
// duplicates, conflict, version, interval columns, derived keys' columns
// and sources, hash column, time columns and lineage), ChunkColumn, Zone,
// DateMeaning, Rollback and Publish (mode and view). It has no Chunker or
// Extractor and cannot be run; a Keyless key rule has its Column and From
// but no normalizers (a rollback derives no key).
//
// It returns an error wrapping [ErrPlanIncomplete] naming the first field
// the plan lacks: "job", "target.table", "rollback"; with
// [RollbackUndoLog] also "target.key", "target.mode", "target.inserted_by",
// "target.updated_by", and by mode "target.valid_from",
// "target.valid_to" (History) or "target.derive" (Keyless); with a
// versioned view "publish" (its view). A field it cannot read back (a
// publish mode or a zone this version does not know) is reported with
// the value.
func PlanJob(plan Plan) (Job, error) {
	if plan.Job == "" {
		return Job{}, fmt.Errorf("%w: %q is empty in the plan", ErrPlanIncomplete, "job")
	}
	if plan.Target.Table == "" {
		return Job{}, planMissing(plan, "target.table", "the table to roll back")
	}
	if plan.Rollback == "" {
		return Job{}, planMissing(plan, "rollback", "the rollback mechanism decided when the run started")
	}
	t, err := planTarget(plan)
	if err != nil {
		return Job{}, err
	}
	job := Job{Name: plan.Job, Source: plan.Source, CodeVersion: plan.CodeVersion, Target: t, Rollback: plan.Rollback}
	if err := applyPlanTime(&job, plan); err != nil {
		return Job{}, err
	}
	if plan.Publish != "" {
		pub, err := planPublish(plan)
		if err != nil {
			return Job{}, err
		}
		job.Publish = pub
	}
	if plan.Rollback == RollbackUndoLog {
		if err := checkUndoLogPlan(plan); err != nil {
			return Job{}, err
		}
	}
	return job, nil
}

// planMissing returns the error wrapping [ErrPlanIncomplete] that names
// field as empty in the plan of plan.Job, with why the rollback needs it.
func planMissing(plan Plan, field, why string) error {
	return fmt.Errorf("%w: %q is empty in the plan of job %q: %s", ErrPlanIncomplete, field, plan.Job, why)
}

// planTarget rebuilds the job's [Target] from plan.Target: table, key,
// columns, mode, duplicates, conflict, version, interval columns, hash
// column, lineage (Off when the plan names neither lineage column) and the
// derived keys' rules. An unreadable derive rule is an error wrapping
// [ErrPlanIncomplete].
func planTarget(plan Plan) (Target, error) {
	pt := plan.Target
	t := Target{Table: pt.Table, Key: pt.Key, Columns: pt.Columns, Mode: pt.Mode, Duplicates: pt.Duplicates,
		Conflict: pt.Conflict, Version: pt.Version, ValidFrom: pt.ValidFrom, ValidTo: pt.ValidTo, HashColumn: pt.HashColumn,
		Lineage: Lineage{InsertedBy: pt.InsertedBy, UpdatedBy: pt.UpdatedBy}}
	if pt.InsertedBy == "" && pt.UpdatedBy == "" {
		t.Lineage.Off = true // as planned: no lineage columns, not the defaults of today's table
	}
	for _, s := range pt.Derive {
		k, err := parseKeyRule(s)
		if err != nil {
			return Target{}, fmt.Errorf("%w: target.derive of job %q: %w", ErrPlanIncomplete, plan.Job, err)
		}
		t.Derive = append(t.Derive, k)
	}
	return t, nil
}

// applyPlanTime sets job's ChunkColumn, DateMeaning, Zone and the target's
// time columns from plan.Time; a plan without Time leaves job unchanged.
// A zone the time package cannot load is an error wrapping
// [ErrPlanIncomplete].
func applyPlanTime(job *Job, plan Plan) error {
	pm := plan.Time
	if pm == nil {
		return nil
	}
	job.ChunkColumn, job.DateMeaning = pm.ChunkColumn, pm.DateMeaning
	job.Target.EventTime, job.Target.ModifiedAt, job.Target.IngestedAt = pm.EventTime, pm.ModifiedAt, pm.IngestedAt
	if pm.Zone != "" {
		z, err := time.LoadLocation(pm.Zone)
		if err != nil {
			return fmt.Errorf("%w: time.zone %q of job %q: %w", ErrPlanIncomplete, pm.Zone, plan.Job, err)
		}
		job.Zone = z
	}
	return nil
}

// planPublish reads back the non-empty plan.Publish ("mode" or
// "mode:view") as a [Publish]. A versioned view without its view, or a
// mode this version does not know, is an error wrapping
// [ErrPlanIncomplete].
func planPublish(plan Plan) (Publish, error) {
	mode, view, _ := strings.Cut(plan.Publish, ":")
	pub := Publish{Mode: PublishMode(mode), View: view}
	switch pub.Mode {
	case PublishAtEnd, PublishPartitionSwap:
	case PublishVersionedView:
		if view == "" {
			return Publish{}, planMissing(plan, "publish", "the view of the versioned view to switch back")
		}
	default:
		return Publish{}, fmt.Errorf("%w: publish %q of job %q: unknown publish mode %q", ErrPlanIncomplete, plan.Publish, plan.Job, mode)
	}
	return pub, nil
}

// checkUndoLogPlan reports, as an error wrapping [ErrPlanIncomplete], the
// first field a [RollbackUndoLog] rollback needs that plan.Target lacks:
// key, mode, both lineage columns, and by mode the interval columns
// (History) or the derived keys (Keyless). It returns nil when none is
// missing.
func checkUndoLogPlan(plan Plan) error {
	pt := plan.Target
	switch {
	case len(pt.Key) == 0:
		return planMissing(plan, "target.key", "the business key the undo log is matched by")
	case pt.Mode == "":
		return planMissing(plan, "target.mode", "the merge mode the batch was written with")
	case pt.InsertedBy == "":
		return planMissing(plan, "target.inserted_by", "the lineage column that finds the rows the batch inserted")
	case pt.UpdatedBy == "":
		return planMissing(plan, "target.updated_by", "the lineage column that finds the rows later batches changed")
	case pt.Mode == History && pt.ValidFrom == "":
		return planMissing(plan, "target.valid_from", "History mode's interval start")
	case pt.Mode == History && pt.ValidTo == "":
		return planMissing(plan, "target.valid_to", "History mode's interval end")
	case pt.Mode == Keyless && len(pt.Derive) == 0:
		return planMissing(plan, "target.derive", "Keyless mode's derived key columns")
	}
	return nil
}

// parseKeyRule reads back the key column and source column of a
// KeyRule.String ("key_col <- trim,nfc(source_col) null_as_empty").
func parseKeyRule(s string) (KeyRule, error) {
	col, rest, ok := strings.Cut(s, " <- ")
	var k KeyRule
	rest, k.NullAsEmpty = strings.CutSuffix(rest, " null_as_empty")
	open := strings.Index(rest, "(")
	if !ok || col == "" || open < 0 || !strings.HasSuffix(rest, ")") || open+1 >= len(rest)-1 {
		return KeyRule{}, fmt.Errorf("rule %q is not \"key <- rules(source)\"", s)
	}
	k.Column, k.From = col, rest[open+1:len(rest)-1]
	return k, nil
}
