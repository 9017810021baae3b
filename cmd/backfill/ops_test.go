package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// faresDDL is the target of the test job: fares by id, with lineage.
const faresDDL = `CREATE TABLE fares (id bigint PRIMARY KEY, route text NOT NULL, fare numeric NOT NULL,
	backfill_inserted_by bigint, backfill_updated_by bigint)`

// awkward are raw values that CSV must quote: commas, quotes, newlines.
var awkward = []string{`a,b`, `say "hi"`, "two\nlines", "cr\r\nlf, \"both\""}

// faresJob loads ids [0, n) in chunks of 1,000 with fare id*factor; the
// chunk [1000, 2000) also rejects one row per awkward value and writes one
// fare that is not a number (rejected by the library, column "fare").
func faresJob(n, factor int64, newRun bool) backfill.Job {
	return backfill.Job{Name: "fares", NewRun: newRun, Chunker: backfill.IntRange(0, n, 1000), ChunkColumn: "id", MaxRunRejectRate: -1,
		Validators: []backfill.Validator{backfill.CheckExceptionRate{Severity: backfill.SeverityWarn, MaxRate: 0.001}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if c.Lo == 1000 {
				for i, a := range awkward {
					if err := w.Reject(ctx, map[string]any{"line": i, "text": a}, "route", "unreadable route: "+a); err != nil {
						return err
					}
				}
				if err := w.Write(ctx, int64(-1), "X-Y", "twelve"); err != nil {
					return err
				}
			}
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, fmt.Sprintf("R%d", id%7), id*factor); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "fares", Key: []string{"id"}, Columns: []string{"id", "route", "fare"}}}
}

// loadFares makes a database with two batches of the fares job: batch 1
// loads 3,000 rows (4 + 1 rejected), batch 2 restates ids [0, 1000).
func loadFares(t *testing.T) (u string, db *sqlx.DB, b1, b2 int64) {
	t.Helper()
	ctx := context.Background()
	u = pgtest.NewURL(t)
	db = sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { _ = db.Close() })
	_, err := db.Exec(faresDDL)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, faresJob(3000, 1, false))
	require.NoError(t, err)
	require.Equal(t, int64(5), rep.Counts.Rejected)
	rep2, err := r.Run(ctx, faresJob(1000, 2, true))
	require.NoError(t, err)
	require.Equal(t, int64(999), rep2.Counts.Updated) // id 0 has fare 0 either way
	return u, db, rep.BatchID, rep2.BatchID
}

// cliOK runs the command and requires exit status 0.
func cliOK(t *testing.T, u string, args ...string) string {
	t.Helper()
	code, out, errOut := cli(t, u, args...)
	require.Equal(t, exitOK, code, "%v: stderr: %s", args, errOut)
	require.Empty(t, errOut, "%v", args)
	return out
}

// cliJSON runs the command with --json and decodes its output into v.
func cliJSON(t *testing.T, u string, v any, args ...string) {
	t.Helper()
	out := cliOK(t, u, append(args, "--json")...)
	d := json.NewDecoder(strings.NewReader(out))
	d.DisallowUnknownFields()
	require.NoError(t, d.Decode(v), "%v: %s", args, out)
}

// TestCLIReadCommands: runs, chunks, exceptions, validations and events,
// for people and with --json, with their filters, against two batches of
// a job, with only DATABASE_URL.
func TestCLIReadCommands(t *testing.T) {
	t.Parallel()
	u, _, b1, b2 := loadFares(t)

	// runs
	var runs runsResult
	cliJSON(t, u, &runs, "runs")
	require.Len(t, runs.Runs, 2)
	require.Equal(t, b2, runs.Runs[0].BatchID, "newest first")
	r1 := runs.Runs[1]
	require.Equal(t, "fares", r1.Job)
	require.Equal(t, "completed", r1.Status)
	require.Equal(t, runChunks{Total: 3, Done: 3}, r1.Chunks)
	require.Equal(t, rowCounts{Read: 3005, Inserted: 3000, Rejected: 5}, r1.Rows)
	require.NotNil(t, r1.FinishedAt)
	require.NotNil(t, r1.Seconds)
	cliJSON(t, u, &runs, "runs", "--limit", "1")
	require.Len(t, runs.Runs, 1)
	cliJSON(t, u, &runs, "runs", "--job", "nope")
	require.Empty(t, runs.Runs)
	require.NotNil(t, runs.Runs, "an empty list is [], not null")
	out := cliOK(t, u, "runs")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	require.Regexp(t, `^BATCH\s+JOB\s+STATUS\s+STARTED \(UTC\)\s+FINISHED \(UTC\)\s+TOOK\s+CHUNKS\s+READ\s+INSERTED`, lines[0])
	require.Regexp(t, fmt.Sprintf(`^%d\s+fares\s+\S+\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\s+\S+\s+3/3\s+3,005\s+3,000\s+0\s+0\s+5\s+0$`, b1), lines[2])
	// Aligned: every column starts where its header does.
	require.Equal(t, strings.Index(lines[0], "READ"), strings.Index(lines[2], "3,005"), out)
	require.Contains(t, cliOK(t, u, "runs", "--job", "nope"), `no runs with job "nope"`)

	// chunks
	var chunks chunksResult
	cliJSON(t, u, &chunks, "chunks", "--batch", fmt.Sprint(b1))
	require.Equal(t, 3, chunks.Total)
	require.Len(t, chunks.Chunks, 3)
	c1 := chunks.Chunks[1]
	require.Equal(t, "int:1000/2000", c1.ID)
	require.Equal(t, "done", c1.Status)
	require.Equal(t, rowCounts{Read: 1005, Inserted: 1000, Rejected: 5}, c1.Rows)
	require.Equal(t, 1, c1.Attempts)
	require.NotEmpty(t, c1.Worker)
	cliJSON(t, u, &chunks, "chunks", "--job", "fares", "--limit", "1")
	require.Equal(t, b2, chunks.BatchID, "--job is its latest run")
	require.Len(t, chunks.Chunks, 1)
	cliJSON(t, u, &chunks, "chunks", "--batch", fmt.Sprint(b1), "--status", "failed")
	require.Zero(t, chunks.Total)
	out = cliOK(t, u, "chunks", "--batch", fmt.Sprint(b1))
	require.Contains(t, out, fmt.Sprintf(`batch %d of job "fares"`, b1))
	require.Regexp(t, `(?m)^1\s+int:1000/2000\s+done\s+1,005\s+1,000\s+0\s+0\s+5\s+0\s+1\s`, out)

	// exceptions
	var ex exceptionsResult
	cliJSON(t, u, &ex, "exceptions", "--batch", fmt.Sprint(b1))
	require.Equal(t, int64(5), ex.Total)
	require.Len(t, ex.Exceptions, 5)
	for i, a := range awkward {
		e := ex.Exceptions[i]
		require.Equal(t, "int:1000/2000", e.ChunkID)
		require.Equal(t, int64(i+1), e.Row)
		require.Equal(t, "route", e.Column)
		require.Equal(t, "unreadable route: "+a, e.Reason)
		var raw map[string]any
		require.NoError(t, json.Unmarshal(e.Raw, &raw))
		require.Equal(t, a, raw["text"], "the raw value")
	}
	bad := ex.Exceptions[4]
	require.Equal(t, "fare", bad.Column)
	require.Equal(t, "twelve", bad.Value)
	require.Contains(t, string(bad.Raw), "twelve")
	cliJSON(t, u, &ex, "exceptions", "--batch", fmt.Sprint(b1), "--column", "fare")
	require.Equal(t, int64(1), ex.Total)
	cliJSON(t, u, &ex, "exceptions", "--batch", fmt.Sprint(b1), "--reason", "UNREADABLE ROUTE", "--limit", "2")
	require.Equal(t, int64(4), ex.Total, "the reason matches without case")
	require.Len(t, ex.Exceptions, 2)
	cliJSON(t, u, &ex, "exceptions", "--batch", fmt.Sprint(b1), "--chunk", "int:0/1000")
	require.Zero(t, ex.Total)
	require.NotNil(t, ex.Exceptions)
	out = cliOK(t, u, "exceptions", "--batch", fmt.Sprint(b1), "--limit", "3")
	require.Contains(t, out, "5 exceptions")
	require.Contains(t, out, "(3 of 5 shown")
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 1+1+3+1, "a raw newline stays inside its row:\n%s", out)

	// validations
	var vs validationsResult
	cliJSON(t, u, &vs, "validations", "--batch", fmt.Sprint(b1))
	require.Len(t, vs.Validations, 3)
	require.Equal(t, 2, vs.Passed)
	require.Equal(t, 1, vs.Failed)
	require.Equal(t, []checkSummary{{Check: "exception_rate", Severity: "warn", Passed: 2, Failed: 1}}, vs.Checks)
	cliJSON(t, u, &vs, "validations", "--batch", fmt.Sprint(b1), "--failed")
	require.Len(t, vs.Validations, 1)
	require.Equal(t, "int:1000/2000", vs.Validations[0].ChunkID)
	require.Equal(t, "exception_rate", vs.Validations[0].Check)
	require.Equal(t, "warn", vs.Validations[0].Severity)
	cliJSON(t, u, &vs, "validations", "--batch", fmt.Sprint(b1), "--chunk", "int:0/1000")
	require.Len(t, vs.Validations, 1)
	require.True(t, vs.Validations[0].Passed)
	out = cliOK(t, u, "validations", "--batch", fmt.Sprint(b1))
	require.Contains(t, out, "3 results: 2 passed, 1 failed (0 accepted)")
	require.Regexp(t, `(?m)^int:1000/2000\s+exception_rate\s+warn\s+FAILED\s`, out)
	require.Regexp(t, `(?m)^exception_rate\s+warn\s+2\s+1\s+0$`, out)

	// events
	var ev eventsResult
	cliJSON(t, u, &ev, "events", "--batch", fmt.Sprint(b1))
	kinds := map[string]bool{}
	for _, e := range ev.Events {
		kinds[e.Kind] = true
		require.True(t, json.Valid(e.Detail))
	}
	require.True(t, kinds["run_started"], "%v", kinds)
	cliJSON(t, u, &ev, "events", "--batch", fmt.Sprint(b1), "--kind", "run_started")
	require.Len(t, ev.Events, 1)
	cliJSON(t, u, &ev, "events", "--job", "fares", "--limit", "1")
	require.Len(t, ev.Events, 1)
	require.Equal(t, b2, ev.BatchID)
	out = cliOK(t, u, "events", "--batch", fmt.Sprint(b1))
	require.Regexp(t, `(?m)^TIME \(UTC\)\s+KIND\s+ACTOR\s+DB ROLE\s+DETAIL$`, out)
	require.Regexp(t, `(?m)^\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\s+run_started\s`, out)
}

// TestCLIExceptionsCSV: --csv is RFC 4180: a reader gets back every
// field, raw values with commas, quotes and newlines included.
func TestCLIExceptionsCSV(t *testing.T) {
	t.Parallel()
	u, db, b1, _ := loadFares(t)
	out := cliOK(t, u, "exceptions", "--batch", fmt.Sprint(b1), "--csv", "--limit", "0")
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	require.NoError(t, err, out)
	require.Equal(t, exceptionsCSVHeader, recs[0])
	var want []struct {
		Chunk  string `db:"chunk_id"`
		Row    string `db:"row_number"`
		Reason string `db:"reason"`
		Column string `db:"column_name"`
		Value  string `db:"value"`
		Raw    string `db:"raw"`
	}
	require.NoError(t, db.Select(&want, `SELECT chunk_id, row_number::text, reason, column_name, value, raw::text AS raw
		FROM backfill.exceptions WHERE batch_id = $1 ORDER BY row_number`, b1))
	require.Len(t, recs, 1+len(want))
	for i, w := range want {
		r := recs[i+1]
		// (encoding/csv's reader drops the \r of a \r\n inside a field.)
		require.Equal(t, []string{fmt.Sprint(b1), w.Chunk, w.Row, strings.ReplaceAll(w.Reason, "\r\n", "\n"), w.Column, w.Value, w.Raw}, r[:7], "record %d", i+1)
	}
	require.Contains(t, out, "\"unreadable route: cr\r\nlf, \"\"both\"\"\"", "the field as written, quoted, quotes doubled")
	// The awkward values came back whole, through the reason and the raw row.
	for i, a := range awkward {
		require.Equal(t, "unreadable route: "+strings.ReplaceAll(a, "\r\n", "\n"), recs[i+1][3])
		var raw map[string]any
		require.NoError(t, json.Unmarshal([]byte(recs[i+1][6]), &raw))
		require.Equal(t, a, raw["text"])
	}
	// Filters apply to CSV too.
	out = cliOK(t, u, "exceptions", "--batch", fmt.Sprint(b1), "--csv", "--column", "fare")
	recs, err = csv.NewReader(strings.NewReader(out)).ReadAll()
	require.NoError(t, err)
	require.Len(t, recs, 2)
	require.Equal(t, "twelve", recs[1][5])
}

// cliState is the target and the manifest's runs, chunks and events.
func cliState(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var s []string
	require.NoError(t, db.Select(&s, `SELECT 'fares ' || row(f.*)::text FROM fares f
		UNION ALL SELECT 'run ' || batch_id || ' ' || status FROM backfill.runs
		UNION ALL SELECT 'chunk ' || batch_id || ' ' || seq || ' ' || status FROM backfill.chunks
		UNION ALL SELECT 'event ' || id || ' ' || kind FROM backfill.events ORDER BY 1`))
	return s
}

// TestCLIRollback: a preview changes nothing and lists the conflicts; a
// rollback meeting rows a later batch changed is refused (exit 1) and
// changes nothing; the later batch, then the earlier one, roll back,
// recorded with the actor (default user@host) and why; a repeated
// rollback changes nothing.
func TestCLIRollback(t *testing.T) {
	t.Parallel()
	u, db, b1, b2 := loadFares(t)
	before := cliState(t, db)

	var pv rollbackResult
	cliJSON(t, u, &pv, "rollback", "--preview", "--batch", fmt.Sprint(b1))
	require.True(t, pv.Preview)
	require.Equal(t, b1, pv.BatchID)
	require.Equal(t, int64(1000), pv.Conflicts, "batch 2 changed ids 1..999 and delivered id 0 unchanged")
	require.Equal(t, int64(1), pv.ConflictsDelivered)
	require.Len(t, pv.ConflictRows, 100)
	require.Equal(t, b2, pv.ConflictRows[0].Batch)
	require.Equal(t, before, cliState(t, db), "a preview changes nothing")
	out := cliOK(t, u, "rollback", "--preview", "--job", "fares")
	require.Contains(t, out, fmt.Sprintf("preview of the rollback of batch %d", b2))
	require.Contains(t, out, "nothing was changed")
	require.Contains(t, out, "it would roll back 1 chunk: delete 0 rows, restore 999 rows")
	require.Equal(t, before, cliState(t, db), "a preview changes nothing")

	code, out, errOut := cli(t, u, "rollback", "--batch", fmt.Sprint(b1), "--why", "wrong fares")
	require.Equal(t, exitError, code, out)
	require.Contains(t, errOut, "later batches still applied")
	require.Contains(t, out, "1,000 rows were changed (999) or delivered unchanged (1)")
	require.Regexp(t, fmt.Sprintf(`(?m)^\{"id": 0\}\s+%d\s+delivered unchanged$`, b2), out)
	require.Regexp(t, fmt.Sprintf(`(?m)^\{"id": 100\}\s+%d\s+changed$`, b2), out)
	require.Contains(t, out, "(and 990 more; --json lists 100)")
	require.Equal(t, before, cliState(t, db), "a refused rollback changes nothing")

	var rb rollbackResult
	cliJSON(t, u, &rb, "rollback", "--batch", fmt.Sprint(b2), "--why", "restated by mistake", "--actor", "ann")
	require.Equal(t, "rolled_back", rb.Status)
	require.Equal(t, int64(999), rb.Restored)
	require.Equal(t, "ann", rb.Actor)
	out = cliOK(t, u, "rollback", "--batch", fmt.Sprint(b1), "--why", "wrong fares")
	require.Contains(t, out, fmt.Sprintf(`rolled back batch %d (job "fares"): 3 chunks, 3,000 rows deleted, 0 rows restored; status rolled_back`, b1))
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM fares`))
	require.Zero(t, n)

	var ev eventsResult
	cliJSON(t, u, &ev, "events", "--batch", fmt.Sprint(b1), "--kind", "rollback")
	require.Len(t, ev.Events, 1)
	require.Equal(t, osActor(), ev.Events[0].Actor, "the default actor")
	require.Contains(t, ev.Events[0].Actor, "@")
	require.Contains(t, string(ev.Events[0].Detail), `"why": "wrong fares"`)
	cliJSON(t, u, &ev, "events", "--batch", fmt.Sprint(b2), "--kind", "rollback")
	require.Equal(t, "ann", ev.Events[0].Actor)

	after := cliState(t, db)
	cliJSON(t, u, &rb, "rollback", "--batch", fmt.Sprint(b1), "--why", "again")
	require.Zero(t, rb.Chunks)
	require.Equal(t, after, cliState(t, db), "a repeated rollback changes nothing")
}

// TestCLIRollbackPreviewNamesLaterBatches: a History job whose batch 2
// wrote late versions that batches 3 and 4, still applied, changed again.
// The preview of batch 2 says that its counts leave those rows out, names
// the later batches newest first, and says that rolling them back first
// lets this rollback restore the rows; rolled back in that order, each
// rollback goes through without --force.
func TestCLIRollbackPreviewNamesLaterBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { _ = db.Close() })
	_, err := db.Exec(`CREATE TABLE addr (customer text, valid_from date, valid_to date, city text,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (customer, valid_from))`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	run := func(rows ...[]any) int64 {
		t.Helper()
		rep, err := r.Run(ctx, backfill.Job{Name: "addr", NewRun: true, Chunker: backfill.List("all"),
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				for _, row := range rows {
					if err := w.Write(ctx, row...); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: backfill.Target{Table: "addr", Key: []string{"customer"}, Mode: backfill.History, Columns: []string{"customer", "valid_from", "city"}}})
		require.NoError(t, err)
		return rep.BatchID
	}
	run([]any{"a", "2024-01-01", "Oslo"}, []any{"b", "2024-01-01", "Rome"})
	b2 := run([]any{"a", "2024-01-10", "Bergen"}, []any{"b", "2024-01-10", "Milan"})
	b3 := run([]any{"a", "2024-01-05", "Tromsø"})
	b4 := run([]any{"b", "2024-01-05", "Turin"})

	var pv rollbackResult
	cliJSON(t, u, &pv, "rollback", "--preview", "--batch", fmt.Sprint(b2))
	require.Equal(t, int64(2), pv.Conflicts, "the versions of Jan 1 batch 2 closed, closed again by batches 3 and 4")
	require.Equal(t, []int64{b4, b3}, pv.ConflictBatches, "newest first")
	out := cliOK(t, u, "rollback", "--preview", "--batch", fmt.Sprint(b2))
	require.Contains(t, out, fmt.Sprintf("; not counted: the 2 rows below, which later batches %d and %d changed or delivered unchanged since\n", b4, b3))
	require.Contains(t, out, fmt.Sprintf("2 rows were changed (2) or delivered unchanged (0) by later batches %d and %d, still applied; "+
		"the rollback is refused unless --force, which overwrites their changes; roll back batches %d and %d first (newest first), "+
		"and this rollback then restores (or deletes) them as well:\n", b4, b3, b4, b3))
	require.Regexp(t, fmt.Sprintf(`(?m)^\{"customer": "a", "valid_from": "2024-01-01"\}\s+%d\s+changed$`, b3), out)
	out = cliOK(t, u, "rollback", "--preview", "--batch", fmt.Sprint(b2), "--force")
	require.Contains(t, out, "restore 2 rows\n", "with --force the counts include the conflicting rows")
	require.Contains(t, out, fmt.Sprintf("--force rolls them back too, over those changes (or, without it: roll back batches %d and %d first (newest first), ", b4, b3))
	code, _, errOut := cli(t, u, "rollback", "--batch", fmt.Sprint(b2), "--why", "wrong cities")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, fmt.Sprintf("later batches still applied (batches %d and %d)", b4, b3))
	require.Contains(t, errOut, fmt.Sprintf("roll back batches %d and %d first, newest first, then this batch, or use Force", b4, b3))

	for _, b := range []int64{b4, b3} {
		cliOK(t, u, "rollback", "--batch", fmt.Sprint(b), "--why", "restated by mistake")
	}
	out = cliOK(t, u, "rollback", "--preview", "--batch", fmt.Sprint(b2))
	require.Contains(t, out, "it would roll back 1 chunk: delete 2 rows, restore 2 rows\n", "the later batches rolled back, nothing conflicts")
	cliOK(t, u, "rollback", "--batch", fmt.Sprint(b2), "--why", "wrong cities")
	var cities []string
	require.NoError(t, db.Select(&cities, `SELECT customer || ' ' || valid_from || ' ' || coalesce(valid_to::text, '-') || ' ' || city FROM addr ORDER BY 1`))
	require.Equal(t, []string{"a 2024-01-01 - Oslo", "b 2024-01-01 - Rome"}, cities)
}

// TestCLIErrors: bad usage exits 2 saying what is wrong, an unknown run 3,
// a missing or older manifest 4 saying to run backfill migrate.
func TestCLIErrors(t *testing.T) {
	t.Parallel()
	u, db, b1, _ := loadFares(t)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"runs", "--bogus"}, exitUsage, "unknown flag: --bogus"},
		{[]string{"runs", "--status", "sleeping"}, exitUsage, `--status "sleeping": want one of running, paused`},
		{[]string{"runs", "--limit", "-1"}, exitUsage, "--limit -1"},
		{[]string{"runs", "--limit", "many"}, exitUsage, `invalid argument "many" for "--limit"`},
		{[]string{"runs", "extra"}, exitUsage, `runs takes no arguments`},
		{[]string{"chunks", "fares", "other"}, exitUsage, `chunks takes at most one JOB`},
		{[]string{"chunks", "--batch", "-3"}, exitUsage, "--batch -3"},
		{[]string{"chunks", "--batch", fmt.Sprint(b1), "--status", "later"}, exitUsage, `--status "later"`},
		{[]string{"chunks", "--batch", "999"}, exitNotFound, "no batch 999 in the manifest"},
		{[]string{"chunks", "--job", "nope"}, exitNotFound, `no run of job "nope"`},
		{[]string{"chunks", "--job", "other", "--batch", fmt.Sprint(b1)}, exitUsage, `is a run of job "fares", not "other"`},
		{[]string{"exceptions", "--batch", fmt.Sprint(b1), "--csv", "--json"}, exitUsage, "--csv and --json are exclusive"},
		{[]string{"events", "--job", "nope"}, exitNotFound, `no run of job "nope"`},
		{[]string{"validations", "fares", "--job", "other"}, exitUsage, "name the job once"},
		{[]string{"rollback", "--job", "fares", "--why", "x"}, exitUsage, "rollback needs --batch N"},
		{[]string{"rollback", "--batch", fmt.Sprint(b1)}, exitUsage, "rollback needs --why TEXT"},
		{[]string{"rollback", "--preview"}, exitUsage, "name the run"},
		{[]string{"runs", "--schema", "nothere"}, exitManifest, `no manifest in schema "nothere": run "backfill migrate"`},
		{[]string{"nosuch"}, exitUsage, `unknown command "nosuch"`},
	} {
		code, out, errOut := cli(t, u, c.args...)
		require.Equal(t, c.code, code, "%v: %s %s", c.args, out, errOut)
		require.Contains(t, errOut, c.want, "%v", c.args)
		require.True(t, strings.HasPrefix(errOut, "backfill: "), "%v: %s", c.args, errOut)
		require.NotContains(t, errOut, "backfill: backfill:")
	}
	code, _, errOut := cli(t, "", "runs")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "set DATABASE_URL")

	// A manifest behind this program.
	_, err := db.Exec(`DELETE FROM backfill.schema_migrations WHERE version = (SELECT max(version) FROM backfill.schema_migrations)`)
	require.NoError(t, err)
	for _, args := range [][]string{{"runs"}, {"rollback", "--preview", "--batch", fmt.Sprint(b1)}} {
		code, _, errOut = cli(t, u, args...)
		require.Equal(t, exitManifest, code, errOut)
		require.Regexp(t, `the manifest in schema "backfill" is at version \d+, this program needs \d+: run "backfill migrate"`, errOut)
	}
}

// TestCLIHelp: every command documents itself, and the exit statuses.
func TestCLIHelp(t *testing.T) {
	t.Parallel()
	out := cliOK(t, "", "--help")
	for _, w := range []string{"Inspect a run:", "Operate a run:", "Administer the manifest:", "runs", "chunks", "exceptions", "validations",
		"events", "rollback", "migrate", "grants", "Exit status:", "4  the manifest is missing"} {
		require.Contains(t, out, w)
	}
	for _, c := range []string{"runs", "chunks", "exceptions", "validations", "events", "rollback"} {
		out := cliOK(t, "", c, "--help")
		require.Contains(t, out, "With --json:", c)
		require.Contains(t, out, "Examples:", c)
	}
}

// TestCLIBinary builds the command and runs it as an operator would, in
// an environment holding only DATABASE_URL.
func TestCLIBinary(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the binary")
	}
	bin := filepath.Join(t.TempDir(), "backfill")
	build := exec.Command(goBin, "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	u, db, b1, b2 := loadFares(t)
	runBin := func(args ...string) (int, string, string) {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"DATABASE_URL=" + u}
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, out.String(), errOut.String()
	}
	for _, args := range [][]string{{"runs"}, {"chunks", "--job", "fares"}, {"exceptions", "--batch", fmt.Sprint(b1), "--csv"},
		{"validations", "--batch", fmt.Sprint(b1)}, {"events", "--job", "fares"}, {"rollback", "--preview", "--batch", fmt.Sprint(b2)}} {
		code, out, errOut := runBin(args...)
		require.Equal(t, 0, code, "%v: %s", args, errOut)
		require.NotEmpty(t, out, "%v", args)
		code, out, errOut = runBin(append(args, "--json")...)
		if args[0] == "exceptions" {
			require.Equal(t, exitUsage, code, "--csv --json")
			continue
		}
		require.Equal(t, 0, code, "%v: %s", args, errOut)
		require.True(t, json.Valid([]byte(out)), "%v: %s", args, out)
	}
	code, out, errOut := runBin("rollback", "--batch", fmt.Sprint(b2), "--why", "from a shell")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "rolled back batch")
	var status string
	require.NoError(t, db.Get(&status, `SELECT status FROM backfill.runs WHERE batch_id = $1`, b2))
	require.Equal(t, "rolled_back", status)
	code, _, errOut = runBin("runs", "--limit", "x")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--limit")
}
