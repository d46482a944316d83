package tests

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"
)

// Server timeouts (docs/behaviour.md, "Streaming"): Caddy's `servers {
// timeouts { write ... } }` bounds the writing of each response, counted
// from the request; the plugin's streams and the answers of calls still in
// progress outlive it, every other response keeps it.

// toolAdded counts add_tool calls, so that each adds a tool of its own.
var toolAdded atomic.Int64

// TestStreamsOutliveWriteTimeout (docs/behaviour.md, "Server timeouts"):
// Caddy with `servers { timeouts { write 2s } }` in front of real go-sdk
// servers (one answering POSTs with SSE, one with JSON, one of protocol
// 2026-07-28), over HTTP/1.1, h2c and HTTP/3, and with `write_idle 1s
// 2000` (a minimum rate of 2000 bytes a second) over HTTP/1.1. Through
// mcp_proxy, go-sdk clients get every progress notification and the result
// of a 5 s SSE tool call, the result of a 3 s JSON tool call, and a
// notification on a GET stream and on a subscriptions/listen stream open
// for more than 3 s. Negative control in the same run: stock reverse_proxy
// cuts every one of them. A response that is not a stream keeps the limit:
// a JSON answer whose body is written over 3 s is cut through the plugin
// too, while one whose headers come after 3 s (a call still in progress)
// is answered whole.
func TestStreamsOutliveWriteTimeout(t *testing.T) {
	sse, json := startBackends(t, 1, false), startBackends(t, 1, true)
	modern := startEraBackends(t, "m", "modern", 1)
	d := startDoubles(t, 1)
	d[0].handle(slowJSON)
	bodies := []string{"mcp_proxy " + upstreams(sse), "mcp_proxy " + upstreams(json), "mcp_proxy " + upstreams(modern),
		stockRoundRobin(sse), stockRoundRobin(json), stockRoundRobin(modern), "mcp_proxy " + upstreams(d)}
	plainSites := func(t *testing.T, limits string) streamSites {
		ps := startProxiesWith(t, "timeouts {\n\t\t\t"+limits+"\n\t\t}", bodies...)
		return streamSites{plugin: [3]string{ps[0].url(), ps[1].url(), ps[2].url()},
			stock: [3]string{ps[3].url(), ps[4].url(), ps[5].url()}, double: ps[6].url()}
	}
	for _, tc := range []struct {
		name, limits string
		h2c          bool
	}{
		{name: "write/HTTP1.1", limits: "write 2s"},
		{name: "write/h2c", limits: "write 2s", h2c: true},
		{name: "write_idle-min_rate/HTTP1.1", limits: "write_idle 1s 2000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sites := plainSites(t, tc.limits)
			hc := newHTTPClient()
			if tc.h2c {
				hc = newH2CClient()
			}
			defer hc.CloseIdleConnections()
			checkStreams(t, hc, sites, tc.limits)
		})
	}
	t.Run("write/HTTP3", func(t *testing.T) {
		port := mustFreePort()
		var routes strings.Builder
		var sites streamSites
		for i, body := range bodies {
			fmt.Fprintf(&routes, "handle /r%d/* {\n\t\t%s\n\t}\n\t", i, body)
			url := fmt.Sprintf("https://127.0.0.1:%d/r%d/mcp", port, i)
			switch {
			case i < 3:
				sites.plugin[i] = url
			case i < 6:
				sites.stock[i-3] = url
			default:
				sites.double = url
			}
		}
		loadCaddyfile(t, tlsSiteConfigWith(t, port, "timeouts {\n\t\t\twrite 2s\n\t\t}", routes.String()))
		tlsConf := &tls.Config{ServerName: "localhost", InsecureSkipVerify: true} //nolint:gosec // Caddy's internal CA, loopback test
		h3 := &http3.Transport{TLSClientConfig: tlsConf}
		defer h3.Close()
		hc := &http.Client{Transport: hostRewriter{host: fmt.Sprintf("localhost:%d", port), next: h3}}
		waitForHTTP3(t, &http.Client{Transport: h3, Timeout: 10 * time.Second}, sites.plugin[0])
		checkStreams(t, hc, sites, "write 2s")
	})
}
