package tests

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// Failover with sealed session IDs over Caddy replicas that share no store
// (docs/failover.md, "Several Caddy instances"): the sealed value carries
// the session's initialize, so every replica can fail a session over on
// its own, once.

// The raw sessions of these tests never re-initialize (the VS Code
// behaviour): they are learned on a fleet's first replica, then resume
// their GET stream and call through the replicas in turn (session.resume).

// TestFailoverSealedReplicas: two Caddy replicas (separate processes, no
// shared store) with the same key and `failover reinitialize`, in front of
// three go-sdk servers; every session is learned on the first replica and
// its later requests go to the replicas in turn. One server is killed
// while 30 go-sdk client sessions call tools, then 10 raw sessions that
// never re-initialize reopen their GET stream with their old ID through the
// second replica and call through both. Every session survives, on both
// replicas: each replica moves a session of the killed server once, on its
// own (so such a session ends up in one new upstream session per replica),
// and routes it from its table after that; calls failed <= calls in flight
// at the kill. The same fleet without failover (negative control, same
// run) breaks the killed server's sessions. Then a replica is stopped, a
// second server killed, and the replica started again with an empty
// table: it fails over, from the sealed value alone, the sessions whose
// server died while it was down. A sealed value without the initialize (the
// format before it, minted here with the key) still opens and routes, and
// cannot fail over: its gone upstream gets the proxy's 404, as before.
func TestFailoverSealedReplicas(t *testing.T) {
	srv := startBackends(t, 3, false)
	key := newSealKey(t)
	env := []string{"MCP_SESSION_KEY=" + key}
	fleets := []*fleet{startSealedFleet(t, "fo", srv, true, env), startSealedFleet(t, "nofo", srv, false, env)}
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	const n, raw, later = 30, 10, 8
	rawSs, laterSs := make([][]*session, 2), make([][]*session, 2)
	for i, f := range fleets {
		rawSs[i] = openRawSessions(t, hc, f.rs[0].url(), raw, rawPlain)
		laterSs[i] = openRawSessions(t, hc, f.rs[0].url(), later, rawPlain)
	}
	live := mcpInitialize(t, hc, srv[0].URL()) // for values of the format without the initialize
	doomed := mcpInitialize(t, hc, srv[2].URL())

	// One server killed under load.
	runs := make([][]*session, 2)
	ready, kill, done := make(chan struct{}, 2), make(chan struct{}), make(chan struct{}, 2)
	for i, f := range fleets {
		go func() {
			runs[i] = foRunWith(t, f.rs[0].url(), f.lb.client(), n, 3*time.Second, func() { ready <- struct{}{}; <-kill })
			done <- struct{}{}
		}()
	}
	<-ready
	<-ready
	for _, f := range fleets {
		f.lb.resetAnswered()
	}
	killed := time.Now()
	srv[1].Kill()
	<-srv[1].Done()
	waitClosesRead(t, srv[1].Addr()) // else a call may go out on a kept-alive connection to it: 502, not a failover
	deadAt := time.Now()
	close(kill)
	<-done
	<-done
	dead := map[string]bool{srv[1].Name(): true}
	for i, f := range fleets {
		for _, s := range rawSs[i] {
			s.resume(t, hc, 2, f.urls()...)
		}
	}

	son := summarizeSealedFailover(runs[0], fleets[0].lb, srv[1].Name(), killed, deadAt)
	soff := summarizeSealedFailover(runs[1], fleets[1].lb, srv[1].Name(), killed, deadAt)
	fiveXX := fleets[0].lb.serverErrors()
	t.Logf("go-sdk clients, 2 sealed replicas, failover reinitialize: %s; 5xx answers %d %q", son, len(fiveXX), fiveXX)
	t.Logf("go-sdk clients, 2 sealed replicas, failover off (negative control): %s", soff)
	if son.connErrs != 0 || son.onDead == 0 || son.deadOK != son.onDead || son.lost != 0 || son.othersOK != son.others ||
		son.failedCalls > son.inFlight || len(fiveXX) > son.inFlight {
		t.Errorf("with failover: want every session kept through both replicas, those of the killed server in at most one new upstream session per replica, failed calls and 5xx <= in flight; got %s", son)
	}
	if soff.onDead == 0 || soff.lostOnDead != soff.onDead || soff.othersOK != soff.others {
		t.Errorf("negative control: want every session of the killed server lost without failover, the others kept; got %s", soff)
	}
	ron, roff := summarizeSpread(rawSs[0], dead), summarizeSpread(rawSs[1], dead)
	t.Logf("raw clients (GET with the old ID through replica 2, then calls through both in turn), failover reinitialize: %d/%d sessions of the killed server ok, in %d upstream sessions; %d/%d others ok; "+
		"answers carrying the client's own Mcp-Session-Id %d, another %d", ron.deadOK, ron.onDead, ron.newSessions, ron.othersOK, ron.others, ron.echoed, ron.otherIDs)
	t.Logf("raw clients, failover off (negative control): %d/%d sessions of the killed server broken (404), %d/%d others ok", roff.deadBroken, roff.onDead, roff.othersOK, roff.others)
	if ron.onDead == 0 || ron.deadOK != ron.onDead || ron.newSessions != 2*ron.onDead || ron.othersOK != ron.others {
		t.Errorf("raw clients with failover: want every session ok, those of the killed server moved once on each replica (2 upstream sessions each); got %+v", ron)
	}
	if roff.onDead == 0 || roff.deadBroken != roff.onDead || roff.othersOK != roff.others {
		t.Errorf("raw clients without failover: want the killed server's sessions broken and the others ok; got %+v", roff)
	}
	for _, r := range fleets[0].rs {
		moved, failed := failoversAt(t, r.admin)
		t.Logf("%s: failovers moved %d, failed %d (sessions of the killed server: %d go-sdk, %d raw)", r.name, moved, failed, son.onDead, ron.onDead)
		if failed != 0 || moved != son.onDead+ron.onDead {
			t.Errorf("%s moved %d sessions and failed %d; want each session of the killed server moved once by each replica (both served each): %d, 0 failed",
				r.name, moved, failed, son.onDead+ron.onDead)
		}
	}

	// A replica restarted with an empty table, after a server died while it
	// was down. Its sessions were adopted by it before the stop.
	for i, f := range fleets {
		for _, s := range laterSs[i] {
			if status, _ := rawWhoami(t, hc, f.rs[1].url(), s.id); status != http.StatusOK && !dead[s.first.Server] {
				t.Fatalf("%s: a call of a session through the second replica before its stop: %d", f.name, status)
			}
		}
		f.rs[1].stop()
	}
	srv[2].Kill()
	<-srv[2].Done()
	waitClosesRead(t, srv[2].Addr())
	for _, f := range fleets {
		f.rs[1].start(t)
	}
	dead[srv[2].Name()] = true
	for i, f := range fleets {
		for _, s := range laterSs[i] {
			s.resume(t, hc, 2, f.rs[1].url())
		}
	}
	lon, loff := summarizeSpread(laterSs[0], dead), summarizeSpread(laterSs[1], dead)
	diedWhileDown := summarizeSpread(laterSs[0], map[string]bool{srv[2].Name(): true}).onDead
	t.Logf("the second replica restarted after %s died: with failover %d/%d sessions of dead servers ok (%d of them on %s), %d/%d others ok; without (negative control) %d/%d broken",
		srv[2].Name(), lon.deadOK, lon.onDead, diedWhileDown, srv[2].Name(), lon.othersOK, lon.others, loff.deadBroken, loff.onDead)
	if diedWhileDown == 0 || lon.deadOK != lon.onDead || lon.othersOK != lon.others || loff.deadBroken != loff.onDead {
		t.Errorf("restarted replica: want every session ok with failover (those of dead servers moved), those of dead servers broken without; got %+v and %+v", lon, loff)
	}

	// Values of the format without the initialize.
	sealer := sealerOf(t, key)
	for _, u := range fleets[0].urls() {
		status, who := rawWhoami(t, hc, u, sealer.Seal(srv[0].Addr(), live))
		gone := mcpPost(t, hc, u, sealer.Seal(srv[2].Addr(), doomed), tsWhoamiCall)
		t.Logf("a value without the initialize through %s: of a live session %d (answered by %s), of a dead server's session %d %s", u, status, who.Server, gone.status, gone.body)
		if status != http.StatusOK || who != (identity{srv[0].Name(), live}) {
			t.Errorf("a value without the initialize, of a live session, through %s: %d %+v; want it routed to %s", u, status, who, srv[0].Name())
		}
		if gone.status != http.StatusNotFound || !strings.Contains(gone.body, "upstream is gone") {
			t.Errorf("a value without the initialize, of a dead server's session, through %s: %d %s; want the proxy's upstream-gone 404", u, gone.status, gone.body)
		}
	}
}

// TestFailoverSealedReplicasTS: raw sessions that never re-initialize, over
// two sealed replicas with `failover reinitialize` in front of three
// TypeScript SDK servers, which repeat Mcp-Session-Id on every response.
// After one server is killed, every session works through both replicas,
// each replica moving each session of the killed server once, and every
// answer gives the client its own sealed value, never the new upstream
// session's ID.
func TestFailoverSealedReplicasTS(t *testing.T) {
	node := tsNeedNode(t, "@modelcontextprotocol/sdk")
	srv := startTSServers(t, node, 3, "tsr")
	f := startSealedFleet(t, "tsfo", srv, true, []string{"MCP_SESSION_KEY=" + newSealKey(t)})
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	ss := openRawSessions(t, hc, f.rs[0].url(), 12, rawPlain)
	srv[1].Kill()
	<-srv[1].Done()
	waitClosesRead(t, srv[1].Addr())
	for _, s := range ss {
		s.resume(t, hc, 2, f.urls()...)
	}
	r := summarizeSpread(ss, map[string]bool{srv[1].Name(): true})
	t.Logf("TypeScript SDK servers, %s killed: %d/%d of its sessions ok through both replicas, in %d upstream sessions; %d/%d others ok; "+
		"answers carrying the client's own Mcp-Session-Id %d, another %d", srv[1].Name(), r.deadOK, r.onDead, r.newSessions, r.othersOK, r.others, r.echoed, r.otherIDs)
	if r.onDead == 0 || r.deadOK != r.onDead || r.newSessions != 2*r.onDead || r.othersOK != r.others || r.echoed != 4*len(ss) || r.otherIDs != 0 {
		t.Fatal("want every session ok, those of the killed server moved once on each replica, and every answer carrying the client's own sealed value")
	}
	for _, rep := range f.rs {
		if moved, failed := failoversAt(t, rep.admin); moved != r.onDead || failed != 0 {
			t.Errorf("%s moved %d sessions, failed %d; want %d and 0", rep.name, moved, failed, r.onDead)
		}
	}
}
