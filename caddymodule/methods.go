package caddymodule

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// specMethods are the JSON-RPC methods an MCP client sends a server, in
// protocol versions 2025-03-26 to 2026-07-28 (MCP schema, ClientRequest and
// ClientNotification of each version). They, `other` and `unknown` are the
// values of the `method` label, which keeps its cardinality bounded.
var specMethods = [...]string{
	"initialize", "ping", "server/discover",
	"tools/list", "tools/call",
	"resources/list", "resources/templates/list", "resources/read", "resources/subscribe", "resources/unsubscribe",
	"prompts/list", "prompts/get",
	"completion/complete", "logging/setLevel", "subscriptions/listen",
	"tasks/get", "tasks/result", "tasks/list", "tasks/cancel",
	"notifications/initialized", "notifications/cancelled", "notifications/progress", "notifications/roots/list_changed",
}

// Label values beyond the spec's methods.
const (
	// MethodOther labels a method the spec does not define.
	MethodOther = "other"
	// MethodUnknown labels a request whose method the plugin did not read:
	// a request older than 2026-07-28 (no trusted Mcp-Method header) whose
	// body no `mcp` matcher read, a GET stream, a DELETE.
	MethodUnknown = "unknown"
)

// methodIndexes maps a method to its index in specMethods.
var methodIndexes = func() map[string]int {
	m := make(map[string]int, len(specMethods))
	for i, name := range specMethods {
		m[name] = i
	}
	return m
}()

const (
	methodOther   = len(specMethods)
	methodUnknown = methodOther + 1
	methodLabels  = methodUnknown + 1
	// firstCode and lastCode bound the HTTP statuses counted.
	firstCode, lastCode = 100, 599
)

// methodIndex returns the label index of a method.
func methodIndex(method string) int {
	if method == "" {
		return methodUnknown
	}
	if i, ok := methodIndexes[method]; ok {
		return i
	}
	return methodOther
}

// methodLabel returns the label value of index i.
func methodLabel(i int) string {
	switch i {
	case methodOther:
		return MethodOther
	case methodUnknown:
		return MethodUnknown
	}
	return specMethods[i]
}

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
	c[methodIndex(method)][status-firstCode].Add(1)
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
				fn(methodLabel(i), j+firstCode, n)
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
