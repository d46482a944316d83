package tests

import (
	"net/http"
	"testing"
	"time"
)

// Sessions that ended stay ended (README, "Ending a session"): with
// `failover reinitialize`, a session the client ended with DELETE, one
// that expired, or one whose sealed ID is older than failover_max_age is
// never brought back as a fresh upstream session, neither on the replica
// that saw it end nor, with the redis store, on any other.

// revokeTables are the tables of TestEndedSessionsStayEnded, each with
// failover reinitialize: sealed IDs without a store; sealed IDs and plain
// IDs with the redis store; sealed IDs with a 2 s session_ttl (and a long
// failover_max_age, so that only the expiry counts), without and with the
// store; sealed IDs with a 3 s failover_max_age.
var revokeTables = []revokeTable{
	{name: "sealed", sealed: true},
	{name: "shared", sealed: true, shared: true},
	{name: "plain", shared: true},
	{name: "idle", settings: "session_ttl 2s\n\t\tfailover_max_age 1h", sealed: true},
	{name: "idleshared", settings: "session_ttl 2s\n\t\tfailover_max_age 1h", sealed: true, shared: true},
	{name: "young", settings: "failover_max_age 3s", sealed: true},
}

// TestEndedSessionsStayEnded: two Caddy replicas (separate processes), three
// go-sdk servers, a Redis; raw sessions opened through the first replica.
//
//   - (a) A session the client DELETEs (go-sdk answers 204) gets 404 on the
//     replica that saw the DELETE, whether its server is alive (which
//     answers it 404: no failover on that 404) or killed (no failover to
//     another server); with the redis store, on the other replica too.
//     Without a store, the other replica cannot know the session ended:
//     its answer is reported, not checked (README).
//   - (b) A session idle past session_ttl gets 404 once its server is
//     killed, on the replica whose table expired it and, with the store,
//     on both.
//   - (c) A sealed ID older than failover_max_age gets 404 once its server
//     is killed, on both replicas, the one that never saw it included.
//
// Negative controls, same run and tables: sessions of the killed server
// that were neither ended, idle, nor too old fail over on both replicas
// with 200. The replicas count the refusals
// (caddy_mcp_failovers_total{result="refused"}), and the Redis holds the
// tombstones of the DELETEd sessions.
func TestEndedSessionsStayEnded(t *testing.T) {
	t.Parallel()
	f := startRevokeFleet(t, revokeTables)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	victim, survivor := f.srv[0].Name(), f.srv[1].Name()
	var checks []revokeCheck
	check := func(table, what, id string, want ...int) {
		checks = append(checks, revokeCheck{table, what, id, want})
	}

	// (a) DELETE, then the old ID: of a server that stays, at once; of
	// the server killed below, after the kill.
	var deleted []revokeCheck
	for _, table := range []string{"sealed", "shared", "plain"} {
		del, delAlive := f.sessionOn(t, hc, table, victim), f.sessionOn(t, hc, table, survivor)
		check(table, "live session of the killed server (control)", f.sessionOn(t, hc, table, victim), 200, 200)
		for _, id := range []string{del, delAlive} {
			if st := endSession(t, hc, tableURL(f.rs[0], table), id); st != http.StatusNoContent {
				t.Fatalf("table %s: DELETE through the first replica: %d, want 204 from go-sdk", table, st)
			}
		}
		other := map[string]int{"sealed": 0, "shared": 404, "plain": 404}[table]
		deleted = append(deleted, revokeCheck{table, "DELETEd, its server alive", delAlive, []int{404, other}})
		check(table, "DELETEd, its server killed", del, 404, other)
	}
	for _, c := range deleted { // before any kill: no failover but on the upstream's 404
		got := f.statusesVia(t, hc, c.table, c.id)
		t.Logf("table %s: %s: %v through the replica that saw the DELETE, the other", c.table, c.what, got)
		if !statusesMatch(got, c.want) {
			t.Errorf("table %s: %s: %v, want %v (0: not checked)", c.table, c.what, got, c.want)
		}
	}

	// (b) Idle past session_ttl (2 s; the store keeps it a touch interval,
	// 1 s, longer), beside sessions in use; (c) sealed IDs aging past
	// failover_max_age (3 s).
	idle := map[string]string{}
	for _, table := range []string{"idle", "idleshared"} {
		idle[table] = f.sessionOn(t, hc, table, victim)
	}
	old := f.sessionOn(t, hc, "young", victim)
	busy := map[string]string{"idle": f.sessionOn(t, hc, "idle", victim), "idleshared": f.sessionOn(t, hc, "idleshared", victim)}
	stop := make(chan struct{})
	busyBad := map[string]<-chan []int{}
	for table, id := range busy {
		busyBad[table] = f.keepUsing(hc, table, []string{id}, 300*time.Millisecond, stop)
	}
	time.Sleep(4500 * time.Millisecond)
	fresh := f.sessionOn(t, hc, "young", victim)
	close(stop)
	for table, ch := range busyBad {
		if bad := <-ch; len(bad) != 0 {
			t.Fatalf("table %s: a session in use got %v while another idled", table, bad)
		}
	}
	check("idle", "idle past session_ttl", idle["idle"], 404, 0)
	check("idleshared", "idle past session_ttl", idle["idleshared"], 404, 404)
	check("idle", "in use (control)", busy["idle"], 200, 200)
	check("idleshared", "in use (control)", busy["idleshared"], 200, 200)
	checks = append([]revokeCheck{
		{"young", "sealed ID younger than failover_max_age (control)", fresh, []int{200, 200}},
		{"young", "sealed ID older than failover_max_age", old, []int{404, 404}},
	}, checks...) // first after the kill: fresh must stay young

	f.srv[0].Kill()
	<-f.srv[0].Done()
	waitClosesRead(t, f.srv[0].Addr()) // see TestFailoverReplicasRedisDown: the kill is a crash by now
	for _, c := range checks {
		got := f.statusesVia(t, hc, c.table, c.id)
		t.Logf("table %s, %s killed: %s: %v through the first replica, the second", c.table, victim, c.what, got)
		if !statusesMatch(got, c.want) {
			t.Errorf("table %s: %s: %v, want %v (0: not checked)", c.table, c.what, got, c.want)
		}
	}

	refused := map[string]int{}
	for _, tb := range revokeTables {
		refused[tb.name] = refusedFailovers(t, f.rs[0], tb.name) + refusedFailovers(t, f.rs[1], tb.name)
	}
	tombs := tombstonesIn(f.redis)
	t.Logf("failovers refused, both replicas, by table: %v; tombstones in Redis: %d", refused, tombs)
	if refused["young"] < 2 || refused["idle"] < 1 || refused["idleshared"] < 2 {
		t.Errorf("want the refused failovers of the sessions that expired or aged counted (a DELETEd session is not adopted, so nothing is refused): %v", refused)
	}
	if tombs < 4 {
		t.Errorf("Redis holds %d tombstones; want one per session DELETEd through the shared tables (4)", tombs)
	}
}
