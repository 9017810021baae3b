package report

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"regexp"
	"strconv"

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

// chunksChart draws the run's buckets of chunks in plan order, each a
// stack of its chunks by status: done, open, failed, the others.
func chunksChart(r backfill.RunReport) ([]byte, error) {
	p := newPlot("Chunks in plan order", fmt.Sprintf("chunk (seq; %s a bar)", plural(r.Buckets.ChunksPerBucket, "chunk")), "chunks")
	st := &stacks{}
	for _, b := range r.Buckets.Buckets {
		x0, x1 := float64(b.FirstSeq), float64(b.LastSeq+1)
		y := 0.0
		for _, part := range []struct {
			n   int
			clr color.Color
		}{
			{b.ChunksByStatus[string(backfill.ChunkDone)], colDone},
			{b.ChunksByStatus[string(backfill.ChunkOpen)], colOpen},
			{b.ChunksByStatus[string(backfill.ChunkFailed)], colFailed},
			{b.Chunks - b.ChunksByStatus[string(backfill.ChunkDone)] - b.ChunksByStatus[string(backfill.ChunkOpen)] - b.ChunksByStatus[string(backfill.ChunkFailed)], colOther},
		} {
			if part.n > 0 {
				st.bars = append(st.bars, stackBar{x0: x0, x1: x1, y0: y, y1: y + float64(part.n), clr: part.clr})
				y += float64(part.n)
			}
		}
		st.xmax, st.ymax = max(st.xmax, x1), max(st.ymax, y)
	}
	p.Add(st)
	p.Y.Min = 0
	p.Y.Tick.Marker = countTicks{}
	return svgOf(p, chartWidth, chartHeight, "chunks", "Chunks in plan order by status")
}

// plural is "1 chunk" or "n chunks".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmtInt(n) + " " + what + "s"
}

type stackBar struct {
	x0, x1, y0, y1 float64
	clr            color.Color
}

// stacks is a plot.Plotter of rectangles.
type stacks struct {
	bars       []stackBar
	xmax, ymax float64
}

// Plot implements plot.Plotter.
func (s *stacks) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	for _, b := range s.bars {
		x0, x1 := trX(b.x0), trX(b.x1)
		if x1-x0 < 0.6 {
			x1 = x0 + 0.6 // a visible sliver
		}
		y0, y1 := trY(b.y0), trY(b.y1)
		c.FillPolygon(b.clr, c.ClipPolygonXY([]vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}}))
	}
}

// DataRange implements plot.DataRanger.
func (s *stacks) DataRange() (xmin, xmax, ymin, ymax float64) {
	return 0, max(s.xmax, 1), 0, max(s.ymax, 1)
}

func alpha(c color.RGBA, a uint8) color.RGBA {
	// Premultiplied, as image/color expects.
	f := float64(a) / 0xff
	return color.RGBA{R: uint8(float64(c.R) * f), G: uint8(float64(c.G) * f), B: uint8(float64(c.B) * f), A: a}
}

// rateChart draws, in plan order, the rows read per second of chunk
// time of each bucket of chunks, and the rows rejected per chunk.
func rateChart(r backfill.RunReport) ([]byte, error) {
	p := newPlot("Rows read per second of chunk time", fmt.Sprintf("chunk (seq; %s a step)", plural(r.Buckets.ChunksPerBucket, "chunk")), "rows/s")
	pts := make(plotter.XYs, 0, 2*len(r.Buckets.Buckets))
	xmax := 1.0
	for _, b := range r.Buckets.Buckets {
		// A step per bucket: flat over its chunks.
		x0, x1 := float64(b.FirstSeq), float64(b.LastSeq+1)
		pts = append(pts, plotter.XY{X: x0, Y: b.RowsPerSecond}, plotter.XY{X: x1, Y: b.RowsPerSecond})
		xmax = max(xmax, x1)
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
	p.X.Min, p.X.Max, p.Y.Min = 0, xmax, 0
	return svgOf(p, chartWidth, chartHeight, "rate", "Rows read per second of chunk time, in plan order")
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
