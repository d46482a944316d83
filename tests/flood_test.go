package tests

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An initialize flood: many sessions opened and never used.

// TestInitializeFloodKeepsSessionsInUse: with max_sessions 1000, 50,000
// initialize requests from one client, while 20 go-sdk sessions (no GET
// stream) call a tool every 2 s and 10 go-sdk sessions hold their GET
// stream open: 30/30 sessions survive, every call answered by the
// session's server. The flood's sessions push out only each other. The
// control in the same run: 5 sessions opened during the flood and not used
// are pushed out like the flood's own, which is what an LRU table did to
// the sessions in use.
func TestInitializeFloodKeepsSessionsInUse(t *testing.T) {
	const (
		maxSessions = 1000
		floodSize   = 50_000
		callers     = 20
		streamers   = 10
	)
	servers := startBackends(t, 2, true)
	fl := startFloodServer(t)
	p := startProxy(t, fmt.Sprintf("mcp_proxy /mcp %s {\n\t\ttable flood\n\t\tmax_sessions %d\n\t}\n\tmcp_proxy /flood %s {\n\t\ttable flood\n\t}",
		upstreams(servers), maxSessions, fl.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	sessions := make([]*mcp.ClientSession, callers+streamers)
	owners := make([]string, len(sessions))
	for i := range sessions {
		connectTo := connect
		if i < callers {
			connectTo = noStream
		}
		cs, err := connectTo(ctx, p.url(), hc)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		id, err := whoami(ctx, cs)
		if err != nil {
			t.Fatal(err)
		}
		sessions[i], owners[i] = cs, id.Server
	}
	waitStreams(t, "flood", sessions[callers:])

	stop := make(chan struct{})
	errs := make(chan error, callers)
	var calls atomic.Int64
	for i, cs := range sessions[:callers] {
		go func() { errs <- callEvery(ctx, cs, owners[i], 2*time.Second, stop, &calls) }()
	}
	var answered atomic.Int64
	victims := make(chan []string, 1)
	go func() { // the control: opened once the flood is under way, never used
		for answered.Load() < 1000 {
			time.Sleep(10 * time.Millisecond)
		}
		var ids []string
		for range 5 {
			ids = append(ids, openUnused(hc, p.url(), nil))
		}
		victims <- ids
	}()
	gc := debug.SetGCPercent(400) // the flood allocates much and keeps little
	cpu := processCPU()
	res := flood(p.addr, "/flood", floodSize, 8, "", &answered)
	cpu = processCPU() - cpu
	debug.SetGCPercent(gc)
	close(stop)
	t.Logf("flood: %d initialize requests in %v (%.0f/s, %v of this process's CPU each), %d learned, %d failed (%v); %d calls of the 20 callers meanwhile",
		floodSize, res.took.Round(time.Millisecond), float64(floodSize)/res.took.Seconds(), (cpu / floodSize).Round(time.Microsecond),
		res.learned, res.failed, res.firstErr.Load(), calls.Load())
	for range callers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	for i, cs := range sessions {
		if id, err := whoami(ctx, cs); err != nil || id.Server != owners[i] {
			t.Errorf("session %d (%s) after the flood: %+v, %v; want it on %s", i, map[bool]string{true: "caller", false: "GET stream"}[i < callers], id, err, owners[i])
		}
	}
	if res.learned < floodSize*99/100 {
		t.Errorf("only %d of %d flood initializes were answered with a session: the flood did not flood", res.learned, floodSize)
	}
	families, _ := scrape(t)
	evicted := func(reason string) float64 {
		return metricValue(families, "caddy_mcp_sessions_evicted_total", map[string]string{"table": "flood", "reason": reason})
	}
	t.Logf("evictions: unconfirmed %v, lru %v", evicted("unconfirmed"), evicted("lru"))
	if evicted("lru") != 0 || evicted("unconfirmed") < float64(res.learned-maxSessions) {
		t.Errorf("evictions: lru %v, unconfirmed %v; want 0 and at least %d", evicted("lru"), evicted("unconfirmed"), res.learned-maxSessions)
	}
	for _, id := range <-victims {
		if id == "" {
			t.Fatal("control: a session could not be opened during the flood")
		}
		if ex := send(t, hc, http.MethodPost, p.url(), mcpPOSTHeaders(id), `{"jsonrpc":"2.0","method":"notifications/initialized"}`); ex.status != http.StatusNotFound {
			t.Errorf("control: a session opened during the flood and never used got %d; want the proxy's 404 (pushed out)", ex.status)
		}
	}
}

// TestClientCapKeepsNewSessionsDuringFlood: with max_unconfirmed_per_client,
// a session that another client opens during a flood survives until its
// first use even when that comes after many times max_sessions flood
// initializes: the flooding client only pushes out its own sessions. The
// control in the same run, the same table without the cap: the new
// session is pushed out before its first use.
func TestClientCapKeepsNewSessionsDuringFlood(t *testing.T) {
	servers := startBackends(t, 1, true)
	fl := startFloodServer(t)
	const maxSessions = 200
	site := ""
	for _, v := range []struct{ table, cap string }{{"capped", "\n\t\tmax_unconfirmed_per_client 20\n\t\tclient_key {http.request.header.X-Client}"}, {"uncapped", ""}} {
		site += fmt.Sprintf("mcp_proxy /%s/mcp %s {\n\t\ttable %s\n\t\tmax_sessions %d%s\n\t}\n\tmcp_proxy /%s/flood %s {\n\t\ttable %s\n\t}\n\t",
			v.table, upstreams(servers), v.table, maxSessions, v.cap, v.table, fl.Addr(), v.table)
	}
	p := startProxy(t, strings.TrimSpace(site))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	for _, tc := range []struct {
		table    string
		survives bool
	}{{"capped", true}, {"uncapped", false}} {
		url := "http://" + p.addr + "/" + tc.table + "/mcp"
		var answered atomic.Int64
		done := make(chan *floodResult)
		go func() {
			done <- flood(p.addr, "/"+tc.table+"/flood", 10*maxSessions, 8, "X-Client: mallory\r\n", &answered)
		}()
		for answered.Load() < maxSessions {
			time.Sleep(5 * time.Millisecond)
		}
		id := openUnused(hc, url, http.Header{"X-Client": {"alice"}})
		opened := answered.Load()
		for answered.Load() < opened+3*maxSessions {
			time.Sleep(5 * time.Millisecond)
		}
		hdr := mcpPOSTHeaders(id)
		hdr["X-Client"] = []string{"alice"}
		used := answered.Load()
		ex := send(t, hc, http.MethodPost, url, hdr, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		res := <-done
		t.Logf("%s: alice's session, first used after %d flood initializes: %d; flood %d learned, %d failed",
			tc.table, used-opened, ex.status, res.learned, res.failed)
		if id == "" || (ex.status == http.StatusAccepted) != tc.survives {
			t.Errorf("%s: alice's first request got %d; want it to survive: %v", tc.table, ex.status, tc.survives)
		}
	}
	families, _ := scrape(t)
	if n := metricValue(families, "caddy_mcp_sessions_evicted_total", map[string]string{"table": "capped", "reason": "client_cap"}); n < 10*maxSessions-20-1 {
		t.Errorf("client_cap evictions in the capped table: %v; want the flood's own, about %d", n, 10*maxSessions-20)
	}
}

// TestClientCapDefaultKey: with max_unconfirmed_per_client 100 and the
// default client_key, one client flooding 2,000 initialize requests keeps
// 100 unconfirmed sessions (the other 1,900 are pushed out, its own
// oldest first), while two other clients that open a session during the
// flood keep theirs until they use it: alice, from another address, and
// bob, who comes through the same proxy as the flood (in the server's
// trusted_proxies) with his own X-Forwarded-For. The default names the
// client by the IP address Caddy's server determines, honouring
// trusted_proxies: by the connection's address ({http.request.remote.host})
// bob and the flood would be one client, and bob's session pushed out.
// The old default, {http.request.client_ip}, is no placeholder: every
// client was the client "", which is not capped, and 2,000 of 2,000 were
// kept.
func TestClientCapDefaultKey(t *testing.T) {
	const (
		table     = "capdefault"
		limit     = 100
		floodSize = 2000
		gateway   = "127.0.0.4" // a proxy in front of Caddy, in trusted_proxies
	)
	servers := startBackends(t, 1, true)
	fl := startFloodServer(t)
	port := mustFreePort()
	global := strings.Replace(globalOptions(), "protocols h1 h2c", "protocols h1 h2c\n\t\ttrusted_proxies static "+gateway+"/32", 1)
	loadCaddyfile(t, global+siteBlock(port, fmt.Sprintf("mcp_proxy /mcp %s {\n\t\ttable %s\n\t\tmax_unconfirmed_per_client %d\n\t}\n\tmcp_proxy /flood %s {\n\t\ttable %s\n\t}",
		upstreams(servers), table, limit, fl.Addr(), table)))
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	url := "http://" + addr + "/mcp"
	evictedBefore := clientCapEvictions(t, table)

	var answered atomic.Int64
	done := make(chan *floodResult)
	go func() {
		done <- floodFrom(gateway, addr, "/flood", floodSize, 4, "X-Forwarded-For: 198.51.100.7\r\n", &answered)
	}()
	for answered.Load() < floodSize/2 {
		time.Sleep(5 * time.Millisecond)
	}
	alice, bob := clientFrom("127.0.0.3"), clientFrom(gateway)
	defer alice.CloseIdleConnections()
	defer bob.CloseIdleConnections()
	bobHeader := http.Header{"X-Forwarded-For": {"198.51.100.8"}}
	aliceID, bobID := openUnused(alice, url, nil), openUnused(bob, url, bobHeader)
	res := <-done
	st := tableOf(t, table)
	evicted := clientCapEvictions(t, table) - evictedBefore
	t.Logf("flood of %d from behind the gateway: %d learned, %d failed (%v); table holds %d sessions, %v pushed out by the client cap",
		floodSize, res.learned, res.failed, res.firstErr.Load(), st.Sessions, evicted)
	if res.learned != floodSize {
		t.Fatalf("the flood got %d sessions of %d: it did not flood", res.learned, floodSize)
	}
	if st.Sessions != limit+2 || int(evicted) != floodSize-limit {
		t.Errorf("after the flood the table holds %d sessions, %v pushed out by the client cap; want %d (the flood's %d, alice's and bob's) and %d",
			st.Sessions, evicted, limit+2, limit, floodSize-limit)
	}
	for _, c := range []struct {
		who string
		hc  *http.Client
		id  string
		hdr http.Header
	}{{"alice", alice, aliceID, nil}, {"bob", bob, bobID, bobHeader}} {
		hdr := mcpPOSTHeaders(c.id)
		for k, v := range c.hdr {
			hdr[k] = v
		}
		ex := send(t, c.hc, http.MethodPost, url, hdr, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		if c.id == "" || ex.status != http.StatusAccepted {
			t.Errorf("%s's session %q, opened during the flood, at its first use after it: %d %s; want 202", c.who, c.id, ex.status, ex.body)
		}
	}
}
