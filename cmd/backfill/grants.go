package main

import (
	"fmt"
	"strings"

	"github.com/lib/pq"
	"github.com/spf13/cobra"

	"github.com/pgbackfill/backfill"
)

// grantsResult is what grants prints with --json.
type grantsResult struct {
	Role       string   `json:"role"`
	Statements []string `json:"statements"`
}

func newGrantsCmd(g *globals) *cobra.Command {
	var (
		tables     []string
		mode       string
		conflict   string
		publish    string
		rollback   bool
		insertOnly bool
	)
	cmd := &cobra.Command{
		Use:   "grants ROLE",
		Short: "Print the GRANT statements a role needs to run jobs",
		Long: `grants prints the GRANT statements that give ROLE the least privileges to
run, resume, validate and (with --rollback) roll back jobs: USAGE on the
manifest's schema and DML on its tables, TEMPORARY on the database, and,
for each --table, USAGE on its schema, SELECT and INSERT, UPDATE where the
runs update rows (--mode history, or upsert with --conflict source_wins or
newer_version_wins, unless --insert-only), DELETE with --rollback, USAGE
on the sequences of its serial columns (needed unless the job writes the
column; identity columns need none), and what a --publish mode creates.
It reads the database's name, the tables' schemas and their serial
columns' sequences; it changes nothing. The ownership PublishPartitionSwap
and PublishVersionedView need is printed as an SQL comment.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("%w: grants takes one ROLE, got %d arguments", errUsage, len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			role := args[0]
			db, err := g.open(ctx)
			if err != nil {
				return err
			}
			defer db.Close()
			var database string
			if err := db.GetContext(ctx, &database, `SELECT current_database()`); err != nil {
				return err
			}
			res := grantsResult{Role: role, Statements: backfill.NewPGManifest(g.schema).Grants(database, role)}
			for _, t := range tables {
				// The table's schema-qualified name, as the job resolves it.
				var name []string
				if err := db.SelectContext(ctx, &name, `SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
					FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, t); err != nil {
					return fmt.Errorf("table %s: %w", t, err)
				}
				if len(name) == 0 {
					return fmt.Errorf("%w: table %s does not exist", errUsage, t)
				}
				stmts, err := backfill.TargetGrants(role,
					backfill.Target{Table: name[0], Mode: backfill.Mode(mode), Conflict: backfill.ConflictPolicy(conflict)},
					backfill.GrantOptions{Publish: backfill.PublishMode(publish), ManifestSchema: g.schema, Rollback: rollback, InsertOnly: insertOnly})
				if err != nil {
					return fmt.Errorf("%w: %w", errUsage, err)
				}
				res.Statements = append(res.Statements, stmts...)
				// The sequences of its serial columns: an INSERT that
				// leaves such a column to its default calls nextval.
				// (Identity columns need no privilege on theirs.)
				var seqs []struct {
					Schema   string `db:"nspname"`
					Sequence string `db:"relname"`
					Column   string `db:"attname"`
				}
				if err := db.SelectContext(ctx, &seqs, `SELECT n.nspname, s.relname, a.attname
					FROM pg_depend d
					JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
					JOIN pg_namespace n ON n.oid = s.relnamespace
					JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
					WHERE d.classid = 'pg_class'::regclass AND d.refobjid = to_regclass($1) AND d.deptype = 'a'
					ORDER BY a.attnum`, name[0]); err != nil {
					return fmt.Errorf("table %s: sequences: %w", t, err)
				}
				for _, q := range seqs {
					res.Statements = append(res.Statements, fmt.Sprintf("GRANT USAGE ON SEQUENCE %s.%s TO %s; -- serial column %s of %s, unless the job writes it",
						pq.QuoteIdentifier(q.Schema), pq.QuoteIdentifier(q.Sequence), pq.QuoteIdentifier(role), pq.QuoteIdentifier(q.Column), name[0]))
				}
			}
			return g.print(res, strings.Join(res.Statements, "\n")+"\n")
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&tables, "table", nil, "a target table the role writes, optionally schema-qualified (repeatable)")
	f.StringVar(&mode, "mode", string(backfill.Upsert), "the targets' mode: upsert, append_only, keyless, history")
	f.StringVar(&conflict, "conflict", string(backfill.SourceWins), "an upsert's conflict policy: source_wins, target_wins, newer_version_wins")
	f.StringVar(&publish, "publish", "", "the publish mode: \"\" (per chunk), at_end, partition_swap, versioned_view")
	f.BoolVar(&rollback, "rollback", false, "the role also rolls batches back (DELETE)")
	f.BoolVar(&insertOnly, "insert-only", false, "upserts only insert (first loads): no UPDATE")
	return cmd
}
