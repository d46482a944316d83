package tests

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	mgmcp "github.com/mark3labs/mcp-go/mcp"
	mgserver "github.com/mark3labs/mcp-go/server"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// mcpGoVersion is the mcp-go version these tests build against (go.mod).
const mcpGoVersion = "v1.2.1"

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
