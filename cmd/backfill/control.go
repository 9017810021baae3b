package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/spf13/cobra"

	"github.com/pgbackfill/backfill"
)

// controlResult is what pause, resume, cancel and set print with --json.
type controlResult struct {
	BatchID int64  `json:"batch_id"`
	Job     string `json:"job"`
	Action  string `json:"action"`
	Key     string `json:"key,omitempty"`
	Value   string `json:"value,omitempty"`
	Actor   string `json:"actor"`
	Why     string `json:"why"`
	// Status is the run's status after the decision.
	Status backfill.RunStatus `json:"status"`
}

// controlDoc is what pause, resume, cancel and set have in common.
const controlDoc = `

The decision goes through the manifest's SQL control functions, like
the same call from psql: it is recorded in the run's audit trail
("backfill events") with the actor (--actor, default the OS user@host)
and --why, which is required, and every worker of every process honours
it within about a second (they are notified, and read the control state
between chunks and every throttle interval).`

func newPauseCmd(g *globals) *cobra.Command {
	return newControlCmd(g, "pause", "Pause a run: the chunks in flight finish, nothing more is claimed",
		`pause pauses a running run: no worker claims another chunk; the chunks
in flight finish and are checkpointed; the workers (Runner.Run,
backfill.Work) wait, claiming nothing, until "backfill resume" continues
it (a Run with Config.ReturnOnPause returns ErrRunPaused).`+controlDoc,
		`  backfill pause --job flights --why "replica lag during the sale"`)
}

func newResumeCmd(g *globals) *cobra.Command {
	return newControlCmd(g, "resume", "Resume a paused (or cancelled) run",
		`resume lets a paused run's workers claim chunks again (a quality gate's
pause, a throttle's critical level or an operator's), or makes a
cancelled run resumable: its workers must then be started again (run
the job). A resume accepts the run's rejects so far: the run reject gate
(Job.MaxRunRejectRate) then judges only the rows read after it.`+controlDoc,
		`  backfill resume --job flights --why "lag back under 2 s"`)
}

func newCancelCmd(g *globals) *cobra.Command {
	return newControlCmd(g, "cancel", "Cancel a run: the chunks in flight roll back, the run ends cancelled",
		`cancel ends a run: the chunks in flight are rolled back (each chunk is
either done or pending, never half merged) and the run's status becomes
cancelled, a terminal state: running the job does not restart it; only
"backfill resume" (or Runner.Resume) does, or a new run (Job.NewRun).
The chunks done stay in the target: "backfill rollback" withdraws them.`+controlDoc,
		`  backfill cancel --batch 12 --why "wrong source file"`)
}

func newSetCmd(g *globals) *cobra.Command {
	return newControlCmd(g, "set", "Set a live knob of a run: concurrency, job_concurrency, rows_per_second, throttle thresholds, adaptive chunks",
		`set KEY=VALUE changes a knob of a run, read by every worker of every
process within about a second. A run that is running applies it at once;
a paused, cancelled or failed run keeps it for when it is resumed ("backfill
resume") or run again; a completed, rolled back or abandoned run refuses
it. The knobs:

  concurrency              chunks at once in each process (up to what
                           each Runner was configured with)
  job_concurrency          chunks at once across every process (also
                           processes started without a JobConcurrency)
  rows_per_second          the job-wide rate cap: 0 (none) or at least 1
  throttle.SIGNAL.high     a throttle's high watermark, by signal name
  throttle.SIGNAL.low      its low watermark (a signal the workers do not
                           have is logged by them and ignored); a pair
                           with low above high, or both 0, is refused
  chunk_target_ms          the target duration of a chunk's transaction
                           (Config.ChunkTarget) in milliseconds: a larger
                           chunk is worked in sub-chunks; 0 turns it off
  chunk_max_rows           a cap on the rows of a sub-chunk (0: none)`+controlDoc,
		`  backfill set rows_per_second=2000 --job flights --why "peak hours"
  backfill set throttle.replica_lag.high=5 --batch 12 --why "tighter during the sale"
  backfill set chunk_target_ms=0 --job flights --why "run chunks whole again"`)
}

// newControlCmd builds pause, resume, cancel and set (which takes
// KEY=VALUE).
func newControlCmd(g *globals, action, short, long, example string) *cobra.Command {
	var (
		sel        selection
		why, actor string
	)
	use := action + " (--job NAME | --batch N) --why TEXT"
	if action == "set" {
		use = "set KEY=VALUE (--job NAME | --batch N) --why TEXT"
	}
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Long:    long,
		Example: example,
		RunE: func(cmd *cobra.Command, args []string) error {
			var key, value string
			if action == "set" {
				if len(args) != 1 {
					return fmt.Errorf("%w: set takes one KEY=VALUE, got %q", errUsage, args)
				}
				var ok bool
				key, value, ok = strings.Cut(args[0], "=")
				if !ok || key == "" {
					return fmt.Errorf("%w: set %q: write KEY=VALUE, e.g. rows_per_second=2000", errUsage, args[0])
				}
			} else if len(args) > 0 {
				return fmt.Errorf("%w: %s takes no arguments, got %q", errUsage, action, args)
			}
			if err := sel.check(); err != nil {
				return err
			}
			if strings.TrimSpace(why) == "" {
				return fmt.Errorf("%w: %s needs --why TEXT, recorded in the audit trail with the actor", errUsage, action)
			}
			if actor == "" {
				actor = osActor()
			}
			ctx := cmd.Context()
			// The control function the command calls, by batch id.
			fn := action + "(bigint, text, text)"
			if action == "set" {
				fn = "set_knob(bigint, text, text, text, text)"
			}
			db, m, err := g.manifest(ctx, backfill.ActionControl, fn)
			if err != nil {
				return err
			}
			defer db.Close()
			run, err := sel.run(ctx, db, m)
			if err != nil {
				return err
			}
			switch action {
			case "pause":
				err = m.Pause(ctx, db, run.BatchID, actor, why)
			case "resume":
				err = m.Resume(ctx, db, run.BatchID, actor, why)
			case "cancel":
				err = m.Cancel(ctx, db, run.BatchID, actor, why)
			case "set":
				err = m.SetKnob(ctx, db, backfilltype.SetKnobParams{BatchID: run.BatchID, Key: key, Value: value, Actor: actor, Why: why})
			}
			if err != nil {
				if errors.Is(err, backfill.ErrInvalidConfig) {
					return fmt.Errorf("%w: %w", errUsage, err)
				}
				return err
			}
			after, err := m.Run(ctx, db, run.BatchID)
			if err != nil {
				return err
			}
			res := controlResult{BatchID: run.BatchID, Job: run.Job, Action: action, Key: key, Value: value, Actor: actor, Why: why, Status: after.Status}
			what := map[string]string{"pause": "paused", "resume": "resumed", "cancel": "cancelled"}[action]
			note := ""
			if action == "set" {
				what = "set " + key + " = " + value + " for"
				note = knobPending(after)
			}
			return g.print(res, fmt.Sprintf("%s %s batch %d (now %s), by %s: %s\n%s", what, run.Job, run.BatchID, after.Status, actor, why, note))
		},
	}
	sel.flags(cmd.Flags())
	cmd.Flags().StringVar(&why, "why", "", "why, recorded in the audit trail (required)")
	cmd.Flags().StringVar(&actor, "actor", "", "who decides, recorded in the audit trail (default the OS user@host)")
	return cmd
}

// knobPending says when a knob set on run, which is not running, takes
// effect, with the command that resumes it; "" for a running run.
func knobPending(run backfill.Run) string {
	switch run.Status {
	case backfill.RunPaused, backfill.RunCancelled:
		return fmt.Sprintf("the run is %s: the knob is kept and applies once it is resumed (backfill resume --batch %d --why TEXT)\n", run.Status, run.BatchID)
	case backfill.RunFailed:
		return "the run has failed: the knob is kept and applies when the job is run again\n"
	}
	return ""
}
