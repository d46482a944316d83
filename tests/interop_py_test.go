package tests

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// gunicornAppDir holds the Python ASGI app of examples/gunicorn.
const gunicornAppDir = "../examples/gunicorn"

// TestInteropGunicornPerWorkerPorts runs the deployment shape of docs/python.md
// with real gunicorn: three single-worker gunicorns on three ports behind
// mcp_proxy. Every session works and every call is answered by the worker
// (pid) that answered initialize.
func TestInteropGunicornPerWorkerPorts(t *testing.T) {
	peer := findGunicorn(t)
	gs := startGunicorns(t, peer, []string{"gu1", "gu2", "gu3"}, 1)
	p := startProxy(t, "mcp_proxy "+upstreams(gs))
	res := runSessions(t, p.url(), peerSessions, sessionPlan{calls: peerCalls})
	t.Logf("3 gunicorns x 1 worker behind mcp_proxy: %s", res)
	if res.ok != peerSessions || res.onCreator != peerTotalCalls || res.sessioned != peerSessions || len(res.perServer) != 3 {
		t.Fatalf("want %d/%d sessions ok with a session ID and %d calls on the creating worker, spread over 3 workers; got %s",
			peerSessions, peerSessions, peerTotalCalls, res)
	}
	for _, r := range res.reports {
		if len(r.id) != 32 || strings.Trim(r.id, "0123456789abcdef") != "" {
			t.Fatalf("session ID %q is not uuid4().hex", r.id)
		}
	}
	recordInterop(interopRow{
		Server: gunicornRow(peer, "3 gunicorns × `--workers 1`, one port each"),
		Client: "go-sdk " + goSDKVersion,
		Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the session's worker",
			res.ok, peerSessions, res.onCreator, peerTotalCalls),
	})
}

// TestInteropGunicornSharedSocket is the failure the deployment shape
// avoids: the same app as one gunicorn with three workers behind one port.
// The workers share one listening socket, so no proxy can tell them apart:
// even behind mcp_proxy, later requests of a session reach workers that never
// saw it and get 404, and sessions break.
func TestInteropGunicornSharedSocket(t *testing.T) {
	peer := findGunicorn(t)
	g := startGunicorn(t, peer, "shared", 3)
	p := startProxy(t, "mcp_proxy "+g.Addr())
	res := runSessions(t, p.url(), peerSessions, sessionPlan{calls: peerCalls})
	t.Logf("1 gunicorn x 3 workers behind mcp_proxy: %s", res)
	notFound := 0
	for _, err := range res.errs {
		if strings.Contains(strings.ToLower(err.Error()), "session not found") {
			notFound++
		}
	}
	if res.failed == 0 || notFound == 0 {
		t.Fatalf("want broken sessions (404 Session not found from workers that never saw them); got %s", res)
	}
	recordInterop(interopRow{
		Server: gunicornRow(peer, "1 gunicorn × `--workers 3` on one port (unsupported shape)"),
		Client: "go-sdk " + goSDKVersion,
		Result: "sessions break as expected: the workers share one socket, so requests reach workers that never saw the session (404); give each worker an address: `mcp_affinity_hooks.py` or one worker per port",
	})
}

// TestInteropGunicornUnixSockets is the deployment shape on unix sockets, as
// docs/deployment.md offers it (`mcp_proxy
// unix//run/mcp/1.sock ...`): three single-worker gunicorns, each on its own
// socket, behind a plain `mcp_proxy unix//...`. The app checks Host like
// python-sdk's DNS-rebinding protection (on by default for servers bound to
// 127.0.0.1): it needs a loopback host with a port, and refuses a missing or
// empty Host with 421.
//
// `header_up Host {upstream_hostport}` is the socket's path for a unix
// upstream, not a valid Host; Go's HTTP client then sends an empty Host
// (net/http, go.dev/issue/61431), and the upstream refuses every request
// with 421. mcp_proxy's default sends a socket `localhost:80`. The test
// first checks that an explicit `header_up Host localhost:80` works, then
// the plain directive.
func TestInteropGunicornUnixSockets(t *testing.T) {
	peer := findGunicorn(t)
	// Socket paths must stay under 108 bytes: a short directory of its own.
	dir, err := os.MkdirTemp("", "mcpgu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	gs := startGunicornsOn(t, peer, []string{"us1", "us2", "us3"}, 1, dir)
	want := func(what string, res loadResult) bool {
		t.Helper()
		t.Logf("%s: %s", what, res)
		return res.ok == peerSessions && res.onCreator == peerTotalCalls && res.sessioned == peerSessions && len(res.perServer) == 3
	}

	p := startProxy(t, "mcp_proxy "+upstreams(gs)+" {\n\t\theader_up Host localhost:80\n\t}")
	if res := runSessions(t, p.url(), peerSessions, sessionPlan{calls: peerCalls}); !want("unix sockets, header_up Host localhost:80", res) {
		t.Fatalf("with header_up Host localhost:80: want %d/%d sessions ok with a session ID and %d calls on the creating worker, spread over 3 workers; got %s",
			peerSessions, peerSessions, peerTotalCalls, res)
	}

	p = startProxy(t, "mcp_proxy "+upstreams(gs))
	res := runSessions(t, p.url(), peerSessions, sessionPlan{calls: peerCalls})
	if !want("unix sockets, plain mcp_proxy", res) {
		t.Fatalf("plain mcp_proxy over unix sockets: want %d/%d sessions ok with a session ID and %d calls on the creating worker, spread over 3 workers; got %s",
			peerSessions, peerSessions, peerTotalCalls, res)
	}
	recordInterop(interopRow{
		Server: gunicornRow(peer, "3 gunicorns × `--workers 1`, one unix socket each"),
		Client: "go-sdk " + goSDKVersion,
		Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the session's worker",
			res.ok, peerSessions, res.onCreator, peerTotalCalls),
	})
}
