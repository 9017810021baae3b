package backfill

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/pgbackfill/backfill/backfilltype"
)

// EventRollbackPreviewed: a rollback was previewed by a named actor
// ([RollbackOptions].Preview with an Actor); Detail holds "why", "chunk",
// "force", the chunks, rows it would delete and restore and the
// conflicts it found, and the run's status ("from" and "to", the same:
// a preview changes nothing).
const EventRollbackPreviewed = backfilltype.EventRollbackPreviewed

// rollbackStatus is the status a rollback of chunk (all chunks for "")
// leaves a run of status from with.
func rollbackStatus(from RunStatus, chunk string) RunStatus {
	if chunk == "" {
		return RunRolledBack
	}
	return from
}

// recordPreview records a preview of a rollback in the audit log when
// the previewer named themselves (opts.Actor): who looked at the fallback
// path, and what it would do then.
func (r *Runner) recordPreview(ctx context.Context, run Run, opts RollbackOptions, rep RollbackReport) error {
	if opts.Actor == "" || r.caps.rollback == nil {
		return nil
	}
	detail, err := json.Marshal(map[string]any{"why": opts.Why, "chunk": opts.ChunkID, "force": opts.Force, "chunks": rep.Chunks,
		"would_delete": rep.Deleted, "would_restore": rep.Restored, "conflicts": rep.Conflicts, "from": run.Status, "to": run.Status})
	if err != nil {
		return err
	}
	if err := r.caps.rollback.RecordEvent(ctx, r.db, backfilltype.Event{BatchID: run.BatchID, Job: run.Job, Kind: EventRollbackPreviewed, Actor: opts.Actor, Detail: detail}); err != nil {
		return fmt.Errorf("backfill: rollback preview of batch %d: record: %w", run.BatchID, err)
	}
	return nil
}
