package tests

import (
	"fmt"
	"net/http"
	"testing"
	"time"
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
