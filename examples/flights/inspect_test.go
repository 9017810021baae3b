package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestDemoProgressReportAndCommands: a small flights run off a terminal
// prints plain progress lines from the manifest, ending at all chunks
// done; writes the HTML report where -report says and prints its
// absolute path; and prints the operator's commands for this run's job
// and batch, each of them a command cmd/backfill has.
func TestDemoProgressReportAndCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	src := open(t, writeParquet(t, synthetic(11, 1500, 3), 500), 64)
	airportsPath := filepath.Join(dir, airportsFile)
	if err := os.WriteFile(airportsPath, []byte("iata,name,city,state,country,latitude,longitude\nBOS,Logan,Boston,MA,USA,42.36,-71.00\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { db.Close() })
	first, end, _ := src.Scope()
	days := backfill.Days(first, end, time.UTC)
	chunks, err := days.Chunks(ctx)
	if err != nil {
		t.Fatal(err)
	}

	var out, progress bytes.Buffer
	reportPath := filepath.Join(dir, "run.html")
	rep, err := load(ctx, &out, db, nil, src, days, airportsPath, options{
		concurrency: 2, report: reportPath, progress: &progress, progressEvery: time.Nanosecond, where: "postgres://test (from DATABASE_URL)"})
	if err != nil {
		t.Fatalf("load: %v\n%s", err, out.String())
	}

	// Progress: plain lines, from the manifest, the last one complete.
	lines := strings.Split(strings.TrimSpace(progress.String()), "\n")
	last := lines[len(lines)-1]
	wantLast := fmt.Sprintf("progress %s batch %d: %d/%d chunks (100.0%%), %s rows, ", flightsJob, rep.BatchID, len(chunks), len(chunks), thousands(rep.Counts.Read))
	if !strings.HasPrefix(last, wantLast) || !strings.Contains(last, " rows/s, ETA 0s, ") {
		t.Errorf("last progress line %q, want prefix %q and ETA 0s", last, wantLast)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "progress ") {
			t.Errorf("progress output has a line that is not a progress line: %q", l)
		}
	}

	// The report.
	abs, _ := filepath.Abs(reportPath)
	if !strings.Contains(out.String(), "  report     "+abs+" ") {
		t.Errorf("output does not name the report %s:\n%s", abs, out.String())
	}
	html, err := os.ReadFile(reportPath)
	if err != nil || !bytes.Contains(html, []byte("<svg")) || !bytes.Contains(html, []byte(flightsJob)) {
		t.Errorf("report %s: %d bytes, %v; want an HTML file with charts naming the job", reportPath, len(html), err)
	}

	// The commands: every one the issue names, with this run's job or
	// batch, run from the checkout.
	b := fmt.Sprint(rep.BatchID)
	for _, c := range []string{
		"status flights-3m", "runs --job flights-3m", "chunks --batch " + b, "exceptions --batch " + b,
		"validations --batch " + b, "events --batch " + b, "report --batch " + b + " --html ",
		"rollback --preview --batch " + b, "rollback --batch " + b + " --why ",
	} {
		if !strings.Contains(out.String(), "  go -C cmd/backfill run . "+c) {
			t.Errorf("output lacks the command %q:\n%s", c, out.String())
		}
	}
	if !strings.Contains(out.String(), "needs only DATABASE_URL: postgres://test (from DATABASE_URL)") {
		t.Errorf("output does not say where the database is:\n%s", out.String())
	}
	// Each command is a subcommand of cmd/backfill (its root.go registers them).
	root, err := os.ReadFile(filepath.Join("..", "..", "cmd", "backfill", "root.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`go -C cmd/backfill run \. (\w+)`).FindAllStringSubmatch(out.String(), -1) {
		if !regexp.MustCompile(`new` + strings.ToUpper(m[1][:1]) + m[1][1:] + `Cmd\(`).Match(root) {
			t.Errorf("command %q is not registered in cmd/backfill/root.go", m[1])
		}
	}
}

// thousands is cli.Thousands, restated for the test.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestDatabaseWhere: the password of a URL or a key=value string is
// masked, and a throwaway server says whether it is kept and how to keep it.
func TestDatabaseWhere(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://alice:s3cret@db:5432/x?sslmode=disable":     "postgres://alice:xxxxx@db:5432/x?sslmode=disable",
		"postgres://alice@db/x?password=s3cret&sslmode=require": "postgres://alice@db/x?password=xxxxx&sslmode=require",
		"host=db user=alice password='s3 cret' dbname=x":        "host=db user=alice password=xxxxx dbname=x",
		"host=db password=s3cret":                               "host=db password=xxxxx",
		"postgres://postgres@127.0.0.1:5432/postgres":           "postgres://postgres@127.0.0.1:5432/postgres",
	} {
		if got := maskPassword(dsn); got != want {
			t.Errorf("maskPassword(%q) = %q, want %q", dsn, got, want)
		}
	}
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	u := "postgres://postgres@127.0.0.1:5432/postgres"
	if got := databaseWhere(u, env()); !strings.Contains(got, "(from DATABASE_URL)") {
		t.Errorf("own server: %q", got)
	}
	if got := databaseWhere(u, env(throwawayEnv, "1")); !strings.Contains(got, "BACKFILL_KEEP=1 make demo") || kept(env(throwawayEnv, "1")) {
		t.Errorf("throwaway server: %q, kept %t", got, kept(env(throwawayEnv, "1")))
	}
	if got := databaseWhere(u, env(throwawayEnv, "1", keepEnv, "1")); !strings.Contains(got, "kept after the demo") || !kept(env(throwawayEnv, "1", keepEnv, "1")) {
		t.Errorf("kept throwaway server: %q", got)
	}
	if !strings.Contains(inspectCommands("j", 1, "backfill", "", "", false), "BACKFILL_KEEP=1 make demo") {
		t.Error("commands for a server that goes away do not say how to keep it")
	}
	// The report command names the file the demo wrote, quoted.
	if got := inspectCommands("j", 1, "backfill", "", "/tmp/my report.html", true); !strings.Contains(got, "report --batch 1 --html '/tmp/my report.html'") {
		t.Errorf("report command: %s", got)
	}
	if got := inspectCommands("j", 1, "backfill", "", "", true); !strings.Contains(got, `report --batch 1 --html "$PWD/flights-report.html"`) {
		t.Errorf("report command without a report: %s", got)
	}
}
