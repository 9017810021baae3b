package report

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"regexp"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/pgbackfill/backfill"
)

// The charts of the report, drawn with gonum/plot as SVG documents and
// inlined in the HTML.

// Chart sizes, in points (1/72 in).
const (
	chartWidth  = 10 * vg.Inch
	chartHeight = 3.2 * vg.Inch
)

// Colours of the report (also used by its CSS).
var (
	colWorking   = color.RGBA{R: 0x2b, G: 0x6c, B: 0xb0, A: 0xff} // blue
	colDone      = colWorking
	colOpen      = color.RGBA{R: 0x2c, G: 0x9c, B: 0x8f, A: 0xff} // teal
	colFailed    = color.RGBA{R: 0xc0, G: 0x39, B: 0x2b, A: 0xff} // red
	colOther     = color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff} // grey
	colPaused    = color.RGBA{R: 0x7f, G: 0x8c, B: 0x8d, A: 0xff} // slate
	colThrottled = color.RGBA{R: 0xe6, G: 0x7e, B: 0x22, A: 0xff} // orange
)

// timeAxis chooses the unit of an elapsed-time axis for a span of
// seconds: seconds, minutes or hours.
func timeAxis(span float64) (unit string, div float64) {
	switch {
	case span > 3*3600:
		return "hours", 3600
	case span > 3*60:
		return "minutes", 60
	}
	return "seconds", 1
}

// newPlot returns a plot whose text is in the sans-serif face.
func newPlot(title, xLabel, yLabel string) *plot.Plot {
	p := plot.New()
	sans := func(f *font.Font) { f.Variant = "Sans" }
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, xLabel, yLabel
	for _, f := range []*font.Font{&p.Title.TextStyle.Font, &p.X.Label.TextStyle.Font, &p.Y.Label.TextStyle.Font,
		&p.X.Tick.Label.Font, &p.Y.Tick.Label.Font, &p.Legend.TextStyle.Font} {
		sans(f)
	}
	p.Title.TextStyle.Font.Size = 13
	p.Title.Padding = vg.Points(6)
	p.Y.Padding, p.X.Padding = vg.Points(4), vg.Points(4)
	return p
}

var svgProlog = regexp.MustCompile(`^(?s)<\?xml[^>]*\?>\s*(<!--.*?-->\s*)?`)

// svgOf renders p as an SVG element for inlining in HTML: the XML prolog
// and comment dropped, marked with class and an accessible label.
func svgOf(p *plot.Plot, w, h vg.Length, class, label string) ([]byte, error) {
	c := vgsvg.New(w, h)
	p.Draw(draw.New(c))
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return nil, err
	}
	out := svgProlog.ReplaceAll(buf.Bytes(), nil)
	attrs := fmt.Sprintf(`<svg class="chart %s" role="img" aria-label="%s" `, class, htmlAttr(label))
	return bytes.Replace(out, []byte("<svg "), []byte(attrs), 1), nil
}

// htmlAttr escapes s for a double-quoted attribute.
func htmlAttr(s string) string {
	var b bytes.Buffer
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '"':
			b.WriteString("&#34;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// timelineChart draws each timed chunk as a bar from its start to its
// finish on the row of its worker, coloured by status, with the paused
// spans and throttle holds shaded behind.
func timelineChart(r backfill.RunReport, workers []string) ([]byte, error) {
	t0, span := timedSpan(r)
	unit, div := timeAxis(span)
	p := newPlot("Chunks by worker", fmt.Sprintf("%s since %s", unit, fmtTime(t0)), "")
	row := map[string]int{}
	for i, w := range workers {
		row[w] = i
	}
	tl := &timeline{rows: len(workers), xmax: span / div}
	for _, c := range r.Chunks {
		if c.StartedAt == nil || c.FinishedAt == nil {
			continue
		}
		clr := colOther
		switch backfill.ChunkStatus(c.Status) {
		case backfill.ChunkDone:
			clr = colDone
		case backfill.ChunkOpen:
			clr = colOpen
		case backfill.ChunkFailed:
			clr = colFailed
		}
		tl.bars = append(tl.bars, bar{y: row[c.Worker], x0: c.StartedAt.Sub(t0).Seconds() / div, x1: c.FinishedAt.Sub(t0).Seconds() / div, clr: clr})
	}
	for _, th := range r.Time.Periods {
		tl.bands = append(tl.bands, band{x0: th.StartedAt.Sub(t0).Seconds() / div, x1: th.EndedAt.Sub(t0).Seconds() / div, clr: alpha(colThrottled, 0x40)})
	}
	for _, s := range r.Time.Paused {
		tl.bands = append(tl.bands, band{x0: s.From.Sub(t0).Seconds() / div, x1: s.To.Sub(t0).Seconds() / div, clr: alpha(colPaused, 0x50)})
	}
	p.Add(tl)
	p.NominalY(workers...)
	p.Y.Padding = vg.Points(6)
	h := max(chartHeight, vg.Length(len(workers))*vg.Points(22)+vg.Inch)
	return svgOf(p, chartWidth, h, "timeline", "Timeline of chunks by worker")
}

func alpha(c color.RGBA, a uint8) color.RGBA {
	// Premultiplied, as image/color expects.
	f := float64(a) / 0xff
	return color.RGBA{R: uint8(float64(c.R) * f), G: uint8(float64(c.G) * f), B: uint8(float64(c.B) * f), A: a}
}

// timedSpan returns the start of the chart's time axis (the run's
// creation, or the first chunk start if earlier) and its length in
// seconds (at least 1 ms).
func timedSpan(r backfill.RunReport) (time.Time, float64) {
	t0, t1 := r.Plan.CreatedAt, r.Time.End
	if t1.IsZero() || t1.Before(t0) {
		t1 = t0
	}
	if r.Totals.FirstStart != nil && r.Totals.FirstStart.Before(t0) {
		t0 = *r.Totals.FirstStart
	}
	if r.Totals.LastFinish != nil && r.Totals.LastFinish.After(t1) {
		t1 = *r.Totals.LastFinish
	}
	return t0, max(t1.Sub(t0).Seconds(), 0.001)
}

type bar struct {
	y      int
	x0, x1 float64
	clr    color.Color
}

type band struct {
	x0, x1 float64
	clr    color.Color
}

// timeline is a plot.Plotter of bars on nominal rows, over shaded bands.
type timeline struct {
	rows  int
	xmax  float64
	bars  []bar
	bands []band
}

// Plot implements plot.Plotter.
func (t *timeline) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	rect := func(x0, x1 vg.Length, y0, y1 vg.Length, clr color.Color) {
		if x1-x0 < 0.6 {
			x1 = x0 + 0.6 // a visible sliver for an instant
		}
		c.FillPolygon(clr, c.ClipPolygonXY([]vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}}))
	}
	for _, b := range t.bands {
		rect(trX(b.x0), trX(b.x1), trY(-0.5), trY(float64(t.rows)-0.5), b.clr)
	}
	for _, b := range t.bars {
		rect(trX(b.x0), trX(b.x1), trY(float64(b.y)-0.35), trY(float64(b.y)+0.35), b.clr)
	}
}

// DataRange implements plot.DataRanger.
func (t *timeline) DataRange() (xmin, xmax, ymin, ymax float64) {
	return 0, t.xmax, -0.5, float64(max(t.rows, 1)) - 0.5
}

// rateChart draws rows/s over time.
func rateChart(r backfill.RunReport) ([]byte, error) {
	t0, span := timedSpan(r)
	unit, div := timeAxis(span)
	p := newPlot("Rows read per second", fmt.Sprintf("%s since %s", unit, fmtTime(t0)), "rows/s")
	tp := r.Throughput
	pts := make(plotter.XYs, 0, 2*len(tp.Buckets))
	for _, b := range tp.Buckets {
		// A step per bucket: flat over its width.
		x := b.Start.Sub(t0).Seconds() / div
		pts = append(pts, plotter.XY{X: x, Y: b.RowsPerSecond}, plotter.XY{X: x + tp.BucketSeconds/div, Y: b.RowsPerSecond})
	}
	if len(pts) == 0 {
		pts = append(pts, plotter.XY{X: 0, Y: 0})
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	l.Color, l.Width = colWorking, vg.Points(1.5)
	l.FillColor = alpha(colWorking, 0x30)
	p.Add(l, plotter.NewGrid())
	p.X.Min, p.X.Max, p.Y.Min = 0, span/div, 0
	return svgOf(p, chartWidth, chartHeight, "rate", "Rows read per second over time")
}

// durationChart draws the histogram of chunk durations.
func durationChart(r backfill.RunReport) ([]byte, error) {
	d := r.Durations
	unit, div := durationUnit(d.Max)
	p := newPlot("Chunk durations", "duration ("+unit+")", "chunks")
	h := &plotter.Histogram{FillColor: colWorking, LineStyle: plotter.DefaultLineStyle}
	h.LineStyle.Color = color.White
	h.LineStyle.Width = vg.Points(0.5)
	for _, b := range d.Bins {
		from, to := b.From/div, b.To/div
		if to <= from {
			// One bin of equal durations: give it a width.
			w := math.Max(from*0.05, 0.001)
			from, to = from-w, to+w
		}
		h.Bins = append(h.Bins, plotter.HistogramBin{Min: from, Max: to, Weight: float64(b.Count)})
		h.Width = to - from
	}
	if len(h.Bins) == 0 {
		h.Bins = []plotter.HistogramBin{{Min: 0, Max: 1}}
		h.Width = 1
	}
	p.Add(h)
	p.Y.Min = 0
	p.Y.Tick.Marker = countTicks{}
	return svgOf(p, chartWidth, chartHeight, "durations", "Histogram of chunk durations")
}

// durationUnit is the unit of a duration axis whose greatest value is s
// seconds.
func durationUnit(s float64) (string, float64) {
	switch {
	case s >= 3*3600:
		return "hours", 3600
	case s >= 3*60:
		return "minutes", 60
	case s >= 1 || s == 0:
		return "seconds", 1
	}
	return "milliseconds", 0.001
}

// splitChart draws the run's time as bars: working, paused and each
// throttle signal.
func splitChart(r backfill.RunReport, parts []timePart) ([]byte, error) {
	unit, div := durationUnit(r.Time.TotalSeconds)
	p := newPlot("Where the run's time went", "", unit)
	names := make([]string, len(parts))
	for i, part := range parts {
		names[i] = part.Name
		v := plotter.Values{0}
		v[0] = part.Seconds / div
		b, err := plotter.NewBarChart(v, vg.Points(70))
		if err != nil {
			return nil, err
		}
		b.Color = part.color
		b.LineStyle.Width = 0
		b.XMin = float64(i)
		p.Add(b)
	}
	p.NominalX(names...)
	p.Y.Min = 0
	p.X.Padding = vg.Points(20)
	return svgOf(p, chartWidth, chartHeight, "split", "Split of the run's time into working, throttled and paused")
}

// countTicks marks an axis of counts: whole numbers only, about five.
type countTicks struct{}

// Ticks implements plot.Ticker.
func (countTicks) Ticks(lo, hi float64) []plot.Tick {
	// The smallest of 1, 2, 5, 10, 20, 50, ... giving at most 6 steps.
	step := 1.0
	for e := 1.0; step == 1 && (hi-lo)/e > 6; e *= 10 {
		for _, m := range []float64{1, 2, 5, 10} {
			if (hi-lo)/(m*e) <= 6 {
				step = m * e
				break
			}
		}
	}
	var out []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return out
}
