package main

import (
	"bytes"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
)

// tpRow is one throughput row as the charts draw it: a target in a mode.
type tpRow struct {
	mode, label        string
	callsPerSec        float64
	p50, p99           time.Duration
	proxyUsPerCall     float64 // 0 when there is no proxy (direct)
	serversUsPerCall   float64
	generatorUsPerCall float64
}

// feRow is one first-event row as the charts draw it.
type feRow struct {
	label    string
	p50, p99 time.Duration
}

// chartData is what the charts show, from a run's results or from a
// recorded report (parseReport).
type chartData struct {
	throughput []tpRow
	firstEvent []feRow
}

// chartsOf takes the charts' figures from a run's results; failed rows are left out.
func chartsOf(r *report) chartData {
	var c chartData
	for _, t := range r.throughput {
		if t.err != nil {
			continue
		}
		row := tpRow{mode: t.mode, label: t.sc.label, callsPerSec: t.load.callsPerSec(),
			p50: percentile(t.load.lat, 50), p99: percentile(t.load.lat, 99),
			serversUsPerCall: perCall(t.serversCPU, t.load.calls), generatorUsPerCall: perCall(t.load.genCPU, t.load.calls)}
		if t.sc.kind != "direct" {
			row.proxyUsPerCall = perCall(t.proxyCPU, t.load.calls)
		}
		c.throughput = append(c.throughput, row)
	}
	for _, f := range r.firstEvent {
		if f.err == nil {
			c.firstEvent = append(c.firstEvent, feRow{f.label, percentile(f.reqToEvent, 50), percentile(f.reqToEvent, 99)})
		}
	}
	return c
}

// recordedCharts takes the charts' figures from the report r writes, as
// `bench charts` reads them from a recorded report, so that the charts a
// run writes match its report byte for byte; from r's results when the
// report has no throughput table.
func recordedCharts(r *report) chartData {
	var md bytes.Buffer
	r.write(&md)
	if c, err := parseReport(md.String()); err == nil {
		return c
	}
	return chartsOf(r)
}

// chart is one SVG file the bench writes beside its report.
type chart struct {
	suffix, alt string
	draw        func(chartData) (*plot.Plot, error)
}

// charts are the bench's charts, in the order the report shows them.
var charts = []chart{
	{"calls", "calls/s per target and mode", callsChart},
	{"p99", "p99 latency per target and mode", p99Chart},
	{"cpu", "CPU per call", cpuChart},
	{"firstevent", "first SSE event latency", firstEventChart},
}

// chartPath returns where the chart with suffix goes for the report at out:
// results.md → results-calls.svg in the same directory.
func chartPath(out, suffix string) string {
	return strings.TrimSuffix(out, filepath.Ext(out)) + "-" + suffix + ".svg"
}

// writeCharts writes every chart that has data beside the report at out and
// returns the files written.
func writeCharts(c chartData, out string) ([]string, error) {
	plot.DefaultFont.Variant, plotter.DefaultFont.Variant = "Sans", "Sans"
	var written []string
	for _, ch := range charts {
		p, err := ch.draw(c)
		if err != nil {
			return written, fmt.Errorf("%s chart: %w", ch.suffix, err)
		}
		if p == nil {
			continue
		}
		path := chartPath(out, ch.suffix)
		if err := saveSVG(p, path); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	return written, nil
}

// saveSVG writes p as SVG. The text is laid out with Liberation Sans, whose
// metrics match Arial's, so viewers without it fall back to Arial.
func saveSVG(p *plot.Plot, path string) error {
	wt, err := p.WriterTo(8*vg.Inch, chartHeight(p), "svg")
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if _, err := wt.WriteTo(&buf); err != nil {
		return err
	}
	svg := bytes.ReplaceAll(buf.Bytes(), []byte("font-family:Liberation Sans;"),
		[]byte("font-family:'Liberation Sans',Arial,Helvetica,sans-serif;"))
	return os.WriteFile(path, svg, 0o644)
}

// chartHeight gives each target row of a horizontal bar chart the same room.
func chartHeight(p *plot.Plot) vg.Length {
	return vg.Length(p.Y.Max-p.Y.Min+1)*0.5*vg.Inch + 1.2*vg.Inch
}

// modeSeries is one bar series of a grouped horizontal bar chart.
type modeSeries struct {
	name   string
	values map[string]float64 // by target label
}

// groupedBars draws one bar per target and series, targets top to bottom in
// the order of labels, with each bar's value written at its end.
func groupedBars(title, unit, format string, labels []string, series []modeSeries) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = unit
	p.X.Min = 0
	width := vg.Points(12)
	for i, s := range series {
		vals := make(plotter.Values, len(labels))
		for j, l := range labels {
			vals[len(labels)-1-j] = s.values[l]
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, err
		}
		bars.Horizontal = true
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = 0
		bars.Offset = width * vg.Length(float64(len(series)-1)/2-float64(i))
		p.Add(bars)
		p.Legend.Add(s.name, bars)
		if err := addValueLabels(p, vals, bars.Offset, format); err != nil {
			return nil, err
		}
	}
	reversed := make([]string, len(labels))
	for j, l := range labels {
		reversed[len(labels)-1-j] = l
	}
	p.NominalY(reversed...)
	p.X.Max *= 1.12 // room for the value labels
	legendOnTop(p)
	return p, nil
}

// legendOnTop puts the legend in the top right corner, in a strip kept
// free of bars.
func legendOnTop(p *plot.Plot) {
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Y.Max += 0.9
}

// addValueLabels writes each non-zero value at the end of its bar.
func addValueLabels(p *plot.Plot, vals plotter.Values, offset vg.Length, format string) error {
	var xys plotter.XYs
	var texts []string
	for j, v := range vals {
		if v > 0 {
			xys = append(xys, plotter.XY{X: v, Y: float64(j)})
			texts = append(texts, fmt.Sprintf(format, v))
		}
	}
	if len(xys) == 0 {
		return nil
	}
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].Font.Size = vg.Points(8)
		l.TextStyle[i].YAlign = -0.5
		l.TextStyle[i].Color = color.Gray{Y: 60}
	}
	l.Offset = vg.Point{X: vg.Points(3), Y: offset}
	p.Add(l)
	return nil
}

// throughputSeries turns the throughput rows into one series per mode over
// the targets, in their report order; value picks the figure.
func throughputSeries(rows []tpRow, value func(tpRow) float64) ([]string, []modeSeries) {
	var labels []string
	var series []modeSeries
	for _, r := range rows {
		if v := value(r); v > 0 {
			labels = appendNew(labels, r.label)
			i := seriesIndex(&series, strings.ToUpper(r.mode))
			series[i].values[r.label] = v
		}
	}
	return labels, series
}

func appendNew(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

// seriesIndex returns the index of the series called name, adding it if new.
func seriesIndex(series *[]modeSeries, name string) int {
	for i, s := range *series {
		if s.name == name {
			return i
		}
	}
	*series = append(*series, modeSeries{name: name, values: map[string]float64{}})
	return len(*series) - 1
}

func callsChart(c chartData) (*plot.Plot, error) {
	labels, series := throughputSeries(c.throughput, func(r tpRow) float64 { return r.callsPerSec })
	if len(labels) == 0 {
		return nil, nil
	}
	return groupedBars("Tool calls per second (32 MCP sessions; higher is better)", "calls/s", "%.0f", labels, series)
}

func p99Chart(c chartData) (*plot.Plot, error) {
	labels, series := throughputSeries(c.throughput, func(r tpRow) float64 { return msOf(r.p99) })
	if len(labels) == 0 {
		return nil, nil
	}
	return groupedBars("p99 latency of a tool call (lower is better)", "ms", "%.1f ms", labels, series)
}

func cpuChart(c chartData) (*plot.Plot, error) {
	labels, series := throughputSeries(c.throughput, func(r tpRow) float64 { return r.proxyUsPerCall })
	if len(labels) == 0 {
		return nil, nil
	}
	return groupedBars("Proxy CPU per tool call (lower is better)", "µs of CPU per call", "%.0f µs", labels, series)
}

// firstEventChart shows p50 and p99 of the first SSE event per target as
// points on a log scale: HAProxy without http-no-delay is ~100× the others,
// which bars from zero would flatten.
func firstEventChart(c chartData) (*plot.Plot, error) {
	if len(c.firstEvent) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = "First SSE event of a GET stream: request to event (lower is better)"
	p.X.Label.Text = "ms (log scale)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	n := len(c.firstEvent)
	labels := make([]string, n)
	for j, f := range c.firstEvent {
		labels[n-1-j] = f.label
	}
	for i, pick := range []func(feRow) time.Duration{func(f feRow) time.Duration { return f.p50 }, func(f feRow) time.Duration { return f.p99 }} {
		if err := addPoints(p, c.firstEvent, pick, i); err != nil {
			return nil, err
		}
	}
	p.NominalY(labels...)
	p.X.Min, p.X.Max = p.X.Min/2, p.X.Max*3 // room for the value labels
	legendOnTop(p)
	return p, nil
}

// addPoints adds series i (0: p50, 1: p99) of the first-event rows, one
// point per target with its value written beside it.
func addPoints(p *plot.Plot, rows []feRow, pick func(feRow) time.Duration, i int) error {
	n := len(rows)
	xys := make(plotter.XYs, n)
	texts := make([]string, n)
	for j, f := range rows {
		xys[n-1-j] = plotter.XY{X: msOf(pick(f)), Y: float64(n - 1 - j)}
		texts[n-1-j] = fmt.Sprintf("%.2f ms", msOf(pick(f)))
	}
	s, err := plotter.NewScatter(xys)
	if err != nil {
		return err
	}
	s.GlyphStyle.Color = plotutil.Color(i)
	s.GlyphStyle.Shape = plotutil.Shape(i)
	s.GlyphStyle.Radius = vg.Points(4)
	p.Add(s)
	p.Legend.Add([]string{"p50", "p99"}[i], s)
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return err
	}
	for k := range l.TextStyle {
		l.TextStyle[k].Font.Size = vg.Points(8)
		l.TextStyle[k].Color = color.Gray{Y: 60}
		l.TextStyle[k].YAlign = []text.YAlignment{0.4, -1.4}[i] // p50 below the row's line, p99 above
	}
	l.Offset = vg.Point{X: vg.Points(6)}
	p.Add(l)
	return nil
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// chartsMain renders the charts of a recorded report without running the
// benchmark: `go run ./bench charts [-from bench/results.md]`.
func chartsMain(args []string) error {
	from := "bench/results.md"
	if len(args) == 2 && args[0] == "-from" {
		from = args[1]
	} else if len(args) != 0 {
		return fmt.Errorf("usage: bench charts [-from report.md]")
	}
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	c, err := parseReport(string(data))
	if err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	written, err := writeCharts(c, from)
	for _, w := range written {
		fmt.Println(w)
	}
	return err
}
