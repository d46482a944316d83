package tests

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// gunicornAppDir holds the Python ASGI app of examples/gunicorn.
const gunicornAppDir = "../examples/gunicorn"

// gunicornStartTimeout bounds a gunicorn's start, until all its workers serve.
const gunicornStartTimeout = 20 * time.Second

// gunicornPeer describes the Python stack found on this machine.
type gunicornPeer struct {
	bin      string // the gunicorn executable
	dir      string // absolute path of examples/gunicorn
	gunicorn string // gunicorn version
	uvicorn  string // uvicorn version
}

// findGunicorn finds gunicorn and checks that its Python can import uvicorn's
// gunicorn worker, or skips t (fails it when MCP_INTEROP_REQUIRED is set).
func findGunicorn(t *testing.T) gunicornPeer {
	t.Helper()
	bin, err := exec.LookPath("gunicorn")
	if err != nil {
		skipInterop(t, "gunicorn not installed (.ci/install-deps installs Debian's gunicorn, python3-uvicorn)")
	}
	python := "python3"
	if f, err := os.Open(bin); err == nil {
		line, _ := bufio.NewReader(f).ReadString('\n')
		f.Close()
		if fields := strings.Fields(strings.TrimPrefix(line, "#!")); strings.HasPrefix(line, "#!") && len(fields) > 0 {
			python = fields[0]
			if filepath.Base(python) == "env" && len(fields) > 1 {
				python = fields[1]
			}
		}
	}
	out, err := exec.Command(python, "-c",
		"import gunicorn, uvicorn, uvicorn.workers; print(gunicorn.__version__, uvicorn.__version__)").CombinedOutput()
	versions := strings.Fields(string(out))
	if err != nil || len(versions) != 2 {
		skipInterop(t, fmt.Sprintf("gunicorn's Python (%s) cannot load uvicorn's worker: %v: %s", python, err, out))
	}
	dir, err := filepath.Abs(gunicornAppDir)
	if err != nil {
		t.Fatal(err)
	}
	return gunicornPeer{bin: bin, dir: dir, gunicorn: versions[0], uvicorn: versions[1]}
}

// startGunicorn starts `gunicorn app:app -k uvicorn.workers.UvicornWorker
// --workers <workers>` on a free loopback port, serving the example app as
// server name, and waits until every worker has started the app.
func startGunicorn(t *testing.T, peer gunicornPeer, name string, workers int) *testproc.Proc {
	t.Helper()
	return startGunicorns(t, peer, []string{name}, workers)[0]
}

// startGunicorns starts one gunicorn per name, with workers workers each, on
// free loopback ports, and waits until all of them serve. They boot concurrently.
func startGunicorns(t *testing.T, peer gunicornPeer, names []string, workers int) []*testproc.Proc {
	t.Helper()
	return startGunicornsOn(t, peer, names, workers, "")
}

// gunicornReady is the line each gunicorn worker logs once it serves the app.
const gunicornReady = "Application startup complete"

// startGunicornsOn is startGunicorns, with unix sockets in socketDir instead
// of ports when socketDir is not empty. Each gunicorn is ready once every
// worker has started the app and its address accepts connections.
func startGunicornsOn(t *testing.T, peer gunicornPeer, names []string, workers int, socketDir string) []*testproc.Proc {
	t.Helper()
	gs := make([]*testproc.Proc, len(names))
	for i, name := range names {
		addr, bind := gunicornBind(t, name, socketDir)
		cmd := exec.Command(peer.bin, "--chdir", peer.dir, "app:app",
			"-k", "uvicorn.workers.UvicornWorker", "--workers", strconv.Itoa(workers), "--bind", bind)
		gs[i] = launch(t, name, addr, withEnv(cmd, "MCP_SERVER_NAME="+name, "PYTHONDONTWRITEBYTECODE=1"))
	}
	ready(t, gunicornStartTimeout, gs, testproc.LogCount(gunicornReady, workers), testproc.Listening())
	return gs
}

// gunicornBind returns the upstream address (host:port or unix/<path>) and
// the --bind value of gunicorn name: a free port, or a socket in socketDir.
func gunicornBind(t *testing.T, name, socketDir string) (addr, bind string) {
	if socketDir == "" {
		addr = freeAddr(t)
		return addr, addr
	}
	socket := filepath.Join(socketDir, name+".sock")
	return "unix/" + socket, "unix:" + socket
}

// gunicornRow names the Python stack in the Interoperability table.
func gunicornRow(peer gunicornPeer, shape string) string {
	return fmt.Sprintf("hand-written ASGI app with python-sdk's wire behaviour (`examples/gunicorn`), gunicorn %s + uvicorn %s, %s",
		peer.gunicorn, peer.uvicorn, shape)
}

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
