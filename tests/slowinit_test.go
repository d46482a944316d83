package tests

import (
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestSlowInitializeOpensSessions (docs/behaviour.md, "Health checks,
// failures and frozen upstreams": a slow upstream): three go-sdk servers whose
// initialize takes 6 s, as after a cold start, behind mcp_proxy with its
// defaults (initialize_timeout 5s). Two go-sdk clients connect at once:
// both get their session, after about 6 s, and a whoami call on it is
// answered by the server that opened it; the servers received 2
// initializes in all, none abandoned and sent again. Negative control in
// the same run: a server of the same kind frozen with SIGSTOP still gets
// the proxy's 504, after initialize_timeout and a probe.
func TestSlowInitializeOpensSessions(t *testing.T) {
	slow := startBackendsWith(t, 4, false, func(string) []string { return []string{"-initialize-delay", "6s"} })
	frozen := slow[3]
	ps := startProxies(t, "mcp_proxy "+upstreams(slow[:3])+" {\n\t\ttable slow-init\n\t}",
		"mcp_proxy "+frozen.Addr()+" {\n\t\ttable slow-init-frozen\n\t}")
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	type opened struct {
		server string
		took   time.Duration
		err    error
	}
	got := make([]opened, 2)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			_, server, took, err := timedConnect(t, ps[0].url(), hc, 30*time.Second)
			got[i] = opened{server: server, took: took.Round(time.Millisecond), err: err}
		})
	}
	wg.Wait()
	seen := 0
	for _, s := range slow[:3] {
		seen += s.Log().Count("whoami: initialize")
	}
	ok := 0
	for i, o := range got {
		t.Logf("session %d: on %q after %v: %v", i+1, o.server, o.took, o.err)
		if o.err == nil && o.server != "" {
			ok++
		}
	}
	t.Logf("%d/2 sessions opened; the servers received %d initializes", ok, seen)
	if ok != 2 {
		t.Errorf("%d/2 sessions opened on servers whose initialize takes 6 s, with initialize_timeout 5s; want 2/2", ok)
	}
	if seen != 2 {
		t.Errorf("the servers received %d initializes for 2 sessions; want 2: none abandoned and sent again", seen)
	}

	freeze(t, frozen)
	status, body, d := patientCall(ps[1].url(), "", 20*time.Second)
	t.Logf("control, the only upstream frozen: %d after %v: %s", status, d.Round(time.Millisecond), body)
	if status != http.StatusGatewayTimeout || rpcErrorCode(body) != -32004 || d < 5*time.Second || d > 10*time.Second {
		t.Errorf("control, the only upstream frozen: %d %q after %v; want the proxy's 504 (JSON-RPC -32004) after 5 s and a probe", status, body, d)
	}
}
