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
// query on the runs, their rollup (chunk_counts) and their leased chunks,
// in a read-only transaction; its cost does not grow with the runs'
// chunks. staleAfter is the bound after which a lease of a worker that
// stopped heartbeating is not counted as live (0:
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
		// The pending chunks held by a live lease are counted as leased:
		// few (a lease per chunk being worked), read by the index on
		// leased chunks. The latest checkpoint of a done, open or staged
		// chunk walks the index on checkpointed_at from its end.
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`WITH latest AS (
			SELECT DISTINCT ON (job_name) batch_id, job_name, status FROM {s}.runs
			WHERE cardinality($1::text[]) = 0 OR job_name = ANY ($1::text[])
			ORDER BY job_name, batch_id DESC),
		leased AS (
			SELECT l.batch_id, count(*) AS n FROM latest l JOIN {s}.chunks c ON c.batch_id = l.batch_id
			WHERE c.status = 'pending' AND `+liveLease("$2")+`
			GROUP BY l.batch_id),
		per AS (
			SELECT k.batch_id, k.status, sum(k.chunks) AS chunks,
				sum(k.chunks) FILTER (WHERE k.skipped AND k.status IN ('done', 'open')) AS skipped,
				sum(k.rows_read) AS rows_read, sum(k.rows_inserted) AS rows_inserted, sum(k.rows_updated) AS rows_updated,
				sum(k.rows_unchanged) AS rows_unchanged, sum(k.rows_rejected) AS rows_rejected, sum(k.rows_deduplicated) AS rows_deduplicated
			FROM latest l JOIN {s}.chunk_counts k ON k.batch_id = l.batch_id
			GROUP BY k.batch_id, k.status),
		groups AS (
			SELECT p.batch_id, p.status, p.chunks - CASE WHEN p.status = 'pending' THEN coalesce(le.n, 0) ELSE 0 END AS chunks,
				coalesce(p.skipped, 0) AS skipped,
				CASE WHEN p.status IN ('done', 'open', 'staged') THEN p.rows_read ELSE 0 END AS rows_read,
				CASE WHEN p.status IN ('done', 'open', 'staged') THEN p.rows_inserted ELSE 0 END AS rows_inserted,
				CASE WHEN p.status IN ('done', 'open', 'staged') THEN p.rows_updated ELSE 0 END AS rows_updated,
				CASE WHEN p.status IN ('done', 'open', 'staged') THEN p.rows_unchanged ELSE 0 END AS rows_unchanged,
				CASE WHEN p.status IN ('done', 'open', 'staged') THEN p.rows_rejected ELSE 0 END AS rows_rejected,
				CASE WHEN p.status IN ('done', 'open', 'staged') THEN p.rows_deduplicated ELSE 0 END AS rows_deduplicated
			FROM per p LEFT JOIN leased le ON le.batch_id = p.batch_id
			UNION ALL
			SELECT le.batch_id, 'leased', le.n, 0, 0, 0, 0, 0, 0, 0 FROM leased le)
		SELECT l.job_name, l.batch_id, l.status AS run_status, g.status AS chunk_status, coalesce(g.chunks, 0) AS chunks,
			coalesce(g.skipped, 0) AS skipped,
			coalesce(g.rows_read, 0) AS rows_read, coalesce(g.rows_inserted, 0) AS rows_inserted, coalesce(g.rows_updated, 0) AS rows_updated,
			coalesce(g.rows_unchanged, 0) AS rows_unchanged, coalesce(g.rows_rejected, 0) AS rows_rejected,
			coalesce(g.rows_deduplicated, 0) AS rows_deduplicated,
			d.last_done, extract(epoch FROM now() - d.last_done)::float8 AS since_last_done
		FROM latest l
		LEFT JOIN groups g ON g.batch_id = l.batch_id AND g.chunks > 0
		CROSS JOIN LATERAL (SELECT (SELECT c.checkpointed_at FROM {s}.chunks c
			WHERE c.batch_id = l.batch_id AND c.checkpointed_at IS NOT NULL AND c.status IN ('done', 'open', 'staged')
			ORDER BY c.checkpointed_at DESC LIMIT 1) AS last_done) d
		ORDER BY l.job_name, g.status`),
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
