package tests

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// TestGet404KeepsSession: TypeScript SDK servers without a GET route (the
// SDK's createMcpExpressApp with only POST and DELETE /mcp, so Express
// answers GET /mcp with its own 404 "Cannot GET /mcp" where the spec asks
// for 405) behind mcp_proxy. docs/behaviour.md, "What happens when": a 404 to a GET
// passes through and keeps the session, a 404 to a POST or DELETE ends it.
//
//   - HTTP requests: the GET of a session gets the upstream's 404 unchanged
//     and the next POST of the session is answered by its server, as direct.
//   - go-sdk and TypeScript SDK clients, which open the standalone GET stream
//     after initialize and carry on when it gets 404: every session and call
//     succeeds through the proxy, as direct.
//   - A session its server really forgot: the GET still passes its 404, the
//     POST gets the server's 404 and ends the session, and the next POST gets
//     the proxy's 404 without reaching the server.
func TestGet404KeepsSession(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod", "express")
	ss := startTSServers(t, env, 2, "g", "--express")
	p := startProxy(t, "mcp_proxy "+upstreams(ss))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	t.Run("HTTP requests", func(t *testing.T) {
		direct := get404Exchanges(t, hc, ss[0].URL())
		proxied := get404Exchanges(t, hc, p.url())
		for i, g := range proxied {
			w := direct[i]
			t.Logf("through the proxy: %-18s %d %q", g.step, g.status, firstLine(g.body))
			if g.status != w.status || g.body != w.body && g.step == "GET" {
				t.Errorf("%s: %d %q through the proxy, %d %q direct", g.step, g.status, g.body, w.status, w.body)
			}
		}
		get := proxied[1]
		if get.status != http.StatusNotFound || !strings.Contains(get.body, "Cannot GET /mcp") || get.header.Get("X-Powered-By") != "Express" {
			t.Fatalf("GET: %d %v %q; want Express's own 404 unchanged", get.status, get.header, get.body)
		}
		owner := proxied[0].header.Get("X-Custom")
		id, err := tsWhoamiResult(proxied[2].body)
		if err != nil || id.Server != owner || id.Session != proxied[0].header.Get("Mcp-Session-Id") {
			t.Fatalf("POST after the GET's 404: %+v (%v); want the session's server %s", id, err, owner)
		}
	})

	t.Run("go-sdk clients", func(t *testing.T) {
		const sessions, calls = 10, 5
		direct := runSessions(t, ss[0].URL(), sessions, sessionPlan{calls: calls})
		proxied := runSessions(t, p.url(), sessions, sessionPlan{calls: calls})
		t.Logf("direct: %s; through mcp_proxy: %s", direct, proxied)
		if direct.ok != sessions || proxied.ok != sessions || proxied.onCreator != sessions*calls {
			t.Fatalf("want %d/%d sessions and %d calls both ways; direct %s; through mcp_proxy %s",
				sessions, sessions, sessions*calls, direct, proxied)
		}
	})

	t.Run("TypeScript SDK clients", func(t *testing.T) {
		const sessions, calls = 5, 5
		direct := runTSClients(t, env, ss[0].URL(), sessions, calls)
		proxied := runTSClients(t, env, p.url(), sessions, calls)
		t.Logf("direct: %+v; through mcp_proxy: %+v", direct, proxied)
		for _, s := range []tsClientSummary{direct, proxied} {
			if s.OK != sessions || s.Calls != sessions*calls || s.Deleted != sessions {
				t.Fatalf("want %d/%d sessions, %d calls and %d DELETEs both ways; direct %+v; through mcp_proxy %+v",
					sessions, sessions, sessions*calls, sessions, direct, proxied)
			}
		}
	})

	t.Run("session really gone", func(t *testing.T) {
		init := send(t, hc, http.MethodPost, p.url(), tsMCPHeaders("", tsOrigin), initBody).as("initialize")
		session := init.header.Get("Mcp-Session-Id")
		i := slices.IndexFunc(ss, func(s *testproc.Proc) bool { return s.Name() == init.header.Get("X-Custom") })
		if init.status != http.StatusOK || session == "" || i < 0 {
			t.Fatalf("initialize: %d %v %q", init.status, init.header, init.body)
		}
		owner, hdr := ss[i], tsMCPHeaders(session, tsOrigin)
		// The server forgets the session: a DELETE sent to it directly.
		if ex := send(t, hc, http.MethodDelete, owner.URL(), hdr, "").as("DELETE, direct"); ex.status != http.StatusOK {
			t.Fatalf("DELETE sent directly: %d %q", ex.status, ex.body)
		}
		if ex := send(t, hc, http.MethodGet, p.url(), getHeaders(hdr), "").as("GET"); ex.status != http.StatusNotFound || !strings.Contains(ex.body, "Cannot GET") {
			t.Fatalf("GET: %d %q; want Express's 404", ex.status, ex.body)
		}
		post := send(t, hc, http.MethodPost, p.url(), hdr, tsWhoamiCall).as("POST")
		if e, err := parseRPCError(post.body); post.status != http.StatusNotFound || err != nil || e.Error.Code != -32001 || post.header.Get("X-Custom") != owner.Name() {
			t.Fatalf("POST of the forgotten session: %d %v %q; want %s's own 404", post.status, post.header, post.body, owner.Name())
		}
		seen := tsStatsOf(t, owner).BySession[session]
		checkProxy404(t, send(t, hc, http.MethodPost, p.url(), hdr, tsWhoamiCall).as("POST after the server's 404"))
		if n := tsStatsOf(t, owner).BySession[session]; n != seen {
			t.Fatalf("the ended session still reached its server (%d requests, was %d)", n, seen)
		}
	})
}
