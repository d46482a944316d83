// Package whoami is a small, stateful MCP server used to demonstrate and test
// session affinity. Every server process keeps its own in-memory sessions
// (the go-sdk default), so a request that reaches a different process than
// the one that created its session fails with 404 "session not found".
//
// The server offers these tools:
//
//   - whoami: reports the server's name and the session ID it sees;
//   - echo: returns its message argument;
//   - slow: sends progress notifications over a period of time, then
//     returns "done", to exercise streaming through a proxy;
//   - add_tool: adds a tool, so that the server notifies clients listening
//     for tool list changes (notifications/tools/list_changed);
//   - open_counter and count: a handle to state in this process's memory,
//     minted in structuredContent and passed back in an argument marked
//     x-mcp-header (handles.go).
//
// By default it speaks the session-based protocol (up to 2025-11-25); see
// [Options.Era] for MCP 2026-07-28's sessionless protocol.
package whoami

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Version is the implementation version the server reports in initialize.
const Version = "v1.0.0"

// Limits applied to the slow tool's arguments, so that a single call cannot
// tie up a server for long.
const (
	// MaxSlowMilliseconds caps the duration of one slow call.
	MaxSlowMilliseconds = 10 * 60 * 1000
	// MaxSlowSteps caps the number of progress notifications of one slow call.
	MaxSlowSteps = 10000
)

// Options configures a whoami server.
type Options struct {
	// Name identifies the server; the whoami tool returns it. Empty means
	// "whoami".
	Name string
	// JSONResponse makes the server answer POSTs with application/json
	// instead of text/event-stream (go-sdk StreamableHTTPOptions.JSONResponse).
	// Notifications such as progress then travel on the standalone GET stream.
	JSONResponse bool
	// Era selects the protocol eras served: EraLegacy (the default)
	// keeps sessions in memory and answers 2026-07-28 requests with 400
	// -32022, as go-sdk's stateful servers do; EraModern serves every
	// request statelessly, 2026-07-28 included (go-sdk's Stateless); EraDual
	// serves 2026-07-28 requests statelessly and older ones with sessions.
	Era string
	// Transport selects the HTTP transport: TransportStreamable (the
	// default) or TransportSSE, the legacy HTTP+SSE transport of protocol
	// 2024-11-05 (go-sdk SSEHandler: a GET opens the session's stream, whose
	// `endpoint` event names `<path>?sessionid=<id>` for the POSTs). Era
	// applies to Streamable HTTP only.
	Transport string
	// DownFile, if set, names a file whose presence makes the health
	// endpoint, GET /healthz, answer 503: a maintenance switch for health
	// checks. The MCP endpoint keeps serving.
	DownFile string
	// SessionTimeout closes a session idle for this long (go-sdk
	// StreamableHTTPOptions.SessionTimeout); 0 keeps sessions until DELETE.
	SessionTimeout time.Duration
	// BearerToken, if set, makes the MCP endpoint an OAuth protected
	// resource that accepts this one bearer token (see ProtectedByHost).
	BearerToken string
	// InitializeDelay makes the server wait this long before it answers
	// initialize, as a server with a cold start or a slow per-session setup
	// does; each initialize is logged to stderr ("whoami: initialize").
	InitializeDelay time.Duration
	// AnyHost turns off go-sdk's DNS-rebinding protection
	// (StreamableHTTPOptions.DisableLocalhostProtection), which refuses a
	// request that arrived on loopback with a Host that is not loopback.
	AnyHost bool
	// MaxSessions, if positive, caps the live sessions: an initialize past
	// it gets 503 with Retry-After, as the Python MCP SDK 2.2 answers at its
	// cap; only a DELETE frees a slot. 0 is no cap.
	MaxSessions int
	// InitializeStatus, if not 0, is the status every initialize gets (with
	// a JSON-RPC error and no session), as from a server whose dependency
	// is down.
	InitializeStatus int
}

// Values of Options.Era.
const (
	// EraLegacy serves sessions (protocol 2025-03-26 to 2025-11-25).
	EraLegacy = "legacy"
	// EraModern serves every request without sessions (MCP 2026-07-28 and stateless older requests).
	EraModern = "modern"
	// EraDual serves 2026-07-28 requests without sessions and older ones with sessions.
	EraDual = "dual"
)

// Values of Options.Transport.
const (
	// TransportStreamable is Streamable HTTP (protocol 2025-03-26 and later).
	TransportStreamable = "streamable"
	// TransportSSE is the legacy HTTP+SSE transport (protocol 2024-11-05).
	TransportSSE = "sse"
)

// Identity is the structured output of the whoami tool.
type Identity struct {
	// Server is the name of the server that handled the call.
	Server string `json:"server" jsonschema:"name of the server that handled the call"`
	// Session is the MCP session ID as the server sees it.
	Session string `json:"session" jsonschema:"MCP session ID as the server sees it"`
}

// EchoInput is the input of the echo tool.
type EchoInput struct {
	// Message is returned unchanged.
	Message string `json:"message" jsonschema:"text to echo back"`
}

// SlowInput is the input of the slow tool.
type SlowInput struct {
	// Milliseconds is the total duration of the call.
	Milliseconds int `json:"milliseconds,omitempty" jsonschema:"total duration of the call in milliseconds"`
	// Steps is the number of progress notifications to send, evenly spread
	// across Milliseconds, when the request carries a progress token.
	Steps int `json:"steps,omitempty" jsonschema:"number of progress notifications to send"`
}

// NewHandler returns an http.Handler serving the whoami MCP server over
// Streamable HTTP at any path but /healthz, its health endpoint for a
// proxy's active health checks (see HealthHandler), and, for a server with
// a session cap, /capz, which answers its counts (see CapStats). Sessions
// are kept in memory. DNS-rebinding protection stays on unless opts.AnyHost: requests
// arriving on a loopback address must carry a loopback Host header.
func NewHandler(opts Options) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", HealthHandler(opts.DownFile))
	inner := capped(mcpHandler(opts), opts)
	if c, ok := inner.(*sessionCap); ok {
		mux.HandleFunc("GET /capz", c.stats)
	}
	if opts.BearerToken == "" {
		mux.Handle("/", inner)
		return mux
	}
	mux.Handle("GET "+ResourceMetadataPrefix+"/", ResourceMetadataHandler())
	mux.Handle("/", ProtectedByHost(opts.BearerToken, inner))
	return mux
}

// mcpHandler serves the whoami MCP server for the protocol eras of opts.
func mcpHandler(opts Options) http.Handler {
	server := NewServer(opts.Name)
	if opts.InitializeDelay > 0 {
		server.AddReceivingMiddleware(delayInitialize(opts.InitializeDelay))
	}
	getServer := func(*http.Request) *mcp.Server { return server }
	if opts.Transport == TransportSSE {
		return mcp.NewSSEHandler(getServer, nil)
	}
	handler := func(stateless bool) http.Handler {
		return mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{
			JSONResponse:               opts.JSONResponse,
			Stateless:                  stateless,
			SessionTimeout:             opts.SessionTimeout,
			DisableLocalhostProtection: opts.AnyHost,
		})
	}
	switch opts.Era {
	case EraModern:
		return handler(true)
	case EraDual:
		return byEra(handler(true), handler(false))
	}
	return handler(false)
}

// delayInitialize returns middleware that logs each initialize request and
// answers it after d, or when its context ends.
func delayInitialize(d time.Duration) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "initialize" {
				fmt.Fprintf(os.Stderr, "whoami: initialize, answering in %v\n", d)
				if err := sleep(ctx, d); err != nil {
					return nil, err
				}
			}
			return next(ctx, method, req)
		}
	}
}

// ModernProtocolVersion is the first MCP protocol version without sessions.
const ModernProtocolVersion = "2026-07-28"

// byEra sends requests of protocol 2026-07-28 or later (by their
// MCP-Protocol-Version header, which that protocol requires on every
// request) to modern, and the others to legacy.
func byEra(modern, legacy http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcp-Protocol-Version") >= ModernProtocolVersion {
			modern.ServeHTTP(w, r)
			return
		}
		legacy.ServeHTTP(w, r)
	})
}

// HealthHandler answers a health check: 200 "ok", or 503 while downFile
// (if not empty) exists. A proxy's active health checks must probe such an
// endpoint, not the MCP endpoint, which answers a GET without a session
// with 400.
func HealthHandler(downFile string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if _, err := os.Stat(downFile); downFile != "" && err == nil {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	}
}

// NewServer returns an MCP server named name (or "whoami" if empty) with the
// whoami, echo and slow tools.
func NewServer(name string) *mcp.Server {
	if name == "" {
		name = "whoami"
	}
	server := mcp.NewServer(&mcp.Implementation{Name: name, Version: Version}, nil)
	mcp.AddTool(server, &mcp.Tool{
		Name:        "whoami",
		Description: "Report which server handled the call and the MCP session ID it sees.",
	}, whoamiTool(name))
	mcp.AddTool(server, &mcp.Tool{
		Name:        "echo",
		Description: "Return the message unchanged.",
	}, echoTool)
	mcp.AddTool(server, &mcp.Tool{
		Name:        "slow",
		Description: "Send progress notifications spread over the given duration, then return \"done\".",
	}, slowTool)
	mcp.AddTool(server, &mcp.Tool{
		Name:        "add_tool",
		Description: "Add a tool that echoes, named as given; clients listening for tool list changes are notified.",
	}, addTool(server))
	addHandleTools(server, name)
	return server
}

// AddToolInput is the input of the add_tool tool.
type AddToolInput struct {
	// Name is the new tool's name.
	Name string `json:"name" jsonschema:"name of the tool to add"`
}

// addTool returns the add_tool handler of server.
func addTool(server *mcp.Server) mcp.ToolHandlerFor[AddToolInput, any] {
	return func(_ context.Context, _ *mcp.CallToolRequest, in AddToolInput) (*mcp.CallToolResult, any, error) {
		if in.Name == "" {
			return nil, nil, fmt.Errorf("name is required")
		}
		mcp.AddTool(server, &mcp.Tool{Name: in.Name, Description: "Return the message unchanged."}, echoTool)
		return textResult("added " + in.Name), nil, nil
	}
}

// whoamiTool returns the whoami tool handler for a server called name.
func whoamiTool(name string) mcp.ToolHandlerFor[struct{}, Identity] {
	return func(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, Identity, error) {
		id := Identity{Server: name, Session: req.Session.ID()}
		return textResult(name), id, nil
	}
}

// echoTool returns its message.
func echoTool(_ context.Context, _ *mcp.CallToolRequest, in EchoInput) (*mcp.CallToolResult, any, error) {
	return textResult(in.Message), nil, nil
}

// slowTool sleeps for in.Milliseconds, sending in.Steps progress
// notifications along the way if the request has a progress token.
func slowTool(ctx context.Context, req *mcp.CallToolRequest, in SlowInput) (*mcp.CallToolResult, any, error) {
	if err := validateSlow(in); err != nil {
		return nil, nil, err
	}
	steps := max(in.Steps, 1)
	interval := time.Duration(in.Milliseconds) * time.Millisecond / time.Duration(steps)
	token := req.Params.GetProgressToken()
	for i := 1; i <= steps; i++ {
		if err := sleep(ctx, interval); err != nil {
			return nil, nil, err
		}
		if token != nil && in.Steps > 0 {
			notifyProgress(ctx, req, token, i, in.Steps)
		}
	}
	return textResult("done"), nil, nil
}

// validateSlow rejects out-of-range slow arguments.
func validateSlow(in SlowInput) error {
	if in.Milliseconds < 0 || in.Milliseconds > MaxSlowMilliseconds {
		return fmt.Errorf("milliseconds must be between 0 and %d", MaxSlowMilliseconds)
	}
	if in.Steps < 0 || in.Steps > MaxSlowSteps {
		return fmt.Errorf("steps must be between 0 and %d", MaxSlowSteps)
	}
	return nil
}

// notifyProgress sends one progress notification; delivery errors are
// ignored, as progress is best-effort.
func notifyProgress(ctx context.Context, req *mcp.CallToolRequest, token any, step, steps int) {
	_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
		ProgressToken: token,
		Progress:      float64(step),
		Total:         float64(steps),
		Message:       fmt.Sprintf("step %d of %d", step, steps),
	})
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// textResult returns a tool result holding one text content.
func textResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}
