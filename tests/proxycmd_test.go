package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// announced is the line `caddy mcp-proxy` prints once it serves: the URL
// to give MCP clients.
var announced = regexp.MustCompile(`MCP proxy on (http://\S+): give MCP clients`)

// runProxyCommand runs `caddy <args...>` as a user would, on the real
// binary, and waits until it serves addr.
func runProxyCommand(t *testing.T, name, addr string, args ...string) *testproc.Proc {
	t.Helper()
	dir := t.TempDir()
	cmd := withEnv(exec.Command(caddyBinary(t), args...), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	p := launch(t, name, addr, cmd)
	ready(t, replicaTimeout, []*testproc.Proc{p}, testproc.Listening())
	return p
}

// TestProxyCommandPinsSessions runs `caddy mcp-proxy --to … --to …` in front
// of three go-sdk servers, exactly as README's quick start shows, and drives
// it with real MCP clients: every call of every session reaches the server
// that created it, the printed URL is the one that works, and the printed
// session API lists the three upstreams with the sessions they hold.
// Negative control in the same run: `caddy reverse-proxy` with the same
// flags breaks sessions.
func TestProxyCommandPinsSessions(t *testing.T) {
	bs := startBackends(t, 3, false)
	addr, admin := freeAddr(t), freeAddr(t)
	args := []string{"mcp-proxy", "--from", addr, "--admin", admin, "--failover"}
	for _, b := range bs {
		args = append(args, "--to", b.Addr())
	}
	p := runProxyCommand(t, "mcp-proxy", addr, args...)
	m := announced.FindStringSubmatch(p.Log().String())
	if m == nil || m[1] != "http://"+addr {
		t.Fatalf("want the command to print the URL http://%s for MCP clients; it printed:\n%s", addr, p.Log().Tail(20))
	}

	const sessions, calls = 30, 5
	res := runSessions(t, m[1]+"/mcp", sessions, sessionPlan{calls: calls})
	t.Logf("caddy mcp-proxy: %s", res)
	if res.ok != sessions || res.onCreator != sessions*calls || len(res.perServer) != 3 {
		t.Fatalf("want %d/%d sessions ok, %d calls on the creating server, over 3 servers; got %s", sessions, sessions, sessions*calls, res)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const open = 6 // sessions left open: runSessions ends its own with DELETE
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	openSessions(ctx, t, m[1]+"/mcp", hc, open)
	if held := upstreamSessions(t, "http://"+admin+"/mcp_sessions/"); held != open {
		t.Fatalf("the session API lists %d live sessions over the upstreams, want the %d open ones", held, open)
	}

	stock := freeAddr(t)
	stockArgs := []string{"reverse-proxy", "--from", "http://" + stock, "--change-host-header"}
	for _, b := range bs {
		stockArgs = append(stockArgs, "--to", b.Addr())
	}
	runProxyCommand(t, "reverse-proxy", stock, stockArgs...)
	ctrl := runSessions(t, "http://"+stock+"/mcp", sessions, sessionPlan{calls: calls})
	t.Logf("caddy reverse-proxy with the same upstreams (negative control): %s", ctrl)
	if ctrl.sessioned == 0 || ctrl.ok == sessions {
		t.Fatalf("negative control: want sessions opened through caddy reverse-proxy and some broken by misrouting; got %s", ctrl)
	}
}

// TestProxyCommandGunicornSockets runs `caddy mcp-proxy --to
// 'unix/<dir>/worker-*.sock'` in front of one gunicorn whose workers each
// serve a socket of their own (examples/gunicorn's hooks): sessions are
// pinned to the worker that created them, over all three workers.
func TestProxyCommandGunicornSockets(t *testing.T) {
	peer := findGunicorn(t)
	dir := shortTempDir(t)
	startHookedGunicorn(t, peer, "gc", 3, dir)
	addr := freeAddr(t)
	runProxyCommand(t, "mcp-proxy-sockets", addr, "mcp-proxy", "--from", addr, "--admin", "off",
		"--to", "unix/"+filepath.Join(dir, "worker-*.sock"))

	res := runSessions(t, "http://"+addr+"/mcp", peerSessions, sessionPlan{calls: peerCalls})
	t.Logf("caddy mcp-proxy over gunicorn's per-worker sockets: %s", res)
	if res.ok != peerSessions || res.onCreator != peerTotalCalls || len(res.perServer) != 3 {
		t.Fatalf("want %d/%d sessions ok, %d calls on the creating worker, over 3 workers; got %s",
			peerSessions, peerSessions, peerTotalCalls, res)
	}
}

// TestProxyCommandRefusesBadFlags runs the command with flags that cannot
// run: it exits non-zero at once with a message naming the flag, and
// serves nothing.
func TestProxyCommandRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"mcp-proxy"}, "--to is required"},
		{[]string{"mcp-proxy", "--to", "127.0.0.1:1 {"}, "invalid --to"},
		{[]string{"mcp-proxy", "--to", "unix//a/*.sock", "--to", "127.0.0.1:1"}, "cannot be mixed"},
	} {
		out, err := exec.Command(caddyBinary(t), tc.args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("caddy %s: want a failure saying %q; got err %v, output:\n%s", strings.Join(tc.args, " "), tc.want, err, out)
		}
	}
}

// upstreamSessions sums the live sessions over the upstreams of the one
// table the admin API at url lists.
func upstreamSessions(t *testing.T, url string) int64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tables []caddymodule.TableStatus
	if err := json.NewDecoder(resp.Body).Decode(&tables); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d, %v", url, resp.StatusCode, err)
	}
	if len(tables) != 1 || len(tables[0].Upstreams) != 3 {
		t.Fatalf("GET %s: want one table with 3 upstreams, got %+v", url, tables)
	}
	var n int64
	for _, u := range tables[0].Upstreams {
		n += u.LiveSessions
	}
	return n
}
