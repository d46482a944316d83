package tests

import (
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
)

// TestPlaceholdersInRoutes uses the {mcp.*} placeholders the way docs/operating.md
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
	// A legacy POST without a session has its body read (to tell an
	// initialize, for initialize_timeout), so its method is known too.
	if ex := send(t, hc, http.MethodPost, p.url(), nil, `{"jsonrpc":"2.0","id":1,"method":"ping"}`); ex.body != "pong from the proxy" {
		t.Errorf("expression matcher on {mcp.method}: legacy ping without a session answered %d %q", ex.status, ex.body)
	}

	send(t, hc, http.MethodPost, p.url(), modern("tools/call", "render_chart"), `{}`)
	id := initialize(t, hc, p.url())
	send(t, hc, http.MethodPost, p.url(), sid(id), `{}`)
	reqs := d.requests()
	want := []map[string]string{
		{"X-Mcp-Method": "tools/call", "X-Mcp-Name": "render_chart", "X-Mcp-Era": "modern_sessionless", "X-Mcp-Decision": "balanced"},
		{"X-Mcp-Method": "initialize", "X-Mcp-Era": "other_sessionless", "X-Mcp-Decision": "balanced"}, // learned only once its response passes
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

// TestSealedRequestsInAccessLog: with seal_session_ids, the access log's
// {mcp.*} placeholders say what the proxy decided about requests carrying
// sealed IDs, as for plain ones: learned, pinned to the go-sdk server the
// sealed value opens to, and unknown for another principal (bind_principal)
// and for a value that does not open. The fingerprint is the sealed
// value's, the one the admin API gives; neither the sealed value nor the
// server's own session ID appears in the log.
func TestSealedRequestsInAccessLog(t *testing.T) {
	key := newSealKey(t)
	bs := startBackends(t, 1, true)
	logFile := filepath.Join(t.TempDir(), "access.log")
	p := startProxy(t, accessLog(logFile)+fmt.Sprintf(`	mcp_proxy %s {
		table sealed-log
		seal_session_ids %s
		bind_principal {http.request.header.Authorization}
	}`, bs[0].Addr(), key))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	as := func(who, session string) http.Header {
		h := mcpPOSTHeaders(session)
		h.Set("Authorization", "Bearer "+who)
		return h
	}
	const ping = `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	init := send(t, hc, http.MethodPost, p.url(), as("alice", ""), initBody)
	sealed := init.header.Get("Mcp-Session-Id")
	_, upstreamID, ok := sealerOf(t, key).Open(sealed)
	if init.status != http.StatusOK || !ok {
		t.Fatalf("initialize: %d, Mcp-Session-Id %q (opens: %v)", init.status, sealed, ok)
	}
	forged := sealed[:len(sealed)-2] + "AA"
	for _, r := range []struct {
		who, id string
		status  int
	}{{"alice", sealed, 200}, {"mallory", sealed, 404}, {"alice", forged, 404}} {
		if ex := send(t, hc, http.MethodPost, p.url(), as(r.who, r.id), ping); ex.status != r.status {
			t.Errorf("ping as %s: %d %q, want %d", r.who, ex.status, ex.body, r.status)
		}
	}
	want := []map[string]string{
		{"mcp_decision": "learned", "mcp_session": "", "mcp_pinned_upstream": bs[0].Addr()},
		{"mcp_decision": "pinned", "mcp_session": sessionFingerprint(sealed), "mcp_pinned_upstream": bs[0].Addr()},
		{"mcp_decision": "unknown", "mcp_session": sessionFingerprint(sealed), "mcp_pinned_upstream": ""},
		{"mcp_decision": "unknown", "mcp_session": sessionFingerprint(forged), "mcp_pinned_upstream": ""},
	}
	var lines []map[string]any
	waitFor(5*time.Second, func() bool { lines = readLogLines(t, logFile); return len(lines) >= len(want) })
	if len(lines) != len(want) {
		t.Fatalf("%d access log lines, want %d: %v", len(lines), len(want), lines)
	}
	for i, w := range want {
		f := logFields(lines[i])
		for k, v := range w {
			if f[k] != v {
				t.Errorf("line %d: %s = %q, want %q (line: %v)", i+1, k, f[k], v, f)
			}
		}
	}
	raw, _ := os.ReadFile(logFile)
	if strings.Contains(string(raw), upstreamID) || strings.Contains(string(raw), sealed) {
		t.Errorf("the access log carries the server's session ID or the sealed value")
	}
	var sess struct{ Fingerprint string }
	if st := adminCall(t, http.MethodPost, "/mcp_sessions/lookup", map[string]string{"table": "sealed-log", "session_id": sealed}, &sess); st != http.StatusOK || sess.Fingerprint != sessionFingerprint(sealed) {
		t.Errorf("admin lookup: %d, fingerprint %q; want the access log's %q", st, sess.Fingerprint, sessionFingerprint(sealed))
	}
}

// TestDefaultTemplatesExpand: every placeholder template the plugin
// evaluates unless configured otherwise (caddymodule.DefaultTemplates:
// client_key, bind_principal, mcp_proxy's Host for upstreams) expands to a
// value in a real request through Caddy: an initialize that basic_auth
// authenticates, proxied to a go-sdk server. A deferred `header` per
// template writes its value into the response, as Caddy evaluates it for
// that request. The old default client_key, {http.request.client_ip}, is
// no placeholder: the plugin's evaluation made it empty, and `header`,
// which leaves unknown placeholders as they are, writes it back unexpanded.
func TestDefaultTemplatesExpand(t *testing.T) {
	bs := startBackends(t, 1, true)
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	defaults := caddymodule.DefaultTemplates()
	options := slices.Sorted(maps.Keys(defaults))
	var headers strings.Builder
	for i, option := range options {
		fmt.Fprintf(&headers, "header >X-Default-%d %q\n\t", i, defaults[option])
	}
	p := startProxy(t, fmt.Sprintf("basic_auth {\n\t\talice %s\n\t}\n\t%smcp_proxy %s {\n\t\ttable default-templates\n\t}",
		hash, headers.String(), upstreams(bs)))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	hdr := mcpPOSTHeaders("")
	req, _ := http.NewRequest(http.MethodPost, "/", nil)
	req.SetBasicAuth("alice", "secret")
	hdr["Authorization"] = req.Header["Authorization"]
	ex := send(t, hc, http.MethodPost, p.url(), hdr, initBody)
	if ex.status != http.StatusOK || ex.header.Get("Mcp-Session-Id") == "" {
		t.Fatalf("authenticated initialize: %d %s", ex.status, ex.body)
	}
	for i, option := range options {
		v := ex.header.Get(fmt.Sprintf("X-Default-%d", i))
		t.Logf("default %s %s = %q", option, defaults[option], v)
		if v == "" || strings.ContainsAny(v, "{}") { // `header` leaves a placeholder it does not know as it is
			t.Errorf("default %s %s expands to %q in a request through Caddy; want a value", option, defaults[option], v)
		}
	}
}
