package tests

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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

// gunicornLog is a bytes.Buffer safe for a process to write while the test reads.
type gunicornLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *gunicornLog) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *gunicornLog) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// gunicornProc is one gunicorn master and its workers, in their own process group.
type gunicornProc struct {
	name    string
	addr    string
	workers int
	cmd     *exec.Cmd
	log     *gunicornLog
	socket  string        // the unix socket's path, when bound to one
	exited  chan struct{} // closed when the master has exited
}

// startGunicorn starts `gunicorn app:app -k uvicorn.workers.UvicornWorker
// --workers <workers>` on a free loopback port, serving the example app as
// server name, and waits until every worker has started the app.
func startGunicorn(t *testing.T, peer gunicornPeer, name string, workers int) *gunicornProc {
	t.Helper()
	return startGunicorns(t, peer, []string{name}, workers)[0]
}

// startGunicorns starts one gunicorn per name, with workers workers each, on
// free loopback ports, and waits until all of them serve. They boot concurrently.
func startGunicorns(t *testing.T, peer gunicornPeer, names []string, workers int) []*gunicornProc {
	t.Helper()
	return startGunicornsOn(t, peer, names, workers, "")
}

// startGunicornsOn is startGunicorns, with unix sockets in socketDir instead
// of ports when socketDir is not empty.
func startGunicornsOn(t *testing.T, peer gunicornPeer, names []string, workers int, socketDir string) []*gunicornProc {
	t.Helper()
	gs := make([]*gunicornProc, len(names))
	for i, name := range names {
		g := &gunicornProc{name: name, workers: workers, log: new(gunicornLog), exited: make(chan struct{})}
		bind := ""
		if socketDir != "" {
			g.socket = filepath.Join(socketDir, name+".sock")
			g.addr = "unix/" + g.socket
			bind = "unix:" + g.socket
		} else {
			g.addr = fmt.Sprintf("127.0.0.1:%d", mustFreePort())
			bind = g.addr
		}
		g.cmd = exec.Command(peer.bin, "--chdir", peer.dir, "app:app",
			"-k", "uvicorn.workers.UvicornWorker", "--workers", strconv.Itoa(workers), "--bind", bind)
		g.cmd.Env = append(os.Environ(), "MCP_SERVER_NAME="+name, "PYTHONDONTWRITEBYTECODE=1")
		g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
		g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := g.cmd.Start(); err != nil {
			t.Fatalf("starting gunicorn %s: %v", name, err)
		}
		go func() {
			_ = g.cmd.Wait()
			close(g.exited)
		}()
		t.Cleanup(func() {
			// The master and its workers share the process group.
			_ = syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL)
			<-g.exited
		})
		gs[i] = g
	}
	deadline := time.Now().Add(gunicornStartTimeout)
	for _, g := range gs {
		for !g.ready() {
			select {
			case <-g.exited:
				t.Fatalf("gunicorn %s exited: %s", g.name, g.log)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("gunicorn %s: %d workers not ready after %v: %s", g.name, workers, gunicornStartTimeout, g.log)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return gs
}

// ready reports whether every worker has started the app and the port accepts connections.
func (g *gunicornProc) ready() bool {
	if strings.Count(g.log.String(), "Application startup complete") < g.workers {
		return false
	}
	network, addr := "tcp", g.addr
	if g.socket != "" {
		network, addr = "unix", g.socket
	}
	c, err := net.DialTimeout(network, addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// gunicornAddrs returns the gunicorns' upstream addresses (host:port or
// unix//path), space-separated, for a Caddyfile.
func gunicornAddrs(gs []*gunicornProc) string {
	s := make([]string, len(gs))
	for i, g := range gs {
		s[i] = g.addr
	}
	return strings.Join(s, " ")
}

// gunicornRow names the Python stack in the Interoperability table.
func gunicornRow(peer gunicornPeer, shape string) string {
	return fmt.Sprintf("hand-written ASGI app with python-sdk's wire behaviour (`examples/gunicorn`), gunicorn %s + uvicorn %s, %s",
		peer.gunicorn, peer.uvicorn, shape)
}

// TestInteropGunicornPerWorkerPorts runs the deployment shape of README.md
// with real gunicorn: three single-worker gunicorns on three ports behind
// mcp_proxy. Every session works and every call is answered by the worker
// (pid) that answered initialize.
func TestInteropGunicornPerWorkerPorts(t *testing.T) {
	peer := findGunicorn(t)
	gs := startGunicorns(t, peer, []string{"gu1", "gu2", "gu3"}, 1)
	p := startProxy(t, "mcp_proxy "+gunicornAddrs(gs))
	res := runCreatorSessions(t, p.url(), "", peerSessions, peerCalls)
	t.Logf("3 gunicorns x 1 worker behind mcp_proxy: %s", res)
	if res.ok != peerSessions || res.onCreator != peerTotalCalls || res.sessioned != peerSessions || len(res.perServer) != 3 {
		t.Fatalf("want %d/%d sessions ok with a session ID and %d calls on the creating worker, spread over 3 workers; got %s",
			peerSessions, peerSessions, peerTotalCalls, res)
	}
	for _, r := range res.reports {
		if len(r.sessionID) != 32 || strings.Trim(r.sessionID, "0123456789abcdef") != "" {
			t.Fatalf("session ID %q is not uuid4().hex", r.sessionID)
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
	p := startProxy(t, "mcp_proxy "+g.addr)
	res := runCreatorSessions(t, p.url(), "", peerSessions, peerCalls)
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
		Result: "sessions break as expected: the workers share one socket, so requests reach workers that never saw the session (404); run one worker per port",
	})
}

// TestInteropGunicornUnixSockets is the deployment shape on unix sockets, as
// README.md offers it ("Unix sockets work the same way: mcp_proxy
// unix//run/mcp/1.sock ..."): three single-worker gunicorns, each on its own
// socket, behind a plain `mcp_proxy unix//...`. The app checks Host like
// python-sdk's DNS-rebinding protection (on by default for servers bound to
// 127.0.0.1): it needs a loopback host with a port, and refuses a missing or
// empty Host with 421.
//
// mcp_proxy's default `header_up Host {upstream_hostport}` is the socket's
// path for a unix upstream, not a valid Host; Go's HTTP client then sends an
// empty Host (net/http, go.dev/issue/61431), and the upstream refuses every
// request with 421. The test first checks that an explicit
// `header_up Host localhost:80` works, then the plain directive.
func TestInteropGunicornUnixSockets(t *testing.T) {
	peer := findGunicorn(t)
	// Socket paths must stay under 108 bytes: a short directory of its own.
	dir, err := os.MkdirTemp("", "mcpgu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	gs := startGunicornsOn(t, peer, []string{"us1", "us2", "us3"}, 1, dir)
	want := func(what string, res creatorResult) bool {
		t.Helper()
		t.Logf("%s: %s", what, res)
		return res.ok == peerSessions && res.onCreator == peerTotalCalls && res.sessioned == peerSessions && len(res.perServer) == 3
	}

	p := startProxy(t, "mcp_proxy "+gunicornAddrs(gs)+" {\n\t\theader_up Host localhost:80\n\t}")
	if res := runCreatorSessions(t, p.url(), "", peerSessions, peerCalls); !want("unix sockets, header_up Host localhost:80", res) {
		t.Fatalf("with header_up Host localhost:80: want %d/%d sessions ok with a session ID and %d calls on the creating worker, spread over 3 workers; got %s",
			peerSessions, peerSessions, peerTotalCalls, res)
	}

	p = startProxy(t, "mcp_proxy "+gunicornAddrs(gs))
	res := runCreatorSessions(t, p.url(), "", peerSessions, peerCalls)
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
