package pgstore

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// PreviousRun returns the newest run of job whose batch ID is below
// before (any run of job when before <= 0); ok is false when there is
// none.
func (m *Manifest) PreviousRun(ctx context.Context, db sqlx.ExtContext, job string, before int64) (run backfilltype.Run, ok bool, err error) {
	ctx = m.purpose(ctx, "read the job's previous run", 0)
	var runs []backfilltype.Run
	err = ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		runs = nil
		return sqlx.SelectContext(ctx, tx, &runs, m.SQL(`SELECT `+runColumns+` FROM {s}.runs
			WHERE job_name = $1 AND ($2 <= 0 OR batch_id < $2) ORDER BY batch_id DESC LIMIT 1`), job, before)
	})
	if err != nil {
		return backfilltype.Run{}, false, fmt.Errorf("backfill: previous run of job %q: %w", job, err)
	}
	if len(runs) == 0 {
		return backfilltype.Run{}, false, nil
	}
	return runs[0], true, nil
}

// RecordedBlueprint returns the blueprint recorded for run (its latest
// [backfilltype.EventBlueprint] event), with the run's batch ID and
// status; full is false when none was recorded (a run started by an older
// version): the blueprint is then the plan's ([backfilltype.PlanBlueprint]
// of runs.plan), without the chunker, validators and limits.
func (m *Manifest) RecordedBlueprint(ctx context.Context, db sqlx.ExtContext, run backfilltype.Run) (b backfilltype.Blueprint, full bool, err error) {
	ctx = m.purpose(ctx, "read the run's blueprint", run.BatchID)
	var details []string
	err = ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		details = nil
		return sqlx.SelectContext(ctx, tx, &details, m.SQL(`SELECT detail::text FROM {s}.events
			WHERE batch_id = $1 AND kind = $2 ORDER BY id DESC LIMIT 1`), run.BatchID, backfilltype.EventBlueprint)
	})
	if err != nil {
		return backfilltype.Blueprint{}, false, fmt.Errorf("backfill: blueprint of batch %d: %w", run.BatchID, err)
	}
	if len(details) == 1 {
		if err := json.Unmarshal([]byte(details[0]), &b); err != nil {
			return backfilltype.Blueprint{}, false, fmt.Errorf("backfill: blueprint of batch %d: %w", run.BatchID, err)
		}
		full = true
	} else if b, err = RunPlanBlueprint(run); err != nil {
		return backfilltype.Blueprint{}, false, err
	}
	b.BatchID, b.Status = run.BatchID, run.Status
	b.Previous, b.Changes = nil, []string{}
	return b, full, nil
}

// RunPlanBlueprint returns the blueprint of run's plan as the manifest
// recorded it (runs.plan): its fingerprinted fields only
// ([backfilltype.PlanBlueprint]), with the run's batch ID and status.
func RunPlanBlueprint(run backfilltype.Run) (backfilltype.Blueprint, error) {
	var p backfilltype.Plan
	if err := json.Unmarshal(run.Plan, &p); err != nil {
		return backfilltype.Blueprint{}, fmt.Errorf("backfill: plan of batch %d: %w", run.BatchID, err)
	}
	p.Fingerprint = run.Fingerprint
	if p.ChunkIDs == nil {
		p.N = run.ChunksTotal
	}
	b := backfilltype.PlanBlueprint(p)
	b.BatchID, b.Status = run.BatchID, run.Status
	return b, nil
}

// RunBlueprint returns the blueprint of run as the manifest records it
// ([Manifest.RecordedBlueprint]) with the job's previous run (the newest
// with a lower batch ID) as its Previous and the changes from it; when
// either was recorded without a blueprint, both are compared by their
// plans' fields only.
func (m *Manifest) RunBlueprint(ctx context.Context, db sqlx.ExtContext, run backfilltype.Run) (backfilltype.Blueprint, error) {
	b, full, err := m.RecordedBlueprint(ctx, db, run)
	if err != nil {
		return backfilltype.Blueprint{}, err
	}
	prev, ok, err := m.PreviousRun(ctx, db, run.Job, run.BatchID)
	if err != nil || !ok {
		return b, err
	}
	pb, pfull, err := m.RecordedBlueprint(ctx, db, prev)
	if err != nil {
		return backfilltype.Blueprint{}, err
	}
	cur := b
	if !full || !pfull {
		if cur, err = RunPlanBlueprint(run); err != nil {
			return backfilltype.Blueprint{}, err
		}
		if pb, err = RunPlanBlueprint(prev); err != nil {
			return backfilltype.Blueprint{}, err
		}
	}
	b.Previous = &backfilltype.BlueprintPrevious{BatchID: prev.BatchID, Status: prev.Status, Fingerprint: prev.Fingerprint}
	b.Changes = backfilltype.BlueprintDiff(pb, cur)
	return b, nil
}
