package caddymodule

import (
	"strconv"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/prometheus/client_golang/prometheus"
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

// Metric descriptors of the per-method metrics and open streams.
var (
	descByMethod = prometheus.NewDesc("caddy_mcp_requests_by_method_total",
		"Requests seen by the mcp_session handler, by JSON-RPC method and response status.", []string{"table", "method", "code"}, nil)
	descStreams = prometheus.NewDesc("caddy_mcp_streams_open",
		"Long-lived streams open through the proxy: legacy GET streams of sessions (get) and 2026-07-28 subscriptions/listen streams (listen).",
		[]string{"table", "kind"}, nil)
)

// collectMethods sends the table's per-method counters and open streams.
func collectMethods(ch chan<- prometheus.Metric, t *session.Table) {
	s := t.Stats.Methods()
	s.Each(func(method string, status int, n uint64) {
		ch <- prometheus.MustNewConstMetric(descByMethod, prometheus.CounterValue, float64(n), t.Name(), method, strconv.Itoa(status))
	})
	var gets int64
	for _, u := range t.Upstreams() {
		gets += u.OpenStreams()
	}
	ch <- prometheus.MustNewConstMetric(descStreams, prometheus.GaugeValue, float64(gets), t.Name(), "get")
	ch <- prometheus.MustNewConstMetric(descStreams, prometheus.GaugeValue, float64(s.Listens()), t.Name(), "listen")
}
