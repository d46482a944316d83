package tests

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// TestBatchesJudgedByTheirVersion sends JSON-RPC batches without a session
// through docs/behaviour.md's "Routing by tool" config (an mcp matcher with
// body that routes whoami calls to a pool of their own), in front of
// stateless go-sdk servers, which answer batches of protocol 2025-03-26
// (docs/behaviour.md, "JSON-RPC batch"). A batch the server would answer
// goes where its members route; one whose members route differently is
// refused, so a route for a call is not bypassed by batching it; at
// 2025-06-18, which removed batches, the proxy still answers 400 itself.
func TestBatchesJudgedByTheirVersion(t *testing.T) {
	pool1 := startEraBackends(t, "p1-", "modern", 1)
	pool2 := startEraBackends(t, "p2-", "modern", 1)
	p := startProxy(t, routingSite(filepath.Join(t.TempDir(), "access.log"), "batches", "", pool1, pool2))
	hc := newHTTPClient()

	whoami := func(id string) string {
		return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`
	}
	echo := func(id string) string {
		return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"echo","arguments":{"message":"m` + id + `"}}}`
	}
	post := func(version string, members ...string) exchange {
		h := map[string][]string{"Accept": {"application/json, text/event-stream"}}
		if version != "" {
			h["Mcp-Protocol-Version"] = []string{version}
		}
		return send(t, hc, http.MethodPost, p.url(), h, "["+strings.Join(members, ",")+"]")
	}

	// Every member routes to the first pool: the batch goes there and both
	// calls run; on main the proxy refused it with 400.
	for _, version := range []string{"", "2025-03-26"} {
		ex := post(version, echo("1"), echo("2"))
		if ex.status != http.StatusOK || !strings.Contains(ex.body, `"text":"m1"`) || !strings.Contains(ex.body, `"text":"m2"`) {
			t.Errorf("batch of two echo calls, version %q: %d %s; want 200 with both results", version, ex.status, ex.body)
		}
	}
	// Every member matches the whoami route: the batch goes to its pool.
	if ex := post("", whoami("1"), whoami("2")); ex.status != http.StatusOK || strings.Count(ex.body, `"server":"p2-`) != 2 {
		t.Errorf("batch of two whoami calls: %d %s; want both answered by the whoami pool (p2-*)", ex.status, ex.body)
	}
	// Members that route differently cannot go one way.
	ex := post("", echo("1"), whoami("2"))
	checkBadRequest(t, ex, "members 1 (tools/call echo) and 2 (tools/call whoami) of this JSON-RPC batch are routed differently")
	// Protocol 2025-06-18 removed batches: the proxy answers, as the server would.
	checkBadRequest(t, post("2025-06-18", echo("1")), "protocol 2025-06-18 has no JSON-RPC batches")

	// The control: the server itself answers the 2025-03-26 batch with both
	// results and refuses the 2025-06-18 one, so the proxy now answers as
	// the server would.
	direct := "http://" + pool1[0].Addr() + "/mcp"
	h := map[string][]string{"Accept": {"application/json, text/event-stream"}}
	if ex := send(t, hc, http.MethodPost, direct, h, "["+echo("1")+","+echo("2")+"]"); ex.status != http.StatusOK || !strings.Contains(ex.body, `"text":"m2"`) {
		t.Errorf("the server itself: %d %s; want 200 with both results", ex.status, ex.body)
	}
	h["Mcp-Protocol-Version"] = []string{"2025-06-18"}
	if ex := send(t, hc, http.MethodPost, direct, h, "["+echo("1")+"]"); ex.status != http.StatusBadRequest {
		t.Errorf("the server itself at 2025-06-18: %d %s; want 400", ex.status, ex.body)
	}
}
