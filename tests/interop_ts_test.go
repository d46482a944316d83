package tests

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// tsStartTimeout bounds a Node server's start.
const tsStartTimeout = 20 * time.Second

// TestInteropTSSDK: TypeScript SDK servers (3 processes, SSE and JSON
// response modes) behind mcp_proxy, driven by 50 concurrent TypeScript SDK
// client sessions (initialize, standalone GET stream, 5 whoami calls,
// DELETE) and by 50 concurrent go-sdk client sessions: every session
// succeeds and every call is answered by the server that created its
// session, which sees the client's own session ID. TypeScript clients
// through stock round_robin over the same servers must break sessions
// (negative control).
func TestInteropTSSDK(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	const sessions, calls = 50, 5
	for _, mode := range []struct {
		name  string
		flags []string
	}{{"SSE responses", nil}, {"JSON responses", []string{"--json"}}} {
		t.Run(strings.Fields(mode.name)[0], func(t *testing.T) {
			ss := startTSServers(t, env, 3, "t", mode.flags...)
			p := startProxy(t, "mcp_proxy "+upstreams(ss))
			server := fmt.Sprintf("TypeScript SDK %s, stateful, %s (3 processes)", tsSDKVersion, mode.name)

			ts := runTSClients(t, env, p.url(), sessions, calls)
			t.Logf("mcp_proxy, TypeScript clients: %+v", ts)
			if ts.OK != sessions || ts.Calls != sessions*calls || ts.Deleted != sessions {
				t.Fatalf("TypeScript clients: want %d/%d sessions ok, %d pinned calls, %d DELETEs; got %+v",
					sessions, sessions, sessions*calls, sessions, ts)
			}
			for _, s := range ss {
				if ts.PerServer[s.Name()] == 0 {
					t.Errorf("server %s got no TypeScript client sessions: %v", s.Name(), ts.PerServer)
				}
			}
			recordInterop(interopRow{
				Server: server,
				Client: "TypeScript SDK " + tsSDKVersion,
				Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the session's server; %d/%d DELETEs ok",
					ts.OK, sessions, ts.Calls, sessions*calls, ts.Deleted, sessions),
			})

			gores := runSessions(t, p.url(), sessions, sessionPlan{calls: calls})
			t.Logf("mcp_proxy, go-sdk clients: %s", gores)
			if gores.ok != sessions || gores.onCreator != sessions*calls {
				t.Fatalf("go-sdk clients: want %d/%d sessions and %d pinned calls; got %s", sessions, sessions, sessions*calls, gores)
			}
			recordInterop(interopRow{
				Server: server,
				Client: "go-sdk " + goSDKVersion,
				Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the session's server",
					gores.ok, sessions, gores.onCreator, sessions*calls),
			})

			stock := startProxy(t, stockRoundRobin(ss))
			ctrl := runTSClients(t, env, stock.url(), 30, calls)
			t.Logf("stock round_robin (negative control), TypeScript clients: %+v", ctrl)
			if ctrl.OK == 30 {
				t.Fatalf("negative control: stock round_robin kept every TypeScript session, so this test cannot see misrouting")
			}
		})
	}
}

// tsHygieneHeaders are the response headers compared between direct and
// proxied exchanges (besides Mcp-Session-Id, X-Custom and Set-Cookie, which
// name the session and the server).
var tsHygieneHeaders = []string{
	"Content-Type", "Mcp-Protocol-Version", "Www-Authenticate",
	"Access-Control-Allow-Origin", "Access-Control-Allow-Methods", "Access-Control-Allow-Headers",
	"Access-Control-Expose-Headers", "Access-Control-Max-Age", "Vary",
}

// TestInteropTSHeaderHygiene: TypeScript SDK servers with
// a typical app around the transport (CORS, cookies, a custom header, 401
// with WWW-Authenticate), in JSON and SSE response modes: per mode one
// server is used directly and two behind mcp_proxy. The same exchanges are
// made directly and through the proxy; every proxied response must have the
// direct one's status and headers: exactly the Mcp-Session-Id values the
// upstream sent (one, the session's own, on each response with a JSON or
// SSE body, which the TS transport stamps: initialize, tool calls, the GET
// stream; none on the 202, DELETE's 200 and the errors the app or transport
// answers), Mcp-Protocol-Version, both Set-Cookie values, WWW-Authenticate
// on the 401, X-Custom naming the session's server, and the CORS headers.
// CORS preflights (no session) are balanced to the upstreams, not
// rejected; 400 and 401 keep the session's mapping; DELETE drops it, so the
// next call gets the proxy's 404 without reaching the server.
func TestInteropTSHeaderHygiene(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	total, preflightsTotal := 0, 0 // subtests run one after the other
	for _, mode := range []struct {
		name  string
		flags []string
	}{{"JSON", []string{"--json"}}, {"SSE", nil}} {
		t.Run(mode.name, func(t *testing.T) {
			ss := startTSServers(t, env, 3, "h", mode.flags...)
			direct, ups := ss[0], ss[1:]
			p := startProxy(t, "mcp_proxy "+upstreams(ups))
			hc := newHTTPClient()
			defer hc.CloseIdleConnections()

			want := tsRunHygiene(t, hc, direct.URL())
			got := tsRunHygiene(t, hc, p.url())
			owner := slices.IndexFunc(ups, func(s *testproc.Proc) bool { return s.Name() == got.owner })
			if owner < 0 {
				t.Fatalf("initialize through the proxy answered by %q, not an upstream", got.owner)
			}
			if len(got.exchanges) != len(want.exchanges) {
				t.Fatalf("got %d exchanges, want %d", len(got.exchanges), len(want.exchanges))
			}
			cookies := func(server string) []string {
				return []string{"srv=" + server + "; Path=/; HttpOnly", "theme=dark; Path=/"}
			}
			last := len(got.exchanges) - 1
			for _, g := range got.exchanges {
				t.Logf("through the proxy: %-30s %d %-18q Mcp-Session-Id×%d X-Custom=%s Set-Cookie×%d WWW-Authenticate=%q Mcp-Protocol-Version=%q",
					g.step, g.status, g.header.Get("Content-Type"), len(g.header.Values("Mcp-Session-Id")), g.header.Get("X-Custom"),
					len(g.header.Values("Set-Cookie")), g.header.Get("WWW-Authenticate"), g.header.Get("Mcp-Protocol-Version"))
			}
			for i, g := range got.exchanges[:last] {
				w := want.exchanges[i]
				server, session := got.owner, got.session
				if strings.HasPrefix(g.step, "preflight") {
					server, session = g.header.Get("X-Custom"), ""
				}
				if g.status != w.status {
					t.Errorf("%s: status %d through the proxy, %d direct (%q)", g.step, g.status, w.status, g.body)
				}
				// Mcp-Session-Id: exactly what the upstream sent, with this session's value.
				ws, gs := w.header.Values("Mcp-Session-Id"), g.header.Values("Mcp-Session-Id")
				if len(gs) != len(ws) || len(gs) > 1 || len(gs) == 1 && (gs[0] != session || ws[0] != want.session) {
					t.Errorf("%s: Mcp-Session-Id %q through the proxy, %q direct; want exactly the upstream's (session %q)", g.step, gs, ws, session)
				}
				if gx := g.header.Values("X-Custom"); len(gx) != 1 || gx[0] != server || server == "" {
					t.Errorf("%s: X-Custom %q; want [%q]", g.step, gx, server)
				}
				if gc, wc := g.header.Values("Set-Cookie"), w.header.Values("Set-Cookie"); !slices.Equal(gc, cookies(server)) || !slices.Equal(wc, cookies(direct.Name())) {
					t.Errorf("%s: Set-Cookie %q through the proxy, %q direct", g.step, gc, wc)
				}
				for _, h := range tsHygieneHeaders {
					if gv, wv := g.header.Values(h), w.header.Values(h); !slices.Equal(gv, wv) {
						t.Errorf("%s: %s %q through the proxy, %q direct", g.step, h, gv, wv)
					}
				}
			}
			// What these exchanges must show, beyond matching direct.
			byStep := map[string]exchange{}
			for _, g := range got.exchanges {
				byStep[g.step] = g
			}
			wantCT := map[string]string{"JSON": "application/json", "SSE": "text/event-stream"}[mode.name]
			for _, step := range []string{"initialize", "whoami call", "whoami call after 400 and 401", "GET stream"} {
				ct := wantCT
				if step == "GET stream" {
					ct = "text/event-stream"
				}
				g := byStep[step]
				if g.status != http.StatusOK || len(g.header.Values("Mcp-Session-Id")) != 1 || !strings.HasPrefix(g.header.Get("Content-Type"), ct) {
					t.Errorf("%s: %d, Mcp-Session-Id %q, Content-Type %q; want 200, the session once, %s",
						step, g.status, g.header.Values("Mcp-Session-Id"), g.header.Get("Content-Type"), ct)
				}
				if step != "initialize" && g.header.Get("Mcp-Protocol-Version") != "2025-11-25" {
					t.Errorf("%s: Mcp-Protocol-Version %q; want 2025-11-25", step, g.header.Get("Mcp-Protocol-Version"))
				}
			}
			for _, step := range []string{"whoami call", "whoami call after 400 and 401"} {
				id, err := tsWhoamiResult(byStep[step].body)
				if err != nil || id.Server != got.owner || id.Session != got.session {
					t.Errorf("%s: answered %+v (%v); want {%s %s}", step, id, err, got.owner, got.session)
				}
			}
			if g := byStep["malformed request (400)"]; g.status != http.StatusBadRequest || !strings.Contains(g.body, "-32700") {
				t.Errorf("malformed request: %d %q; want the transport's 400 parse error", g.status, g.body)
			}
			if g := byStep["unauthorized (401)"]; g.status != http.StatusUnauthorized || !strings.HasPrefix(g.header.Get("WWW-Authenticate"), "Bearer ") {
				t.Errorf("unauthorized: %d %v; want 401 with WWW-Authenticate", g.status, g.header)
			}
			for i := range 4 {
				g := byStep[fmt.Sprintf("preflight %d", i+1)]
				if g.status != http.StatusNoContent || g.header.Get("Access-Control-Allow-Origin") != tsOrigin {
					t.Errorf("%s: %d %v; want the upstream's 204 CORS answer", g.step, g.status, g.header)
				}
			}
			if g := byStep["DELETE"]; g.status != http.StatusOK {
				t.Errorf("DELETE: %d %q; want the TypeScript SDK's 200", g.status, g.body)
			}
			// After DELETE: the proxy forgot the session and answers itself;
			// directly, the server answers its own 404.
			checkProxy404(t, got.exchanges[last])
			if w := want.exchanges[last]; w.status != http.StatusNotFound {
				t.Errorf("call after DELETE, direct: %d %q; want the server's 404", w.status, w.body)
			}
			// Every preflight reached an upstream; the session's requests
			// reached only its owner, and the call after DELETE none.
			preflights, ownerRequests, elsewhere := 0, 0, 0
			for i, s := range ups {
				st := tsStatsOf(t, s)
				preflights += st.Options
				if i == owner {
					ownerRequests = st.BySession[got.session]
				} else {
					elsewhere += st.BySession[got.session]
				}
			}
			// notifications/initialized, 2 calls, 400, 401, GET, DELETE.
			if preflights != 4 || ownerRequests != 7 || elsewhere != 0 {
				t.Errorf("upstreams got %d preflights (want 4); the session's owner got %d of its requests (want 7), other upstreams %d (want 0)",
					preflights, ownerRequests, elsewhere)
			}
			if !t.Failed() {
				total += last // every exchange but the call after DELETE was compared with direct
				preflightsTotal += preflights
			}
		})
	}
	if t.Failed() {
		return
	}
	recordInterop(interopRow{
		Server: fmt.Sprintf("TypeScript SDK %s, stateful, JSON and SSE responses, app with CORS, cookies, 401 (2 processes)", tsSDKVersion),
		Client: "HTTP requests (header hygiene)",
		Result: fmt.Sprintf("%d/%d responses match direct: the upstream's one Mcp-Session-Id; Mcp-Protocol-Version, Set-Cookie, WWW-Authenticate, custom and CORS headers kept on JSON, SSE and error responses; %d/%d CORS preflights balanced to an upstream; after DELETE the proxy's 404",
			total, total, preflightsTotal, preflightsTotal),
	})
}

// TestInteropTSUnknownSession400: TypeScript servers that answer an unknown
// session with 400 (`-32000 Bad Request: No valid session ID provided`, as
// server-everything and the TypeScript SDK's example apps do). docs/behaviour.md: a 400
// does not evict, since it can mean a malformed request. With such servers
// behind mcp_proxy, a session whose owner answers 400 (its "unknown session"
// 400, and a malformed request's 400) keeps its mapping: the 400 reaches the
// client unchanged and the next call still reaches the owner. A session the
// proxy does not know gets the proxy's own JSON-RPC 404 for POST, GET and
// DELETE and never reaches a server (which would have said 400), and after
// the client's DELETE the session's next request gets that 404 too.
func TestInteropTSUnknownSession400(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	ss := startTSServers(t, env, 2, "u", "--json", "--unknown-session", "400")
	p := startProxy(t, "mcp_proxy "+upstreams(ss))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cs, err := connect(ctx, p.url(), hc)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	first, err := whoami(ctx, cs)
	if err != nil || first.Session != cs.ID() || cs.ID() == "" {
		t.Fatalf("whoami: %+v, %v (session %q)", first, err, cs.ID())
	}
	owner := ss[slices.IndexFunc(ss, func(s *testproc.Proc) bool { return s.Name() == first.Server })]

	// The owner's 400s pass through unchanged and the session stays pinned.
	hdr := tsMCPHeaders(cs.ID(), tsOrigin)
	pretend := hdr.Clone()
	pretend.Set("X-Test-Pretend-Unknown", "1")
	passed := 0
	for _, c := range []struct {
		step string
		hdr  http.Header
		body string
		code int
		msg  string
	}{
		{"owner's unknown-session 400", pretend, tsWhoamiCall, -32000, "Bad Request: No valid session ID provided"},
		{"owner's malformed-request 400", hdr, tsBadJSON, -32700, "Parse error"},
	} {
		ex := send(t, hc, http.MethodPost, p.url(), c.hdr, c.body).as(c.step)
		e, err := parseRPCError(ex.body)
		if ex.status != http.StatusBadRequest || err != nil || e.Error.Code != c.code || !strings.HasPrefix(e.Error.Message, c.msg) || ex.header.Get("X-Custom") != owner.Name() {
			t.Fatalf("%s: %d %v %q; want %s's 400 %d %q unchanged", c.step, ex.status, ex.header, ex.body, owner.Name(), c.code, c.msg)
		}
		id, err := whoami(ctx, cs)
		if err != nil || id != first {
			t.Fatalf("after the %s: whoami %+v, %v; want %+v (mapping kept)", c.step, id, err, first)
		}
		passed++
	}

	// A session the proxy never learned: the proxy's 404, on every method,
	// and no server sees it.
	const madeUp = "0b5f2f3e-5a34-4c1e-9a51-6a2d3f4c5b6e"
	before := []tsStats{tsStatsOf(t, ss[0]), tsStatsOf(t, ss[1])}
	unknown := tsMCPHeaders(madeUp, tsOrigin)
	getHdr := unknown.Clone()
	getHdr.Set("Accept", "text/event-stream")
	checkProxy404(t, send(t, hc, http.MethodPost, p.url(), unknown, tsWhoamiCall).as("POST, unknown session"))
	checkProxy404(t, send(t, hc, http.MethodGet, p.url(), getHdr, "").as("GET, unknown session"))
	checkProxy404(t, send(t, hc, http.MethodDelete, p.url(), unknown, "").as("DELETE, unknown session"))
	for i, s := range ss {
		after := tsStatsOf(t, s)
		if after.Requests != before[i].Requests || after.BySession[madeUp] != 0 {
			t.Fatalf("%s received requests of the unknown session: %d requests before, %d after, %d with it",
				s.Name(), before[i].Requests, after.Requests, after.BySession[madeUp])
		}
	}
	// Directly, the same server would have answered 400, which tells a
	// client nothing about the session being gone.
	if ex := send(t, hc, http.MethodPost, owner.URL(), unknown, tsWhoamiCall).as("direct, unknown session"); ex.status != http.StatusBadRequest {
		t.Fatalf("direct, unknown session: %d %q; want the server's 400", ex.status, ex.body)
	}

	// DELETE drops the mapping: the next request gets the proxy's 404.
	session := cs.ID()
	if err := cs.Close(); err != nil {
		t.Fatalf("close (DELETE): %v", err)
	}
	seen := tsStatsOf(t, owner).BySession[session]
	checkProxy404(t, send(t, hc, http.MethodPost, p.url(), tsMCPHeaders(session, tsOrigin), tsWhoamiCall).as("after DELETE"))
	if st := tsStatsOf(t, owner); st.BySession[session] != seen || st.Deleted != 1 {
		t.Fatalf("after DELETE: the owner saw %d requests of the session (was %d) and %d DELETEs (want 1)", st.BySession[session], seen, st.Deleted)
	}

	recordInterop(interopRow{
		Server: fmt.Sprintf("TypeScript SDK %s, stateful, unknown session → 400 like server-everything (2 processes)", tsSDKVersion),
		Client: "go-sdk " + goSDKVersion + " and HTTP requests",
		Result: fmt.Sprintf("%d/2 upstream 400s passed through, session kept (next call on its server); unknown session: the proxy's 404 for POST, GET, DELETE, 0 requests reached the servers", passed),
	})
}
