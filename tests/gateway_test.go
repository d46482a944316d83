package tests

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
)

// The proxy's answers to upstream failures: a request that reverse_proxy
// ends with 502 or 503 before any response gets a JSON-RPC error body
// from the proxy (caddymodule/gateway.go), where stock Caddy answers a
// bare status with an empty body that MCP clients show without a reason.

// gatewayLogger is the logger of the mcp_session handler's lines.
const gatewayLogger = "http.handlers.mcp_session"

// TestUnreachableUpstreamsAnswerJSONRPC: mcp_proxy in front of two ports
// where nothing listens, as for a first-time user whose servers are not
// up. A real initialize POST gets 502 with a JSON-RPC error (code -32003,
// the request's id, a message naming no address) as application/json, and
// Caddy's log holds the dial error, once, at ERROR. The negative control in
// the same run: stock reverse_proxy to the same ports answers the bare
// 502 with an empty body. With the TypeScript SDK present, its client
// shows the proxy's message, and nothing for the control.
func TestUnreachableUpstreamsAnswerJSONRPC(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	dead := []string{strconv.Itoa(mustFreePort()), strconv.Itoa(mustFreePort())}
	sites := newSites(2)
	mcpSite, stock := sites[0], sites[1]
	loadCaddyfile(t, gatewayConfig(logFile, mcpSite, stock, "gateway-dead", "127.0.0.1:"+dead[0]+" 127.0.0.1:"+dead[1]))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	const open = `{"jsonrpc":"2.0","id":"first-41","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`

	got := send(t, hc, http.MethodPost, mcpSite.url(), mcpPOSTHeaders(""), open).as("initialize through mcp_proxy, nothing listening")
	checkGatewayError(t, got, http.StatusBadGateway, caddymodule.CodeUpstreamUnavailable, `"first-41"`, dead...)
	t.Logf("mcp_proxy: %d %s %s", got.status, got.header.Get("Content-Type"), got.body)
	ctrl := send(t, hc, http.MethodPost, stock.url(), mcpPOSTHeaders(""), open).as("initialize through stock reverse_proxy")
	if ctrl.status != http.StatusBadGateway || ctrl.body != "" || ctrl.header.Get("Content-Type") != "" {
		t.Errorf("control: stock reverse_proxy answered %d %v %q; want Caddy's bare 502 with an empty body", ctrl.status, ctrl.header, ctrl.body)
	}

	lines := logLinesWith(t, logFile, gatewayLogger, "no upstream answered")
	if len(lines) != 1 || lines[0]["level"] != "error" || lines[0]["status"] != float64(http.StatusBadGateway) ||
		!strings.Contains(fmt.Sprint(lines[0]["error"]), "connection refused") || lines[0]["method"] != "initialize" {
		t.Fatalf("want one ERROR line of %s with the dial error for the one initialize; got %v", gatewayLogger, lines)
	}
	t.Logf("the log: %v", lines[0]["error"])
	// Caddy's own error log saw only the control's error: the proxy
	// answered its own, so the server no longer logs (nor routes to
	// handle_errors) the mcp_proxy site's.
	var caddyErrs []string
	for _, l := range readLogLines(t, logFile) {
		if strings.HasPrefix(fmt.Sprint(l["logger"]), "http.log.error") {
			req, _ := l["request"].(map[string]any)
			caddyErrs = append(caddyErrs, fmt.Sprint(req["host"]))
		}
	}
	if len(caddyErrs) != 1 || caddyErrs[0] != stock.addr {
		t.Errorf("Caddy's error log has lines for the hosts %v; want one, for the control %s", caddyErrs, stock.addr)
	}

	// The go-sdk client (v1.8.0) reads no body of a 502, 503 or 504: it
	// shows the status alone either way.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cs, err := connect(ctx, mcpSite.url(), hc); err == nil {
		cs.Close()
		t.Error("a go-sdk session opened with nothing listening")
	} else {
		t.Logf("go-sdk client through mcp_proxy: %v", err)
	}
	if env, ok := tsNodeIfPresent(t); ok {
		ours := runTSClients(t, env, mcpSite.url(), 1, 1)
		theirs := runTSClients(t, env, stock.url(), 1, 1)
		t.Logf("TypeScript SDK client through mcp_proxy: %q; through stock reverse_proxy: %q", ours.Errors, theirs.Errors)
		if ours.OK != 0 || len(ours.Errors) == 0 || !strings.Contains(ours.Errors[0], "no upstream answered this request") {
			t.Errorf("the TypeScript SDK client through mcp_proxy shows %q; want the proxy's message", ours.Errors)
		}
		if theirs.OK != 0 || len(theirs.Errors) == 0 || strings.Contains(theirs.Errors[0], "no upstream answered") {
			t.Errorf("control: the TypeScript SDK client through stock reverse_proxy shows %q; want an error without the proxy's message", theirs.Errors)
		}
	}
}

// TestDrainedUpstreamsAnswerJSONRPC: two go-sdk servers behind mcp_proxy,
// both drained through the admin API. A new session's initialize gets 503
// with a JSON-RPC error (code -32003, the request's id) as
// application/json, the log says "no upstreams available", and a session
// opened before the drain still works. The negative control in the same
// run: once one server is undrained, the same initialize opens a session.
func TestDrainedUpstreamsAnswerJSONRPC(t *testing.T) {
	bs := startBackends(t, 2, true)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	sites := newSites(2)
	const table = "gateway-drained"
	loadCaddyfile(t, gatewayConfig(logFile, sites[0], sites[1], table, upstreams(bs)))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := connect(ctx, sites[0].url(), hc)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for _, b := range bs {
		setDraining(t, table, b.Addr(), true)
	}
	const open = `{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`
	got := send(t, hc, http.MethodPost, sites[0].url(), mcpPOSTHeaders(""), open).as("initialize, every upstream draining")
	checkGatewayError(t, got, http.StatusServiceUnavailable, caddymodule.CodeUpstreamUnavailable, `7`, bs[0].Addr(), bs[1].Addr())
	t.Logf("mcp_proxy: %d %s %s", got.status, got.header.Get("Content-Type"), got.body)
	lines := logLinesWith(t, logFile, gatewayLogger, "no upstream answered")
	if len(lines) != 1 || lines[0]["status"] != float64(http.StatusServiceUnavailable) || !strings.Contains(fmt.Sprint(lines[0]["error"]), "no upstreams available") {
		t.Errorf("want one ERROR line of %s saying no upstreams available; got %v", gatewayLogger, lines)
	}
	if _, err := whoami(ctx, cs); err != nil {
		t.Errorf("a session opened before the drain: %v; want it served by its draining upstream", err)
	}

	setDraining(t, table, bs[1].Addr(), false)
	if ex := send(t, hc, http.MethodPost, sites[0].url(), mcpPOSTHeaders(""), open); ex.status != http.StatusOK || ex.header.Get("Mcp-Session-Id") == "" {
		t.Errorf("control: initialize with one upstream undrained: %d %v %q; want a new session", ex.status, ex.header, ex.body)
	}
}
