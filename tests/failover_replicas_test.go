package tests

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// foTables are the tables of a foFleet and their mcp_proxy options.
var foTables = []struct{ name, options string }{
	{"fo", "failover reinitialize"},
	{"nofo", "failover off"},
	{"sealedfo", "failover reinitialize\n\t\t\tseal_session_ids {env.FO_SEAL_KEY}"},
}

// TestFailoverReplicas: three Caddy replicas sharing Redis, over three
// go-sdk servers, each request of every client to the next replica (round
// robin). Per table, 30 go-sdk sessions call whoami while one server is
// killed, and 12 raw sessions then reopen their GET stream with their old
// ID and call, never re-initializing. With failover reinitialize, plain or
// sealed IDs, every session survives on every replica: each session of the
// killed server moves once, to one new upstream session that every replica
// then uses, and calls failed <= calls in flight at the kill. Without
// failover (negative control, same fleet and run), the sessions of the
// killed server are lost. Then two or three replicas meeting a dead
// upstream with the same session at once converge on one new upstream
// session.
func TestFailoverReplicas(t *testing.T) {
	t.Parallel()
	f := startFailoverFleet(t)
	t.Run("killed upstream under load", func(t *testing.T) { testFailoverReplicasKill(t, f) })
	t.Run("replicas failing a session over at once", func(t *testing.T) { testFailoverReplicasConverge(t, f) })
}

func testFailoverReplicasKill(t *testing.T, f *fleet) {
	const n, raw = 30, 12
	url := func(table string) string { return tableURL(f.rs[0], table) }
	lbs, vs := map[string]*balancer{}, map[string][]*session{}
	for _, tb := range foTables {
		lbs[tb.name] = newRoundRobin(f.rs...)
		vs[tb.name] = openRawSessions(t, lbs[tb.name].client(), url(tb.name), raw, rawPlain)
	}
	runs := map[string][]*session{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	ready, kill := make(chan struct{}, len(foTables)), make(chan struct{})
	for _, tb := range foTables {
		wg.Go(func() {
			ss := foRunWith(t, url(tb.name), lbs[tb.name].client(), n, 3*time.Second, func() { ready <- struct{}{}; <-kill })
			mu.Lock()
			runs[tb.name] = ss
			mu.Unlock()
		})
	}
	for range foTables {
		<-ready
	}
	killed := time.Now()
	f.srv[1].Kill()
	<-f.srv[1].Done()
	waitClosesRead(t, f.srv[1].Addr()) // else a call may go out on a kept-alive connection to it: 502, not a failover
	dead := time.Now()
	close(kill)
	wg.Wait()
	dn := f.srv[1].Name()
	for _, tb := range foTables {
		for _, v := range vs[tb.name] {
			v.resume(t, lbs[tb.name].client(), 3, url(tb.name))
		}
		s := summarizeFailover(runs[tb.name], dn, killed, dead)
		onDead, deadOK, others, othersOK := vsSummary(vs[tb.name], dn)
		moved, followed := f.failoversAt(t, tb.name, "moved"), f.failoversAt(t, tb.name, "followed")
		split := splitSessions(runs[tb.name])
		if tb.name == "sealedfo" { // the creator sees the upstream ID inside the client's sealed one
			s.inconsistent = split
		}
		t.Logf("table %s (%s), 3 replicas round robin: go-sdk clients: %s", tb.name, strings.ReplaceAll(tb.options, "\n\t\t\t", ", "), s)
		t.Logf("table %s: raw clients reopening GET then POSTing: %d/%d sessions of the killed server ok, %d/%d others ok; "+
			"failovers on all replicas: moved %d, followed another replica's move %d; answers 5xx (requests in flight at the kill) %d",
			tb.name, deadOK, onDead, othersOK, others, moved, followed, len(lbs[tb.name].serverErrors()))
		if tb.name == "nofo" {
			if s.onDead == 0 || s.lostOnDead != s.onDead || onDead == 0 || deadOK != 0 || othersOK != others {
				t.Errorf("negative control: want every session of the killed server lost without failover, the others ok")
			}
			continue
		}
		if s.connErrs != 0 || s.onDead == 0 || s.movedOK != s.onDead || s.lost != 0 || s.othersOK != n-s.onDead ||
			s.inconsistent != 0 || split != 0 || s.failedCalls > s.inFlight {
			t.Errorf("table %s: want every go-sdk session of the killed server moved to one new upstream session and working, none lost, failed calls <= in flight", tb.name)
		}
		if onDead == 0 || deadOK != onDead || othersOK != others {
			t.Errorf("table %s: want every raw session ok on every replica", tb.name)
		}
		if moved != s.onDead+onDead {
			t.Errorf("table %s: %d failovers moved a session, want one per session of the killed server: %d", tb.name, moved, s.onDead+onDead)
		}
	}
}

// testFailoverReplicasConverge: sessions whose calls went through every
// replica lose their server; then one call of each goes to every replica
// at the same moment. Every call is answered, by one server under one
// session ID, the same for every replica, and the next calls through each
// replica reach it too: the replicas that lost the compare-and-set follow
// the winner's move.
func testFailoverReplicasConverge(t *testing.T, f *fleet) {
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	victim := f.srv[0]
	tables := []string{"fo", "sealedfo"}
	ids := map[string][]string{}
	before := map[string][2]int{}
	for _, table := range tables {
		for len(ids[table]) < 4 {
			id := mcpInitialize(t, hc, tableURL(f.rs[len(ids[table])%3], table))
			if _, who := rawWhoami(t, hc, tableURL(f.rs[0], table), id); who.Server == victim.Name() {
				ids[table] = append(ids[table], id)
			}
		}
		for _, id := range ids[table] { // every replica holds the session on the victim
			for _, r := range f.rs {
				if st, who := rawWhoami(t, hc, tableURL(r, table), id); st != http.StatusOK || who.Server != victim.Name() {
					t.Fatalf("table %s: before the kill, %s answered %d from %q", table, r.name, st, who.Server)
				}
			}
		}
		before[table] = [2]int{f.failoversAt(t, table, "moved"), f.failoversAt(t, table, "followed")}
	}
	victim.Kill()
	<-victim.Done()
	waitClosesRead(t, victim.Addr())
	for _, table := range tables {
		agreed := 0
		for _, id := range ids[table] {
			if atOnce(t, hc, f, table, id, victim.Name()) {
				agreed++
			}
		}
		moved, followed := f.failoversAt(t, table, "moved")-before[table][0], f.failoversAt(t, table, "followed")-before[table][1]
		t.Logf("table %s: %d sessions on the killed %s, each called through 3 replicas at once: %d answered by one live server under one session ID on every replica; "+
			"failovers: moved %d, followed another replica's move %d", table, len(ids[table]), victim.Name(), agreed, moved, followed)
		if agreed != len(ids[table]) || moved != len(ids[table]) {
			t.Errorf("table %s: want every session answered alike on every replica, and moved exactly once", table)
		}
	}
}

// TestFailoverReplicasRedisDown: with Redis down, a session whose server
// is killed still fails over, on each replica on its own: every call is
// answered 200 by a live server, none 5xx, and the replicas count the
// store errors of the moves (op move). Without failover (negative control,
// same fleet), the sessions of the killed server get 404.
func TestFailoverReplicasRedisDown(t *testing.T) {
	t.Parallel()
	f := startFailoverFleet(t)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	victim := f.srv[0]
	ids := map[string][]string{}
	for _, table := range []string{"fo", "nofo"} {
		for len(ids[table]) < 3 {
			id := mcpInitialize(t, hc, tableURL(f.rs[0], table))
			if _, who := rawWhoami(t, hc, tableURL(f.rs[1], table), id); who.Server == victim.Name() {
				ids[table] = append(ids[table], id)
			}
		}
	}
	f.redis.Stop()
	victim.Kill()
	<-victim.Done()
	// A call sent at once can go out on a kept-alive connection whose close
	// the proxy has not read. If the transport reads the close before the
	// call was sent on it ("server closed idle connection"), the session
	// fails over (TestUpstreamGoneClosedUnread); if only after, it reads as
	// EOF after the write, like a server that read the call and died, and
	// gets 502 as an in-flight call does (TestFailoverKilledUpstream counts
	// those). This test is about Redis being down: its calls start once the
	// crash is a crash, every replica having read the close.
	waitClosesRead(t, victim.Addr())
	statuses := map[string][]int{}
	servedBy := map[string]bool{}
	for table, list := range ids {
		for _, id := range list {
			for _, r := range f.rs[:2] {
				st, who := rawWhoami(t, hc, tableURL(r, table), id)
				statuses[table] = append(statuses[table], st)
				if table == "fo" {
					servedBy[who.Server] = true
				}
			}
		}
	}
	moveErrs := metricSum(t, f.rs, "caddy_mcp_store_errors_total", map[string]string{"table": "fo", "op": "move"})
	t.Logf("Redis down, %s killed: failover reinitialize answered %v (servers %v); without failover (negative control) %v; store errors op=move on the replicas: %.0f",
		victim.Name(), statuses["fo"], servedBy, statuses["nofo"], moveErrs)
	for _, st := range statuses["fo"] {
		if st != http.StatusOK {
			t.Fatalf("with failover and Redis down: want every call answered 200, got %v", statuses["fo"])
		}
	}
	for _, st := range statuses["nofo"] {
		if st != http.StatusNotFound {
			t.Fatalf("negative control: want 404 for the killed server's sessions without failover, got %v", statuses["nofo"])
		}
	}
	if servedBy[victim.Name()] || moveErrs < 1 {
		t.Fatalf("want no call answered by the killed server and the moves' store errors counted; got servers %v, %.0f errors", servedBy, moveErrs)
	}
}
