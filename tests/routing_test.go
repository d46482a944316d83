package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

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

// accessLogFields are the access log fields the routing site appends.
var accessLogFields = []string{"mcp_method", "mcp_name", "mcp_era", "mcp_protocol_version", "mcp_session", "mcp_pinned_upstream", "mcp_decision", "upstream"}

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

// TestRoutesOneToolToItsOwnPool is docs/behaviour.md's "Routing by tool": the
// go-sdk client's 2026-07-28 calls of one tool go to a second pool of
// sessionless servers, while legacy clients' sessions stay pinned to the
// dual-era servers that created them, calls of that tool included. The
// access log shows every {mcp.*} placeholder, and never a session ID.
func TestRoutesOneToolToItsOwnPool(t *testing.T) {
	pool1 := startEraBackends(t, "p1-", "dual", 2)
	pool2 := startEraBackends(t, "p2-", "modern", 2)
	logFile := filepath.Join(t.TempDir(), "access.log")
	p := startProxy(t, routingSite(logFile, "routing-pools", "", pool1, pool2))

	const clients, calls = 6, 4
	modern := runEraClients(t, p.url(), "", clients, calls)
	legacy := runEraClients(t, p.url(), "2025-11-25", clients, calls)
	for _, r := range modern {
		if r.err != nil || r.session != "" {
			t.Fatalf("modern client: session %q, error %v", r.session, r.err)
		}
		for _, s := range r.servers {
			if !strings.HasPrefix(s, "p2-") {
				t.Errorf("a 2026-07-28 whoami call was answered by %s, want the whoami pool (p2-*)", s)
			}
		}
	}
	for _, r := range legacy {
		if r.err != nil || r.session == "" {
			t.Fatalf("legacy client: session %q, error %v", r.session, r.err)
		}
		if !strings.HasPrefix(r.servers[0], "p1-") || slices.ContainsFunc(r.servers, func(s string) bool { return s != r.servers[0] }) {
			t.Errorf("legacy session's whoami calls answered by %v, want all by the p1-* server that created it", r.servers)
		}
	}
	checkRoutingLog(t, logFile, pool1, pool2, modern, legacy, calls)

	// Per-method metrics: the modern calls by method; the legacy initialize
	// too, whose body the matcher read; the legacy sessions' requests as
	// unknown, since the matcher leaves them alone.
	families, _ := scrape(t)
	for _, w := range []struct {
		method, code string
		n            float64
	}{
		{"tools/call", "200", clients * calls * 2},
		{"server/discover", "200", clients},
		{"initialize", "200", clients},
	} {
		got := metricValue(families, "caddy_mcp_requests_by_method_total", map[string]string{"table": "routing-pools", "method": w.method, "code": w.code})
		if got != w.n {
			t.Errorf("caddy_mcp_requests_by_method_total{method=%q,code=%q} = %v, want %v", w.method, w.code, got, w.n)
		}
	}
	if got := metricValue(families, "caddy_mcp_requests_by_method_total", map[string]string{"table": "routing-pools", "method": "unknown", "code": "200"}); got < clients*calls*2 {
		t.Errorf("legacy sessions' requests counted as method unknown: %v, want at least %d", got, clients*calls*2)
	}
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
	lines := readLogLines(t, logFile)
	counts := map[string]int{}
	for _, l := range lines {
		f := logFields(l)
		key := f["mcp_era"] + " " + f["mcp_method"] + " " + f["mcp_name"] + " " + f["mcp_decision"]
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
	want := map[string]int{
		"modern_sessionless tools/call whoami balanced": len(modern) * calls,
		"modern_sessionless tools/call echo balanced":   len(modern) * calls,
		"other_sessionless initialize  learned":         len(legacy), // the matcher's body read tells its method
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

// TestRoutingThatSplitsSessions shows what docs/behaviour.md warns about: a
// matcher that also selects requests of legacy sessions (era
// legacy_session) sends a session's calls of the routed tool to a pool that
// does not hold the session. The proxy then answers 404 and drops the
// session, and the client must start over. The same calls with the
// docs/behaviour.md's matcher (legacy sessions excluded, the default) keep working.
func TestRoutingThatSplitsSessions(t *testing.T) {
	pool1 := startEraBackends(t, "p1-", "dual", 2)
	pool2 := startEraBackends(t, "p2-", "modern", 1)
	logFile := filepath.Join(t.TempDir(), "access.log")
	port := mustFreePort()
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	for _, tc := range []struct {
		eras  string
		split bool
	}{
		{eras: "", split: false},
		{eras: "era legacy_session modern_sessionless other_sessionless", split: true},
	} {
		loadCaddyfile(t, siteConfig(port, routingSite(logFile, "routing-split", tc.eras, pool1, pool2)))
		rep := runEraClients(t, url, "2025-11-25", 1, 2)[0]
		if !tc.split {
			if rep.err != nil {
				t.Errorf("matcher %q: legacy session broke: %v", tc.eras, rep.err)
			}
			continue
		}
		if rep.err == nil || !strings.Contains(rep.err.Error(), "whoami call 1") {
			t.Errorf("matcher %q: the session's first whoami call succeeded (%v, err %v); want it sent to the other pool and refused", tc.eras, rep.servers, rep.err)
		}
		var gone []map[string]any
		for _, l := range readLogLines(t, logFile) {
			if l["mcp_decision"] == "gone" {
				gone = append(gone, l)
			}
		}
		if len(gone) != 1 || gone[0]["status"] != 404.0 || logFields(gone[0])["mcp_method"] != "tools/call" {
			t.Errorf("matcher %q: %d requests logged as gone (%v), want the whoami call answered 404 by the proxy", tc.eras, len(gone), gone)
		}
	}
}

// TestMismatchAnsweredByProxy sends a 2026-07-28 request whose Mcp-Name
// disagrees with its body, and one with a body over the matcher's bound,
// through the routing site: the proxy answers them itself, 400 with
// JSON-RPC error -32020 and 413, and no upstream sees them.
func TestMismatchAnsweredByProxy(t *testing.T) {
	pool1 := startEraBackends(t, "p1-", "dual", 1)
	pool2 := startEraBackends(t, "p2-", "modern", 1)
	logFile := filepath.Join(t.TempDir(), "access.log")
	p := startProxy(t, routingSite(logFile, "routing-mismatch", "", pool1, pool2))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	hdr := map[string][]string{
		"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"echo"},
		"Accept": {"application/json, text/event-stream"},
	}
	call := func(tool, args string) string {
		return `{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args +
			`,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	}
	for _, tc := range []struct {
		name, body string
		status     int
		code       int
		message    string
	}{
		{name: "header says echo, body calls whoami", body: call("whoami", `{}`), status: 400, code: -32020, message: `Mcp-Name header value "echo" does not match body value "whoami"`},
		{name: "body over 4 MiB", body: call("echo", `{"message":"`+strings.Repeat("x", 5<<20)+`"}`), status: 413, code: -32600, message: "larger than 4194304 bytes"},
		{name: "consistent", body: call("echo", `{"message":"hi"}`), status: 200},
	} {
		ex := send(t, hc, http.MethodPost, p.url(), hdr, tc.body)
		if ex.status != tc.status {
			t.Errorf("%s: status %d, want %d: %.200s", tc.name, ex.status, tc.status, ex.body)
			continue
		}
		if tc.status == 200 {
			continue
		}
		var body struct {
			ID    json.RawMessage `json:"id"`
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(ex.body), &body); err != nil || body.Error.Code != tc.code || !strings.Contains(body.Error.Message, tc.message) {
			t.Errorf("%s: body %s, want error %d containing %q", tc.name, ex.body, tc.code, tc.message)
		}
		if tc.status == 400 && string(body.ID) != "41" {
			t.Errorf("%s: error id %s, want the request's 41", tc.name, body.ID)
		}
	}
	for _, l := range readLogLines(t, logFile) {
		f := logFields(l)
		rejected := f["mcp_decision"] == "rejected"
		if rejected != (l["status"] != 200.0) || rejected && f["upstream"] != "" {
			t.Errorf("logged %v %v %q: want the refused requests rejected by the proxy, with no upstream", l["status"], f["mcp_decision"], f["upstream"])
		}
	}
}
