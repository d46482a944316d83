package tests

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// Sealing helpers: keys, sealers, sealed sites, and raw MCP requests
// (mcpPost, mcpInitialize).

// sealedRow names a server of the Interoperability table behind a proxy
// with sealed session IDs.
func sealedRow(server string) string { return server + "; `mcp_proxy` with `seal_session_ids`" }

// newSealKey returns a random sealing key, base64-encoded as
// `openssl rand -base64 32` prints it.
func newSealKey(t testing.TB) string {
	t.Helper()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(k)
}

// sealerOf returns a sealer of the given base64 keys, to mint or open
// sealed values as the proxy does.
func sealerOf(t testing.TB, keys ...string) *caddymodule.SessionSealer {
	t.Helper()
	raw := make([][]byte, len(keys))
	for i, k := range keys {
		b, err := base64.StdEncoding.DecodeString(k)
		if err != nil {
			t.Fatal(err)
		}
		raw[i] = b
	}
	s, err := caddymodule.NewSessionSealer(raw...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sealedProxy returns an mcp_proxy directive over upstreams that seals
// session IDs with the keys in the given environment variables, the first
// sealing.
func sealedProxy(upstreams string, keyVars ...string) string {
	keys := make([]string, len(keyVars))
	for i, v := range keyVars {
		keys[i] = "{env." + v + "}"
	}
	return fmt.Sprintf("mcp_proxy %s {\n\t\tseal_session_ids %s\n\t}", upstreams, strings.Join(keys, " "))
}

// eachSessionAsync starts f on every session in the background.
func eachSessionAsync(wg *sync.WaitGroup, ss []*session, f func(*session)) {
	for _, s := range ss {
		wg.Go(func() { f(s) })
	}
}

// requireSessions fails the test unless every session is ok and, if calls is
// not 0, exactly that many calls were made.
func requireSessions(t *testing.T, step string, ss []*session, sessions, calls int) {
	t.Helper()
	ok, n, first := sessionsResult(ss)
	if ok != sessions || calls != 0 && n != calls {
		t.Fatalf("%s: %d/%d sessions ok, %d calls (want %d); first error: %v", step, ok, sessions, n, calls, first)
	}
}

// mcpPost sends one JSON-RPC message of session to url and returns the exchange.
func mcpPost(t testing.TB, hc *http.Client, url, session, body string) exchange {
	t.Helper()
	hdr := map[string][]string{"Accept": {"application/json, text/event-stream"}}
	if session != "" {
		hdr["Mcp-Session-Id"] = []string{session}
		hdr["Mcp-Protocol-Version"] = []string{"2025-11-25"}
	}
	return send(t, hc, http.MethodPost, url, hdr, body)
}

// mcpInitialize opens a session through url with raw requests and returns
// the Mcp-Session-Id the client got.
func mcpInitialize(t testing.TB, hc *http.Client, url string) string {
	t.Helper()
	ex := mcpPost(t, hc, url, "", initBody)
	if ex.status != http.StatusOK || len(ex.header.Values("Mcp-Session-Id")) != 1 {
		t.Fatalf("initialize through %s: %d %v %s", url, ex.status, ex.header, ex.body)
	}
	id := ex.header.Get("Mcp-Session-Id")
	if ex := mcpPost(t, hc, url, id, tsInitializedMsg); ex.status != http.StatusAccepted {
		t.Fatalf("notifications/initialized through %s: %d %s", url, ex.status, ex.body)
	}
	return id
}

// sessionLookup asks a Caddy's admin API about a session: its upstream, or
// "" with the status if it does not hold it.
func sessionLookup(t testing.TB, admin, session string) (string, int) {
	t.Helper()
	var out struct {
		Upstream string `json:"upstream"`
	}
	status, err := adminDoAt(admin, http.MethodPost, "/mcp_sessions/lookup", map[string]string{"session_id": session}, &out)
	if err != nil {
		t.Fatalf("admin API of %s: %v", admin, err)
	}
	return out.Upstream, status
}

// withVersion returns the sealed value raw, decoded, with its version byte
// set to v, encoded again.
func withVersion(raw []byte, v byte) string {
	b := append([]byte{v}, raw[1:]...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// tsRequests returns how many requests reached the TypeScript servers.
func tsRequests(t testing.TB, ss []*testproc.Proc) int {
	n := 0
	for _, s := range ss {
		n += tsStatsOf(t, s).Requests
	}
	return n
}

// portOf returns a listener's port.
func portOf(ln net.Listener) string {
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
