package backfill

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// The manifest's side of throttles (throttle.go): the throttle periods
// of each run and the job-wide concurrency slots.

// ThrottlePeriod is one hold of a [Throttle] by one worker (a call of
// [Runner.Run]), as recorded in the manifest.
type ThrottlePeriod struct {
	ID        int64  `db:"id"`
	BatchID   int64  `db:"batch_id"`
	WorkerKey string `db:"worker_key"`
	// Signal is the throttle's [Signal.Name].
	Signal string `db:"signal"`
	// Reason says why it held (the value and the high watermark).
	Reason string `db:"reason"`
	// Value is the reading that started the hold; High and Low are the
	// watermarks in force.
	Value float64 `db:"value"`
	High  float64 `db:"high"`
	Low   float64 `db:"low"`
	// StartedAt and EndedAt are the server's times. EndedAt is nil while
	// the hold lasts; a hold whose worker died without ending it ends, as
	// read by [ManifestThrottle.ThrottlePeriods], at the worker's last
	// heartbeat (Ended reports the end used).
	StartedAt time.Time  `db:"started_at"`
	EndedAt   *time.Time `db:"ended_at"`
	// Ended is EndedAt, or the end assumed for a hold still open: the
	// worker's last heartbeat when it is gone, now when it lives.
	Ended time.Time `db:"ended"`
}

// ManifestThrottle is implemented by manifests that record throttle
// periods and host the job-wide concurrency slots ([Config.JobConcurrency]).
// [PGManifest] does. [Runner.TimeSplit] needs it.
type ManifestThrottle interface {
	// ThrottlePeriods returns the throttle periods of run batchID in the
	// order they started.
	ThrottlePeriods(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]ThrottlePeriod, error)
	// Run returns the run of batchID ([ErrRunNotFound] if none).
	Run(ctx context.Context, db sqlx.ExtContext, batchID int64) (Run, error)
}

// throttleManifest is what a Runner writes for throttles (PGManifest).
type throttleManifest interface {
	ManifestThrottle
	openPeriod(ctx context.Context, db sqlx.ExtContext, p ThrottlePeriod) (int64, error)
	closePeriod(ctx context.Context, db sqlx.ExtContext, id int64, value float64) error
	liveWorkers(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]string, error)
	ensureSlots(ctx context.Context, db sqlx.ExtContext, batchID int64, n int) error
	takeSlot(ctx context.Context, tx sqlx.ExtContext, batchID int64, n int) (bool, error)
}

// ThrottlePeriods implements [ManifestThrottle].
func (m *PGManifest) ThrottlePeriods(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]ThrottlePeriod, error) {
	var out []ThrottlePeriod
	err := readTx(ctx, db, func(tx sqlx.ExtContext) error {
		out = out[:0]
		return sqlx.SelectContext(ctx, tx, &out, m.sql(`SELECT p.id, p.batch_id, p.worker_key, p.signal, p.reason, p.value, p.high, p.low,
			p.started_at, p.ended_at,
			greatest(p.started_at, coalesce(p.ended_at, w.finished_at,
				CASE WHEN w.heartbeat_at < now() - w.stale_after THEN w.heartbeat_at END, now())) AS ended
			FROM {s}.throttle_periods p LEFT JOIN {s}.workers w ON w.worker_key = p.worker_key
			WHERE p.batch_id = $1 ORDER BY p.started_at, p.id`), batchID)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: throttle periods of batch %d: %w", batchID, err)
	}
	return out, nil
}

func (m *PGManifest) openPeriod(ctx context.Context, db sqlx.ExtContext, p ThrottlePeriod) (int64, error) {
	var id int64
	err := inShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		return sqlx.GetContext(ctx, tx, &id, m.sql(`INSERT INTO {s}.throttle_periods (batch_id, worker_key, signal, reason, value, high, low)
			VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`),
			p.BatchID, p.WorkerKey, ManifestText(p.Signal), ManifestText(p.Reason), p.Value, p.High, p.Low)
	})
	return id, err
}

func (m *PGManifest) closePeriod(ctx context.Context, db sqlx.ExtContext, id int64, value float64) error {
	return inShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		_, err := tx.ExecContext(ctx, m.sql(`UPDATE {s}.throttle_periods SET ended_at = now(), end_value = $2 WHERE id = $1 AND ended_at IS NULL`), id, value)
		return err
	})
}

// liveWorkers returns the keys of the run's workers that are working
// and whose heartbeat is fresh.
func (m *PGManifest) liveWorkers(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]string, error) {
	var keys []string
	err := readTx(ctx, db, func(tx sqlx.ExtContext) error {
		keys = keys[:0]
		return sqlx.SelectContext(ctx, tx, &keys, m.sql(`SELECT worker_key FROM {s}.workers
			WHERE batch_id = $1 AND state = 'working' AND heartbeat_at >= now() - stale_after ORDER BY worker_key`), batchID)
	})
	return keys, err
}

// ensureSlots makes sure run batchID has slots 1..n.
func (m *PGManifest) ensureSlots(ctx context.Context, db sqlx.ExtContext, batchID int64, n int) error {
	return inShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		_, err := tx.ExecContext(ctx, m.sql(`INSERT INTO {s}.job_slots (batch_id, slot)
			SELECT $1, g FROM generate_series(1, $2::int) g ON CONFLICT DO NOTHING`), batchID, n)
		return err
	})
}

// takeSlot locks a free slot among 1..n of run batchID in tx, the
// chunk's transaction, until it ends; false when every one is taken.
func (m *PGManifest) takeSlot(ctx context.Context, tx sqlx.ExtContext, batchID int64, n int) (bool, error) {
	var slots []int
	if err := sqlx.SelectContext(ctx, tx, &slots, m.sql(`SELECT slot FROM {s}.job_slots
		WHERE batch_id = $1 AND slot <= $2 ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED`), batchID, n); err != nil {
		return false, fmt.Errorf("backfill: take a job concurrency slot of batch %d: %w", batchID, err)
	}
	return len(slots) > 0, nil
}

// TimeSplit is how a run's time splits: Total = Working + Paused + the
// sum of Throttled. Each instant counts once: paused first, then
// throttled (attributed to the signal whose hold started first, when
// several hold at once, in any process), else working. Working includes
// the time no worker ran (between calls of Run).
type TimeSplit struct {
	// Start is when the run was created; End when it finished, or now.
	Start, End time.Time
	Total      time.Duration
	Working    time.Duration
	Paused     time.Duration
	// Throttled is the time held, by signal name.
	Throttled map[string]time.Duration
}

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
	if err := readTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		return sqlx.GetContext(ctx, tx, &now, `SELECT now()`)
	}); err != nil {
		return TimeSplit{}, err
	}
	end := now
	if run.FinishedAt != nil {
		end = *run.FinishedAt
	}
	return splitTime(run.CreatedAt, end, pausedSpans(events, end), periods), nil
}

type span struct{ from, to time.Time }

// pausedSpans are the spans between "run_paused" and the next
// "run_resumed_by_operator" (or end).
func pausedSpans(events []Event, end time.Time) []span {
	var out []span
	var from *time.Time
	for _, e := range events {
		switch e.Kind {
		case "run_paused":
			if from == nil {
				t := e.CreatedAt
				from = &t
			}
		case "run_resumed_by_operator":
			if from != nil {
				out = append(out, span{*from, e.CreatedAt})
				from = nil
			}
		}
	}
	if from != nil {
		out = append(out, span{*from, end})
	}
	return out
}

// splitTime splits [start, end) by the paused spans and the throttle
// periods (their Ended).
func splitTime(start, end time.Time, paused []span, periods []ThrottlePeriod) TimeSplit {
	ts := TimeSplit{Start: start, End: end, Throttled: map[string]time.Duration{}}
	if !end.After(start) {
		return ts
	}
	ts.Total = end.Sub(start)
	clamp := func(t time.Time) time.Time {
		switch {
		case t.Before(start):
			return start
		case t.After(end):
			return end
		}
		return t
	}
	cuts := []time.Time{start, end}
	for _, s := range paused {
		cuts = append(cuts, clamp(s.from), clamp(s.to))
	}
	for _, p := range periods {
		cuts = append(cuts, clamp(p.StartedAt), clamp(p.Ended))
	}
	slices.SortFunc(cuts, func(a, b time.Time) int { return a.Compare(b) })
	cuts = slices.CompactFunc(cuts, func(a, b time.Time) bool { return a.Equal(b) })
	in := func(t, from, to time.Time) bool { return !t.Before(from) && t.Before(to) }
	for i := 0; i+1 < len(cuts); i++ {
		a, b := cuts[i], cuts[i+1]
		d := b.Sub(a)
		if slices.ContainsFunc(paused, func(s span) bool { return in(a, s.from, s.to) }) {
			ts.Paused += d
			continue
		}
		// periods are in start order: the first that covers a.
		if j := slices.IndexFunc(periods, func(p ThrottlePeriod) bool { return in(a, p.StartedAt, p.Ended) }); j >= 0 {
			ts.Throttled[periods[j].Signal] += d
			continue
		}
		ts.Working += d
	}
	return ts
}

// quotedTable is name (Target.Table) quoted and schema-qualified.
func quotedTable(name string) string { return sqlgen.Table(name) }
