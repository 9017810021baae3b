package pgstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// ThrottleManifest is what a Runner writes for throttles ([Manifest]).
type ThrottleManifest interface {
	backfilldriver.ManifestThrottle
	// OpenPeriod records the start of a throttle period
	// ([Manifest.OpenPeriod]).
	OpenPeriod(ctx context.Context, db sqlx.ExtContext, p backfilltype.ThrottlePeriod) (int64, error)
	// ClosePeriod records its end ([Manifest.ClosePeriod]).
	ClosePeriod(ctx context.Context, db sqlx.ExtContext, id int64, value float64) error
	// LiveWorkers returns the run's live workers ([Manifest.LiveWorkers]).
	LiveWorkers(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]string, error)
}

// ThrottlePeriods implements [backfilldriver.ManifestThrottle].
func (m *Manifest) ThrottlePeriods(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.ThrottlePeriod, error) {
	ctx = m.purpose(ctx, "read throttle periods", batchID)
	var out []backfilltype.ThrottlePeriod
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		out = out[:0]
		return sqlx.SelectContext(ctx, tx, &out, m.SQL(`SELECT p.id, p.batch_id, p.worker_key, p.signal, p.reason, p.value, p.high, p.low,
			p.started_at, p.ended_at,
			greatest(p.started_at, coalesce(p.ended_at, w.finished_at,
				CASE WHEN w.heartbeat_at < now() - w.stale_after THEN {s}.worker_last_life(w.worker_key) END, now())) AS ended
			FROM {s}.throttle_periods p LEFT JOIN {s}.workers w ON w.worker_key = p.worker_key
			WHERE p.batch_id = $1 ORDER BY p.started_at, p.id`), batchID)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: throttle periods of batch %d: %w", batchID, err)
	}
	return out, nil
}

// OpenPeriod inserts throttle period p (its BatchID, WorkerKey, Signal,
// Reason, Value, High and Low; started now, by the server's clock, and
// open) into the throttle_periods table, in a short transaction of its
// own, and returns its id for [Manifest.ClosePeriod].
func (m *Manifest) OpenPeriod(ctx context.Context, db sqlx.ExtContext, p backfilltype.ThrottlePeriod) (int64, error) {
	ctx = m.purpose(ctx, "open a throttle period", p.BatchID)
	var id int64
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		return sqlx.GetContext(ctx, tx, &id, m.SQL(`INSERT INTO {s}.throttle_periods (batch_id, worker_key, signal, reason, value, high, low)
			VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`),
			p.BatchID, p.WorkerKey, ManifestText(p.Signal), ManifestText(p.Reason), p.Value, p.High, p.Low)
	})
	return id, err
}

// ClosePeriod ends throttle period id now (the server's clock), with the
// signal's value at its end, in a short transaction of its own. A period
// already closed, or no period id, is left as it is, without error.
func (m *Manifest) ClosePeriod(ctx context.Context, db sqlx.ExtContext, id int64, value float64) error {
	ctx = m.purpose(ctx, "close a throttle period", 0)
	return InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		_, err := tx.ExecContext(ctx, m.SQL(`UPDATE {s}.throttle_periods SET ended_at = now(), end_value = $2 WHERE id = $1 AND ended_at IS NULL`), id, value)
		return err
	})
}

// LiveWorkers returns the keys of the run's workers that are working
// and whose heartbeat is fresh.
func (m *Manifest) LiveWorkers(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]string, error) {
	ctx = m.purpose(ctx, "read the live workers", batchID)
	var keys []string
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		keys = keys[:0]
		return sqlx.SelectContext(ctx, tx, &keys, m.SQL(`SELECT worker_key FROM {s}.workers
			WHERE batch_id = $1 AND state = 'working' AND heartbeat_at >= now() - stale_after ORDER BY worker_key`), batchID)
	})
	return keys, err
}

type span struct{ from, to time.Time }

// The split of a run's time, the one definition of the run_progress view
// (working_seconds, throttled_seconds, paused_seconds, idle_seconds), in
// Go for the report and Runner.TimeSplit: each instant of [created_at,
// end) counts once, paused (PausedSpans) first, then throttled (a
// throttle period, to its Ended), then idle (no worker of the run alive:
// WorkerSpans; a run with no worker registered has none), else working.
// end is RunEnd.

// runEndSQL is the end of a run's measured time (the view's as_of): when
// it finished; now while it is running or paused; else its last update.
const runEndSQL = `coalesce(r.finished_at, CASE WHEN r.status IN ('running', 'paused') THEN now() ELSE greatest(r.updated_at, r.created_at) END)`

// RunTimeSplit splits the time of run batchID, read in tx with its
// events and throttle periods, as the run_progress view does; it also
// returns the paused spans.
func (m *Manifest) RunTimeSplit(ctx context.Context, tx sqlx.ExtContext, batchID int64, events []backfilltype.Event, periods []backfilltype.ThrottlePeriod) (backfilltype.TimeSplit, []span, error) {
	var r struct {
		CreatedAt time.Time `db:"created_at"`
		End       time.Time `db:"t_end"`
	}
	if err := sqlx.GetContext(ctx, tx, &r, m.SQL(`SELECT r.created_at, `+runEndSQL+` AS t_end FROM {s}.runs r WHERE r.batch_id = $1`), batchID); err != nil {
		return backfilltype.TimeSplit{}, nil, fmt.Errorf("time split: %w", err)
	}
	var ws []struct {
		From time.Time `db:"started_at"`
		To   time.Time `db:"alive_to"`
	}
	if err := sqlx.SelectContext(ctx, tx, &ws, m.SQL(`SELECT started_at, greatest(started_at, coalesce(finished_at,
		CASE WHEN heartbeat_at < now() - stale_after THEN {s}.worker_last_life(worker_key) END, now())) AS alive_to
		FROM {s}.workers WHERE batch_id = $1`), batchID); err != nil {
		return backfilltype.TimeSplit{}, nil, fmt.Errorf("time split: workers: %w", err)
	}
	var alive []span
	for _, w := range ws {
		alive = append(alive, span{w.From, w.To})
	}
	paused := PausedSpans(events, r.End)
	return SplitTime(r.CreatedAt, r.End, paused, periods, alive), paused, nil
}

// PausedSpans are the spans from each "run_paused" event to the run's
// next event of another "run_..." kind (a resume, a cancel, the end), or
// end. events are in the order recorded.
func PausedSpans(events []backfilltype.Event, end time.Time) []span {
	var out []span
	for i, e := range events {
		if e.Kind != "run_paused" {
			continue
		}
		to := end
		for _, n := range events[i+1:] {
			if strings.HasPrefix(n.Kind, "run_") && n.Kind != "run_paused" {
				to = n.CreatedAt
				break
			}
		}
		if to.Before(e.CreatedAt) {
			to = e.CreatedAt
		}
		// Pauses in a row merge into the first's span.
		if k := len(out); k > 0 && !e.CreatedAt.After(out[k-1].to) {
			if to.After(out[k-1].to) {
				out[k-1].to = to
			}
			continue
		}
		out = append(out, span{e.CreatedAt, to})
	}
	return out
}

// WorkerSpans are the spans each worker was alive: from its start to its
// finish, to its last heartbeat when it stopped heartbeating (stale), or
// to now. Nil when no worker registered.
func WorkerSpans(workers []backfilltype.Worker, now time.Time) []span {
	var out []span
	for _, w := range workers {
		to := now
		switch {
		case w.FinishedAt != nil:
			to = *w.FinishedAt
		case w.Stale:
			to = w.HeartbeatAt
		}
		if to.Before(w.StartedAt) {
			to = w.StartedAt
		}
		out = append(out, span{w.StartedAt, to})
	}
	return out
}

// SplitTime splits [start, end) by the paused spans, the throttle periods
// (their Ended) and the workers' alive spans (nil: no worker registered,
// no idle time).
func SplitTime(start, end time.Time, paused []span, periods []backfilltype.ThrottlePeriod, alive []span) backfilltype.TimeSplit {
	ts := backfilltype.TimeSplit{Start: start, End: end, Throttled: map[string]time.Duration{}}
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
	for _, s := range alive {
		cuts = append(cuts, clamp(s.from), clamp(s.to))
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
		if j := slices.IndexFunc(periods, func(p backfilltype.ThrottlePeriod) bool { return in(a, p.StartedAt, p.Ended) }); j >= 0 {
			ts.Throttled[periods[j].Signal] += d
			continue
		}
		if alive != nil && !slices.ContainsFunc(alive, func(s span) bool { return in(a, s.from, s.to) }) {
			ts.Idle += d
			continue
		}
		ts.Working += d
	}
	return ts
}

// QuotedTable is name (Target.Table) quoted and schema-qualified.
func QuotedTable(name string) string { return sqlgen.Table(name) }

// SignalNoter records whether the throttle signals of a run observe what
// they guard ([Manifest.NoteSignal]).
type SignalNoter interface {
	NoteSignal(ctx context.Context, db sqlx.ExtContext, n SignalNote) error
}

// SignalNote is what a worker found of one throttle signal: Inert, with
// Why, when it guards nothing.
type SignalNote struct {
	BatchID int64
	Job     string
	// Worker is the worker's Config.WorkerID.
	Worker string
	Signal string
	Inert  bool
	Why    string
}

// NoteSignal records n in run n.BatchID's audit trail, in a short
// transaction, as an event backfilltype.EventSignalInert (n.Inert) or
// backfilltype.EventSignalObserves, only when the run's latest such event
// of the signal says otherwise (another kind, or another why); a signal
// with no such event counts as observing, so a signal that observes from
// the start records nothing.
func (m *Manifest) NoteSignal(ctx context.Context, db sqlx.ExtContext, n SignalNote) error {
	ctx = m.purpose(ctx, "note a throttle signal", 0)
	kind, why := backfilltype.EventSignalObserves, ""
	if n.Inert {
		kind, why = backfilltype.EventSignalInert, FitChars(ManifestText(n.Why), MaxReasonChars)
	}
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		// Through record_event, as the library's other events: the
		// loader does not write the audit log directly.
		_, err := tx.ExecContext(ctx, m.SQL(`SELECT {s}.record_event($1, $2, $3, '', jsonb_build_object('signal', $4::text, 'why', $5::text, 'worker', $6::text))
			WHERE (SELECT row(e.kind, coalesce(e.detail->>'why', '')) FROM {s}.events e
					WHERE e.batch_id = $1 AND e.kind IN ($7, $8) AND e.detail->>'signal' = $4::text ORDER BY e.id DESC LIMIT 1)
				IS DISTINCT FROM row($3::text, $5::text)
				AND ($3 <> $8 OR EXISTS (SELECT FROM {s}.events e WHERE e.batch_id = $1 AND e.kind = $7 AND e.detail->>'signal' = $4::text))`),
			n.BatchID, n.Job, kind, FitChars(ManifestText(n.Signal), MaxActorChars), why, FitChars(ManifestText(n.Worker), MaxActorChars),
			backfilltype.EventSignalInert, backfilltype.EventSignalObserves)
		return err
	})
	if err != nil {
		return fmt.Errorf("backfill: batch %d: record whether throttle signal %s observes what it guards: %w", n.BatchID, n.Signal, err)
	}
	return nil
}

// throttleWarningsSQL is the run $1's throttle signals whose latest
// EventSignalInert or EventSignalObserves event is the former, as a JSON
// array of backfilltype.ThrottleWarning, by signal.
const throttleWarningsSQL = `coalesce((SELECT json_agg(json_build_object('signal', x.signal, 'why', x.why, 'since', x.created_at) ORDER BY x.signal) FROM (
				SELECT DISTINCT ON (e.detail->>'signal') e.detail->>'signal' AS signal, coalesce(e.detail->>'why', '') AS why, e.created_at, e.kind
				FROM {s}.events e WHERE e.batch_id = $1 AND e.kind IN ('` + backfilltype.EventSignalInert + `', '` + backfilltype.EventSignalObserves + `')
				ORDER BY e.detail->>'signal', e.id DESC) x WHERE x.kind = '` + backfilltype.EventSignalInert + `'), '[]')::text`
