package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Principal binding: a session belongs to the principal that opened it.

// TestPrincipalBindingStopsHijack: with `bind_principal
// {http.request.header.Authorization}`, a second client with another
// bearer token (or none), fresh connections and a known session ID gets, for
// a tool call, the GET stream and DELETE, exactly the proxy's answer to an
// unknown session; nothing reaches the upstream (its tool call would be
// answered, its DELETE would end the session), the owner's session keeps
// working, and each refusal is counted. The control in the same run,
// `bind_principal off`: the same attacker's tool call is answered by the
// session's go-sdk server and its DELETE ends the owner's session.
func TestPrincipalBindingStopsHijack(t *testing.T) {
	bs := startBackends(t, 2, true)
	site := func(table, bind string) string {
		return fmt.Sprintf("mcp_proxy %s {\n\t\ttable %s\n\t\tbind_principal %s\n\t}", upstreams(bs), table, bind)
	}
	p := startProxy(t, site("bound", "{http.request.header.Authorization}"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	alice, _ := clientAs("Bearer alice-token")
	cs, err := connect(ctx, p.url(), alice)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	owner, err := whoami(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}

	unknown := tryHijack(t, p.url(), "UNKNOWNSESSION0000000000000", "Bearer mallory-token")
	for _, auth := range []string{"Bearer mallory-token", ""} {
		got := tryHijack(t, p.url(), cs.ID(), auth)
		for _, c := range []struct {
			what      string
			got, want exchange
		}{{"tool call", got.call, unknown.call}, {"GET stream", got.get, unknown.get}, {"DELETE", got.del, unknown.del}} {
			if c.got.status != http.StatusNotFound || c.got.body != c.want.body || c.got.header.Get("Content-Type") != c.want.header.Get("Content-Type") {
				t.Errorf("%s with Authorization %q: %d %q; want the unknown session's answer %d %q", c.what, auth, c.got.status, c.got.body, c.want.status, c.want.body)
			}
		}
	}
	if again, err := whoami(ctx, cs); err != nil || again != owner {
		t.Fatalf("the owner after the hijack attempts: %+v, %v; want %+v", again, err, owner)
	}
	if n := mismatches(t, "bound"); n != 6 {
		t.Errorf("caddy_mcp_principal_mismatch_total = %v, want 6", n)
	}

	// Control: without binding, the same attack works.
	ctrl := startProxy(t, site("unbound", "off"))
	ccs, err := connect(ctx, ctrl.url(), alice)
	if err != nil {
		t.Fatal(err)
	}
	defer ccs.Close()
	got := tryHijack(t, ctrl.url(), ccs.ID(), "Bearer mallory-token")
	if got.call.status != http.StatusOK || !strings.Contains(got.call.body, ccs.ID()) {
		t.Fatalf("control, bind_principal off: the attacker's tool call got %d %q; want the server's answer (the hijack)", got.call.status, got.call.body)
	}
	if _, err := whoami(ctx, ccs); err == nil {
		t.Fatal("control, bind_principal off: the owner's session survived the attacker's DELETE")
	}
}

// TestPrincipalBindingDefaultsToAuthenticatedUser: by default a session is
// bound to `{http.auth.user.id}`. Behind Caddy's basic_auth, bob (valid
// credentials of his own) cannot use alice's session; alice can. Without
// Caddy authentication the principal is empty, sessions are unbound, and a
// client whose bearer token changes mid-session (an OAuth refresh) keeps
// its session; binding to the Authorization header instead breaks it,
// which is why that binding is opt-in.
func TestPrincipalBindingDefaultsToAuthenticatedUser(t *testing.T) {
	bs := startBackends(t, 2, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, fmt.Sprintf("basic_auth {\n\t\talice %s\n\t\tbob %s\n\t}\n\tmcp_proxy %s {\n\t\ttable basic\n\t}", hash, hash, upstreams(bs)))
	basic := func(user string) string {
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		r.SetBasicAuth(user, "secret")
		return r.Header.Get("Authorization")
	}
	alice, _ := clientAs(basic("alice"))
	cs, err := connect(ctx, p.url(), alice)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	owner, err := whoami(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	got := tryHijack(t, p.url(), cs.ID(), basic("bob"))
	if got.call.status != http.StatusNotFound || got.del.status != http.StatusNotFound || !strings.Contains(got.call.body, "Session not found") {
		t.Errorf("bob with alice's session: tool call %d %q, DELETE %d; want the proxy's 404s", got.call.status, got.call.body, got.del.status)
	}
	if again, err := whoami(ctx, cs); err != nil || again != owner {
		t.Fatalf("alice after bob's attempts: %+v, %v; want %+v", again, err, owner)
	}
	if n := mismatches(t, "basic"); n != 3 {
		t.Errorf("caddy_mcp_principal_mismatch_total = %v, want 3", n)
	}

	for _, tc := range []struct {
		bind  string
		keeps bool
	}{{"", true}, {"{http.request.header.Authorization}", false}} {
		opt := ""
		if tc.bind != "" {
			opt = "\n\t\tbind_principal " + tc.bind
		}
		p := startProxy(t, fmt.Sprintf("mcp_proxy %s {\n\t\ttable refresh%d%s\n\t}", upstreams(bs), len(tc.bind), opt))
		hc, at := clientAs("Bearer token-1")
		cs, err := connect(ctx, p.url(), hc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := whoami(ctx, cs); err != nil {
			t.Fatal(err)
		}
		refreshed := "Bearer token-2" // the client refreshed its token
		at.value.Store(&refreshed)
		_, err = whoami(ctx, cs)
		if kept := err == nil; kept != tc.keeps {
			t.Errorf("bind_principal %q: after a token refresh the session kept = %v (%v); want %v", tc.bind, kept, err, tc.keeps)
		}
		cs.Close()
	}
}

// TestPrincipalBindingLegacyTwoSessionNames: behind basic_auth (sessions
// bound to the user), alice and bob each hold a legacy HTTP+SSE session on
// one TypeScript SDK server. Bob POSTs a tool call to alice's message URL
// (?sessionId=<alice's>) carrying his own session in Mcp-Session-Id, and
// once more without the header, with alice's session followed by 10000
// '&' (Go's url.ParseQuery reads none of such a query; the server's
// URLSearchParams reads it). The first gets 400 with a JSON-RPC error
// saying the request names two sessions, the second the unknown session's
// 404, as does the plain POST without the header; none reaches the server,
// and the first message on alice's stream is the answer to her own next
// call. Bob's own session named in both places works.
func TestPrincipalBindingLegacyTwoSessionNames(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	ss := startTSServers(t, env, 1, "tb", "--legacy-sse")
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, fmt.Sprintf("basic_auth {\n\t\talice %s\n\t\tbob %s\n\t}\n\tmcp_proxy %s {\n\t\ttable legacy_bound\n\t}", hash, hash, upstreams(ss)))
	basic := func(user string) string {
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		r.SetBasicAuth(user, "secret")
		return r.Header.Get("Authorization")
	}
	aliceHC, _ := clientAs(basic("alice"))
	bobHC, _ := clientAs(basic("bob"))
	as := openLegacyStream(t, aliceHC, "http://"+p.addr+"/sse")
	time.AfterFunc(30*time.Second, as.close) // a stream that never answers fails the test instead of hanging it
	bs := openLegacyStream(t, bobHC, "http://"+p.addr+"/sse")
	time.AfterFunc(30*time.Second, bs.close)
	bob := sessionIn(t, bs.endpoint)
	call := func(id int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`, id)
	}
	aliceURL := "http://" + p.addr + as.endpoint

	before := tsRequests(t, ss)
	two := send(t, bobHC, http.MethodPost, aliceURL, sid(bob), call(41))
	if e, err := parseRPCError(two.body); two.status != http.StatusBadRequest || err != nil || !strings.Contains(e.Error.Message, "two sessions") {
		t.Errorf("bob's POST to alice's ?sessionId with his own Mcp-Session-Id: %d %q; want 400 saying it names two sessions", two.status, two.body)
	}
	long := send(t, bobHC, http.MethodPost, aliceURL+strings.Repeat("&", 10000), nil, call(43))
	if long.status != http.StatusNotFound || rpcErrorCode(long.body) != -32001 {
		t.Errorf("bob's POST to alice's ?sessionId followed by 10000 '&': %d %q; want the proxy's 404", long.status, long.body)
	}
	checkProxy404(t, send(t, bobHC, http.MethodPost, aliceURL, nil, call(44)).as("bob's POST to alice's ?sessionId"))
	if after := tsRequests(t, ss); after != before {
		t.Errorf("bob's POSTs reached the server: %d requests before, %d after", before, after)
	}

	if own := send(t, aliceHC, http.MethodPost, aliceURL, nil, call(42)); own.status != http.StatusAccepted {
		t.Fatalf("alice's own call: %d %q, want 202", own.status, own.body)
	}
	if typ, data := readEvent(t, as.events); typ != "message" || !strings.Contains(data, `"id":42`) {
		t.Errorf("alice's stream: first message %q %s; want the answer to her own call (id 42), not one to bob's", typ, data)
	}
	both := send(t, bobHC, http.MethodPost, "http://"+p.addr+bs.endpoint, sid(bob), call(45))
	if both.status != http.StatusAccepted {
		t.Errorf("bob's own session in the query and Mcp-Session-Id: %d %q, want 202", both.status, both.body)
	}
	if typ, data := readEvent(t, bs.events); typ != "message" || !strings.Contains(data, `"id":45`) {
		t.Errorf("bob's stream: first message %q %s; want the answer to his call (id 45)", typ, data)
	}
}
