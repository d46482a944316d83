package whoami

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// connect opens a client session to url; progress notifications increment
// progress if it is non-nil.
func connect(t *testing.T, url string, progress *atomic.Int32) *mcp.ClientSession {
	t.Helper()
	opts := &mcp.ClientOptions{}
	if progress != nil {
		opts.ProgressNotificationHandler = func(context.Context, *mcp.ProgressNotificationClientRequest) {
			progress.Add(1)
		}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, opts)
	cs, err := client.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// startServer serves a whoami handler on a free loopback port.
func startServer(t *testing.T, opts Options) string {
	t.Helper()
	srv := httptest.NewServer(NewHandler(opts))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// callText calls a tool and returns its first text content.
func callText(t *testing.T, cs *mcp.ClientSession, params *mcp.CallToolParams) (string, *mcp.CallToolResult) {
	t.Helper()
	res, err := cs.CallTool(t.Context(), params)
	if err != nil {
		t.Fatalf("call %s: %v", params.Name, err)
	}
	if res.IsError || len(res.Content) == 0 {
		t.Fatalf("call %s: bad result %+v", params.Name, res)
	}
	text, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("call %s: content %T, want text", params.Name, res.Content[0])
	}
	return text.Text, res
}

func TestWhoami(t *testing.T) {
	for _, jsonMode := range []bool{false, true} {
		cs := connect(t, startServer(t, Options{Name: "s7", JSONResponse: jsonMode}), nil)
		if cs.ID() == "" {
			t.Fatal("no session ID: server should be stateful")
		}
		text, res := callText(t, cs, &mcp.CallToolParams{Name: "whoami"})
		if text != "s7" {
			t.Errorf("json=%v: text = %q, want s7", jsonMode, text)
		}
		var id Identity
		raw, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(raw, &id); err != nil {
			t.Fatalf("structured content %s: %v", raw, err)
		}
		if id != (Identity{Server: "s7", Session: cs.ID()}) {
			t.Errorf("json=%v: identity = %+v, want s7/%s", jsonMode, id, cs.ID())
		}
	}
}

func TestEcho(t *testing.T) {
	cs := connect(t, startServer(t, Options{}), nil)
	text, _ := callText(t, cs, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "héllo"}})
	if text != "héllo" {
		t.Errorf("echo = %q", text)
	}
}

func TestSlowProgress(t *testing.T) {
	for _, jsonMode := range []bool{false, true} {
		var progress atomic.Int32
		cs := connect(t, startServer(t, Options{JSONResponse: jsonMode}), &progress)
		if jsonMode {
			time.Sleep(100 * time.Millisecond) // progress travels on the GET stream
		}
		params := &mcp.CallToolParams{Name: "slow", Arguments: SlowInput{Milliseconds: 100, Steps: 4}}
		params.SetProgressToken("p1")
		start := time.Now()
		text, _ := callText(t, cs, params)
		if text != "done" {
			t.Errorf("slow = %q", text)
		}
		if d := time.Since(start); d < 100*time.Millisecond {
			t.Errorf("slow returned after %v, want >= 100ms", d)
		}
		waitFor(t, func() bool { return progress.Load() == 4 })
	}
}

// TestInitializeDelay: with InitializeDelay, opening a session takes that
// long; the calls of the session after it do not wait.
func TestInitializeDelay(t *testing.T) {
	const delay = 300 * time.Millisecond
	url := startServer(t, Options{InitializeDelay: delay})
	start := time.Now()
	cs := connect(t, url, nil)
	if took := time.Since(start); took < delay {
		t.Errorf("the session opened after %v; want at least %v", took, delay)
	}
	start = time.Now()
	callText(t, cs, &mcp.CallToolParams{Name: "whoami"})
	if took := time.Since(start); took >= delay {
		t.Errorf("a call took %v; want it not delayed", took)
	}
}

func TestSlowRejectsBadArguments(t *testing.T) {
	cs := connect(t, startServer(t, Options{}), nil)
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "slow", Arguments: SlowInput{Milliseconds: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError {
		t.Error("negative milliseconds accepted")
	}
}

// TestSessionsArePerServer checks the property the proxy exists for: a
// session ID from one server is unknown to another.
func TestSessionsArePerServer(t *testing.T) {
	cs := connect(t, startServer(t, Options{}), nil)
	other := startServer(t, Options{})
	req, _ := http.NewRequest(http.MethodDelete, other, nil)
	req.Header.Set("Mcp-Session-Id", cs.ID())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("foreign session: status %d, want 404", resp.StatusCode)
	}
}

func TestLocalhostProtection(t *testing.T) {
	url := startServer(t, Options{})
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"0"}}}`
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Host = "mcp.example"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("non-loopback Host: status %d, want 403", resp.StatusCode)
	}
}

func TestRunWritesAddrFile(t *testing.T) {
	addrFile := filepath.Join(t.TempDir(), "addr")
	ctx, cancel := context.WithCancel(t.Context())
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- Run(ctx, []string{"-name", "r1", "-addr-file", addrFile}, &out) }()
	var addr string
	waitFor(t, func() bool {
		b, err := os.ReadFile(addrFile)
		addr = strings.TrimSpace(string(b))
		return err == nil && addr != ""
	})
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("addr = %q, want 127.0.0.1:port", addr)
	}
	cs := connect(t, "http://"+addr+"/", nil)
	if text, _ := callText(t, cs, &mcp.CallToolParams{Name: "whoami"}); text != "r1" {
		t.Errorf("whoami = %q", text)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if want := "whoami r1 listening on http://" + addr + "/mcp\n"; out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := ParseFlags(nil)
	if err != nil || cfg.Listen != "127.0.0.1:0" || cfg.Options.Name != "whoami" || cfg.Options.JSONResponse || cfg.Options.SessionTimeout != 0 {
		t.Errorf("defaults: %+v, %v", cfg, err)
	}
	cfg, err = ParseFlags([]string{"-json", "-name", "a", "-listen", "127.0.0.1:1", "-addr-file", "f"})
	if err != nil || !cfg.Options.JSONResponse || cfg.Options.Name != "a" || cfg.Listen != "127.0.0.1:1" || cfg.AddrFile != "f" {
		t.Errorf("flags: %+v, %v", cfg, err)
	}
	if cfg, err := ParseFlags([]string{"-session-timeout", "5s"}); err != nil || cfg.Options.SessionTimeout != 5*time.Second {
		t.Errorf("-session-timeout 5s: %+v, %v", cfg, err)
	}
	if cfg, err := ParseFlags([]string{"-initialize-delay", "6s"}); err != nil || cfg.Options.InitializeDelay != 6*time.Second {
		t.Errorf("-initialize-delay 6s: %+v, %v", cfg, err)
	}
	if _, err := ParseFlags([]string{"extra"}); err == nil {
		t.Error("extra argument accepted")
	}
	if cfg, err = ParseFlags([]string{"-transport", "sse"}); err != nil || cfg.Options.Transport != TransportSSE {
		t.Errorf("-transport sse: %+v, %v", cfg, err)
	}
	if _, err := ParseFlags([]string{"-transport", "websocket"}); err == nil {
		t.Error("-transport websocket accepted")
	}
}

// waitFor polls cond for up to 5 seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 5s")
}

// TestServeStopsPromptly checks that an idle, never-used connection (as
// client HTTP pools keep) and an open GET stream do not delay shutdown.
func TestServeStopsPromptly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, Options{}) }()
	cs := connect(t, "http://"+ln.Addr().String()+"/mcp", nil) // opens a GET stream
	callText(t, cs, &mcp.CallToolParams{Name: "whoami"})
	spare, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer spare.Close()
	time.Sleep(50 * time.Millisecond) // let the server see the spare connection
	start := time.Now()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("shutdown took %v", d)
	}
}

// connectAt opens a client session to url at protocol version (the client's
// default, 2026-07-28, when empty); tool list changes are sent to changed.
func connectAt(t *testing.T, url, version string, changed chan<- string) *mcp.ClientSession {
	t.Helper()
	opts := &mcp.ClientOptions{}
	if changed != nil {
		opts.ToolListChangedHandler = func(context.Context, *mcp.ToolListChangedRequest) { changed <- "tools" }
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, opts)
	cs, err := client.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: url}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect at %q: %v", version, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestEras checks which clients get sessions from each era of server.
func TestEras(t *testing.T) {
	for _, tc := range []struct {
		era           string
		legacySession bool // a 2025-11-25 client gets a session
		modernSession bool // a default (2026-07-28) client gets a session
	}{
		{era: EraLegacy, legacySession: true, modernSession: true}, // the default client falls back to initialize
		{era: EraModern},
		{era: EraDual, legacySession: true},
	} {
		url := startServer(t, Options{Name: "s", Era: tc.era})
		for _, c := range []struct {
			version string
			want    bool
		}{{"2025-11-25", tc.legacySession}, {"", tc.modernSession}} {
			cs := connectAt(t, url, c.version, nil)
			if got := cs.ID() != ""; got != c.want {
				t.Errorf("era %s, client at %q: session %v, want %v", tc.era, c.version, got, c.want)
			}
			if text, _ := callText(t, cs, &mcp.CallToolParams{Name: "whoami"}); text != "s" {
				t.Errorf("era %s, client at %q: whoami = %q", tc.era, c.version, text)
			}
		}
	}
}

// TestAddToolNotifiesListeners checks that add_tool reaches a 2026-07-28
// client's subscriptions/listen stream.
func TestAddToolNotifiesListeners(t *testing.T) {
	url := startServer(t, Options{Era: EraModern})
	changed := make(chan string, 4)
	connectAt(t, url, "", changed)
	caller := connectAt(t, url, "", nil)
	if text, _ := callText(t, caller, &mcp.CallToolParams{Name: "add_tool", Arguments: map[string]any{"name": "extra"}}); text != "added extra" {
		t.Fatalf("add_tool = %q", text)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no notifications/tools/list_changed on the listening client")
	}
}

// TestHealthEndpoint: GET /healthz answers 200 while the down file is
// absent and 503 while it exists; the MCP endpoint is not the health
// endpoint (a GET without a session there gets 400).
func TestHealthEndpoint(t *testing.T) {
	down := filepath.Join(t.TempDir(), "down")
	srv := httptest.NewServer(NewHandler(Options{Name: "h", DownFile: down}))
	defer srv.Close()
	status := func(path string) int {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status("/healthz"); got != http.StatusOK {
		t.Errorf("/healthz without the down file: %d, want 200", got)
	}
	if err := os.WriteFile(down, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := status("/healthz"); got != http.StatusServiceUnavailable {
		t.Errorf("/healthz with the down file: %d, want 503", got)
	}
	if got := status("/mcp"); got != http.StatusBadRequest {
		t.Errorf("GET /mcp without a session: %d, want 400", got)
	}
}
