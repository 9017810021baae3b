package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/contrib/report"
	"github.com/pgbackfill/backfill/internal/quote"
)

// The variables internal/pgtest/with-postgres.sh (make demo) exports to
// its command: throwawayEnv when it started a throwaway server for it,
// keepEnv (set by the user) when that server outlives the command.
const (
	throwawayEnv = "BACKFILL_THROWAWAY"
	keepEnv      = "BACKFILL_KEEP"
)

// databaseWhere describes the database at dsn for people: the URL with
// its password masked, and whether it is a throwaway server (and how to
// keep it for inspection).
func databaseWhere(dsn string, getenv func(string) string) string {
	where := maskPassword(dsn)
	switch {
	case getenv(throwawayEnv) == "":
		return where + " (from DATABASE_URL)"
	case getenv(keepEnv) != "":
		return where + " (a throwaway server of internal/pgtest/with-postgres.sh, kept after the demo because " + keepEnv + " is set: press Ctrl-C there to stop and remove it)"
	default:
		return where + " (a throwaway server of internal/pgtest/with-postgres.sh, removed when the demo ends: run `" + keepEnv + "=1 make demo` to keep it for inspection)"
	}
}

// kept reports whether the database outlives the demo.
func kept(getenv func(string) string) bool {
	return getenv(throwawayEnv) == "" || getenv(keepEnv) != ""
}

var dsnPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// maskPassword returns dsn, a URL or a key=value connection string, with
// its password replaced by xxxxx.
func maskPassword(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	return dsnPassword.ReplaceAllString(dsn, "${1}xxxxx")
}

// inspect writes the HTML report of run batchID to o.report (if set) and
// prints its absolute path, then the operator's commands (cmd/backfill)
// that inspect the run.
func inspect(ctx context.Context, out io.Writer, db *sqlx.DB, m *backfill.PGManifest, batchID int64, o options) error {
	path := ""
	if o.report != "" {
		rr, err := backfill.LoadRunReport(ctx, db, m, batchID)
		if err != nil {
			return err
		}
		abs, err := filepath.Abs(o.report)
		if err != nil {
			return err
		}
		path = abs
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		if err := errors.Join(report.WriteHTML(f, rr), f.Close()); err != nil {
			return fmt.Errorf("report %s: %w", path, err)
		}
		fmt.Fprintf(out, "  report     %s (HTML, self-contained: open it in a browser)\n", path)
	}
	fmt.Fprint(out, inspectCommands(flightsJob, batchID, m.Schema(), o.where, path, kept(os.Getenv)))
	return nil
}

// inspectCommands returns the text that tells how to inspect run batchID
// of job with the operator's command, run from a checkout's root; html is
// the absolute path of the HTML report the demo wrote ("": none, the
// command writes flights-report.html in the working directory).
func inspectCommands(job string, batchID int64, schema, where, html string, kept bool) string {
	var b strings.Builder
	b.WriteString("\ninspect the run with the operator's command, from the repository's root (needs only DATABASE_URL")
	if where != "" {
		fmt.Fprintf(&b, ": %s", where)
	}
	b.WriteString(")\n")
	if !kept {
		b.WriteString("  (this server is gone when the demo ends: run `" + keepEnv + "=1 make demo` and these commands in another shell)\n")
	}
	cmd := "go -C cmd/backfill run ."
	if schema != "" && schema != "backfill" {
		cmd += " --schema " + schema
	}
	htmlArg := `"$PWD/flights-report.html"`
	if html != "" {
		htmlArg = quote.Shell(html)
	}
	lines := [][2]string{
		{fmt.Sprintf("status %s", quote.Shell(job)), "progress, rates and ETA (--watch to follow a run)"},
		{fmt.Sprintf("runs --job %s", quote.Shell(job)), "the job's runs"},
		{fmt.Sprintf("chunks --batch %d", batchID), "every chunk: status, counts, attempts, worker"},
		{fmt.Sprintf("exceptions --batch %d --limit 20", batchID), "rows not loaded, with the raw rows (--csv, --json)"},
		{fmt.Sprintf("validations --batch %d", batchID), "validation evidence"},
		{fmt.Sprintf("events --batch %d", batchID), "the audit trail"},
		{fmt.Sprintf("report --batch %d --html %s", batchID, htmlArg), "the HTML run report (a relative path is relative to cmd/backfill)"},
		{fmt.Sprintf("rollback --preview --batch %d", batchID), "what a rollback would do; changes nothing"},
		{fmt.Sprintf("rollback --batch %d --why 'TEXT'", batchID), "withdraws the run (careful)"},
	}
	for _, l := range lines {
		fmt.Fprintf(&b, "  %s %-50s # %s\n", cmd, l[0], l[1])
	}
	return b.String()
}
