package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/quote"
)

// ChunkSummary is what a run's report and checkLoaded read of its
// chunks.
type ChunkSummary struct {
	// Done, open and other count the chunks done, open, and in any other
	// status.
	Done, Open, Other int `json:"-" db:"-"`
	// Skipped counts the done and open chunks whose latest checkpoint
	// skipped their staging and merge (ChunkState.Skipped).
	Skipped int `json:"-" db:"-"`
	// Counts sums the counts of the done and open chunks.
	Counts backfilltype.Counts `json:"-" db:"-"`
	// OpenIDs lists the open chunks' IDs in Seq order.
	OpenIDs []string `json:"-" db:"-"`
}

// StatusWindow describes the recent window of [Status.RecentRate]: the
// last StatusWindowSeconds of wall time or the last StatusWindowChunks
// checkpoints, whichever reaches further back; its rate is per second of
// working time within it.
const (
	StatusWindowSeconds = 20
	StatusWindowChunks  = 20
)

var _ backfilldriver.ManifestStatus = (*Manifest)(nil)

// statusRow is a row of the run_progress view.
type statusRow struct {
	BatchID           int64      `db:"batch_id"`
	Job               string     `db:"job_name"`
	Status            string     `db:"status"`
	Liveness          *string    `db:"liveness"`
	LiveWorkers       *int       `db:"live_workers"`
	LastHeartbeat     *time.Time `db:"last_heartbeat"`
	CreatedAt         time.Time  `db:"created_at"`
	AsOf              time.Time  `db:"as_of"`
	Total             int        `db:"chunks_total"`
	Done              int        `db:"chunks_done"`
	Open              int        `db:"chunks_open"`
	Pending           int        `db:"chunks_pending"`
	Failed            int        `db:"chunks_failed"`
	Staged            int        `db:"chunks_staged"`
	RolledBack        int        `db:"chunks_rolled_back"`
	Other             int        `db:"chunks_other"`
	Leased            int        `db:"chunks_leased"`
	Skipped           int        `db:"chunks_skipped"`
	Read              int64      `db:"rows_read"`
	Inserted          int64      `db:"rows_inserted"`
	Updated           int64      `db:"rows_updated"`
	Unchanged         int64      `db:"rows_unchanged"`
	Rejected          int64      `db:"rows_rejected"`
	Deduplicated      int64      `db:"rows_deduplicated"`
	Processed         int64      `db:"rows_processed"`
	Reads             int64      `db:"chunk_reads"`
	LastCheckpoint    *time.Time `db:"last_checkpoint"`
	TotalSeconds      float64    `db:"total_seconds"`
	WorkingSeconds    float64    `db:"working_seconds"`
	ThrottledSeconds  float64    `db:"throttled_seconds"`
	PausedSeconds     float64    `db:"paused_seconds"`
	IdleSeconds       float64    `db:"idle_seconds"`
	ThrottledFraction *float64   `db:"throttled_fraction"`
	WindowStart       time.Time  `db:"window_start"`
	WindowRows        int64      `db:"window_rows"`
	WindowWorking     float64    `db:"window_working_seconds"`
	RecentRate        *float64   `db:"recent_rate"`
	OverallRate       *float64   `db:"overall_rate"`
	WallRate          *float64   `db:"wall_rate"`
	RemainingRows     *float64   `db:"remaining_rows"`
	RemainingChunks   int        `db:"remaining_chunks"`
	ETASeconds        *float64   `db:"eta_seconds"`
}

// Status implements [backfilldriver.ManifestStatus] with three statements
// in one read transaction: the run's row of the run_progress view (through
// run_progress_of, whose plan the session keeps), the inputs of its ETA,
// then its chunks in flight, its exceptions by reason and column and its
// throttle warnings (its events of backfilltype.EventSignalInert), as
// JSON. The counts come from the run's rollups (chunk_counts,
// exception_counts: a few rows per run, kept by triggers in the writing
// transactions), the latest checkpoints and the recent window from the
// index on checkpointed_at, the chunks in flight from the index on leased
// chunks: its cost does not grow with the run's chunks nor its queued
// exceptions, only with the distinct reasons and columns of its
// exception queue, and with the plan chunks worked in sub-chunks (one
// index probe each: subchunksInProgressSQL).
func (m *Manifest) Status(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.Status, error) {
	ctx = m.purpose(ctx, "read the run's status", batchID)
	var (
		rows       []statusRow
		inFlightJS string
		exJS       string
		warnJS     string
		waitsJS    string
		in         etaInputs
	)
	err := SnapshotReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = rows[:0]
		if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT * FROM {s}.run_progress_of($1)`), batchID); err != nil {
			return err
		}
		if len(rows) == 0 {
			return nil
		}
		if err := m.readETAInputs(ctx, tx, batchID, rows[0].WindowStart, rows[0].AsOf, &in); err != nil {
			return err
		}
		if err := sqlx.GetContext(ctx, tx, &in.sub, m.SQL(subchunksInProgressSQL), batchID, rows[0].WindowStart, rows[0].AsOf, in.knobFrom()); err != nil {
			return err
		}
		if rows[0].RolledBack > 0 && rows[0].Status != string(backfilltype.RunRolledBack) {
			// Chunks rolled back in a batch that is not: a chunk's rollback
			// (which leaves the batch as it is), or a whole batch's that
			// was interrupted between its slices. The latest rollback
			// event tells them apart; read only when chunks are rolled back.
			in.rollback = nil
			var ev []rollbackEvent
			if err := sqlx.SelectContext(ctx, tx, &ev, m.SQL(`SELECT kind, actor, coalesce(detail->>'why', '') AS why,
				coalesce(detail->>'chunk', '') AS chunk, created_at
				FROM {s}.events WHERE batch_id = $1 AND kind IN ('rollback_started', 'rollback', 'rollback_chunk')
				ORDER BY id DESC LIMIT 1`), batchID); err != nil {
				return err
			}
			if len(ev) == 1 && ev[0].Kind == "rollback_started" && ev[0].Chunk == "" {
				in.rollback = &ev[0]
			}
		}
		return tx.QueryRowxContext(ctx, m.SQL(`SELECT
			coalesce((SELECT json_agg(f ORDER BY f.since NULLS LAST, f.seq) FROM {s}.chunks_in_flight f WHERE f.batch_id = $1), '[]')::text,
			coalesce((SELECT json_agg(x ORDER BY x.count DESC, x.reason, x.column) FROM (
				SELECT reason, column_name AS column, sum(n) AS count FROM {s}.exception_counts
				WHERE batch_id = $1 GROUP BY reason, column_name) x), '[]')::text,
			`+throttleWarningsSQL+`,
			`+lockWaitsSQL), batchID).Scan(&inFlightJS, &exJS, &warnJS, &waitsJS)
	})
	if err != nil {
		return backfilltype.Status{}, fmt.Errorf("backfill: status of batch %d: %w", batchID, m.readDenied(ctx, db, err))
	}
	if len(rows) == 0 {
		return backfilltype.Status{}, fmt.Errorf("backfill: status of batch %d: %w", batchID, backfilltype.ErrRunNotFound)
	}
	r := rows[0]
	in.sub.addTo(&r)
	s := backfilltype.Status{BatchID: r.BatchID, Job: r.Job, Status: backfilltype.RunStatus(r.Status), LastHeartbeat: r.LastHeartbeat,
		CreatedAt: r.CreatedAt, AsOf: r.AsOf,
		Chunks: backfilltype.StatusChunks{Total: r.Total, Done: r.Done, Open: r.Open, Pending: r.Pending, Failed: r.Failed,
			Staged: r.Staged, RolledBack: r.RolledBack, Other: r.Other, InFlight: r.Leased, Skipped: r.Skipped},
		Rows:          backfilltype.Counts{Read: r.Read, Inserted: r.Inserted, Updated: r.Updated, Unchanged: r.Unchanged, Rejected: r.Rejected, Deduplicated: r.Deduplicated},
		RowsProcessed: r.Processed, ChunkReads: r.Reads, LastCheckpoint: r.LastCheckpoint,
		Time: backfilltype.StatusTime{TotalSeconds: r.TotalSeconds, WorkingSeconds: r.WorkingSeconds, ThrottledSeconds: r.ThrottledSeconds,
			PausedSeconds: r.PausedSeconds, IdleSeconds: r.IdleSeconds},
		RecentRate: r.RecentRate, WindowStart: r.WindowStart, OverallRate: r.OverallRate, WallRate: r.WallRate,
		RemainingChunks: r.RemainingChunks, RemainingRows: r.RemainingRows, ETASeconds: r.ETASeconds,
		InFlight: []backfilltype.ChunkInFlight{}, Exceptions: []backfilltype.ExceptionCount{}}
	if r.Liveness != nil {
		s.Liveness = *r.Liveness
	}
	if r.LiveWorkers != nil {
		s.LiveWorkers = *r.LiveWorkers
	}
	if r.ThrottledFraction != nil {
		s.Time.ThrottledFraction = *r.ThrottledFraction
	}
	var inFlight []struct {
		Seq        int        `json:"seq"`
		ChunkID    string     `json:"chunk_id"`
		WorkerKey  *string    `json:"worker_key"`
		WorkerID   string     `json:"worker_id"`
		Host       string     `json:"host"`
		PID        int        `json:"pid"`
		Since      *time.Time `json:"since"`
		AgeSeconds *float64   `json:"age_seconds"`
		Stale      bool       `json:"stale"`
	}
	if err := json.Unmarshal([]byte(inFlightJS), &inFlight); err != nil {
		return backfilltype.Status{}, fmt.Errorf("backfill: status of batch %d: chunks in flight: %w", batchID, err)
	}
	for _, f := range inFlight {
		c := backfilltype.ChunkInFlight{Seq: f.Seq, ChunkID: f.ChunkID, WorkerID: f.WorkerID, Host: f.Host, PID: f.PID, Since: f.Since, Stale: f.Stale}
		if f.WorkerKey != nil {
			c.WorkerKey = *f.WorkerKey
		}
		if f.AgeSeconds != nil {
			c.AgeSeconds = *f.AgeSeconds
		}
		s.InFlight = append(s.InFlight, c)
	}
	if err := json.Unmarshal([]byte(exJS), &s.Exceptions); err != nil {
		return backfilltype.Status{}, fmt.Errorf("backfill: status of batch %d: exceptions: %w", batchID, err)
	}
	if err := json.Unmarshal([]byte(warnJS), &s.ThrottleWarnings); err != nil {
		return backfilltype.Status{}, fmt.Errorf("backfill: status of batch %d: throttle warnings: %w", batchID, err)
	}
	if len(s.ThrottleWarnings) == 0 {
		s.ThrottleWarnings = nil
	}
	if err := json.Unmarshal([]byte(waitsJS), &s.LockWaits); err != nil {
		return backfilltype.Status{}, fmt.Errorf("backfill: status of batch %d: lock waits: %w", batchID, err)
	}
	if len(s.LockWaits) == 0 {
		s.LockWaits = nil
	}
	if err := json.Unmarshal([]byte(in.KnobsJS), &in.knobs); err != nil {
		return backfilltype.Status{}, fmt.Errorf("backfill: status of batch %d: knobs: %w", batchID, err)
	}
	m.applyETA(&s, r, in)
	if s.Forecast, err = m.ForecastCheck(ctx, db, s); err != nil {
		return backfilltype.Status{}, err
	}
	if err := m.statusApproval(ctx, db, &s); err != nil {
		return backfilltype.Status{}, fmt.Errorf("backfill: status of batch %d: %w", batchID, err)
	}
	return s, nil
}

// etaInputs is what the ETA reads beside the run_progress view: the
// run's reason of a pause or cancel and when it came, its knobs, the
// throttle holds of its live workers, and the busy time of the chunks of
// the recent window.
type etaInputs struct {
	Reason  string     `db:"last_error"`
	Since   *time.Time `db:"since"`
	KnobsJS string     `db:"knobs"`
	Holding int        `db:"holding"`
	Holds   *string    `db:"holds"`
	// Busy sums the seconds within the recent window of the chunks
	// checkpointed in it, from their start: over the window's working
	// seconds, the chunks at once it ran.
	Busy *float64 `db:"busy"`
	// KnobAt is when a knob of the run was last set, KnobKey which, when
	// that falls within the recent window (else nil); ResumedAt when the
	// run was last resumed; KnobRows the rows of the chunks checkpointed
	// since the later of the two (knobFrom).
	KnobAt    *time.Time `db:"knob_at"`
	KnobKey   *string    `db:"knob_key"`
	ResumedAt *time.Time `db:"resumed_at"`
	KnobRows  *int64     `db:"knob_rows"`
	// Throttled is the time within the recent window some worker of the
	// run waited for the pace of the rate cap or of an adaptive
	// throttle's cut rate (their throttle periods' union): the window's
	// working time leaves it out. Holds are not in it: they end.
	Throttled float64 `db:"window_throttled"`
	knobs     map[string]float64
	// sub is what the committed sub-chunks of plan chunks not done add.
	sub subchunkProgress
	// rollback is the start of a whole batch's rollback that has not
	// finished (interrupted between its slices), nil if none.
	rollback *rollbackEvent
}

// subchunkProgress sums the committed sub-chunks of a run's plan
// chunks that are not done (pending or failed: worked in sub-chunks,
// adaptive chunks): their rows are in the target, not yet in their plan
// chunk's counts (which take the sums when the last sub-chunk commits).
type subchunkProgress struct {
	Read         int64 `db:"rows_read"`
	Inserted     int64 `db:"rows_inserted"`
	Updated      int64 `db:"rows_updated"`
	Unchanged    int64 `db:"rows_unchanged"`
	Rejected     int64 `db:"rows_rejected"`
	Deduplicated int64 `db:"rows_deduplicated"`
	// WindowRead are the rows read of those committed within the recent
	// window, KnobRead since the latest knob change (etaInputs.knobFrom).
	WindowRead int64 `db:"window_read"`
	KnobRead   int64 `db:"knob_read"`
}

// subchunksInProgressSQL reads the subchunkProgress of run $1 with the
// recent window ($2, $3] and the latest knob change $4 (null: none in
// the window): the plan chunks with sub-chunks, by a skip
// scan of the sub-chunks' primary key (one probe per such plan chunk),
// those pending or failed, and their sub-chunks.
const subchunksInProgressSQL = `WITH RECURSIVE split(seq) AS (
		SELECT min(seq) FROM {s}.subchunks WHERE batch_id = $1
		UNION ALL
		SELECT (SELECT min(x.seq) FROM {s}.subchunks x WHERE x.batch_id = $1 AND x.seq > split.seq) FROM split WHERE split.seq IS NOT NULL)
	SELECT coalesce(sum(s.rows_read), 0)::bigint AS rows_read, coalesce(sum(s.rows_inserted), 0)::bigint AS rows_inserted,
		coalesce(sum(s.rows_updated), 0)::bigint AS rows_updated, coalesce(sum(s.rows_unchanged), 0)::bigint AS rows_unchanged,
		coalesce(sum(s.rows_rejected), 0)::bigint AS rows_rejected, coalesce(sum(s.rows_deduplicated), 0)::bigint AS rows_deduplicated,
		coalesce(sum(s.rows_read) FILTER (WHERE s.committed_at > $2 AND s.committed_at <= $3), 0)::bigint AS window_read,
		coalesce(sum(s.rows_read) FILTER (WHERE s.committed_at > $4 AND s.committed_at <= $3), 0)::bigint AS knob_read
	FROM split JOIN {s}.chunks c ON c.batch_id = $1 AND c.seq = split.seq AND c.status IN ('pending', 'failed')
	JOIN {s}.subchunks s ON s.batch_id = $1 AND s.seq = split.seq`

// addTo adds p to the counts of r, the rows processed, and the recent
// window's rows and rate.
func (p subchunkProgress) addTo(r *statusRow) {
	r.Read += p.Read
	r.Inserted += p.Inserted
	r.Updated += p.Updated
	r.Unchanged += p.Unchanged
	r.Rejected += p.Rejected
	r.Deduplicated += p.Deduplicated
	r.Processed += p.Read
	if p.Read > 0 && r.WorkingSeconds > 0 {
		v := float64(r.Processed) / r.WorkingSeconds
		r.OverallRate = &v
	}
	if p.Read > 0 && r.TotalSeconds > 0 {
		v := float64(r.Processed) / r.TotalSeconds
		r.WallRate = &v
	}
	if p.WindowRead > 0 && r.WindowWorking >= 1 {
		r.WindowRows += p.WindowRead
		v := float64(r.WindowRows) / r.WindowWorking
		r.RecentRate = &v
	}
}

// knobFrom is where the rate since the latest knob change starts: the
// change, or the run's latest resume when later (the time paused is no
// working time); nil when no knob changed within the recent window.
func (in etaInputs) knobFrom() *time.Time {
	if in.KnobAt == nil {
		return nil
	}
	if in.ResumedAt != nil && in.ResumedAt.After(*in.KnobAt) {
		return in.ResumedAt
	}
	return in.KnobAt
}

// rollbackEvent is a rollback's event in the audit log.
type rollbackEvent struct {
	Kind      string    `db:"kind"`
	Actor     string    `db:"actor"`
	Why       string    `db:"why"`
	Chunk     string    `db:"chunk"`
	CreatedAt time.Time `db:"created_at"`
}

// RateSignalName is the signal of the throttle periods of the rate cap's
// waits (backfill.RateSignalName): a wait paced by the cap is the rate
// the ETA uses, not a hold.
const RateSignalName = "rows_per_second"

// readETAInputs reads in for run batchID, whose recent window runs from
// windowStart to asOf.
func (m *Manifest) readETAInputs(ctx context.Context, tx sqlx.ExtContext, batchID int64, windowStart, asOf time.Time, in *etaInputs) error {
	return sqlx.GetContext(ctx, tx, in, m.SQL(`SELECT r.last_error, ev.since, k.knob_at, k.knob_key, k.resumed_at,
		CASE WHEN k.knob_at IS NOT NULL THEN (SELECT coalesce(sum(c.rows_read), 0)::bigint FROM {s}.chunks c WHERE c.batch_id = r.batch_id
			AND c.checkpointed_at > greatest(k.knob_at, k.resumed_at) AND c.checkpointed_at <= $3) END AS knob_rows,
		coalesce((SELECT json_object_agg(k.key, k.value) FROM {s}.knobs k WHERE k.batch_id = r.batch_id), '{}')::text AS knobs,
		(SELECT count(DISTINCT w.worker_key) FROM {s}.throttle_periods p JOIN {s}.workers w ON w.worker_key = p.worker_key
			WHERE p.batch_id = r.batch_id AND p.ended_at IS NULL AND p.signal <> $4 AND w.finished_at IS NULL AND w.heartbeat_at >= now() - w.stale_after) AS holding,
		(SELECT string_agg(DISTINCT p.signal || ' (' || p.reason || ')', ', ') FROM {s}.throttle_periods p JOIN {s}.workers w ON w.worker_key = p.worker_key
			WHERE p.batch_id = r.batch_id AND p.ended_at IS NULL AND p.signal <> $4 AND w.finished_at IS NULL AND w.heartbeat_at >= now() - w.stale_after) AS holds,
		(SELECT sum(extract(epoch FROM c.checkpointed_at - greatest(c.started_at, $2)))::float8
			FROM {s}.chunks c WHERE c.batch_id = r.batch_id AND c.checkpointed_at > $2 AND c.checkpointed_at <= $3 AND c.started_at IS NOT NULL) AS busy,
		(SELECT coalesce(sum(extract(epoch FROM upper(z) - lower(z))), 0)::float8 FROM unnest((
			SELECT range_agg(tstzrange(greatest(p.started_at, $2), least(coalesce(p.ended_at, $3), $3)))
			FROM {s}.throttle_periods p WHERE p.batch_id = r.batch_id AND p.started_at < $3 AND coalesce(p.ended_at, $3) > $2
				AND (p.signal = $4 OR p.reason LIKE '%rate cut to %'))) z) AS window_throttled
		FROM {s}.runs r
		CROSS JOIN LATERAL (SELECT max(e.created_at) AS since FROM {s}.events e WHERE e.batch_id = r.batch_id AND e.kind LIKE 'run\_%') ev
		LEFT JOIN LATERAL (SELECT e.created_at AS knob_at, e.detail->>'key' AS knob_key,
			(SELECT max(x.created_at) FROM {s}.events x WHERE x.batch_id = r.batch_id AND x.kind LIKE 'run\_resumed%') AS resumed_at
			FROM {s}.events e WHERE e.batch_id = r.batch_id AND e.kind = 'knob_set' ORDER BY e.id DESC LIMIT 1) k ON k.knob_at > $2
		WHERE r.batch_id = $1`), batchID, windowStart, asOf, RateSignalName)
}

// applyETA sets s's ETA from the rate the run has under the knobs and
// throttles in force now, or, for a run that is not working, says what it
// waits for instead (backfilltype.Status.Waiting).
func (m *Manifest) applyETA(s *backfilltype.Status, r statusRow, in etaInputs) {
	s.ETASeconds, s.ETARate, s.ETABasis = nil, nil, ""
	since := ""
	if in.Since != nil {
		since = " since " + in.Since.UTC().Format("2006-01-02 15:04:05Z")
	}
	resume := fmt.Sprintf("SELECT %s.resume(%d, 'ACTOR', 'WHY') or backfill resume%s --batch %d --why WHY",
		quote.SQLIdent(m.Schema()), s.BatchID, quote.SchemaFlag(m.Schema()), s.BatchID)
	reason := in.Reason
	if rb := in.rollback; rb != nil {
		// A batch partly rolled back: its status stays what it was until
		// the rollback's last transaction, so say so before anything else.
		who := rb.Actor
		if rb.Why != "" {
			who += ": " + rb.Why
		}
		s.Waiting = fmt.Sprintf("a rollback of this batch started %s (%s) did not finish: %d of %d chunks marked rolled back (the rows they updated restored), the others as the run left them, and the rows the batch inserted stay until the rollback's last step deletes them: run it again to finish it (backfill rollback%s --batch %d --why WHY, or Runner.RollbackBatch)",
			rb.CreatedAt.UTC().Format("2006-01-02 15:04:05Z"), who, s.Chunks.RolledBack, s.Chunks.Total, quote.SchemaFlag(m.Schema()), s.BatchID)
		return
	}
	switch s.Status {
	case backfilltype.RunPaused:
		if reason == "" {
			reason = "paused"
		}
		s.Waiting = fmt.Sprintf("%s%s: waits to be resumed: %s", reason, since, resume)
		return
	case backfilltype.RunCancelled:
		s.Waiting = fmt.Sprintf("%s%s: to go on, resume it (%s) and run the job again, or start a new run", reason, since, resume)
		return
	case backfilltype.RunFailed:
		s.Waiting = fmt.Sprintf("failed%s: %s: run the job again to retry its failed chunks once the cause is fixed", since, reason)
		return
	case backfilltype.RunRunning:
	default:
		if r.RemainingChunks == 0 {
			zero := 0.0
			s.ETASeconds = &zero
		}
		return
	}
	if r.RemainingChunks == 0 {
		zero := 0.0
		s.ETASeconds = &zero
		return
	}
	if s.Liveness == LivenessDead || s.Liveness == LivenessStalled {
		// No worker heartbeats within its stale bound: stalled (a worker
		// heartbeated within twice it: perhaps only frozen, perhaps
		// killed) or dead; either way nothing works the run now.
		hb := " (no worker ever registered)"
		if s.LastHeartbeat != nil {
			hb = " since the last heartbeat, " + s.LastHeartbeat.UTC().Format("2006-01-02 15:04:05Z")
		}
		state := ""
		if s.Liveness == LivenessStalled {
			state = "; stalled: its workers stopped heartbeating and count as dead at twice their stale bound"
		}
		s.Waiting = fmt.Sprintf("no live worker%s%s: start a worker (backfill.Work, or Runner.Run with the job) to go on", hb, state)
		return
	}
	if in.Holding > 0 && in.Holding >= s.LiveWorkers && in.Holds != nil {
		s.Waiting = "held by throttle " + *in.Holds + ": no chunk is claimed until it releases"
		return
	}
	rate, basis := r.RecentRate, "the recent working rate"
	if rate == nil {
		rate, basis = r.OverallRate, "the overall working rate"
	}
	if rate == nil || *rate <= 0 || r.RemainingRows == nil {
		return
	}
	v := *rate
	if r.RecentRate != nil && in.Throttled >= 1 && r.WindowRows > 0 {
		// The run was paced within the window (a rate cap's waits, an
		// adaptive throttle's cut rate): the working rate leaves those
		// waits out, but they go on, so the ETA counts them, whether the
		// cap is a knob or in the Config.
		paced := float64(r.WindowRows) / (r.WindowWorking + in.Throttled)
		v, basis = paced, fmt.Sprintf("the recent rate, rate-cap waits included (%.0f%% of the window)", 100*in.Throttled/(r.WindowWorking+in.Throttled))
	}
	measured := false
	if from := in.knobFrom(); from != nil {
		// A knob (a throttle's watermark, the rate cap, the concurrency,
		// the chunk size) was set within the recent window, whose rate
		// mixes the setting before: the rate since the change, throttle
		// holds included (what a throttle's setting changes), once it
		// ran a second and committed rows; until then the recent rate,
		// saying so.
		key, at := "", from.UTC().Format("2006-01-02 15:04:05Z")
		if in.KnobKey != nil {
			key = *in.KnobKey
		}
		rows := in.sub.KnobRead
		if in.KnobRows != nil {
			rows += *in.KnobRows
		}
		if secs := r.AsOf.Sub(*from).Seconds(); secs >= 1 && rows > 0 {
			v, basis, measured = float64(rows)/secs, fmt.Sprintf("the rate since knob %s was set at %s, throttle holds included", key, at), true
		} else {
			basis = fmt.Sprintf("%s before knob %s was set at %s: too recent to measure its effect", basis, key, at)
		}
	}
	// The concurrency knobs in force: fewer chunks at once than the
	// window saw lower the rate in proportion (a rate measured since the
	// latest knob change has them).
	if in.Busy != nil && *in.Busy > 0 && r.WindowWorking >= 1 && !measured {
		parallel := *in.Busy / r.WindowWorking
		now := math.Inf(1)
		if c, ok := in.knobs[KnobConcurrency]; ok && s.LiveWorkers > 0 {
			now = c * float64(s.LiveWorkers)
		}
		if c, ok := in.knobs[KnobJobConcurrency]; ok {
			now = min(now, c)
		}
		if now < parallel {
			chunks := "chunks"
			if now == 1 {
				chunks = "chunk"
			}
			v, basis = v*now/parallel, fmt.Sprintf("%s scaled to %g %s at once by the concurrency knobs (%.1f in the window)", basis, now, chunks, parallel)
		}
	}
	if c, ok := in.knobs[KnobRowsPerSecond]; ok && c > 0 && c < v {
		v, basis = c, fmt.Sprintf("the rows_per_second knob (%g)", c)
	}
	if c, ok := in.knobs["chunks_per_second"]; ok && c > 0 && r.RemainingChunks > 0 {
		if cv := c * *r.RemainingRows / float64(r.RemainingChunks); cv < v {
			v, basis = cv, fmt.Sprintf("the chunks_per_second knob (%g)", c)
		}
	}
	eta := *r.RemainingRows / v
	s.ETASeconds, s.ETARate, s.ETABasis = &eta, &v, basis
}

// lockWaitsSQL lists, as JSON, the sessions of the live workers of run $1
// that wait for a lock now (backfilltype.Status.LockWaits): a chunk's
// transaction sets its application_name to "backfill <worker key> ...",
// and a worker's other sessions carry its key the same way. Blockers are
// asked of pg_blocking_pids only for the waiting sessions.
const lockWaitsSQL = `coalesce((SELECT json_agg(json_build_object('worker_id', x.worker_id, 'host', x.host, 'pid', x.os_pid,
				'backend_pid', x.pid, 'wait_event', x.wait_event, 'seconds', x.seconds, 'blocker_pid', coalesce(b.pid, 0),
				'blocker_app', btrim(coalesce(b.application_name, '')), 'blocker_user', coalesce(b.usename::text, ''),
				'blocker_state', coalesce(b.state, ''), 'blocker_query', left(regexp_replace(coalesce(b.query, ''), '\s+', ' ', 'g'), 200))
				ORDER BY x.seconds DESC, x.pid) FROM (
				SELECT w.worker_id, w.host, w.pid AS os_pid, a.pid, coalesce(a.wait_event, '') AS wait_event,
					extract(epoch FROM now() - coalesce((SELECT min(l.waitstart) FROM pg_locks l WHERE l.pid = a.pid AND NOT l.granted), a.state_change))::float8 AS seconds,
					(pg_blocking_pids(a.pid))[1] AS blocker
				FROM {s}.workers w JOIN pg_stat_activity a ON a.application_name LIKE 'backfill ' || w.worker_key || ' %'
				WHERE w.batch_id = $1 AND w.finished_at IS NULL AND a.wait_event_type = 'Lock') x
				LEFT JOIN pg_stat_activity b ON b.pid = x.blocker), '[]')::text`
