package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/quote"
)

// rollbackResult is what rollback prints with --json.
type rollbackResult struct {
	BatchID int64  `json:"batch_id"`
	Job     string `json:"job"`
	// Preview is true when nothing was changed.
	Preview bool `json:"preview"`
	// Chunks rolled back (or that would be); Deleted rows the batch
	// inserted, Restored rows it changed that got their prior image back.
	Chunks   int   `json:"chunks"`
	Deleted  int64 `json:"deleted"`
	Restored int64 `json:"restored"`
	// Conflicts counts rows later batches still applied changed or
	// delivered unchanged (ConflictsDelivered); ConflictRows lists up to
	// 100 of them. Without --force, Deleted and Restored leave them out.
	Conflicts          int64          `json:"conflicts"`
	ConflictsDelivered int64          `json:"conflicts_delivered"`
	ConflictRows       []conflictJSON `json:"conflict_rows"`
	// ConflictBatches are the later batches that last changed or
	// delivered those rows, newest first: roll them back first, in this
	// order, and this batch's rollback then restores the rows too.
	ConflictBatches []int64 `json:"conflict_batches"`
	// Status is the run's status after the call.
	Status  string  `json:"status"`
	Seconds float64 `json:"seconds"`
	Actor   string  `json:"actor,omitempty"`
	Why     string  `json:"why,omitempty"`
	// Error is why the rollback was refused or failed ("" if it was not).
	Error string `json:"error,omitempty"`
}

// conflictJSON is one row a later batch changed or delivered unchanged.
type conflictJSON struct {
	// Key is the row's identity as JSON, e.g. {"id": 1}.
	Key       string `json:"key"`
	Batch     int64  `json:"batch"`
	Delivered bool   `json:"delivered"`
}

func newRollbackCmd(g *globals) *cobra.Command {
	var (
		sel                 selection
		preview, force      bool
		why, actor, chunkID string
	)
	cmd := &cobra.Command{
		Use:   "rollback (--preview (--job NAME | --batch N) | --batch N --why TEXT)",
		Short: "Withdraw a batch (or preview it) from what the manifest recorded, without the job's code",
		Long: `rollback withdraws one batch from its target, from what the manifest
recorded when the run started (its plan: target table, business key,
merge mode, lineage columns, rollback mechanism and publish mode), so
that it works from any machine without the job's code
(Runner.RollbackBatch, which does exactly what Runner.Rollback does with
the job). With the undo log, rows the batch inserted are deleted and rows
it changed get their prior image back in reverse commit order, in
transactions of whole chunks (slices of at most 200 chunks and 100,000
restored rows), each marking its chunks rolled back: an interrupted
rollback is completed by running it again. A versioned view or
partition swaps are switched back to the versions the batch replaced.

--preview (with --job NAME for its latest run, or --batch N) says what a
rollback would do, and changes nothing.

Without --preview, --batch N and --why TEXT are required: the rollback
is recorded in the audit trail with the actor (--actor, default the OS
user@host) and why. It first looks for rows that later batches, still
applied, changed or delivered unchanged: it names those batches, lists
the rows and refuses (exit status 1, nothing changed) unless --force,
which overwrites their changes too (and is recorded). Roll the later
batches back first instead, newest first: this batch's rollback then
restores those rows too. A preview counts them apart: without --force
its rows to delete and restore leave them out. --chunk ID rolls back one
chunk of the batch.

With --json: {"batch_id", "job", "preview", "chunks", "deleted",
"restored", "conflicts", "conflicts_delivered", "conflict_rows": [{"key",
"batch", "delivered"}], "conflict_batches" (newest first), "status",
"seconds", "actor", "why", "error"}.`,
		Example: `  backfill rollback --preview --job flights
  backfill rollback --batch 12 --why "wrong fares, ticket OPS-231"
  backfill rollback --batch 12 --why "restated" --actor ann --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !preview {
				switch {
				case sel.batch == 0:
					return fmt.Errorf("%w: rollback needs --batch N, the batch to withdraw (\"backfill runs --job NAME\" lists them); --preview shows what it would do", errUsage)
				case strings.TrimSpace(why) == "":
					return fmt.Errorf("%w: rollback needs --why TEXT, recorded in the audit trail with the actor", errUsage)
				}
			}
			if err := sel.check(); err != nil {
				return err
			}
			if actor == "" {
				actor = osActor()
			}
			ctx := cmd.Context()
			action := backfill.ActionRun
			if preview {
				action = backfill.ActionRead
			}
			db, m, err := g.manifest(ctx, action)
			if err != nil {
				return err
			}
			defer db.Close()
			run, err := sel.run(ctx, db, m)
			if err != nil {
				return err
			}
			// Warnings (a lock held by a session that is not a worker or
			// by a stale worker, retried lock timeouts, transient faults)
			// go to stderr as they happen, naming the holder: a rollback
			// that waits behind an operator's lock is not silent. So does,
			// once, a wait for a chunk in flight of a live worker (until
			// it ends or its lease goes stale), and its end.
			logger := slog.New(newWaitNotes(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelInfo})))
			r, err := backfill.New(db, &backfill.Config{Manifest: m, Logger: logger})
			if err != nil {
				return err
			}
			opts := backfill.RollbackOptions{Preview: preview, Force: force, ChunkID: chunkID}
			if !preview {
				opts.Actor, opts.Why = actor, why
			}
			rep, rerr := r.RollbackBatch(ctx, run.BatchID, opts)
			if rerr != nil && rep.BatchID == 0 {
				return rerr // nothing to report
			}
			res := rollbackResult{BatchID: run.BatchID, Job: run.Job, Preview: preview, Chunks: rep.Chunks, Deleted: rep.Deleted, Restored: rep.Restored,
				Conflicts: rep.Conflicts, ConflictsDelivered: rep.ConflictsDelivered, ConflictRows: []conflictJSON{},
				ConflictBatches: append([]int64{}, rep.ConflictBatches...), Status: string(rep.Status),
				Seconds: rep.Elapsed.Seconds(), Actor: opts.Actor, Why: opts.Why}
			for _, c := range rep.ConflictRows {
				res.ConflictRows = append(res.ConflictRows, conflictJSON{Key: c.Key, Batch: c.Batch, Delivered: c.Delivered})
			}
			if rerr != nil {
				res.Error = strings.TrimPrefix(rerr.Error(), "backfill: ")
			}
			if g.json {
				if err := g.printJSON(res); err != nil {
					return err
				}
				return rerr
			}
			if err := printRollback(g, res, force); err != nil {
				return err
			}
			return rerr
		},
	}
	sel.flags(cmd.Flags())
	f := cmd.Flags()
	f.BoolVar(&preview, "preview", false, "say what the rollback would do; change nothing")
	f.StringVar(&why, "why", "", "why the batch is rolled back (required without --preview; recorded in the audit trail)")
	f.StringVar(&actor, "actor", "", "who rolls it back, recorded in the audit trail (default the OS user@host)")
	f.BoolVar(&force, "force", false, "also roll back rows later batches still applied changed or delivered unchanged")
	f.StringVar(&chunkID, "chunk", "", "roll back only this chunk ID of the batch")
	return cmd
}

// printRollback writes res for people.
func printRollback(g *globals, res rollbackResult, force bool) error {
	w := g.out
	later := res.ConflictBatches
	if res.Preview {
		fmt.Fprintf(w, "preview of the rollback of batch %d (job %q, status %s); nothing was changed\n", res.BatchID, res.Job, res.Status)
		fmt.Fprintf(w, "it would roll back %s: delete %s, restore %s", plural(int64(res.Chunks), "chunk"), plural(res.Deleted, "row"), plural(res.Restored, "row"))
		if res.Conflicts > 0 && !force {
			fmt.Fprintf(w, "; not counted: the %s below, which later %s changed or delivered unchanged since", plural(res.Conflicts, "row"), quote.Batches(later))
		}
		fmt.Fprintln(w)
	} else if res.Error == "" {
		fmt.Fprintf(w, "rolled back batch %d (job %q): %s, %s deleted, %s restored; status %s (took %s)\n", res.BatchID, res.Job,
			plural(int64(res.Chunks), "chunk"), plural(res.Deleted, "row"), plural(res.Restored, "row"), res.Status, human(secondsDuration(res.Seconds)))
	}
	if res.Conflicts == 0 {
		return nil
	}
	first := "roll back " + quote.Batches(later) + " first"
	if len(later) > 1 {
		first += " (newest first)"
	}
	first += ", and this rollback then restores (or deletes) them as well"
	advice := "the rollback is refused unless --force, which overwrites their changes; " + first
	if force {
		advice = "--force rolls them back too, over those changes (or, without it: " + first + ")"
	}
	fmt.Fprintf(w, "%s rows were changed (%s) or delivered unchanged (%s) by later %s, still applied; %s:\n",
		thousands(res.Conflicts), thousands(res.Conflicts-res.ConflictsDelivered), thousands(res.ConflictsDelivered), quote.Batches(later), advice)
	t := newTable(w, "KEY", "LATER BATCH", "HOW")
	shown := res.ConflictRows[:min(10, len(res.ConflictRows))]
	for _, c := range shown {
		how := "changed"
		if c.Delivered {
			how = "delivered unchanged"
		}
		t.row(c.Key, fmt.Sprint(c.Batch), how)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if n := res.Conflicts - int64(len(shown)); n > 0 {
		_, err := fmt.Fprintf(w, "(and %s more; --json lists %d)\n", thousands(n), len(res.ConflictRows))
		return err
	}
	return nil
}

// osActor is the OS user@host, the default actor of the audit trail.
func osActor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return name + "@" + host
}

// waitNotes passes on the warnings and errors of the handler it wraps
// (whose level must let INFO through), and of the INFO records only the
// first of each of waitMessages: a command that waits for a chunk in
// flight says so once, and when the wait ended, rather than nothing (or
// a line every poll).
type waitNotes struct {
	slog.Handler
	mu   *sync.Mutex
	seen map[string]bool
}

// waitMessages are the INFO messages waitNotes passes on, once each.
var waitMessages = map[string]bool{
	"backfill: waiting for a chunk in flight": true,
	"backfill: chunks in flight ended":        true,
}

func newWaitNotes(h slog.Handler) slog.Handler {
	return waitNotes{Handler: h, mu: new(sync.Mutex), seen: map[string]bool{}}
}

func (w waitNotes) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelInfo && w.Handler.Enabled(ctx, l)
}

func (w waitNotes) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		w.mu.Lock()
		pass := waitMessages[r.Message] && !w.seen[r.Message]
		w.seen[r.Message] = true
		w.mu.Unlock()
		if !pass {
			return nil
		}
	}
	return w.Handler.Handle(ctx, r)
}

func (w waitNotes) WithAttrs(as []slog.Attr) slog.Handler {
	return waitNotes{Handler: w.Handler.WithAttrs(as), mu: w.mu, seen: w.seen}
}

func (w waitNotes) WithGroup(name string) slog.Handler {
	return waitNotes{Handler: w.Handler.WithGroup(name), mu: w.mu, seen: w.seen}
}
