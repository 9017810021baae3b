package main

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgbackfill/backfill"
)

// rehearsalsResult is what rehearsals prints with --json.
type rehearsalsResult struct {
	Rehearsals []backfill.Rehearsal `json:"rehearsals"`
}

func newRehearsalsCmd(g *globals) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:     "rehearsals JOB",
		Aliases: []string{"rehearse"},
		Short:   "Show a job's rehearsals: the chunks rehearsed, what each took, the run's forecast",
		Long: `rehearsals shows the rehearsals of JOB recorded in the manifest, newest
first (--limit N, default 1; 0 for all).

A rehearsal (backfill.Runner.Rehearse) runs a sample of the job's chunks on
the path a run takes (extraction, staging, merge with the undo log,
validators, checkpoint) in transactions it rolls back, and projects the
full run. Only the job's program can rehearse it, since only it has the
job's extractor: call Runner.Rehearse from Go (the flights example has a
-rehearse N flag). This command shows what it recorded:

- per rehearsed chunk: its estimate and rows read, its duration by phase
  (extract, stage, merge, validate, checkpoint), the WAL it wrote, the
  growth of the target's table, its indexes, the undo log and the staging
  (temp) table, the Go heap's peak, the time it waited for key locks and
  the locks its transaction held before its rollback;
- the forecast: the run's duration range at the concurrency assumed, its
  rows, WAL, table, index and undo log growth, and peak heap.

backfill status compares a run with the forecast of the latest rehearsal
of its plan before it. With --json: {"rehearsals": [backfill.Rehearsal]}.`,
		Example: `  backfill rehearsals flights
  backfill rehearsals flights --limit 0 --json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("%w: rehearsals takes one JOB, got %d arguments", errUsage, len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkLimit(limit); err != nil {
				return err
			}
			ctx := cmd.Context()
			db, m, err := g.manifest(ctx, backfill.ActionRead)
			if err != nil {
				return err
			}
			defer db.Close()
			rhs, err := m.Rehearsals(ctx, db, args[0], limit)
			if err != nil {
				return err
			}
			if len(rhs) == 0 {
				// A job the manifest has never seen is not found (exit 3).
				if _, err := m.LatestRun(ctx, db, args[0]); errors.Is(err, backfill.ErrRunNotFound) {
					return fmt.Errorf("%w: no run or rehearsal of job %q in the manifest (schema %q); \"backfill runs\" lists the jobs' runs", errNotFound, args[0], m.Schema())
				} else if err != nil {
					return err
				}
			}
			if g.json {
				return g.printJSON(rehearsalsResult{Rehearsals: append([]backfill.Rehearsal{}, rhs...)})
			}
			if len(rhs) == 0 {
				_, err := fmt.Fprintf(g.out, "no rehearsals of job %s (rehearse it from its program: backfill.Runner.Rehearse)\n", visible(args[0], false))
				return err
			}
			for i, rh := range rhs {
				if i > 0 {
					fmt.Fprintln(g.out)
				}
				if err := printRehearsal(g, rh); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 1, "show the N newest rehearsals (0 for all)")
	return cmd
}

// printRehearsal prints rh: a header, its forecast and a table of its
// chunks.
func printRehearsal(g *globals, rh backfill.Rehearsal) error {
	f := rh.Forecast
	fp := rh.Fingerprint
	if len(fp) > 12 {
		fp = fp[:12]
	}
	fmt.Fprintf(g.out, "rehearsal %d of job %s (plan %s, code %s) at %s by %s: %d of %d chunks\n", rh.ID, visible(rh.Job, false), fp,
		orDash(visible(rh.CodeVersion, false)), utc(&rh.CreatedAt), orDash(visible(rh.Worker, false)), len(rh.Chunks), rh.ChunksTotal)
	fmt.Fprintf(g.out, "forecast (by %s, concurrency %d): duration %s (%s to %s), %s rows, WAL %s, table +%s, indexes +%s, undo log +%s, peak heap %s\n",
		f.Basis, f.Concurrency, human(f.Duration), human(f.DurationLow), human(f.DurationHigh), thousands(f.Rows), bytesText(f.WALBytes),
		bytesText(f.TargetBytes), bytesText(f.IndexBytes), bytesText(f.UndoBytes), bytesText(f.HeapBytes))
	if f.CommitTime > 0 {
		fmt.Fprintf(g.out, "overhead %s of the duration beyond the chunks' transactions: leases, commits (%s each, %s), the run's start (%s) and end\n",
			human(f.Overhead), f.CommitTime.Round(time.Microsecond), orDash(f.Durability), human(f.RunStart))
	}
	t := newTable(g.out, "SEQ", "CHUNK", "EST", "READ", "TIME", "EXTRACT", "STAGE", "MERGE", "VALIDATE", "CHECKPOINT",
		"WAL", "TABLE+", "INDEX+", "UNDO+", "TEMP", "HEAP", "LOCK WAIT", "LOCKS")
	for _, c := range rh.Chunks {
		est := "-"
		if c.EstimatedRows >= 0 {
			est = thousands(c.EstimatedRows)
		}
		locks := 0
		for _, l := range c.Locks {
			locks += l.Count
		}
		p := c.Phases
		t.row(strconv.Itoa(c.Chunk.Seq), clip(visible(c.Chunk.ID, false), 60), est, thousands(c.Counts.Read), human(c.Duration),
			human(p.Extract), human(p.Stage), human(p.Merge), human(p.Validate), human(p.Checkpoint),
			bytesText(c.WALBytes), bytesText(c.TargetBytes), bytesText(c.IndexBytes), bytesText(c.UndoBytes), bytesText(c.TempBytes),
			bytesText(c.HeapBytes), human(c.LockWait), strconv.Itoa(locks))
	}
	return t.flush()
}

// bytesText formats n bytes for people: "512 B", "12.3 KiB", "4.0 GiB".
func bytesText(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), 0
	for (v >= unit || v <= -unit) && i < 5 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[i-1])
}
