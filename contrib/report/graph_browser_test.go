package report_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// graphReports runs two graphs on a fresh database and returns the
// reports of their runs: "routes", finished (three modules, one after
// another); and "feeds", left incomplete: "src" failed on its last chunk
// with a long error (one URL-like token), "src_stats" held by it,
// "lookup" disabled and "lookup_daily" held by it, and a module of a
// 200-byte name (one token) with a long job name, completed.
func graphReports(t *testing.T) (done, held backfill.RunReport) {
	t.Helper()
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { db.Close() })
	job := func(name, table string, lo, hi, step int64, fail func(c backfill.Chunk) error) backfill.Job {
		db.MustExec(fmt.Sprintf(`CREATE TABLE %q (id bigint PRIMARY KEY, v text)`, table))
		return backfill.Job{Name: name, Chunker: backfill.IntRange(lo, hi, step), Rollback: backfill.RollbackNone,
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				if fail != nil {
					if err := fail(c); err != nil {
						return err
					}
				}
				for id := c.Lo; id < c.Hi; id++ {
					if err := w.Write(ctx, id, "x"); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: backfill.Target{Table: table, Key: []string{"id"}, Columns: []string{"id", "v"}}}
	}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	report := func(g backfill.Graph) backfill.RunReport {
		rep, err := r.RunGraph(ctx, g)
		if rep.BatchID == 0 {
			t.Fatalf("graph %s: no run: %v", g.Name, err)
		}
		rr, err := backfill.LoadRunReport(ctx, db, backfill.NewPGManifest(""), rep.BatchID)
		if err != nil {
			t.Fatal(err)
		}
		if rr.Graph == nil {
			t.Fatalf("graph %s: the report has no modules", g.Name)
		}
		return rr
	}
	done = report(backfill.Graph{Name: "routes", Modules: []backfill.Module{
		{Name: "airports", Jobs: []backfill.Job{job("airports", "airports", 0, 30, 10, nil)}},
		{Name: "flights", Jobs: []backfill.Job{job("flights", "flights", 0, 1200, 100, nil)}, DependsOn: []string{"airports"}},
		{Name: "route_stats", Jobs: []backfill.Job{job("route_stats", "route_stats", 0, 30, 5, nil)}, DependsOn: []string{"flights"}},
	}})
	longModule := "airport_" + strings.Repeat("dimension_", 19) + "x"
	longJob := "load_" + strings.Repeat("airport_dimension_", 7)
	held = report(backfill.Graph{Name: "feeds", Modules: []backfill.Module{
		{Name: "src", Jobs: []backfill.Job{job("src", "src", 0, 30, 10, func(c backfill.Chunk) error {
			if c.Lo == 20 {
				return errors.New("upstream refused https://feeds.example.invalid/api/v2/flights?from=2024-01-01&to=2024-12-31&fields=" +
					strings.Repeat("carrier,origin,destination,", 20))
			}
			return nil
		})}},
		{Name: "src_stats", Jobs: []backfill.Job{job("src_stats", "src_stats", 0, 30, 10, nil)}, DependsOn: []string{"src"}},
		{Name: "lookup", Jobs: []backfill.Job{job("lookup", "lookup", 0, 30, 10, nil)}, Disabled: true},
		{Name: "lookup_daily", Jobs: []backfill.Job{job("lookup_daily", "lookup_daily", 0, 30, 10, nil)}, DependsOn: []string{"lookup"}},
		{Name: longModule, Jobs: []backfill.Job{job(longJob, "dims", 0, 20, 10, nil)}},
	}})
	want := map[string]backfilltype.ModuleState{"src": backfilltype.ModuleFailed, "src_stats": backfilltype.ModuleHeld,
		"lookup": backfilltype.ModuleDisabled, "lookup_daily": backfilltype.ModuleHeld, longModule: backfilltype.ModuleCompleted}
	for _, m := range held.Graph.Modules {
		if m.State != want[m.Name] {
			t.Fatalf("module %s: %s, want %s", m.Name, m.State, want[m.Name])
		}
	}
	return done, held
}

// moduleRow is what the page shows of one row of the Modules table.
type moduleRow struct {
	// Cells are the cells' visible text (innerText).
	Cells []string `json:"cells"`
	// Cut lists the cells whose content is wider than the cell (cut or
	// scrolled), Outside those that end beyond the window.
	Cut     []int `json:"cut"`
	Outside []int `json:"outside"`
	// Contrast is the contrast ratio of the state's label (text on its
	// background, WCAG 2), BadgeLines its height in lines (above 1: its
	// word broken), Visible whether the row has a size.
	Contrast   float64 `json:"contrast"`
	BadgeLines float64 `json:"badgeLines"`
	Visible    bool    `json:"visible"`
	// Broken lists the row's words of up to 16 characters split across
	// two lines.
	Broken []string `json:"broken"`
}

// seenPage is what a person sees of a report in the browser.
type seenPage struct {
	Rows        []moduleRow `json:"rows"`
	Headers     []string    `json:"headers"`
	Cards       []string    `json:"cards"`
	ScrollWidth float64     `json:"scrollWidth"`
	InnerWidth  float64     `json:"innerWidth"`
	Text        string      `json:"text"`
}

// seeJS reads seenPage from the page.
const seeJS = `(() => {
	const lum = (c) => {
		const m = c.match(/[\d.]+/g).map(Number);
		const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
		return 0.2126 * f(m[0]) + 0.7152 * f(m[1]) + 0.0722 * f(m[2]);
	};
	const contrast = (el) => {
		const s = getComputedStyle(el);
		const a = lum(s.color), b = lum(s.backgroundColor);
		return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
	};
	// brokenWords lists the words of el's text nodes, up to 16
	// characters, that are split across lines (a break opportunity the
	// page put in, <wbr>, ends a text node).
	const brokenWords = (el) => {
		const out = [];
		const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
		for (let n = walk.nextNode(); n; n = walk.nextNode()) {
			for (const m of n.data.matchAll(/\S+/g)) {
				if (m[0].length > 16) continue;
				const r = document.createRange();
				r.setStart(n, m.index);
				r.setEnd(n, m.index + m[0].length);
				const tops = new Set([...r.getClientRects()].map(q => Math.round(q.top)));
				if (tops.size > 1) out.push(m[0]);
			}
		}
		return out;
	};
	const width = document.documentElement.clientWidth;
	// The Modules table: the first table after the heading #modules.
	let table = document.getElementById('modules');
	while (table && table.tagName !== 'TABLE') table = table.nextElementSibling;
	const rows = table ? [...table.querySelectorAll('tr')].filter(tr => tr.querySelector('td')).map(tr => {
		const cells = [...tr.querySelectorAll('td')];
		const badge = tr.querySelector('.status');
		const r = tr.getBoundingClientRect();
		return {
			cells: cells.map(td => td.innerText),
			cut: cells.map((td, i) => [...td.querySelectorAll('*')].concat([td]).some(e => e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).display !== 'inline') ? i : -1).filter(i => i >= 0),
			outside: cells.map((td, i) => td.getBoundingClientRect().right > width + 0.5 ? i : -1).filter(i => i >= 0),
			contrast: badge ? contrast(badge) : 0,
			badgeLines: badge ? badge.getBoundingClientRect().height / parseFloat(getComputedStyle(badge).lineHeight) : 0,
			broken: brokenWords(tr),
			visible: r.width > 0 && r.height > 0,
		};
	}) : [];
	return {
		rows,
		headers: table ? [...table.querySelectorAll('th')].map(th => th.innerText) : [],
		cards: [...document.querySelectorAll('.card')].map(c => c.innerText),
		scrollWidth: document.documentElement.scrollWidth,
		innerWidth: window.innerWidth,
		text: document.body.innerText,
	};
})()`

// browse opens the HTML file at path in headless Chromium (exe) in a
// window width px wide and returns what it shows, and what the page
// reported: console errors and warnings, exceptions, log errors.
func browse(t *testing.T, exe, path string, width int) (seenPage, []string) {
	t.Helper()
	fileURL := (&url.URL{Scheme: "file", Path: path}).String()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(width, 900), chromedp.UserDataDir(t.TempDir()))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	var (
		mu       sync.Mutex
		problems []string
	)
	listener := func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				problems = append(problems, fmt.Sprintf("console.%s", ev.Type))
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, fmt.Sprintf("exception: %s (line %d)", ev.ExceptionDetails.Text, ev.ExceptionDetails.LineNumber))
		case *log.EventEntryAdded:
			if ev.Entry.Level == log.EntryLevelError || ev.Entry.Level == log.EntryLevelWarning {
				problems = append(problems, fmt.Sprintf("log %s (%s): %s %s", ev.Entry.Level, ev.Entry.Source, ev.Entry.Text, ev.Entry.URL))
			}
		}
	}
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithListener(listener))
	defer cancel()
	// The first action starts the browser: no timeout on it (it would
	// stop the browser); the page's actions get one.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", exe, err)
	}
	pctx, cancelP := context.WithTimeout(ctx, 60*time.Second)
	defer cancelP()
	if err := chromedp.Do(pctx, chromedp.Navigate(fileURL), chromedp.WaitReady(chromedp.CSS("footer"))); err != nil {
		t.Fatalf("open %s: %v", fileURL, err)
	}
	seen, err := chromedp.Run(pctx, chromedp.Evaluate[seenPage](seeJS))
	if err != nil {
		t.Fatal(err)
	}
	if p := os.Getenv(envScreenshot); p != "" {
		png, err := chromedp.Run(pctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		p = strings.TrimSuffix(p, ".png") + "-" + strings.TrimSuffix(path[strings.LastIndex(path, "/")+1:], ".html") + fmt.Sprintf("-%d.png", width)
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}
	mu.Lock()
	defer mu.Unlock()
	return seen, append([]string(nil), problems...)
}

// TestGraphReportInHeadlessChromium opens the reports of a finished
// graph and of a graph with a failed, a disabled and two held modules in
// headless Chromium, in a wide and a narrow window, and checks what a
// person sees: the Modules table's row of each module shows its state
// (and what holds it), its chunks done of total and its rows as the
// report's data says; no cell's text is cut or beyond the window, the
// page is no wider than the window, long names and errors wrap without
// breaking a short word; each state's label is readable
// (contrast at least 4.5:1); the summary counts the modules' chunks and
// rows (the graph's own run has none); and the page reports no error.
func TestGraphReportInHeadlessChromium(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	done, held := graphReports(t)
	logged := false
	for _, tc := range []struct {
		name string
		rep  backfill.RunReport
	}{{"finished", done}, {"held", held}} {
		path := writeTempNamed(t, tc.name+".html", tc.rep)
		for _, width := range []int{1280, 720} {
			seen, problems := browse(t, exe, path, width)
			where := fmt.Sprintf("%s graph at %d px", tc.name, width)
			if len(problems) > 0 {
				t.Errorf("%s: the page reported:\n  %s", where, strings.Join(problems, "\n  "))
			}
			if seen.ScrollWidth > seen.InnerWidth {
				t.Errorf("%s: the page is %v px wide in a %v px window", where, seen.ScrollWidth, seen.InnerWidth)
			}
			checkModuleRows(t, where, tc.rep.Graph.Modules, seen)
			var chunks, chunksTotal int
			var rows int64
			for _, m := range tc.rep.Graph.Modules {
				chunks += m.ChunksDone
				chunksTotal += m.ChunksTotal
				rows += m.Rows
			}
			if len(seen.Cards) < 2 || !strings.Contains(seen.Cards[0], fmt.Sprintf("%s / %s", num(int64(chunks)), num(int64(chunksTotal)))) ||
				!strings.Contains(seen.Cards[1], num(rows)) {
				t.Errorf("%s: the summary shows %q, want the modules' %d / %d chunks and %d rows", where, seen.Cards, chunks, chunksTotal, rows)
			}
			if t.Failed() && !logged {
				t.Logf("%s: page text:\n%s", where, seen.Text)
				logged = true
			}
		}
	}
}

// checkModuleRows checks the Modules table as seen against the modules
// of the report.
func checkModuleRows(t *testing.T, where string, modules []backfilltype.ModuleStatus, seen seenPage) {
	t.Helper()
	col := map[string]int{}
	for i, h := range seen.Headers {
		col[strings.ToLower(strings.TrimSpace(h))] = i
	}
	for _, h := range []string{"module", "state", "chunks", "rows"} {
		if _, ok := col[h]; !ok {
			t.Fatalf("%s: the Modules table has no %q column: %q", where, h, seen.Headers)
		}
	}
	if len(seen.Rows) != len(modules) {
		t.Fatalf("%s: the Modules table shows %d rows, want %d (one per module)", where, len(seen.Rows), len(modules))
	}
	for i, m := range modules {
		row := seen.Rows[i]
		cell := func(h string) string { return strings.TrimSpace(row.Cells[col[h]]) }
		if !row.Visible {
			t.Errorf("%s: module %s: its row is not visible", where, m.Name)
		}
		if got := strings.Join(strings.Fields(cell("module")), ""); got != m.Name {
			t.Errorf("%s: module %s: the row's module shows %q", where, m.Name, cell("module"))
		}
		state := cell("state")
		wantState := string(m.State)
		if m.HeldBy != "" {
			wantState += " by " + m.HeldBy
		}
		if first, _, _ := strings.Cut(state, "\n"); strings.TrimSpace(first) != wantState {
			t.Errorf("%s: module %s: the state shows %q, want %q first", where, m.Name, state, wantState)
		}
		if m.State == backfilltype.ModuleFailed && !strings.Contains(strings.Join(strings.Fields(state), ""), "upstreamrefused") {
			t.Errorf("%s: module %s: the state does not say why it failed: %q", where, m.Name, state)
		}
		if got, want := cell("chunks"), num(int64(m.ChunksDone))+" / "+num(int64(m.ChunksTotal)); got != want {
			t.Errorf("%s: module %s: chunks show %q, want %q", where, m.Name, got, want)
		}
		if got, want := cell("rows"), num(m.Rows); got != want {
			t.Errorf("%s: module %s: rows show %q, want %q", where, m.Name, got, want)
		}
		if len(row.Cut) > 0 || len(row.Outside) > 0 {
			t.Errorf("%s: module %s: cells %v cut, %v beyond the window: %q", where, m.Name, row.Cut, row.Outside, row.Cells)
		}
		if len(row.Broken) > 0 {
			t.Errorf("%s: module %s: words broken across lines: %q", where, m.Name, row.Broken)
		}
		if row.BadgeLines >= 1.5 {
			t.Errorf("%s: module %s: the %s label is %.1f lines high: its word is broken", where, m.Name, m.State, row.BadgeLines)
		}
		if row.Contrast < 4.5 {
			t.Errorf("%s: module %s: the %s label's contrast is %.2f:1, want at least 4.5:1", where, m.Name, m.State, row.Contrast)
		}
	}
}

// num is how the report writes an integer: thousands apart by a narrow
// no-break space.
func num(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, d := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteString("\u202f")
		}
		b.WriteRune(d)
	}
	return b.String()
}

// writeTempNamed is writeTemp with the file's name.
func writeTempNamed(t *testing.T, name string, rep backfill.RunReport) string {
	t.Helper()
	path := writeTemp(t, rep)
	named := strings.TrimSuffix(path, "report.html") + name
	if err := os.Rename(path, named); err != nil {
		t.Fatal(err)
	}
	return named
}
