package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The Host header (README, `header_up Host` and `localhost_protection`) and
// CORS preflights (README, "What happens when": no Mcp-Session-Id).

// publicHost is the Host a client of a public proxy sends.
const publicHost = "mcp.example.com"

// sendWithHost is send with the request's Host set to host.
func sendWithHost(t testing.TB, hc *http.Client, method, url, host string, hdr map[string][]string, body string) exchange {
	t.Helper()
	return send(t, &http.Client{Transport: hostRewriter{host: host, next: hc.Transport}}, method, url, hdr, body)
}

// hostRewriter is a RoundTripper that sends every request with Host set to
// host, as a client reaching the proxy through a public name does.
type hostRewriter struct {
	host string
	next http.RoundTripper
}

func (h hostRewriter) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = h.host
	next := h.next
	if next == nil {
		next = http.DefaultTransport
	}
	return next.RoundTrip(r)
}

// behindTunnel is the mcp_proxy option for a Caddy on loopback that a
// trusted proxy or tunnel on the same machine reaches with public hostnames.
const behindTunnel = "\n\t\tlocalhost_protection off"

// TestUpstreamSeesItsOwnHost: by default mcp_proxy sends each upstream its
// own host:port as Host, whatever Host the client sent, and carries the
// client's Host in X-Forwarded-Host; with `header_up Host {host}` (the
// control) the client's Host reaches the upstream. The proxy listens on
// loopback, so public hostnames need localhost_protection off.
func TestUpstreamSeesItsOwnHost(t *testing.T) {
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	t.Run("default", func(t *testing.T) {
		d := startDoubles(t, 1)[0]
		p := startProxy(t, "mcp_proxy "+d.addr+" {"+behindTunnel+"\n\t}")
		for _, clientHost := range []string{publicHost, p.addr} {
			ex := sendWithHost(t, hc, http.MethodPost, p.url(), clientHost, nil, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
			id := ex.header.Get("Mcp-Session-Id")
			if ex.status != http.StatusOK || id == "" {
				t.Fatalf("initialize with Host %s: %d %q", clientHost, ex.status, ex.body)
			}
			if ex := sendWithHost(t, hc, http.MethodPost, p.url(), clientHost, sid(id), `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); ex.status != http.StatusOK {
				t.Fatalf("pinned request with Host %s: %d %q", clientHost, ex.status, ex.body)
			}
		}
		reqs := mcpOnly(d.requests())
		if len(reqs) != 4 {
			t.Fatalf("the upstream got %d requests; want 4", len(reqs))
		}
		for i, r := range reqs {
			clientHost := []string{publicHost, p.addr}[i/2]
			if r.host != d.addr {
				t.Errorf("request %d (client Host %s): the upstream got Host %q; want its own %q", i+1, clientHost, r.host, d.addr)
			}
			if got := r.header.Values("X-Forwarded-Host"); len(got) != 1 || got[0] != clientHost {
				t.Errorf("request %d: X-Forwarded-Host = %q; want [%q]", i+1, got, clientHost)
			}
		}
	})

	t.Run("header_up Host {host}", func(t *testing.T) {
		d := startDoubles(t, 1)[0]
		p := startProxy(t, fmt.Sprintf("mcp_proxy %s {\n\t\theader_up Host {host}"+behindTunnel+"\n\t}", d.addr))
		if ex := sendWithHost(t, hc, http.MethodPost, p.url(), publicHost, nil, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`); ex.status != http.StatusOK {
			t.Fatalf("initialize: %d %q", ex.status, ex.body)
		}
		if reqs := mcpOnly(d.requests()); len(reqs) != 1 || reqs[0].host != publicHost {
			t.Fatalf("with header_up Host {host} the upstream should see the client's Host %q; got %d requests, first %+v", publicHost, len(reqs), reqs)
		}
	})
}

// TestDNSRebindingProtection: mcp_proxy sends upstreams their own host:port
// as Host, which would launder a DNS rebinding attack past their own check,
// so on a loopback listener the proxy itself answers 403 to a Host that is
// not loopback, without contacting an upstream, as a go-sdk server would.
func TestDNSRebindingProtection(t *testing.T) {
	d := startDoubles(t, 1)[0]
	p := startProxy(t, "mcp_proxy "+d.addr)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	_, port, _ := strings.Cut(p.addr, ":")
	for _, host := range []string{"evil.example.com", publicHost + ":" + port, "10.0.0.1:" + port} {
		ex := sendWithHost(t, hc, http.MethodPost, p.url(), host, map[string][]string{"Origin": {"http://" + host}}, `{"jsonrpc":"2.0","id":1,"method":"initialize"}`)
		if ex.status != http.StatusForbidden || !strings.Contains(ex.body, "localhost_protection off") || rpcErrorCode(ex.body) != -32600 {
			t.Errorf("Host %s: %d %q; want the proxy's 403 naming localhost_protection", host, ex.status, ex.body)
		}
	}
	if n := len(mcpOnly(d.requests())); n != 0 {
		t.Fatalf("the upstream got %d requests with a rebinding Host", n)
	}
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "127.0.0.2", "[::1]:" + port, "localhost"} {
		if ex := sendWithHost(t, hc, http.MethodPost, p.url(), host, nil, `{"jsonrpc":"2.0","id":1,"method":"initialize"}`); ex.status != http.StatusOK {
			t.Errorf("loopback Host %s: %d %q; want 200", host, ex.status, ex.body)
		}
	}
}

// TestGoSDKBehindPublicHost: a go-sdk server bound to loopback refuses a
// foreign Host (DNS-rebinding protection). Through the default mcp_proxy a
// go-sdk client whose requests carry Host: mcp.example.com works end to
// end, each call on its session's server. With `header_up Host {host}` the
// server's 403 to initialize reaches the client unchanged, and the proxy
// learns nothing: a request with a session ID gets the proxy's own 404.
func TestGoSDKBehindPublicHost(t *testing.T) {
	bs := startBackends(t, 2, false)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	public := &http.Client{Transport: hostRewriter{host: publicHost, next: hc.Transport}}

	t.Run("default", func(t *testing.T) {
		p := startProxy(t, "mcp_proxy "+upstreams(bs)+" {"+behindTunnel+"\n\t}")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for i := range 4 {
			if rep := runSession(ctx, p.url(), public, sessionPlan{calls: 3}); !rep.ok() || rep.onCreator != 3 {
				t.Fatalf("session %d with Host %s: %d of 3 calls on its server, %v", i+1, publicHost, rep.onCreator, rep.err)
			}
		}
	})

	t.Run("header_up Host {host}", func(t *testing.T) {
		p := startProxy(t, fmt.Sprintf("mcp_proxy %s {\n\t\theader_up Host {host}"+behindTunnel+"\n\t}", upstreams(bs)))
		direct := sendWithHost(t, hc, http.MethodPost, bs[0].URL(), publicHost, mcpPOSTHeaders(""), initBody)
		if direct.status != http.StatusForbidden {
			t.Fatalf("the server itself answered %d %q to Host %s; want 403", direct.status, direct.body, publicHost)
		}
		for i := range len(bs) { // round robin: once per server
			ex := sendWithHost(t, hc, http.MethodPost, p.url(), publicHost, mcpPOSTHeaders(""), initBody)
			if ex.status != direct.status || ex.body != direct.body || ex.header.Get("Content-Type") != direct.header.Get("Content-Type") {
				t.Errorf("initialize %d through the proxy: %d %q (%s); want the server's %d %q (%s) unchanged",
					i+1, ex.status, ex.body, ex.header.Get("Content-Type"), direct.status, direct.body, direct.header.Get("Content-Type"))
			}
			if v := ex.header.Values("Mcp-Session-Id"); len(v) != 0 {
				t.Errorf("initialize %d: the 403 carries Mcp-Session-Id %q", i+1, v)
			}
		}
		// Nothing was learned: a session ID gets the proxy's own JSON-RPC 404
		// (go-sdk would answer a plain-text "session not found").
		ex := sendWithHost(t, hc, http.MethodPost, p.url(), publicHost, mcpPOSTHeaders("ANYSESSION0123456789"), `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		if ex.status != http.StatusNotFound || rpcErrorCode(ex.body) != -32001 || ex.header.Get("Content-Type") != "application/json" {
			t.Errorf("request with a session after the failed initialize: %d %q (%s); want the proxy's JSON-RPC 404 (-32001)",
				ex.status, ex.body, ex.header.Get("Content-Type"))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if cs, err := connect(ctx, p.url(), public); err == nil {
			cs.Close()
			t.Errorf("a go-sdk client connected with Host %s through header_up Host {host}; want the server's 403", publicHost)
		} else if !strings.Contains(err.Error(), "403") && !strings.Contains(err.Error(), "Forbidden") {
			t.Errorf("go-sdk connect error %q does not mention the 403", err)
		}
	})
}

// corsHandler makes d answer like an MCP server with CORS for browser
// clients: preflights get 204 allowing what they ask; initialize gets an SSE
// response with a new session; every response to a request with an Origin
// allows that origin and exposes Mcp-Session-Id.
func corsHandler(d *double) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		if origin := r.Header.Get("Origin"); origin != "" {
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Expose-Headers", "Mcp-Session-Id")
			h.Set("Vary", "Origin")
		}
		switch {
		case r.Method == http.MethodOptions:
			h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE")
			h.Set("Access-Control-Allow-Headers", r.Header.Get("Access-Control-Request-Headers"))
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
		case r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "":
			h.Set("Mcp-Session-Id", d.mint())
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache, no-transform")
			w.WriteHeader(http.StatusOK)
			fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"server\":%q}}\n\n", d.name)
		default:
			d.serveMCP(w, r)
		}
	}
}

// TestCORSThroughProxy: a CORS preflight carries no session; the proxy
// balances it to an upstream instead of rejecting it, and the upstream's
// CORS answer comes back. The SSE response to a browser's initialize keeps
// Access-Control-Expose-Headers: Mcp-Session-Id, and the next request of
// the session reaches its owner.
func TestCORSThroughProxy(t *testing.T) {
	const origin = "https://app.example"
	const reqHeaders = "content-type, mcp-session-id, mcp-protocol-version, last-event-id"
	ds := startDoubles(t, 2)
	for _, d := range ds {
		d.handle(corsHandler(d))
	}
	p := startProxy(t, "mcp_proxy "+upstreams(ds))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	for _, method := range []string{http.MethodPost, http.MethodDelete, http.MethodGet} {
		ex := send(t, hc, http.MethodOptions, p.url(), map[string][]string{
			"Origin":                         {origin},
			"Access-Control-Request-Method":  {method},
			"Access-Control-Request-Headers": {reqHeaders},
		}, "")
		if ex.status != http.StatusNoContent {
			t.Errorf("preflight for %s: %d %q; want the upstream's 204", method, ex.status, ex.body)
		}
		want := map[string]string{
			"Access-Control-Allow-Origin":   origin,
			"Access-Control-Allow-Methods":  "GET, POST, DELETE",
			"Access-Control-Allow-Headers":  reqHeaders,
			"Access-Control-Expose-Headers": "Mcp-Session-Id",
		}
		for h, v := range want {
			if got := ex.header.Values(h); len(got) != 1 || got[0] != v {
				t.Errorf("preflight for %s: %s = %q; want [%q]", method, h, got, v)
			}
		}
	}
	options := 0
	for _, d := range ds {
		for _, r := range mcpOnly(d.requests()) {
			if r.method == http.MethodOptions {
				options++
			}
		}
	}
	if options != 3 {
		t.Errorf("the upstreams got %d preflights; want 3", options)
	}

	hdr := mcpPOSTHeaders("")
	hdr["Origin"] = []string{origin}
	ex := send(t, hc, http.MethodPost, p.url(), hdr, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
	id := ex.header.Get("Mcp-Session-Id")
	if ex.status != http.StatusOK || id == "" || !strings.HasPrefix(ex.header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("initialize: %d %v %q; want 200 SSE with a session", ex.status, ex.header, ex.body)
	}
	if got := ex.header.Values("Access-Control-Expose-Headers"); len(got) != 1 || got[0] != "Mcp-Session-Id" {
		t.Errorf("initialize: Access-Control-Expose-Headers = %q; want [Mcp-Session-Id]", got)
	}
	if got := ex.header.Get("Access-Control-Allow-Origin"); got != origin {
		t.Errorf("initialize: Access-Control-Allow-Origin = %q; want %q", got, origin)
	}
	owner := ownerOf(t, ds, id)
	if !strings.Contains(ex.body, owner.name) {
		t.Errorf("initialize body %q does not come from %s", ex.body, owner.name)
	}

	hdr = mcpPOSTHeaders(id)
	hdr["Origin"] = []string{origin}
	for _, body := range []string{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`} {
		ex := send(t, hc, http.MethodPost, p.url(), hdr, body)
		if ex.status != http.StatusOK || !strings.Contains(ex.body, owner.name) {
			t.Errorf("pinned request %s: %d %q; want 200 from %s", body, ex.status, ex.body, owner.name)
		}
		if got := ex.header.Get("Access-Control-Expose-Headers"); got != "Mcp-Session-Id" {
			t.Errorf("pinned request: Access-Control-Expose-Headers = %q", got)
		}
	}
	if n := owner.sawSession(id); n != 2 {
		t.Errorf("the owner saw the session %d times; want 2", n)
	}
	for _, d := range ds {
		if d != owner && d.sawSession(id) != 0 {
			t.Errorf("%s, not the owner, saw the session", d.name)
		}
	}
}
