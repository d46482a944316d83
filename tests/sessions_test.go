package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// connect opens an MCP session through url with the go-sdk client, asking
// for protocol version ("" for the client's default).
func connect(ctx context.Context, url string, hc *http.Client, version ...string) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "affinity-test", Version: "v0"}, nil)
	opts := &mcp.ClientSessionOptions{}
	if len(version) > 0 {
		opts.ProtocolVersion = version[0]
	}
	return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, opts)
}

// connectNoStream is connect without the standalone GET (SSE) stream that
// the go-sdk client opens by default: an open stream keeps a session from
// expiring or being evicted, so tests of those use sessions without one.
func connectNoStream(ctx context.Context, url string, hc *http.Client) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "affinity-test", Version: "v0"}, nil)
	return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
}

// identity is the whoami tool's answer: the server that handled the call
// (the name it also gives as serverInfo.name) and the session ID it saw.
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

// whoamiAcrossReload calls whoami, retrying transport errors on fresh
// connections. During a reload the old server closes its keep-alive
// connections, and a POST that raced onto one fails with EOF or a reset in
// any HTTP client before it reaches a handler. A lost mapping is different:
// it is a 404 from the proxy, which is never retried here.
func whoamiAcrossReload(ctx context.Context, t testing.TB, hc *http.Client, cs *mcp.ClientSession) (identity, error) {
	for attempt := 1; ; attempt++ {
		id, err := whoami(ctx, cs)
		if err == nil || attempt == 3 || !isConnectionError(err) {
			return id, err
		}
		t.Logf("retrying on a fresh connection: %v", err)
		hc.CloseIdleConnections()
	}
}

// isConnectionError reports whether err is a client connection failure
// before any answer: EOF, a reset, or a keep-alive connection the server
// closed as the request went out on it (net/http's "server closed idle
// connection", which it retries itself only for idempotent requests).
func isConnectionError(err error) bool {
	msg := err.Error()
	return strings.HasSuffix(msg, ": EOF") || strings.Contains(msg, "connection reset by peer") ||
		strings.Contains(msg, "server closed idle connection")
}

// sessionPlan says what runSession does in one session.
type sessionPlan struct {
	calls   int           // whoami calls
	version string        // protocol version the client asks for; "" for its default
	pause   time.Duration // after each call, a random pause of pause/4 to pause; 0 for none
	// sealed: the proxy seals session IDs (seal_session_ids), so the
	// creator sees a session ID of its own, the same on every call, which
	// the client's ID does not show.
	sealed bool
	// legacySSE: the client speaks the legacy HTTP+SSE transport (protocol
	// 2024-11-05, go-sdk SSEClientTransport) to the URL of the SSE stream.
	// Its session ID is in the endpoint URL, which the go-sdk client does
	// not show; the creator is the server of the stream, and each call must
	// see the session ID it saw first.
	legacySSE bool
}

// sessionReport is the outcome of one client session.
type sessionReport struct {
	began     time.Time // before connecting
	creator   string    // serverInfo.name of the initialize response: the server that created the session
	sessionID string    // the client's session ID; "" when sessionless
	seen      string    // the session ID the creator saw on the first call
	calls     int       // calls answered
	onCreator int       // calls answered by the creator, seeing the client's session ID
	misrouted int       // calls answered by another server or for another session, without error
	answered  []string  // the server that answered each call
	err       error     // the first failure (connect, a call, or closing the session), if any
	legacy    bool      // a legacy HTTP+SSE session, whose ID the client does not show
}

// ok reports whether the session had an ID, and every call reached its creator.
func (r sessionReport) ok() bool {
	return r.err == nil && r.misrouted == 0 && (r.sessionID != "" || r.legacy)
}

// connectPlan opens a session through url as plan says.
func connectPlan(ctx context.Context, url string, hc *http.Client, plan sessionPlan) (*mcp.ClientSession, error) {
	if !plan.legacySSE {
		return connect(ctx, url, hc, plan.version)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "affinity-test-legacy", Version: "v0"}, nil)
	return client.Connect(ctx, &mcp.SSEClientTransport{Endpoint: url, HTTPClient: hc}, nil)
}

// runSession connects, calls whoami plan.calls times and closes the session
// (DELETE). Each call should be answered by the server that created the
// session, seeing the client's session ID; runSession keeps going after a
// misrouted call, since servers that accept any session ID answer it
// without error.
func runSession(ctx context.Context, url string, hc *http.Client, plan sessionPlan) sessionReport {
	rep := sessionReport{began: time.Now(), legacy: plan.legacySSE}
	cs, err := connectPlan(ctx, url, hc, plan)
	if err != nil {
		rep.err = fmt.Errorf("connect: %w", err)
		return rep
	}
	rep.sessionID = cs.ID()
	if init := cs.InitializeResult(); init != nil && init.ServerInfo != nil {
		rep.creator = init.ServerInfo.Name
	}
	rep.err = rep.call(ctx, cs, plan)
	if err := cs.Close(); err != nil && rep.err == nil {
		rep.err = fmt.Errorf("close (session on %s): %w", rep.creator, err)
	}
	return rep
}

// call makes the plan's calls in session cs, and returns the first error.
func (r *sessionReport) call(ctx context.Context, cs *mcp.ClientSession, plan sessionPlan) error {
	for i := range plan.calls {
		id, err := whoami(ctx, cs)
		if err != nil {
			return fmt.Errorf("call %d (session created by %q): %w", i+1, r.creator, err)
		}
		r.calls++
		r.answered = append(r.answered, id.Server)
		if id.Server == r.creator && r.sameSession(id.Session, plan) {
			r.onCreator++
		} else {
			r.misrouted++
		}
		if plan.pause > 0 {
			time.Sleep(plan.pause/4 + rand.N(plan.pause*3/4))
		}
	}
	return nil
}

// sameSession reports whether a call's server saw the session's ID: the
// client's own, or with sealed IDs the one it saw first, which the client's
// ID does not show; for a legacy HTTP+SSE session, the one it saw first.
func (r *sessionReport) sameSession(seen string, plan sessionPlan) bool {
	if !plan.sealed && !plan.legacySSE {
		return seen == r.sessionID
	}
	if r.calls == 1 {
		r.seen = seen
	}
	return seen == r.seen && (plan.legacySSE || seen != "" && !strings.Contains(r.sessionID, seen))
}

// loadResult sums up a run of concurrent sessions.
type loadResult struct {
	reports   []sessionReport
	ok        int            // sessions with an ID, no error and every call on the creator
	failed    int            // sessions that ended in an error
	calls     int            // calls answered
	onCreator int            // calls answered by the session's creator
	misrouted int            // calls answered elsewhere without error
	sessioned int            // sessions with a session ID
	perServer map[string]int // sessions per creating server
	answered  map[string]int // calls per answering server
	errs      []error
}

func (r loadResult) String() string {
	var first error
	if len(r.errs) > 0 {
		first = r.errs[0]
	}
	return fmt.Sprintf("%d/%d sessions ok, %d failed, %d with a session ID; calls: %d answered, %d on the creating server, %d misrouted; sessions per creating server %v; calls per answering server %v; first error: %v",
		r.ok, len(r.reports), r.failed, r.sessioned, r.calls, r.onCreator, r.misrouted, r.perServer, r.answered, first)
}

// runSessions runs sessions concurrent sessions of plan through url.
func runSessions(t testing.TB, url string, sessions int, plan sessionPlan) loadResult {
	t.Helper()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	return runSessionsWith(t, url, hc, sessions, plan)
}

// runSessionsWith is runSessions through the HTTP client hc.
func runSessionsWith(t testing.TB, url string, hc *http.Client, sessions int, plan sessionPlan) loadResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reports := make([]sessionReport, sessions)
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() { reports[i] = runSession(ctx, url, hc, plan) })
	}
	wg.Wait()
	return sumUp(reports)
}

// sumUp adds up session reports.
func sumUp(reports []sessionReport) loadResult {
	res := loadResult{reports: reports, perServer: map[string]int{}, answered: map[string]int{}}
	for _, r := range reports {
		res.add(r)
	}
	return res
}

// add counts one session.
func (res *loadResult) add(r sessionReport) {
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
	case r.ok():
		res.ok++
	}
}

// liveSession is an open client session and the server that owns it.
type liveSession struct {
	cs     *mcp.ClientSession
	server string
}

// openLiveSession connects and learns which server owns the session with a
// first call. The session is closed when t ends.
func openLiveSession(ctx context.Context, t testing.TB, url string, hc *http.Client) *liveSession {
	t.Helper()
	cs, err := connect(ctx, url, hc)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return liveSessionOf(ctx, t, cs)
}

// liveSessionOf closes cs when t ends and learns which server owns it with
// a first call.
func liveSessionOf(ctx context.Context, t testing.TB, cs *mcp.ClientSession) *liveSession {
	t.Helper()
	t.Cleanup(func() { cs.Close() })
	id, err := whoami(ctx, cs)
	if err != nil {
		t.Fatalf("first call: %v", err)
	}
	return &liveSession{cs: cs, server: id.Server}
}
