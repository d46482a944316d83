package tests

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// announced is the line `caddy mcp-proxy` prints once it serves: the URL
// to give MCP clients.
var announced = regexp.MustCompile(`MCP proxy on (http://\S+): give MCP clients`)

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
	// The command prints its lines once Caddy has started, which may be
	// after its listener accepts connections.
	var m []string
	testproc.Until(10*time.Second, func() bool {
		m = announced.FindStringSubmatch(p.Log().String())
		return m != nil && strings.Contains(p.Log().String(), "Status page: ")
	})
	if m == nil || m[1] != "http://"+addr {
		t.Fatalf("want the command to print the URL http://%s for MCP clients; it printed:\n%s", addr, p.Log().Tail(2000))
	}

	const sessions, calls = 30, 5
	res := runSessions(t, m[1]+"/mcp", sessions, sessionPlan{calls: calls})
	t.Logf("caddy mcp-proxy: %s", res)
	if res.ok != sessions || res.onCreator != sessions*calls || len(res.perServer) != 3 {
		t.Fatalf("want %d/%d sessions ok, %d calls on the creating server, over 3 servers; got %s", sessions, sessions, sessions*calls, res)
	}
	if !strings.Contains(p.Log().String(), "Status page: http://"+addr+"/mcp-status") {
		t.Fatalf("want the command to print its status page's URL; it printed:\n%s", p.Log().Tail(2000))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const open = 6 // sessions left open: runSessions ends its own with DELETE
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	openLiveSessions(ctx, t, m[1]+"/mcp", hc, open)
	// The ended sessions' DELETEs may still be on their way: wait for them.
	held := upstreamSessions(t, "http://"+admin+"/mcp_sessions/")
	for end := time.Now().Add(5 * time.Second); held != open && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
		held = upstreamSessions(t, "http://"+admin+"/mcp_sessions/")
	}
	if held != open {
		t.Fatalf("the session API lists %d live sessions over the upstreams, want the %d open ones", held, open)
	}
	resp, err := hc.Get("http://" + addr + "/mcp-status?refresh=off")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	rows := statusRows(t, string(page))
	var shown int
	for _, b := range bs {
		n, _ := strconv.Atoi(rows[b.Addr()]["live"])
		shown += n
	}
	if resp.StatusCode != http.StatusOK || len(rows) != 3 || shown != open {
		t.Fatalf("the status page: status %d, %d upstream rows, %d live sessions; want 200, 3 rows, %d sessions", resp.StatusCode, len(rows), shown, open)
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

// TestProxyCommandSharesThroughRedis runs two `caddy mcp-proxy --redis` on
// one real redis-server, the hash key in MCP_SESSIONS_HASH_KEY as --help
// says, behind a balancer that sends each request to the other proxy than
// the one before: every call reaches the server that created its session.
// Negative controls in the same run: the same two proxies without --redis
// break sessions, and --redis without the variable refuses to start,
// saying what to set.
func TestProxyCommandSharesThroughRedis(t *testing.T) {
	srv := redistest.Start(t)
	bs := startBackends(t, 3, false)
	key := make([]byte, 32)
	rand.Read(key)
	env := []string{"MCP_SESSIONS_HASH_KEY=" + base64.StdEncoding.EncodeToString(key)}
	pair := func(name string, extra ...string) *balancer {
		var rs []*replica
		for i := range 2 {
			addr := freeAddr(t)
			args := append([]string{"mcp-proxy", "--from", addr, "--admin", "off"}, extra...)
			for _, b := range bs {
				args = append(args, "--to", b.Addr())
			}
			runProxyCommandEnv(t, fmt.Sprintf("%s%d", name, i), addr, env, args...)
			rs = append(rs, &replica{addr: addr})
		}
		return newRoundRobin(rs...)
	}

	const sessions, calls = 20, 5
	shared := pair("mcp-proxy-redis", "--redis", srv.Addr)
	res := runSessionsWith(t, "http://"+shared.rotation[0]+"/mcp", shared.client(), sessions, sessionPlan{calls: calls})
	t.Logf("two caddy mcp-proxy --redis, requests alternating: %s", res)
	if res.ok != sessions || res.onCreator != sessions*calls {
		t.Fatalf("want %d/%d sessions ok and %d calls on the creating server; got %s", sessions, sessions, sessions*calls, res)
	}

	apart := pair("mcp-proxy-apart")
	ctrl := runSessionsWith(t, "http://"+apart.rotation[0]+"/mcp", apart.client(), sessions, sessionPlan{calls: calls})
	t.Logf("the same two proxies without --redis (negative control): %s", ctrl)
	if ctrl.ok == sessions {
		t.Fatalf("negative control: want sessions broken by two proxies that do not share a table; got %s", ctrl)
	}

	cmd := exec.Command(caddyBinary(t), "mcp-proxy", "--admin", "off", "--from", freeAddr(t), "--to", bs[0].Addr(), "--redis", srv.Addr)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "MCP_SESSIONS_HASH_KEY=") })
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "export MCP_SESSIONS_HASH_KEY=") {
		t.Fatalf("--redis without MCP_SESSIONS_HASH_KEY: want a refusal naming the variable; got err %v, output:\n%s", err, out)
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
	busy, err := net.Listen("tcp", "127.0.0.1:0") // Caddy would share it (SO_REUSEPORT) and split the sessions
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"mcp-proxy"}, "--to is required"},
		{[]string{"mcp-proxy", "--to", "127.0.0.1:1 {"}, "invalid --to"},
		{[]string{"mcp-proxy", "--to", "unix//a/*.sock", "--to", "127.0.0.1:1"}, "cannot be mixed"},
		{[]string{"mcp-proxy", "--to", "19101"}, "give host:port"},
		{[]string{"mcp-proxy", "--to", "127.0.0.1:19101/mcp"}, "give host:port without the path (--to 127.0.0.1:19101)"},
		{[]string{"mcp-proxy", "--to", "127.0.0.1:99999"}, "is not a port number (1-65535)"},
		{[]string{"mcp-proxy", "--to", "127.0.0.1:1", "--from", "19102"}, "give :19102 to listen on every interface"},
		{[]string{"mcp-proxy", "--to", "127.0.0.1:1", "127.0.0.1:2"}, "unexpected argument"},
		{[]string{"mcp-proxy", "--to", "127.0.0.1:1", "--status", "/mcp"}, "would hide the MCP endpoint"},
		{[]string{"mcp-proxy", "--from", busy.Addr().String(), "--admin", "off", "--to", "127.0.0.1:1"}, "is another caddy mcp-proxy (or another server) running there"},
	} {
		out, err := exec.Command(caddyBinary(t), tc.args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("caddy %s: want a failure saying %q; got err %v, output:\n%s", strings.Join(tc.args, " "), tc.want, err, out)
		}
	}
}
