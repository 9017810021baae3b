package backfill

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// The manifest's side of throttles (throttle.go): the throttle periods
// of each run and the job-wide concurrency slots.

// ThrottlePeriod is one hold of a [Throttle] by one worker (a call of
// [Runner.Run]), as recorded in the manifest.
type ThrottlePeriod = backfilltype.ThrottlePeriod

// TimeSplit is how a run's time splits: Total = Working + Paused + the
// sum of Throttled. Each instant counts once: paused first, then
// throttled (attributed to the signal whose hold started first, when
// several hold at once, in any process), else working. Working includes
// the time no worker ran (between calls of Run).
type TimeSplit = pgstore.TimeSplit

// TimeSplit returns how the time of run batchID splits into working,
// throttled (by signal) and paused. Paused spans run from each
// "run_paused" event to the next "run_resumed_by_operator" (or the end).
// It needs [ManifestThrottle] and [ManifestAudit] (else an error
// wrapping [ErrUnsupported]).
func (r *Runner) TimeSplit(ctx context.Context, batchID int64) (TimeSplit, error) {
	mt, audit := r.caps.throttlePeriods, r.caps.audit
	if mt == nil || audit == nil {
		return TimeSplit{}, fmt.Errorf("backfill: time split of batch %d: %w: needs ManifestThrottle and ManifestAudit", batchID, ErrUnsupported)
	}
	run, err := mt.Run(ctx, r.db, batchID)
	if err != nil {
		return TimeSplit{}, err
	}
	periods, err := mt.ThrottlePeriods(ctx, r.db, batchID)
	if err != nil {
		return TimeSplit{}, err
	}
	events, err := audit.Events(ctx, r.db, batchID)
	if err != nil {
		return TimeSplit{}, err
	}
	var now time.Time
	if err := pgstore.ReadTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		return sqlx.GetContext(ctx, tx, &now, `SELECT now()`)
	}); err != nil {
		return TimeSplit{}, err
	}
	end := now
	if run.FinishedAt != nil {
		end = *run.FinishedAt
	}
	return pgstore.SplitTime(run.CreatedAt, end, pgstore.PausedSpans(events, end), periods), nil
}
