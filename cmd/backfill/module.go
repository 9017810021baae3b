package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgbackfill/backfill"
)

// moduleResult is what module enable|disable prints with --json.
type moduleResult struct {
	Graph  string `json:"graph"`
	Module string `json:"module"`
	// Result is "enabled", "disabled" or "unchanged" (the flag had the
	// value: nothing recorded).
	Result string `json:"result"`
	Actor  string `json:"actor"`
	Reason string `json:"reason"`
}

func newModuleCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "module (enable|disable) GRAPH MODULE --reason TEXT [--actor NAME]",
		Short: "Enable or disable a module of a graph: a recorded plan change",
		Long: `module enable and module disable switch the flag of a module of a graph
of modules (Runner.RunGraph) through the manifest's SQL function
set_module_flag, as an operator role. The flag is part of the graph's
plan and fingerprint: the switch is recorded in the audit trail (actor,
the session's database role, --reason, the old and new value), a run of
the graph awaiting approval (or unfinished) is abandoned with its
approvals, and the next run of the graph has the new fingerprint, which
needs its own approvals ("backfill plan GRAPH" shows the change, e.g.
module.stats.enabled: "false" -> "true"). A disabled module's jobs do not
run and the modules that depend on it are held. Switching a flag to the
value it has records nothing. The graph must have a run (its modules are
read from its plan).`,
		Example: `  backfill module enable flights_graph route_stats --reason "validated on a sample"
  backfill module disable flights_graph route_stats --reason "stats source late" --actor alice`,
	}
	for _, on := range []bool{true, false} {
		verb := "disable"
		if on {
			verb = "enable"
		}
		var actor, reason string
		sub := &cobra.Command{
			Use:   verb + " GRAPH MODULE --reason TEXT [--actor NAME]",
			Short: strings.ToUpper(verb[:1]) + verb[1:] + " a module of a graph",
			RunE: func(cmd *cobra.Command, args []string) error {
				if len(args) != 2 {
					return fmt.Errorf("%w: module %s takes GRAPH and MODULE, got %q", errUsage, verb, args)
				}
				if strings.TrimSpace(reason) == "" {
					return fmt.Errorf("%w: module %s needs --reason TEXT, recorded in the audit trail", errUsage, verb)
				}
				if actor == "" {
					actor = osActor()
				}
				ctx := cmd.Context()
				db, m, err := g.manifest(ctx, backfill.ActionControl, "set_module_flag(text, text, boolean, text, text)")
				if err != nil {
					return err
				}
				defer db.Close()
				res, err := m.SetModuleFlag(ctx, db, args[0], args[1], on, actor, reason)
				if err != nil {
					if errors.Is(err, backfill.ErrInvalidConfig) {
						return fmt.Errorf("%w: %w", errUsage, err)
					}
					return err
				}
				out := moduleResult{Graph: args[0], Module: args[1], Result: res, Actor: actor, Reason: reason}
				text := fmt.Sprintf("module %s of graph %s %s by %s: %s\nthe graph's next run has a new plan fingerprint and needs its own approvals\n", args[1], args[0], res, actor, reason)
				if res == "unchanged" {
					text = fmt.Sprintf("module %s of graph %s unchanged: its flag has that value already; nothing recorded\n", args[1], args[0])
				}
				return g.print(out, text)
			},
		}
		sub.Flags().StringVar(&actor, "actor", "", "who decides, recorded in the audit trail (default the OS user@host)")
		sub.Flags().StringVar(&reason, "reason", "", "why, recorded in the audit trail (required)")
		cmd.AddCommand(sub)
	}
	return cmd
}
