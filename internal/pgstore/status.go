package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
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

// Status implements [backfilldriver.ManifestStatus] with two statements in
// one read transaction: the run's row of the run_progress view, then its
// chunks in flight and its exceptions by reason and column, as JSON. Its
// cost grows with the run's chunks (one pass over them by index) and the
// distinct reasons of its exception queue (an index-only scan when
// vacuumed).
func (m *Manifest) Status(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.Status, error) {
	var (
		rows       []statusRow
		inFlightJS string
		exJS       string
	)
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = rows[:0]
		if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT * FROM {s}.run_progress WHERE batch_id = $1`), batchID); err != nil {
			return err
		}
		if len(rows) == 0 {
			return nil
		}
		return tx.QueryRowxContext(ctx, m.SQL(`SELECT
			coalesce((SELECT json_agg(f ORDER BY f.since NULLS LAST, f.seq) FROM {s}.chunks_in_flight f WHERE f.batch_id = $1), '[]')::text,
			coalesce((SELECT json_agg(x ORDER BY x.count DESC, x.reason, x.column) FROM (
				SELECT reason, column_name AS column, count(*) AS count FROM {s}.exceptions
				WHERE batch_id = $1 AND failed_attempt IS NULL GROUP BY reason, column_name) x), '[]')::text`), batchID).Scan(&inFlightJS, &exJS)
	})
	if err != nil {
		return backfilltype.Status{}, fmt.Errorf("backfill: status of batch %d: %w", batchID, err)
	}
	if len(rows) == 0 {
		return backfilltype.Status{}, fmt.Errorf("backfill: status of batch %d: %w", batchID, backfilltype.ErrRunNotFound)
	}
	r := rows[0]
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
	return s, nil
}
