package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // the "postgres" driver
	"github.com/spf13/cobra"
)

// Exit statuses of run.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// globals are the flags every command takes.
type globals struct {
	databaseURL string
	schema      string
	json        bool
	out         io.Writer
}

// errUsage marks an error in the command line (exit status 2).
var errUsage = errors.New("usage")

// run runs the command line args (without the program name), writing to
// stdout and stderr, with getenv for the environment; it returns the exit
// status. Tests call it in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	g := &globals{out: stdout}
	root := newRoot(g, getenv)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "backfill:", strings.TrimPrefix(err.Error(), "backfill: "))
		return exitUsage
	default:
		// The library's errors begin with "backfill: " too: once is enough.
		fmt.Fprintln(stderr, "backfill:", strings.TrimPrefix(err.Error(), "backfill: "))
		return exitError
	}
}

func newRoot(g *globals, getenv func(string) string) *cobra.Command {
	root := &cobra.Command{
		Use:           "backfill",
		Short:         "Operate backfill jobs: migrate the manifest, print the grants a role needs",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return fmt.Errorf("%w: %w", errUsage, err) })
	pf := root.PersistentFlags()
	pf.StringVar(&g.databaseURL, "database-url", "", "PostgreSQL connection URL (default $DATABASE_URL)")
	pf.StringVar(&g.schema, "schema", "backfill", "the manifest's schema")
	pf.BoolVar(&g.json, "json", false, "print JSON instead of text")
	root.PersistentPreRun = func(*cobra.Command, []string) {
		if g.databaseURL == "" {
			g.databaseURL = getenv("DATABASE_URL")
		}
	}
	root.AddCommand(newMigrateCmd(g), newGrantsCmd(g))
	return root
}

// open connects to the database of --database-url.
func (g *globals) open(ctx context.Context) (*sqlx.DB, error) {
	if g.databaseURL == "" {
		return nil, fmt.Errorf("%w: no database: set DATABASE_URL or pass --database-url", errUsage)
	}
	db, err := sqlx.Open("postgres", g.databaseURL)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return db, nil
}

// print writes v as indented JSON with --json, else text.
func (g *globals) print(v any, text string) error {
	if !g.json {
		_, err := io.WriteString(g.out, text)
		return err
	}
	e := json.NewEncoder(g.out)
	e.SetIndent("", "  ")
	return e.Encode(v)
}
