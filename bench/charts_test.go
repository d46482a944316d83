package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// latencies returns n sorted latencies spread evenly from lo to hi.
func latencies(n int, lo, hi time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = lo + (hi-lo)*time.Duration(i)/time.Duration(n-1)
	}
	return out
}

// sampleReport is a run's results as the bench holds them: two modes, a
// direct and a proxied row each, a failed row, and first-event rows.
func sampleReport() *report {
	direct := scenario{key: "direct3", label: "direct (3 servers)", kind: "direct", group: "3"}
	proxied := scenario{key: "mcp_proxy3", label: "Caddy mcp_proxy (3)", kind: "caddy", group: "3"}
	failed := scenario{key: "haproxy3", label: "HAProxy stick table (3)", kind: "haproxy", group: "3"}
	row := func(mode string, sc scenario, calls int, p99 time.Duration, proxyCPU time.Duration) tpResult {
		return tpResult{mode: mode, sc: sc, proxyCPU: proxyCPU, serversCPU: 3 * time.Second,
			load: loadResult{window: 10 * time.Second, calls: calls, lat: latencies(1001, time.Millisecond, p99*100/99)}}
	}
	return &report{
		o: &options{sessions: 32, duration: 10 * time.Second, warmup: 2 * time.Second, rounds: 1,
			modes: []string{"json", "sse"}, events: 1000, eventConc: 4, eventDelay: time.Millisecond},
		throughput: []tpResult{
			row("json", direct, 60000, 20*time.Millisecond, 0),
			row("json", proxied, 35000, 28*time.Millisecond, 6*time.Second),
			{mode: "json", sc: failed, err: errors.New("haproxy: not found")},
			row("sse", direct, 54000, 22*time.Millisecond, 0),
			row("sse", proxied, 34000, 27*time.Millisecond, 5900*time.Millisecond),
		},
		firstEvent: []feResult{
			{key: "direct", label: "direct (3 doubles)", reqToEvent: latencies(1000, time.Millisecond, 3*time.Millisecond)},
			{key: "mcp_proxy", label: "Caddy mcp_proxy (3)", reqToEvent: latencies(1000, 2*time.Millisecond, 5*time.Millisecond)},
			{key: "haproxy-delay", label: "HAProxy, for reference", reqToEvent: latencies(1000, 200*time.Millisecond, 220*time.Millisecond)},
		},
	}
}

// TestReportRoundTrip shows that parseReport reads back, from the Markdown
// the bench writes, the figures the charts take from the results.
func TestReportRoundTrip(t *testing.T) {
	r := sampleReport()
	var md bytes.Buffer
	r.write(&md)
	parsed, err := parseReport(md.String())
	if err != nil {
		t.Fatal(err)
	}
	want := chartsOf(r)
	if len(parsed.throughput) != 4 || len(want.throughput) != 4 {
		t.Fatalf("throughput rows: parsed %d, from results %d, want 4 (the failed row left out)", len(parsed.throughput), len(want.throughput))
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 0.01*math.Max(math.Abs(b), 1) }
	for i, p := range parsed.throughput {
		w := want.throughput[i]
		if p.mode != w.mode || p.label != w.label || !near(p.callsPerSec, w.callsPerSec) ||
			!near(msOf(p.p99), msOf(w.p99)) || !near(p.proxyUsPerCall, w.proxyUsPerCall) {
			t.Errorf("row %d: parsed %+v, from results %+v", i, p, w)
		}
	}
	if len(parsed.firstEvent) != 3 || !near(msOf(parsed.firstEvent[1].p99), msOf(want.firstEvent[1].p99)) {
		t.Errorf("first event: parsed %+v, from results %+v", parsed.firstEvent, want.firstEvent)
	}
}

// svgTexts parses an SVG file as XML and returns its text elements.
func svgTexts(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	dec := xml.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return texts
		}
		if err != nil {
			t.Fatalf("%s is not well-formed SVG: %v", path, err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "text" {
			var s string
			if err := dec.DecodeElement(&s, &se); err != nil {
				t.Fatal(err)
			}
			texts = append(texts, s)
		}
	}
}

// TestWriteCharts writes the charts of a run's results beside its report
// and checks each shows its targets and figures, and that the report links them.
func TestWriteCharts(t *testing.T) {
	r := sampleReport()
	out := filepath.Join(t.TempDir(), "results.md")
	written, err := writeCharts(chartsOf(r), out)
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != len(charts) {
		t.Fatalf("wrote %v, want one file per chart", written)
	}
	want := map[string][]string{
		"calls":      {"direct (3 servers)", "Caddy mcp_proxy (3)", "JSON", "SSE", "6000", "3500"},
		"p99":        {"direct (3 servers)", "20.0 ms", "27.0 ms"},
		"cpu":        {"Caddy mcp_proxy (3)", "171 µs"}, // 6 s / 35000 calls
		"firstevent": {"Caddy mcp_proxy (3)", "HAProxy, for reference", "p50", "p99"},
	}
	for suffix, texts := range want {
		got := strings.Join(svgTexts(t, chartPath(out, suffix)), "\n")
		for _, s := range texts {
			if !strings.Contains(got, s) {
				t.Errorf("%s chart lacks %q; its texts:\n%s", suffix, s, got)
			}
		}
		if strings.Contains(got, "HAProxy stick table (3)") {
			t.Errorf("%s chart shows the failed row", suffix)
		}
	}
	if cpu := strings.Join(svgTexts(t, chartPath(out, "cpu")), "\n"); strings.Contains(cpu, "direct") {
		t.Errorf("the CPU chart shows direct rows, which have no proxy")
	}
	r.charts = written
	var md bytes.Buffer
	r.write(&md)
	if !strings.Contains(md.String(), "](results-calls.svg)") || !strings.Contains(md.String(), "](results-firstevent.svg)") {
		t.Errorf("the report does not link its charts:\n%s", md.String())
	}
}

// TestRecordedCharts checks that the charts committed beside
// bench/results.md are the ones its figures give: after editing either, run
// `go run ./bench charts`.
func TestRecordedCharts(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile("results.md")
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseReport(string(data))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.throughput) == 0 || len(c.firstEvent) == 0 {
		t.Fatalf("results.md gave %d throughput and %d first-event rows", len(c.throughput), len(c.firstEvent))
	}
	written, err := writeCharts(c, filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range written {
		got, _ := os.ReadFile(w)
		committed, err := os.ReadFile(filepath.Base(w))
		if err != nil || !bytes.Equal(got, committed) {
			t.Errorf("bench/%s does not match bench/results.md (%v): run `go run ./bench charts`", filepath.Base(w), err)
		}
	}
}

// TestRunChartsMatchRedrawn: the charts a run writes beside its report are
// the ones `bench charts` redraws from that report, byte for byte, so that
// TestRecordedCharts holds right after a run. Charts drawn from the run's
// unrounded figures (chartsOf), the negative control, differ.
func TestRunChartsMatchRedrawn(t *testing.T) {
	r := sampleReport()
	dir := t.TempDir()
	out := filepath.Join(dir, "results.md")
	written, err := writeCharts(recordedCharts(r), out)
	if err != nil {
		t.Fatal(err)
	}
	r.charts = written
	var md bytes.Buffer
	r.write(&md)
	parsed, err := parseReport(md.String())
	if err != nil {
		t.Fatal(err)
	}
	redrawn := filepath.Join(t.TempDir(), "results.md")
	if _, err := writeCharts(parsed, redrawn); err != nil {
		t.Fatal(err)
	}
	unrounded := filepath.Join(t.TempDir(), "results.md")
	if _, err := writeCharts(chartsOf(r), unrounded); err != nil {
		t.Fatal(err)
	}
	differs := false
	for _, c := range charts {
		run, _ := os.ReadFile(chartPath(out, c.suffix))
		again, _ := os.ReadFile(chartPath(redrawn, c.suffix))
		raw, _ := os.ReadFile(chartPath(unrounded, c.suffix))
		if len(run) == 0 || !bytes.Equal(run, again) {
			t.Errorf("%s chart: the run's (%d bytes) differs from the one redrawn from its report (%d bytes)", c.suffix, len(run), len(again))
		}
		differs = differs || !bytes.Equal(raw, again)
	}
	if !differs {
		t.Errorf("charts from the unrounded figures match the redrawn ones too: the sample report shows nothing")
	}
}
