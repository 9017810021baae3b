package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/spf13/cobra"
)

// chunksResult is what chunks prints with --json.
type chunksResult struct {
	BatchID int64      `json:"batch_id"`
	Job     string     `json:"job"`
	Status  string     `json:"run_status"`
	Total   int        `json:"total"`
	Chunks  []chunkRow `json:"chunks"`
}

// chunkRow is one chunk of chunks.
type chunkRow struct {
	Seq    int    `json:"seq"`
	ID     string `json:"chunk_id"`
	Status string `json:"status"`
	// Attempts counts the attempts made, and the one under way of a
	// chunk in flight.
	Attempts   int        `json:"attempts"`
	Rows       rowCounts  `json:"rows"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	Seconds    *float64   `json:"seconds"`
	// Worker is the worker that completed the chunk, or holds the lease
	// of a chunk in flight.
	Worker string `json:"worker"`
	Error  string `json:"error"`
	// Skipped: the chunk's staging and merge were skipped, its rows
	// unchanged (backfill.Job.SkipUnchanged).
	Skipped bool `json:"skipped"`
	// Leased: the chunk is in flight, pending or staged with its lease
	// held by a live worker.
	Leased bool `json:"leased"`
}

// chunkFilters are the values chunks --status accepts: the chunk
// statuses, "leased" (in flight) and "skipped".
var chunkFilters = append(slices.Clone(chunkStatuses), string(backfilltype.ChunkLeased), "skipped")

// matches reports whether the chunk passes the --status filter f: its
// status ("pending" and "staged" leave out the chunks in flight), or
// "leased" for a chunk in flight, or "skipped" for one whose staging and
// merge a replay skipped.
func (c chunkRow) matches(f string) bool {
	switch f {
	case "":
		return true
	case string(backfilltype.ChunkLeased):
		return c.Leased
	case "skipped":
		return c.Skipped
	}
	return c.Status == f && !c.Leased
}

func newChunksCmd(g *globals) *cobra.Command {
	var (
		sel    selection
		status string
		limit  int
	)
	cmd := &cobra.Command{
		Use:   "chunks [JOB | --job NAME | --batch N]",
		Short: "List a run's chunks: status, row counts, attempts, error, worker",
		Long: `chunks lists the chunks of one run in plan order: the sequence number and
chunk ID, the status (pending, staged, done, open, failed, rolled_back;
"done (skipped)" for a chunk whose staging and merge a replay with
SkipUnchanged skipped, its rows unchanged; "pending (leased)" for a chunk
in flight, its lease held by a live worker), its rows by outcome, the attempts made, when it started and finished
(UTC) and how long it took, the worker that completed it (for a chunk in
flight: the worker holding its lease, its attempts counting the one under
way), and the last error (the whole text with --json; cut to one line in
the table).

Filters: --status (a status, or leased: the chunks in flight, or
skipped), --limit N (default 0: all).

With --json: {"batch_id", "job", "run_status", "total", "chunks": [{"seq",
"chunk_id", "status", "attempts", "rows": {"read", "inserted", "updated",
"unchanged", "rejected", "deduplicated"}, "started_at", "finished_at",
"seconds", "worker", "error", "skipped", "leased"}]}; total counts the chunks that match the
filters before --limit.`,
		Example: `  backfill chunks flights
  backfill chunks flights --status leased
  backfill chunks --batch 12 --status failed --json`,
		Args: sel.args("chunks"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := oneOf("status", status, chunkFilters); err != nil {
				return err
			}
			if err := checkLimit(limit); err != nil {
				return err
			}
			ctx := cmd.Context()
			db, m, run, err := sel.open(ctx, g)
			if err != nil {
				return err
			}
			defer db.Close()
			states, err := m.Chunks(ctx, db, run.BatchID)
			if err != nil {
				return err
			}
			// The chunks in flight: pending or staged in the manifest,
			// their lease held by a live worker.
			leased := map[string]backfilltype.ChunkInFlight{}
			if run.Status == backfill.RunRunning || run.Status == backfill.RunPaused {
				st, err := m.Status(ctx, db, run.BatchID)
				if err != nil {
					return err
				}
				for _, f := range st.InFlight {
					leased[f.ChunkID] = f
				}
			}
			res := chunksResult{BatchID: run.BatchID, Job: run.Job, Status: string(run.Status), Chunks: []chunkRow{}}
			for _, s := range states {
				row := chunkRowOf(s)
				f, inFlight := leased[row.ID]
				row.Leased = inFlight && (s.Status == backfilltype.ChunkPending || s.Status == "staged")
				if row.Leased {
					// The lease holder works the chunk now, and its
					// attempt is under way.
					row.Worker = holderOf(f)
					row.Attempts++
				}
				if !row.matches(status) {
					continue
				}
				res.Total++
				if limit > 0 && len(res.Chunks) >= limit {
					continue
				}
				res.Chunks = append(res.Chunks, row)
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.out, "batch %d of job %q (%s): %s%s\n", run.BatchID, run.Job, run.Status, plural(int64(res.Total), "chunk"), statusText(status))
			if len(res.Chunks) == 0 {
				return nil
			}
			now := time.Now()
			t := newTable(g.out, "SEQ", "CHUNK", "STATUS", "READ", "INSERTED", "UPDATED", "UNCHANGED", "REJECTED", "DEDUPLICATED", "ATTEMPTS", "TOOK", "WORKER", "ERROR")
			for _, c := range res.Chunks {
				took := "-"
				if c.FinishedAt != nil {
					took = span(c.StartedAt, c.FinishedAt, now)
				}
				status := c.Status
				if c.Skipped {
					status += " (skipped)"
				}
				if c.Leased {
					status += " (leased)"
				}
				t.row(fmt.Sprint(c.Seq), c.ID, status, thousands(c.Rows.Read), thousands(c.Rows.Inserted), thousands(c.Rows.Updated),
					thousands(c.Rows.Unchanged), thousands(c.Rows.Rejected), thousands(c.Rows.Deduplicated), fmt.Sprint(c.Attempts), took,
					orDash(c.Worker), orDash(clip(c.Error, 80)))
			}
			if err := t.flush(); err != nil {
				return err
			}
			if len(res.Chunks) < res.Total {
				_, err := fmt.Fprintf(g.out, "(%s of %s shown: --limit %d)\n", thousands(int64(len(res.Chunks))), thousands(int64(res.Total)), limit)
				return err
			}
			return nil
		},
	}
	sel.flags(cmd.Flags())
	cmd.Flags().StringVar(&status, "status", "", "only chunks with this status: "+strings.Join(chunkFilters, ", "))
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many chunks, in plan order (0: all)")
	return cmd
}

// chunkRowOf is s as chunks prints it.
func chunkRowOf(s backfilltype.ChunkState) chunkRow {
	return chunkRow{Seq: s.Chunk.Seq, ID: s.Chunk.ID, Status: string(s.Status), Attempts: s.Attempts,
		Rows:      rowCounts{Read: s.Read, Inserted: s.Inserted, Updated: s.Updated, Unchanged: s.Unchanged, Rejected: s.Rejected, Deduplicated: s.Deduplicated},
		StartedAt: utcPtr(s.StartedAt), FinishedAt: utcPtr(s.FinishedAt), Seconds: seconds(s.StartedAt, s.FinishedAt), Worker: s.Worker, Error: s.LastError,
		Skipped: s.Skipped}
}

// holderOf names the worker that holds the lease of chunk f: its
// WorkerID, with its host and PID when known.
func holderOf(f backfilltype.ChunkInFlight) string {
	id := f.WorkerID
	if id == "" {
		id = f.WorkerKey
	}
	if f.Host != "" || f.PID != 0 {
		id += fmt.Sprintf(" (%s:%d)", f.Host, f.PID)
	}
	return strings.TrimSpace(id)
}

// statusText describes a --status filter.
func statusText(status string) string {
	if status == "" {
		return ""
	}
	return " with status " + status
}
