package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Proxy helpers: requests with other hosts, principals and TLS, routing
// logs, the 404 and health checks of the proxy's own answers.

// adminRaw sends body, exactly as given, to the in-process Caddy's admin
// endpoint and returns the status and the answer's text.
func adminRaw(t testing.TB, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+adminAddr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		t.Fatalf("admin API %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(text)
}

// reopenLost replaces the sessions owned by server with new ones.
func reopenLost(ctx context.Context, t testing.TB, url string, hc *http.Client, css []*session, server string) []*session {
	for i, s := range css {
		if s.first.Server == server {
			css[i] = openLiveSession(ctx, t, url, hc)
		}
	}
	return css
}

// goSDKVersion is the MCP Go SDK version the tests build against.
const goSDKVersion = "v1.8.0"

// withGlobal returns cfg, a Caddyfile whose first block is the global
// options, with extra added to them.
func withGlobal(cfg, extra string) string {
	return strings.Replace(cfg, "{\n", "{\n\t"+extra+"\n", 1)
}

// tryLoadCaddyfile adapts and loads cfg into the in-process Caddy, and
// returns the load's error. A load replaces the admin server, so the
// default client's idle connections to the old one are dropped.
func tryLoadCaddyfile(t testing.TB, cfg string) error {
	t.Helper()
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, cfg)
	}
	defer http.DefaultClient.CloseIdleConnections()
	return caddy.Load(js, true)
}

// openLiveSessions opens n go-sdk sessions through url and returns the servers
// that own them, in order.
func openLiveSessions(ctx context.Context, t testing.TB, url string, hc *http.Client, n int) []*session {
	t.Helper()
	css := make([]*session, n)
	for i := range css {
		cs, err := connectNoStream(ctx, url, hc) // a GET stream would keep it from eviction
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		css[i] = liveSessionOf(ctx, t, cs)
	}
	return css
}

// get404Exchanges makes, against url: initialize, the GET that opens the
// standalone stream, and a whoami call, as an MCP client does.
func get404Exchanges(t *testing.T, hc *http.Client, url string) []exchange {
	t.Helper()
	init := send(t, hc, http.MethodPost, url, tsMCPHeaders("", tsOrigin), initBody).as("initialize")
	session := init.header.Get("Mcp-Session-Id")
	if init.status != http.StatusOK || session == "" {
		t.Fatalf("initialize through %s: %d %q", url, init.status, init.body)
	}
	hdr := tsMCPHeaders(session, tsOrigin)
	send(t, hc, http.MethodPost, url, hdr, tsInitializedMsg).as("notifications/initialized")
	get := send(t, hc, http.MethodGet, url, getHeaders(hdr), "").as("GET")
	call := send(t, hc, http.MethodPost, url, hdr, tsWhoamiCall).as("POST after the GET")
	return []exchange{init, get, call}
}

// getHeaders turns the headers of an MCP POST into those of the GET that
// opens the standalone SSE stream.
func getHeaders(post http.Header) http.Header {
	h := post.Clone()
	h.Del("Content-Type")
	h.Set("Accept", "text/event-stream")
	return h
}

// firstLine returns s up to its first line break.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// startHealthFleet starts two whoami servers with a health endpoint each
// (GET /healthz, 503 while the server's down file exists) behind mcp_proxy
// with active health checks and the given options, and n go-sdk client
// sessions held on them, some on each server.
func startHealthFleet(t *testing.T, options string, n int) *fleet {
	t.Helper()
	site := func(f *fleet) string {
		return fmt.Sprintf("mcp_proxy %s {\n\t\thealth_uri /healthz\n%s\n\t}", upstreams(f.srv), options)
	}
	return newFleet(t, withServers(2, true), withHealthDown(), withSite(site), withHeldSessions(n))
}

// call makes a raw whoami call of session cs through the proxy.
func (f *fleet) call(t *testing.T, cs *mcp.ClientSession) exchange {
	t.Helper()
	return send(t, f.hc, http.MethodPost, f.p.url(), mcpPOSTHeaders(cs.ID()), gunicornCallBody)
}

// waitStatus makes raw calls of cs until one gets status, and returns that
// exchange and when it came, or fails t after limit.
func (f *fleet) waitStatus(t *testing.T, cs *mcp.ClientSession, status int, limit time.Duration) (exchange, time.Time) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ex := f.call(t, cs)
		if ex.status == status {
			return ex, time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d within %v; last %d %q", status, limit, ex.status, ex.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkUnavailable asserts that ex is the proxy's 503 for an unhealthy
// upstream: a JSON-RPC error with id null, and Retry-After in seconds.
func checkUnavailable(t *testing.T, ex exchange) {
	t.Helper()
	ra, err := strconv.Atoi(ex.header.Get("Retry-After"))
	if ex.status != http.StatusServiceUnavailable || rpcErrorCode(ex.body) != caddymodule.CodeUpstreamUnavailable ||
		ex.header.Get("Content-Type") != "application/json" || err != nil || ra < 1 || ra > 60 {
		t.Fatalf("want the proxy's 503 (JSON-RPC -32003, Retry-After 1-60 s); got %d %v %q", ex.status, ex.header, ex.body)
	}
}

// mustConnect opens a new go-sdk client session through the fleet's proxy.
func mustConnect(t *testing.T, f *fleet) *mcp.ClientSession {
	t.Helper()
	cs, err := connect(context.Background(), f.p.url(), f.hc)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// sendWithHost is send with the request's Host set to host.
func sendWithHost(t testing.TB, hc *http.Client, method, url, host string, hdr map[string][]string, body string) exchange {
	t.Helper()
	return send(t, &http.Client{Transport: hostRewriter{host: host, next: hc.Transport}}, method, url, hdr, body)
}

// hostRewriter is a RoundTripper that sends every request with Host set to
// host, as a client reaching the proxy through a public name does.
type hostRewriter struct {
	host string
	next http.RoundTripper
}

func (h hostRewriter) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = h.host
	next := h.next
	if next == nil {
		next = http.DefaultTransport
	}
	return next.RoundTrip(r)
}

// behindTunnel is the mcp_proxy option for a Caddy on loopback that a
// trusted proxy or tunnel on the same machine reaches with public hostnames.
const behindTunnel = "\n\t\tlocalhost_protection off"

// corsHandler makes d answer like an MCP server with CORS for browser
// clients: preflights get 204 allowing what they ask; initialize gets an SSE
// response with a new session; every response to a request with an Origin
// allows that origin and exposes Mcp-Session-Id.
func corsHandler(d *double) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		if origin := r.Header.Get("Origin"); origin != "" {
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Expose-Headers", "Mcp-Session-Id")
			h.Set("Vary", "Origin")
		}
		switch {
		case r.Method == http.MethodOptions:
			h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE")
			h.Set("Access-Control-Allow-Headers", r.Header.Get("Access-Control-Request-Headers"))
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
		case r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "":
			h.Set("Mcp-Session-Id", d.mint())
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache, no-transform")
			w.WriteHeader(http.StatusOK)
			fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"server\":%q}}\n\n", d.name)
		default:
			d.serveMCP(w, r)
		}
	}
}

// withBearer is a RoundTripper that sends every request with
// `Authorization: Bearer <bearerToken>`.
type withBearer struct{ next http.RoundTripper }

func (b withBearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+bearerToken)
	return b.next.RoundTrip(r)
}

// resourceMetadataURL returns the URL a 401's `WWW-Authenticate: Bearer
// resource_metadata="..."` names (RFC 9728 §5.1), or "".
func resourceMetadataURL(ex exchange) string {
	_, v, ok := strings.Cut(ex.header.Get("Www-Authenticate"), `resource_metadata="`)
	if !ok {
		return ""
	}
	v, _, _ = strings.Cut(v, `"`)
	return v
}

// authTransport sends every request with Authorization set to its value,
// which a client may change mid-session (a token refresh).
type authTransport struct {
	value atomic.Pointer[string]
	next  http.RoundTripper
}

func (a *authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", *a.value.Load())
	return a.next.RoundTrip(r)
}

// clientAs returns an HTTP client whose requests carry Authorization: auth.
func clientAs(auth string) (*http.Client, *authTransport) {
	at := &authTransport{next: &http.Transport{}}
	at.value.Store(&auth)
	return &http.Client{Transport: at}, at
}

// hijack is what an attacker who knows a session ID, with other
// credentials and fresh connections, gets through the proxy.
type hijack struct {
	call, get, del exchange
}

// tryHijack sends a tool call, a GET stream and a DELETE of session with
// Authorization: auth (none when empty).
func tryHijack(t *testing.T, url, session, auth string) hijack {
	t.Helper()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	hdr := func() map[string][]string {
		h := mcpPOSTHeaders(session)
		if auth != "" {
			h["Authorization"] = []string{auth}
		}
		return h
	}
	var h hijack
	h.call = send(t, hc, http.MethodPost, url, hdr(), `{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`)
	get := hdr()
	get["Accept"] = []string{"text/event-stream"}
	delete(get, "Content-Type")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	for k, v := range get {
		req.Header[k] = v
	}
	if resp, err := hc.Do(req); err == nil {
		h.get = exchange{status: resp.StatusCode, header: resp.Header}
		if resp.StatusCode != http.StatusOK {
			b := make([]byte, 4096)
			n, _ := resp.Body.Read(b)
			h.get.body = string(b[:n])
		}
		resp.Body.Close()
	}
	h.del = send(t, hc, http.MethodDelete, url, hdr(), "")
	return h
}

// mismatches returns the table's principal mismatch counter.
func mismatches(t *testing.T, table string) float64 {
	families, _ := scrape(t)
	return metricValue(families, "caddy_mcp_principal_mismatch_total", map[string]string{"table": table})
}

// startEraBackends starts n go-sdk whoami servers (examples/whoami-server)
// serving the protocol era given (-era legacy, modern or dual), named
// <prefix>1..<prefix>n.
func startEraBackends(t testing.TB, prefix, era string, n int) []*testproc.Proc {
	t.Helper()
	return launchFleet(t, n, prefix, whoamiTimeout, func(name, addrFile string) *exec.Cmd {
		return exec.Command(whoamiBin, "-name", name, "-listen", "127.0.0.1:0", "-addr-file", addrFile, "-era", era)
	})
}

// sessionFingerprint is the plugin's name for a session ID in logs: the
// first 12 hex digits of its SHA-256.
func sessionFingerprint(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:6])
}

// logFields returns the appended fields of an access log line; a
// placeholder with no value is "".
func logFields(l map[string]any) map[string]string {
	f := map[string]string{}
	for _, k := range accessLogFields {
		f[k], _ = l[k].(string)
	}
	return f
}

// accessLog is docs/operating.md's access log: the {mcp.*} placeholders and the
// upstream appended to every line, and Mcp-Session-Id filtered out of the
// request and response headers Caddy logs.
func accessLog(file string) string {
	return fmt.Sprintf(`log {
		output file %s
		format filter {
			wrap json
			fields {
				request>headers>Mcp-Session-Id delete
				resp_headers>Mcp-Session-Id delete
			}
		}
	}
	log_append mcp_method {mcp.method}
	log_append mcp_name {mcp.name}
	log_append mcp_era {mcp.era}
	log_append mcp_protocol_version {mcp.protocol_version}
	log_append mcp_session {mcp.session_fingerprint}
	log_append mcp_pinned_upstream {mcp.pinned_upstream}
	log_append mcp_decision {mcp.decision}
	log_append upstream {http.reverse_proxy.upstream.hostport}
`, file)
}

// routingSite is docs/behaviour.md's routing-by-tool config: 2026-07-28 calls of
// the whoami tool go to pool2, everything else to pool1, both with session
// table table. matcherEras, if not empty, is an era line for the matcher.
func routingSite(logFile, table, matcherEras string, pool1, pool2 []*testproc.Proc) string {
	return accessLog(logFile) + fmt.Sprintf(`
	@whoami mcp {
		%s
		method tools/call
		name whoami
		body
	}
	mcp_proxy @whoami %[2]s {
		table %[4]s
	}
	mcp_proxy %[3]s {
		table %[4]s
	}`, matcherEras, upstreams(pool2), upstreams(pool1), table)
}

// eraReport is what one client saw in the routing test.
type eraReport struct {
	session string   // the session ID, "" when sessionless
	servers []string // the server that answered each whoami call
	err     error
}

// runEraClient connects at version and calls whoami calls times, echo once
// between calls.
func runEraClient(ctx context.Context, url string, hc *http.Client, version string, calls int) eraReport {
	cs, err := connect(ctx, url, hc, version)
	if err != nil {
		return eraReport{err: fmt.Errorf("connect: %w", err)}
	}
	defer cs.Close()
	rep := eraReport{session: cs.ID()}
	for i := range calls {
		id, err := whoami(ctx, cs)
		if err != nil {
			rep.err = fmt.Errorf("whoami call %d: %w", i+1, err)
			return rep
		}
		if id.Session != cs.ID() {
			rep.err = fmt.Errorf("whoami call %d: server %s saw session %q, the client has %q", i+1, id.Server, id.Session, cs.ID())
			return rep
		}
		rep.servers = append(rep.servers, id.Server)
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "hi"}})
		if err != nil || res.IsError {
			rep.err = fmt.Errorf("echo call %d: %v %v", i+1, err, res)
			return rep
		}
	}
	return rep
}

// runEraClients runs n clients at version concurrently.
func runEraClients(t *testing.T, url, version string, n, calls int) []eraReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	reps := make([]eraReport, n)
	var wg sync.WaitGroup
	for i := range reps {
		wg.Go(func() { reps[i] = runEraClient(ctx, url, hc, version, calls) })
	}
	wg.Wait()
	return reps
}

// checkRoutingLog checks the access log of TestRoutesOneToolToItsOwnPool.
func checkRoutingLog(t *testing.T, logFile string, pool1, pool2 []*testproc.Proc, modern, legacy []eraReport, calls int) {
	t.Helper()
	in := func(bs []*testproc.Proc, addr string) bool {
		return slices.ContainsFunc(bs, func(b *testproc.Proc) bool { return b.Addr() == addr })
	}
	fingerprints := map[string]bool{}
	for _, r := range legacy {
		fingerprints[sessionFingerprint(r.session)] = true
	}
	want := map[string]int{
		"modern_sessionless tools/call whoami balanced": len(modern) * calls,
		"modern_sessionless tools/call echo balanced":   len(modern) * calls,
		"other_sessionless initialize  learned":         len(legacy), // the matcher's body read tells its method
	}
	key := func(f map[string]string) string {
		return f["mcp_era"] + " " + f["mcp_method"] + " " + f["mcp_name"] + " " + f["mcp_decision"]
	}
	lines := waitLogLines(t, logFile, func(lines []map[string]any) bool {
		counts := map[string]int{}
		for _, l := range lines {
			counts[key(logFields(l))]++
		}
		for k, n := range want {
			if counts[k] < n {
				return false
			}
		}
		return true
	})
	counts := map[string]int{}
	for _, l := range lines {
		f := logFields(l)
		key := key(f)
		counts[key]++
		whoamiCall := f["mcp_era"] == "modern_sessionless" && f["mcp_method"] == "tools/call" && f["mcp_name"] == "whoami"
		switch {
		case whoamiCall && !in(pool2, f["upstream"]), !whoamiCall && !in(pool1, f["upstream"]):
			t.Errorf("%s went to %s", key, f["upstream"])
		case f["mcp_era"] == "modern_sessionless" && (f["mcp_protocol_version"] != "2026-07-28" || f["mcp_decision"] != "balanced" || f["mcp_session"] != ""):
			t.Errorf("2026-07-28 request logged as %v", f)
		case f["mcp_era"] == "legacy_session" && (!fingerprints[f["mcp_session"]] || f["mcp_decision"] != "pinned" || f["mcp_pinned_upstream"] != f["upstream"]):
			t.Errorf("request of a session logged as %v", f)
		case f["mcp_decision"] == "learned" && f["mcp_pinned_upstream"] != f["upstream"]:
			t.Errorf("initialize logged as %v", f)
		}
	}
	for k, n := range want {
		if counts[k] != n {
			t.Errorf("%d access log lines %q, want %d (all: %v)", counts[k], k, n, counts)
		}
	}
	raw, _ := os.ReadFile(logFile)
	for _, r := range legacy {
		if strings.Contains(string(raw), r.session) {
			t.Errorf("the access log contains session ID %s", r.session)
		}
	}
}

// tlsSiteConfig returns a Caddyfile whose one site serves body over TLS
// (Caddy's internal CA) with HTTP/1.1, HTTP/2 and HTTP/3 on
// 127.0.0.1:port, for the hosts localhost and evil.example: a DNS
// rebinding attack makes the victim's browser send the attacker's name to
// a loopback address.
func tlsSiteConfig(t testing.TB, port int, body string) string {
	return tlsSiteConfigWith(t, port, "", body)
}

// tlsSiteConfigWith is tlsSiteConfig with serverOptions (such as a
// `timeouts` block) added to the servers block of the global options.
func tlsSiteConfigWith(t testing.TB, port int, serverOptions, body string) string {
	return fmt.Sprintf(`{
	admin %s
	log {
		output discard
	}
	storage file_system %s
	skip_install_trust
	auto_https disable_redirects
	persist_config off
	servers {
		protocols h1 h2 h3
		%s
	}
}

https://localhost:%d, https://evil.example:%d {
	bind 127.0.0.1
	tls internal
	%s
}
`, adminAddr, t.TempDir(), serverOptions, port, port, body)
}

// protocols returns the set of HTTP protocols that holds only the one set by enable.
func protocols(enable func(*http.Protocols, bool)) *http.Protocols {
	p := new(http.Protocols)
	enable(p, true)
	return p
}

// waitForHTTP3 waits until the site at url answers over HTTP/3: Caddy
// starts its QUIC listener alongside the TCP one.
func waitForHTTP3(t testing.TB, h3 *http.Client, url string) {
	t.Helper()
	var err error
	answers := func() bool {
		req, _ := http.NewRequest(http.MethodOptions, url, nil)
		req.Host = "localhost"
		var resp *http.Response
		if resp, err = h3.Do(req); err == nil {
			resp.Body.Close()
		}
		return err == nil
	}
	if !testproc.Until(10*time.Second, answers) {
		t.Fatalf("no HTTP/3 answer from %s: %v", url, err)
	}
}

// gatewayConfig returns a Caddyfile whose default log goes to logFile (at
// INFO, where Caddy and the plugin log errors) and which serves two sites
// in front of the upstreams dials: mcpSite through `mcp_proxy` (table
// table), stockSite through stock `reverse_proxy`, the negative control.
func gatewayConfig(logFile string, mcpSite, stockSite proxy, table, dials string) string {
	return fmt.Sprintf(`{
	admin %s
	log {
		output file %s
	}
	auto_https off
	persist_config off
	servers {
		protocols h1 h2c
	}
}

http://:%d {
	bind 127.0.0.1
	mcp_proxy %s {
		table %s
	}
}

http://:%d {
	bind 127.0.0.1
	reverse_proxy %s
}
`, adminAddr, logFile, mcpSite.port(), dials, table, stockSite.port(), dials)
}

// newSites returns n sites on ports nothing listens on yet, for a config
// the test writes itself.
func newSites(n int) []proxy {
	ps := make([]proxy, n)
	for i := range ps {
		ps[i] = proxy{addr: fmt.Sprintf("127.0.0.1:%d", mustFreePort())}
	}
	return ps
}

// checkGatewayError asserts that ex is the proxy's JSON-RPC answer to an
// upstream failure (gateway.go): status, application/json, JSON-RPC
// error code, the request's id (as JSON text), and a message that names
// none of hidden (the upstreams' addresses) and says where the cause is.
func checkGatewayError(t testing.TB, ex exchange, status, code int, id string, hidden ...string) {
	t.Helper()
	var e struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	err := json.Unmarshal([]byte(ex.body), &e)
	if ex.status != status || ex.header.Get("Content-Type") != "application/json" || err != nil || e.JSONRPC != "2.0" ||
		e.Error.Code != code || string(e.ID) != id || !strings.Contains(e.Error.Message, "the proxy's log has the cause") {
		t.Fatalf("%s: want the proxy's %d (application/json, JSON-RPC %d, id %s, the log named); got %d %v %q",
			ex.step, status, code, id, ex.status, ex.header, ex.body)
	}
	for _, h := range append(hidden, "127.0.0.1") {
		if strings.Contains(e.Error.Message, h) {
			t.Errorf("%s: the message %q names %q, an address the client has no use for", ex.step, e.Error.Message, h)
		}
	}
}

// logLinesWith returns the lines of the JSON log file whose logger is
// logger and whose msg contains msg.
func logLinesWith(t testing.TB, file, logger, msg string) []map[string]any {
	t.Helper()
	var hits []map[string]any
	for _, l := range readLogLines(t, file) {
		if l["logger"] == logger && strings.Contains(fmt.Sprint(l["msg"]), msg) {
			hits = append(hits, l)
		}
	}
	return hits
}
