package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// testSessionID is shaped like the IDs the MCP go-sdk mints.
const testSessionID = "B5CKDXQ4Z3N7RWJ2YHT6MFEA4U"

// newContext returns the context of a new, empty config for provisioning
// modules in tests. Cancelling it, when the test ends, cleans up what was
// provisioned in it, as unloading a config does.
func newContext(t testing.TB) caddy.Context {
	t.Helper()
	base, err := caddy.ProvisionContext(new(caddy.Config))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(base)
	t.Cleanup(cancel)
	return ctx
}

// startApp starts the mcp_sessions app of ctx's config, as a config load
// does once everything is provisioned, and returns it.
func startApp(t testing.TB, ctx caddy.Context) *App {
	t.Helper()
	app, err := sessionsApp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Start(); err != nil {
		t.Fatalf("starting the %s app: %v", AppName, err)
	}
	return app
}

// provisionHandler provisions h with a table of its own (named after the
// test unless h names one) and releases it when the test ends. Its logs go
// to the returned observer.
func provisionHandler(t testing.TB, h *Handler) (*Handler, *observer.ObservedLogs) {
	t.Helper()
	if h.Table == "" {
		h.Table = "test/" + t.Name()
	}
	if h.Reclaim == "" {
		// The fake proxies serve one request at a time: reclaim DELETEs,
		// sent from goroutines of their own, are reclaim_test.go's.
		h.Reclaim = ReclaimOff
	}
	ctx := newContext(t)
	if err := h.Provision(ctx); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	startApp(t, ctx)
	t.Cleanup(func() { _ = h.Cleanup() })
	core, logs := observer.New(zapcore.DebugLevel)
	h.setLogger(zap.New(core))
	return h, logs
}

// provisionPolicy provisions s and returns it.
func provisionPolicy(t testing.TB, s *SessionSelection) *SessionSelection {
	t.Helper()
	if err := s.Provision(newContext(t)); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	return s
}

// testPool returns a pool of three upstreams, as Caddy's own tests build them.
func testPool() reverseproxy.UpstreamPool {
	return reverseproxy.UpstreamPool{
		{Host: new(reverseproxy.Host), Dial: "10.0.0.1:8080"},
		{Host: new(reverseproxy.Host), Dial: "10.0.0.2:8080"},
		{Host: new(reverseproxy.Host), Dial: "10.0.0.3:8080"},
	}
}

// newRequest returns a request carrying Caddy's request variables, as the
// server sets them up, with one Mcp-Session-Id field per id.
func newRequest(method string, ids ...string) *http.Request {
	r := httptest.NewRequest(method, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	for _, id := range ids {
		r.Header.Add(HeaderSessionID, id)
	}
	return r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
}

// countingNext is a next handler that counts its calls and answers 200.
type countingNext struct{ calls int }

func (n *countingNext) ServeHTTP(w http.ResponseWriter, _ *http.Request) error {
	n.calls++
	w.WriteHeader(http.StatusOK)
	_, err := io.WriteString(w, "from upstream")
	return err
}

// rpcBody is the JSON-RPC error body the handler answers with.
type rpcBody struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// checkRPCError checks that rec holds a JSON-RPC error answer with the
// given status and code, whose message contains msg.
func checkRPCError(t *testing.T, rec *httptest.ResponseRecorder, status, code int, msg string) {
	t.Helper()
	if rec.Code != status {
		t.Errorf("status = %d, want %d", rec.Code, status)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", cc)
	}
	wantPrefix := fmt.Sprintf(`{"jsonrpc":"2.0","id":null,"error":{"code":%d,"message":`, code)
	if !strings.HasPrefix(rec.Body.String(), wantPrefix) {
		t.Errorf("body = %s, want it to start with %s", rec.Body, wantPrefix)
	}
	var body rpcBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q is not JSON: %v", rec.Body, err)
	}
	if body.JSONRPC != "2.0" || string(body.ID) != "null" || body.Error.Code != code {
		t.Errorf("body = %s, want jsonrpc 2.0, id null, code %d", rec.Body, code)
	}
	if !strings.Contains(body.Error.Message, msg) {
		t.Errorf("error message %q does not contain %q", body.Error.Message, msg)
	}
}

// TestServeHTTPRejects covers the requests the handler answers itself.
func TestServeHTTPRejects(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler Handler
		ids     []string // Mcp-Session-Id fields
		conn    []string // Connection fields
		status  int      // 0: next must be called
		code    int
		msg     string
	}{
		{name: "no session", ids: nil},
		{name: "sent twice", ids: []string{"a", "b"}, status: 400, code: CodeInvalidRequest, msg: "Mcp-Session-Id was sent 2 times; send it once"},
		{name: "sent twice, same value", ids: []string{"a", "a"}, status: 400, code: CodeInvalidRequest, msg: "sent 2 times"},
		{name: "sent three times", ids: []string{"a", "b", "c"}, status: 400, code: CodeInvalidRequest, msg: "sent 3 times"},
		{name: "twice, one empty", ids: []string{"", testSessionID}, status: 400, code: CodeInvalidRequest, msg: "sent 2 times"},
		{name: "empty", ids: []string{""}, status: 400, code: CodeInvalidRequest, msg: "Bad Request: Mcp-Session-Id is empty"},
		{name: "space", ids: []string{"a b"}, status: 400, code: CodeInvalidRequest, msg: "0x20"},
		{name: "non-ascii", ids: []string{"\x80"}, status: 400, code: CodeInvalidRequest, msg: "0x80"},
		{name: "too long", handler: Handler{MaxSessionIDLength: 8}, ids: []string{"123456789"}, status: 400, code: CodeInvalidRequest, msg: "the limit is 8 (max_session_id_length)"},
		{name: "unknown", ids: []string{testSessionID}, status: 404, code: CodeSessionNotFound, msg: "Session not found"},
		{name: "unknown, explicit reject", handler: Handler{UnknownSession: UnknownSessionReject}, ids: []string{testSessionID}, status: 404, code: CodeSessionNotFound, msg: "Session not found"},
		{name: "unknown, forward", handler: Handler{UnknownSession: UnknownSessionForward}, ids: []string{testSessionID}},
		{name: "malformed, forward", handler: Handler{UnknownSession: UnknownSessionForward}, ids: []string{"a b"}, status: 400, code: CodeInvalidRequest, msg: "0x20"},
		// A proxy strips the fields Connection names: the upstream would get
		// the request without the session it was pinned on.
		{name: "Connection names it", ids: []string{testSessionID}, conn: []string{"Mcp-Session-Id"}, status: 400, code: CodeInvalidRequest, msg: "Connection names Mcp-Session-Id"},
		{name: "Connection names it in a list", ids: []string{testSessionID}, conn: []string{"keep-alive,  mcp-session-id "}, status: 400, code: CodeInvalidRequest, msg: "remove Mcp-Session-Id from Connection"},
		{name: "Connection names it in a second field", ids: []string{testSessionID}, conn: []string{"close", "MCP-SESSION-ID"}, status: 400, code: CodeInvalidRequest, msg: "Connection names"},
		{name: "Connection names it, forward", handler: Handler{UnknownSession: UnknownSessionForward}, ids: []string{testSessionID}, conn: []string{"Mcp-Session-Id"}, status: 400, code: CodeInvalidRequest, msg: "Connection names"},
		{name: "Connection names other fields", ids: []string{testSessionID}, conn: []string{"keep-alive, Mcp-Session-Idx, x-Mcp-Session-Id"}, status: 404, code: CodeSessionNotFound, msg: "Session not found"},
		{name: "Connection names it, no session", conn: []string{"Mcp-Session-Id"}},
	} {
		for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
			t.Run(tc.name+"/"+method, func(t *testing.T) {
				hc := tc.handler
				h, _ := provisionHandler(t, &hc)
				next := new(countingNext)
				rec := httptest.NewRecorder()
				r := newRequest(method, tc.ids...)
				r.Header["Connection"] = tc.conn
				if err := h.ServeHTTP(rec, r, next); err != nil {
					t.Fatalf("ServeHTTP: %v", err)
				}
				if tc.status == 0 {
					if next.calls != 1 || rec.Code != 200 || rec.Body.String() != "from upstream" {
						t.Errorf("next called %d times, response %d %q; want it passed through", next.calls, rec.Code, rec.Body)
					}
					return
				}
				if next.calls != 0 {
					t.Errorf("next called %d times, want 0", next.calls)
				}
				checkRPCError(t, rec, tc.status, tc.code, tc.msg)
				if h.table.Len() != 0 {
					t.Errorf("table holds %d sessions, want 0", h.table.Len())
				}
			})
		}
	}
}

func TestHandlerProvisionDefaults(t *testing.T) {
	h, _ := provisionHandler(t, &Handler{})
	if h.Table != "test/"+t.Name() || h.MaxSessionIDLength != DefaultMaxSessionIDLength || h.UnknownSession != UnknownSessionReject {
		t.Errorf("defaults not applied: %+v", h)
	}
	if h.table.MaxSessions() != session.DefaultMaxSessions || h.table.TTL() != session.DefaultSessionTTL {
		t.Errorf("table bounds %d, %s; want the defaults", h.table.MaxSessions(), h.table.TTL())
	}
	var d Handler
	if err := d.Provision(newContext(t)); err != nil {
		t.Fatal(err)
	}
	if d.Table != session.DefaultTableName || d.table == nil {
		t.Errorf("Table = %q, want %q", d.Table, session.DefaultTableName)
	}
}

func TestHandlerValidate(t *testing.T) {
	for _, tc := range []struct {
		h    Handler
		want string
	}{
		{Handler{TableSettings: TableSettings{MaxSessions: -1}}, "max_sessions must be positive, got -1"},
		{Handler{TableSettings: TableSettings{SessionTTL: -1}}, "session_ttl -1ns is below the minimum of 1s"},
		{Handler{TableSettings: TableSettings{SessionTTL: caddy.Duration(time.Nanosecond)}}, "session_ttl 1ns is below the minimum of 1s"},
		{Handler{TableSettings: TableSettings{SessionTTL: caddy.Duration(999 * time.Millisecond)}}, "session_ttl 999ms is below the minimum of 1s"},
		{Handler{MaxSessionIDLength: -5}, "max_session_id_length must be positive, got -5"},
		{Handler{UnknownSession: "maybe"}, `unknown_session must be "reject" or "forward", got "maybe"`},
		{Handler{TableSettings: TableSettings{Journal: JournalOn, JournalSessionBytes: 8 << 20, JournalTotalBytes: 1 << 20}},
			"journal_session_bytes 8388608 is above journal_total_bytes 1048576"},
		{Handler{TableSettings: TableSettings{Journal: JournalOn, JournalSessionBytes: 256 << 20}},
			"journal_session_bytes 268435456 is above journal_total_bytes 134217728"}, // the total's default
	} {
		h := tc.h
		h.Table = "validate/" + t.Name()
		err := h.Provision(newContext(t))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Provision(%+v) = %v, want an error containing %q", tc.h, err, tc.want)
		}
		if h.table != nil {
			t.Errorf("an invalid handler got its table")
		}
	}
	if _, ok := tables.References("validate/" + t.Name()); ok {
		t.Errorf("an invalid handler's table is in the pool")
	}
}

// TestHandlersShareTable checks that handlers naming the same table share
// it, that a config's bounds apply when its app starts, and that the table
// lives until the last config using it is unloaded.
func TestHandlersShareTable(t *testing.T) {
	name := "shared/" + t.Name()
	ctx1 := newContext(t)
	h1 := &Handler{TableSettings: TableSettings{MaxSessions: 10}, Table: name}
	if err := h1.Provision(ctx1); err != nil {
		t.Fatal(err)
	}
	startApp(t, ctx1)
	h1.table.Learn("s1", "a:1")
	h1.table.Learn("s2", "a:1")
	h1.table.Learn("s3", "a:1")
	ctx2, cancel2 := caddy.NewContext(newContext(t)) // a reload: the new config provisions first
	h2 := &Handler{TableSettings: TableSettings{MaxSessions: 2}, Table: name}
	if err := h2.Provision(ctx2); err != nil {
		t.Fatal(err)
	}
	if h1.table != h2.table {
		t.Fatal("handlers with the same table name got different tables")
	}
	if h2.table.Len() != 3 {
		t.Errorf("Len() = %d after provisioning a config with max_sessions 2 that has not started, want 3", h2.table.Len())
	}
	startApp(t, ctx2)
	if h2.table.Len() != 2 || h2.table.MaxSessions() != 2 {
		t.Errorf("Len() = %d, max %d once the new config started, want 2, 2", h2.table.Len(), h2.table.MaxSessions())
	}
	cancel2() // the config unloaded; the first still uses the table
	if refs, ok := tables.References(name); !ok || refs != 1 {
		t.Errorf("references after unloading one of two configs: %d, %v; want 1", refs, ok)
	}
	h3 := &Handler{Table: name}
	if err := h3.Provision(ctx1); err != nil {
		t.Fatal(err)
	}
	if h3.table != h1.table || h3.table.Len() != 2 {
		t.Error("the table did not survive while a config still used it")
	}
}

// TestFailedReloadLeavesTable: a config that provisions a handler with
// other bounds and then fails to load (Provision, then Cleanup, never a
// start) must not change the table the running config uses.
func TestFailedReloadLeavesTable(t *testing.T) {
	name := "reload/" + t.Name()
	running, _ := provisionHandler(t, &Handler{TableSettings: TableSettings{MaxSessions: 10, SessionTTL: caddy.Duration(time.Hour)}, Table: name})
	for _, id := range []string{"s1", "s2", "s3"} {
		running.table.Learn(id, "a:1")
	}
	ctx, cancel := caddy.NewContext(newContext(t))
	failed := &Handler{TableSettings: TableSettings{MaxSessions: 1, SessionTTL: caddy.Duration(time.Second)}, Table: name}
	if err := failed.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	if n, max, ttl := running.table.Len(), running.table.MaxSessions(), running.table.TTL(); n != 3 || max != 10 || ttl != time.Hour {
		t.Errorf("after a failed load: %d sessions, max_sessions %d, ttl %s; want 3, 10, 1h", n, max, ttl)
	}
}

// TestConflictingBoundsInOneConfig: places of one config that share a
// table must agree on its bounds; a place that sets nothing agrees with any.
func TestConflictingBoundsInOneConfig(t *testing.T) {
	ctx := newContext(t)
	name := "conflict/" + t.Name()
	for _, h := range []*Handler{{Table: name, TableSettings: TableSettings{MaxSessions: 5}}, {Table: name, TableSettings: TableSettings{MaxSessions: 5}}, {Table: name}} {
		if err := h.Provision(ctx); err != nil {
			t.Fatalf("agreeing bounds: %v", err)
		}
	}
	b := &Handler{TableSettings: TableSettings{MaxSessions: 50000}, Table: name}
	err := b.Provision(ctx)
	if err == nil || !strings.Contains(err.Error(), "different table names") || !strings.Contains(err.Error(), "50000") {
		t.Fatalf("conflicting bounds in one config: err = %v, want one that says what to change", err)
	}
}

// fakeProxy plays reverse_proxy after the handler: it asks the policy for
// an upstream of its pool, as reverse_proxy does, and lets respond answer
// as that upstream.
type fakeProxy struct {
	policy   *SessionSelection
	pool     reverseproxy.UpstreamPool
	respond  func(w http.ResponseWriter, r *http.Request, up *reverseproxy.Upstream)
	selected []*reverseproxy.Upstream // one per call; nil when Select gave none
}

func (p *fakeProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	up := p.policy.Select(p.pool, r, w)
	p.selected = append(p.selected, up)
	if up == nil {
		return caddyhttp.Error(http.StatusServiceUnavailable, errors.New("no upstreams available"))
	}
	p.respond(w, r, up)
	return nil
}

// last returns the upstream selected by the last call.
func (p *fakeProxy) last() *reverseproxy.Upstream {
	if len(p.selected) == 0 {
		return nil
	}
	return p.selected[len(p.selected)-1]
}

// answer returns a respond function that answers status with the given
// Mcp-Session-Id fields and a body naming the upstream.
func answer(status int, ids ...string) func(http.ResponseWriter, *http.Request, *reverseproxy.Upstream) {
	return func(w http.ResponseWriter, _ *http.Request, up *reverseproxy.Upstream) {
		for _, id := range ids {
			w.Header().Add(HeaderSessionID, id)
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "from "+up.Dial)
	}
}

// affinityFixture is a handler and a fake reverse_proxy using its policy.
type affinityFixture struct {
	h     *Handler
	logs  *observer.ObservedLogs
	proxy *fakeProxy
}

func newAffinityFixture(t testing.TB) *affinityFixture {
	t.Helper()
	h, logs := provisionHandler(t, &Handler{})
	policy := provisionPolicy(t, &SessionSelection{Table: h.Table})
	return &affinityFixture{h: h, logs: logs, proxy: &fakeProxy{policy: policy, pool: testPool()}}
}

// serve sends r through the handler; respond answers for the upstream.
func (f *affinityFixture) serve(t testing.TB, r *http.Request, respond func(http.ResponseWriter, *http.Request, *reverseproxy.Upstream)) *httptest.ResponseRecorder {
	t.Helper()
	f.proxy.respond = respond
	rec := httptest.NewRecorder()
	if err := f.h.ServeHTTP(rec, r, f.proxy); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	return rec
}

// initialize sends a request without a session, answered 200 with id, and
// returns the upstream that answered it.
func (f *affinityFixture) initialize(t testing.TB, id string) *reverseproxy.Upstream {
	t.Helper()
	f.serve(t, newRequest(http.MethodPost), answer(http.StatusOK, id))
	up := f.proxy.last()
	if up == nil {
		t.Fatal("initialize: no upstream selected")
	}
	if got := lookupDial(f.h.table, id); got != up.Dial {
		t.Fatalf("after initialize, the table maps the session to %q, want %q", got, up.Dial)
	}
	return up
}

// TestLearning covers which responses to a request without a session teach
// the table a session.
func TestLearning(t *testing.T) {
	for _, tc := range []struct {
		name    string
		respond func(http.ResponseWriter, *http.Request, *reverseproxy.Upstream)
		learn   bool
	}{
		{name: "200", respond: answer(200, testSessionID), learn: true},
		{name: "201", respond: answer(201, testSessionID), learn: true},
		{name: "202", respond: answer(202, testSessionID), learn: true},
		{name: "200 without session", respond: answer(200)},
		{name: "301", respond: answer(301, testSessionID)},
		{name: "400", respond: answer(400, testSessionID)},
		{name: "401", respond: answer(401, testSessionID)},
		{name: "404", respond: answer(404, testSessionID)},
		{name: "421", respond: answer(421, testSessionID)},
		{name: "500", respond: answer(500, testSessionID)},
		{name: "503", respond: answer(503, testSessionID)},
		{name: "two session fields", respond: answer(200, testSessionID, "OTHER")},
		{name: "empty session", respond: answer(200, "")},
		{name: "malformed session", respond: answer(200, "a b")},
		{name: "session over max_session_id_length", respond: answer(200, strings.Repeat("x", DefaultMaxSessionIDLength+1))},
		{
			name: "103 then 200",
			respond: func(w http.ResponseWriter, r *http.Request, up *reverseproxy.Upstream) {
				w.Header().Set("Link", "</style.css>; rel=preload")
				w.WriteHeader(http.StatusEarlyHints)
				w.Header().Del("Link")
				answer(200, testSessionID)(w, r, up)
			},
			learn: true,
		},
		{
			name: "100 then 404",
			respond: func(w http.ResponseWriter, r *http.Request, up *reverseproxy.Upstream) {
				w.WriteHeader(http.StatusContinue)
				answer(404, testSessionID)(w, r, up)
			},
		},
		{
			name: "implicit 200 by Write",
			respond: func(w http.ResponseWriter, _ *http.Request, _ *reverseproxy.Upstream) {
				w.Header().Set(HeaderSessionID, testSessionID)
				_, _ = io.WriteString(w, "data: {}\n\n")
			},
			learn: true,
		},
		{
			name: "implicit 200 by Flush",
			respond: func(w http.ResponseWriter, _ *http.Request, _ *reverseproxy.Upstream) {
				w.Header().Set(HeaderSessionID, testSessionID)
				if err := http.NewResponseController(w).Flush(); err != nil {
					panic(err)
				}
			},
			learn: true,
		},
		{
			name: "implicit 200 by http.Flusher",
			respond: func(w http.ResponseWriter, _ *http.Request, _ *reverseproxy.Upstream) {
				w.Header().Set(HeaderSessionID, testSessionID)
				w.(http.Flusher).Flush()
			},
			learn: true,
		},
		{
			// io.Copy uses the writer's ReadFrom when the reader has no WriteTo.
			name: "implicit 200 by io.Copy",
			respond: func(w http.ResponseWriter, _ *http.Request, _ *reverseproxy.Upstream) {
				w.Header().Set(HeaderSessionID, testSessionID)
				_, _ = io.Copy(w, struct{ io.Reader }{strings.NewReader("data: {}\n\n")})
			},
			learn: true,
		},
		{
			name: "header set after WriteHeader is not seen",
			respond: func(w http.ResponseWriter, _ *http.Request, _ *reverseproxy.Upstream) {
				w.WriteHeader(200)
				w.Header().Set(HeaderSessionID, testSessionID)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newAffinityFixture(t)
			rec := f.serve(t, newRequest(http.MethodPost), tc.respond)
			up := f.proxy.last()
			want := ""
			if tc.learn {
				want = up.Dial
			}
			if got := lookupDial(f.h.table, testSessionID); got != want {
				t.Errorf("table maps the session to %q, want %q", got, want)
			}
			wantLen := 0
			if tc.learn {
				wantLen = 1
			}
			if f.h.table.Len() != wantLen {
				t.Errorf("Len() = %d, want %d", f.h.table.Len(), wantLen)
			}
			// The response passes unchanged.
			if rec.Header().Get("Content-Type") == "application/json" && strings.Contains(rec.Body.String(), "jsonrpc") {
				t.Errorf("the handler answered itself: %s", rec.Body)
			}
			// Session IDs are logged only as fingerprints.
			for _, e := range f.logs.All() {
				if strings.Contains(fmt.Sprint(e.ContextMap()), testSessionID) {
					t.Errorf("log entry %q carries the session ID in clear: %v", e.Message, e.ContextMap())
				}
			}
		})
	}
}

// TestLearnAtWriteHeader checks that the session is in the table as soon as
// the response headers are written, before the body (an SSE stream may
// keep the body open for as long as the session lives).
func TestLearnAtWriteHeader(t *testing.T) {
	f := newAffinityFixture(t)
	var atHeader, beforeHeader string
	f.serve(t, newRequest(http.MethodPost), func(w http.ResponseWriter, _ *http.Request, up *reverseproxy.Upstream) {
		w.Header().Set(HeaderSessionID, testSessionID)
		w.Header().Set("Content-Type", "text/event-stream")
		beforeHeader = lookupDial(f.h.table, testSessionID)
		w.WriteHeader(http.StatusOK)
		atHeader = lookupDial(f.h.table, testSessionID)
		_, _ = io.WriteString(w, "event: message\ndata: {}\n\n")
	})
	if beforeHeader != "" {
		t.Errorf("session learned before WriteHeader: %q", beforeHeader)
	}
	if atHeader != f.proxy.last().Dial {
		t.Errorf("right after WriteHeader the table maps the session to %q, want %q", atHeader, f.proxy.last().Dial)
	}
}

// TestLearnNeedsPolicy checks that without the mcp_session policy (nothing
// recorded which upstream answered) nothing is learned, and one warning
// (not one per request) says why.
func TestLearnNeedsPolicy(t *testing.T) {
	h, logs := provisionHandler(t, &Handler{})
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		answer(200, testSessionID)(w, r, &reverseproxy.Upstream{Dial: "10.0.0.1:8080"})
		return nil
	})
	for range 3 {
		if err := h.ServeHTTP(httptest.NewRecorder(), newRequest(http.MethodPost), next); err != nil {
			t.Fatal(err)
		}
	}
	if h.table.Len() != 0 {
		t.Errorf("Len() = %d, want 0", h.table.Len())
	}
	if n := logs.FilterMessageSnippet("lb_policy mcp_session").FilterLevelExact(zapcore.WarnLevel).Len(); n != 1 {
		t.Errorf("%d warnings naming lb_policy mcp_session, want 1; logs: %v", n, logs.All())
	}
}

func TestPinnedRequestsStick(t *testing.T) {
	f := newAffinityFixture(t)
	up := f.initialize(t, testSessionID)
	other := f.initialize(t, "OTHERSESSION")
	if other == up {
		t.Fatal("least_sessions gave the second session the upstream of the first")
	}
	for i := range 9 {
		method := []string{http.MethodPost, http.MethodGet, http.MethodPost}[i%3]
		rec := f.serve(t, newRequest(method, testSessionID), answer(200))
		if f.proxy.last() != up {
			t.Fatalf("request %d (%s) went to %v, want the session's upstream %v", i, method, f.proxy.last(), up)
		}
		if rec.Body.String() != "from "+up.Dial {
			t.Errorf("body = %q", rec.Body)
		}
	}
	// Requests without a session are still balanced: least_sessions sends
	// them to the one upstream without a session.
	for range 3 {
		f.serve(t, newRequest(http.MethodPost), answer(202))
		if last := f.proxy.last(); last == up || last == other {
			t.Errorf("a request without a session went to %s, which has a session; want the third upstream", last.Dial)
		}
	}
}

// TestPinnedResponses covers what the upstream's answer to a request of a
// known session does to the table.
func TestPinnedResponses(t *testing.T) {
	for _, tc := range []struct {
		method  string
		respond func(http.ResponseWriter, *http.Request, *reverseproxy.Upstream)
		evicted session.EvictReason // 0 (no reason) if the session stays
	}{
		{method: "POST", respond: answer(200)},
		{method: "POST", respond: answer(202)},
		{method: "GET", respond: answer(200)},
		{method: "POST", respond: answer(404), evicted: session.EvictUpstream404},
		{method: "GET", respond: answer(404)}, // no GET route: not "session unknown"
		{method: "DELETE", respond: answer(404), evicted: session.EvictUpstream404},
		{method: "DELETE", respond: answer(200), evicted: session.EvictDelete},
		{method: "DELETE", respond: answer(202), evicted: session.EvictDelete},
		{method: "DELETE", respond: answer(204), evicted: session.EvictDelete},
		{method: "DELETE", respond: answer(405)},
		{method: "DELETE", respond: answer(400)},
		{method: "DELETE", respond: answer(500)},
		{method: "POST", respond: answer(400)},
		{method: "POST", respond: answer(401)},
		{method: "POST", respond: answer(403)},
		{method: "POST", respond: answer(421)},
		{method: "POST", respond: answer(500)},
		{method: "POST", respond: answer(503)},
		{method: "GET", respond: answer(405)},
		{method: "POST", respond: func(w http.ResponseWriter, r *http.Request, up *reverseproxy.Upstream) {
			w.WriteHeader(http.StatusEarlyHints)
			answer(404)(w, r, up)
		}, evicted: session.EvictUpstream404},
	} {
		rec := httptest.NewRecorder()
		tc.respond(rec, nil, &reverseproxy.Upstream{})
		t.Run(fmt.Sprintf("%s %d", tc.method, rec.Code), func(t *testing.T) {
			f := newAffinityFixture(t)
			up := f.initialize(t, testSessionID)
			rec := f.serve(t, newRequest(tc.method, testSessionID), tc.respond)
			if f.proxy.last() != up {
				t.Fatalf("request went to %v, want %v", f.proxy.last(), up)
			}
			// The upstream's answer passes unchanged.
			if want := "from " + up.Dial; rec.Body.String() != want {
				t.Errorf("body = %q, want %q", rec.Body, want)
			}
			got := lookupDial(f.h.table, testSessionID)
			live := f.h.table.KnownUpstream(up.Dial).LiveSessions()
			if tc.evicted == 0 {
				if got != up.Dial || live != 1 {
					t.Errorf("session mapped to %q with %d live, want it kept on %q", got, live, up.Dial)
				}
				wantEvictions(t, f.h.table, nil)
				return
			}
			if got != "" || live != 0 {
				t.Errorf("session mapped to %q with %d live, want it evicted", got, live)
			}
			wantEvictions(t, f.h.table, map[session.EvictReason]uint64{tc.evicted: 1})
			// The next request of the session is unknown: 404.
			rec = f.serve(t, newRequest(http.MethodPost, testSessionID), answer(200))
			checkRPCError(t, rec, 404, CodeSessionNotFound, "Session not found")
		})
	}
}

// TestPinnedResponseNeverRelearns checks that a 2xx response to a request
// that carried a session changes no mapping, whatever session it names.
func TestPinnedResponseNeverRelearns(t *testing.T) {
	f := newAffinityFixture(t)
	up := f.initialize(t, testSessionID)
	for _, id := range []string{testSessionID, "NEWSESSION", "a b"} {
		f.serve(t, newRequest(http.MethodPost, testSessionID), answer(200, id))
	}
	if got := lookupDial(f.h.table, testSessionID); got != up.Dial {
		t.Errorf("session mapped to %q, want %q", got, up.Dial)
	}
	if f.h.table.Lookup("NEWSESSION") != nil || f.h.table.Len() != 1 {
		t.Errorf("a response to a pinned request taught a session; Len() = %d", f.h.table.Len())
	}
	wantEvictions(t, f.h.table, nil)
}

// TestForwardUnknownSession checks unknown_session forward: the request goes
// to the fallback policy and its answer teaches nothing.
func TestForwardUnknownSession(t *testing.T) {
	h, _ := provisionHandler(t, &Handler{UnknownSession: UnknownSessionForward})
	proxy := &fakeProxy{policy: provisionPolicy(t, &SessionSelection{}), pool: testPool(), respond: answer(200, testSessionID)}
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, newRequest(http.MethodPost, testSessionID), proxy); err != nil {
		t.Fatal(err)
	}
	if proxy.last() == nil || rec.Code != 200 {
		t.Fatalf("forwarded request: selected %v, status %d", proxy.last(), rec.Code)
	}
	if h.table.Len() != 0 {
		t.Errorf("Len() = %d, want 0", h.table.Len())
	}
}

// TestPinnedUpstreamGone checks that a session whose upstream left the pool
// is dropped and answered 404 without trying another upstream.
func TestPinnedUpstreamGone(t *testing.T) {
	f := newAffinityFixture(t)
	up := f.initialize(t, testSessionID)
	var rest reverseproxy.UpstreamPool
	for _, u := range f.proxy.pool {
		if u != up {
			rest = append(rest, u)
		}
	}
	f.proxy.pool = rest
	r := newRequest(http.MethodPost, testSessionID)
	rec := f.serve(t, r, answer(200))
	if f.proxy.last() != nil {
		t.Errorf("request went to %v, want no upstream", f.proxy.last())
	}
	if !exchangeOf(r).gone {
		t.Error("the exchange does not say the upstream is gone")
	}
	checkRPCError(t, rec, 404, CodeSessionNotFound, "its upstream is gone")
	if f.h.table.Len() != 0 {
		t.Errorf("Len() = %d, want 0", f.h.table.Len())
	}
	wantEvictions(t, f.h.table, map[session.EvictReason]uint64{session.EvictUpstreamGone: 1})
	for _, u := range f.h.table.Upstreams() {
		if u.LiveSessions() != 0 {
			t.Errorf("LiveSessions of %s = %d, want 0", u.Dial(), u.LiveSessions())
		}
	}
}

// TestPinnedErrors checks that errors of the proxy other than a gone
// upstream keep the session: one before any header is answered with the
// proxy's JSON-RPC 502 (gateway.go), one after the header passes through.
func TestPinnedErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		next     func(w http.ResponseWriter) error
		answered bool // the handler writes the proxy's 502 and returns nil
	}{
		{"502 before any header", func(http.ResponseWriter) error {
			return caddyhttp.Error(http.StatusBadGateway, errors.New("read: connection reset by peer"))
		}, true},
		{"error after the header", func(w http.ResponseWriter) error {
			w.WriteHeader(200)
			return caddyhttp.Error(http.StatusBadGateway, errors.New("stream cut"))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newAffinityFixture(t)
			f.initialize(t, testSessionID)
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				if f.proxy.policy.Select(f.proxy.pool, r, w) == nil {
					t.Fatal("no upstream selected")
				}
				return tc.next(w)
			})
			rec := httptest.NewRecorder()
			err := f.h.ServeHTTP(rec, newRequest(http.MethodPost, testSessionID), next)
			var he caddyhttp.HandlerError
			switch {
			case tc.answered && err != nil:
				t.Errorf("ServeHTTP = %v, want nil: the handler answers the 502 itself", err)
			case tc.answered && (rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), `"code":-32003`)):
				t.Errorf("answer %d %s, want the proxy's 502 with JSON-RPC -32003", rec.Code, rec.Body)
			case !tc.answered && (!errors.As(err, &he) || he.StatusCode != http.StatusBadGateway):
				t.Errorf("ServeHTTP = %v, want reverse_proxy's 502", err)
			}
			if f.h.table.Len() != 1 {
				t.Errorf("Len() = %d, want the session kept", f.h.table.Len())
			}
		})
	}
}

// streamsOf returns the count of open streams the table holds for id.
func streamsOf(tbl *session.Table, id string) int32 {
	info, _ := tbl.Info(id)
	return int32(info.OpenStreams)
}

// TestGetStreamOpen checks that a GET of a session counts as an open stream
// while it is proxied, and only a GET.
func TestGetStreamOpen(t *testing.T) {
	for _, tc := range []struct {
		method string
		want   int32
	}{{http.MethodGet, 1}, {http.MethodPost, 0}, {http.MethodDelete, 0}} {
		t.Run(tc.method, func(t *testing.T) {
			f := newAffinityFixture(t)
			f.initialize(t, testSessionID)
			var during int32 = -1
			f.serve(t, newRequest(tc.method, testSessionID), func(w http.ResponseWriter, r *http.Request, up *reverseproxy.Upstream) {
				during = streamsOf(f.h.table, testSessionID)
				answer(200)(w, r, up)
			})
			if during != tc.want {
				t.Errorf("open streams while proxying = %d, want %d", during, tc.want)
			}
			if after := streamsOf(f.h.table, testSessionID); after != 0 {
				t.Errorf("open streams after the response = %d, want 0", after)
			}
		})
	}
}

// TestBodyShorterThanContentLength: a body that ends before its
// Content-Length (an HTTP/2 stream ended early; over HTTP/1.1 the client
// closes, see TestSlowUploadIsNotAFrozenUpstream) is the client's fault: 400
// from the proxy, no upstream contacted, so none is marked failed. A whole
// body reaches next intact.
func TestBodyShorterThanContentLength(t *testing.T) {
	h, _ := provisionHandler(t, &Handler{})
	next := new(countingNext)
	rec := httptest.NewRecorder()
	r := newRequest(http.MethodPost)
	r.ContentLength = 100 // the body has 40 bytes
	if err := h.ServeHTTP(rec, r, next); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	if next.calls != 0 {
		t.Errorf("next called %d times, want 0", next.calls)
	}
	checkRPCError(t, rec, http.StatusBadRequest, CodeInvalidRequest, "fewer than its Content-Length of 100 bytes")

	var got []byte
	r = newRequest(http.MethodPost)
	whole := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		got, _ = io.ReadAll(r.Body)
		return nil
	})
	if err := h.ServeHTTP(httptest.NewRecorder(), r, whole); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	if string(got) != `{"jsonrpc":"2.0","id":1,"method":"ping"}` {
		t.Errorf("next read %q, want the whole body", got)
	}
}
