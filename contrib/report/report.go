// Package report renders a [backfill.RunReport] as one self-contained
// HTML file, for a person, and as JSON, for a machine.
//
// The HTML file needs nothing beside itself: its CSS is inline, its
// charts are inline SVG drawn with gonum/plot, it runs no script and
// loads nothing (no fonts, images or style sheets from anywhere), so it
// can be mailed, attached to a ticket or opened offline. Its sections:
// the plan summary (fingerprint, code version, scope, rollback
// mechanism, who started the run); a timeline of chunks by worker; rows
// per second over time; the histogram of chunk durations; the split of
// the run's time into working, throttled (by signal) and paused; the
// waits of chunks on locks; exceptions by reason and column, with
// examples; validation evidence; the audit trail. Times are UTC.
//
// The report of a graph's run ([backfill.Runner.RunGraph]), which has no
// chunks of its own, shows its modules instead of those chunk sections:
// each module's state (what holds it, why it failed), chunks done of
// total, rows, class, priority, flag, dependencies and its jobs' runs
// (each with a report of its own); its summary counts the modules'
// chunks and rows. Its plan, pauses and audit trail follow.
//
// A report is read from the manifest alone, by
// [backfill.LoadRunReport], so it can be produced from any machine that
// reaches the database, without the job's code:
//
//	rep, err := backfill.LoadRunReport(ctx, db, backfill.NewPGManifest(""), batchID)
//	...
//	err = report.WriteHTML(f, rep)
//
// The operator's command does the same: backfill report --html out.html.
package report

import (
	"cmp"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"image/color"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/textcap"

	"github.com/pgbackfill/backfill"
)

//go:embed report.html.tmpl
var templates embed.FS

var page = template.Must(template.New("report.html.tmpl").Funcs(template.FuncMap{
	"num":   fmtInt,
	"float": fmtFloat,
	"secs":  fmtSeconds,
	"time":  fmtTime,
	"ptime": fmtTimePtr,
	"pct":   fmtPct,
	"json":  fmtJSON,
	"text":  fmtText,
	"wrap":  fmtWrap,
	"dur":   func(d time.Duration) string { return fmtSeconds(d.Seconds()) },
	"bytes": fmtBytes,
	// measured is bytes the run recorded, "—" for none (-1).
	"measured": func(n int64) string {
		if n < 0 {
			return "—"
		}
		return fmtBytes(n)
	},
	"int64": func(d time.Duration) int64 { return int64(d) },
	"off":   fmtOff,
}).ParseFS(templates, "report.html.tmpl"))

// WriteJSON writes r as indented JSON: the report's JSON twin, with the
// field names of [backfill.RunReport]'s json tags.
func WriteJSON(w io.Writer, r backfill.RunReport) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("report: write JSON of batch %d: %w", r.Plan.BatchID, err)
	}
	return nil
}

// WriteHTML writes r as one self-contained HTML document (UTF-8): inline
// CSS, charts as inline SVG, no script, no reference to anything outside
// the file. Every text of the report is escaped. It returns the first
// error of drawing a chart or writing to w.
//
// Each text from the manifest (a reason, an error, an actor, an
// exception's value or raw row, an event's detail, a validation's
// evidence) shows at most its first 1,000 characters, followed by
// "… (N characters; the full text is in the report's JSON twin)" when
// longer: a 50 MiB pause reason keeps the file a few hundred kilobytes.
// [WriteJSON] writes every text whole.
func WriteHTML(w io.Writer, r backfill.RunReport) error {
	v, err := newView(r)
	if err != nil {
		return fmt.Errorf("report: HTML of batch %d: %w", r.Plan.BatchID, err)
	}
	if err := page.Execute(w, v); err != nil {
		return fmt.Errorf("report: HTML of batch %d: %w", r.Plan.BatchID, err)
	}
	return nil
}

// view is what the template shows.
type view struct {
	R backfill.RunReport
	// Done counts the done chunks of ChunksTotal, RowsRead their rows;
	// for a graph's run (which has no chunks), its modules' jobs' runs',
	// and ModulesDone its modules completed. Duration is the run's time.
	Done        int
	ChunksTotal int
	RowsRead    int64
	ModulesDone int
	Duration    float64
	Statuses    []statusCount
	Outcomes    []outcome
	Workers     []workerRow
	Slowest     []backfilltype.ReportChunk
	Rejects     []backfilltype.ReportChunk
	Attn        []backfilltype.ReportChunk
	AttnMore    int
	// EventsHalf is where the events left out would be (RunReport.EventsOmitted).
	EventsHalf int
	Parts      []timePart
	// Charts, as inline SVG.
	Chunks, Rate, Durations, Split template.HTML
}

type statusCount struct {
	Status string
	N      int
}

type outcome struct {
	Name string
	N    int64
	Of   int64
}

type workerRow struct {
	ID     string
	Chunks int
	Rows   int64
	Busy   float64
	Procs  []backfilltype.ReportWorker
}

type timePart struct {
	Name    string
	Seconds float64
	Of      float64
	color   color.Color
}

// maxListed bounds the rows of the chunk tables.
const maxListed = 50

func newView(r backfill.RunReport) (view, error) {
	v := view{R: r, Done: r.Totals.ChunksByStatus[string(backfill.ChunkDone)], ChunksTotal: r.Plan.ChunksTotal, RowsRead: r.Totals.Rows.Read,
		Duration: r.Time.TotalSeconds, EventsHalf: len(r.Events) / 2}
	if r.Graph != nil {
		v.Done, v.ChunksTotal, v.RowsRead = 0, 0, 0
		for _, m := range r.Graph.Modules {
			v.Done += m.ChunksDone
			v.ChunksTotal += m.ChunksTotal
			v.RowsRead += m.Rows
			if m.State == backfilltype.ModuleCompleted {
				v.ModulesDone++
			}
		}
	}
	for _, s := range slices.Sorted(maps.Keys(r.Totals.ChunksByStatus)) {
		v.Statuses = append(v.Statuses, statusCount{s, r.Totals.ChunksByStatus[s]})
	}
	rows := r.Totals.Rows
	for _, o := range []outcome{{"inserted", rows.Inserted, 0}, {"updated", rows.Updated, 0}, {"unchanged", rows.Unchanged, 0},
		{"rejected", rows.Rejected, 0}, {"deduplicated", rows.Deduplicated, 0}} {
		o.Of = rows.Read
		v.Outcomes = append(v.Outcomes, o)
	}

	// Workers: by Config.WorkerID, the processes that ran under it.
	byID := map[string]*workerRow{}
	row := func(id string) *workerRow {
		if byID[id] == nil {
			byID[id] = &workerRow{ID: id}
		}
		return byID[id]
	}
	for _, w := range r.Workers {
		wr := row(w.WorkerID)
		wr.Procs = append(wr.Procs, w)
	}
	for _, c := range r.ChunkWorkers {
		if c.Worker == "" {
			continue
		}
		wr := row(c.Worker)
		wr.Chunks += c.Chunks
		wr.Rows += c.Rows.Read
		wr.Busy += c.BusySeconds
	}
	ids := slices.Sorted(maps.Keys(byID))
	for _, id := range ids {
		v.Workers = append(v.Workers, *byID[id])
	}

	// The notable chunks: the slowest first, the most rejects first, the
	// others (failed, in flight) in plan order.
	notable := func(why string) []backfilltype.ReportChunk {
		return slices.DeleteFunc(slices.Clone(r.Notable), func(c backfilltype.ReportChunk) bool { return !slices.Contains(c.Notable, why) })
	}
	v.Slowest = notable("slowest")
	sort.SliceStable(v.Slowest, func(i, j int) bool { return v.Slowest[i].DurationSeconds > v.Slowest[j].DurationSeconds })
	v.Rejects = notable("most_rejects")
	sort.SliceStable(v.Rejects, func(i, j int) bool { return v.Rejects[i].Counts.Rejected > v.Rejects[j].Counts.Rejected })
	notDone := 0
	for s, n := range r.Totals.ChunksByStatus {
		if s != string(backfill.ChunkDone) {
			notDone += n
		}
	}
	for _, c := range r.Notable {
		if c.Status != string(backfill.ChunkDone) || c.LastError != "" || c.InFlight {
			if len(v.Attn) < maxListed {
				v.Attn = append(v.Attn, c)
			}
		}
	}
	listedNotDone := 0
	for _, c := range v.Attn {
		if c.Status != string(backfill.ChunkDone) {
			listedNotDone++
		}
	}
	v.AttnMore = max(0, notDone-listedNotDone)

	t := r.Time
	v.Parts = []timePart{{"working", t.WorkingSeconds, t.TotalSeconds, colWorking}, {"paused", t.PausedSeconds, t.TotalSeconds, colPaused},
		{"idle (no live worker: between calls, dead, cancelled)", t.IdleSeconds, t.TotalSeconds, colOther}}
	for _, s := range slices.SortedFunc(maps.Keys(t.ThrottledSeconds), cmp.Compare[string]) {
		v.Parts = append(v.Parts, timePart{"throttled: " + s, t.ThrottledSeconds[s], t.TotalSeconds, colThrottled})
	}

	charts := []struct {
		dst  *template.HTML
		draw func() ([]byte, error)
	}{
		{&v.Chunks, func() ([]byte, error) { return chunksChart(r) }},
		{&v.Rate, func() ([]byte, error) { return rateChart(r) }},
		{&v.Durations, func() ([]byte, error) { return durationChart(r) }},
		{&v.Split, func() ([]byte, error) { return splitChart(r, v.Parts) }},
	}
	for _, c := range charts {
		svg, err := c.draw()
		if err != nil {
			return v, err
		}
		// gonum/plot's SVG escapes its text (html.EscapeString) and
		// holds only what svgOf wrote: safe to inline.
		*c.dst = template.HTML(svg)
	}
	return v, nil
}

// fmtInt formats n with thin spaces between thousands: 1 234 567.
func fmtInt(n any) string {
	var x int64
	switch n := n.(type) {
	case int:
		x = int64(n)
	case int64:
		x = n
	default:
		return fmt.Sprint(n)
	}
	s := strconv.FormatInt(x, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, d := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteString("\u202f")
		}
		b.WriteRune(d)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// fmtFloat formats x with 3 significant digits, thousands grouped.
func fmtFloat(x float64) string {
	switch {
	case x == 0:
		return "0"
	case x >= 1000 || x <= -1000:
		return fmtInt(int64(x + 0.5))
	case x >= 100 || x <= -100:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case x >= 10 || x <= -10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	case x >= 1 || x <= -1:
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}

// fmtSeconds formats a duration of s seconds with its unit: 850 ms,
// 12.3 s, 4 min 05 s, 2 h 03 min.
// fmtBytes formats n bytes in binary units: "512 B", "12.3 MiB".
func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), 0
	for (v >= unit || v <= -unit) && i < 5 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[i-1])
}

func fmtSeconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case s == 0:
		return "0 s"
	case s < 1:
		return fmtFloat(s*1000) + " ms"
	case s < 60:
		return fmtFloat(s) + " s"
	case s < 3600:
		return fmt.Sprintf("%d min %02d s", int(d/time.Minute), int(d%time.Minute/time.Second))
	}
	return fmt.Sprintf("%d h %02d min", int(d/time.Hour), int(d%time.Hour/time.Minute))
}

// fmtTime formats t in UTC to the millisecond, with the zone.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
}

func fmtTimePtr(t *time.Time) string {
	if t == nil {
		return "—"
	}
	return fmtTime(*t)
}

// fmtPct formats part of whole as a percentage.
// fmtOff is how far forecast is from actual in percent of actual, e.g.
// "+12 %"; "—" when actual is not known (negative) or 0.
func fmtOff(forecast, actual int64) string {
	if actual <= 0 {
		return "—"
	}
	return fmt.Sprintf("%+.0f %%", 100*(float64(forecast)-float64(actual))/float64(actual))
}

func fmtPct(part, whole any) string {
	f := func(x any) float64 {
		switch x := x.(type) {
		case int:
			return float64(x)
		case int64:
			return float64(x)
		case float64:
			return x
		}
		return 0
	}
	p, w := f(part), f(whole)
	if w == 0 {
		return "—"
	}
	return strconv.FormatFloat(100*p/w, 'f', 1, 64) + " %"
}

// fmtJSON formats raw JSON compactly, "" for none or an empty object.
func fmtJSON(raw json.RawMessage) string {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "{}" || s == "null" {
		return ""
	}
	return fmtText(s)
}

// textCap is the most characters of one stored text the HTML shows
// (see WriteHTML).
const textCap = 1000

// wrapRun is the most characters fmtWrap leaves without a break
// opportunity.
const wrapRun = 16

// fmtWrap is fmtText(v) escaped for HTML, with a break opportunity
// (<wbr>) after each punctuation a name, a URL or a list breaks at
// (_ - . / , ; : & ? =) and within every run of wrapRun characters
// without one: a long name or error wraps inside its table cell instead
// of widening the page, and a short word is never broken.
func fmtWrap(v any) template.HTML {
	var b strings.Builder
	run := 0
	for _, r := range fmtText(v) {
		b.WriteString(template.HTMLEscapeString(string(r)))
		run++
		if unicode.IsSpace(r) {
			run = 0
			continue
		}
		if strings.ContainsRune("_-./,;:&?=", r) || run >= wrapRun {
			b.WriteString("<wbr>")
			run = 0
		}
	}
	return template.HTML(b.String())
}

// fmtText is v (a string, or anything fmt prints) cut to textCap
// characters, a longer text followed by its full length.
func fmtText(v any) string {
	s, ok := v.(string)
	if !ok {
		s = fmt.Sprint(v)
	}
	return textcap.Clip(s, textCap, "the full text is in the report's JSON twin")
}
