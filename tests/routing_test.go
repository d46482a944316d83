package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// accessLogFields are the access log fields the routing site appends.
var accessLogFields = []string{"mcp_method", "mcp_name", "mcp_era", "mcp_protocol_version", "mcp_session", "mcp_pinned_upstream", "mcp_decision", "upstream"}

// TestRoutesOneToolToItsOwnPool is docs/behaviour.md's "Routing by tool": the
// go-sdk client's 2026-07-28 calls of one tool go to a second pool of
// sessionless servers, while legacy clients' sessions stay pinned to the
// dual-era servers that created them, calls of that tool included. The
// access log shows every {mcp.*} placeholder, and never a session ID.
func TestRoutesOneToolToItsOwnPool(t *testing.T) {
	pool1 := startEraBackends(t, "p1-", "dual", 2)
	pool2 := startEraBackends(t, "p2-", "modern", 2)
	logFile := filepath.Join(t.TempDir(), "access.log")
	p := startProxy(t, routingSite(logFile, "routing-pools", "", pool1, pool2))

	const clients, calls = 6, 4
	modern := runEraClients(t, p.url(), "", clients, calls)
	legacy := runEraClients(t, p.url(), "2025-11-25", clients, calls)
	for _, r := range modern {
		if r.err != nil || r.session != "" {
			t.Fatalf("modern client: session %q, error %v", r.session, r.err)
		}
		for _, s := range r.servers {
			if !strings.HasPrefix(s, "p2-") {
				t.Errorf("a 2026-07-28 whoami call was answered by %s, want the whoami pool (p2-*)", s)
			}
		}
	}
	for _, r := range legacy {
		if r.err != nil || r.session == "" {
			t.Fatalf("legacy client: session %q, error %v", r.session, r.err)
		}
		if !strings.HasPrefix(r.servers[0], "p1-") || slices.ContainsFunc(r.servers, func(s string) bool { return s != r.servers[0] }) {
			t.Errorf("legacy session's whoami calls answered by %v, want all by the p1-* server that created it", r.servers)
		}
	}
	checkRoutingLog(t, logFile, pool1, pool2, modern, legacy, calls)

	// Per-method metrics: the modern calls by method; the legacy initialize
	// too, whose body the matcher read; the legacy sessions' requests as
	// unknown, since the matcher leaves them alone.
	families, _ := scrape(t)
	for _, w := range []struct {
		method, code string
		n            float64
	}{
		{"tools/call", "200", clients * calls * 2},
		{"server/discover", "200", clients},
		{"initialize", "200", clients},
	} {
		got := metricValue(families, "caddy_mcp_requests_by_method_total", map[string]string{"table": "routing-pools", "method": w.method, "code": w.code})
		if got != w.n {
			t.Errorf("caddy_mcp_requests_by_method_total{method=%q,code=%q} = %v, want %v", w.method, w.code, got, w.n)
		}
	}
	if got := metricValue(families, "caddy_mcp_requests_by_method_total", map[string]string{"table": "routing-pools", "method": "unknown", "code": "200"}); got < clients*calls*2 {
		t.Errorf("legacy sessions' requests counted as method unknown: %v, want at least %d", got, clients*calls*2)
	}
}

// TestRoutingThatSplitsSessions shows what docs/behaviour.md warns about: a
// matcher that also selects requests of legacy sessions (era
// legacy_session) sends a session's calls of the routed tool to a pool that
// does not hold the session. The proxy then answers 404 and drops the
// session, and the client must start over. The same calls with the
// docs/behaviour.md's matcher (legacy sessions excluded, the default) keep working.
func TestRoutingThatSplitsSessions(t *testing.T) {
	pool1 := startEraBackends(t, "p1-", "dual", 2)
	pool2 := startEraBackends(t, "p2-", "modern", 1)
	logFile := filepath.Join(t.TempDir(), "access.log")
	port := mustFreePort()
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	for _, tc := range []struct {
		eras  string
		split bool
	}{
		{eras: "", split: false},
		{eras: "era legacy_session modern_sessionless other_sessionless", split: true},
	} {
		loadCaddyfile(t, siteConfig(port, routingSite(logFile, "routing-split", tc.eras, pool1, pool2)))
		rep := runEraClients(t, url, "2025-11-25", 1, 2)[0]
		if !tc.split {
			if rep.err != nil {
				t.Errorf("matcher %q: legacy session broke: %v", tc.eras, rep.err)
			}
			continue
		}
		if rep.err == nil || !strings.Contains(rep.err.Error(), "whoami call 1") {
			t.Errorf("matcher %q: the session's first whoami call succeeded (%v, err %v); want it sent to the other pool and refused", tc.eras, rep.servers, rep.err)
		}
		var gone []map[string]any
		waitLogLines(t, logFile, func(lines []map[string]any) bool {
			gone = nil
			for _, l := range lines {
				if l["mcp_decision"] == "gone" {
					gone = append(gone, l)
				}
			}
			return len(gone) > 0
		})
		if len(gone) != 1 || gone[0]["status"] != 404.0 || logFields(gone[0])["mcp_method"] != "tools/call" {
			t.Errorf("matcher %q: %d requests logged as gone (%v), want the whoami call answered 404 by the proxy", tc.eras, len(gone), gone)
		}
	}
}

// TestMismatchAnsweredByProxy sends a 2026-07-28 request whose Mcp-Name
// disagrees with its body, and one with a body over the matcher's bound,
// through the routing site: the proxy answers them itself, 400 with
// JSON-RPC error -32020 and 413, and no upstream sees them.
func TestMismatchAnsweredByProxy(t *testing.T) {
	pool1 := startEraBackends(t, "p1-", "dual", 1)
	pool2 := startEraBackends(t, "p2-", "modern", 1)
	logFile := filepath.Join(t.TempDir(), "access.log")
	p := startProxy(t, routingSite(logFile, "routing-mismatch", "", pool1, pool2))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	hdr := map[string][]string{
		"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"echo"},
		"Accept": {"application/json, text/event-stream"},
	}
	call := func(tool, args string) string {
		return `{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args +
			`,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	}
	for _, tc := range []struct {
		name, body string
		status     int
		code       int
		message    string
	}{
		{name: "header says echo, body calls whoami", body: call("whoami", `{}`), status: 400, code: -32020, message: `Mcp-Name header value "echo" does not match body value "whoami"`},
		{name: "body over 4 MiB", body: call("echo", `{"message":"`+strings.Repeat("x", 5<<20)+`"}`), status: 413, code: -32600, message: "larger than 4194304 bytes"},
		{name: "consistent", body: call("echo", `{"message":"hi"}`), status: 200},
	} {
		ex := send(t, hc, http.MethodPost, p.url(), hdr, tc.body)
		if ex.status != tc.status {
			t.Errorf("%s: status %d, want %d: %.200s", tc.name, ex.status, tc.status, ex.body)
			continue
		}
		if tc.status == 200 {
			continue
		}
		var body struct {
			ID    json.RawMessage `json:"id"`
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(ex.body), &body); err != nil || body.Error.Code != tc.code || !strings.Contains(body.Error.Message, tc.message) {
			t.Errorf("%s: body %s, want error %d containing %q", tc.name, ex.body, tc.code, tc.message)
		}
		if tc.status == 400 && string(body.ID) != "41" {
			t.Errorf("%s: error id %s, want the request's 41", tc.name, body.ID)
		}
	}
	for _, l := range readLogLines(t, logFile) {
		f := logFields(l)
		rejected := f["mcp_decision"] == "rejected"
		if rejected != (l["status"] != 200.0) || rejected && f["upstream"] != "" {
			t.Errorf("logged %v %v %q: want the refused requests rejected by the proxy, with no upstream", l["status"], f["mcp_decision"], f["upstream"])
		}
	}
}
