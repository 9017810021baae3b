package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"
)

// eventsResult is what events prints with --json.
type eventsResult struct {
	BatchID int64      `json:"batch_id"`
	Job     string     `json:"job"`
	Events  []eventRow `json:"events"`
}

// eventRow is one entry of the audit trail.
type eventRow struct {
	ID    int64  `json:"id"`
	Kind  string `json:"kind"`
	Actor string `json:"actor"`
	// DBRole is the database role of the session that recorded the event
	// (absent for events recorded before manifest version 23).
	DBRole string `json:"db_role,omitempty"`
	// Detail is the event's data as a JSON object (reason, counts, ...).
	Detail    json.RawMessage `json:"detail"`
	CreatedAt time.Time       `json:"created_at"`
}

func newEventsCmd(g *globals) *cobra.Command {
	var (
		sel   selection
		kinds []string
		limit int
	)
	cmd := &cobra.Command{
		Use:   "events [JOB | --job NAME | --batch N]",
		Short: "Show a run's audit trail: who did what, when and why",
		Long: `events shows the audit trail of one run, oldest first: each entry's time
(UTC), kind (run_started, run_resumed, run_paused, run_completed,
run_failed, handoff, rollback_started, rollback, gate decisions, ...),
actor (a worker ID or an operator's name, as given), the database role
of the session that recorded it (PostgreSQL's session_user) and detail
(a JSON object with the reason, the counts, ...). Entries are appended, never changed.

Filters: --kind KIND (repeatable), --limit N (the latest N; default 0:
all).

With --json: {"batch_id", "job", "events": [{"id", "kind", "actor", "db_role",
"detail", "created_at"}]}.`,
		Example: `  backfill events --job flights
  backfill events --batch 12 --kind rollback --kind run_paused --json`,
		Args: sel.args("events"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkLimit(limit); err != nil {
				return err
			}
			ctx := cmd.Context()
			db, m, run, err := sel.open(ctx, g)
			if err != nil {
				return err
			}
			defer db.Close()
			es, err := m.Events(ctx, db, run.BatchID)
			if err != nil {
				return err
			}
			res := eventsResult{BatchID: run.BatchID, Job: run.Job, Events: []eventRow{}}
			for _, e := range es {
				if len(kinds) > 0 && !slices.Contains(kinds, e.Kind) {
					continue
				}
				detail := e.Detail
				if len(detail) == 0 {
					detail = json.RawMessage("{}")
				}
				res.Events = append(res.Events, eventRow{ID: e.ID, Kind: e.Kind, Actor: e.Actor, DBRole: e.DBRole, Detail: detail, CreatedAt: utcTime(e.CreatedAt)})
			}
			if limit > 0 && len(res.Events) > limit {
				res.Events = res.Events[len(res.Events)-limit:]
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.out, "batch %d of job %q: %s\n", run.BatchID, run.Job, plural(int64(len(res.Events)), "event"))
			if len(res.Events) == 0 {
				return nil
			}
			t := newTable(g.out, "TIME (UTC)", "KIND", "ACTOR", "DB ROLE", "DETAIL")
			for _, e := range res.Events {
				var b bytes.Buffer
				if json.Compact(&b, e.Detail) != nil {
					b.Reset()
					b.Write(e.Detail)
				}
				t.row(utc(&e.CreatedAt), clip(e.Kind, 40), orDash(clip(e.Actor, 40)), orDash(clip(e.DBRole, 40)), clip(b.String(), 120))
			}
			return t.flush()
		},
	}
	sel.flags(cmd.Flags())
	cmd.Flags().StringArrayVar(&kinds, "kind", nil, "only events of this kind (repeatable)")
	cmd.Flags().IntVar(&limit, "limit", 0, "only the latest N events (0: all)")
	return cmd
}
