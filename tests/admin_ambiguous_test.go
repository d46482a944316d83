package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
)

// TestAdminRefusesAmbiguousInput sends a real Caddy's admin endpoint input
// that a lenient reader takes in two ways: a key given twice (encoding/json
// keeps the last), in two spellings (it matches keys case-insensitively),
// two JSON objects in one body (json.Decoder reads the first), a query
// parameter given twice (url.Values.Get keeps the first). Each gets 400
// saying what to send instead, and does nothing: no upstream drains, the
// session stays pinned and keeps working on its go-sdk server. The control:
// the same calls, well formed, drain and evict.
func TestAdminRefusesAmbiguousInput(t *testing.T) {
	servers := startBackends(t, 2, true)
	p := startProxy(t, "mcp_proxy "+upstreams(servers)+" {\n\t\ttable ambiguous\n\t}")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	cs, err := connectNoStream(ctx, p.url(), hc)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer cs.Close()
	first, err := whoami(ctx, cs)
	if err != nil {
		t.Fatalf("whoami: %v", err)
	}
	id := cs.ID()
	a, b := servers[0].Addr(), servers[1].Addr()
	obj := func(fields string) string { return `{"table":"ambiguous",` + fields + `}` }
	up := func(dial string) string { return `"upstream":"` + dial + `"` }
	session := `"session_id":"` + id + `"`
	upstreamQuery := "/mcp_sessions/upstream?" + url.Values{"table": {"ambiguous"}}.Encode()
	for _, tc := range []struct {
		name, method, path, body, want string
		lenient                        bool // encoding/json, as the admin API read bodies, accepts it
	}{
		{"drain: upstream twice", "POST", "/mcp_sessions/drain", obj(up(b) + "," + up(a)), `key \"upstream\" is given twice`, true},
		{"drain: upstream escaped, twice", "POST", "/mcp_sessions/drain", obj(up(b) + `,"upstre\u0061m":"` + a + `"`), `key \"upstream\" is given twice`, true},
		{"drain: upstream in two spellings", "POST", "/mcp_sessions/drain", obj(up(b) + `,"UPSTREAM":"` + a + `"`), `are the same field to a case-insensitive decoder`, true},
		{"drain: table twice", "POST", "/mcp_sessions/drain", `{"table":"elsewhere","table":"ambiguous",` + up(a) + `}`, `key \"table\" is given twice`, true},
		{"drain: two objects", "POST", "/mcp_sessions/drain", obj(up(a)) + obj(up(b)), "more follows the object", true},
		{"drain: two objects on two lines", "POST", "/mcp_sessions/drain", obj(up(a)) + "\n" + obj(up(b)) + "\n", "more follows the object", true},
		{"drain: a query beside the body", "POST", "/mcp_sessions/drain?upstream=" + b, obj(up(a)), "give the fields in the JSON body", true},
		{"drain: a field in another case only", "POST", "/mcp_sessions/drain", `{"table":"ambiguous","Upstream":"` + a + `"}`, `unknown field \"Upstream\"`, true},
		{"evict: session_id twice", "POST", "/mcp_sessions/evict", obj(`"session_id":"unknown",` + session), `key \"session_id\" is given twice`, true},
		{"evict: session_id with a long s", "POST", "/mcp_sessions/evict", obj(`"session_id":"unknown","\u017fession_id":"` + id + `"`), `are the same field`, true},
		{"evict: two objects", "POST", "/mcp_sessions/evict", obj(up(b)) + " " + obj(session), "more follows the object", true},
		{"evict: null upstream", "POST", "/mcp_sessions/evict", obj(session + `,"upstream":null`), "null is not a value here", true},
		{"upstream: upstream twice", "GET", upstreamQuery + "&upstream=" + a + "&upstream=" + b, "", "query parameter upstream is given 2 times: give it once", false},
		{"upstream: an unknown parameter", "GET", upstreamQuery + "&upstream=" + a + "&Upstream=" + b, "", `not \"Upstream\"`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.body != "" {
				var req struct{ Table, Upstream, SessionID, Deadline string }
				dec := json.NewDecoder(strings.NewReader(tc.body))
				if err := dec.Decode(&req); (err == nil) != tc.lenient {
					t.Fatalf("encoding/json reads %s: %v; the case does not show what it should", tc.body, err)
				}
			}
			status, text := adminRaw(t, tc.method, tc.path, tc.body)
			if status != http.StatusBadRequest || !strings.Contains(text, tc.want) || !strings.Contains(text, "give") && !strings.Contains(text, "send") {
				t.Errorf("%s %s %s: %d %s; want 400 saying %q and what to send", tc.method, tc.path, tc.body, status, text, tc.want)
			}
			if strings.Contains(text, id) {
				t.Errorf("the error carries the session ID: %s", text)
			}
		})
	}
	// Nothing happened: no drain, the session is held and still served by
	// its own server.
	for _, dial := range []string{a, b} {
		if st := mustUpstream(t, "ambiguous", dial); st.Draining {
			t.Errorf("an ambiguous call drained %s: %+v", dial, st)
		}
	}
	var sess caddymodule.SessionStatus
	if st := adminCall(t, http.MethodPost, "/mcp_sessions/lookup", map[string]string{"table": "ambiguous", "session_id": id}, &sess); st != http.StatusOK {
		t.Fatalf("lookup after the refused calls: %d; an ambiguous evict acted", st)
	}
	if again, err := whoami(ctx, cs); err != nil || again != first {
		t.Fatalf("whoami after the refused calls: %+v, %v; want %+v", again, err, first)
	}

	// The control: the same calls, well formed, act.
	if st := setDraining(t, "ambiguous", a, true); !st.Draining {
		t.Fatalf("a well-formed drain: %+v", st)
	}
	setDraining(t, "ambiguous", a, false)
	if status, text := adminRaw(t, http.MethodPost, "/mcp_sessions/evict", " \r\n"+obj(session)+"\n"); status != http.StatusOK || !strings.Contains(text, `"evicted":true`) {
		t.Fatalf("a well-formed evict, with whitespace around the object: %d %s", status, text)
	}
	checkProxy404(t, send(t, hc, http.MethodPost, p.url(), sid(id), `{"jsonrpc":"2.0","id":9,"method":"ping"}`))
}
