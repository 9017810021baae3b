package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// validationsResult is what validations prints with --json.
type validationsResult struct {
	BatchID int64  `json:"batch_id"`
	Job     string `json:"job"`
	// Passed and Failed count the results shown; Accepted counts the
	// failed ones an operator accepted.
	Passed   int `json:"passed"`
	Failed   int `json:"failed"`
	Accepted int `json:"accepted"`
	// Checks sums the results shown per check, for the whole run, in the
	// order each check was first recorded.
	Checks      []checkSummary  `json:"checks"`
	Validations []validationRow `json:"validations"`
}

// checkSummary is one check's results over the run's chunks.
type checkSummary struct {
	Check    string `json:"check"`
	Severity string `json:"severity"`
	Passed   int    `json:"passed"`
	Failed   int    `json:"failed"`
	Accepted int    `json:"accepted"`
}

// validationRow is one check's result on one chunk.
type validationRow struct {
	ChunkID  string `json:"chunk_id"`
	Check    string `json:"check"`
	Severity string `json:"severity"`
	Passed   bool   `json:"passed"`
	// Accepted: a failed check an operator accepted for the chunk.
	Accepted bool     `json:"accepted"`
	Expected string   `json:"expected"`
	Actual   string   `json:"actual"`
	Sample   []string `json:"sample"`
	// Detail is the check's evidence as a JSON object (null if none).
	Detail json.RawMessage `json:"detail"`
	// FailedAttempt is 0 for a committed attempt, else the number of the
	// attempt a failed gate rolled back (kept as evidence).
	FailedAttempt int       `json:"failed_attempt"`
	CreatedAt     time.Time `json:"created_at"`
}

func newValidationsCmd(g *globals) *cobra.Command {
	var (
		sel    selection
		chunk  string
		failed bool
	)
	cmd := &cobra.Command{
		Use:   "validations [JOB | --job NAME | --batch N]",
		Short: "List a run's validation evidence: each check's result per chunk",
		Long: `validations lists the evidence the run's validators recorded, in the order
recorded: first a summary per check over the run (passed, failed,
accepted), then per chunk each check with its severity, whether it passed (or
failed and was accepted by an operator), what was expected and found, and
a sample of offending keys. Results of chunk attempts that a failed
quality gate rolled back are kept as evidence and shown with their
attempt number. A summary line counts the results by outcome.

Filters: --chunk ID, --failed (only failed checks).

With --json: {"batch_id", "job", "passed", "failed", "accepted",
"checks": [{"check", "severity", "passed", "failed", "accepted"}],
"validations": [{"chunk_id", "check", "severity", "passed", "accepted",
"expected", "actual", "sample", "detail", "failed_attempt",
"created_at"}]}.`,
		Example: `  backfill validations --job flights --failed
  backfill validations --batch 12 --json`,
		Args: sel.args("validations"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			db, m, run, err := sel.open(ctx, g)
			if err != nil {
				return err
			}
			defer db.Close()
			vs, err := m.Validations(ctx, db, run.BatchID)
			if err != nil {
				return err
			}
			res := validationsResult{BatchID: run.BatchID, Job: run.Job, Checks: []checkSummary{}, Validations: []validationRow{}}
			byCheck := map[string]int{} // check and severity -> index in res.Checks
			for _, v := range vs {
				if chunk != "" && v.ChunkID != chunk || failed && v.Passed {
					continue
				}
				row := validationRow{ChunkID: v.ChunkID, Check: v.Check, Severity: string(v.Severity), Passed: v.Passed, Accepted: v.Accepted,
					Expected: v.Expected, Actual: v.Actual, Sample: v.Sample, Detail: v.Detail, FailedAttempt: v.FailedAttempt, CreatedAt: utcTime(v.CreatedAt)}
				if row.Sample == nil {
					row.Sample = []string{}
				}
				if len(row.Detail) == 0 {
					row.Detail = json.RawMessage("null")
				}
				k := v.Check + "\x00" + string(v.Severity)
				i, ok := byCheck[k]
				if !ok {
					i = len(res.Checks)
					byCheck[k] = i
					res.Checks = append(res.Checks, checkSummary{Check: v.Check, Severity: string(v.Severity)})
				}
				cs := &res.Checks[i]
				switch {
				case v.Passed:
					res.Passed++
					cs.Passed++
				default:
					res.Failed++
					cs.Failed++
					if v.Accepted {
						res.Accepted++
						cs.Accepted++
					}
				}
				res.Validations = append(res.Validations, row)
			}
			if g.json {
				return g.printJSON(res)
			}
			fmt.Fprintf(g.out, "batch %d of job %q: %s: %s passed, %s failed (%s accepted)\n", run.BatchID, run.Job,
				plural(int64(len(res.Validations)), "result"), thousands(int64(res.Passed)), thousands(int64(res.Failed)), thousands(int64(res.Accepted)))
			if len(res.Validations) == 0 {
				return nil
			}
			t := newTable(g.out, "CHECK", "SEVERITY", "PASSED", "FAILED", "ACCEPTED")
			for _, c := range res.Checks {
				t.row(c.Check, c.Severity, thousands(int64(c.Passed)), thousands(int64(c.Failed)), thousands(int64(c.Accepted)))
			}
			if err := t.flush(); err != nil {
				return err
			}
			fmt.Fprintln(g.out)
			t = newTable(g.out, "CHUNK", "CHECK", "SEVERITY", "RESULT", "EXPECTED", "ACTUAL", "ATTEMPT", "SAMPLE")
			for _, v := range res.Validations {
				result := "passed"
				switch {
				case !v.Passed && v.Accepted:
					result = "FAILED, accepted"
				case !v.Passed:
					result = "FAILED"
				}
				attempt := "committed"
				if v.FailedAttempt > 0 {
					attempt = fmt.Sprintf("rolled back #%d", v.FailedAttempt)
				}
				t.row(orDash(v.ChunkID), v.Check, v.Severity, result, clip(v.Expected, 40), clip(v.Actual, 40), attempt, orDash(clip(strings.Join(v.Sample, ", "), 60)))
			}
			return t.flush()
		},
	}
	sel.flags(cmd.Flags())
	cmd.Flags().StringVar(&chunk, "chunk", "", "only the results of this chunk ID")
	cmd.Flags().BoolVar(&failed, "failed", false, "only failed checks")
	return cmd
}
