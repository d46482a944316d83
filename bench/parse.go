package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// mdTable is a Markdown table of a report: its header cells and rows.
type mdTable struct {
	header []string
	rows   [][]string
}

// col returns the index of the first header cell named name, or -1.
func (t mdTable) col(name string) int {
	for i, h := range t.header {
		if h == name {
			return i
		}
	}
	return -1
}

// cells splits a Markdown table line into trimmed cells.
func cells(line string) []string {
	parts := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// findTable returns the first table whose header line starts with prefix.
func findTable(report, prefix string) (mdTable, bool) {
	lines := strings.Split(report, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, prefix) || i+1 >= len(lines) {
			continue
		}
		t := mdTable{header: cells(l)}
		for _, r := range lines[i+2:] {
			if !strings.HasPrefix(r, "|") {
				break
			}
			t.rows = append(t.rows, cells(r))
		}
		return t, true
	}
	return mdTable{}, false
}

// parseReport reads the charts' figures back from a report written by
// report.write (bench/results.md): the throughput, CPU and first-event tables.
func parseReport(report string) (chartData, error) {
	var c chartData
	tp, ok := findTable(report, "| mode | target | calls/s |")
	if !ok {
		return c, fmt.Errorf("no throughput table")
	}
	cpu, _ := findTable(report, "| mode | target | proxy |")
	for _, r := range tp.rows {
		row, err := parseTpRow(tp, cpu, r)
		if err != nil {
			return c, err
		}
		if row != nil {
			c.throughput = append(c.throughput, *row)
		}
	}
	fe, _ := findTable(report, "| target | request → event p50 |")
	for _, r := range fe.rows {
		if len(r) < 3 || strings.HasPrefix(r[1], "error") {
			continue
		}
		f := feRow{label: r[0]}
		var err1, err2 error
		f.p50, err1 = parseMs(r[fe.col("request → event p50")])
		f.p99, err2 = parseMs(r[fe.col("p99")])
		if err1 != nil || err2 != nil {
			return c, fmt.Errorf("first-event row %q: %v %v", r[0], err1, err2)
		}
		c.firstEvent = append(c.firstEvent, f)
	}
	return c, nil
}

// parseTpRow reads one throughput row and its CPU row; nil for a failed row.
func parseTpRow(tp, cpu mdTable, r []string) (*tpRow, error) {
	if len(r) < len(tp.header) || strings.HasPrefix(r[2], "error") {
		return nil, nil
	}
	row := &tpRow{mode: r[0], label: r[1]}
	var errs [3]error
	row.callsPerSec, errs[0] = strconv.ParseFloat(r[tp.col("calls/s")], 64)
	row.p50, errs[1] = parseMs(r[tp.col("p50")])
	row.p99, errs[2] = parseMs(r[tp.col("p99")])
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("throughput row %s %s: %w", r[0], r[1], err)
		}
	}
	for _, c := range cpu.rows {
		if len(c) == len(cpu.header) && c[0] == r[0] && c[1] == r[1] {
			row.proxyUsPerCall = number(c[cpu.col("proxy µs/call")])
			row.serversUsPerCall = number(c[cpu.col("servers µs/call")])
			row.generatorUsPerCall = number(c[cpu.col("generator µs/call")])
		}
	}
	return row, nil
}

// parseMs reads "21.03 ms".
func parseMs(s string) (time.Duration, error) {
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, " ms"), 64)
	return time.Duration(v * float64(time.Millisecond)), err
}

// number reads a figure, 0 for "–".
func number(s string) float64 {
	v, _ := strconv.ParseFloat(s, 64)
	return v
}
