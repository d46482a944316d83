package caddymodule

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// handleCall returns the headers of a 2026-07-28 tools/call of tool, with
// more header pairs.
func handleCall(tool string, more ...string) map[string]string {
	m := map[string]string{"Mcp-Protocol-Version": ModernProtocolVersion, "Mcp-Method": "tools/call", "Mcp-Name": tool}
	for i := 0; i+1 < len(more); i += 2 {
		m[more[i]] = more[i+1]
	}
	return m
}

// answering is a next handler that records the pick of upstream dial, as
// the selection policy does, and answers with status, content type and the
// body written in the chunks given.
func answering(dial string, status int, ctype string, chunks ...string) caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		exchangeOf(r).selected = &reverseproxy.Upstream{Dial: dial}
		w.Header().Set("Content-Type", ctype)
		w.WriteHeader(status)
		for _, c := range chunks {
			if _, err := w.Write([]byte(c)); err != nil {
				return err
			}
			http.NewResponseController(w).Flush()
		}
		return nil
	})
}

func newRuledHandler(t *testing.T, unknown string) *Handler {
	h, _ := provisionHandler(t, &Handler{UnknownHandle: unknown, Handles: []HandleRule{
		{Tool: "open_*", From: "/handle", Header: "mcp-param-handle"},
		{Tool: "repl", From: "text", Header: "Mcp-Param-Repl"},
	}})
	return h
}

func TestHandlesLearnFromResults(t *testing.T) {
	result := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"R-9"}],"structuredContent":{"handle":"H-1"}}}`
	gz := func(s string) string {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write([]byte(s))
		zw.Close()
		return b.String()
	}
	for _, tc := range []struct {
		name, tool string
		next       caddyhttp.Handler
		gzip       bool
		learned    string // "" for none
	}{
		{"json", "open_counter", answering("u1:1", 200, "application/json", result[:20], result[20:]), false, "H-1"},
		{"sse split mid event", "open_browser", answering("u1:1", 200, "text/event-stream",
			"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n", "data: "+result[:30], result[30:]+"\n\n"), false, "H-1"},
		{"text content", "repl", answering("u1:1", 200, "application/json", result), false, "R-9"},
		{"gzip json", "open_counter", nil, true, "H-1"},
		{"other tool", "count", answering("u1:1", 200, "application/json", result), false, ""},
		{"error status", "open_counter", answering("u1:1", 500, "application/json", result), false, ""},
		{"tool error", "open_counter", answering("u1:1", 200, "application/json",
			`{"jsonrpc":"2.0","id":1,"result":{"isError":true,"structuredContent":{"handle":"H-1"}}}`), false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newRuledHandler(t, "")
			next := tc.next
			if tc.gzip {
				next = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
					exchangeOf(r).selected = &reverseproxy.Upstream{Dial: "u1:1"}
					w.Header().Set("Content-Type", "application/json")
					w.Header().Set("Content-Encoding", "gzip")
					_, err := w.Write([]byte(gz(result)))
					return err
				})
			}
			rec, r := httptest.NewRecorder(), caddyRequest(`{}`, handleCall(tc.tool))
			if err := h.ServeHTTP(rec, r, next); err != nil {
				t.Fatal(err)
			}
			want := "balanced"
			if tc.learned != "" {
				want = "learned"
			}
			if got, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer).GetString("mcp.decision"); got != want {
				t.Errorf("{mcp.decision} = %q, want %q", got, want)
			}
			body := rec.Body.String()
			if tc.gzip {
				body = result // compared decoded below
			}
			if !strings.Contains(body, "H-1") {
				t.Errorf("the client got %q; the result must pass unchanged", body)
			}
			for _, handle := range []string{"H-1", "R-9"} {
				up := h.handles.table.Lookup(handle)
				switch {
				case handle == tc.learned && (up == nil || up.Dial() != "u1:1"):
					t.Errorf("handle %s: learned %v, want u1:1", handle, up)
				case handle != tc.learned && up != nil:
					t.Errorf("handle %s learned (%s), want not", handle, up.Dial())
				}
			}
		})
	}
}

func TestHandlesPinAndRefuse(t *testing.T) {
	ok := answering("u1:1", 200, "application/json", `{"jsonrpc":"2.0","id":1,"result":{}}`)
	for _, tc := range []struct {
		name, unknown string
		header        []string
		status        int
		owner         string // the upstream the policy is told to pick, "" for none
		decision      string // {mcp.decision}
	}{
		{"known handle", "", []string{"Mcp-Param-Handle", "H-1"}, 200, "u1:1", "pinned"},
		{"known handle, sentinel", "", []string{"Mcp-Param-Handle", "=?base64?SC0x?="}, 200, "u1:1", "pinned"},
		{"unknown handle forwarded", "", []string{"Mcp-Param-Handle", "H-2"}, 200, "", "unknown"},
		{"unknown handle rejected", UnknownHandleReject, []string{"Mcp-Param-Handle", "H-2"}, 404, "", "unknown"},
		{"bad sentinel", "", []string{"Mcp-Param-Handle", "=?base64?%%?="}, 400, "", "rejected"},
		{"no rule header", UnknownHandleReject, []string{"Mcp-Param-Other", "H-2"}, 200, "", "balanced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newRuledHandler(t, tc.unknown)
			h.handles.table.Learn("H-1", "u1:1")
			var owner string
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				if o := exchangeOf(r).owner; o != nil {
					owner = o.Dial()
				}
				return ok.ServeHTTP(w, r)
			})
			rec, r := httptest.NewRecorder(), caddyRequest(`{}`, handleCall("count", tc.header...))
			if err := h.ServeHTTP(rec, r, next); err != nil {
				t.Fatal(err)
			}
			if rec.Code != tc.status || owner != tc.owner {
				t.Errorf("status %d, pinned to %q; want %d, %q (%s)", rec.Code, owner, tc.status, tc.owner, rec.Body)
			}
			repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
			if got, _ := repl.GetString("mcp.decision"); got != tc.decision {
				t.Errorf("{mcp.decision} = %q, want %q", got, tc.decision)
			}
		})
	}
}

func TestHandleRulesValidate(t *testing.T) {
	for _, tc := range []struct {
		h    Handler
		want string // in the error; "" for none
	}{
		{Handler{Handles: []HandleRule{{Tool: "t", From: "/a/0", Header: "Mcp-Param-A"}}}, ""},
		{Handler{Handles: []HandleRule{{From: "/a", Header: "Mcp-Param-A"}}}, "needs the tool"},
		{Handler{Handles: []HandleRule{{Tool: "t", Header: "Mcp-Param-A"}}}, "needs where"},
		{Handler{Handles: []HandleRule{{Tool: "t", From: "a", Header: "Mcp-Param-A"}}}, "neither a JSON pointer"},
		{Handler{Handles: []HandleRule{{Tool: "t", From: "/a"}}}, "needs the header"},
		{Handler{Handles: []HandleRule{{Tool: "t", From: "/a", Header: "Mcp-Param-"}}}, "must be Mcp-Param- followed"},
		{Handler{Handles: []HandleRule{{Tool: "t", From: "/a", Header: "Mcp-Param-a b"}}}, "not allowed in a header name"},
		{Handler{UnknownHandle: "drop"}, "unknown_handle must be"},
		{Handler{UnknownHandleStatus: 503}, "4xx status"},
		{Handler{UnknownHandle: UnknownHandleReject}, "there is none"},
		{Handler{HandleTable: "h"}, "there is none"},
		{Handler{Table: "x", HandleTable: "x", Handles: []HandleRule{{Tool: "t", From: "/a", Header: "Mcp-Param-A"}}}, "is the session table"},
	} {
		err := tc.h.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.h, err, tc.want)
		}
	}
}

// TestHandlesBoundToPrincipal: a handle minted by one principal is refused
// to another, even with unknown_handle forward, and never reaches an
// upstream; its own principal is pinned.
func TestHandlesBoundToPrincipal(t *testing.T) {
	h, _ := provisionHandler(t, &Handler{TableSettings: TableSettings{BindPrincipal: "{http.request.header.X-User}"},
		Handles: []HandleRule{{Tool: "open_counter", From: "/handle", Header: "Mcp-Param-Handle"}}})
	mint := answering("u1:1", 200, "application/json", `{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"handle":"H-A"}}}`)
	withHTTPPlaceholders := func(r *http.Request) *http.Request { caddyhttp.NewTestReplacer(r); return r }
	if err := h.ServeHTTP(httptest.NewRecorder(), withHTTPPlaceholders(caddyRequest(`{}`, handleCall("open_counter", "X-User", "alice"))), mint); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		user    string
		status  int
		reached bool
	}{{"alice", 200, true}, {"mallory", 404, false}} {
		reached := false
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			reached = exchangeOf(r).owner != nil
			w.WriteHeader(http.StatusOK)
			return nil
		})
		rec := httptest.NewRecorder()
		if err := h.ServeHTTP(rec, withHTTPPlaceholders(caddyRequest(`{}`, handleCall("count", "X-User", tc.user, "Mcp-Param-Handle", "H-A"))), next); err != nil {
			t.Fatal(err)
		}
		if rec.Code != tc.status || reached != tc.reached {
			t.Errorf("%s: %d, pinned upstream reached %v; want %d, %v", tc.user, rec.Code, reached, tc.status, tc.reached)
		}
	}
	if got := h.handles.table.Stats.PrincipalMismatches(); got != 1 {
		t.Errorf("principal mismatches counted: %d, want 1", got)
	}
}
