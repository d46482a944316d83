package tests

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// The legacy HTTP+SSE transport (MCP 2024-11-05): a GET opens the
// session's SSE stream, whose first event, `endpoint`, names the URL the
// client POSTs to, with the session in its query string (go-sdk
// `sessionid`, TypeScript SDK and mcp-go `sessionId`, Python SDK
// `session_id`). The server answers the POSTs on the stream, so a POST
// must reach the stream's server.

// legacyCalls and legacySessions size the interop runs, as for Streamable HTTP.
const legacySessions, legacyCalls = peerSessions, peerCalls

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`

// TestInteropLegacySSEGoSDK: go-sdk legacy servers (mcp.NewSSEHandler, 3
// processes) behind mcp_proxy, 50 concurrent sessions of go-sdk and of
// TypeScript SDK legacy clients (SSEClientTransport): every session works
// and every call is answered by the server of the session's stream. Stock
// round_robin breaks them (negative control).
func TestInteropLegacySSEGoSDK(t *testing.T) {
	ss := startLegacyGoServers(t, 3)
	p := startProxy(t, "mcp_proxy "+upstreams(ss))
	sseURL := "http://" + p.addr + "/sse"
	server := fmt.Sprintf("go-sdk %s, legacy HTTP+SSE (`mcp.NewSSEHandler`, `sessionid`; 3 processes)", goSDKVersion)

	res := runSessions(t, sseURL, legacySessions, sessionPlan{calls: legacyCalls, legacySSE: true})
	t.Logf("mcp_proxy, go-sdk legacy clients: %s", res)
	checkLegacyRun(t, res, 3)

	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	ts := runTSClients(t, env, sseURL, legacySessions, legacyCalls, "--legacy-sse")
	t.Logf("mcp_proxy, TypeScript legacy clients: %+v", ts)
	checkTSLegacyRun(t, ts, ss)

	rr := runSessions(t, "http://"+startProxy(t, stockRoundRobin(ss)).addr+"/sse", legacySessions, sessionPlan{calls: legacyCalls, legacySSE: true})
	t.Logf("stock round_robin (negative control): %s", rr)
	if rr.failed == 0 {
		t.Fatalf("negative control: stock round_robin kept every legacy session, so this test cannot see misrouting: %s", rr)
	}
	recordInterop(interopRow{Server: server, Client: fmt.Sprintf("go-sdk %s (`SSEClientTransport`)", goSDKVersion),
		Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the server of the session's stream (stock `round_robin`: sessions break)",
			res.ok, legacySessions, res.onCreator, legacySessions*legacyCalls)})
	recordInterop(interopRow{Server: server, Client: fmt.Sprintf("TypeScript SDK %s (`SSEClientTransport`)", tsSDKVersion),
		Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the server of the session's stream", ts.OK, legacySessions, ts.Calls, legacySessions*legacyCalls)})
}

// TestInteropLegacySSETS: TypeScript SDK legacy servers (SSEServerTransport,
// 3 processes) behind mcp_proxy, with TypeScript and go-sdk legacy clients;
// no POST reaches a server that does not hold its session, and a POST of an
// unknown session gets the proxy's 404 without reaching any server. Stock
// round_robin breaks the sessions (negative control).
func TestInteropLegacySSETS(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	ss := startTSServers(t, env, 3, "tl", "--legacy-sse")
	p := startProxy(t, "mcp_proxy "+upstreams(ss))
	sseURL := "http://" + p.addr + "/sse"
	server := fmt.Sprintf("TypeScript SDK %s, legacy HTTP+SSE (`SSEServerTransport`, `sessionId`; 3 processes)", tsSDKVersion)

	ts := runTSClients(t, env, sseURL, legacySessions, legacyCalls, "--legacy-sse")
	t.Logf("mcp_proxy, TypeScript legacy clients: %+v", ts)
	checkTSLegacyRun(t, ts, ss)
	res := runSessions(t, sseURL, legacySessions, sessionPlan{calls: legacyCalls, legacySSE: true})
	t.Logf("mcp_proxy, go-sdk legacy clients: %s", res)
	checkLegacyRun(t, res, 3)

	hc := newHTTPClient()
	before := 0
	for _, s := range ss {
		st := tsStatsOf(t, s)
		before += st.Requests
		if st.Unknown != 0 {
			t.Errorf("%s answered %d POSTs of sessions it does not hold: the proxy misrouted them", s.Name(), st.Unknown)
		}
	}
	checkProxy404(t, send(t, hc, http.MethodPost, "http://"+p.addr+"/messages?sessionId=made-up", nil, initializeBody))
	after := 0
	for _, s := range ss {
		after += tsStatsOf(t, s).Requests
	}
	if after != before {
		t.Errorf("a POST of an unknown legacy session reached the servers (%d requests before, %d after)", before, after)
	}

	ctrl := runTSClients(t, env, "http://"+startProxy(t, stockRoundRobin(ss)).addr+"/sse", legacySessions, legacyCalls, "--legacy-sse")
	t.Logf("stock round_robin (negative control), TypeScript legacy clients: %+v", ctrl)
	if ctrl.OK == legacySessions {
		t.Fatalf("negative control: stock round_robin kept every legacy session, so this test cannot see misrouting")
	}
	recordInterop(interopRow{Server: server, Client: fmt.Sprintf("TypeScript SDK %s (`SSEClientTransport`)", tsSDKVersion),
		Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the server of the session's stream, 0 POSTs on another server; unknown session: the proxy's 404 (stock `round_robin`: sessions break)",
			ts.OK, legacySessions, ts.Calls, legacySessions*legacyCalls)})
	recordInterop(interopRow{Server: server, Client: fmt.Sprintf("go-sdk %s (`SSEClientTransport`)", goSDKVersion),
		Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the server of the session's stream", res.ok, legacySessions, res.onCreator, legacySessions*legacyCalls)})
}

// TestLegacySSESessionEndsWithStream: a legacy session is pinned while its
// stream is open and forgotten when the stream closes, as its server
// forgets it; a POST of it then gets the proxy's 404, and a client that
// reconnects gets a new session that works.
func TestLegacySSESessionEndsWithStream(t *testing.T) {
	ss := startLegacyGoServers(t, 3)
	p := startProxy(t, "mcp_proxy "+upstreams(ss))
	hc := newHTTPClient()
	stream := openLegacyStream(t, hc, "http://"+p.addr+"/sse")
	if !strings.HasPrefix(stream.endpoint, "/sse?sessionid=") {
		t.Fatalf("endpoint %q: want the server's own /sse?sessionid=…, unchanged", stream.endpoint)
	}
	id := sessionIn(t, stream.endpoint)
	code, st := lookupStatus(t, id)
	if code != http.StatusOK || st.OpenStreams != 1 {
		t.Fatalf("while the stream is open: lookup %d %+v; want the session pinned with 1 open stream", code, st)
	}
	post := "http://" + p.addr + stream.endpoint
	for i := range 5 {
		if ex := send(t, hc, http.MethodPost, post, nil, initializeBody); ex.status != http.StatusAccepted {
			t.Fatalf("POST %d of the open session: %d %q, want 202 from its server", i+1, ex.status, ex.body)
		}
	}

	stream.close()
	testproc.Until(5*time.Second, func() bool { code, _ = lookupStatus(t, id); return code == http.StatusNotFound })
	if code != http.StatusNotFound {
		t.Fatalf("5 s after the stream closed, lookup answers %d; want the session forgotten (404)", code)
	}
	checkProxy404(t, send(t, hc, http.MethodPost, post, nil, initializeBody).as("POST after the stream closed"))

	again := runSessions(t, "http://"+p.addr+"/sse", 10, sessionPlan{calls: legacyCalls, legacySSE: true})
	if again.ok != 10 {
		t.Fatalf("reconnecting legacy clients: want 10/10 new sessions ok; got %s", again)
	}
}

// TestLegacySSEPathPrefix: behind `handle_path /tenant/*`, the go-sdk
// server's endpoint `/sse?sessionid=…` lacks the prefix the proxy
// stripped; mcp_proxy gives it back, so legacy clients of both SDKs work.
// Stock reverse_proxy passes the endpoint without the prefix, where the
// client's POSTs miss the route (the common bug report).
func TestLegacySSEPathPrefix(t *testing.T) {
	ss := startLegacyGoServers(t, 3)
	site := func(proxy string) string {
		return "handle_path /tenant/* {\n\t\t" + proxy + "\n\t}\n\trespond 404"
	}
	p := startProxy(t, site("mcp_proxy "+upstreams(ss)))
	hc := newHTTPClient()
	if ep := openLegacyStream(t, hc, "http://"+p.addr+"/tenant/sse").endpoint; !strings.HasPrefix(ep, "/tenant/sse?sessionid=") {
		t.Fatalf("endpoint through mcp_proxy under /tenant: %q, want /tenant/sse?sessionid=…", ep)
	}
	res := runSessions(t, "http://"+p.addr+"/tenant/sse", legacySessions, sessionPlan{calls: legacyCalls, legacySSE: true})
	t.Logf("mcp_proxy under handle_path /tenant/*, go-sdk legacy clients: %s", res)
	checkLegacyRun(t, res, 3)

	stock := startProxy(t, site(stockRoundRobin(ss)))
	if ep := openLegacyStream(t, hc, "http://"+stock.addr+"/tenant/sse").endpoint; !strings.HasPrefix(ep, "/sse?sessionid=") {
		t.Fatalf("negative control: stock reverse_proxy gave the endpoint %q, want the server's /sse?sessionid=… without the prefix", ep)
	}
}

// TestLegacySSEAbsoluteEndpoint: mcp-go legacy servers configured with
// their own address as base URL announce absolute endpoints naming it
// (http://127.0.0.1:<port>/message?sessionId=…). mcp_proxy turns them into
// path-absolute URLs, which clients resolve against the proxy's URL; the
// TypeScript client, which refuses an endpoint of another origin, then
// works, and so does the go-sdk client, whose POSTs now pass the proxy
// instead of going to the server directly.
func TestLegacySSEAbsoluteEndpoint(t *testing.T) {
	ss := startMCPGoServers(t, "mgs", mcpGoModeSSE, 3)
	p := startProxy(t, "mcp_proxy "+upstreams(ss))
	hc := newHTTPClient()
	ep := openLegacyStream(t, hc, "http://"+p.addr+"/sse").endpoint
	if !strings.HasPrefix(ep, "/message?sessionId=") {
		t.Fatalf("endpoint through mcp_proxy: %q, want /message?sessionId=…", ep)
	}
	const sessions = 20
	res := runSessions(t, "http://"+p.addr+"/sse", sessions, sessionPlan{calls: legacyCalls, legacySSE: true})
	if res.ok != sessions || res.onCreator != sessions*legacyCalls {
		t.Fatalf("go-sdk legacy clients through mcp_proxy: want %d/%d sessions ok on the stream's server; got %s", sessions, sessions, res)
	}
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	ts := runTSClients(t, env, "http://"+p.addr+"/sse", sessions, legacyCalls, "--legacy-sse")
	if ts.OK != sessions {
		t.Fatalf("TypeScript legacy clients through mcp_proxy: want %d/%d sessions ok; got %+v", sessions, sessions, ts)
	}

	stock := startProxy(t, stockRoundRobin(ss))
	if ep := openLegacyStream(t, hc, "http://"+stock.addr+"/sse").endpoint; !strings.HasPrefix(ep, "http://127.0.0.1:") {
		t.Fatalf("negative control: stock reverse_proxy gave the endpoint %q, want the server's absolute URL", ep)
	}
	ctrl := runTSClients(t, env, "http://"+stock.addr+"/sse", 5, 1, "--legacy-sse")
	if ctrl.OK != 0 {
		t.Fatalf("negative control: TypeScript clients worked with the server's absolute endpoint through stock reverse_proxy: %+v", ctrl)
	}
	t.Logf("stock reverse_proxy: endpoint %q, TypeScript clients: %v", ep, ctrl.Errors)
}

// TestInteropLegacySSEGunicornHooks: the example app's legacy HTTP+SSE
// transport, shaped as python-sdk's SseServerTransport (`session_id`, CRLF
// line ends), in one gunicorn with `workers = 3` and the hooks, behind
// mcp_proxy with the unix_sockets source: legacy sessions of go-sdk and
// TypeScript clients stay on their stream's worker. Behind `handle_path`,
// the root-relative `/messages/?session_id=` gets the prefix back. The same
// gunicorn's shared port breaks the sessions (negative control).
func TestInteropLegacySSEGunicornHooks(t *testing.T) {
	peer := findGunicorn(t)
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	dir := shortTempDir(t)
	g := startHookedGunicorn(t, peer, "gl", 3, dir)

	p := startProxy(t, dynamicSocketsSite(dir))
	sseURL := "http://" + p.addr + "/sse"
	res := runSessions(t, sseURL, legacySessions, sessionPlan{calls: legacyCalls, legacySSE: true})
	t.Logf("go-sdk legacy clients, 1 gunicorn x 3 workers with the hooks: %s", res)
	checkLegacyRun(t, res, 3)
	ts := runTSClients(t, env, sseURL, legacySessions, legacyCalls, "--legacy-sse")
	t.Logf("TypeScript legacy clients: %+v", ts)
	if ts.OK != legacySessions || ts.Calls != legacySessions*legacyCalls || len(ts.PerServer) != 3 {
		t.Fatalf("TypeScript legacy clients: want %d/%d sessions ok, %d calls on the stream's worker, over 3 workers; got %+v",
			legacySessions, legacySessions, legacySessions*legacyCalls, ts)
	}

	hc := newHTTPClient()
	prefixed := startProxy(t, "handle_path /tenant/* {\n\t\t"+dynamicSocketsSite(dir)+"\n\t}\n\trespond 404")
	if ep := openLegacyStream(t, hc, "http://"+prefixed.addr+"/tenant/sse").endpoint; !strings.HasPrefix(ep, "/tenant/messages/?session_id=") {
		t.Fatalf("endpoint under handle_path /tenant/*: %q, want /tenant/messages/?session_id=…", ep)
	}
	pres := runSessions(t, "http://"+prefixed.addr+"/tenant/sse", 10, sessionPlan{calls: legacyCalls, legacySSE: true})
	if pres.ok != 10 {
		t.Fatalf("under handle_path /tenant/*: want 10/10 legacy sessions ok; got %s", pres)
	}

	shared := startProxy(t, "mcp_proxy "+g.Addr())
	sres := runSessions(t, "http://"+shared.addr+"/sse", legacySessions, sessionPlan{calls: legacyCalls, legacySSE: true})
	t.Logf("negative control, the same gunicorn's shared port: %s", sres)
	if sres.failed == 0 {
		t.Fatalf("negative control: legacy sessions through the shared port all worked; got %s", sres)
	}
	t.Logf("1 gunicorn x 3 workers, python-sdk-shaped legacy SSE: go-sdk %d/%d sessions, %d/%d calls on the stream's worker; TypeScript %d/%d, %d/%d",
		res.ok, legacySessions, res.onCreator, legacySessions*legacyCalls, ts.OK, legacySessions, ts.Calls, legacySessions*legacyCalls)
}
