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

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// modernHeaders are the headers of a 2026-07-28 request of method, with
// Mcp-Name name unless name is "".
func modernHeaders(method, name string) http.Header {
	h := http.Header{HeaderProtocolVersion: {ModernProtocolVersion}, HeaderMethod: {method}}
	if name != "" {
		h[HeaderName] = []string{name}
	}
	return h
}

// toolCall is the body of a tools/call of tool, with the _meta a 2026-07-28
// client sends.
func toolCall(tool string) string {
	return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + tool +
		`","arguments":{"size":3},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
}

// matchRequest returns a POST with header and body, prepared as Caddy's
// server prepares one.
func matchRequest(header http.Header, body string) *http.Request {
	r := caddyRequest(body, nil)
	for k, v := range header {
		r.Header[k] = v
	}
	return r
}

// provisionMatcher provisions m and fails the test on error.
func provisionMatcher(t testing.TB, m *MatchMCP) *MatchMCP {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := m.Provision(ctx); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	return m
}

// wantFault is the fault a matcher must record: status, JSON-RPC code and
// a part of the message.
type wantFault struct {
	status int
	code   int
	msg    string
}

func TestMatchMCP(t *testing.T) {
	tools := MatchMCP{Methods: []string{"tools/call"}, Names: []string{"render_*"}}
	checked := MatchMCP{Methods: []string{"tools/call"}, Names: []string{"render_*"}, Body: true}
	legacy := http.Header{HeaderProtocolVersion: {"2025-11-25"}}
	for _, tc := range []struct {
		name    string
		m       MatchMCP
		header  http.Header
		body    string
		want    bool
		fault   *wantFault
		method  string // the method the exchange knows afterwards
		nameGot string
	}{
		// headers of 2026-07-28 requests
		{name: "method and name", m: tools, header: modernHeaders("tools/call", "render_chart"), want: true, method: "tools/call", nameGot: "render_chart"},
		{name: "other tool", m: tools, header: modernHeaders("tools/call", "whoami"), method: "tools/call", nameGot: "whoami"},
		{name: "other method", m: tools, header: modernHeaders("tools/list", ""), method: "tools/list"},
		{name: "name of a method without names", m: MatchMCP{Names: []string{"*"}}, header: modernHeaders("tools/list", "render_chart"), method: "tools/list"},
		{name: "method only", m: MatchMCP{Methods: []string{"server/discover"}}, header: modernHeaders("server/discover", ""), want: true},
		{name: "several methods", m: MatchMCP{Methods: []string{"tools/list", "prompts/list"}}, header: modernHeaders("prompts/list", ""), want: true},
		{name: "method wildcard", m: MatchMCP{Methods: []string{"resources/*"}}, header: modernHeaders("resources/templates/list", ""), want: true},
		{name: "name prefix", m: MatchMCP{Names: []string{"render_*"}}, header: modernHeaders("tools/call", "render_"), want: true},
		{name: "name suffix", m: MatchMCP{Names: []string{"*_v2"}}, header: modernHeaders("tools/call", "render_chart_v2"), want: true},
		{name: "name middle", m: MatchMCP{Names: []string{"render_*_v2"}}, header: modernHeaders("tools/call", "render_chart_v3"), method: "tools/call", nameGot: "render_chart_v3"},
		{name: "name two stars", m: MatchMCP{Names: []string{"*chart*"}}, header: modernHeaders("prompts/get", "a_chart_b"), want: true},
		{name: "name is case-sensitive", m: MatchMCP{Names: []string{"render_*"}}, header: modernHeaders("tools/call", "Render_chart"), method: "tools/call", nameGot: "Render_chart"},
		{name: "resource URI across slashes", m: MatchMCP{Names: []string{"file:///reports/*"}}, header: modernHeaders("resources/read", "file:///reports/2026/q3.pdf"), want: true},
		{name: "Base64 name", m: tools, header: modernHeaders("tools/call", "=?base64?cmVuZGVyX2NoYXJ0?="), want: true, nameGot: "render_chart"},
		{name: "Base64 non-ASCII name", m: MatchMCP{Names: []string{"日本*"}}, header: modernHeaders("tools/call", "=?base64?5pel5pys6Kqe?="), want: true, nameGot: "日本語"},
		{name: "later protocol version", m: tools, header: http.Header{HeaderProtocolVersion: {"2027-01-01"}, HeaderMethod: {"tools/call"}, HeaderName: {"render_x"}}, want: true},

		// headers older servers never validate are not trusted
		{name: "Mcp-Method with a legacy version", m: tools, header: http.Header{HeaderProtocolVersion: {"2025-11-25"}, HeaderMethod: {"tools/call"}, HeaderName: {"render_x"}}},
		{name: "Mcp-Method without a version", m: tools, header: http.Header{HeaderMethod: {"tools/call"}, HeaderName: {"render_x"}}},
		{name: "Mcp-Method with a non-date version", m: tools, header: http.Header{HeaderProtocolVersion: {"latest"}, HeaderMethod: {"tools/call"}, HeaderName: {"render_x"}}},

		// eras
		{name: "era modern", m: MatchMCP{Eras: []string{"modern_sessionless"}}, header: modernHeaders("tools/list", ""), want: true},
		{name: "era other", m: MatchMCP{Eras: []string{"other_sessionless"}}, header: legacy, want: true},
		{name: "era other, modern request", m: MatchMCP{Eras: []string{"other_sessionless"}}, header: modernHeaders("tools/list", "")},
		{name: "session, era listed", m: MatchMCP{Eras: []string{"legacy_session"}}, header: http.Header{HeaderSessionID: {testSessionID}}, want: true},
		{name: "session, no era listed", m: MatchMCP{}, header: http.Header{HeaderSessionID: {testSessionID}}},
		{name: "session, other eras listed", m: MatchMCP{Eras: []string{"modern_sessionless", "other_sessionless"}}, header: http.Header{HeaderSessionID: {testSessionID}}},
		{name: "no conditions", m: MatchMCP{}, header: legacy, want: true},

		// protocol versions
		{name: "version >=, modern", m: MatchMCP{ProtocolVersion: []string{">=2026-07-28"}}, header: modernHeaders("ping", ""), want: true},
		{name: "version >=, legacy", m: MatchMCP{ProtocolVersion: []string{">=2026-07-28"}}, header: legacy},
		{name: "version <, legacy", m: MatchMCP{ProtocolVersion: []string{"< 2026-07-28"}}, header: legacy, want: true},
		{name: "version range", m: MatchMCP{ProtocolVersion: []string{">=2025-06-18", "<2026-07-28"}}, header: legacy, want: true},
		{name: "version range, below", m: MatchMCP{ProtocolVersion: []string{">=2025-06-18", "<2026-07-28"}}, header: http.Header{HeaderProtocolVersion: {"2025-03-26"}}},
		{name: "version equal", m: MatchMCP{ProtocolVersion: []string{"2025-11-25"}}, header: legacy, want: true},
		{name: "version !=", m: MatchMCP{ProtocolVersion: []string{"!=2025-11-25"}}, header: modernHeaders("ping", ""), want: true},
		{name: "no version satisfies no condition", m: MatchMCP{ProtocolVersion: []string{"!=2025-11-25"}}, header: http.Header{}},
		{name: "non-date version satisfies no condition", m: MatchMCP{ProtocolVersion: []string{"<2026-07-28"}}, header: http.Header{HeaderProtocolVersion: {"2025-1-1"}}},

		// headers sent twice or malformed
		{name: "Mcp-Method twice", m: tools, header: http.Header{HeaderProtocolVersion: {ModernProtocolVersion}, HeaderMethod: {"tools/call", "tools/call"}, HeaderName: {"render_x"}},
			fault: &wantFault{400, CodeHeaderMismatch, "Mcp-Method was sent 2 times"}},
		{name: "Mcp-Name twice", m: MatchMCP{Eras: []string{"other_sessionless"}}, header: http.Header{HeaderName: {"a", "b"}},
			fault: &wantFault{400, CodeHeaderMismatch, "Mcp-Name was sent 2 times"}},
		{name: "version twice", m: MatchMCP{}, header: http.Header{HeaderProtocolVersion: {"2025-11-25", "2026-07-28"}},
			fault: &wantFault{400, CodeHeaderMismatch, "Mcp-Protocol-Version was sent 2 times"}},
		{name: "bad Base64 name", m: tools, header: modernHeaders("tools/call", "=?base64?%%%?="),
			fault: &wantFault{400, CodeHeaderMismatch, "not valid Base64"}},

		// body checked against 2026-07-28 headers
		{name: "body agrees", m: checked, header: modernHeaders("tools/call", "render_chart"), body: toolCall("render_chart"), want: true},
		{name: "body names another tool", m: checked, header: modernHeaders("tools/call", "render_chart"), body: toolCall("whoami"),
			fault: &wantFault{400, CodeHeaderMismatch, `Mcp-Name header value "render_chart" does not match body value "whoami"`}},
		{name: "header names another tool", m: checked, header: modernHeaders("tools/call", "whoami"), body: toolCall("render_chart"),
			fault: &wantFault{400, CodeHeaderMismatch, "does not match"}},
		{name: "body has another method", m: checked, header: modernHeaders("tools/list", ""), body: toolCall("render_chart"),
			fault: &wantFault{400, CodeHeaderMismatch, `Mcp-Method header value "tools/list" does not match body value "tools/call"`}},
		{name: "Mcp-Method missing", m: checked, header: http.Header{HeaderProtocolVersion: {ModernProtocolVersion}, HeaderName: {"render_chart"}}, body: toolCall("render_chart"),
			fault: &wantFault{400, CodeHeaderMismatch, "the Mcp-Method header is required"}},
		{name: "Mcp-Name missing", m: checked, header: modernHeaders("tools/call", ""), body: toolCall("render_chart"),
			fault: &wantFault{400, CodeHeaderMismatch, "the Mcp-Name header is required for tools/call"}},
		{name: "Base64 name agrees", m: checked, header: modernHeaders("tools/call", "=?base64?cmVuZGVyX2NoYXJ0?="), body: toolCall("render_chart"), want: true},
		{name: "_meta version differs", m: checked, header: http.Header{HeaderProtocolVersion: {"2027-01-01"}, HeaderMethod: {"tools/call"}, HeaderName: {"render_chart"}}, body: toolCall("render_chart"),
			fault: &wantFault{400, CodeHeaderMismatch, `MCP-Protocol-Version header value "2027-01-01" does not match body value "2026-07-28"`}},
		{name: "resource URI agrees", m: MatchMCP{Names: []string{"file:///*"}, Body: true}, header: modernHeaders("resources/read", "file:///a/b"),
			body: `{"jsonrpc":"2.0","id":"r1","method":"resources/read","params":{"uri":"file:///a/b"}}`, want: true},
		{name: "resource URI differs", m: MatchMCP{Body: true}, header: modernHeaders("resources/read", "file:///a/b"),
			body:  `{"jsonrpc":"2.0","id":"r1","method":"resources/read","params":{"uri":"file:///etc/passwd"}}`,
			fault: &wantFault{400, CodeHeaderMismatch, "does not match"}},
		{name: "notification without headers", m: MatchMCP{Methods: []string{"notifications/cancelled"}, Body: true}, header: http.Header{HeaderProtocolVersion: {ModernProtocolVersion}},
			body: `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}`, want: true},
		{name: "body escapes", m: checked, header: modernHeaders("tools/call", "render_chart"),
			body: `{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"\u006eame":"render\u005fchart"}}`, want: true},

		// the body of older requests: method and name come from it
		{name: "legacy body", m: checked, header: legacy, body: toolCall("render_chart"), want: true, method: "tools/call", nameGot: "render_chart"},
		{name: "legacy body, other tool", m: checked, header: legacy, body: toolCall("whoami"), method: "tools/call", nameGot: "whoami"},
		{name: "legacy, body not read", m: tools, header: legacy, body: toolCall("render_chart")},
		{name: "legacy response body", m: MatchMCP{Methods: []string{"*"}, Body: true}, header: legacy, body: `{"jsonrpc":"2.0","id":1,"result":{}}`},
		{name: "legacy Mcp-Method ignored for the body", m: checked, header: http.Header{HeaderMethod: {"tools/list"}}, body: toolCall("render_chart"), want: true},
		{name: "session: body not read", m: checked, header: http.Header{HeaderSessionID: {testSessionID}}, body: toolCall("render_chart")},
		{name: "session, era listed: body read", m: MatchMCP{Eras: []string{"legacy_session"}, Names: []string{"render_*"}, Body: true},
			header: http.Header{HeaderSessionID: {testSessionID}}, body: toolCall("render_chart"), want: true},

		// bodies the matcher refuses
		{name: "not JSON", m: checked, header: legacy, body: `{"jsonrpc":"2.0",`, fault: &wantFault{400, CodeParseError, "not one JSON object"}},
		{name: "empty body", m: checked, header: legacy, body: ``, fault: &wantFault{400, CodeParseError, "not one JSON object"}},
		{name: "two objects", m: checked, header: legacy, body: toolCall("a") + toolCall("b"), fault: &wantFault{400, CodeParseError, "not one JSON object"}},
		{name: "batch at 2025-11-25", m: checked, header: legacy, body: `[` + toolCall("render_chart") + `]`, fault: &wantFault{400, CodeInvalidRequest, "protocol 2025-11-25 has no JSON-RPC batches"}},
		{name: "batch at 2025-06-18", m: checked, header: http.Header{HeaderProtocolVersion: {"2025-06-18"}}, body: `[` + toolCall("render_chart") + `]`, fault: &wantFault{400, CodeInvalidRequest, "no JSON-RPC batches"}},
		{name: "batch at 2026-07-28", m: checked, header: modernHeaders("tools/call", "render_chart"), body: `[` + toolCall("render_chart") + `]`, fault: &wantFault{400, CodeInvalidRequest, "no JSON-RPC batches"}},
		{name: "batch without a version, every member matches", m: checked, body: `[` + toolCall("render_chart") + `,` + toolCall("render_map") + `]`, want: true},
		{name: "batch at 2025-03-26, every member matches", m: checked, header: http.Header{HeaderProtocolVersion: {"2025-03-26"}}, body: `[` + toolCall("render_chart") + `]`, want: true},
		{name: "batch without a version, no member matches", m: checked, body: `[` + toolCall("whoami") + `,{"jsonrpc":"2.0","method":"notifications/initialized"}]`},
		{name: "batch whose members route differently", m: checked, body: `[` + toolCall("whoami") + `,` + toolCall("render_chart") + `]`,
			fault: &wantFault{400, CodeInvalidRequest, "members 1 (tools/call whoami) and 2 (tools/call render_chart) of this JSON-RPC batch are routed differently"}},
		{name: "batch member in another case", m: checked, body: `[` + toolCall("whoami") + `,{"id":2,"Method":"tools/call"}]`,
			fault: &wantFault{400, CodeInvalidRequest, `key "Method" of batch member 2 is ambiguous`}},
		{name: "empty batch", m: checked, body: `[]`, fault: &wantFault{400, CodeInvalidRequest, "the batch is empty"}},
		{name: "batch of a non-object", m: checked, body: `[1]`, fault: &wantFault{400, CodeInvalidRequest, "batch member 1 is a JSON number"}},
		{name: "not an object", m: checked, header: legacy, body: `"tools/call"`, fault: &wantFault{400, CodeInvalidRequest, "the message is a JSON string, not an object"}},
		{name: "null", m: checked, header: legacy, body: `null`, fault: &wantFault{400, CodeInvalidRequest, "the message is a JSON null, not an object"}},
		{name: "_meta version a number", m: checked, header: modernHeaders("tools/call", "render_x"), body: `{"id":1,"method":"tools/call","params":{"name":"render_x","_meta":{"io.modelcontextprotocol/protocolVersion":20260728}}}`,
			fault: &wantFault{400, CodeInvalidRequest, "protocolVersion is a JSON number, not a string"}},
		{name: "white space everywhere", m: checked, header: legacy, body: " \n{ \"id\" : 1 , \"method\"\t:\"tools/call\" ,\"params\": { \"x\" : [ 1 , { \"name\" : \"no\" } ] , \"name\" : \"render_x\" } }\n", want: true, nameGot: "render_x"},
		{name: "method twice", m: checked, header: legacy, body: `{"method":"tools/list","method":"tools/call"}`, fault: &wantFault{400, CodeInvalidRequest, `field "method" of the message appears twice`}},
		{name: "method in another case", m: checked, header: legacy, body: `{"method":"tools/list","Method":"tools/call"}`,
			fault: &wantFault{400, CodeInvalidRequest, `key "Method" of the message is ambiguous: servers that match keys as Go's encoding/json does (ignoring letter case, with Unicode case folding) read it as "method"; spell it "method"`}},
		{name: "name in another case", m: checked, header: legacy, body: `{"method":"tools/call","params":{"name":"a","NAME":"render_x"}}`,
			fault: &wantFault{400, CodeInvalidRequest, `key "NAME" of params is ambiguous`}},
		{name: "params with a long s", m: checked, header: legacy, body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","paramſ":{"name":"render_x"}}`,
			fault: &wantFault{400, CodeInvalidRequest, `key "param\u017f" of the message is ambiguous`}},
		{name: "params with an escaped long s", m: checked, header: legacy, body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"PARAM\u017F":{"name":"render_x"}}`,
			fault: &wantFault{400, CodeInvalidRequest, `key "PARAM\u017f" of the message is ambiguous: servers that match keys as Go's encoding/json does (ignoring letter case, with Unicode case folding) read it as "params"; spell it "params"`}},
		{name: "_meta version with a long s", m: checked, header: modernHeaders("tools/call", "render_x"),
			body:  `{"id":1,"method":"tools/call","params":{"name":"render_x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/protocolVer\u017fion":"2027-01-01"}}}`,
			fault: &wantFault{400, CodeInvalidRequest, `key "io.modelcontextprotocol/protocolVer\u017fion" of params._meta is ambiguous`}},
		{name: "keys that look alike but do not fold", m: checked, header: legacy, want: true, nameGot: "render_x",
			body: `{"id":1,"method":"tools/call","paramš":{"name":"a"},"p\u0430rams":{"name":"b"},"params":{"name":"render_x","nam\u0301e":"c"}}`},
		{name: "name not UTF-8", m: MatchMCP{Names: []string{"render_x*"}, Body: true}, header: legacy, want: true, nameGot: "render_x\ufffd",
			body: "{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"render_x\xff\"}}"},
		{name: "method not a string", m: checked, header: legacy, body: `{"method":5}`, fault: &wantFault{400, CodeInvalidRequest, "method is a JSON number, not a string"}},
		{name: "params an array", m: checked, header: legacy, body: `{"method":"tools/call","params":["render_x"]}`, fault: &wantFault{400, CodeInvalidRequest, "params is a JSON array"}},
		{name: "params null", m: MatchMCP{Methods: []string{"ping"}, Body: true}, header: legacy, body: `{"jsonrpc":"2.0","id":1,"method":"ping","params":null}`, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := provisionMatcher(t, &tc.m)
			r := matchRequest(tc.header, tc.body)
			got, err := m.MatchWithError(r)
			if err != nil {
				t.Fatalf("MatchWithError outside a handler: error %v, want it recorded", err)
			}
			if got != tc.want {
				t.Errorf("match = %v, want %v", got, tc.want)
			}
			ex := exchangeOf(r)
			checkFault(t, ex.fault, tc.fault)
			if tc.method != "" && ex.method() != tc.method {
				t.Errorf("method = %q, want %q", ex.method(), tc.method)
			}
			if tc.nameGot != "" && ex.name() != tc.nameGot {
				t.Errorf("name = %q, want %q", ex.name(), tc.nameGot)
			}
			if b, _ := io.ReadAll(r.Body); string(b) != tc.body {
				t.Errorf("the body passed on is %q, want %q unchanged", b, tc.body)
			}
		})
	}
}

// checkFault compares a recorded fault with the one wanted.
func checkFault(t *testing.T, got *fault, want *wantFault) {
	t.Helper()
	switch {
	case want == nil && got != nil:
		t.Errorf("fault %d %d %q, want none", got.status, got.code, got.message)
	case want != nil && got == nil:
		t.Errorf("no fault, want %d %d %q", want.status, want.code, want.msg)
	case want != nil && (got.status != want.status || got.code != want.code || !strings.Contains(got.message, want.msg)):
		t.Errorf("fault %d %d %q, want %d %d containing %q", got.status, got.code, got.message, want.status, want.code, want.msg)
	}
}

// TestMatchMCPOversizedBody checks the bound of the body read: a body over
// max_body_size is a 413 fault whether its length is announced or not, and
// reaches the upstream whole.
func TestMatchMCPOversizedBody(t *testing.T) {
	body := toolCall("render_" + strings.Repeat("x", 200))
	size := len(body)
	for _, tc := range []struct {
		name    string
		limit   int64
		chunked bool
		fault   *wantFault
	}{
		{name: "announced", limit: 100, fault: &wantFault{413, CodeInvalidRequest, fmt.Sprintf("Request body of %d bytes is larger than 100 bytes", size)}},
		{name: "chunked", limit: 100, chunked: true, fault: &wantFault{413, CodeInvalidRequest, "larger than 100 bytes"}},
		{name: "at the limit", limit: int64(len(body))},
		{name: "at the limit, chunked", limit: int64(len(body)), chunked: true},
		{name: "one byte over, chunked", limit: int64(size) - 1, chunked: true, fault: &wantFault{413, CodeInvalidRequest, fmt.Sprintf("larger than %d bytes", size-1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := provisionMatcher(t, &MatchMCP{Body: true, MaxBodySize: tc.limit})
			r := matchRequest(http.Header{}, body)
			if tc.chunked {
				r.ContentLength = -1
				r.Body = io.NopCloser(strings.NewReader(body))
			}
			got, _ := m.MatchWithError(r)
			checkFault(t, exchangeOf(r).fault, tc.fault)
			if got != (tc.fault == nil) {
				t.Errorf("match = %v", got)
			}
			if b, _ := io.ReadAll(r.Body); string(b) != body {
				t.Errorf("the body passed on has %d bytes, want the %d sent", len(b), len(body))
			}
		})
	}
}

// countingBody counts the reads of a request body.
type countingBody struct {
	io.Reader
	reads int
}

func (b *countingBody) Read(p []byte) (int, error) { b.reads++; return b.Reader.Read(p) }
func (b *countingBody) Close() error               { return nil }

// TestMatchMCPReadsBodyOnce runs several body-reading matchers on one
// request: the body is read once, and a fault found by the first makes
// every matcher fail.
func TestMatchMCPReadsBodyOnce(t *testing.T) {
	matchers := []*MatchMCP{
		provisionMatcher(t, &MatchMCP{Names: []string{"render_*"}, Body: true}),
		provisionMatcher(t, &MatchMCP{Methods: []string{"tools/*"}, Body: true}),
		provisionMatcher(t, &MatchMCP{Names: []string{"whoami"}, Body: true}),
	}
	body := &countingBody{Reader: strings.NewReader(toolCall("render_chart"))}
	r := matchRequest(modernHeaders("tools/call", "render_chart"), "")
	r.Body, r.ContentLength = body, -1
	var got []bool
	for _, m := range matchers {
		got = append(got, m.Match(r))
	}
	if got[0] != true || got[1] != true || got[2] != false {
		t.Errorf("matches = %v, want [true true false]", got)
	}
	if body.reads > 2 { // one read for the bytes, one for EOF
		t.Errorf("the body was read %d times by 3 matchers, want once (2 reads)", body.reads)
	}
	if b, _ := io.ReadAll(r.Body); string(b) != toolCall("render_chart") {
		t.Errorf("the body passed on is %q", b)
	}

	r = matchRequest(modernHeaders("tools/call", "render_chart"), toolCall("whoami"))
	for i, m := range matchers {
		if m.Match(r) {
			t.Errorf("matcher %d matched a request whose headers disagree with its body", i)
		}
	}
}

// TestMatchMCPInsideHandler checks that a fault found inside an
// mcp_session handler's routes stops them with an error that the handler
// answers with the JSON-RPC error, and that the upstream is not contacted.
func TestMatchMCPInsideHandler(t *testing.T) {
	h, _ := provisionHandler(t, &Handler{})
	m := provisionMatcher(t, &MatchMCP{Names: []string{"render_*"}, Body: true})
	upstream := &countingNext{}
	routes := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if _, err := m.MatchWithError(r); err != nil {
			return err // as a route's matcher error stops the routes
		}
		return upstream.ServeHTTP(w, r)
	})
	rec := httptest.NewRecorder()
	r := matchRequest(modernHeaders("tools/call", "render_chart"), toolCall("whoami"))
	if err := h.ServeHTTP(rec, r, routes); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	if upstream.calls != 0 {
		t.Errorf("the upstream was called %d times", upstream.calls)
	}
	checkFaultResponse(t, rec, 400, CodeHeaderMismatch, "7", "does not match")
	if d := exchangeOf(r).decision; d != decisionRejected {
		t.Errorf("decision = %q, want rejected", d)
	}

	// Outside a handler the fault is recorded; the handler answers it first.
	r = matchRequest(modernHeaders("tools/call", "render_chart"), toolCall("whoami"))
	if ok, err := m.MatchWithError(r); ok || err != nil {
		t.Fatalf("MatchWithError = %v, %v; want false, nil", ok, err)
	}
	rec = httptest.NewRecorder()
	if err := h.ServeHTTP(rec, r, upstream); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	if upstream.calls != 0 {
		t.Errorf("the upstream was called %d times", upstream.calls)
	}
	checkFaultResponse(t, rec, 400, CodeHeaderMismatch, "7", "does not match")
}

// checkFaultResponse checks a JSON-RPC error answer of the proxy.
func checkFaultResponse(t *testing.T, rec *httptest.ResponseRecorder, status, code int, id, msg string) {
	t.Helper()
	if rec.Code != status || rec.Header().Get("Content-Type") != "application/json" {
		t.Errorf("answer %d %q, want %d application/json", rec.Code, rec.Header().Get("Content-Type"), status)
	}
	var body rpcBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	if body.JSONRPC != "2.0" || string(body.ID) != id || body.Error.Code != code || !strings.Contains(body.Error.Message, msg) {
		t.Errorf("body %s, want id %s, code %d, message containing %q", rec.Body, id, code, msg)
	}
}

func TestMatchMCPValidate(t *testing.T) {
	for _, tc := range []struct {
		m    MatchMCP
		want string
	}{
		{m: MatchMCP{Eras: []string{"modern"}}, want: `era "modern" is not one of legacy_session, modern_sessionless, other_sessionless`},
		{m: MatchMCP{ProtocolVersion: []string{">= latest"}}, want: `protocol_version ">= latest" must be an operator`},
		{m: MatchMCP{ProtocolVersion: []string{"=> 2026-07-28"}}, want: "must be an operator"},
		{m: MatchMCP{ProtocolVersion: []string{"2026-7-28"}}, want: "must be an operator"},
		{m: MatchMCP{Methods: []string{""}}, want: "an empty method or name matches nothing"},
		{m: MatchMCP{MaxBodySize: -1}, want: "max_body_size must be positive"},
	} {
		err := tc.m.Provision(caddy.Context{Context: context.Background()})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Provision(%+v) = %v, want an error containing %q", tc.m, err, tc.want)
		}
	}
}

func TestMatchMCPUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input string
		want  string // the matcher as JSON, or the error
	}{
		{input: `mcp {
			method tools/call
			name render_* export_*
		}`, want: `{"method":["tools/call"],"name":["render_*","export_*"]}`},
		{input: `mcp method server/discover`, want: `{"method":["server/discover"]}`},
		{input: `mcp {
			era modern_sessionless other_sessionless
			protocol_version >= 2025-06-18 <2026-07-28
			protocol_version != 2025-11-25
			body 64KiB
		}`, want: `{"era":["modern_sessionless","other_sessionless"],"protocol_version":[">=2025-06-18","<2026-07-28","!=2025-11-25"],"body":true,"max_body_size":65536}`},
		{input: `mcp {
			body
		}`, want: `{"body":true}`},
		{input: `mcp {
			tool render
		}`, want: "unrecognized option 'tool'"},
		{input: `mcp {
			method
		}`, want: "method needs at least one value"},
		{input: `mcp {
			protocol_version >= latest
		}`, want: "must be an operator"},
		{input: `mcp {
			body 1KiB 2KiB
		}`, want: "body takes at most one value"},
		{input: `mcp {
			body
			body
		}`, want: "body takes at most one value"},
		{input: `mcp {
			body lots
		}`, want: "'lots' is not a size"},
	} {
		var m MatchMCP
		err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		got := ""
		if err != nil {
			got = err.Error()
		} else {
			var b strings.Builder
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false)
			_ = enc.Encode(m)
			got = strings.TrimSpace(b.String())
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("UnmarshalCaddyfile(%s) = %s, want %s", tc.input, got, tc.want)
		}
	}
}

// TestMatchMCPJSON loads the matcher from JSON config, as Caddy does.
func TestMatchMCPJSON(t *testing.T) {
	var m MatchMCP
	raw := `{"method":["tools/call"],"name":["render_*"],"era":["modern_sessionless"],"protocol_version":[">= 2026-07-28"],"body":true,"max_body_size":1024}`
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatal(err)
	}
	provisionMatcher(t, &m)
	if !m.Match(matchRequest(modernHeaders("tools/call", "render_chart"), toolCall("render_chart"))) {
		t.Errorf("%s does not match a 2026-07-28 call of render_chart", raw)
	}
	r := matchRequest(modernHeaders("tools/call", "render_chart"), toolCall("render_"+strings.Repeat("x", 1024)))
	if m.Match(r) || exchangeOf(r).fault == nil || exchangeOf(r).fault.status != http.StatusRequestEntityTooLarge {
		t.Errorf("%s: a body over max_body_size is not a 413 fault", raw)
	}
}

// TestMatchMCPCEL uses the matcher in a CEL expression.
func TestMatchMCPCEL(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	expr := &caddyhttp.MatchExpression{Expr: `mcp({'method': 'tools/call', 'name': ['render_*', 'export_*']}) && path('/mcp')`}
	if err := expr.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		header http.Header
		want   bool
	}{
		{modernHeaders("tools/call", "export_pdf"), true},
		{modernHeaders("tools/call", "whoami"), false},
		{modernHeaders("tools/list", ""), false},
	} {
		got, err := expr.MatchWithError(matchRequest(tc.header, ""))
		if err != nil || got != tc.want {
			t.Errorf("%v: match = %v, %v; want %v", tc.header, got, err, tc.want)
		}
	}
	bad := &caddyhttp.MatchExpression{Expr: `mcp({'tool': 'x'})`}
	if err := bad.Provision(ctx); err == nil || !strings.Contains(err.Error(), `unrecognized option "tool"`) {
		t.Errorf("Provision(%s) = %v, want an unrecognized option error", bad.Expr, err)
	}
}

func TestGlobMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"render", "render", true},
		{"render", "render_x", false},
		{"*", "", true},
		{"*", "anything/at/all", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "aXcYb", false},
		{"*a*a*a*a*b", strings.Repeat("a", 40), false},
		{"a?c", "abc", false}, // ? is not special
		{"[a]", "[a]", true},  // nor are brackets
		{"**", "x", true},
	} {
		if got := globMatch(tc.pattern, tc.s); got != tc.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
}

// TestAsFault checks that the handler finds a matcher's fault in the error it gets.
func TestAsFault(t *testing.T) {
	f := mismatch("x")
	if asFault(caddyhttp.Error(400, f)) != f || asFault(errors.New("x")) != nil {
		t.Error("asFault does not find a fault wrapped in a HandlerError")
	}
}
