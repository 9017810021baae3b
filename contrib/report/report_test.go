package report_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/contrib/report"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestMain gives the tests a PostgreSQL server: DATABASE_URL, or a
// throwaway one (internal/pgtest).
func TestMain(m *testing.M) { pgtest.Main(m) }

// realRun runs a small job on a fresh database and returns its report:
// 12 chunks of 10 ids by two workers at once, rows rejected for two
// reasons, a warning check failing on one chunk, a pause by a critical
// throttle before the first chunk that "oncall" resumes, and a hold of
// the same throttle after.
func realRun(t *testing.T) backfill.RunReport {
	t.Helper()
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { db.Close() })
	db.MustExec(`CREATE TABLE pressure (v int NOT NULL); INSERT INTO pressure VALUES (150); CREATE SEQUENCE pressure_reads`)
	db.MustExec(`CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL)`)
	runner := func(worker string) *backfill.Runner {
		r, err := backfill.New(db, &backfill.Config{
			WorkerID:         worker,
			Concurrency:      1,
			ThrottleInterval: 50 * time.Millisecond,
			ReturnOnPause:    true, // the first call ends on the critical throttle's pause
			Throttles: []backfillthrottle.Throttle{
				// 150 (critical) until lowered; then 90 (a hold) for
				// three readings, then 10.
				{Signal: backfillthrottle.SQLSignal("pressure", `SELECT CASE WHEN v > 100 THEN v WHEN nextval('pressure_reads') <= 3 THEN 90 ELSE 10 END FROM pressure`),
					High: 80, Low: 50, Critical: 100},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	job := backfill.Job{
		Name:        "items",
		Source:      "fixture",
		CodeVersion: "v1.2.3",
		Chunker:     backfill.IntRange(0, 120, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			time.Sleep(time.Duration(10+c.Lo/2) * time.Millisecond) // chunks of varied durations
			for id := c.Lo; id < c.Hi; id++ {
				var err error
				switch {
				case id > 0 && id%7 == 0:
					err = w.Reject(ctx, map[string]any{"id": id, "v": -id}, "v", "negative value")
				case id > 0 && id%9 == 0:
					err = w.Reject(ctx, map[string]any{"line": fmt.Sprint("garbage ", id)}, "", "unparseable line")
				default:
					err = w.Write(ctx, id, id*10)
				}
				if err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback:         backfill.RollbackNone,
		MaxRunRejectRate: 0.5,
		Target:           backfill.Target{Table: "items", Key: []string{"id"}},
		Validators: []backfill.Validator{
			backfill.CheckExceptionRate{MaxRate: 0.5},
			backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s backfill.ValidationScope) (backfill.CheckResult, error) {
				return backfill.CheckResult{Check: "no_twenties", Severity: backfill.SeverityWarn, Passed: s.Chunk.Lo != 20,
					Expected: "no chunk 20", Actual: fmt.Sprint("chunk ", s.Chunk.Lo), Sample: []string{s.Chunk.ID}}, nil
			}),
		},
	}
	rep, err := runner("worker-a").Run(ctx, job)
	if !errors.Is(err, backfill.ErrRunPaused) {
		t.Fatalf("first call: %v, want it paused by the critical throttle", err)
	}
	m := backfill.NewPGManifest("")
	db.MustExec(`UPDATE pressure SET v = 0`)
	if err := m.ResumeRun(ctx, db, rep.BatchID, "oncall", "pressure is back to normal"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, w := range []string{"worker-a", "worker-b"} {
		wg.Go(func() { _, errs[i] = runner(w).Run(ctx, job) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	out, err := backfill.LoadRunReport(ctx, db, m, rep.BatchID)
	if err != nil {
		t.Fatal(err)
	}
	if out.Plan.Status != backfill.RunCompleted {
		t.Fatalf("run %s, want completed", out.Plan.Status)
	}
	return out
}

// Outside references: in a tag, a src, href (xlink:href), srcset,
// action, poster or data attribute naming a scheme or a
// protocol-relative address, or a CSS url() or @import doing so (in a
// style attribute); in a style element, the same url() or @import.
var (
	tagRE      = regexp.MustCompile(`<[a-zA-Z][^>]*>`)
	styleRE    = regexp.MustCompile(`(?is)<style[^>]*>(.*?)</style>`)
	attrRefRE  = regexp.MustCompile(`(?i)\b(src|href|srcset|action|poster|data)\s*=\s*["']?\s*([a-z][a-z0-9+.-]*:|//)`)
	cssRefRE   = regexp.MustCompile(`(?i)url\(\s*["']?\s*([a-z][a-z0-9+.-]*:|//)|@import`)
	scriptTags = regexp.MustCompile(`(?i)<(script|img|link|iframe|object|embed|audio|video|source|base)\b|\bon[a-z]+\s*=`)
)

// externalRefs returns the references of html to anything outside it,
// and the elements and event handlers a self-contained report has no use
// for.
func externalRefs(html string) []string {
	var out []string
	for _, tag := range tagRE.FindAllString(html, -1) {
		out = append(out, attrRefRE.FindAllString(tag, -1)...)
		out = append(out, cssRefRE.FindAllString(tag, -1)...)
		out = append(out, scriptTags.FindAllString(tag, -1)...)
	}
	for _, m := range styleRE.FindAllStringSubmatch(html, -1) {
		out = append(out, cssRefRE.FindAllString(m[1], -1)...)
	}
	return out
}

// TestHTMLIsSelfContained: the HTML of a run whose texts hold markup and
// addresses (a job name, an exception's value and raw row, an event's
// actor) refers to nothing outside the file, runs no script, and shows
// those texts escaped.
func TestHTMLIsSelfContained(t *testing.T) {
	t.Parallel()
	rep := realRun(t)
	hostile := `<img src="https://evil.example/x.png"><script>alert(1)</script>`
	rep.Plan.Job = hostile
	rep.Plan.CodeVersion = `javascript:alert(1)`
	rep.Events = append(rep.Events, backfilltype.Event{Kind: "note", Actor: hostile, Detail: json.RawMessage(`{"see":"http://evil.example/a.css"}`), CreatedAt: rep.GeneratedAt})
	rep.Exceptions.Groups = append(rep.Exceptions.Groups, backfilltype.ReportExceptionGroup{Reason: hostile, Column: "url(http://evil.example/f.woff)", Count: 1,
		Examples: []backfill.Exception{{ChunkID: "c", Row: 1, Value: `" onload="fetch('//evil.example')`, Raw: json.RawMessage(`{"u":"<link href='https://cdn.example/x.css'>"}`)}}})
	rep.Workers = append(rep.Workers, backfilltype.ReportWorker{WorkerID: hostile, Host: "//evil.example"})
	var buf bytes.Buffer
	if err := report.WriteHTML(&buf, rep); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	if m := externalRefs(html); len(m) > 0 {
		t.Errorf("the HTML refers outside itself or holds active content: %q", m)
	}
	if !strings.Contains(html, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Error("the hostile job name is not shown escaped")
	}
	if n := strings.Count(html, `<svg class="chart `); n != 4 {
		t.Errorf("%d charts, want 4", n)
	}
	// The time split's note agrees with its idle row.
	if strings.Contains(html, "Working includes time when no worker ran") || !strings.Contains(html, "then idle (no worker of the run alive") {
		t.Error("the time split's note does not say that time with no worker alive is idle")
	}
	if strings.Contains(html, "</strong>, ") {
		t.Error("a stray comma after the total")
	}
}

// TestExternalRefsFinds: externalRefs finds each kind of outside
// reference and active content (so TestHTMLIsSelfContained can fail), and
// not addresses in text or the SVG namespace.
func TestExternalRefsFinds(t *testing.T) {
	for _, s := range []string{`<img alt="">`, `<a href=http://x>`, `<use xlink:href="//x/s.svg#a"/>`,
		`<div style="background:url('https://x/b.png')">`, `<style>@import "x.css";</style>`, `<style>p{background:url(//x/b.png)}</style>`,
		`<a href="data:text/html,">`, `<svg onload="x()">`, `<script>`} {
		if len(externalRefs(s)) == 0 {
			t.Errorf("not found: %s", s)
		}
	}
	for _, s := range []string{`<a href="#plan">`, `<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink">`,
		`<p>see https://example.com and url(http://x) and src=https://x</p>`, `<style>p{color:red}</style>`} {
		if m := externalRefs(s); len(m) > 0 {
			t.Errorf("found %q in %s", m, s)
		}
	}
}

// TestWriteJSONRoundTrips: the JSON twin decodes to the same report.
func TestWriteJSONRoundTrips(t *testing.T) {
	t.Parallel()
	rep := realRun(t)
	var buf bytes.Buffer
	if err := report.WriteJSON(&buf, rep); err != nil {
		t.Fatal(err)
	}
	var back backfill.RunReport
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(rep)
	b, _ := json.Marshal(back)
	if !bytes.Equal(a, b) {
		t.Errorf("JSON round trip differs:\n%s\n%s", a, b)
	}
	chunks := 0
	for _, b := range back.Buckets.Buckets {
		chunks += b.Chunks
	}
	if back.Totals.Rows.Read != 120 || back.Exceptions.Total == 0 || chunks != 12 {
		t.Errorf("decoded report: %d rows read, %d exceptions, %d chunks in the buckets", back.Totals.Rows.Read, back.Exceptions.Total, chunks)
	}
}

// writeTemp writes the HTML of rep to a file of the test's temporary
// directory and returns its path.
func writeTemp(t *testing.T, rep backfill.RunReport) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "report.html")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := report.WriteHTML(f, rep); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}
