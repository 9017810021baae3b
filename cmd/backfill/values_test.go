package main

import (
	"context"
	"database/sql"
	"encoding/csv"
	"fmt"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestCLIExceptionValues: values refused after they came through a
// pointer, a pointer to a pointer or an sql.Null*, or a nil pointer,
// show in "backfill exceptions" and "backfill report" as the values
// they deliver (NULL for the nil pointer), never as Go addresses.
func TestCLIExceptionValues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { _ = db.Close() })
	db.MustExec(`CREATE TABLE vals (id bigint PRIMARY KEY, small smallint, code varchar(3), must text NOT NULL)`)
	n := 70000
	s := "abcdef"
	ps := &s
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, backfill.Job{Name: "vals", Chunker: backfill.List("all"), MaxRunRejectRate: -1, Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "vals", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for _, row := range [][]any{
				{int64(1), &n, "a", "x"},
				{int64(2), int16(1), &ps, "x"},
				{int64(3), sql.NullInt64{Int64: 70001, Valid: true}, "a", "x"},
				{int64(4), int16(1), "a", (*string)(nil)},
				{int64(5), int16(1), "a", "ok"},
			} {
				if err := w.Write(ctx, row...); err != nil {
					return err
				}
			}
			return nil
		})})
	require.NoError(t, err)
	require.Equal(t, int64(4), rep.Counts.Rejected)

	out := cliOK(t, u, "exceptions", "--batch", fmt.Sprint(rep.BatchID))
	for _, want := range []string{"70000", "abcdef", "70001", "NULL"} {
		require.Contains(t, out, want)
	}
	require.NotContains(t, out, "0x")
	out = cliOK(t, u, "exceptions", "--batch", fmt.Sprint(rep.BatchID), "--csv", "--limit", "0")
	require.Contains(t, out, "70000")
	require.NotContains(t, out, "0x")
	out = cliOK(t, u, "report", "--batch", fmt.Sprint(rep.BatchID))
	require.False(t, strings.Contains(out, "0x"), "report: %s", out)
}

// TestCLIExceptionsCSVFormulas: exceptions --csv neutralises the cells a
// spreadsheet would run as formulas (OWASP): a value or reason that
// begins with =, +, -, @, a tab or a carriage return is written with a
// single quote before it, every field is quoted, and --json keeps the
// values as stored.
func TestCLIExceptionsCSVFormulas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { _ = db.Close() })
	db.MustExec(`CREATE TABLE formulas (id bigint PRIMARY KEY, n boolean)`)
	values := []string{`=HYPERLINK("http://x","y")`, `+1`, `-2+3`, `@SUM(A1)`, "\t=1+1", "\r=1+1", `plain`}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, backfill.Job{Name: "formulas", Chunker: backfill.List("all"), MaxRunRejectRate: -1, Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "formulas", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for i, v := range values {
				if err := w.Write(ctx, int64(i), v); err != nil {
					return err
				}
			}
			if err := w.Write(ctx, int64(100), true); err != nil {
				return err
			}
			return w.Reject(ctx, map[string]any{"x": 1}, "n", `=cmd|' /C calc'!A0`)
		})})
	require.NoError(t, err)
	require.Equal(t, int64(len(values)+1), rep.Counts.Rejected)

	out := cliOK(t, u, "exceptions", "--batch", fmt.Sprint(rep.BatchID), "--csv", "--limit", "0")
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	require.NoError(t, err, out)
	require.Len(t, recs, 1+len(values)+1)
	for i, v := range values {
		want := v
		if v != "plain" {
			want = "'" + v
		}
		require.Equal(t, want, recs[i+1][5], "value of record %d", i+1)
	}
	require.Equal(t, `'=cmd|' /C calc'!A0`, recs[len(values)+1][3], "reason")
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		require.True(t, strings.HasPrefix(line, `"`) && strings.HasSuffix(line, `"`), "every field quoted: %q", line)
	}
	require.Contains(t, out, `"'=HYPERLINK(""http://x"",""y"")"`)

	var res exceptionsResult
	cliJSON(t, u, &res, "exceptions", "--batch", fmt.Sprint(rep.BatchID), "--limit", "0")
	got := map[string]bool{}
	for _, e := range res.Exceptions {
		got[e.Value] = true
	}
	for _, v := range values {
		require.True(t, got[v], "--json keeps %q as stored: %v", v, got)
	}
}

// TestCLILongTexts: the human output of status, events and exceptions
// shows the head of a huge stored text (a 50 MiB pause reason, a 1 MiB
// actor, event detail and exception value) and its full length, in a
// few kilobytes; --json gives the texts whole.
func TestCLILongTexts(t *testing.T) {
	t.Parallel()
	u, db, b1, _ := loadFares(t)
	db.MustExec(`UPDATE backfill.runs SET status = 'paused', last_error = repeat('R', 50 << 20) WHERE batch_id = $1`, b1)
	db.MustExec(`INSERT INTO backfill.events (batch_id, job_name, kind, actor, detail)
		VALUES ($1, 'fares', 'note', repeat('A', 1 << 20), jsonb_build_object('why', repeat('W', 1 << 20)))`, b1)
	db.MustExec(`UPDATE backfill.exceptions SET value = repeat('V', 1 << 20) WHERE batch_id = $1`, b1)
	batch := fmt.Sprint(b1)

	out := cliOK(t, u, "status", "--batch", batch)
	t.Logf("status: %d bytes", len(out))
	require.Less(t, len(out), 16<<10, "status: %d bytes", len(out))
	require.Regexp(t, `RRRR … \(52,428,\d{3} characters in all; [^)]*\) … [^\n]*backfill resume --batch `+batch+` --why WHY`, out, "the reason's head and length, then what to do")
	out = cliOK(t, u, "events", "--batch", batch)
	t.Logf("events: %d bytes", len(out))
	require.Less(t, len(out), 16<<10, "events: %d bytes", len(out))
	require.Contains(t, out, "AAAA … (1,048,576 characters)")
	require.Contains(t, out, "WWWW … (1,048,586 characters)") // {"why":"W...W"}
	out = cliOK(t, u, "exceptions", "--batch", batch)
	t.Logf("exceptions: %d bytes", len(out))
	require.Less(t, len(out), 16<<10, "exceptions: %d bytes", len(out))
	require.Contains(t, out, "VVVV … (1,048,576 characters)")

	var st backfill.Status
	cliJSON(t, u, &st, "status", "--batch", batch)
	require.Greater(t, len(st.Waiting), 50<<20, "--json keeps the reason whole")
	var ex exceptionsResult
	cliJSON(t, u, &ex, "exceptions", "--batch", batch)
	require.Len(t, ex.Exceptions[0].Value, 1<<20)
}

// TestCLIStatusThrottleWarning: backfill status shows a throttle signal
// that guards nothing (a replica lag signal on the tests' server, which
// has no replica), and --json lists it.
func TestCLIStatusThrottleWarning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { _ = db.Close() })
	db.MustExec(`CREATE TABLE lagged (id bigint PRIMARY KEY)`)
	r, err := backfill.New(db, &backfill.Config{Throttles: []backfillthrottle.Throttle{{Signal: backfillthrottle.ReplicaLagSignal(), High: 10}}})
	require.NoError(t, err)
	rep, err := r.Run(ctx, backfill.Job{Name: "lagged", Chunker: backfill.List("all"), Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "lagged", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, int64(1))
		})})
	require.NoError(t, err)
	out := cliOK(t, u, "status", "--batch", fmt.Sprint(rep.BatchID))
	require.Regexp(t, `(?m)^warning: throttle signal replica_lag guards nothing since \S+ \S+: the server has no replicas`, out)
	var st backfill.Status
	cliJSON(t, u, &st, "status", "--batch", fmt.Sprint(rep.BatchID))
	require.Len(t, st.ThrottleWarnings, 1)
	require.Equal(t, "replica_lag", st.ThrottleWarnings[0].Signal)
}
