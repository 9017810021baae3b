package report_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

// The browser test's environment:
//   - BACKFILL_CHROMIUM: the browser binary (default: chromium or
//     chromium-browser on PATH);
//   - BACKFILL_REQUIRE_CHROMIUM=1 (or CI=true): fail the test when there
//     is no browser (otherwise it is skipped, saying how to install one);
//   - BACKFILL_REPORT_SCREENSHOT=path.png: save a full-page screenshot.
const (
	envChromium   = "BACKFILL_CHROMIUM"
	envScreenshot = "BACKFILL_REPORT_SCREENSHOT"
)

// chromium returns the path of the browser, or skips the test (fails it
// when Chromium is required).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(envChromium); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	pgtest.Missing(t, pgtest.Chromium, "the report's browser test needs Chromium: no chromium or chromium-browser on PATH; "+
		"install it (apt-get install chromium) or name it with "+envChromium+"=/path/to/chromium")
	return ""
}

// chart is what the page says of one chart.
type chart struct {
	Class string  `json:"cls"`
	W     float64 `json:"w"`
	H     float64 `json:"h"`
	Marks int     `json:"marks"`
}

// TestHTMLInHeadlessChromium opens the report of a real run in headless
// Chromium (--headless --no-sandbox --disable-gpu) and checks that it
// loads with no console error and no exception, requests nothing but the
// file itself, draws each of its four charts at a size above zero with
// marks in them, shows the run's key numbers, and is no wider than the
// window with a long audit detail, actor and exception value.
func TestHTMLInHeadlessChromium(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	rep := realRun(t)
	// Shown as counted (a replay with Job.SkipUnchanged counts them;
	// backfill's report tests count them from the manifest).
	rep.Totals.ChunksSkipped = 3
	// A long audit detail (one token, no break opportunity), a long raw
	// row and a long blocker query: none may widen the page.
	long := strings.Repeat("x", 3000)
	rep.Events = append(rep.Events, backfilltype.Event{BatchID: rep.Plan.BatchID, Job: rep.Plan.Job, Kind: "knob_set", Actor: "oncall-" + long,
		Detail: []byte(`{"why":"` + long + `","list":[` + strings.Repeat(`1,`, 1500) + `1]}`), CreatedAt: rep.GeneratedAt})
	if len(rep.Exceptions.Groups) > 0 && len(rep.Exceptions.Groups[0].Examples) > 0 {
		rep.Exceptions.Groups[0].Examples[0].Value = long
	}
	path := writeTemp(t, rep)
	fileURL := (&url.URL{Scheme: "file", Path: path}).String()

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900), chromedp.UserDataDir(t.TempDir()))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()

	var (
		mu       sync.Mutex
		problems []string
		requests []string
	)
	listener := func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				problems = append(problems, fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(args, " ")))
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, fmt.Sprintf("exception: %s (line %d)", ev.ExceptionDetails.Text, ev.ExceptionDetails.LineNumber))
		case *log.EventEntryAdded:
			if ev.Entry.Level == log.EntryLevelError || ev.Entry.Level == log.EntryLevelWarning {
				problems = append(problems, fmt.Sprintf("log %s (%s): %s %s", ev.Entry.Level, ev.Entry.Source, ev.Entry.Text, ev.Entry.URL))
			}
		case *network.EventRequestWillBeSent:
			requests = append(requests, ev.Request.URL)
		case *network.EventLoadingFailed:
			problems = append(problems, "loading failed: "+ev.ErrorText)
		}
	}
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithListener(listener))
	defer cancel()
	// The first Run starts the browser: no timeout on it (it would stop
	// the browser); the page's actions get one below.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", exe, err)
	}
	pctx, cancelP := context.WithTimeout(ctx, 60*time.Second)
	defer cancelP()
	if err := chromedp.Do(pctx, chromedp.Navigate(fileURL), chromedp.WaitReady(chromedp.CSS("footer"))); err != nil {
		t.Fatalf("open %s: %v", fileURL, err)
	}
	charts, err := chromedp.Run(pctx, chromedp.Evaluate[[]chart](`[...document.querySelectorAll('svg.chart')].map(s => {
		const r = s.getBoundingClientRect();
		return {cls: s.getAttribute('class'), w: r.width, h: r.height, marks: s.querySelectorAll('path, rect, polygon, polyline').length};
	})`))
	if err != nil {
		t.Fatal(err)
	}
	widths, err := chromedp.Run(pctx, chromedp.Evaluate[[]float64](`[document.documentElement.scrollWidth, window.innerWidth]`))
	if err != nil {
		t.Fatal(err)
	}
	if widths[0] > widths[1] {
		t.Errorf("the page is %v px wide in a %v px window: something (the audit trail's JSON?) widens it", widths[0], widths[1])
	}
	text, err := chromedp.Run(pctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		t.Fatal(err)
	}
	if p := os.Getenv(envScreenshot); p != "" {
		png, err := chromedp.Run(pctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("the page reported:\n  %s", strings.Join(problems, "\n  "))
	}
	for _, u := range requests {
		if u != fileURL {
			t.Errorf("the page requested %s; it may load only itself (%s)", u, fileURL)
		}
	}
	if len(requests) == 0 {
		t.Errorf("no request for the page seen: the listener saw nothing")
	}
	want := []string{"chart chunks", "chart rate", "chart durations", "chart split"}
	if len(charts) != len(want) {
		t.Fatalf("charts on the page: %+v, want %v", charts, want)
	}
	for i, c := range charts {
		if c.Class != want[i] || c.W < 100 || c.H < 50 || c.Marks == 0 {
			t.Errorf("chart %d: %+v, want class %q drawn at a size above zero with marks", i, c, want[i])
		}
	}
	for _, s := range []string{
		"Run report: items", "completed", rep.Plan.Fingerprint, "v1.2.3", "int [0, 120) step 10", "none",
		"12 / 12", "3 skipped unchanged", "of the done, skipped unchanged (SkipUnchanged: not staged nor merged)\t3", "read\t120\t100.0 %", fmt.Sprintf("%d rows in the exception queue", rep.Exceptions.Total), "negative value", "unparseable line", "no_twenties", "no chunk 20", "oncall",
		"run_resumed_by_operator", "worker-a", "worker-b", "throttled: pressure", "UTC",
	} {
		if !strings.Contains(text, s) {
			t.Errorf("the page does not show %q", s)
		}
	}
	if t.Failed() {
		t.Logf("page text:\n%s", text)
	}
}
