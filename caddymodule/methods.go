package caddymodule

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
)

// Label values beyond the spec's methods (internal/mcpwire lists the
// spec's).
const (
	// MethodOther labels a method the spec does not define.
	MethodOther = mcpwire.MethodOther
	// MethodUnknown labels a request whose method the plugin did not read:
	// a request older than 2026-07-28 (no trusted Mcp-Method header) whose
	// body no `mcp` matcher read, a GET stream, a DELETE.
	MethodUnknown = mcpwire.MethodUnknown
)

const (
	methodLabels = mcpwire.Labels
	// firstCode and lastCode bound the HTTP statuses counted.
	firstCode, lastCode = 100, 599
)

// methodCounts counts requests by method label and response status.
type methodCounts [methodLabels][lastCode - firstCode + 1]atomic.Uint64

// methodStats are a table's per-method counters and its open
// subscriptions/listen streams. The counts are allocated on first use
// (about 100 KiB), so a table that serves no traffic costs nothing.
type methodStats struct {
	counts  atomic.Pointer[methodCounts]
	listens atomic.Int64
}

// count counts one request of method answered with status.
func (s *methodStats) count(method string, status int) {
	if status < firstCode || status > lastCode {
		return
	}
	c := s.counts.Load()
	if c == nil {
		s.counts.CompareAndSwap(nil, new(methodCounts))
		c = s.counts.Load()
	}
	c[mcpwire.MethodIndex(method)][status-firstCode].Add(1)
}

// each calls fn for every method label and status counted at least once.
func (s *methodStats) each(fn func(method string, status int, n uint64)) {
	c := s.counts.Load()
	if c == nil {
		return
	}
	for i := range c {
		for j := range c[i] {
			if n := c[i][j].Load(); n > 0 {
				fn(mcpwire.MethodLabel(i), j+firstCode, n)
			}
		}
	}
}

// Metric descriptors of the per-method metrics and open streams.
var (
	descByMethod = prometheus.NewDesc("caddy_mcp_requests_by_method_total",
		"Requests seen by the mcp_session handler, by JSON-RPC method and response status.", []string{"table", "method", "code"}, nil)
	descStreams = prometheus.NewDesc("caddy_mcp_streams_open",
		"Long-lived streams open through the proxy: legacy GET streams of sessions (get) and 2026-07-28 subscriptions/listen streams (listen).",
		[]string{"table", "kind"}, nil)
)

// collectMethods sends the table's per-method counters and open streams.
func collectMethods(ch chan<- prometheus.Metric, t *Table) {
	s := &t.Stats.methods
	s.each(func(method string, status int, n uint64) {
		ch <- prometheus.MustNewConstMetric(descByMethod, prometheus.CounterValue, float64(n), t.name, method, strconv.Itoa(status))
	})
	var gets int64
	for _, u := range t.Upstreams() {
		gets += u.streams.Load()
	}
	ch <- prometheus.MustNewConstMetric(descStreams, prometheus.GaugeValue, float64(gets), t.name, "get")
	ch <- prometheus.MustNewConstMetric(descStreams, prometheus.GaugeValue, float64(s.listens.Load()), t.name, "listen")
}
