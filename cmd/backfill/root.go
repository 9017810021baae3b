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

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgurl"
)

// Exit statuses of run (documented in the package comment and in
// "backfill --help").
const (
	exitOK       = 0 // done
	exitError    = 1 // failed: a database error, a refused rollback, ...
	exitUsage    = 2 // bad command line, or no DATABASE_URL
	exitNotFound = 3 // no such job, batch or chunk
	exitManifest = 4 // the manifest is missing, behind or ahead: run backfill migrate
)

// globals are the flags every command takes.
type globals struct {
	databaseURL string
	schema      string
	json        bool
	out         io.Writer // text for people goes through visibleWriter
	raw         io.Writer // the output as it is (CSV)
	getenv      func(string) string
}

var (
	// errUsage marks an error in the command line (exit status 2).
	errUsage = errors.New("usage")
	// errNotFound marks a job, batch or chunk the manifest does not have
	// (exit status 3).
	errNotFound = errors.New("not found")
	// errManifest marks a manifest that is missing or not at this
	// program's version (exit status 4).
	errManifest = errors.New("manifest not ready")
)

// run runs the command line args (without the program name), writing to
// stdout and stderr, with getenv for the environment; it returns the exit
// status. Tests call it in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	g := &globals{out: stdout, getenv: getenv}
	root := newRoot(g, getenv)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	// The library's errors begin with "backfill: " too: once is enough.
	fmt.Fprintln(stderr, "backfill:", visible(strings.TrimPrefix(err.Error(), "backfill: "), true))
	switch {
	case errors.Is(err, errUsage), strings.HasPrefix(err.Error(), "unknown command "):
		return exitUsage
	case errors.Is(err, errNotFound):
		return exitNotFound
	case errors.Is(err, errManifest):
		return exitManifest
	default:
		return exitError
	}
}

const rootLong = `backfill operates the runs of backfill jobs from any machine, with only
the database: it reads the manifest (the schema where the library records
runs, chunks, exceptions, validations and the audit trail) and can roll a
batch back from what the manifest recorded, without the job's code.

The database is named by $DATABASE_URL (or --database-url); --schema
names the manifest's schema. Every read command prints aligned tables
for people (counts with thousands separators, times in UTC, durations
rounded), or, with --json, one JSON document with stable field names.

A command about one run selects it with --job NAME (the job's latest
run) or --batch N (a batch ID, as "backfill runs" lists them). The
commands that only read (status, chunks, exceptions, validations,
events, report) also take the job as their argument (backfill status
flights) and, when the manifest has runs of one job only, need no name.

Exit status:
  0  done
  1  failed (a database error, a refused rollback, ...)
  2  bad usage: an unknown command or flag, a bad value, no DATABASE_URL
  3  not found: no such job, batch or chunk in the manifest
  4  the manifest is missing, behind or ahead of this program: run
     "backfill migrate" (an administrator) or use a matching version`

func newRoot(g *globals, getenv func(string) string) *cobra.Command {
	root := &cobra.Command{
		Use:           "backfill",
		Short:         "Operate backfill jobs: inspect runs, chunks, exceptions and the audit trail, roll batches back, migrate the manifest",
		Long:          rootLong,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return fmt.Errorf("%w: %w", errUsage, err) })
	pf := root.PersistentFlags()
	pf.StringVar(&g.databaseURL, "database-url", "", "PostgreSQL connection URL (default $DATABASE_URL)")
	pf.StringVar(&g.schema, "schema", backfill.NewPGManifest("").Schema(), "the manifest's schema")
	pf.BoolVar(&g.json, "json", false, "print one JSON document instead of text")
	root.PersistentPreRun = func(*cobra.Command, []string) {
		if g.databaseURL == "" {
			g.databaseURL = getenv("DATABASE_URL")
		}
		g.raw = g.out
		if !g.json {
			// Text for people: job names, reasons and values come from
			// the data; their control characters (terminal escapes) are
			// shown, not sent to the terminal.
			g.out = visibleWriter{g.out}
		}
	}
	// Groups of commands. The control commands join them here:
	// status and report under groupInspect, pause, resume, cancel and set
	// under groupOperate, each in a file of its own (newStatusCmd(g), ...)
	// built like runs.go: a selection (select.go) for the run, g.manifest
	// for the database, g.printJSON or a table (format.go) for output.
	root.AddGroup(&cobra.Group{ID: groupInspect, Title: "Inspect a run:"},
		&cobra.Group{ID: groupOperate, Title: "Operate a run:"},
		&cobra.Group{ID: groupAdmin, Title: "Administer the manifest:"})
	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add(groupInspect, newStatusCmd(g), newRunsCmd(g), newChunksCmd(g), newExceptionsCmd(g), newValidationsCmd(g), newEventsCmd(g), newReportCmd(g), newRehearsalsCmd(g), newPlanCmd(g))
	add(groupOperate, newPauseCmd(g), newResumeCmd(g), newCancelCmd(g), newSetCmd(g), newRollbackCmd(g), newApproveCmd(g), newModuleCmd(g))
	add(groupAdmin, newMigrateCmd(g), newGrantsCmd(g))
	root.SetHelpCommandGroupID(groupAdmin)
	root.SetCompletionCommandGroupID(groupAdmin)
	return root
}

// Command groups of "backfill --help".
const (
	groupInspect = "inspect"
	groupOperate = "operate"
	groupAdmin   = "admin"
)

// noArgs refuses positional arguments with a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("%w: %s takes no arguments, got %q", errUsage, cmd.Name(), args)
	}
	return nil
}

// open connects to the database of --database-url.
func (g *globals) open(ctx context.Context) (*sqlx.DB, error) {
	if g.databaseURL == "" {
		return nil, fmt.Errorf("%w: no database: set DATABASE_URL or pass --database-url", errUsage)
	}
	if err := pgurl.Check(g.databaseURL); err != nil {
		return nil, fmt.Errorf("%w: --database-url or DATABASE_URL: %w", errUsage, err)
	}
	db, err := pgurl.Open(ctx, g.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("--database-url or DATABASE_URL: %w", err)
	}
	return db, nil
}

// manifest connects and checks that the manifest of --schema exists at
// this program's version: a missing or older one is an errManifest
// saying to run backfill migrate. Commands that only read or roll back
// never create or migrate it. action is what the command is about to do
// (fns: the control functions it calls): a role that may not read the
// version gets the privileges that action needs and their fix; with
// backfill.ActionRead the role's read privileges are checked too.
func (g *globals) manifest(ctx context.Context, action backfill.ManifestAction, fns ...string) (*sqlx.DB, *backfill.PGManifest, error) {
	db, err := g.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	m := backfill.NewPGManifest(g.schema)
	cur, latest, err := m.VersionFor(ctx, db, action, fns...)
	switch {
	case err != nil:
		_ = db.Close()
		return nil, nil, err
	case cur == 0:
		_ = db.Close()
		return nil, nil, fmt.Errorf("%w: this database has no manifest in schema %q: run \"backfill migrate\" (an administrator, once) to create it, or name the schema the jobs use with --schema",
			errManifest, g.schema)
	case cur < latest:
		_ = db.Close()
		return nil, nil, fmt.Errorf("%w: the manifest in schema %q is at version %d, this program needs %d: run \"backfill migrate\" (an administrator)",
			errManifest, g.schema, cur, latest)
	case cur > latest:
		_ = db.Close()
		return nil, nil, fmt.Errorf("%w: the manifest in schema %q is at version %d, newer than this program knows (%d): use the backfill command of the jobs' release",
			errManifest, g.schema, cur, latest)
	}
	if action == backfill.ActionRead {
		if err := m.CheckAccess(ctx, db, action); err != nil {
			_ = db.Close()
			return nil, nil, err
		}
	}
	return db, m, nil
}

// print writes v as indented JSON with --json, else text.
func (g *globals) print(v any, text string) error {
	if !g.json {
		_, err := io.WriteString(g.out, text)
		return err
	}
	return g.printJSON(v)
}

// printJSONLine writes v as indented JSON, or on one line when line is
// true (a stream of documents, such as status --watch).
func (g *globals) printJSONLine(v any, line bool) error {
	if !line {
		return g.printJSON(v)
	}
	return json.NewEncoder(g.out).Encode(v)
}

// printJSON writes v as indented JSON.
func (g *globals) printJSON(v any) error {
	e := json.NewEncoder(g.out)
	e.SetIndent("", "  ")
	return e.Encode(v)
}

// readTx runs f in a read-only transaction: the CLI's statements with
// parameters run in one, safe behind a transaction-mode pooler.
func readTx(ctx context.Context, db *sqlx.DB, f func(tx *sqlxTx) error) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SET TRANSACTION READ ONLY`); err != nil {
		return err
	}
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// sqlxTx is the transaction readTx gives.
type sqlxTx = sqlx.Tx
