package backfill

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/internal/pgstore"
)

// The manifest's side of throttles ([Config.Throttles]): the throttle periods
// of each run and the job-wide concurrency slots.

// TimeSplit returns how the time of run batchID splits into working,
// throttled (by signal) and paused. Paused spans run from each "run_paused"
// event to the next "run_resumed_by_operator" (or the end). It needs
// [backfilldriver.ManifestThrottle] and [backfilldriver.ManifestAudit]
// (else an error wrapping [ErrUnsupported]).
func (r *Runner) TimeSplit(ctx context.Context, batchID int64) (pgstore.TimeSplit, error) {
	mt, audit := r.caps.throttlePeriods, r.caps.audit
	if mt == nil || audit == nil {
		return pgstore.TimeSplit{}, fmt.Errorf("backfill: time split of batch %d: %w: needs ManifestThrottle and ManifestAudit", batchID, ErrUnsupported)
	}
	run, err := mt.Run(ctx, r.db, batchID)
	if err != nil {
		return pgstore.TimeSplit{}, err
	}
	periods, err := mt.ThrottlePeriods(ctx, r.db, batchID)
	if err != nil {
		return pgstore.TimeSplit{}, err
	}
	events, err := audit.Events(ctx, r.db, batchID)
	if err != nil {
		return pgstore.TimeSplit{}, err
	}
	var now time.Time
	if err := pgstore.ReadTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		return sqlx.GetContext(ctx, tx, &now, `SELECT now()`)
	}); err != nil {
		return pgstore.TimeSplit{}, err
	}
	end := now
	if run.FinishedAt != nil {
		end = *run.FinishedAt
	}
	return pgstore.SplitTime(run.CreatedAt, end, pgstore.PausedSpans(events, end), periods), nil
}
