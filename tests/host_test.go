package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// The Host header (docs/caddyfile.md, `header_up Host` and `localhost_protection`) and
// CORS preflights (docs/behaviour.md, "What happens when": no Mcp-Session-Id).

// publicHost is the Host a client of a public proxy sends.
const publicHost = "mcp.example.com"

// TestUpstreamSeesItsOwnHost: by default mcp_proxy sends an upstream on
// loopback its own host:port as Host, whatever Host the client sent, and
// carries the client's Host and scheme in X-Forwarded-Host and
// X-Forwarded-Proto, once each (reverse_proxy sets them; mcp_proxy adds
// none); with `header_up Host {host}` (the control) the client's Host
// reaches the upstream. The proxy listens on loopback, so public hostnames
// need localhost_protection off. (Upstreams not on loopback get the
// client's Host: TestHostForUpstream in caddymodule, since every test
// server here listens on loopback.)
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
			if got := r.header.Values("X-Forwarded-Proto"); len(got) != 1 || got[0] != "http" {
				t.Errorf("request %d: X-Forwarded-Proto = %q; want [http]", i+1, got)
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

// bearerToken is the token the OAuth-protected whoami servers accept.
const bearerToken = "t0ken-for-tests"

// TestResourceMetadataNamesPublicHost: a go-sdk server that builds its
// OAuth protected-resource metadata URL from the request's Host (go-sdk's
// auth.RequireBearerToken and auth.ProtectedResourceMetadataHandler, the
// URL built per request) advertises the public name through mcp_proxy in
// docs/behaviour.md's setup for such servers on loopback: `header_up Host
// {hostport}` and the server accepting that Host (go-sdk:
// DisableLocalhostProtection). The client follows the 401's
// resource_metadata URL, through the proxy, to a document whose `resource`
// is the public URL, then works with its token. Negative controls: with
// the default Host (the upstream's own host:port, what mcp_proxy sends to
// every loopback upstream and used to send to every upstream) the URLs
// name 127.0.0.1:<upstream port>; with the client's Host but the server's
// DNS-rebinding protection on, the server refuses it with 403.
func TestResourceMetadataNamesPublicHost(t *testing.T) {
	open := startBackendsWith(t, 2, false, func(string) []string { return []string{"-bearer-token", bearerToken, "-any-host"} })
	guarded := startBackendsWith(t, 1, false, func(string) []string { return []string{"-bearer-token", bearerToken} })
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	public := &http.Client{Transport: hostRewriter{host: publicHost, next: hc.Transport}}
	const passHost = "\n\t\theader_up Host {hostport}"

	// discover sends initialize without a token, then follows the 401's
	// resource_metadata URL through the proxy; it returns both URLs.
	discover := func(t *testing.T, p proxy) (metadataURL, resource string) {
		t.Helper()
		ex := sendWithHost(t, hc, http.MethodPost, p.url(), publicHost, mcpPOSTHeaders(""), initBody)
		metadataURL = resourceMetadataURL(ex)
		if ex.status != http.StatusUnauthorized || metadataURL == "" {
			t.Fatalf("initialize without a token: %d, WWW-Authenticate %q; want 401 naming resource_metadata", ex.status, ex.header.Get("Www-Authenticate"))
		}
		path := metadataURL[strings.Index(metadataURL[len("http://"):], "/")+len("http://"):]
		meta := sendWithHost(t, hc, http.MethodGet, "http://"+p.addr+path, publicHost, nil, "")
		var doc struct{ Resource string }
		if meta.status != http.StatusOK || json.Unmarshal([]byte(meta.body), &doc) != nil {
			t.Fatalf("GET %s through the proxy: %d %q", path, meta.status, meta.body)
		}
		return metadataURL, doc.Resource
	}

	t.Run("header_up Host {hostport}", func(t *testing.T) {
		p := startProxy(t, "mcp_proxy "+upstreams(open)+" {"+passHost+behindTunnel+"\n\t}")
		metadataURL, resource := discover(t, p)
		if want := "http://" + publicHost + "/.well-known/oauth-protected-resource/mcp"; metadataURL != want {
			t.Errorf("resource_metadata = %q, want %q", metadataURL, want)
		}
		if want := "http://" + publicHost + "/mcp"; resource != want {
			t.Errorf("resource = %q, want %q", resource, want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		withToken := &http.Client{Transport: withBearer{next: public.Transport}}
		for i := range 4 {
			if rep := runSession(ctx, p.url(), withToken, sessionPlan{calls: 3}); !rep.ok() || rep.onCreator != 3 {
				t.Fatalf("session %d with the token: %d of 3 calls on its server, %v", i+1, rep.onCreator, rep.err)
			}
		}
	})

	t.Run("default Host", func(t *testing.T) {
		p := startProxy(t, "mcp_proxy "+upstreams(open)+" {"+behindTunnel+"\n\t}")
		metadataURL, resource := discover(t, p)
		if !strings.HasPrefix(metadataURL, "http://127.0.0.1:") || !strings.HasPrefix(resource, "http://127.0.0.1:") {
			t.Errorf("with the upstream's own Host, resource_metadata = %q and resource = %q; want both on 127.0.0.1 (the control shows nothing)", metadataURL, resource)
		}
	})

	t.Run("server refuses the public Host", func(t *testing.T) {
		p := startProxy(t, "mcp_proxy "+upstreams(guarded)+" {"+passHost+behindTunnel+"\n\t}")
		hdr := mcpPOSTHeaders("")
		hdr["Authorization"] = []string{"Bearer " + bearerToken}
		if ex := sendWithHost(t, hc, http.MethodPost, p.url(), publicHost, hdr, initBody); ex.status != http.StatusForbidden || !strings.Contains(ex.body, "invalid Host") {
			t.Errorf("initialize with the token and Host %s to a server with DNS-rebinding protection: %d %q; want its 403", publicHost, ex.status, ex.body)
		}
	})
}

// TestTSServerNamesPublicHost measures the Host choices with a TypeScript
// SDK server on loopback (createMcpExpressApp, whose DNS-rebinding check
// allows localhost, 127.0.0.1 and [::1] unless given allowedHosts) whose
// 401 names resource_metadata from Express's req.protocol and req.host,
// which honour X-Forwarded-Proto and X-Forwarded-Host from a trusted proxy
// (`trust proxy`). Through the default mcp_proxy the URL names the public
// host by X-Forwarded-Host; without that header (the control) it names the
// upstream. With `header_up Host {hostport}` the server must allow the
// public name (allowedHosts), else it refuses it with 403.
func TestTSServerNamesPublicHost(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod", "express")
	plain := startTSServers(t, env, 1, "f", "--express")
	allowing := startTSServers(t, env, 1, "a", "--express", "--allowed-hosts", publicHost+",localhost,127.0.0.1")
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	public := "http://" + publicHost + "/.well-known/oauth-protected-resource"
	for _, tc := range []struct {
		name, block, want string
		server            *testproc.Proc
		status            int
	}{
		{"default Host, X-Forwarded-Host", "", public, plain[0], http.StatusUnauthorized},
		{"default Host, no X-Forwarded-Host", "\n\t\theader_up -X-Forwarded-Host", "http://" + plain[0].Addr() + "/.well-known/oauth-protected-resource", plain[0], http.StatusUnauthorized},
		{"header_up Host {hostport}, allowedHosts", "\n\t\theader_up Host {hostport}", public, allowing[0], http.StatusUnauthorized},
		{"header_up Host {hostport}, default allowedHosts", "\n\t\theader_up Host {hostport}", "", plain[0], http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startProxy(t, "mcp_proxy "+tc.server.Addr()+" {"+tc.block+behindTunnel+"\n\t}")
			hdr := mcpPOSTHeaders("")
			hdr["X-Test-Auth"] = []string{"deny"}
			ex := sendWithHost(t, hc, http.MethodPost, p.url(), publicHost, hdr, initBody)
			if got := resourceMetadataURL(ex); ex.status != tc.status || got != tc.want {
				t.Errorf("initialize: %d, resource_metadata %q (body %q); want %d, %q", ex.status, got, firstLine(ex.body), tc.status, tc.want)
			}
		})
	}
}
