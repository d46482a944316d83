package tests

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// TestReclaimFreesCappedServer: a server capped at N sessions, as the
// Python SDK 2.2 is (503 on initialize past N, no reaper, DELETE frees a
// slot), filled by N sessions that their clients abandon. With a short
// session_ttl the proxy forgets them and DELETEs them upstream, so the
// next N initializes succeed without a restart. The control, same run: an
// identical server behind a proxy with reclaim off stays full, and its
// next initialize gets 503. The servers: the go-sdk whoami server with
// -max-sessions, and the repository's Python app under gunicorn with
// MCP_MAX_SESSIONS.
func TestReclaimFreesCappedServer(t *testing.T) {
	const capN = 5
	t.Run("go-sdk", func(t *testing.T) {
		servers := startBackendsWith(t, 2, false, func(string) []string { return []string{"-max-sessions", fmt.Sprint(capN)} })
		hc := newHTTPClient()
		defer hc.CloseIdleConnections()
		reclaimAfterTTL(t, hc, "reclaim-ttl-go", servers[0].Addr(), servers[1].Addr(), capN)
		st := capz(t, hc, servers[0].Addr())
		if got := deleteCounts(st); len(st.Deletes) != capN || got[1] != capN {
			t.Errorf("DELETEs per session at the server %v over %d sessions; want %d sessions DELETEd once", got, len(st.Deletes), capN)
		}
		if st := capz(t, hc, servers[1].Addr()); st.Live != capN || len(st.Deletes) != 0 {
			t.Errorf("reclaim off: the server holds %d sessions and got %d DELETEs; want %d and none", st.Live, len(st.Deletes), capN)
		}
	})
	t.Run("gunicorn", func(t *testing.T) {
		peer := findGunicorn(t)
		gs := startGunicornsWith(t, peer, []string{"gcap1", "gcap2"}, 1, "", func(string) []string { return []string{fmt.Sprint("MCP_MAX_SESSIONS=", capN)} })
		hc := newHTTPClient()
		defer hc.CloseIdleConnections()
		reclaimAfterTTL(t, hc, "reclaim-ttl-py", gs[0].Addr(), gs[1].Addr(), capN)
	})
}

// TestReclaimOncePerSessionAcrossReplicas: three Caddy replicas on one
// Redis, every one of them holding every session. Sessions that expire
// (session_ttl 2s), and sessions an operator evicts through one replica's
// admin API, each get exactly one DELETE at the server: from the replica
// whose write ended the session in Redis. The control, same run: sealed
// session IDs without a store, where each replica forgets on its own,
// get a DELETE from every replica that held the session.
func TestReclaimOncePerSessionAcrossReplicas(t *testing.T) {
	const n = 6
	f := startReclaimFleet(t)
	shared := openEverywhere(t, f, "reclaim-shared", n)
	openEverywhere(t, f, "reclaim-sealed", n)
	for _, id := range shared[:2] {
		if st, err := adminDoAt(f.rs[1].admin, http.MethodPost, "/mcp_sessions/evict", map[string]string{"table": "reclaim-shared", "session_id": id}, nil); st != http.StatusOK {
			t.Fatalf("admin evict: %d %v", st, err)
		}
	}

	waitCapLive(t, f.hc, f.srv[0].Addr(), 0)
	if !waitFor(20*time.Second, func() bool {
		return metricSum(t, f.rs, "caddy_mcp_reclaim_sent_total", map[string]string{"table": "reclaim-sealed"}) >= 3*n
	}) {
		t.Fatalf("the control: %v reclaim DELETEs sent for sealed sessions, want %d", metricSum(t, f.rs, "caddy_mcp_reclaim_sent_total", map[string]string{"table": "reclaim-sealed"}), 3*n)
	}
	time.Sleep(2 * time.Second) // a replica that would DELETE a shared session again has had its sweep
	st := capz(t, f.hc, f.srv[0].Addr())
	if got := deleteCounts(st); len(st.Deletes) != n || got[1] != n {
		t.Errorf("redis store: DELETEs per session %v (sessions: number of them), over %d sessions; want %d sessions with exactly 1", got, len(st.Deletes), n)
	}
	ctl := capz(t, f.hc, f.srv[1].Addr())
	if got := deleteCounts(ctl); got[3] != n || ctl.Live != 0 {
		t.Errorf("the control, sealed IDs without a store: DELETEs per session %v, live %d; want every one of %d sessions DELETEd by all 3 replicas", got, ctl.Live, n)
	}
	sent := metricSum(t, f.rs, "caddy_mcp_reclaim_sent_total", map[string]string{"table": "reclaim-shared"})
	ok := metricSum(t, f.rs, "caddy_mcp_reclaim_results_total", map[string]string{"table": "reclaim-shared", "result": "ok"})
	if sent != n || ok != n {
		t.Errorf("redis store: the replicas sent %v DELETEs, %v answered 2xx; want %d and %d", sent, ok, n, n)
	}
}

// TestFullServerTakesSessionsAgain: one of three upstreams is full (a
// go-sdk server capped at 3 sessions, answering initialize 503 past them,
// as the Python SDK 2.2 does). 100 new sessions through mcp_proxy all open
// on the other two (the control, same run: stock round_robin hands the
// 503 to some); then an operator evicts the full server's sessions through
// the admin API, the proxy DELETEs each of them there once, and the server
// takes new sessions again, without a restart. The control for that: the
// same with reclaim off, where the server stays full and never gets a
// session again.
func TestFullServerTakesSessionsAgain(t *testing.T) {
	const n = 100
	on := runFullServer(t, "reclaim-full-on", "on", n)
	if on.opened != n || on.failed != 0 || on.onFull != 0 {
		t.Errorf("mcp_proxy with one upstream full: %d/%d opened, %d failed, %d on the full one; want all opened elsewhere", on.opened, n, on.failed, on.onFull)
	}
	if on.stockFailed == 0 {
		t.Errorf("the control, stock round_robin: no initialize failed; want some 503s from the full server")
	}
	if on.deletes[1] != 3 || len(on.deletes) != 1 || !on.tookAgain {
		t.Errorf("after evicting its sessions: DELETEs per session %v, took a new session %v; want 3 sessions DELETEd once, and new sessions there", on.deletes, on.tookAgain)
	}
	off := runFullServer(t, "reclaim-full-off", "off", n)
	if len(off.deletes) != 0 || off.liveAfter != 3 || off.tookAgain {
		t.Errorf("the control, reclaim off: DELETEs %v, %d live, took a new session %v; want none, 3, false", off.deletes, off.liveAfter, off.tookAgain)
	}
	t.Logf("mcp_proxy %d/%d new sessions opened with one upstream full; stock round_robin %d/%d", on.opened, n, n-on.stockFailed, n)
}

// TestReclaimPushedOutSessions: a table of max_sessions 3. Three sessions
// in use, then two new ones: the first new one pushes out the least
// recently used session in use (lru), the second pushes out the first new
// one, never used (unconfirmed). Both are DELETEd upstream, once, and no
// other. The control, same run: the same with reclaim off, no DELETE.
func TestReclaimPushedOutSessions(t *testing.T) {
	servers := startBackendsWith(t, 2, false, func(string) []string { return []string{"-max-sessions", "100"} })
	site := func(i int, reclaim string) string {
		return fmt.Sprintf("mcp_proxy %s {\n\t\ttable reclaim-push-%s\n\t\tmax_sessions 3\n\t\treclaim %s\n\t}", servers[i].Addr(), reclaim, reclaim)
	}
	ps := startProxies(t, site(0, "on"), site(1, "off"))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	var want [2][]string // per proxy: the sessions pushed out
	for i, p := range ps {
		var used []string
		for range 3 {
			used = append(used, mcpInitialize(t, hc, p.url()))
		}
		for _, id := range used {
			if status, _ := rawWhoami(t, hc, p.url(), id); status != http.StatusOK {
				t.Fatalf("whoami: %d", status)
			}
		}
		fresh := mcpPost(t, hc, p.url(), "", initBody).header.Get("Mcp-Session-Id")
		mcpPost(t, hc, p.url(), "", initBody)
		want[i] = []string{used[0], fresh}
	}
	table := "reclaim-push-on"
	waitEvicted(t, table, "lru", 1)
	waitEvicted(t, table, "unconfirmed", 1)
	if !testproc.Until(10*time.Second, func() bool { _, ok, _, _ := reclaimCounts(t, table); return ok >= 2 }) {
		t.Fatal("the pushed-out sessions were not DELETEd in 10 s")
	}
	st := capz(t, hc, servers[0].Addr())
	if len(st.Deletes) != 2 || st.Deletes[want[0][0]] != 1 || st.Deletes[want[0][1]] != 1 || st.Live != 3 {
		t.Errorf("DELETEs at the server %v, %d live; want one each for the pushed-out %v, 3 live", st.Deletes, st.Live, want[0])
	}
	waitEvicted(t, "reclaim-push-off", "unconfirmed", 1)
	if st := capz(t, hc, servers[1].Addr()); len(st.Deletes) != 0 || st.Live != 5 {
		t.Errorf("the control, reclaim off: DELETEs %v, %d live; want none, 5", st.Deletes, st.Live)
	}
}

// TestReclaimAfterFailover: a session that failed over (failover
// reinitialize) to another upstream, then evicted through the admin API,
// is DELETEd on its new upstream under the ID that upstream gave it; the
// client's ID, which the new upstream never issued, gets no DELETE there
// (what a proxy that sent the client's ID would do).
func TestReclaimAfterFailover(t *testing.T) {
	servers := startBackendsWith(t, 2, false, func(string) []string { return []string{"-max-sessions", "100"} })
	p := startProxy(t, failoverSite(upstreams(servers), "reclaim-failover", true))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	id := mcpInitialize(t, hc, p.url())
	status, first := rawWhoami(t, hc, p.url(), id)
	if status != http.StatusOK {
		t.Fatalf("whoami: %d", status)
	}
	dead, alive := servers[0], servers[1]
	if first.Server != dead.Name() {
		dead, alive = alive, dead
	}
	dead.Kill()
	waitClosesRead(t, dead.Addr())
	status, moved := rawWhoami(t, hc, p.url(), id)
	if status != http.StatusOK || moved.Server != alive.Name() || moved.Session == id {
		t.Fatalf("after the kill: %d from %s as %q; want 200 from %s under a new upstream ID", status, moved.Server, moved.Session, alive.Name())
	}
	if st, err := adminDo(http.MethodPost, "/mcp_sessions/evict", map[string]string{"table": "reclaim-failover", "session_id": id}, nil); st != http.StatusOK {
		t.Fatalf("admin evict: %d %v", st, err)
	}
	st := waitCapLive(t, hc, alive.Addr(), 0)
	if st.Deletes[moved.Session] != 1 || st.Deletes[id] != 0 {
		t.Errorf("DELETEs at the new upstream %v; want one of its own ID %s, none of the client's %s", st.Deletes, moved.Session, id)
	}
}

// TestReclaimEvictedUpstream: an operator evicts every session of one
// upstream through the admin API (POST /mcp_sessions/evict with
// "upstream"). Each of its sessions gets exactly one DELETE at that
// server; the other upstream's sessions get none and keep working; a
// session learned on the evicted upstream right after the eviction works
// through every proxy and gets no DELETE. The control, same run: the same
// with reclaim off, where the server gets no DELETE and still holds every
// session the proxy forgot. Run on three Caddy replicas sharing one Redis,
// each holding every session, the eviction sent to the second replica;
// and on one Caddy without a store.
func TestReclaimEvictedUpstream(t *testing.T) {
	const n = 8
	capped := func(string) []string { return []string{"-max-sessions", "1000"} }
	t.Run("three replicas on one Redis", func(t *testing.T) {
		srv := startBackendsWith(t, 4, false, capped)
		global := func(f *fleet) string {
			store := redisStore(f.redis.Addr, sharedTimeout)
			return fmt.Sprintf("mcp_sessions evict-on {\n\t\t%s\n\t}\n\tmcp_sessions evict-off {\n\t\t%s\n\t}\n\t%s", store, store, storeLog)
		}
		body := func(*fleet) string { return evictRoutes(srv, "evict-on", "evict-off") }
		f := newFleet(t, withRedis(), withServersOf(srv), withReplicas(3, "c", global, body))
		urls := func(table string) []string {
			out := make([]string, len(f.rs))
			for i, r := range f.rs {
				out[i] = tableURL(r, table)
			}
			return out
		}
		on := evictUpstreamRun(t, f.hc, urls("evict-on"), f.rs[1].admin, "evict-on", srv[0], srv[1], n)
		off := evictUpstreamRun(t, f.hc, urls("evict-off"), f.rs[1].admin, "evict-off", srv[2], srv[3], n)
		if on.evictedHere != len(on.evicted) || off.evictedHere != len(off.evicted) {
			t.Errorf("the admin API evicted %d and %d sessions; want %d and %d", on.evictedHere, off.evictedHere, len(on.evicted), len(off.evicted))
		}
		waitCapLive(t, f.hc, srv[0].Addr(), 1)
		time.Sleep(2 * time.Second) // a replica that would DELETE a session again, or with reclaim off, has flushed and synced
		checkUpstreamEviction(t, f.hc, urls("evict-on"), on, srv[0], srv[1], true)
		checkUpstreamEviction(t, f.hc, urls("evict-off"), off, srv[2], srv[3], false)
		sent := metricSum(t, f.rs, "caddy_mcp_reclaim_sent_total", map[string]string{"table": "evict-on"})
		ok := metricSum(t, f.rs, "caddy_mcp_reclaim_results_total", map[string]string{"table": "evict-on", "result": "ok"})
		if sent != float64(len(on.evicted)) || ok != sent {
			t.Errorf("the replicas sent %v DELETEs, %v answered 2xx; want %d", sent, ok, len(on.evicted))
		}
		if sent := metricSum(t, f.rs, "caddy_mcp_reclaim_sent_total", map[string]string{"table": "evict-off"}); sent != 0 {
			t.Errorf("reclaim off: the replicas sent %v DELETEs", sent)
		}
		t.Logf("3 replicas: %d sessions of the evicted upstream, %v DELETEs (%v answered 2xx); %d of the other kept; reclaim off: %d sessions, 0 DELETEs",
			len(on.evicted), sent, ok, len(on.kept), len(off.evicted))
	})
	t.Run("one Caddy, no store", func(t *testing.T) {
		srv := startBackendsWith(t, 4, false, capped)
		p := startProxy(t, evictRoutes(srv, "evict-local-on", "evict-local-off"))
		hc := newHTTPClient()
		defer hc.CloseIdleConnections()
		url := func(table string) []string { return []string{"http://" + p.addr + "/" + table + "/mcp"} }
		sent0, ok0, _, _ := reclaimCounts(t, "evict-local-on") // the in-process Caddy keeps a table's counts across runs
		off0, _, _, _ := reclaimCounts(t, "evict-local-off")
		on := evictUpstreamRun(t, hc, url("evict-local-on"), adminAddr, "evict-local-on", srv[0], srv[1], n)
		off := evictUpstreamRun(t, hc, url("evict-local-off"), adminAddr, "evict-local-off", srv[2], srv[3], n)
		if on.evictedHere != len(on.evicted) || off.evictedHere != len(off.evicted) {
			t.Errorf("the admin API evicted %d and %d sessions; want %d and %d", on.evictedHere, off.evictedHere, len(on.evicted), len(off.evicted))
		}
		waitCapLive(t, hc, srv[0].Addr(), 1)
		checkUpstreamEviction(t, hc, url("evict-local-on"), on, srv[0], srv[1], true)
		checkUpstreamEviction(t, hc, url("evict-local-off"), off, srv[2], srv[3], false)
		sent, ok, _, _ := reclaimCounts(t, "evict-local-on")
		sent, ok = sent-sent0, ok-ok0
		if sent != float64(len(on.evicted)) || ok != sent {
			t.Errorf("the proxy sent %v DELETEs, %v answered 2xx; want %d", sent, ok, len(on.evicted))
		}
		if sent, _, _, _ := reclaimCounts(t, "evict-local-off"); sent != off0 {
			t.Errorf("reclaim off: the proxy sent %v DELETEs", sent-off0)
		}
		t.Logf("1 Caddy: %d sessions of the evicted upstream, %v DELETEs (%v answered 2xx); %d of the other kept; reclaim off: %d sessions, 0 DELETEs",
			len(on.evicted), sent, ok, len(on.kept), len(off.evicted))
	})
}
