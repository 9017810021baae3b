package pgstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
)

// JobChunks returns the state of the latest run of each job in jobs (of
// every job in the manifest when jobs is empty), ordered by job name: one
// grouped query on the runs and chunks tables, in a read-only
// transaction. staleAfter is the bound after which a lease of a worker
// that stopped heartbeating is not counted as live (0:
// [backfilltype.DefaultStaleAfter]). A job without a run is absent.
func (m *Manifest) JobChunks(ctx context.Context, db sqlx.ExtContext, staleAfter time.Duration, jobs ...string) ([]backfilltype.JobChunks, error) {
	ctx = m.purpose(ctx, "read the jobs' chunks", 0)
	if staleAfter <= 0 {
		staleAfter = backfilltype.DefaultStaleAfter
	}
	if jobs == nil {
		jobs = []string{} // pq.Array(nil) is NULL
	}
	var rows []struct {
		Job       string                 `db:"job_name"`
		BatchID   int64                  `db:"batch_id"`
		RunStatus backfilltype.RunStatus `db:"run_status"`
		Status    sql.NullString         `db:"chunk_status"`
		Chunks    int64                  `db:"chunks"`
		Skipped   int64                  `db:"skipped"`
		Read      int64                  `db:"rows_read"`
		Inserted  int64                  `db:"rows_inserted"`
		Updated   int64                  `db:"rows_updated"`
		Unchanged int64                  `db:"rows_unchanged"`
		Rejected  int64                  `db:"rows_rejected"`
		Dedup     int64                  `db:"rows_deduplicated"`
		LastDone  sql.NullTime           `db:"last_done"`
		Since     sql.NullFloat64        `db:"since_last_done"`
	}
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = nil // a retried attempt starts over
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`WITH latest AS (
			SELECT DISTINCT ON (job_name) batch_id, job_name, status FROM {s}.runs
			WHERE cardinality($1::text[]) = 0 OR job_name = ANY ($1::text[])
			ORDER BY job_name, batch_id DESC),
		per AS (
			SELECT l.job_name, l.batch_id, l.status AS run_status,
				CASE WHEN c.status = 'pending' AND `+liveLease("$2")+` THEN 'leased' ELSE c.status END AS chunk_status,
				c.rows_read, c.rows_inserted, c.rows_updated, c.rows_unchanged, c.rows_rejected, c.rows_deduplicated,
				c.status IN ('done', 'open') AND c.skipped AS skipped,
				CASE WHEN c.status IN ('done', 'open', 'staged') THEN c.finished_at END AS done_at
			FROM latest l LEFT JOIN {s}.chunks c ON c.batch_id = l.batch_id)
		SELECT job_name, batch_id, run_status, chunk_status, count(chunk_status) AS chunks,
			count(*) FILTER (WHERE skipped) AS skipped,
			coalesce(sum(rows_read) FILTER (WHERE chunk_status IN ('done', 'open', 'staged')), 0) AS rows_read,
			coalesce(sum(rows_inserted) FILTER (WHERE chunk_status IN ('done', 'open', 'staged')), 0) AS rows_inserted,
			coalesce(sum(rows_updated) FILTER (WHERE chunk_status IN ('done', 'open', 'staged')), 0) AS rows_updated,
			coalesce(sum(rows_unchanged) FILTER (WHERE chunk_status IN ('done', 'open', 'staged')), 0) AS rows_unchanged,
			coalesce(sum(rows_rejected) FILTER (WHERE chunk_status IN ('done', 'open', 'staged')), 0) AS rows_rejected,
			coalesce(sum(rows_deduplicated) FILTER (WHERE chunk_status IN ('done', 'open', 'staged')), 0) AS rows_deduplicated,
			max(done_at) AS last_done, extract(epoch FROM now() - max(done_at))::float8 AS since_last_done
		FROM per GROUP BY job_name, batch_id, run_status, chunk_status ORDER BY job_name, chunk_status`),
			pq.Array(jobs), staleAfter.Seconds())
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: chunks of the latest runs of jobs %v: %w", jobs, err)
	}
	var out []backfilltype.JobChunks
	for _, r := range rows {
		if len(out) == 0 || out[len(out)-1].BatchID != r.BatchID {
			out = append(out, backfilltype.JobChunks{Job: r.Job, BatchID: r.BatchID, RunStatus: r.RunStatus, Chunks: map[backfilltype.ChunkStatus]int64{}})
		}
		j := &out[len(out)-1]
		if !r.Status.Valid {
			continue // a run without chunks
		}
		j.Chunks[backfilltype.ChunkStatus(r.Status.String)] = r.Chunks
		j.Skipped += r.Skipped
		j.Counts = j.Counts.Add(backfilltype.Counts{Read: r.Read, Inserted: r.Inserted, Updated: r.Updated, Unchanged: r.Unchanged,
			Rejected: r.Rejected, Deduplicated: r.Dedup})
		if r.LastDone.Valid && r.LastDone.Time.After(j.LastDone) {
			j.LastDone = r.LastDone.Time
			j.SinceLastDone = time.Duration(r.Since.Float64 * float64(time.Second))
		}
	}
	return out, nil
}
