package tests

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestReclaimFreesCappedServer: a go-sdk server capped at N sessions, as
// the Python SDK 2.2 is (503 on initialize past N, no reaper, DELETE frees
// a slot), filled by N sessions that their clients abandon. With a short
// session_ttl the proxy forgets them and DELETEs them upstream, so the
// next N initializes succeed without a restart. The control, same run: an
// identical server behind a proxy with reclaim off stays full, and its
// next initialize gets 503.
func TestReclaimFreesCappedServer(t *testing.T) {
	const capN = 5
	servers := startBackendsWith(t, 2, false, func(string) []string { return []string{"-max-sessions", fmt.Sprint(capN)} })
	on, off := servers[0], servers[1]
	site := func(s interface{ Addr() string }, table, reclaim string) string {
		return fmt.Sprintf("mcp_proxy %s {\n\t\ttable %s\n\t\tsession_ttl 1s\n\t\treclaim %s\n\t}", s.Addr(), table, reclaim)
	}
	ps := startProxies(t, site(on, "reclaim-ttl-on", "on"), site(off, "reclaim-ttl-off", "off"))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	for i, p := range ps {
		if got := initStatuses(t, hc, p.url(), capN+1); got[http.StatusOK] != capN || got[http.StatusServiceUnavailable] != 1 {
			t.Fatalf("filling %s: statuses %v; want %d×200 then 503", servers[i].Name(), got, capN)
		}
	}
	waitEvicted(t, "reclaim-ttl-on", "ttl", capN)
	waitEvicted(t, "reclaim-ttl-off", "ttl", capN)
	st := waitCapLive(t, hc, on.Addr(), 0)
	for id, n := range st.Deletes {
		if n != 1 {
			t.Errorf("session %s got %d DELETEs, want 1", id, n)
		}
	}
	if len(st.Deletes) != capN {
		t.Errorf("%d sessions DELETEd upstream, want %d", len(st.Deletes), capN)
	}
	if got := initStatuses(t, hc, ps[0].url(), capN); got[http.StatusOK] != capN {
		t.Errorf("reclaim on: the next %d initializes got %v; want all 200", capN, got)
	}
	if sent, ok, _, failed := reclaimCounts(t, "reclaim-ttl-on"); sent < capN || ok < capN || failed != 0 {
		t.Errorf("reclaim metrics: sent %v, ok %v, failed %v; want %d sent and answered 2xx", sent, ok, failed, capN)
	}

	// The control: nothing freed the slots.
	if st := capz(t, hc, off.Addr()); st.Live != capN || len(st.Deletes) != 0 {
		t.Errorf("reclaim off: the server holds %d sessions and got %d DELETEs; want %d and none", st.Live, len(st.Deletes), capN)
	}
	if got := initStatuses(t, hc, ps[1].url(), 1); got[http.StatusServiceUnavailable] != 1 {
		t.Errorf("reclaim off: the next initialize got %v; want 503", got)
	}
	if sent, _, _, _ := reclaimCounts(t, "reclaim-ttl-off"); sent != 0 {
		t.Errorf("reclaim off: %v DELETEs sent", sent)
	}
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

	st := waitCapLive(t, f.hc, f.srv[0].Addr(), 0)
	if !waitFor(20*time.Second, func() bool {
		return metricSum(t, f.rs, "caddy_mcp_reclaim_sent_total", map[string]string{"table": "reclaim-sealed"}) >= 3*n
	}) {
		t.Fatalf("the control: %v reclaim DELETEs sent for sealed sessions, want %d", metricSum(t, f.rs, "caddy_mcp_reclaim_sent_total", map[string]string{"table": "reclaim-sealed"}), 3*n)
	}
	time.Sleep(2 * time.Second) // a replica that would DELETE a shared session again has had its sweep
	st = capz(t, f.hc, f.srv[0].Addr())
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
