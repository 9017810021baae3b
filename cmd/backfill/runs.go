package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/lib/pq"
	"github.com/spf13/cobra"

	"github.com/pgbackfill/backfill"
)

// runStatuses are the run statuses --status accepts.
var runStatuses = []string{"running", "paused", "cancelled", "completed", "failed", "abandoned", "rolled_back"}

// chunkStatuses are the chunk statuses --status accepts.
var chunkStatuses = []string{"pending", "staged", "done", "open", "failed", "rolled_back"}

// runsResult is what runs prints with --json.
type runsResult struct {
	Runs []runRow `json:"runs"`
}

// runRow is one run of runs: its chunks by status and its rows by outcome
// (sums over its chunks).
type runRow struct {
	BatchID     int64      `json:"batch_id" db:"batch_id"`
	Job         string     `json:"job" db:"job_name"`
	Status      string     `json:"status" db:"status"`
	StartedBy   string     `json:"started_by" db:"started_by"`
	CodeVersion string     `json:"code_version" db:"code_version"`
	StartedAt   time.Time  `json:"started_at" db:"created_at"`
	FinishedAt  *time.Time `json:"finished_at" db:"finished_at"`
	// Seconds is from start to finish (null while unfinished).
	Seconds   *float64  `json:"seconds" db:"-"`
	LastError string    `json:"last_error" db:"last_error"`
	Chunks    runChunks `json:"chunks" db:"-"`
	Rows      rowCounts `json:"rows" db:"-"`
}

// runChunks counts a run's chunks by status.
type runChunks struct {
	Total      int `json:"total" db:"chunks_total"`
	Done       int `json:"done" db:"chunks_done"`
	Open       int `json:"open" db:"chunks_open"`
	Pending    int `json:"pending" db:"chunks_pending"`
	Failed     int `json:"failed" db:"chunks_failed"`
	RolledBack int `json:"rolled_back" db:"chunks_rolled_back"`
	// Skipped counts the done chunks whose staging and merge were
	// skipped, their rows unchanged (backfill.Job.SkipUnchanged).
	Skipped int `json:"skipped" db:"chunks_skipped"`
}

// rowCounts are rows by outcome: read = inserted + updated + unchanged +
// rejected + deduplicated.
type rowCounts struct {
	Read         int64 `json:"read" db:"rows_read"`
	Inserted     int64 `json:"inserted" db:"rows_inserted"`
	Updated      int64 `json:"updated" db:"rows_updated"`
	Unchanged    int64 `json:"unchanged" db:"rows_unchanged"`
	Rejected     int64 `json:"rejected" db:"rows_rejected"`
	Deduplicated int64 `json:"deduplicated" db:"rows_deduplicated"`
}

func newRunsCmd(g *globals) *cobra.Command {
	var (
		job, status string
		limit       int
	)
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List recent runs: job, batch, status, times, chunks and rows",
		Long: `runs lists the most recent runs (newest first), one per batch: the job,
the batch ID, the status, who started it, when it started and finished
(UTC) and how long it took, its chunks done of the total, and its rows by
outcome, summed over its chunks (read = inserted + updated + unchanged +
rejected + deduplicated).

Filters: --job NAME, --status (running, paused, completed, failed,
abandoned, rolled_back), --limit N (default 20; 0 for all).

With --json: {"runs": [{"batch_id", "job", "status", "started_by",
"code_version", "started_at", "finished_at", "seconds", "last_error",
"chunks": {"total", "done", "open", "pending", "failed", "rolled_back",
"skipped"},
"rows": {"read", "inserted", "updated", "unchanged", "rejected",
"deduplicated"}}]}.`,
		Example: `  backfill runs
  backfill runs --job flights --status failed
  backfill runs --limit 0 --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := oneOf("status", status, runStatuses); err != nil {
				return err
			}
			if err := checkLimit(limit); err != nil {
				return err
			}
			ctx := cmd.Context()
			db, m, err := g.manifest(ctx, backfill.ActionRead)
			if err != nil {
				return err
			}
			defer db.Close()
			s := pq.QuoteIdentifier(m.Schema())
			q := `SELECT r.batch_id, r.job_name, r.status, r.started_by, r.code_version, r.created_at, r.finished_at, r.last_error, r.chunks_total,
				count(c.seq) FILTER (WHERE c.status = 'done') AS chunks_done,
				count(c.seq) FILTER (WHERE c.status = 'open') AS chunks_open,
				count(c.seq) FILTER (WHERE c.status IN ('pending', 'staged')) AS chunks_pending,
				count(c.seq) FILTER (WHERE c.status = 'failed') AS chunks_failed,
				count(c.seq) FILTER (WHERE c.status = 'rolled_back') AS chunks_rolled_back,
				count(c.seq) FILTER (WHERE c.status IN ('done', 'open') AND c.skipped) AS chunks_skipped,
				coalesce(sum(c.rows_read), 0) AS rows_read, coalesce(sum(c.rows_inserted), 0) AS rows_inserted,
				coalesce(sum(c.rows_updated), 0) AS rows_updated, coalesce(sum(c.rows_unchanged), 0) AS rows_unchanged,
				coalesce(sum(c.rows_rejected), 0) AS rows_rejected, coalesce(sum(c.rows_deduplicated), 0) AS rows_deduplicated
				FROM ` + s + `.runs r LEFT JOIN ` + s + `.chunks c ON c.batch_id = r.batch_id
				WHERE ($1 = '' OR r.job_name = $1) AND ($2 = '' OR r.status = $2)
				GROUP BY r.batch_id ORDER BY r.batch_id DESC LIMIT nullif($3, 0)`
			var rows []struct {
				runRow
				runChunks
				rowCounts
			}
			if err := readTx(ctx, db, func(tx *sqlxTx) error { return tx.SelectContext(ctx, &rows, q, job, status, limit) }); err != nil {
				return fmt.Errorf("runs: %w", err)
			}
			res := runsResult{Runs: []runRow{}}
			for _, r := range rows {
				row := r.runRow
				row.Chunks, row.Rows = r.runChunks, r.rowCounts
				row.Seconds = seconds(&row.StartedAt, row.FinishedAt)
				row.StartedAt, row.FinishedAt = utcTime(row.StartedAt), utcPtr(row.FinishedAt)
				res.Runs = append(res.Runs, row)
			}
			if g.json {
				return g.printJSON(res)
			}
			if len(res.Runs) == 0 {
				_, err := fmt.Fprintln(g.out, "no runs"+filtersText(job, status))
				return err
			}
			now := time.Now()
			t := newTable(g.out, "BATCH", "JOB", "STATUS", "STARTED (UTC)", "FINISHED (UTC)", "TOOK", "CHUNKS", "READ", "INSERTED", "UPDATED", "UNCHANGED", "REJECTED", "DEDUPLICATED")
			for _, r := range res.Runs {
				chunks := fmt.Sprintf("%s/%s", thousands(int64(r.Chunks.Done)), thousands(int64(r.Chunks.Total)))
				if r.Chunks.Failed > 0 {
					chunks += fmt.Sprintf(" (%s failed)", thousands(int64(r.Chunks.Failed)))
				}
				if r.Chunks.Skipped > 0 {
					chunks += fmt.Sprintf(" (%s skipped)", thousands(int64(r.Chunks.Skipped)))
				}
				t.row(fmt.Sprint(r.BatchID), r.Job, r.Status, utc(&r.StartedAt), utc(r.FinishedAt), span(&r.StartedAt, r.FinishedAt, now), chunks,
					thousands(r.Rows.Read), thousands(r.Rows.Inserted), thousands(r.Rows.Updated), thousands(r.Rows.Unchanged),
					thousands(r.Rows.Rejected), thousands(r.Rows.Deduplicated))
			}
			return t.flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&job, "job", "", "only the runs of this job")
	f.StringVar(&status, "status", "", "only runs with this status: "+strings.Join(runStatuses, ", "))
	f.IntVar(&limit, "limit", 20, "at most this many runs, newest first (0: all)")
	return cmd
}

// filtersText describes the filters of an empty listing.
func filtersText(job, status string) string {
	var parts []string
	if job != "" {
		parts = append(parts, fmt.Sprintf("job %q", job))
	}
	if status != "" {
		parts = append(parts, "status "+status)
	}
	if len(parts) == 0 {
		return ""
	}
	return " with " + strings.Join(parts, " and ")
}
