package tests

import (
	"fmt"
	"net/http"
	"testing"
)

// TestPlaceholdersInRoutes uses the {mcp.*} placeholders the way the README
// shows, in a route behind mcp_session: in `respond`, in an `expression`
// matcher, and in `header_up` to the upstream.
func TestPlaceholdersInRoutes(t *testing.T) {
	d := startDouble(t, "d1")
	p := startProxy(t, fmt.Sprintf(`route {
		mcp_session {
			table placeholders
		}
		respond /explain "method={mcp.method} name={mcp.name} era={mcp.era} version={mcp.protocol_version} decision={mcp.decision}" 200
		@ping expression {mcp.method} == 'ping'
		respond @ping "pong from the proxy" 200
		reverse_proxy %s {
			lb_policy mcp_session {
				table placeholders
			}
			header_up X-Mcp-Method {mcp.method}
			header_up X-Mcp-Name {mcp.name}
			header_up X-Mcp-Era {mcp.era}
			header_up X-Mcp-Session {mcp.session_fingerprint}
			header_up X-Mcp-Decision {mcp.decision}
			header_up X-Mcp-Pinned {mcp.pinned_upstream}
		}
	}`, d.Addr()))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	modern := func(method, name string) map[string][]string {
		h := map[string][]string{"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {method}}
		if name != "" {
			h["Mcp-Name"] = []string{name}
		}
		return h
	}

	explain := send(t, hc, http.MethodPost, "http://"+p.addr+"/explain", modern("tools/call", "render_chart"), `{}`)
	if want := "method=tools/call name=render_chart era=modern_sessionless version=2026-07-28 decision=balanced"; explain.body != want {
		t.Errorf("respond: %q, want %q", explain.body, want)
	}
	if ex := send(t, hc, http.MethodPost, p.url(), modern("ping", ""), `{}`); ex.body != "pong from the proxy" {
		t.Errorf("expression matcher on {mcp.method}: modern ping answered %d %q", ex.status, ex.body)
	}
	if ex := send(t, hc, http.MethodPost, p.url(), nil, `{"jsonrpc":"2.0","id":1,"method":"ping"}`); ex.body == "pong from the proxy" {
		t.Error("a legacy ping, whose method the proxy does not read, matched {mcp.method} == 'ping'")
	}

	send(t, hc, http.MethodPost, p.url(), modern("tools/call", "render_chart"), `{}`)
	id := initialize(t, hc, p.url())
	send(t, hc, http.MethodPost, p.url(), sid(id), `{}`)
	reqs := d.requests()
	want := []map[string]string{
		{"X-Mcp-Method": "", "X-Mcp-Era": "other_sessionless", "X-Mcp-Decision": "balanced"}, // the legacy ping
		{"X-Mcp-Method": "tools/call", "X-Mcp-Name": "render_chart", "X-Mcp-Era": "modern_sessionless", "X-Mcp-Decision": "balanced"},
		{"X-Mcp-Era": "other_sessionless", "X-Mcp-Decision": "balanced"}, // initialize: learned only once its response passes
		{"X-Mcp-Era": "legacy_session", "X-Mcp-Session": sessionFingerprint(id), "X-Mcp-Decision": "pinned", "X-Mcp-Pinned": d.Addr()},
	}
	if len(reqs) != len(want) {
		t.Fatalf("the upstream got %d requests, want %d", len(reqs), len(want))
	}
	for i, w := range want {
		for _, k := range []string{"X-Mcp-Method", "X-Mcp-Name", "X-Mcp-Era", "X-Mcp-Session", "X-Mcp-Decision", "X-Mcp-Pinned"} {
			if got := reqs[i].header.Get(k); got != w[k] {
				t.Errorf("request %d: %s = %q, want %q", i+1, k, got, w[k])
			}
		}
	}
}
