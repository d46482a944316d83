package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mgmcp "github.com/mark3labs/mcp-go/mcp"
	mgserver "github.com/mark3labs/mcp-go/server"
	"github.com/modelcontextprotocol/go-sdk/mcp"
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
	var opts []mgserver.StreamableHTTPOption
	switch mode {
	case mcpGoModeStateful:
		opts = append(opts, mgserver.WithStateful(true))
	case mcpGoModeDefault:
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	tmp := addrFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(ln.Addr().String()), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, addrFile); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mgserver.NewStreamableHTTPServer(s, opts...))
	return http.Serve(ln, mux)
}

// mcpGoServer is one mcp-go server process.
type mcpGoServer struct {
	name string
	addr string
	cmd  *exec.Cmd
	out  *bytes.Buffer
}

// startMCPGoServers starts n mcp-go whoami servers named <prefix>1..<prefix>n
// in mode, as separate processes, and waits until they listen.
func startMCPGoServers(t *testing.T, prefix, mode string, n int) []*mcpGoServer {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	servers := make([]*mcpGoServer, n)
	for i := range servers {
		name := fmt.Sprintf("%s%d", prefix, i+1)
		addrFile := filepath.Join(dir, name+".addr")
		s := &mcpGoServer{name: name, cmd: exec.Command(exe), out: new(bytes.Buffer)}
		s.cmd.Env = append(os.Environ(),
			mcpGoServerNameEnv+"="+name, mcpGoServerModeEnv+"="+mode, mcpGoServerAddrEnv+"="+addrFile)
		s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
		if err := s.cmd.Start(); err != nil {
			t.Fatalf("starting mcp-go server %s: %v", name, err)
		}
		t.Cleanup(func() {
			_ = s.cmd.Process.Signal(syscall.SIGKILL)
			_ = s.cmd.Wait()
		})
		servers[i] = s
	}
	deadline := time.Now().Add(mcpGoStartTimeout)
	for _, s := range servers {
		addrFile := filepath.Join(dir, s.name+".addr")
		for s.addr == "" {
			if data, err := os.ReadFile(addrFile); err == nil {
				s.addr = strings.TrimSpace(string(data))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("mcp-go server %s did not start: %s", s.name, s.out)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return servers
}

// mcpGoAddrs returns the servers' addresses, space-separated, for a Caddyfile.
func mcpGoAddrs(servers []*mcpGoServer) string {
	s := make([]string, len(servers))
	for i, srv := range servers {
		s[i] = srv.addr
	}
	return strings.Join(s, " ")
}

// roundRobinSite is a Caddyfile site body: stock reverse_proxy, no affinity.
func roundRobinSite(upstreams string) string {
	return "reverse_proxy " + upstreams + " {\n\t\tlb_policy round_robin\n\t}"
}

// creatorReport is the outcome of one client session that checks every call
// against the server that answered initialize (its serverInfo.name), not
// just against the first call.
type creatorReport struct {
	creator   string   // serverInfo.name of the initialize response
	sessionID string   // the client's session ID; "" when sessionless
	calls     int      // calls answered
	onCreator int      // calls answered by the creator, seeing the client's session ID
	misrouted int      // calls answered by another server or for another session, without error
	answered  []string // the server that answered each call
	err       error    // the first failure, if any
}

// runCreatorSession connects with protocol version version ("" for the
// client's default), calls whoami calls times, and closes the session. It
// keeps going after a misrouted call: servers that accept any session ID
// answer misrouted calls without error.
func runCreatorSession(ctx context.Context, url string, hc *http.Client, version string, calls int) creatorReport {
	client := mcp.NewClient(&mcp.Implementation{Name: "affinity-interop", Version: "v0"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		return creatorReport{err: fmt.Errorf("connect: %w", err)}
	}
	defer cs.Close()
	rep := creatorReport{sessionID: cs.ID()}
	if init := cs.InitializeResult(); init != nil && init.ServerInfo != nil {
		rep.creator = init.ServerInfo.Name
	}
	for i := range calls {
		id, err := whoami(ctx, cs)
		if err != nil {
			rep.err = fmt.Errorf("call %d: %w", i+1, err)
			return rep
		}
		rep.calls++
		rep.answered = append(rep.answered, id.Server)
		if id.Server == rep.creator && id.Session == rep.sessionID {
			rep.onCreator++
		} else {
			rep.misrouted++
		}
	}
	return rep
}

// creatorResult sums up a run of concurrent sessions.
type creatorResult struct {
	reports   []creatorReport
	ok        int // sessions with no error and every call on the creator
	failed    int // sessions that ended in an error
	calls     int // calls answered
	onCreator int
	misrouted int
	sessioned int            // sessions with a session ID
	perServer map[string]int // sessions per creating server
	answered  map[string]int // calls per answering server
	errs      []error
}

func (r creatorResult) String() string {
	var first error
	if len(r.errs) > 0 {
		first = r.errs[0]
	}
	return fmt.Sprintf("%d/%d sessions ok, %d failed, %d with a session ID; calls: %d answered, %d on the creating server, %d misrouted; sessions per creating server %v; calls per answering server %v; first error: %v",
		r.ok, len(r.reports), r.failed, r.sessioned, r.calls, r.onCreator, r.misrouted, r.perServer, r.answered, first)
}

// runCreatorSessions runs sessions concurrent sessions of calls whoami calls each.
func runCreatorSessions(t *testing.T, url, version string, sessions, calls int) creatorResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	res := creatorResult{reports: make([]creatorReport, sessions), perServer: map[string]int{}, answered: map[string]int{}}
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() { res.reports[i] = runCreatorSession(ctx, url, hc, version, calls) })
	}
	wg.Wait()
	for _, r := range res.reports {
		res.calls += r.calls
		res.onCreator += r.onCreator
		res.misrouted += r.misrouted
		if r.sessionID != "" {
			res.sessioned++
		}
		if r.creator != "" {
			res.perServer[r.creator]++
		}
		for _, srv := range r.answered {
			res.answered[srv]++
		}
		switch {
		case r.err != nil:
			res.failed++
			res.errs = append(res.errs, r.err)
		case r.misrouted == 0:
			res.ok++
		}
	}
	return res
}

// TestInteropMCPGoStateful runs go-sdk clients through mcp_proxy against
// three stateful mcp-go servers (server.WithStateful(true), separate
// processes): every session works and every call is answered by the server
// that created the session. Stock round_robin breaks the same sessions, and
// default go-sdk clients, which negotiate the sessionless 2026-07-28
// protocol with mcp-go, pass through mcp_proxy unpinned.
func TestInteropMCPGoStateful(t *testing.T) {
	servers := startMCPGoServers(t, "mg", mcpGoModeStateful, 3)

	p := startProxy(t, "mcp_proxy "+mcpGoAddrs(servers))
	res := runCreatorSessions(t, p.url(), peerLegacyProtocol, peerSessions, peerCalls)
	t.Logf("mcp_proxy, protocol %s: %s", peerLegacyProtocol, res)
	if res.ok != peerSessions || res.onCreator != peerTotalCalls || res.sessioned != peerSessions || len(res.perServer) != 3 {
		t.Fatalf("want %d/%d sessions ok with a session ID and %d calls on the creating server, spread over 3 servers; got %s",
			peerSessions, peerSessions, peerTotalCalls, res)
	}
	for _, r := range res.reports {
		if !strings.HasPrefix(r.sessionID, mcpGoIDPrefix) {
			t.Fatalf("session ID %q is not an mcp-go ID", r.sessionID)
		}
	}

	// Negative control: stock round_robin sends later requests to servers
	// that never saw the session, and stateful mcp-go refuses them (404).
	p = startProxy(t, roundRobinSite(mcpGoAddrs(servers)))
	rr := runCreatorSessions(t, p.url(), peerLegacyProtocol, peerSessions, peerCalls)
	t.Logf("stock round_robin: %s", rr)
	if rr.failed == 0 {
		t.Fatalf("stock round_robin: want broken sessions with stateful mcp-go; got %s", rr)
	}

	// The go-sdk client's default protocol (2026-07-28) is sessionless with
	// mcp-go: no Mcp-Session-Id, so requests are balanced and still work.
	p = startProxy(t, "mcp_proxy "+mcpGoAddrs(servers))
	modern := runCreatorSessions(t, p.url(), "", mcpGoModernRuns, peerCalls)
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
	ex := send(t, hc, http.MethodPost, "http://"+servers[0].addr+"/mcp",
		map[string][]string{"Mcp-Session-Id": {made}, "Accept": {"application/json, text/event-stream"}, "Mcp-Protocol-Version": {peerLegacyProtocol}},
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`)
	if ex.status != http.StatusOK || !strings.Contains(ex.body, made) {
		t.Fatalf("default mcp-go with a made-up session: want 200 answered for it; got %d %s", ex.status, ex.body)
	}

	p := startProxy(t, "mcp_proxy "+mcpGoAddrs(servers))
	res := runCreatorSessions(t, p.url(), peerLegacyProtocol, peerSessions, peerCalls)
	t.Logf("mcp_proxy: %s", res)
	if res.ok != peerSessions || res.onCreator != peerTotalCalls || res.misrouted != 0 || res.sessioned != peerSessions {
		t.Fatalf("mcp_proxy: want %d/%d sessions ok and %d calls on the creating server, 0 misrouted; got %s",
			peerSessions, peerSessions, peerTotalCalls, res)
	}

	// Negative control: stock round_robin misroutes calls, and nothing fails.
	p = startProxy(t, roundRobinSite(mcpGoAddrs(servers)))
	rr := runCreatorSessions(t, p.url(), peerLegacyProtocol, peerSessions, peerCalls)
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
