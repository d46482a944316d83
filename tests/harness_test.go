// Package tests runs the plugin end to end: a real Caddy (in this process,
// so the race detector covers the plugin) in front of real go-sdk MCP servers
// running as separate processes, driven by real go-sdk clients.
package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	_ "github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
)

var (
	// whoamiBin is the path of the whoami-server binary built by TestMain.
	whoamiBin string
	// adminAddr is the Caddy admin endpoint of this test process.
	adminAddr string
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "mcp-affinity-tests")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	whoamiBin = filepath.Join(dir, "whoami-server")
	build := exec.Command("go", "build", "-o", whoamiBin, "../examples/whoami-server")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building whoami-server:", err)
		return 1
	}
	adminAddr = fmt.Sprintf("127.0.0.1:%d", mustFreePort())
	defer caddy.Stop() //nolint:errcheck
	return m.Run()
}

// mustFreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func mustFreePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// backend is one whoami MCP server process.
type backend struct {
	name string
	addr string // host:port
	cmd  *exec.Cmd
	out  *bytes.Buffer
}

// startBackend starts a whoami-server process called name and waits until it listens.
func startBackend(t testing.TB, name string, jsonMode bool) *backend {
	t.Helper()
	addrFile := filepath.Join(t.TempDir(), name+".addr")
	args := []string{"-name", name, "-listen", "127.0.0.1:0", "-addr-file", addrFile}
	if jsonMode {
		args = append(args, "-json")
	}
	b := &backend{name: name, cmd: exec.Command(whoamiBin, args...), out: new(bytes.Buffer)}
	b.cmd.Stdout, b.cmd.Stderr = b.out, b.out
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("starting backend %s: %v", name, err)
	}
	t.Cleanup(b.kill)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if data, err := os.ReadFile(addrFile); err == nil {
			b.addr = strings.TrimSpace(string(data))
			return b
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("backend %s did not start: %s", name, b.out)
	return nil
}

// startBackends starts n whoami servers named s1..sn.
func startBackends(t testing.TB, n int, jsonMode bool) []*backend {
	bs := make([]*backend, n)
	for i := range bs {
		bs[i] = startBackend(t, fmt.Sprintf("s%d", i+1), jsonMode)
	}
	return bs
}

// kill ends the backend process at once, as a crash would.
func (b *backend) kill() {
	if b.cmd.Process != nil && b.cmd.ProcessState == nil {
		_ = b.cmd.Process.Signal(syscall.SIGKILL)
		_ = b.cmd.Wait()
	}
}

// addrs returns the backends' addresses, space-separated, for a Caddyfile.
func addrs(bs []*backend) string {
	s := make([]string, len(bs))
	for i, b := range bs {
		s[i] = b.addr
	}
	return strings.Join(s, " ")
}

// proxy is a site served by the in-process Caddy.
type proxy struct {
	addr string // host:port
}

// port returns the proxy's port.
func (p proxy) port() int {
	_, port, _ := net.SplitHostPort(p.addr)
	n, _ := strconv.Atoi(port)
	return n
}

// url returns the proxy's MCP endpoint.
func (p proxy) url() string { return "http://" + p.addr + "/mcp" }

// globalOptions is the Caddyfile global options block of every test config.
func globalOptions() string {
	logs := "log {\n\t\toutput discard\n\t}"
	if os.Getenv("MCP_TEST_CADDY_LOG") != "" {
		logs = "log {\n\t\tlevel DEBUG\n\t}"
	}
	return fmt.Sprintf(`{
	admin %s
	%s
	auto_https off
	persist_config off
	servers {
		protocols h1 h2c
	}
}
`, adminAddr, logs)
}

// siteConfig returns a Caddyfile whose one site listens on 127.0.0.1:port
// for any Host and holds body.
func siteConfig(port int, body string) string {
	return globalOptions() + fmt.Sprintf(`
http://:%d {
	bind 127.0.0.1
	%s
}
`, port, body)
}

// startProxy loads a Caddy config serving body on a new port and returns the site.
func startProxy(t testing.TB, body string) proxy {
	t.Helper()
	port := mustFreePort()
	loadCaddyfile(t, siteConfig(port, body))
	return proxy{addr: fmt.Sprintf("127.0.0.1:%d", port)}
}

// loadCaddyfile adapts cfg and loads it into the in-process Caddy, replacing
// the running config (a reload, when one is running).
func loadCaddyfile(t testing.TB, cfg string) {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	js, warnings, err := adapter.Adapt([]byte(cfg), nil)
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, cfg)
	}
	for _, w := range warnings {
		t.Logf("caddyfile warning: %s", w.String())
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	time.Sleep(20 * time.Millisecond) // let a replaced server close its idle connections
}

// reloadViaAdmin posts a Caddyfile to the admin endpoint's /load, as `caddy
// reload` does. The old server then closes its idle keep-alive connections
// in the background: a client POST that races onto one of them fails with
// EOF before reaching any handler (Go's client does not retry POSTs), so
// tests drop their idle connections after a reload.
func reloadViaAdmin(t testing.TB, cfg string) {
	t.Helper()
	resp, err := http.Post("http://"+adminAddr+"/load", "text/caddyfile", strings.NewReader(cfg))
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reload: %s: %s", resp.Status, body)
	}
	time.Sleep(50 * time.Millisecond) // let the old server close its idle connections
}

// newHTTPClient returns a client with its own connection pool.
func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
}

// connect opens an MCP session through url with the go-sdk client.
func connect(ctx context.Context, url string, hc *http.Client) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "affinity-test", Version: "v0"}, nil)
	return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, nil)
}

// identity is the whoami tool's answer.
type identity struct {
	Server  string `json:"server"`
	Session string `json:"session"`
}

// whoami calls the whoami tool.
func whoami(ctx context.Context, cs *mcp.ClientSession) (identity, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami"})
	if err != nil {
		return identity{}, err
	}
	if res.IsError {
		return identity{}, fmt.Errorf("whoami tool error: %v", res.Content)
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return identity{}, err
	}
	var id identity
	err = json.Unmarshal(raw, &id)
	return id, err
}

// sessionReport is the outcome of one client session in a load run.
type sessionReport struct {
	server string // the server that answered the first call
	calls  int    // calls answered by that server, with the client's session ID
	err    error  // the first failure, if any
}

// runSession connects, calls whoami n times and closes the session. Each
// call must be answered by the server that answered the first, seeing the
// client's own session ID.
func runSession(ctx context.Context, url string, hc *http.Client, n int) sessionReport {
	cs, err := connect(ctx, url, hc)
	if err != nil {
		return sessionReport{err: fmt.Errorf("connect: %w", err)}
	}
	defer cs.Close()
	var rep sessionReport
	for i := range n {
		id, err := whoami(ctx, cs)
		if err != nil {
			rep.err = fmt.Errorf("call %d: %w", i+1, err)
			return rep
		}
		if rep.server == "" {
			rep.server = id.Server
		}
		if id.Server != rep.server || id.Session != cs.ID() || cs.ID() == "" {
			rep.err = fmt.Errorf("call %d misrouted: answered by %s for session %q, session began on %s as %q",
				i+1, id.Server, id.Session, rep.server, cs.ID())
			return rep
		}
		rep.calls++
	}
	return rep
}

// loadResult sums up a run of concurrent sessions.
type loadResult struct {
	reports  []sessionReport
	ok       int
	calls    int
	perServe map[string]int
	firstErr error
}

func (r loadResult) String() string {
	return fmt.Sprintf("%d/%d sessions ok, %d calls pinned, sessions per server %v, first error: %v",
		r.ok, len(r.reports), r.calls, r.perServe, r.firstErr)
}

// runSessions runs sessions concurrent sessions of calls whoami calls each.
func runSessions(t testing.TB, url string, sessions, calls int) loadResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	res := loadResult{reports: make([]sessionReport, sessions), perServe: map[string]int{}}
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() { res.reports[i] = runSession(ctx, url, hc, calls) })
	}
	wg.Wait()
	for _, r := range res.reports {
		res.calls += r.calls
		if r.err != nil {
			if res.firstErr == nil {
				res.firstErr = r.err
			}
			continue
		}
		res.ok++
		res.perServe[r.server]++
	}
	return res
}
