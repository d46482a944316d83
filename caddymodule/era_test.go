package caddymodule

import (
	"cmp"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

func TestEraOf(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers map[string][]string // set with Header.Add, so keys are canonicalised as a server would
		method  string              // POST unless set
		query   string              // the URL's query
		want    session.Era
	}{
		{name: "nothing", want: session.EraOther},
		{name: "session", headers: map[string][]string{"Mcp-Session-Id": {testSessionID}}, want: session.EraLegacySession},
		{name: "session, lower case", headers: map[string][]string{"mcp-session-id": {testSessionID}}, want: session.EraLegacySession},
		{name: "session and Mcp-Method", headers: map[string][]string{"Mcp-Session-Id": {testSessionID}, "Mcp-Method": {"tools/call"}}, want: session.EraLegacySession},
		{name: "session and modern version", headers: map[string][]string{"Mcp-Session-Id": {testSessionID}, "MCP-Protocol-Version": {"2026-07-28"}}, want: session.EraLegacySession},
		{name: "session sent twice", headers: map[string][]string{"Mcp-Session-Id": {"a", "b"}}, want: session.EraLegacySession},
		{name: "empty session", headers: map[string][]string{"Mcp-Session-Id": {""}}, want: session.EraLegacySession},
		{name: "Mcp-Method", headers: map[string][]string{"Mcp-Method": {"tools/list"}}, want: session.EraModern},
		{name: "MCP-METHOD", headers: map[string][]string{"MCP-METHOD": {"initialize"}}, want: session.EraModern},
		{name: "Mcp-Method with an old version", headers: map[string][]string{"Mcp-Method": {"tools/list"}, "MCP-Protocol-Version": {"2025-06-18"}}, want: session.EraModern},
		{name: "version 2026-07-28", headers: map[string][]string{"MCP-Protocol-Version": {"2026-07-28"}}, want: session.EraModern},
		{name: "version 2026-07-29", headers: map[string][]string{"MCP-Protocol-Version": {"2026-07-29"}}, want: session.EraModern},
		{name: "version 2027-01-15", headers: map[string][]string{"MCP-Protocol-Version": {"2027-01-15"}}, want: session.EraModern},
		{name: "version lower case", headers: map[string][]string{"mcp-protocol-version": {"2026-07-28"}}, want: session.EraModern},
		{name: "version 2026-07-27", headers: map[string][]string{"MCP-Protocol-Version": {"2026-07-27"}}, want: session.EraOther},
		{name: "version 2025-11-25", headers: map[string][]string{"MCP-Protocol-Version": {"2025-11-25"}}, want: session.EraOther},
		{name: "version not a date", headers: map[string][]string{"MCP-Protocol-Version": {"DRAFT-2026-v1"}}, want: session.EraOther},
		{name: "version date-like garbage", headers: map[string][]string{"MCP-Protocol-Version": {"2026-07-2x"}}, want: session.EraOther},
		{name: "version later date", headers: map[string][]string{"MCP-Protocol-Version": {"2027-01-15"}}, want: session.EraModern},
		{name: "version 2025-06-18", headers: map[string][]string{"MCP-Protocol-Version": {"2025-06-18"}}, want: session.EraOther},
		{name: "version 2025-03-26", headers: map[string][]string{"MCP-Protocol-Version": {"2025-03-26"}}, want: session.EraOther},
		{name: "version 2024-11-05", headers: map[string][]string{"MCP-Protocol-Version": {"2024-11-05"}}, want: session.EraOther},
		{name: "empty version", headers: map[string][]string{"MCP-Protocol-Version": {""}}, want: session.EraOther},
		{name: "first version counts", headers: map[string][]string{"MCP-Protocol-Version": {"2025-11-25", "2026-07-28"}}, want: session.EraOther},
		{name: "unrelated headers", headers: map[string][]string{"Accept": {"application/json, text/event-stream"}, "X-Mcp-Method": {"x"}}, want: session.EraOther},
		{name: "legacy SSE POST, sessionId", query: "sessionId=A", want: session.EraLegacySession},
		{name: "legacy SSE POST, session_id", query: "x=1&session_id=A", want: session.EraLegacySession},
		{name: "legacy SSE POST, sessionid", query: "sessionid=", want: session.EraLegacySession},
		{name: "legacy SSE POST and Mcp-Method", query: "sessionid=A", headers: map[string][]string{"Mcp-Method": {"tools/list"}}, want: session.EraLegacySession},
		{name: "other query", query: "session=A&id=B", want: session.EraOther},
		{name: "legacy SSE session in a GET's query", method: http.MethodGet, query: "sessionId=A", want: session.EraLegacySession},
		{name: "legacy SSE session in a PUT's query", method: http.MethodPut, query: "session_id=A", want: session.EraLegacySession},
		{name: "CORS preflight of a legacy SSE POST", method: http.MethodOptions, query: "sessionId=A", want: session.EraOther},
		{name: "session named in brackets", query: "sessionId[]=A", want: session.EraLegacySession},
		{name: "session past 10000 pairs", query: "sessionId=A" + strings.Repeat("&", 10000), want: session.EraLegacySession},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(cmp.Or(tc.method, http.MethodPost), "/mcp?"+tc.query, nil)
			for k, vs := range tc.headers {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			got := eraOf(r, len(r.Header[HeaderSessionID]))
			if got != tc.want {
				t.Errorf("eraOf(%v) = %s, want %s", r.Header, got, tc.want)
			}
		})
	}
}

// TestServeHTTPCountsEras checks that every request through the handler
// counts in the table's Stats, whatever the handler does with it.
func TestServeHTTPCountsEras(t *testing.T) {
	h, _ := provisionHandler(t, &Handler{})
	send := func(headers map[string]string, ids ...string) {
		t.Helper()
		r := newRequest(http.MethodPost, ids...)
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		if err := h.ServeHTTP(httptest.NewRecorder(), r, new(countingNext)); err != nil {
			t.Fatalf("ServeHTTP: %v", err)
		}
	}
	send(nil)                                                                                 // other
	send(map[string]string{"MCP-Protocol-Version": "2025-11-25"})                             // other
	send(map[string]string{"MCP-Protocol-Version": "2026-07-28"})                             // modern
	send(map[string]string{"Mcp-Method": "tools/list"})                                       // modern
	send(map[string]string{"Mcp-Method": "tools/call", "MCP-Protocol-Version": "2026-07-28"}) // modern
	send(nil, testSessionID)                                                                  // legacy: unknown session, 404
	send(map[string]string{"Mcp-Method": "ping"}, testSessionID)                              // legacy: the session wins
	send(nil, "a", "b")                                                                       // legacy: malformed, 400
	send(nil, "a b")                                                                          // legacy: malformed, 400
	h.table.Learn(testSessionID, "10.0.0.1:8080")
	send(nil, testSessionID) // legacy: pinned (countingNext does not proxy)

	for _, tc := range []struct {
		era  session.Era
		want uint64
	}{{session.EraLegacySession, 5}, {session.EraModern, 3}, {session.EraOther, 2}} {
		if got := h.table.Stats.Requests(tc.era); got != tc.want {
			t.Errorf("Requests(%s) = %d, want %d", tc.era, got, tc.want)
		}
	}
	if h.table.Stats.Unknown() != 2 || h.table.Stats.Pinned() != 1 {
		t.Errorf("Unknown() = %d, Pinned() = %d; want 2, 1", h.table.Stats.Unknown(), h.table.Stats.Pinned())
	}
}
