package backfill

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
)

// Blueprint is a run's plan as a document for reviewers ([Runner.Blueprint],
// "backfill plan"): scope and chunking, the modules and jobs with their
// target, key, columns and identity mode, validators and thresholds,
// publish mode, rollback mechanism and what it restores, the Runner's
// throttles and limits, the plan fingerprint approvals bind to, a
// rehearsal's forecast, and the changes since the job's previous plan.
type Blueprint = backfilltype.Blueprint

// blueprintStore is a manifest that lists a job's runs and the blueprints
// recorded for them (PGManifest).
type blueprintStore interface {
	PreviousRun(ctx context.Context, db sqlx.ExtContext, job string, before int64) (Run, bool, error)
	RecordedBlueprint(ctx context.Context, db sqlx.ExtContext, run Run) (Blueprint, bool, error)
}

// Blueprint returns job's blueprint as a run of it would start now: it
// prepares the job as [Runner.Run] does (the same checks and errors: the
// target, the privileges, the chunks), freezes the plan in memory, and
// writes nothing: no run is created or changed, nothing is recorded (a
// manifest schema behind the library is migrated by Init, as by any
// call). When the job's latest run has the same fingerprint, the
// blueprint is that run's (BatchID and Status set) and its previous plan
// is the run before it; otherwise the previous plan is the job's latest
// run. Changes lists what differs from the previous plan's recorded
// blueprint ([backfilltype.BlueprintDiff]; against a run recorded
// without one, only the plan's fields are compared). Scope.EstimatedRows
// comes from the job's previous completed run, rows read per chunk.
//
// [Runner.Run] records the blueprint of a run in its audit log (event
// [backfilltype.EventBlueprint]) when a call first works the run or
// awaits its approval, and again when a call's blueprint differs
// (validators, limits); "backfill plan" prints it from the manifest.
// Previous, estimates and changes need [PGManifest]; other manifests
// give a blueprint without them.
func (r *Runner) Blueprint(ctx context.Context, job Job) (Blueprint, error) {
	rs, err := r.planRun(ctx, job)
	if err != nil {
		return Blueprint{}, err
	}
	b, err := r.blueprintOf(ctx, rs)
	if err == nil {
		err = r.compareBlueprint(ctx, rs, &b)
	}
	if err == nil {
		err = r.blueprintRehearsal(ctx, &b)
	}
	if err != nil {
		return Blueprint{}, fmt.Errorf("backfill: blueprint of job %q: %w", job.Name, err)
	}
	return b, nil
}

// blueprintRehearsal sets b.Rehearsal to the forecast of the latest
// rehearsal recorded of b's plan (same job and fingerprint), if any
// (PGManifest only).
func (r *Runner) blueprintRehearsal(ctx context.Context, b *Blueprint) error {
	pm, _ := r.pgPrivileges()
	if pm == nil {
		return nil
	}
	rhs, err := pm.Rehearsals(ctx, r.db, b.Job, 0)
	if err != nil {
		return err
	}
	for _, rh := range rhs {
		if rh.Fingerprint != b.Fingerprint {
			continue
		}
		if b.Rehearsal == nil || rh.ID > idOf(b.Rehearsal.ID) {
			f := rh.Forecast
			doc, err := json.Marshal(f)
			if err != nil {
				return err
			}
			b.Rehearsal = &backfilltype.BlueprintRehearsal{ID: strconv.FormatInt(rh.ID, 10), Rows: f.Rows, Forecast: doc,
				Summary: fmt.Sprintf("rehearsed %s: %d chunks, %d rows, duration %s (%s to %s), WAL %d bytes, target %d bytes, indexes %d bytes",
					rh.CreatedAt.UTC().Format(time.RFC3339), f.Chunks, f.Rows, f.Duration.Round(time.Millisecond),
					f.DurationLow.Round(time.Millisecond), f.DurationHigh.Round(time.Millisecond), f.WALBytes, f.TargetBytes, f.IndexBytes)}
		}
	}
	return nil
}

// idOf is a rehearsal ID as a number (0 if it is none).
func idOf(id string) int64 {
	n, _ := strconv.ParseInt(id, 10, 64)
	return n
}

// blueprintOf is the blueprint of rs without the previous plan. The
// chunks of a plan frozen from a ChunkStreamer are read once for the
// first and last.
func (r *Runner) blueprintOf(ctx context.Context, rs runSetup) (Blueprint, error) {
	b := backfilltype.PlanBlueprint(rs.plan)
	if rs.plan.Chunks == nil && rs.plan.ChunkIDs == nil {
		n := 0
		for c, err := range rs.plan.AllChunks(ctx) {
			if err != nil {
				return Blueprint{}, err
			}
			if n == 0 {
				b.Scope.FirstChunk = c.ID
			}
			b.Scope.LastChunk = c.ID
			n++
		}
	}
	b.Scope.Chunker = fmt.Sprintf("%T", rs.job.Chunker)
	j := &b.Modules[0].Jobs[0]
	j.Validators = validatorNames(rs.job.Validators)
	j.MaxRunRejectRate = rs.job.MaxRunRejectRate
	if j.MaxRunRejectRate == 0 {
		j.MaxRunRejectRate = DefaultMaxRunRejectRate
	}
	c := r.cfg
	b.Limits = backfilltype.BlueprintLimits{Concurrency: c.Concurrency, JobConcurrency: c.JobConcurrency, RowsPerSecond: c.RowsPerSecond,
		MemoryBudget: c.MemoryBudget, MaxAttempts: c.MaxAttempts, RetryBackoff: c.RetryBackoff.String(),
		MaxRejectsPerChunk: noLimit(c.MaxRejectsPerChunk), MaxStagingRejects: c.MaxStagingRejects, MaxMergeRefusals: c.MaxMergeRefusals,
		LockTimeout: c.LockTimeout.String(), StatementTimeout: c.StatementTimeout.String(), HeartbeatInterval: c.HeartbeatInterval.String(),
		StaleAfter: c.StaleAfter.String(), ThrottleInterval: c.throttleInterval().String(), Throttles: []string{}}
	for _, t := range c.Throttles {
		name := "<nil signal>"
		if t.Signal != nil {
			name = t.Signal.Name()
		}
		b.Limits.Throttles = append(b.Limits.Throttles, fmt.Sprintf("%s high %g low %g critical %g min hold %s", name, t.High, t.Low, t.Critical, t.MinHold))
	}
	return b, nil
}

// compareBlueprint sets b's run (when the job's latest run has b's
// fingerprint), previous plan, changes and estimate.
func (r *Runner) compareBlueprint(ctx context.Context, rs runSetup, b *Blueprint) error {
	bs, ok := r.cfg.Manifest.(blueprintStore)
	if !ok {
		return nil
	}
	prev, found, err := bs.PreviousRun(ctx, r.db, b.Job, 0)
	if err != nil {
		return err
	}
	if found && prev.Fingerprint == b.Fingerprint {
		b.BatchID, b.Status = prev.BatchID, prev.Status
		if prev, found, err = bs.PreviousRun(ctx, r.db, b.Job, prev.BatchID); err != nil {
			return err
		}
	}
	if !found {
		return nil
	}
	pb, full, err := bs.RecordedBlueprint(ctx, r.db, prev)
	if err != nil {
		return err
	}
	b.Previous = &backfilltype.BlueprintPrevious{BatchID: prev.BatchID, Status: prev.Status, Fingerprint: prev.Fingerprint}
	cur := *b
	if !full {
		cur = backfilltype.PlanBlueprint(rs.plan)
	}
	b.Changes = backfilltype.BlueprintDiff(pb, cur)
	if prev.Status == RunCompleted && prev.ChunksTotal > 0 {
		totals, err := loadedTotals(ctx, r.cfg.Manifest, r.db, prev.BatchID)
		if err != nil {
			return err
		}
		est := int64(float64(totals.Read) / float64(prev.ChunksTotal) * float64(b.Scope.Chunks))
		b.Scope.EstimatedRows = &est
		b.Scope.EstimateBasis = fmt.Sprintf("batch %d read %d rows in %d chunks", prev.BatchID, totals.Read, prev.ChunksTotal)
	}
	return nil
}

// maxBlueprintDetail is the most bytes of a blueprint recorded whole in
// an event (record_event caps a detail at 65536 characters).
const maxBlueprintDetail = 60_000

// recordBlueprint records the blueprint of run (EventBlueprint) unless
// the latest one recorded for it is the same but for its status. Only
// for a run that will work or awaits approval, with an audit log.
func (r *Runner) recordBlueprint(ctx context.Context, rs runSetup, run Run) error {
	audit := r.caps.audit
	if audit == nil || run.Status != RunRunning && run.Status != RunAwaitingApproval {
		return nil
	}
	b, err := r.blueprintOf(ctx, rs)
	if err == nil {
		err = r.compareBlueprint(ctx, rs, &b)
	}
	if err == nil {
		err = r.blueprintRehearsal(ctx, &b)
	}
	if err != nil {
		return fmt.Errorf("backfill: job %q batch %d: blueprint: %w", rs.job.Name, run.BatchID, err)
	}
	return r.recordBlueprintEvent(ctx, audit, run, rs.job.Name, b)
}

// noLimit is Config.MaxRejectsPerChunk as the blueprint shows it: 0 (the
// Runner's "no limit" once defaults are applied) as -1.
func noLimit(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// recordBlueprintEvent records b as run's blueprint event of job (a job's
// or a graph's name), unless the latest one recorded for the run is the
// same document: the blueprint is recorded when a call first works the
// run and again whenever it changes.
func (r *Runner) recordBlueprintEvent(ctx context.Context, audit backfilldriver.ManifestAudit, run Run, job string, b Blueprint) error {
	b.BatchID, b.Status = run.BatchID, ""
	detail, err := json.Marshal(b)
	if err != nil {
		return err
	}
	if len(detail) > maxBlueprintDetail {
		detail, _ = json.Marshal(map[string]any{"job": b.Job, "batch_id": b.BatchID, "fingerprint": b.Fingerprint, "truncated": true,
			"bytes": len(detail), "recorded_at": time.Now().UTC()})
	}
	events, err := audit.Events(ctx, r.db, run.BatchID)
	if err != nil {
		return err
	}
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].Kind != backfilltype.EventBlueprint {
			continue
		}
		var old Blueprint
		if json.Unmarshal(events[i].Detail, &old) == nil {
			old.Status = ""
			if o, err := json.Marshal(old); err == nil && string(o) == string(detail) {
				return nil
			}
		}
		break
	}
	return audit.RecordEvent(ctx, r.db, backfilltype.Event{BatchID: run.BatchID, Job: job, Kind: backfilltype.EventBlueprint, Actor: r.cfg.WorkerID, Detail: detail})
}
