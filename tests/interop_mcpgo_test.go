package tests

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpGoVersion is the mcp-go version these tests build against (go.mod).
const mcpGoVersion = "v1.2.1"

func init() {
	name := os.Getenv(mcpGoServerNameEnv)
	if name == "" {
		return
	}
	if err := serveMCPGo(name, os.Getenv(mcpGoServerModeEnv), os.Getenv(mcpGoServerAddrEnv)); err != nil {
		fmt.Fprintln(os.Stderr, "mcp-go server:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// TestInteropMCPGoStateful runs go-sdk clients through mcp_proxy against
// three stateful mcp-go servers (server.WithStateful(true), separate
// processes): every session works and every call is answered by the server
// that created the session. Stock round_robin breaks the same sessions, and
// default go-sdk clients, which negotiate the sessionless 2026-07-28
// protocol with mcp-go, pass through mcp_proxy unpinned.
func TestInteropMCPGoStateful(t *testing.T) {
	servers := startMCPGoServers(t, "mg", mcpGoModeStateful, 3)

	p := startProxy(t, "mcp_proxy "+upstreams(servers))
	res := runSessions(t, p.url(), peerSessions, sessionPlan{calls: peerCalls, version: peerLegacyProtocol})
	t.Logf("mcp_proxy, protocol %s: %s", peerLegacyProtocol, res)
	if res.ok != peerSessions || res.onCreator != peerTotalCalls || res.sessioned != peerSessions || len(res.perServer) != 3 {
		t.Fatalf("want %d/%d sessions ok with a session ID and %d calls on the creating server, spread over 3 servers; got %s",
			peerSessions, peerSessions, peerTotalCalls, res)
	}
	for _, r := range res.reports {
		if !strings.HasPrefix(r.id, mcpGoIDPrefix) {
			t.Fatalf("session ID %q is not an mcp-go ID", r.id)
		}
	}

	// Negative control: stock round_robin sends later requests to servers
	// that never saw the session, and stateful mcp-go refuses them (404).
	p = startProxy(t, stockRoundRobin(servers))
	rr := runSessions(t, p.url(), peerSessions, sessionPlan{calls: peerCalls, version: peerLegacyProtocol})
	t.Logf("stock round_robin: %s", rr)
	if rr.failed == 0 {
		t.Fatalf("stock round_robin: want broken sessions with stateful mcp-go; got %s", rr)
	}

	// The go-sdk client's default protocol (2026-07-28) is sessionless with
	// mcp-go: no Mcp-Session-Id, so requests are balanced and still work.
	p = startProxy(t, "mcp_proxy "+upstreams(servers))
	modern := runSessions(t, p.url(), mcpGoModernRuns, sessionPlan{calls: peerCalls})
	t.Logf("mcp_proxy, client default protocol: %s", modern)
	if modern.failed != 0 || modern.sessioned != 0 || modern.calls != mcpGoModernRuns*peerCalls || len(modern.answered) != 3 {
		t.Fatalf("client default protocol: want %d sessionless sessions and %d calls answered, balanced over 3 servers; got %s",
			mcpGoModernRuns, mcpGoModernRuns*peerCalls, modern)
	}

	recordInterop(interopRow{
		Server: fmt.Sprintf("mcp-go %s, `WithStateful(true)` (3 processes)", mcpGoVersion),
		Client: fmt.Sprintf("go-sdk %s, protocol %s", goSDKVersion, peerLegacyProtocol),
		Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the session's server (stock `round_robin`: sessions break)",
			res.ok, peerSessions, res.onCreator, peerTotalCalls),
	})
	recordInterop(interopRow{
		Server: fmt.Sprintf("mcp-go %s, `WithStateful(true)` (3 processes)", mcpGoVersion),
		Client: fmt.Sprintf("go-sdk %s, default protocol (negotiates 2026-07-28)", goSDKVersion),
		Result: fmt.Sprintf("%d/%d sessions ok, sessionless: no `Mcp-Session-Id`, requests balanced; %d/%d calls answered",
			mcpGoModernRuns-modern.failed, mcpGoModernRuns, modern.calls, mcpGoModernRuns*peerCalls),
	})
}

// TestInteropMCPGoDefaultSessionManager covers mcp-go's default session
// manager (StatelessGeneratingSessionIdManager): it mints session IDs but
// accepts any well-formed ID, so a request that reaches the wrong server
// succeeds and silently loses the session's state. The whoami tool names the
// server, so misroutes are visible: through mcp_proxy none happens; through
// stock round_robin they happen, without any error.
func TestInteropMCPGoDefaultSessionManager(t *testing.T) {
	servers := startMCPGoServers(t, "mgd", mcpGoModeDefault, 3)

	// The premise: a default mcp-go server answers a session it never minted.
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	made := mcpGoIDPrefix + "00000000-0000-4000-8000-000000000000"
	ex := send(t, hc, http.MethodPost, servers[0].URL(),
		mcpPOSTHeaders(made),
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`)
	if ex.status != http.StatusOK || !strings.Contains(ex.body, made) {
		t.Fatalf("default mcp-go with a made-up session: want 200 answered for it; got %d %s", ex.status, ex.body)
	}

	p := startProxy(t, "mcp_proxy "+upstreams(servers))
	res := runSessions(t, p.url(), peerSessions, sessionPlan{calls: peerCalls, version: peerLegacyProtocol})
	t.Logf("mcp_proxy: %s", res)
	if res.ok != peerSessions || res.onCreator != peerTotalCalls || res.misrouted != 0 || res.sessioned != peerSessions {
		t.Fatalf("mcp_proxy: want %d/%d sessions ok and %d calls on the creating server, 0 misrouted; got %s",
			peerSessions, peerSessions, peerTotalCalls, res)
	}

	// Negative control: stock round_robin misroutes calls, and nothing fails.
	p = startProxy(t, stockRoundRobin(servers))
	rr := runSessions(t, p.url(), peerSessions, sessionPlan{calls: peerCalls, version: peerLegacyProtocol})
	t.Logf("stock round_robin: %s", rr)
	if rr.failed != 0 || rr.misrouted == 0 || rr.calls != peerTotalCalls {
		t.Fatalf("stock round_robin: want every call answered without error and some misrouted; got %s", rr)
	}
	for _, err := range rr.errs {
		if errors.Is(err, mcp.ErrSessionMissing) {
			t.Fatalf("stock round_robin: unexpected session error: %v", err)
		}
	}

	recordInterop(interopRow{
		Server: fmt.Sprintf("mcp-go %s, default session manager: accepts any well-formed ID (3 processes)", mcpGoVersion),
		Client: fmt.Sprintf("go-sdk %s, protocol %s", goSDKVersion, peerLegacyProtocol),
		Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the session's server, 0 misrouted (stock `round_robin`: calls silently answered by other servers)",
			res.ok, peerSessions, res.onCreator, peerTotalCalls),
	})
}
