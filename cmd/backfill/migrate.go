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
}

func newMigrateCmd(g *globals) *cobra.Command {
	var roles []string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or migrate the manifest's schema (an administrator, once per release)",
		Long: `migrate creates the manifest's schema if it does not exist and applies the
migrations it lacks, in one transaction (PGManifest.Migrate). Run it as a
role that may create the schema (CREATE on the database) or owns it.
Afterwards the roles that run jobs need no DDL privilege on the manifest.

With --grant ROLE (repeatable), it then grants each role the manifest's
privileges a runtime role needs (see "backfill grants").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			db, err := g.open(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			m := backfill.NewPGManifest(g.schema)
			from, _, err := m.Version(ctx, db)
			if err != nil {
				return err
			}
			if err := m.Migrate(ctx, db); err != nil {
				return err
			}
			to, _, err := m.Version(ctx, db)
			if err != nil {
				return err
			}
			res := migrateResult{Schema: g.schema, From: from, To: to}
			var database string
			if err := db.GetContext(ctx, &database, `SELECT current_database()`); err != nil {
				return err
			}
			for _, role := range roles {
				for _, q := range m.Grants(database, role) {
					if _, err := db.ExecContext(ctx, q); err != nil {
						return fmt.Errorf("%s: %w", q, err)
					}
					res.Granted = append(res.Granted, q)
				}
			}
			var b strings.Builder
			if from == to {
				fmt.Fprintf(&b, "manifest schema %q is at version %d; nothing to migrate\n", g.schema, to)
			} else {
				fmt.Fprintf(&b, "manifest schema %q migrated from version %d to %d\n", g.schema, from, to)
			}
			for _, q := range res.Granted {
				fmt.Fprintln(&b, q)
			}
			return g.print(res, b.String())
		},
	}
	cmd.Flags().StringArrayVar(&roles, "grant", nil, "grant this runtime role the manifest's privileges after migrating (repeatable)")
	return cmd
}
