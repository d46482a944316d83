package caddymodule

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/seal"
)

// chunkRecorder records each write the client gets, with the response.
type chunkRecorder struct {
	*httptest.ResponseRecorder
	chunks []string
}

func (c *chunkRecorder) Write(b []byte) (int, error) {
	c.chunks = append(c.chunks, string(b))
	return c.ResponseRecorder.Write(b)
}

// legacyGet returns a GET of the legacy transport's SSE endpoint at path,
// carrying the client's original request as Caddy's server records it.
func legacyGet(path, origPath string) *http.Request {
	r := newRequest(http.MethodGet)
	r.URL.Path = path
	orig := r.Clone(r.Context())
	orig.URL.Path = origPath
	return r.WithContext(context.WithValue(r.Context(), caddyhttp.OriginalRequestCtxKey, *orig))
}

// legacyPost returns a POST to the message endpoint with query q.
func legacyPost(q string) *http.Request {
	r := newRequest(http.MethodPost)
	r.URL.RawQuery = q
	return r
}

// streamEvents answers as a legacy server: an SSE response written in
// the given writes, with during called after them, while the stream is open.
func streamEvents(during func(), writes ...string) func(http.ResponseWriter, *http.Request, *reverseproxy.Upstream) {
	return func(w http.ResponseWriter, _ *http.Request, _ *reverseproxy.Upstream) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for _, s := range writes {
			_, _ = io.WriteString(w, s)
		}
		during()
	}
}

// TestLegacySSESession follows a legacy session through the handler: the
// endpoint event, split across writes, teaches the session while its
// stream is open; it reaches the client as written, in one piece, and
// later events as they are written; POSTs of the session go to the
// stream's upstream; the session ends with the stream.
func TestLegacySSESession(t *testing.T) {
	f := newAffinityFixture(t)
	var streamUp, postUp *reverseproxy.Upstream
	during := ""
	rec := &chunkRecorder{ResponseRecorder: httptest.NewRecorder()}
	f.proxy.respond = streamEvents(func() {
		streamUp = f.proxy.last()
		during = lookupDial(f.h.table, "A")
		f.serve(t, legacyPost("sessionid=A"), answer(http.StatusAccepted))
		postUp = f.proxy.last()
	}, ": hello\n\n", "event: endpoint\ndata: /sse?sess", "ionid=A\n", "\nevent: message\n", "data: {}\n\n")
	if err := f.h.ServeHTTP(rec, legacyGet("/sse", "/sse"), f.proxy); err != nil {
		t.Fatal(err)
	}
	want := []string{": hello\n\n", "event: endpoint\ndata: /sse?sessionid=A\n\n", "event: message\n", "data: {}\n\n"}
	if strings.Join(rec.chunks, "|") != strings.Join(want, "|") {
		t.Errorf("the client got the writes %q, want %q", rec.chunks, want)
	}
	if during != streamUp.Dial || postUp != streamUp {
		t.Errorf("while the stream was open: session on %q, POST sent to %v; want both on the stream's upstream %s", during, postUp, streamUp.Dial)
	}
	if up := f.h.table.Lookup("A"); up != nil || f.h.table.Evictions(session.EvictStreamClosed) != 1 {
		t.Errorf("after the stream closed: session on %v, %d stream_closed evictions; want it gone", up, f.h.table.Evictions(session.EvictStreamClosed))
	}
}

// TestLegacySSEPostRefused covers POSTs the proxy answers itself: an
// unknown legacy session (404, like any unknown session), and a query that
// names the session twice (400).
func TestLegacySSEPostRefused(t *testing.T) {
	for _, tc := range []struct {
		query  string
		status int
	}{
		{"sessionId=never-learned", http.StatusNotFound},
		{"session_id=A&sessionid=B", http.StatusBadRequest},
		{"sessionId=A&sessionId=A", http.StatusBadRequest},
		{"sessionId=", http.StatusBadRequest},
	} {
		t.Run(tc.query, func(t *testing.T) {
			h, _ := provisionHandler(t, &Handler{})
			next := &countingNext{}
			rec := httptest.NewRecorder()
			r := legacyPost(tc.query)
			init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}` // never a stale initialize
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(init)), int64(len(init))
			if err := h.ServeHTTP(rec, r, next); err != nil {
				t.Fatal(err)
			}
			if rec.Code != tc.status || next.calls != 0 {
				t.Errorf("POST ?%s: %d, %d upstream calls; want %d from the proxy", tc.query, rec.Code, next.calls, tc.status)
			}
		})
	}
}

// TestLegacySSEOff checks that with legacy pinning off, an endpoint event
// teaches nothing and a POST carrying a session parameter is balanced.
func TestLegacySSEOff(t *testing.T) {
	f := newAffinityFixture(t)
	f.h.DisableLegacySSE = true
	rec := f.serve(t, legacyGet("/sse", "/sse"), streamEvents(func() {}, "event: endpoint\ndata: /sse?sessionid=A\n\n"))
	if f.h.table.Len() != 0 || rec.Body.String() != "event: endpoint\ndata: /sse?sessionid=A\n\n" {
		t.Errorf("legacy_sse off: %d sessions learned, body %q", f.h.table.Len(), rec.Body)
	}
	rec = f.serve(t, legacyPost("sessionid=A"), answer(http.StatusAccepted))
	if rec.Code != http.StatusAccepted {
		t.Errorf("legacy_sse off: POST got %d, want the upstream's 202", rec.Code)
	}
}

// TestLegacySSEStreamsOthersUnread checks that GET streams whose first
// event is not an endpoint event pass unchanged and teach nothing.
func TestLegacySSEStreamsOthersUnread(t *testing.T) {
	for _, body := range []string{
		"event: message\ndata: /sse?sessionid=A\n\n",
		"data: /sse?sessionid=A\n\n",
		"event: endpoint\ndata: /sse?other=A\n\n",
		"event: endpoint\ndata: /a?sessionid=A\ndata: /b\n\n",
		strings.Repeat(":", maxEndpointEvent+1),
	} {
		f := newAffinityFixture(t)
		rec := f.serve(t, legacyGet("/sse", "/sse"), streamEvents(func() {}, body))
		if f.h.table.Len() != 0 || rec.Body.String() != body {
			t.Errorf("stream %.40q: %d sessions learned, body changed: %v", body, f.h.table.Len(), rec.Body.String() != body)
		}
	}
}

func TestClientEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name, dial, path, orig, endpoint, want string
	}{
		{"relative", "10.0.0.1:8080", "/sse", "/sse", "messages?sessionId=A", ""},
		{"root-relative, no prefix", "10.0.0.1:8080", "/sse", "/sse", "/messages?sessionId=A", ""},
		{"prefix stripped", "10.0.0.1:8080", "/sse", "/mcp/sse", "/messages?sessionId=A", "/mcp/messages?sessionId=A"},
		{"prefix present", "10.0.0.1:8080", "/sse", "/mcp/sse", "/mcp/messages?sessionId=A", ""},
		{"prefix, escaped path", "10.0.0.1:8080", "/sse", "/mcp/sse", "/a%2Fb?sessionId=A", "/mcp/a%2Fb?sessionId=A"},
		{"upstream's address", "10.0.0.1:8080", "/sse", "/sse", "http://10.0.0.1:8080/message?sessionId=A", "/message?sessionId=A"},
		{"upstream's address, prefix", "10.0.0.1:8080", "/sse", "/mcp/sse", "http://10.0.0.1:8080/message?sessionId=A", "/mcp/message?sessionId=A"},
		{"loopback name", "127.0.0.1:9001", "/sse", "/sse", "http://localhost:9001/message?sessionId=A", "/message?sessionId=A"},
		{"loopback, other port", "127.0.0.1:9001", "/sse", "/sse", "http://localhost:9002/message?sessionId=A", ""},
		{"unix socket", "unix//run/mcp/w.sock", "/sse", "/sse", "http://localhost/messages/?session_id=A", "/messages/?session_id=A"},
		{"another host", "10.0.0.1:8080", "/sse", "/mcp/sse", "https://mcp.example.com/message?sessionId=A", ""},
		{"the client's host", "10.0.0.1:8080", "/sse", "/mcp/sse", "http://proxy.example.com/message?sessionId=A", "http://proxy.example.com/mcp/message?sessionId=A"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := legacyGet(tc.path, tc.orig)
			r.Host = "proxy.example.com"
			repl := caddy.NewReplacer()
			r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
			u, err := url.Parse(tc.endpoint)
			if err != nil {
				t.Fatal(err)
			}
			if got := clientEndpoint(r, u, tc.dial); got != tc.want {
				t.Errorf("clientEndpoint(%q) = %q, want %q", tc.endpoint, got, tc.want)
			}
		})
	}
}

// TestLegacySSERewrite checks that a rewritten endpoint event reaches the
// client with only its URL changed.
func TestLegacySSERewrite(t *testing.T) {
	f := newAffinityFixture(t)
	rec := f.serve(t, legacyGet("/sse", "/tenant/sse"), streamEvents(func() {}, "id: 1\r\nevent: endpoint\r\ndata: /sse?sessionid=A\r\nretry: 5\r\n\r\n"))
	if want := "id: 1\r\nevent: endpoint\r\ndata: /tenant/sse?sessionid=A\r\nretry: 5\r\n\r\n"; rec.Body.String() != want {
		t.Errorf("body %q, want %q", rec.Body, want)
	}
}

// TestLegacySSEStreamAborted checks that a stream reverse_proxy aborts
// (it panics with http.ErrAbortHandler when the client goes away) still
// ends its session.
func TestLegacySSEStreamAborted(t *testing.T) {
	f := newAffinityFixture(t)
	f.proxy.respond = streamEvents(func() { panic(http.ErrAbortHandler) }, "event: endpoint\ndata: /sse?sessionid=A\n\n")
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Fatalf("recovered %v, want http.ErrAbortHandler", v)
			}
		}()
		_ = f.h.ServeHTTP(httptest.NewRecorder(), legacyGet("/sse", "/sse"), f.proxy)
	}()
	if f.h.table.Len() != 0 || f.h.table.Evictions(session.EvictStreamClosed) != 1 {
		t.Errorf("after an aborted stream: %d sessions, %d stream_closed evictions; want 0, 1", f.h.table.Len(), f.h.table.Evictions(session.EvictStreamClosed))
	}
}

// TestLegacySSEParamsValidate: a JSON config's legacy_sse_params must be
// names a legacy endpoint can write as `?<name>=<session>`.
func TestLegacySSEParamsValidate(t *testing.T) {
	for _, tc := range []struct {
		params []string
		ok     bool
	}{
		{nil, true},
		{[]string{"session_id", "sid"}, true},
		{[]string{""}, false},
		{[]string{"session_id", "?x="}, false},
		{[]string{"a&b"}, false},
		{[]string{"session id"}, false},
	} {
		err := (&Handler{LegacySSEParams: tc.params}).Validate()
		if (err == nil) != tc.ok {
			t.Errorf("Validate with legacy_sse_params %q: %v, want ok %v", tc.params, err, tc.ok)
		}
	}
}

// TestEverySessionNamedIsChecked: bob may use his own sessions only, however
// a request names a session. A request naming two sessions (his own in
// Mcp-Session-Id, alice's in the query of a legacy POST, which a legacy
// server reads) is refused with 400 before any lookup, whatever its method
// and whether the header is sealed; so is a query that names a session in a
// way servers read differently than the proxy (twice, in brackets, past
// 10000 pairs, with ';', with a bad escape). A session named in the query
// of any method is checked against its principal (python-sdk's message
// endpoint takes any method); only a CORS preflight, an OPTIONS without a
// body, is balanced as a request without a session. The same session in
// the header and the query is served as that session's.
func TestEverySessionNamedIsChecked(t *testing.T) {
	const alice, bob = "ALICELEGACYSESSION", "BOBLEGACYSESSION"
	h, _ := provisionHandler(t, &Handler{SealSessionIDs: &SealedSessionIDs{Keys: []string{base64.StdEncoding.EncodeToString(newKey(t))}}})
	h.table.SetBindPrincipal("{http.request.header.Authorization}")
	h.table.LearnFrom(alice, "a:1", session.Origin{Principal: "Bearer alice"})
	h.table.LearnFrom(bob, "a:1", session.Origin{Principal: "Bearer bob"})
	bobSealed := h.sealer.seal(seal.Session{Dial: "a:1", Bound: principalDigest("Bearer bob"), ID: "BOBSTREAMABLE"})
	for _, tc := range []struct {
		name, method, query string
		header              []string // Mcp-Session-Id values
		noBody              bool
		status, calls       int
		reason              string // in the 400's JSON-RPC message
	}{
		{name: "alice's session in the query, bob's in the header", query: "sessionId=" + alice, header: []string{bob}, status: 400, reason: "two sessions"},
		{name: "the same, under another parameter", query: "x=1&sessionid=" + alice, header: []string{bob}, status: 400, reason: "two sessions"},
		{name: "the same, GET", method: http.MethodGet, query: "session_id=" + alice, header: []string{bob}, noBody: true, status: 400, reason: "two sessions"},
		{name: "the same, DELETE", method: http.MethodDelete, query: "sessionId=" + alice, header: []string{bob}, status: 400, reason: "two sessions"},
		{name: "bob's sealed session in the header", query: "sessionId=" + alice, header: []string{bobSealed}, status: 400, reason: "two sessions"},
		{name: "bob's sealed session in the header, his own legacy one in the query", query: "sessionId=" + bob, header: []string{bobSealed}, status: 400, reason: "two sessions"},
		{name: "a session made up in the header", query: "sessionId=" + alice, header: []string{"NEVERLEARNED"}, status: 400, reason: "two sessions"},
		{name: "the query names two, the header one", query: "sessionId=" + bob + "&sessionId=" + alice, header: []string{bob}, status: 400, reason: "more than once"},
		{name: "the query names two under two names", query: "sessionId=" + bob + "&session_id=" + alice, status: 400, reason: "more than once"},
		{name: "the header twice", query: "sessionId=" + bob, header: []string{bob, alice}, status: 400, reason: "sent 2 times"},
		{name: "an empty session in the query, bob's in the header", query: "sessionId=", header: []string{bob}, status: 400, reason: "is empty"},
		{name: "brackets (Express's qs reads sessionId)", query: "sessionId[]=" + alice, status: 400, reason: "without brackets"},
		{name: "encoded brackets", query: "sessionId%5B0%5D=" + alice, status: 400, reason: "without brackets"},
		{name: "past 10000 pairs (Go's url.ParseQuery reads none)", query: "sessionId=" + alice + strings.Repeat("&", 10000), status: 404},
		{name: "past 10000 pairs, bob's own", query: "sessionId=" + bob + strings.Repeat("&", 10000), status: 200, calls: 1},
		{name: "';' in the pair", query: "x;sessionId=" + alice, status: 400, reason: "';'"},
		{name: "';' in the value", query: "sessionId=" + alice + ";x", status: 400, reason: "';'"},
		{name: "a bad escape", query: "sessionId=" + alice + "%zz", status: 400, reason: "percent-encoding"},
		{name: "percent-encoded name", query: "session%49d=" + alice, status: 404},
		{name: "alice's session in a POST's query", query: "sessionId=" + alice, status: 404},
		{name: "alice's session in a PUT's query", method: http.MethodPut, query: "session_id=" + alice, status: 404},
		{name: "alice's session in a GET's query", method: http.MethodGet, query: "sessionId=" + alice, noBody: true, status: 404},
		{name: "alice's session in an OPTIONS with a body", method: http.MethodOptions, query: "sessionId=" + alice, status: 404},
		{name: "CORS preflight of alice's session", method: http.MethodOptions, query: "sessionId=" + alice, noBody: true, status: 200, calls: 1},
		{name: "alice's session in the header and the query", query: "sessionId=" + alice, header: []string{alice}, status: 404},
		{name: "bob's own session in the header and the query", query: "sessionId=" + bob, header: []string{bob}, status: 200, calls: 1},
		{name: "bob's own session in a PUT's query", method: http.MethodPut, query: "sessionId=" + bob, status: 200, calls: 1},
		{name: "bob's sealed session alone", query: "x=1", header: []string{bobSealed}, status: 200, calls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = strings.NewReader(`{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"whoami"}}`)
			if tc.noBody {
				body = nil
			}
			r := httptest.NewRequest(cmp.Or(tc.method, http.MethodPost), "/messages?"+tc.query, body)
			r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
			r.Header[HeaderSessionID] = tc.header
			r.Header.Set("Authorization", "Bearer bob")
			caddyhttp.NewTestReplacer(r)
			rec, next := httptest.NewRecorder(), new(countingNext)
			if err := h.ServeHTTP(rec, r, next); err != nil {
				t.Fatal(err)
			}
			if rec.Code != tc.status || next.calls != tc.calls {
				t.Fatalf("%s ?%.60s with Mcp-Session-Id %q: %d %q, %d upstream calls; want %d, %d calls",
					r.Method, tc.query, tc.header, rec.Code, rec.Body, next.calls, tc.status, tc.calls)
			}
			if tc.status == http.StatusBadRequest {
				var b rpcBody
				if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil || b.JSONRPC != "2.0" || !strings.Contains(b.Error.Message, tc.reason) {
					t.Errorf("400 body %q (%v); want a JSON-RPC error saying %q", rec.Body, err, tc.reason)
				}
			}
		})
	}
	if up, _ := h.table.LookupAs(alice, "Bearer alice"); up == nil {
		t.Error("alice's session is gone after bob's attempts")
	}
}
