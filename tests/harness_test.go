// Package tests runs the plugin end to end: a real Caddy (in this process,
// so the race detector covers the plugin) in front of real go-sdk MCP servers
// running as separate processes, driven by real go-sdk clients.
package tests

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
)

var (
	// whoamiBin is the path of the whoami-server binary built by TestMain.
	whoamiBin string
	// adminAddr is the Caddy admin endpoint of this test process.
	adminAddr string
	// binDir holds binaries built for this run; it is removed when the run ends.
	binDir string
)

// TestMain builds the whoami server, runs the tests with the in-process
// Caddy, and then checks docs/interop.md's Interoperability table against what
// the interop tests measured (see interop_table_test.go).
func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		// The quick loop (go test -short) covers the unit tests; every test
		// here starts real processes.
		fmt.Fprintln(os.Stderr, "tests: end-to-end package skipped under -short")
		return 0
	}
	dir, err := os.MkdirTemp("", "mcp-affinity-tests")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	whoamiBin = filepath.Join(dir, "whoami-server")
	build := exec.Command("go", "build", "-o", whoamiBin, "../examples/whoami-server")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building whoami-server:", err)
		return 1
	}
	adminAddr = fmt.Sprintf("127.0.0.1:%d", mustFreePort())
	defer caddy.Stop() //nolint:errcheck
	if code := m.Run(); code != 0 {
		return code
	}
	return checkInteropTable()
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
func globalOptions() string { return globalOptionsWith("") }

// globalOptionsWith is globalOptions with server options (such as a
// `timeouts` block) added to its `servers` block.
func globalOptionsWith(serverOptions string) string {
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
		%s
	}
}
`, adminAddr, logs, serverOptions)
}

// siteConfig returns a Caddyfile whose one site listens on 127.0.0.1:port
// for any Host and holds body.
func siteConfig(port int, body string) string {
	return globalOptions() + siteBlock(port, body)
}

// siteBlock returns the Caddyfile site block of siteConfig.
func siteBlock(port int, body string) string {
	return fmt.Sprintf(`
http://:%d {
	bind 127.0.0.1
	%s
}
`, port, body)
}

// startProxy loads a Caddy config serving body on a new port and returns the site.
func startProxy(t testing.TB, body string) proxy {
	t.Helper()
	return startProxies(t, body)[0]
}

// startProxies loads one Caddy config with a site per body, each on a new
// port, and returns the sites in the order of bodies.
func startProxies(t testing.TB, bodies ...string) []proxy {
	t.Helper()
	return startProxiesWith(t, "", bodies...)
}

// startProxiesWith is startProxies with serverOptions added to the servers
// block of the global options (see globalOptionsWith).
func startProxiesWith(t testing.TB, serverOptions string, bodies ...string) []proxy {
	t.Helper()
	cfg := globalOptionsWith(serverOptions)
	ps := make([]proxy, len(bodies))
	for i, body := range bodies {
		port := mustFreePort()
		cfg += siteBlock(port, body)
		ps[i] = proxy{addr: fmt.Sprintf("127.0.0.1:%d", port)}
	}
	loadCaddyfile(t, cfg)
	return ps
}

// stockRoundRobin is stock Caddy in front of the same backends: the setup
// that breaks sessions, used as the negative control.
func stockRoundRobin[U addressed](us []U) string {
	return fmt.Sprintf("reverse_proxy %s {\n\t\tlb_policy round_robin\n\t\theader_up Host {upstream_hostport}\n\t}", upstreams(us))
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

// clientFrom returns a client with its own connection pool whose
// connections come from the loopback address src (127.0.0.2, …): to the
// proxy, another client machine.
func clientFrom(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DialContext: d.DialContext}}
}
