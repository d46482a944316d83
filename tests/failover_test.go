package tests

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestFailoverKilledUpstream: through a proxy with `failover reinitialize`
// and one without, over the same three go-sdk servers, 60 go-sdk client
// sessions each call tools while one server is killed (SIGKILL), and 15 raw
// sessions each then reopen their GET stream with their old ID and call
// tools, never re-initializing. With failover every session survives: those
// of the killed server carry on with another server, which sees a session
// ID of its own while the client keeps its ID, and calls failed <= calls
// in flight at the kill. Without failover (negative control, same run) the
// sessions of the killed server are lost.
func TestFailoverKilledUpstream(t *testing.T) {
	killUnderLoad(t, startBackends(t, 3, false), "go")
}

// TestFailoverKilledUpstreamTS is TestFailoverKilledUpstream over three
// TypeScript SDK servers.
func TestFailoverKilledUpstreamTS(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk")
	killUnderLoad(t, startTSServers(t, env, 3, "ts"), "ts")
}

// TestReinitializeStaleSession: a client that re-initializes still
// carrying its old Mcp-Session-Id, of a session the proxy does not hold or
// whose upstream was killed, gets a new session, pinned to the upstream
// that created it, with failover off and on; a tools/call carrying the same
// stale IDs still gets the proxy's 404 (negative control), and the old
// session ends.
func TestReinitializeStaleSession(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("failover=%v", on), func(t *testing.T) {
			srv := startBackends(t, 2, true)
			p := startProxy(t, failoverSite(upstreams(srv), fmt.Sprintf("stale%v", on), on))
			hc := newHTTPClient()
			defer hc.CloseIdleConnections()
			url := p.url()

			status, id, who := reinitWith(t, hc, url, "NOSUCHSESSION0123456789")
			t.Logf("initialize carrying an unknown session ID: %d, new session on %s", status, who.Server)
			if status != http.StatusOK || id == "NOSUCHSESSION0123456789" || who.Session != id {
				t.Fatalf("initialize with an unknown session ID: status %d, new ID %q, whoami %+v; want 200 and a new session pinned to its creator", status, id, who)
			}
			if st, _ := rawWhoami(t, hc, url, "NOSUCHSESSION0123456789"); st != http.StatusNotFound {
				t.Fatalf("negative control: tools/call with the unknown ID got %d, want 404", st)
			}

			old := mcpInitialize(t, hc, url)
			_, owner := rawWhoami(t, hc, url, old)
			victim := srv[0]
			if owner.Server != victim.Name() {
				victim = srv[1]
			}
			victim.Kill()
			<-victim.Done()
			waitClosesRead(t, victim.Addr()) // else a request may go out on a kept-alive connection to it: 502
			if !on {                         // with failover, this call would move the session
				if st, _ := rawWhoami(t, hc, url, old); st != http.StatusNotFound {
					t.Fatalf("negative control: tools/call of the killed server's session got %d, want 404", st)
				}
			}
			status, id, who = reinitWith(t, hc, url, old)
			t.Logf("initialize carrying the ID of a session of the killed %s: %d, new session on %s", victim.Name(), status, who.Server)
			if status != http.StatusOK || id == old || who.Session != id || who.Server == victim.Name() {
				t.Fatalf("initialize with a stale ID: status %d, new ID %q (old %q), whoami %+v; want 200, a new ID, pinned to a live server", status, id, old, who)
			}
			for range 3 {
				if st, w := rawWhoami(t, hc, url, id); st != http.StatusOK || w != who {
					t.Fatalf("the new session is not pinned: %d %+v, want %+v", st, w, who)
				}
			}
			if st, _ := rawWhoami(t, hc, url, old); st != http.StatusNotFound {
				t.Fatalf("the old session, given up by the client's initialize, answered %d, want 404", st)
			}
		})
	}
}

// TestFailoverDrainDeadline: an upstream drained with a deadline keeps its
// sessions until the deadline; past it, with failover reinitialize, each
// session moves to another upstream on its next request, so the drain is
// done (live_sessions 0) and the upstream can be stopped with no session
// lost. Without failover (negative control, same run), the deadline moves
// nothing and stopping the upstream loses its sessions.
func TestFailoverDrainDeadline(t *testing.T) {
	srv := startBackends(t, 3, true)
	ps := startProxies(t, failoverSite(upstreams(srv), "dd", true), failoverSite(upstreams(srv), "ddoff", false))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	const n = 12
	css := map[string][]*mcp.ClientSession{}
	for i, table := range []string{"dd", "ddoff"} {
		for range n {
			cs, err := connectReconnecting(ctx, ps[i].url(), hc)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cs.Close() })
			css[table] = append(css[table], cs)
		}
	}
	victim := srv[0]
	before := map[string][]identity{}
	for _, table := range []string{"dd", "ddoff"} {
		before[table], _ = whoamiAll(ctx, css[table])
		st := drainDeadline(t, table, victim.Addr(), "1s")
		if !st.Draining || st.DrainDeadline == "" {
			t.Fatalf("drain with a deadline: answer %+v, want draining and a drain_deadline", st)
		}
	}
	onVictim := func(ids []identity) (n int) {
		for _, id := range ids {
			if id.Server == victim.Name() {
				n++
			}
		}
		return n
	}
	k := onVictim(before["dd"])
	within, _ := whoamiAll(ctx, css["dd"])
	if k == 0 || onVictim(within) != k {
		t.Fatalf("within the deadline: %d sessions answered by the drained %s, want the %d it had (and more than 0)", onVictim(within), victim.Name(), k)
	}
	time.Sleep(1200 * time.Millisecond)
	past, failed, took := timedWhoamiAll(ctx, css["dd"])
	live := mustUpstream(t, "dd", victim.Addr()).LiveSessions
	t.Logf("failover reinitialize, past the deadline: %d of %d sessions on %s moved (%d calls failed), live_sessions %d", k-onVictim(past), k, victim.Name(), failed, live)
	t.Logf("median call that failed its session over: %v; median call pinned as usual, in the same loop: %v",
		medianOn(took, within, victim.Name(), true), medianOn(took, within, victim.Name(), false))
	if onVictim(past) != 0 || failed != 0 || live != 0 {
		t.Fatalf("past the deadline: %d sessions still on %s, %d calls failed, live_sessions %d; want 0, 0, 0", onVictim(past), victim.Name(), failed, live)
	}
	offPast, _ := whoamiAll(ctx, css["ddoff"])
	koff := onVictim(before["ddoff"])
	victim.Stop(10 * time.Second)
	after, failedAfter := whoamiAll(ctx, css["dd"])
	_, failedOff := whoamiAll(ctx, css["ddoff"])
	t.Logf("after stopping %s: with failover %d of %d calls failed; without (negative control): %d of its %d sessions stayed past the deadline, %d of %d calls failed",
		victim.Name(), failedAfter, n, onVictim(offPast), koff, failedOff, n)
	if failedAfter != 0 || onVictim(after) != 0 {
		t.Fatalf("with failover, after the stop: %d calls failed, %d on %s; want 0", failedAfter, onVictim(after), victim.Name())
	}
	if koff == 0 || onVictim(offPast) != koff || failedOff < koff {
		t.Fatalf("negative control: want the %d sessions of %s to stay past the deadline and fail after the stop; %d stayed, %d calls failed", koff, victim.Name(), onVictim(offPast), failedOff)
	}
	fam, _ := scrape(t)
	if moved := metricValue(fam, "caddy_mcp_failovers_total", map[string]string{"table": "dd", "cause": "drain_deadline", "result": "moved"}); int(moved) != k {
		t.Fatalf("caddy_mcp_failovers_total{cause=drain_deadline,result=moved} = %v, want %d", moved, k)
	}
}

// TestRollingDeployFailoverDeadline runs examples/rolling-deploy/rolling-deploy.sh
// with `--on-timeout failover --timeout 2` while 24 go-sdk sessions that
// never end call tools through a proxy with `failover reinitialize`. No
// drain could finish by sessions ending; with the deadline every upstream
// is replaced in bounded time, and no session is lost: each moves at its
// next request past its upstream's deadline.
func TestRollingDeployFailoverDeadline(t *testing.T) {
	rdRequireTools(t)
	const table, n, deadline = "rolling_failover", 24, 2
	f := newFleet(t, withScriptedServers("s1", "s2", "s3"))
	p := startProxy(t, failoverSite(strings.Join(f.ups, " "), table, true))
	var out string
	var code int
	var took time.Duration
	ss := foRun(t, p.url(), n, time.Second, func() {
		start := time.Now()
		out, code = runRollingDeploy(t, append([]string{
			"--admin", adminAddr, "--table", table, "--stop", f.stopCmd(), "--start", f.startCmd(),
			"--timeout", strconv.Itoa(deadline), "--on-timeout", "failover", "--poll", "0.1", "--port-timeout", "10",
		}, f.ups...)...)
		took = time.Since(start)
	})
	t.Logf("rolling-deploy.sh --on-timeout failover --timeout %d took %v, exit %d:\n%s", deadline, took.Round(time.Millisecond), code, out)
	if code != 0 {
		t.Fatalf("rolling-deploy.sh exited %d", code)
	}
	lost, failed, calls, moved, inconsistent := 0, 0, 0, 0, 0
	for _, s := range ss {
		calls += len(s.answered)
		failed += len(s.failed())
		if s.lost || s.connErr != nil {
			lost++
		}
		if s.servers() > 1 {
			moved++
		}
		if !s.consistent() {
			inconsistent++
		}
	}
	fam, _ := scrape(t)
	byDeadline := metricValue(fam, "caddy_mcp_failovers_total", map[string]string{"table": table, "cause": "drain_deadline", "result": "moved"})
	t.Logf("%d sessions: %d lost, %d moved to another server at least once (failovers at a drain deadline: %v), %d inconsistent; calls answered %d, failed %d",
		n, lost, moved, byDeadline, inconsistent, calls, failed)
	if lost != 0 || moved != n || inconsistent != 0 || byDeadline < n {
		t.Fatalf("want 0 sessions lost, all %d moved (by drain deadlines) with consistent IDs", n)
	}
	if limit := time.Duration(3*deadline+30) * time.Second; took > limit {
		t.Fatalf("the rolling deploy took %v, more than %v for 3 upstreams with a %ds deadline", took, limit, deadline)
	}
}

// TestFailoverSealed: with seal_session_ids and failover reinitialize, the
// sessions of a killed server move to another server while their clients
// keep their sealed ID, which the proxy gives back on every response (the
// new upstream's own ID never reaches the client); the sessions of the
// other servers are untouched. Over go-sdk servers, and TypeScript SDK
// servers, which repeat Mcp-Session-Id on every response; and the same
// over TypeScript SDK servers without sealing, where the proxy gives the
// client back its own plain ID.
func TestFailoverSealed(t *testing.T) {
	t.Setenv("FO_SEAL_KEY", newSealKey(t))
	env := tsNeedNode(t, "@modelcontextprotocol/sdk")
	for _, c := range []struct {
		name   string
		sealed bool
		start  func() []*testproc.Proc
	}{
		{"go-sdk, sealed", true, func() []*testproc.Proc { return startBackends(t, 3, true) }},
		{"typescript-sdk, sealed", true, func() []*testproc.Proc { return startTSServers(t, env, 3, "tsa") }},
		{"typescript-sdk, plain", false, func() []*testproc.Proc { return startTSServers(t, env, 3, "tsb") }},
	} {
		t.Run(c.name, func(t *testing.T) { failoverKeepsClientID(t, c.start(), c.sealed) })
	}
}

// TestFailoverUpstreamRemoved: a reload removes an upstream from the
// config; with failover reinitialize, the raw sessions it owned move to
// the remaining upstreams on their next request (cause upstream_gone), and
// the others stay where they were.
func TestFailoverUpstreamRemoved(t *testing.T) {
	srv := startBackends(t, 3, true)
	port := mustFreePort()
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	loadCaddyfile(t, siteConfig(port, failoverSite(upstreams(srv), "removed", true)))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	vs := openRawSessions(t, hc, url, 12, rawPlain)
	loadCaddyfile(t, siteConfig(port, failoverSite(upstreams(srv[1:]), "removed", true)))
	hc.CloseIdleConnections()
	for _, v := range vs {
		v.resume(t, hc, 3, url)
	}
	onGone, goneOK, others, othersOK := vsSummary(vs, srv[0].Name())
	fam, _ := scrape(t)
	moved := metricValue(fam, "caddy_mcp_failovers_total", map[string]string{"table": "removed", "cause": "upstream_gone", "result": "moved"})
	t.Logf("%s removed from the config: %d/%d of its sessions moved and ok, %d/%d others ok; failovers{cause=upstream_gone,result=moved} %v",
		srv[0].Name(), goneOK, onGone, othersOK, others, moved)
	if onGone == 0 || goneOK != onGone || othersOK != others || int(moved) != onGone {
		t.Fatal("want every session of the removed upstream moved (cause upstream_gone) and the others untouched")
	}
}

// TestFailoverRestartedUpstream: a server is restarted at its address (a
// redeploy, a crash and a supervisor's restart) and forgets its sessions.
// Raw sessions that opened their GET stream, then reopen it with their old
// ID and call tools, never re-initializing (the VS Code behaviour), get 200
// to the GET and every call through a proxy with failover reinitialize:
// the restarted server's 404 to the GET is held back and the session fails
// over (cause upstream_404). Through a proxy without failover (negative
// control, same servers) the GET gets the 404 and every call after it too.
func TestFailoverRestartedUpstream(t *testing.T) {
	srv := startBackends(t, 2, true)
	ps := startProxies(t, failoverSite(upstreams(srv), "restartfo", true), failoverSite(upstreams(srv), "restartnofo", false))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	vs := [][]*session{openRawSessions(t, hc, ps[0].url(), 10, rawPlain), openRawSessions(t, hc, ps[1].url(), 10, rawPlain)}
	for i, p := range ps {
		for _, v := range vs[i] {
			if st := reopenGET(t, hc, p.url(), v.id); st != http.StatusOK {
				t.Fatalf("GET stream of session %s before the restart: %d", v.id, st)
			}
		}
	}
	srv[0].Kill()
	<-srv[0].Done()
	addr := srv[0].Addr()
	waitClosesRead(t, addr) // before a new server takes the address: a kept-alive connection to the old one gets 502
	again := launch(t, "s1-restarted", addr, exec.Command(whoamiBin, "-name", "s1-restarted", "-listen", addr, "-json"))
	ready(t, whoamiTimeout, []*testproc.Proc{again}, testproc.Listening())
	for i, p := range ps {
		for _, v := range vs[i] {
			v.resume(t, hc, 3, p.url())
		}
	}
	onDead, deadOK, others, othersOK := vsSummary(vs[0], srv[0].Name())
	offDead, offDeadOK, offOthers, offOthersOK := vsSummary(vs[1], srv[0].Name())
	fam, _ := scrape(t)
	moved := metricValue(fam, "caddy_mcp_failovers_total", map[string]string{"table": "restartfo", "cause": "upstream_404", "result": "moved"})
	t.Logf("s1 restarted at %s: with failover %d/%d of its sessions ok (GET then 3 calls), %d/%d others ok, failovers{cause=upstream_404,result=moved} %v; "+
		"without failover (negative control) %d/%d ok, %d/%d others ok", addr, deadOK, onDead, othersOK, others, moved, offDeadOK, offDead, offOthersOK, offOthers)
	if onDead == 0 || deadOK != onDead || othersOK != others || int(moved) != onDead {
		t.Errorf("with failover: want every session of the restarted server ok, moved on the 404 to its GET, and the others untouched")
	}
	if offDead == 0 || offDeadOK != 0 || offOthersOK != offOthers {
		t.Errorf("negative control: want every session of the restarted server broken without failover, the others ok")
	}
	for _, v := range vs[1] {
		if v.creator == srv[0].Name() && (v.get != http.StatusNotFound || slices.ContainsFunc(v.statuses(), func(st int) bool { return st != http.StatusNotFound })) {
			t.Errorf("negative control: session %s got GET %d and calls %v; want 404 to each", v.id, v.get, v.statuses())
		}
	}
}

// TestFailoverWithOthersPassiveDown: with failover reinitialize, the
// session's upstream A is killed while both other upstreams are out of
// service by passive health checks alone, as in a fast rolling restart
// where an upstream just restarted still counts the failures of its
// restart: B is down with 4 failures, C is up with 5, and A has 1 to 3
// once the session's request has refused (reverse_proxy dials it 1 +
// lb_retries times). The session moves to C and its call is answered
// there: never back to A, which the fewest failures alone would pick (and
// did: it refused again and the failover gave up, "no other upstream took
// the session over"), and past B, which refuses on the way. With
// lb_retries 0 too, where reverse_proxy sends the replay once: it is sent
// again while an upstream is left to try.
func TestFailoverWithOthersPassiveDown(t *testing.T) {
	for _, tc := range []struct{ name, options string }{{"lb_retries_2", ""}, {"lb_retries_0", "\n\t\tlb_retries 0"}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startBackends(t, 3, false)
			table := "fo-passive-" + tc.name
			// A second site whose reverse_proxy counts a failure against
			// the upstream for every request, answered or refused (and
			// keeps sending it requests): Caddy keeps one failure count
			// per upstream address.
			var poke []string
			for _, s := range srv {
				poke = append(poke, fmt.Sprintf("handle /poke/%s {\n\t\treverse_proxy %s {\n\t\t\tfail_duration 5m\n\t\t\tmax_fails 100\n\t\t\tunhealthy_status 2xx 3xx 4xx 5xx\n\t\t}\n\t}", s.Name(), s.Addr()))
			}
			ps := startProxies(t, fmt.Sprintf("mcp_proxy %s {\n\t\ttable %s\n\t\tfailover reinitialize%s\n\t}", upstreams(srv), table, tc.options), strings.Join(poke, "\n\t"))
			hc := newHTTPClient()
			defer hc.CloseIdleConnections()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cs := sessionOn(ctx, t, ps[0].url(), hc, srv[0].Name())
			defer cs.Close()
			movedBefore, failedBefore := failoversOf(t, table)

			srv[1].Kill()
			<-srv[1].Done()
			waitClosesRead(t, srv[1].Addr())
			for i, n := range map[int]int{1: 4, 2: 5} {
				for range n {
					send(t, hc, http.MethodGet, "http://"+ps[1].addr+"/poke/"+srv[i].Name(), nil, "")
				}
			}
			if f1, f2 := caddyFails(t, srv[1].Addr()), caddyFails(t, srv[2].Addr()); f1 != 4 || f2 != 5 {
				t.Fatalf("setup: Caddy counts %d failures against %s and %d against %s; want 4 and 5", f1, srv[1].Name(), f2, srv[2].Name())
			}
			srv[0].Kill()
			<-srv[0].Done()
			// Else the call can go out on a kept-alive connection whose close
			// the proxy has not read: EOF after the write, 502 as for a call in
			// flight (see TestFailoverReplicasRedisDown).
			waitClosesRead(t, srv[0].Addr())

			id, err := whoami(ctx, cs)
			moved, failed := failoversOf(t, table)
			moved, failed = moved-movedBefore, failed-failedBefore
			f0, f1, f2 := caddyFails(t, srv[0].Addr()), caddyFails(t, srv[1].Addr()), caddyFails(t, srv[2].Addr())
			t.Logf("call after %s was killed: %+v, %v; failovers moved %v, failed %v; failures counted: %s %d, %s %d, %s %d",
				srv[0].Name(), id, err, moved, failed, srv[0].Name(), f0, srv[1].Name(), f1, srv[2].Name(), f2)
			if err != nil || id.Server != srv[2].Name() {
				t.Errorf("the session's call after its upstream was killed: %+v, %v; want it answered by %s, the only live upstream", id, err, srv[2].Name())
			}
			if moved != 1 || failed != 0 {
				t.Errorf("caddy_mcp_failovers_total{cause=refused}: moved %v, failed %v; want 1 and 0", moved, failed)
			}
			if f0 < 1 || f0 > 3 {
				t.Errorf("%s, the upstream left, has %d failures; want 1 to 3, the dials of the session's own request (1 + lb_retries): "+
					"fewer than the others' (so that the fewest failures alone would pick it), and none from the replay", srv[0].Name(), f0)
			}
		})
	}
}
