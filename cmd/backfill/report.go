package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/spf13/cobra"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/contrib/report"
)

// reportResult is what report prints with --json: the run report
// (backfill.RunReport, the HTML's twin).
type reportResult = backfill.RunReport

func newReportCmd(g *globals) *cobra.Command {
	var (
		sel  selection
		html string
	)
	cmd := &cobra.Command{
		Use:   "report [JOB | --job NAME | --batch N] [--html FILE]",
		Short: "Write a run's report: one self-contained HTML file, or its JSON twin",
		Long: `report reads everything the manifest recorded about one run and writes
its report: the plan (fingerprint, code version, scope, rollback
mechanism, who started it), a timeline of chunks by worker, rows/s over
time, the chunk-duration distribution, the split of the run's time into
working, throttled (by signal) and paused, waits and their blockers,
exceptions by reason and column with examples, validation evidence and
the audit trail.

--html FILE writes one self-contained HTML file (inline CSS, charts as
inline SVG, nothing fetched from the network: mail it or attach it to a
ticket) and prints where it went. --json prints the same data as one
JSON document (backfill.RunReport: stable snake_case fields, times in
UTC, durations in *_seconds). Without either it prints a short summary.`,
		Example: `  backfill report --job flights --html flights-report.html
  backfill report --batch 12 --json > report.json`,
		Args: sel.args("report"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			db, m, run, err := sel.open(ctx, g)
			if err != nil {
				return err
			}
			defer db.Close()
			rep, err := backfill.LoadRunReport(ctx, db, m, run.BatchID)
			if err != nil {
				return err
			}
			if html != "" {
				if err := writeHTML(html, rep); err != nil {
					return err
				}
				if g.json {
					return g.printJSON(map[string]any{"batch_id": run.BatchID, "job": run.Job, "html": html})
				}
				abs, _ := filepath.Abs(html)
				_, err := fmt.Fprintf(g.out, "report of %s batch %d written to %s\n", run.Job, run.BatchID, abs)
				return err
			}
			if g.json {
				return g.printJSON(reportResult(rep))
			}
			return g.print(nil, reportSummary(rep))
		},
	}
	sel.flags(cmd.Flags())
	cmd.Flags().StringVar(&html, "html", "", "write the report as one self-contained HTML file here")
	return cmd
}

// writeHTML writes rep's HTML to path, through a temporary file renamed
// into place, so that a failed write leaves no half file.
func writeHTML(path string, rep backfill.RunReport) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".backfill-report-*.html")
	if err != nil {
		return fmt.Errorf("%w: --html %s: %w", errUsage, path, err)
	}
	defer os.Remove(f.Name())
	if err := report.WriteHTML(f, rep); err != nil {
		_ = f.Close()
		return fmt.Errorf("write the report: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write the report: %w", err)
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// reportSummary is the text report prints without --html or --json.
func reportSummary(r backfill.RunReport) string {
	var b strings.Builder
	p, t := r.Plan, r.Totals
	fmt.Fprintf(&b, "%s batch %d: %s\n", p.Job, p.BatchID, p.Status)
	done := t.ChunksByStatus[string(backfill.ChunkDone)]
	total := 0
	for _, n := range t.ChunksByStatus {
		total += n
	}
	fmt.Fprintf(&b, "chunks   %s of %s done", thousands(int64(done)), thousands(int64(total)))
	if t.ChunksSkipped > 0 {
		fmt.Fprintf(&b, ", %s skipped unchanged", thousands(int64(t.ChunksSkipped)))
	}
	b.WriteString("\n")
	c := t.Rows
	fmt.Fprintf(&b, "rows     read %s: inserted %s, updated %s, unchanged %s, rejected %s, deduplicated %s\n",
		thousands(c.Read), thousands(c.Inserted), thousands(c.Updated), thousands(c.Unchanged), thousands(c.Rejected), thousands(c.Deduplicated))
	fmt.Fprintf(&b, "rate     %s rows/s over the chunks' work\n", thousands(int64(t.RowsPerSecond+0.5)))
	fmt.Fprintf(&b, "time     %s\n", timeSplitText(r.Time))
	fmt.Fprintf(&b, "events   %d in the audit trail\n", len(r.Events))
	fmt.Fprintf(&b, "\nfor the whole report: backfill report --batch %d --html report.html\n", p.BatchID)
	return b.String()
}

// timeSplitText describes where a run's time went.
func timeSplitText(t backfilltype.ReportTime) string {
	sec := func(s float64) string { return human(time.Duration(s * float64(time.Second))) }
	parts := []string{"working " + sec(t.WorkingSeconds)}
	var throttled float64
	for _, s := range t.ThrottledSeconds {
		throttled += s
	}
	if throttled > 0 {
		names := make([]string, 0, len(t.ThrottledSeconds))
		for n := range t.ThrottledSeconds {
			names = append(names, n)
		}
		slices.Sort(names)
		var by []string
		for _, n := range names {
			by = append(by, n+" "+sec(t.ThrottledSeconds[n]))
		}
		parts = append(parts, "throttled "+sec(throttled)+" ("+strings.Join(by, ", ")+")")
	}
	if t.PausedSeconds > 0 {
		parts = append(parts, "paused "+sec(t.PausedSeconds))
	}
	if t.IdleSeconds > 0 {
		parts = append(parts, "idle (no live worker) "+sec(t.IdleSeconds))
	}
	return strings.Join(parts, ", ") + " of " + sec(t.TotalSeconds)
}
