package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgbackfill/backfill"
)

// migrateResult is what migrate prints with --json.
type migrateResult struct {
	Schema  string   `json:"schema"`
	From    int      `json:"from_version"`
	To      int      `json:"to_version"`
	Granted []string `json:"granted,omitempty"`
	// NotGranted: privileges a --grant role still lacks after its GRANT
	// (the caller holds them without grant option); the exit status is 1.
	NotGranted []notGranted `json:"not_granted,omitempty"`
}

// notGranted is a privilege migrate --grant could not give.
type notGranted struct {
	Role      string `json:"role"`
	Object    string `json:"object"`
	Privilege string `json:"privilege"`
	Grant     string `json:"grant"`
	Owner     string `json:"owner"`
}

func newMigrateCmd(g *globals) *cobra.Command {
	var roles, operators []string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or migrate the manifest's schema (an administrator, once per release)",
		Long: `migrate creates the manifest's schema if it does not exist and applies the
migrations it lacks, in one transaction (PGManifest.Migrate). Run it as a
role that may create the schema (CREATE on the database) or owns it.
Afterwards the roles that run jobs need no DDL privilege on the manifest.

With --grant ROLE (repeatable), it then grants each role the manifest's
privileges a runtime role needs (see "backfill grants"), under the same
lock, and checks that each role has them afterwards: a privilege
PostgreSQL did not grant (the caller holds it without grant option) is
reported with its owner, who can grant it, and the exit status is 1.
Several migrate calls may run at once: one migrates, the others report
"nothing to migrate".

With --grant-operator ROLE (repeatable), it makes each role an operator:
it creates the role NOLOGIN when it does not exist (which needs
CREATEROLE; an existing role is used as it is) and grants it USAGE on
the schema, SELECT on its tables (status, events, exceptions, report) and
EXECUTE on the control functions (pause, resume, cancel, set_knob, approve, set_module_flag), which
run as the manifest's owner; then a person's login role becomes an
operator with GRANT ROLE TO person. A loader (--grant) may not steer
runs, nor write the audit log or schema_migrations.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			db, err := g.open(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			// The version is read, the schema migrated and the roles
			// granted under one lock, in one transaction: what this call
			// did, even when others run at once.
			r, err := backfill.NewPGManifest(g.schema).MigrateGrantRoles(ctx, db, roles, operators)
			if err != nil && len(r.NotGranted) == 0 {
				return err
			}
			res := migrateResult{Schema: g.schema, From: r.From, To: r.To, Granted: r.Granted}
			for _, p := range r.NotGranted {
				res.NotGranted = append(res.NotGranted, notGranted{Role: p.Role, Object: p.Object, Privilege: p.Privilege.Privilege, Grant: p.Grant, Owner: p.Owner})
			}
			var b strings.Builder
			if r.From == r.To {
				fmt.Fprintf(&b, "manifest schema %q is at version %d; nothing to migrate\n", g.schema, r.To)
			} else {
				fmt.Fprintf(&b, "manifest schema %q migrated from version %d to %d\n", g.schema, r.From, r.To)
			}
			for _, q := range res.Granted {
				fmt.Fprintln(&b, q)
			}
			for _, p := range res.NotGranted {
				fmt.Fprintf(&b, "NOT GRANTED: %s on %s to %q: run %s as its owner %q (or a superuser)\n", p.Privilege, p.Object, p.Role, p.Grant, p.Owner)
			}
			if perr := g.print(res, b.String()); perr != nil {
				return perr
			}
			return err
		},
	}
	cmd.Flags().StringArrayVar(&roles, "grant", nil, "grant this runtime role (a loader) the manifest's privileges after migrating (repeatable)")
	cmd.Flags().StringArrayVar(&operators, "grant-operator", nil, "create (NOLOGIN, if missing) this operator role and grant it the control functions and reads (repeatable)")
	return cmd
}
