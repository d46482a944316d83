package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// placeholderKeys are the placeholders the plugin sets.
var placeholderKeys = []string{"method", "name", "era", "protocol_version", "session_fingerprint", "pinned_upstream", "decision"}

// placeholders returns the {mcp.*} values of r's replacer, by key.
func placeholders(r *http.Request) map[string]string {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	out := map[string]string{}
	for _, k := range placeholderKeys {
		out[k] = "<unset>"
		if v, ok := repl.Get("mcp." + k); ok {
			out[k] = v.(string)
		}
	}
	return out
}

// TestPlaceholders serves one request of each kind through the handler and
// reads every {mcp.*} placeholder afterwards, as an access log does.
func TestPlaceholders(t *testing.T) {
	name := "placeholders/" + t.Name()
	h, _ := provisionHandler(t, &Handler{Table: name})
	policy := provisionPolicy(t, &SessionSelection{Table: name, FallbackRaw: []byte(`{"policy":"first"}`)})
	pool := testPool()[:2]
	a := pool[0].Dial
	proxy := &fakeProxy{policy: policy, pool: pool}
	const learned = "Q7LMXW3C2B5NPZKRJ4HTYDVE6A"
	h.table.Learn(testSessionID, pool[1].Dial)
	fp := fingerprint(testSessionID)

	for _, tc := range []struct {
		name    string
		header  http.Header
		respond func(http.ResponseWriter, *http.Request, *reverseproxy.Upstream)
		want    map[string]string
	}{
		{name: "modern tool call", header: modernHeaders("tools/call", "render_chart"), respond: answer(200),
			want: map[string]string{"method": "tools/call", "name": "render_chart", "era": "modern_sessionless", "protocol_version": "2026-07-28", "decision": "balanced"}},
		{name: "legacy initialize", header: http.Header{}, respond: answer(200, learned),
			want: map[string]string{"era": "other_sessionless", "decision": "learned", "pinned_upstream": a}},
		{name: "pinned", header: http.Header{HeaderSessionID: {testSessionID}, HeaderProtocolVersion: {"2025-11-25"}}, respond: answer(200),
			want: map[string]string{"era": "legacy_session", "protocol_version": "2025-11-25", "session_fingerprint": fp, "decision": "pinned", "pinned_upstream": pool[1].Dial}},
		{name: "unknown session", header: http.Header{HeaderSessionID: {"UNKNOWNSESSIONID7Q2XW4C3B5"}},
			want: map[string]string{"era": "legacy_session", "session_fingerprint": fingerprint("UNKNOWNSESSIONID7Q2XW4C3B5"), "decision": "unknown"}},
		{name: "malformed session", header: http.Header{HeaderSessionID: {"a b"}},
			want: map[string]string{"era": "legacy_session", "session_fingerprint": fingerprint("a b"), "decision": "rejected"}},
		{name: "session sent twice", header: http.Header{HeaderSessionID: {"a", "b"}},
			want: map[string]string{"era": "legacy_session", "decision": "rejected"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy.respond = tc.respond
			r := matchRequest(tc.header, `{}`)
			if err := h.ServeHTTP(httptest.NewRecorder(), r, proxy); err != nil {
				t.Fatalf("ServeHTTP: %v", err)
			}
			got := placeholders(r)
			for _, k := range placeholderKeys {
				if got[k] != tc.want[k] {
					t.Errorf("{mcp.%s} = %q, want %q", k, got[k], tc.want[k])
				}
				if strings.Contains(got[k], testSessionID) {
					t.Errorf("{mcp.%s} = %q carries the session ID", k, got[k])
				}
			}
		})
	}

	// A session's upstream that left the pool: gone.
	proxy.pool, proxy.respond = pool[:1], nil
	r := matchRequest(http.Header{HeaderSessionID: {testSessionID}}, `{}`)
	if err := h.ServeHTTP(httptest.NewRecorder(), r, proxy); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	if got := placeholders(r); got["decision"] != "gone" || got["pinned_upstream"] != pool[1].Dial {
		t.Errorf("gone: placeholders %v, want decision gone, pinned_upstream %s", got, pool[1].Dial)
	}
}

// TestPlaceholdersBeforeHandler checks that a matcher alone sets the
// request's placeholders, for routes that use them before any handler.
func TestPlaceholdersBeforeHandler(t *testing.T) {
	m := provisionMatcher(t, &MatchMCP{Body: true})
	r := matchRequest(http.Header{}, toolCall("render_chart"))
	if !m.Match(r) {
		t.Fatal("no match")
	}
	got := placeholders(r)
	if got["method"] != "tools/call" || got["name"] != "render_chart" || got["era"] != "other_sessionless" || got["decision"] != "" {
		t.Errorf("placeholders %v", got)
	}
	if v := placeholders(caddyRequest("", nil))["method"]; v != "<unset>" {
		t.Errorf("{mcp.method} of a request no mcp module saw = %q, want it unset", v)
	}
}

// TestMethodMetrics counts requests by method and status through the handler.
func TestMethodMetrics(t *testing.T) {
	h, _ := provisionHandler(t, &Handler{})
	serve := func(header http.Header, next func(http.ResponseWriter, *http.Request) error) {
		if err := h.ServeHTTP(httptest.NewRecorder(), matchRequest(header, `{}`), handlerFunc(next)); err != nil {
			t.Fatal(err)
		}
	}
	ok := func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(200); return nil }
	serve(modernHeaders("tools/call", "x"), ok)
	serve(modernHeaders("tools/call", "y"), ok)
	serve(modernHeaders("x-vendor/thing", ""), func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(404); return nil })
	serve(http.Header{}, func(http.ResponseWriter, *http.Request) error { return nil }) // nothing written: 200
	serve(modernHeaders("tools/list", ""), func(w http.ResponseWriter, _ *http.Request) error {
		_, err := w.Write([]byte("x")) // implicit 200
		return err
	})
	got := map[string]uint64{}
	h.table.Stats.Methods().Each(func(method string, status int, n uint64) {
		got[method+" "+http.StatusText(status)] = n
	})
	want := map[string]uint64{"tools/call OK": 2, "other Not Found": 1, "unknown OK": 1, "tools/list OK": 1}
	if len(got) != len(want) {
		t.Errorf("counts %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("count of %q = %d, want %d (all: %v)", k, got[k], n, got)
		}
	}
}

// handlerFunc adapts a function to caddyhttp.Handler.
type handlerFunc func(http.ResponseWriter, *http.Request) error

func (f handlerFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) error { return f(w, r) }

// TestSealedPlaceholders: with seal_session_ids, the placeholders of a
// request carrying a sealed ID say what was decided, as for plain IDs: the
// fingerprint is the client's sealed value's (never the upstream's ID),
// pinned_upstream the upstream it opens to, and the decision learned,
// pinned (also when another replica adopts the session), unknown (a value
// that does not open), gone, or, for another principal, the unknown
// session's.
func TestSealedPlaceholders(t *testing.T) {
	key := newKey(t)
	a := newSealedFixture(t, "placeholders/sealed-a", key)
	b := newSealedFixture(t, "placeholders/sealed-b", key)
	for _, f := range []*affinityFixture{a, b} {
		f.h.table.SetBindPrincipal("{http.request.header.Authorization}")
	}
	serve := func(f *affinityFixture, respond func(http.ResponseWriter, *http.Request, *reverseproxy.Upstream), auth string, ids ...string) (*httptest.ResponseRecorder, map[string]string) {
		t.Helper()
		r := newRequest(http.MethodPost, ids...)
		r.Header.Set("Authorization", auth)
		caddyhttp.NewTestReplacer(r)
		rec := f.serve(t, r, respond)
		return rec, placeholders(r)
	}
	rec, got := serve(a, answer(200, testSessionID), "Bearer alice")
	sealed, owner := rec.Header().Get(HeaderSessionID), a.proxy.last().Dial
	if got["decision"] != "learned" || got["pinned_upstream"] != owner {
		t.Errorf("initialize: %v; want learned on %s", got, owner)
	}
	if fingerprint(a.h.sealer.tableKey(sealed)) != fingerprint(sealed) {
		t.Errorf("the debug log and admin API fingerprint a sealed session as %s, {mcp.session_fingerprint} as %s",
			fingerprint(a.h.sealer.tableKey(sealed)), fingerprint(sealed))
	}
	forged := sealed[:len(sealed)-2] + "AA"
	for _, tc := range []struct {
		name string
		f    *affinityFixture
		auth string
		id   string
		want map[string]string
	}{
		{"pinned", a, "Bearer alice", sealed, map[string]string{"decision": "pinned", "pinned_upstream": owner}},
		{"adopted by another replica", b, "Bearer alice", sealed, map[string]string{"decision": "pinned", "pinned_upstream": owner}},
		{"does not open", a, "Bearer alice", forged, map[string]string{"decision": "unknown", "pinned_upstream": ""}},
		{"another principal, the replica that learned it", a, "Bearer mallory", sealed, map[string]string{"decision": "unknown", "pinned_upstream": ""}},
		{"another principal, another replica", b, "Bearer mallory", sealed, map[string]string{"decision": "unknown", "pinned_upstream": ""}},
	} {
		_, got := serve(tc.f, answer(200), tc.auth, tc.id)
		tc.want["era"], tc.want["session_fingerprint"] = "legacy_session", fingerprint(tc.id)
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%s: {mcp.%s} = %q, want %q", tc.name, k, got[k], v)
			}
		}
		for k, v := range got {
			if strings.Contains(v, testSessionID) {
				t.Errorf("%s: {mcp.%s} = %q carries the upstream's session ID", tc.name, k, v)
			}
		}
	}
	a.proxy.pool = reverseproxy.UpstreamPool{{Dial: "192.0.2.1:1"}}
	if _, got := serve(a, answer(200), "Bearer alice", sealed); got["decision"] != "gone" || got["pinned_upstream"] != owner {
		t.Errorf("upstream removed: %v; want gone, pinned_upstream %s", got, owner)
	}
}
