package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The one session runner: a session is opened through a chosen proxy or
// replica with a chosen client kind (a go-sdk client, see sessionPlan, or
// raw requests, see rawKind), calls the whoami tool, which names the server
// that answered and the session ID it saw, and records every call in one
// session value.

// session is one client session that a test opened, and what it saw: who
// answered each call, and the first failure.
type session struct {
	cs      *mcp.ClientSession // the go-sdk client's session; nil for raw requests
	raw     rawKind            // how raw requests are made, when cs is nil
	id      string             // the client's session ID; "" when sessionless, or legacy HTTP+SSE (the client does not show it)
	version string             // raw: the MCP-Protocol-Version its requests carry
	legacy  bool               // a legacy HTTP+SSE session
	began   time.Time          // before connecting
	// creator is the server that created the session: serverInfo.name of
	// the initialize answer, or for raw requests who answered the first call.
	creator   string
	first     identity   // who answered the first call
	firstSeen string     // the session ID the creator saw on the first call of the plan (sealed, legacy)
	answered  []string   // the server that answered each call answered
	onCreator int        // calls answered by the creator, seeing the session's ID (sessionPlan calls)
	misrouted int        // calls answered by another server or for another session, without error (sessionPlan calls)
	spans     []callSpan // every call, in order
	err       error      // the first failure (connect, a call of the plan, or closing), if any
	connErr   error      // connecting failed
	lost      bool       // a failover run ended it: 404, or 3 failed calls in a row
	get       int        // the status of the GET stream reopened with its ID (resume)
	resumed   int        // how many calls came before that GET
}

// callSpan is one call of a session: when it ran, through which of the
// URLs given, its status (raw requests), who answered, and its error.
type callSpan struct {
	start, end time.Time
	via        int         // the index of the URL it went through (resume)
	status     int         // raw: the HTTP status
	header     http.Header // raw: the answer's header
	who        identity    // who answered; zero when the call failed
	err        error
}

// ok reports whether the session had an ID, and every call reached its creator.
func (s *session) ok() bool {
	return s.err == nil && s.misrouted == 0 && (s.id != "" || s.legacy)
}

// record appends a call; an answered one counts in answered and first.
func (s *session) record(sp callSpan) {
	s.spans = append(s.spans, sp)
	if sp.err != nil || sp.status != 0 && sp.status != http.StatusOK {
		return
	}
	if len(s.answered) == 0 {
		s.first = sp.who
	}
	s.answered = append(s.answered, sp.who.Server)
}

// failed returns the calls that failed.
func (s *session) failed() []callSpan {
	var out []callSpan
	for _, sp := range s.spans {
		if sp.err != nil {
			out = append(out, sp)
		}
	}
	return out
}

// seenBy returns, by server, the session IDs it saw, in order and
// deduplicated.
func (s *session) seenBy() map[string][]string {
	seen := map[string][]string{}
	for _, sp := range s.spans {
		if sp.err != nil || sp.who.Server == "" {
			continue
		}
		ids := seen[sp.who.Server]
		if len(ids) == 0 || ids[len(ids)-1] != sp.who.Session {
			seen[sp.who.Server] = append(ids, sp.who.Session)
		}
	}
	return seen
}

// servers returns how many servers answered the session's calls.
func (s *session) servers() int { return len(s.seenBy()) }

// consistent reports whether every server saw one session ID, the creator
// the client's own, any other an ID of its own.
func (s *session) consistent() bool {
	for srv, ids := range s.seenBy() {
		if len(ids) != 1 || (srv == s.creator) != (ids[0] == s.id) {
			return false
		}
	}
	return true
}

// afterGET returns the calls after the reopened GET (see resume).
func (s *session) afterGET() []callSpan { return s.spans[s.resumed:] }

// statuses returns the statuses of the calls after the reopened GET.
func (s *session) statuses() []int {
	var out []int
	for _, sp := range s.afterGET() {
		out = append(out, sp.status)
	}
	return out
}

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

// connectReconnecting opens a go-sdk client session through url whose
// standalone GET stream reconnects when a replica it runs through goes
// away (the go-sdk default retries; the harness's connect makes none).
func connectReconnecting(ctx context.Context, url string, hc *http.Client) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "affinity-test", Version: "v0"}, nil)
	return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: 20}, nil)
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

// sessionPlan says which go-sdk client opens a session and what it does.
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
	// reconnect: the client's standalone GET stream reconnects when a
	// replica it runs through goes away (see connectReconnecting).
	reconnect bool
}

// connectPlan opens a go-sdk session through url as plan says.
func connectPlan(ctx context.Context, url string, hc *http.Client, plan sessionPlan) (*mcp.ClientSession, error) {
	switch {
	case plan.legacySSE:
		client := mcp.NewClient(&mcp.Implementation{Name: "affinity-test-legacy", Version: "v0"}, nil)
		return client.Connect(ctx, &mcp.SSEClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	case plan.reconnect:
		return connectReconnecting(ctx, url, hc)
	}
	return connect(ctx, url, hc, plan.version)
}

// openSession connects through url as plan says, and makes no call; a
// failure to connect is the session's err and connErr.
func openSession(ctx context.Context, url string, hc *http.Client, plan sessionPlan) *session {
	s := &session{began: time.Now(), legacy: plan.legacySSE}
	cs, err := connectPlan(ctx, url, hc, plan)
	if err != nil {
		s.connErr, s.err = err, fmt.Errorf("connect: %w", err)
		return s
	}
	s.cs, s.id = cs, cs.ID()
	if init := cs.InitializeResult(); init != nil && init.ServerInfo != nil {
		s.creator = init.ServerInfo.Name
	}
	return s
}

// runSession connects, calls whoami plan.calls times and closes the session
// (DELETE). Each call should be answered by the server that created the
// session, seeing the client's session ID; runSession keeps going after a
// misrouted call, since servers that accept any session ID answer it
// without error.
func runSession(ctx context.Context, url string, hc *http.Client, plan sessionPlan) *session {
	s := openSession(ctx, url, hc, plan)
	if s.cs == nil {
		return s
	}
	s.callPlan(ctx, plan)
	if err := s.cs.Close(); err != nil && s.err == nil {
		s.err = fmt.Errorf("close (session on %s): %w", s.creator, err)
	}
	return s
}

// callPlan makes the plan's calls, unless the session failed already; the
// first failure is the session's err.
func (s *session) callPlan(ctx context.Context, plan sessionPlan) {
	if s.err == nil && s.cs != nil {
		s.err = s.call(ctx, plan)
	}
}

// call makes the plan's calls in the session, and returns the first error.
func (s *session) call(ctx context.Context, plan sessionPlan) error {
	for i := range plan.calls {
		sp := callSpan{start: time.Now()}
		sp.who, sp.err = whoami(ctx, s.cs)
		sp.end = time.Now()
		s.record(sp)
		if sp.err != nil {
			return fmt.Errorf("call %d (session created by %q): %w", i+1, s.creator, sp.err)
		}
		if sp.who.Server == s.creator && s.sameSession(sp.who.Session, plan) {
			s.onCreator++
		} else {
			s.misrouted++
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
func (s *session) sameSession(seen string, plan sessionPlan) bool {
	if !plan.sealed && !plan.legacySSE {
		return seen == s.id
	}
	if len(s.answered) == 1 {
		s.firstSeen = seen
	}
	return seen == s.firstSeen && (plan.legacySSE || seen != "" && !strings.Contains(s.id, seen))
}

// loadResult sums up a run of concurrent sessions.
type loadResult struct {
	reports   []*session
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
	reports := make([]*session, sessions)
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() { reports[i] = runSession(ctx, url, hc, plan) })
	}
	wg.Wait()
	return sumUp(reports)
}

// sumUp adds up sessions.
func sumUp(reports []*session) loadResult {
	res := loadResult{reports: reports, perServer: map[string]int{}, answered: map[string]int{}}
	for _, r := range reports {
		res.add(r)
	}
	return res
}

// add counts one session.
func (res *loadResult) add(r *session) {
	res.calls += len(r.answered)
	res.onCreator += r.onCreator
	res.misrouted += r.misrouted
	if r.id != "" {
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

// openSessions opens n sessions of plan through hc concurrently and makes
// the plan's calls in each. A session that fails keeps its first error.
func openSessions(ctx context.Context, url string, hc *http.Client, n int, plan sessionPlan) []*session {
	ss := make([]*session, n)
	var wg sync.WaitGroup
	for i := range ss {
		wg.Go(func() {
			ss[i] = openSession(ctx, url, hc, plan)
			ss[i].callPlan(ctx, plan)
		})
	}
	wg.Wait()
	return ss
}

// eachSession runs f on every session concurrently.
func eachSession(ss []*session, f func(*session)) {
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Go(func() { f(s) })
	}
	wg.Wait()
}

// sessionsResult counts the sessions without error whose every call reached
// their creator, the calls answered by the creator, and the first problem.
func sessionsResult(ss []*session) (ok, calls int, first error) {
	for _, s := range ss {
		calls += s.onCreator
		switch {
		case s.ok():
		case first == nil && s.err != nil:
			first = s.err
		case first == nil:
			first = fmt.Errorf("session created by %s: %d calls answered elsewhere: %v", s.creator, s.misrouted, s.answered)
		}
		if s.ok() {
			ok++
		}
	}
	return ok, calls, first
}

// closeSessions ends every open session (DELETE through the client's HTTP
// client) and returns the first error.
func closeSessions(ss []*session) error {
	var mu sync.Mutex
	var first error
	eachSession(ss, func(s *session) {
		if s.cs == nil {
			return
		}
		if err := s.cs.Close(); err != nil {
			mu.Lock()
			if first == nil {
				first = err
			}
			mu.Unlock()
		}
	})
	return first
}

// openLiveSession connects and learns which server owns the session with a
// first call (the session's first). The session is closed when t ends.
func openLiveSession(ctx context.Context, t testing.TB, url string, hc *http.Client) *session {
	t.Helper()
	cs, err := connect(ctx, url, hc)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return liveSessionOf(ctx, t, cs)
}

// liveSessionOf closes cs when t ends and learns which server owns it with
// a first call.
func liveSessionOf(ctx context.Context, t testing.TB, cs *mcp.ClientSession) *session {
	t.Helper()
	t.Cleanup(func() { cs.Close() })
	s := &session{cs: cs, id: cs.ID(), began: time.Now()}
	if init := cs.InitializeResult(); init != nil && init.ServerInfo != nil {
		s.creator = init.ServerInfo.Name
	}
	sp := callSpan{start: time.Now()}
	sp.who, sp.err = whoami(ctx, cs)
	sp.end = time.Now()
	s.record(sp)
	if sp.err != nil {
		t.Fatalf("first call: %v", sp.err)
	}
	return s
}

// runFailoverSession connects through url (its GET stream reconnecting)
// and calls whoami every 20 ms, each call bounded by 10 s, until stop is
// closed or the session is lost (a 404, or 3 failures in a row); started
// is called once the first call is answered (or the session failed).
func runFailoverSession(ctx context.Context, url string, hc *http.Client, started func(), stop <-chan struct{}) *session {
	once := sync.OnceFunc(started)
	defer once()
	s := openSession(ctx, url, hc, sessionPlan{reconnect: true})
	if s.cs == nil {
		return s
	}
	defer s.cs.Close()
	for streak := 0; streak < 3; {
		sp := s.timedCall(ctx)
		if sp.err != nil {
			streak++
			if is404(sp.err) || errors.Is(sp.err, mcp.ErrSessionMissing) {
				break
			}
		} else {
			streak = 0
			once()
		}
		select {
		case <-stop:
			return s
		case <-time.After(20 * time.Millisecond):
		}
	}
	s.lost = true
	return s
}

// timedCall makes one whoami call, bounded by 10 s, and records it.
func (s *session) timedCall(ctx context.Context) callSpan {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sp := callSpan{start: time.Now()}
	sp.who, sp.err = whoami(cctx, s.cs)
	sp.end = time.Now()
	s.record(sp)
	return sp
}

// foRun runs n failover sessions through url, calls act once every session
// has answered a call, keeps them calling for hold, and returns them.
func foRun(t *testing.T, url string, n int, hold time.Duration, act func()) []*session {
	t.Helper()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	return foRunWith(t, url, hc, n, hold, act)
}

// foRunWith is foRun through the HTTP client hc.
func foRunWith(t *testing.T, url string, hc *http.Client, n int, hold time.Duration, act func()) []*session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ss := make([]*session, n)
	stop := make(chan struct{})
	var started, wg sync.WaitGroup
	started.Add(n)
	for i := range ss {
		wg.Go(func() { ss[i] = runFailoverSession(ctx, url, hc, started.Done, stop) })
	}
	started.Wait()
	act()
	time.Sleep(hold) // the load goes on for hold after act
	close(stop)
	wg.Wait()
	return ss
}

// rawKind says how the raw requests of a session are made.
type rawKind int

const (
	rawPlain      rawKind = iota // at MCP-Protocol-Version 2025-11-25
	rawNegotiated                // at the version the initialize negotiated
	rawZstd                      // accepting only zstd answers, which the client decodes itself
)

// openRawSession opens a session through url with raw requests of kind
// (initialize, notifications/initialized) and makes one whoami call, which
// names the session's creator; it fails t unless each is answered as it
// should be.
func openRawSession(t testing.TB, hc *http.Client, url string, kind rawKind) *session {
	t.Helper()
	s := &session{raw: kind, version: "2025-11-25", began: time.Now()}
	ex := s.post(t, hc, url, initBody)
	if ex.status != http.StatusOK || len(ex.header.Values("Mcp-Session-Id")) != 1 {
		t.Fatalf("raw initialize through %s: %d %v %s", url, ex.status, ex.header, ex.body)
	}
	s.id = ex.header.Get("Mcp-Session-Id")
	if kind == rawNegotiated {
		var res struct {
			Result struct {
				ProtocolVersion string `json:"protocolVersion"`
			} `json:"result"`
		}
		msg, err := rpcMessage(ex.body)
		if err == nil {
			err = json.Unmarshal(msg, &res)
		}
		if err != nil {
			t.Fatalf("raw initialize: %d %s (%v)", ex.status, ex.body, err)
		}
		s.version = res.Result.ProtocolVersion
	}
	if ex := s.post(t, hc, url, tsInitializedMsg); ex.status != http.StatusAccepted {
		t.Fatalf("raw notifications/initialized through %s: %d %s", url, ex.status, ex.body)
	}
	if sp := s.rawCall(t, hc, url, 0); sp.status != http.StatusOK {
		t.Fatalf("first raw whoami of session %s through %s: %d", s.id, url, sp.status)
	}
	s.creator = s.first.Server
	return s
}

// openRawSessions opens n raw sessions of kind through url.
func openRawSessions(t testing.TB, hc *http.Client, url string, n int, kind rawKind) []*session {
	t.Helper()
	ss := make([]*session, n)
	for i := range ss {
		ss[i] = openRawSession(t, hc, url, kind)
	}
	return ss
}

// post sends body in the raw session (before its initialize is answered,
// outside any session).
func (s *session) post(t testing.TB, hc *http.Client, url, body string) exchange {
	t.Helper()
	hdr := map[string][]string{"Accept": {"application/json, text/event-stream"}}
	if s.id != "" {
		hdr["Mcp-Session-Id"] = []string{s.id}
		hdr["Mcp-Protocol-Version"] = []string{s.version}
	}
	if s.raw == rawZstd {
		hdr["Accept-Encoding"] = []string{"zstd"}
		ex := send(t, hc, http.MethodPost, url, hdr, body)
		ex.body = zstdDecoded(t, ex)
		return ex
	}
	return send(t, hc, http.MethodPost, url, hdr, body)
}

// rawCall calls whoami in the raw session through url (the via-th URL of
// its caller), and records the call; who is set on 200.
func (s *session) rawCall(t testing.TB, hc *http.Client, url string, via int) callSpan {
	t.Helper()
	sp := callSpan{start: time.Now(), via: via}
	ex := s.post(t, hc, url, tsWhoamiCall)
	sp.end, sp.status, sp.header = time.Now(), ex.status, ex.header
	if ex.status == http.StatusOK {
		who, err := tsWhoamiResult(ex.body)
		if err != nil {
			t.Fatalf("whoami in session %s: %v in %s", s.id, err, ex.body)
		}
		sp.who = who
	}
	s.record(sp)
	return sp
}

// resume reopens the session's GET stream through the last of urls, as VS
// Code does after its server restarts (reading only its status), then
// calls whoami through each of urls in turn, rounds times around.
func (s *session) resume(t testing.TB, hc *http.Client, rounds int, urls ...string) {
	t.Helper()
	s.get = reopenGET(t, hc, urls[len(urls)-1], s.id)
	s.resumed = len(s.spans)
	for range rounds {
		for i, u := range urls {
			s.rawCall(t, hc, u, i)
		}
	}
}

// reopenGET reopens the GET stream of session id through url, as VS Code
// does after its server restarts, and returns the status, reading nothing
// more.
func reopenGET(t testing.TB, hc *http.Client, url, id string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = http.Header{"Accept": {"text/event-stream"}, "Mcp-Session-Id": {id}, "Mcp-Protocol-Version": {"2025-11-25"}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET of session %s: %v", id, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
