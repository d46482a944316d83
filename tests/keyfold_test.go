package tests

import (
	"net/http"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// TestBlockedToolNotReachedThroughLooseKeys blocks tool danger with an
// `mcp` body matcher in front of a real mcp-go server, which decodes with
// Go's encoding/json and so reads a key that folds to "params" (ſ U+017F
// for s, raw or \u017f-escaped, in any letter case) as params. Each such
// call, sent with a length or chunked, is refused by the proxy with a 400
// naming the key, and the server never runs danger. The negative control,
// in the same run: the same bodies sent straight to the server run danger
// (the bypass is real), a plain call of danger through the proxy is
// blocked by the route, and calls of other tools work through the proxy.
func TestBlockedToolNotReachedThroughLooseKeys(t *testing.T) {
	server, calls := startRecordingMCPGo(t)
	p := startProxy(t, blockDangerSite(upstreams([]*testproc.Proc{server})))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	ex := send(t, hc, http.MethodPost, p.url(), mcpPOSTHeaders(""), initBody)
	session := ex.header.Get("Mcp-Session-Id")
	if ex.status != http.StatusOK || !strings.HasPrefix(session, mcpGoIDPrefix) {
		t.Fatalf("initialize through the proxy: want 200 with an mcp-go session; got %d %v %s", ex.status, ex.header, ex.body)
	}
	hdr := mcpPOSTHeaders(session)

	loose := []struct {
		name, key string
		chunked   bool
	}{
		{"long s", "paramſ", false},
		{"long s, chunked", "paramſ", true},
		{"long s escaped", `param\u017f`, false},
		{"long s escaped, upper case", `PARAM\u017F`, false},
		{"long s escaped, chunked", `param\u017f`, true},
		{"escapes throughout", `\u0070aram\u017f`, false},
	}
	for _, tc := range loose {
		tag := "proxy " + tc.name
		body := looseCall(tc.key, tag)
		ex := postMaybeChunked(t, hc, p.url(), hdr, body, tc.chunked)
		checkBadRequest(t, ex.as(tc.name), "is ambiguous")
		if e, _ := parseRPCError(ex.body); e.Error.Code != -32600 || !strings.Contains(e.Error.Message, `read it as "params"`) {
			t.Errorf("%s: want JSON-RPC -32600 saying the key reads as params; got %s", tc.name, ex.body)
		}
		t.Logf("%s: %d %s", tc.name, ex.status, ex.body)

		// Negative control: straight to the server, the same body runs danger.
		direct := postMaybeChunked(t, hc, server.URL(), hdr, strings.Replace(body, tag, "direct "+tc.name, 1), tc.chunked)
		if direct.status != http.StatusOK || !strings.Contains(direct.body, "danger ran: direct "+tc.name) {
			t.Fatalf("%s sent straight to mcp-go: want danger to run (the bypass this guards against); got %d %s", tc.name, direct.status, direct.body)
		}
	}

	// A key the matcher does not read may hold any character: with the
	// Kelvin sign (which folds to k) in _meta's progressToken, the call is
	// still read as danger, and blocked by the route.
	kelvin := `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"danger","arguments":{"tag":"proxy kelvin"},"_meta":{"progressTo\u212aen":1}}}`
	if ex := send(t, hc, http.MethodPost, p.url(), hdr, kelvin); ex.status != http.StatusForbidden || !strings.Contains(ex.body, "blocked here") {
		t.Errorf("danger with the Kelvin sign in _meta.progressToken: want 403 from the route; got %d %s", ex.status, ex.body)
	}
	safe := `{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"safe","arguments":{}}}`
	if ex := send(t, hc, http.MethodPost, p.url(), hdr, safe); ex.status != http.StatusOK || !strings.Contains(ex.body, "safe ran") {
		t.Errorf("a call of safe through the proxy: want 200 from the tool; got %d %s", ex.status, ex.body)
	}
	plain := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"danger","arguments":{"tag":"proxy plain danger"}}}`
	if ex := send(t, hc, http.MethodPost, p.url(), hdr, plain); ex.status != http.StatusForbidden {
		t.Errorf("a plain call of danger through the proxy: want 403 from the route; got %d %s", ex.status, ex.body)
	}

	ran := dangerCalls(t, calls)
	for _, tag := range ran {
		if strings.HasPrefix(tag, "proxy") {
			t.Errorf("danger ran for a request sent through the proxy: %q (all runs: %q)", tag, ran)
		}
	}
	if len(ran) != len(loose) {
		t.Errorf("danger ran %d times, want %d (once per direct send): %q", len(ran), len(loose), ran)
	}
}
