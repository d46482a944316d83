package tests

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A frozen upstream: a server process stopped with SIGSTOP. The kernel
// still accepts its connections and takes in requests; nothing answers.

// TestFrozenUpstreamNeverHoldsNewSessions: three go-sdk servers behind
// mcp_proxy with `initialize_timeout 2s` and `pinned_timeout 3s`; the
// server with the fewest sessions, s3, is stopped with SIGSTOP, so that
// least_sessions picks it for the next new session. Then:
//   - 8 new sessions all open, none on s3: the first waits 2 s for s3 and
//     is sent to another server, the 7 others never wait for s3 (each
//     under 2 s);
//   - a call of s3's session gets 504 with a JSON-RPC error after 3 s, and
//     works again, on s3, once s3 resumes;
//   - negative controls in the same run: with `initialize_timeout off`, an
//     initialize to s3 hangs until the client gives up (4 s); without
//     `pinned_timeout` (the default), a call of a session of s3 hangs too,
//     while a silent 3 s tool call succeeds.
func TestFrozenUpstreamNeverHoldsNewSessions(t *testing.T) {
	bs := startBackends(t, 3, true)
	s3 := bs[2]
	hc := newHTTPClient()
	t.Cleanup(hc.CloseIdleConnections)
	ps := startProxies(t,
		fmt.Sprintf("mcp_proxy %s {\n\t\ttable frozen-a\n\t\tinitialize_timeout 2s\n\t\tpinned_timeout 3s\n\t}", upstreams(bs)),
		fmt.Sprintf("mcp_proxy %s {\n\t\ttable frozen-b\n\t\tinitialize_timeout 2s\n\t}", s3.Addr()),
		fmt.Sprintf("mcp_proxy %s {\n\t\ttable frozen-c\n\t\tinitialize_timeout off\n\t}", s3.Addr()))
	a, b, c := ps[0], ps[1], ps[2]

	// s1 and s2 get two sessions each, s3 one: s3 is next for least_sessions.
	setDraining(t, "frozen-a", s3.Addr(), true)
	for range 4 {
		if _, server, _, err := timedConnect(t, a.url(), hc, 10*time.Second); err != nil || server == s3.Name() {
			t.Fatalf("session on %q while s3 drains: %v", server, err)
		}
	}
	setDraining(t, "frozen-a", s3.Addr(), false)
	pinned, server, _, err := timedConnect(t, a.url(), hc, 10*time.Second)
	if err != nil || server != s3.Name() {
		t.Fatalf("fifth session on %q, want %s: %v", server, s3.Name(), err)
	}
	quiet, _, _, err := timedConnect(t, b.url(), hc, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	res, err := quiet.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"milliseconds": 3000}})
	if err != nil || res.IsError {
		t.Fatalf("a silent 3 s tool call behind initialize_timeout 2s failed after %v: %v %v", time.Since(start), err, res)
	}
	t.Logf("silent tool call of 3 s: answered after %v", time.Since(start).Round(time.Millisecond))

	resume := freeze(t, s3)
	var took []time.Duration
	for i := range 8 {
		_, server, d, err := timedConnect(t, a.url(), hc, 15*time.Second)
		took = append(took, d.Round(time.Millisecond))
		if err != nil || server == "" || server == s3.Name() {
			t.Fatalf("new session %d: on %q after %v: %v", i+1, server, d, err)
		}
	}
	t.Logf("8 new sessions with s3 frozen took %v", took)
	if took[0] < 2*time.Second {
		t.Errorf("the first new session took %v: it did not wait for s3, which least_sessions should have picked", took[0])
	}
	for i, d := range took[1:] {
		if d >= 2*time.Second {
			t.Errorf("new session %d took %v: it waited for s3, which is stuck", i+2, d)
		}
	}

	status, body, d := patientCall(a.url(), pinned.ID(), 15*time.Second)
	t.Logf("call of s3's session with pinned_timeout 3s: %d after %v", status, d.Round(time.Millisecond))
	if status != http.StatusGatewayTimeout || rpcErrorCode(body) != -32004 || d < 3*time.Second || d > 8*time.Second {
		t.Errorf("call of s3's session: %d %q after %v; want the proxy's 504 (JSON-RPC -32004) after 3 s", status, body, d)
	}
	status, _, d = patientCall(b.url(), quiet.ID(), 4*time.Second)
	if status != 0 {
		t.Errorf("without pinned_timeout, a call of a frozen upstream's session got %d after %v; want no answer (the default never cuts pinned requests)", status, d)
	}
	if _, _, d, err := timedConnect(t, c.url(), hc, 4*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("initialize_timeout off: opening a session on frozen s3 ended after %v with %v; want the client to give up (negative control)", d, err)
	}
	status, body, d = patientCall(b.url(), "", 15*time.Second)
	t.Logf("initialize with the only upstream frozen: %d after %v: %s", status, d.Round(time.Millisecond), body)
	if status != http.StatusGatewayTimeout || rpcErrorCode(body) != -32004 || d < 2*time.Second || d > 8*time.Second {
		t.Errorf("initialize with the only upstream frozen: %d %q after %v; want the proxy's 504 (JSON-RPC -32004) after 2 s", status, body, d)
	}

	resume()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if id, err := whoami(ctx, pinned); err != nil || id.Server != s3.Name() {
		t.Errorf("s3's session after s3 resumed: %v on %q; want it kept and answered by s3", err, id.Server)
	}
}

// TestFrozenUpstreamWithHealthChecks is docs/operating.md's recipe for pinned
// sessions of a frozen upstream: active health checks on /healthz every
// second with a 1 s timeout. Two servers; s1 is stopped with SIGSTOP.
// Within a few seconds its sessions' calls get the proxy's 503 with
// Retry-After instead of hanging, new sessions go to s2, and once s1
// resumes every session of it works again, answered by s1: the mappings
// were kept (unhealthy_grace, default 1 m). The times are logged for
// docs/operating.md.
func TestFrozenUpstreamWithHealthChecks(t *testing.T) {
	f := startHealthFleet(t, "\t\thealth_interval 1s\n\t\thealth_timeout 1s", 6)
	s1 := f.sessions["s1"]
	resume := freeze(t, f.srv[0])
	start := time.Now()
	var status, hung int
	var body string
	for status != http.StatusServiceUnavailable {
		if time.Since(start) > 15*time.Second {
			t.Fatalf("no 503 for s1's session 15 s after s1 froze; last %d %q", status, body)
		}
		if status, body, _ = patientCall(f.p.url(), s1[0].ID(), time.Second); status == 0 {
			hung++
		}
	}
	detected := time.Since(start)
	ex := f.call(t, s1[len(s1)-1])
	checkUnavailable(t, ex)
	if _, server, took, err := timedConnect(t, f.p.url(), f.hc, 5*time.Second); err != nil || server != "s2" {
		t.Errorf("a new session with s1 frozen: on %q after %v: %v; want s2", server, took, err)
	}
	resume()
	resumed := time.Now()
	f.waitStatus(t, s1[0], http.StatusOK, 10*time.Second)
	back := time.Since(resumed)
	t.Logf("s1 frozen: its sessions get 503 after %v (%d calls given up after 1 s before); after SIGCONT they work again after %v",
		detected.Round(100*time.Millisecond), hung, back.Round(10*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for cs, want := range f.first {
		if id, err := whoami(ctx, cs); err != nil || id != want {
			t.Errorf("after s1 resumed: %+v, %v; want %+v", id, err, want)
		}
	}
}

// TestSlowUploadIsNotAFrozenUpstream (docs/behaviour.md, "What happens when": a
// client's body that is slow or ends early): pinned_timeout bounds the
// upstream's wait for response headers, not the client's upload. A call
// whose body arrives after longer than pinned_timeout is answered, and its
// upstream keeps getting new sessions; a body that ends before its
// Content-Length is answered by the proxy, and no upstream sees it.
func TestSlowUploadIsNotAFrozenUpstream(t *testing.T) {
	ds := startDoubles(t, 2)
	p := startProxy(t, fmt.Sprintf("mcp_proxy %s {\n\t\ttable slow-upload\n\t\tpinned_timeout 1s\n\t\tfallback round_robin\n\t}", upstreams(ds)))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	id := initialize(t, hc, p.url())
	body := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami"}}`
	head := fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
		"Mcp-Session-Id: %s\r\nContent-Length: %d\r\n\r\n", p.addr, id, len(body))

	slow := func(rest string, pause time.Duration) (int, string) {
		conn, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
		if _, err := io.WriteString(conn, head+body[:20]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(pause)
		if rest == "" {
			conn.(*net.TCPConn).CloseWrite() //nolint:errcheck
		} else if _, err := io.WriteString(conn, rest); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodPost})
		if err != nil {
			t.Fatalf("reading the response: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, b := slow(body[20:], 1500*time.Millisecond); status != http.StatusOK {
		t.Errorf("a call whose body took 1.5 s to arrive, pinned_timeout 1s: %d %s, want 200", status, b)
	}
	before := ds[0].total() + ds[1].total()
	// Over HTTP/1.1 a body ends early only when the client closes its side
	// of the connection, which Go's server takes for a client gone: 499, as
	// Caddy logs a client that left (the handler's unit test has the 400
	// that an HTTP/2 stream ended early gets).
	if status, b := slow("", 0); status != 499 {
		t.Errorf("a body that ended before its Content-Length: %d %s, want 499 (client gone)", status, b)
	}
	if after := ds[0].total() + ds[1].total(); after != before {
		t.Errorf("the truncated request reached an upstream (%d requests)", after-before)
	}
	// Neither upstream was taken for stuck or failed: new sessions still
	// alternate between the two.
	was := []int{ds[0].total(), ds[1].total()}
	for range 4 {
		initialize(t, hc, p.url())
	}
	if got := []int{ds[0].total() - was[0], ds[1].total() - was[1]}; got[0] == 0 || got[1] == 0 {
		t.Errorf("4 new sessions went %v to the two upstreams, want both to get some", got)
	}
}
