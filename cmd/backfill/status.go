package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"
)

func newStatusCmd(g *globals) *cobra.Command {
	var (
		sel   selection
		watch time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status [JOB] [--batch N] [--watch[=INTERVAL]]",
		Short: "Show a run's progress: chunks, rows, rates, ETA, chunks in flight, exceptions, liveness",
		Long: `status shows the progress of a run (the job's latest run, or --batch N),
read from the manifest, so it is the same from any machine and counts the
work of every process:

- the run's status and liveness (running, stalled: no heartbeat lately,
  dead: no live worker) and its live workers;
- chunks done/total, open, pending, failed and in flight, and the done
  chunks a replay with SkipUnchanged skipped, their rows unchanged;
- rows by outcome (read, inserted, updated, unchanged, rejected,
  deduplicated); they never decrease across resumes;
- rows/s over the recent window and overall, per working second (time
  throttled, paused or idle excluded), and per wall-clock second;
- the ETA: the remaining planned rows at the rate the run has under the
  knobs in force now (the recent working rate, lowered by the
  rows_per_second, chunks_per_second and concurrency knobs), with the
  share of the run so far that was throttled, paused or idle, which the
  ETA does not foresee; a paused, cancelled, failed or dead run, or one
  held by a throttle, shows no ETA but what it waits for and how to end
  the wait;
- the workers' sessions waiting for a lock now (a chunk's merge behind a
  LOCK TABLE, say), each with the session that blocks it: its pid,
  application, user, state and query;
- the chunks in flight with their worker, host, pid and age;
- the exception queue by reason and column;
- when the job's plan was rehearsed before the run (backfill rehearsals),
  the run against the rehearsal's forecast: duration and rows, with the
  WAL, table, index and undo log growth forecast.

For a graph of modules (Runner.RunGraph: the graph's run is a run of
the graph's name), status shows each module: its state (pending,
running, held by which ancestor, paused, disabled, completed, failed),
chunks done of total and rows, class, priority, flag and dependencies,
and why a module is not running (a backfill.GraphStatus with --json).

--watch refreshes it every 2s (--watch=INTERVAL: every INTERVAL, e.g.
--watch=10s) while the run is running or paused, until Ctrl-C. With --json: one backfill.Status document
(with --watch, one per line).`,
		Example: `  backfill status flights
  backfill status flights_graph
  backfill status --batch 12 --watch
  backfill status flights --json`,
		Args: sel.args("status"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := sel.check(); err != nil {
				return err
			}
			if watch < 0 {
				return fmt.Errorf("%w: --watch %v: an interval is positive", errUsage, watch)
			}
			ctx := cmd.Context()
			db, m, err := g.manifest(ctx, backfill.ActionRead)
			if err != nil {
				return err
			}
			defer db.Close()
			run, err := sel.run(ctx, db, m)
			if err != nil {
				return err
			}
			if backfilltype.IsGraphPlan(run.Plan) {
				return graphStatus(cmd, g, db, m, run, watch)
			}
			return watchStatus(ctx, g, watch, func() (any, string, backfill.RunStatus, error) {
				st, err := m.Status(ctx, db, run.BatchID)
				if err != nil {
					return nil, "", "", err
				}
				text := st.String() + "\n"
				if watch > 0 {
					text = st.AsOf.UTC().Format("2006-01-02 15:04:05Z") + "\n" + text
				}
				return st, text, st.Status, nil
			})
		},
	}
	sel.flags(cmd.Flags())
	cmd.Flags().DurationVar(&watch, "watch", 0, "refresh every 2s, or every INTERVAL with --watch=INTERVAL, while the run is running or paused")
	cmd.Flags().Lookup("watch").NoOptDefVal = "2s"
	return cmd
}

// graphStatus prints the status of the graph whose run is run, per
// module, every watch while it is running or paused.
func graphStatus(cmd *cobra.Command, g *globals, db *sqlx.DB, m *backfill.PGManifest, run backfill.Run, watch time.Duration) error {
	ctx := cmd.Context()
	return watchStatus(ctx, g, watch, func() (any, string, backfill.RunStatus, error) {
		st, err := m.GraphStatus(ctx, db, run.Job)
		if err != nil {
			return nil, "", "", err
		}
		return st, st.Text(), st.Status, nil
	})
}

// watchStatus prints what read returns (v as a JSON line with --json,
// else text), once, or every watch while the status it returns is
// running or paused; a blank line separates the refreshes.
func watchStatus(ctx context.Context, g *globals, watch time.Duration, read func() (v any, text string, status backfill.RunStatus, err error)) error {
	for first := true; ; first = false {
		v, text, status, err := read()
		if err != nil {
			return err
		}
		if g.json {
			if err := g.printJSONLine(v, watch > 0); err != nil {
				return err
			}
		} else {
			if watch > 0 && !first {
				fmt.Fprint(g.out, "\n")
			}
			fmt.Fprint(g.out, text)
		}
		if watch <= 0 || status != backfill.RunRunning && status != backfill.RunPaused {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(watch):
		}
	}
}
