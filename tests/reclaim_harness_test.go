package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	whoamisrv "github.com/caddy-mcp-affinity/caddy-mcp-affinity/examples/whoami"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// capz returns what a whoami server started with -max-sessions counts:
// its live sessions and the DELETEs of each session ID.
func capz(t testing.TB, hc *http.Client, addr string) whoamisrv.CapStats {
	t.Helper()
	resp, err := hc.Get("http://" + addr + "/capz")
	if err != nil {
		t.Fatalf("GET /capz of %s: %v", addr, err)
	}
	defer resp.Body.Close()
	var st whoamisrv.CapStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("GET /capz of %s: %v", addr, err)
	}
	return st
}

// waitCapLive waits until the capped server at addr holds live sessions,
// and returns what it counts then; it fails t after 15 s.
func waitCapLive(t testing.TB, hc *http.Client, addr string, live int) whoamisrv.CapStats {
	t.Helper()
	var st whoamisrv.CapStats
	if !testproc.Until(15*time.Second, func() bool { st = capz(t, hc, addr); return st.Live == live }) {
		t.Fatalf("%s holds %d live sessions, want %d", addr, st.Live, live)
	}
	return st
}

// initStatuses sends n initializes through url, each opening a session
// it never uses again, and returns their statuses by count.
func initStatuses(t testing.TB, hc *http.Client, url string, n int) map[int]int {
	t.Helper()
	got := map[int]int{}
	for range n {
		got[mcpPost(t, hc, url, "", initBody).status]++
	}
	return got
}

// waitEvicted waits until table has evicted at least n sessions for
// reason, as the in-process Caddy's metrics say; it fails t after 15 s.
func waitEvicted(t testing.TB, table, reason string, n int) {
	t.Helper()
	labels := map[string]string{"table": table, "reason": reason}
	var got float64
	if !testproc.Until(15*time.Second, func() bool {
		fams, _ := scrape(t)
		got = metricValue(fams, "caddy_mcp_sessions_evicted_total", labels)
		return got >= float64(n)
	}) {
		t.Fatalf("table %s evicted %v sessions for %s, want %d", table, got, reason, n)
	}
}

// reclaimCounts returns the reclaim counters of table in the in-process
// Caddy: DELETEs sent, and their results ok, not_found and failed.
func reclaimCounts(t testing.TB, table string) (sent, ok, notFound, failed float64) {
	t.Helper()
	fams, _ := scrape(t)
	res := func(r string) float64 {
		return metricValue(fams, "caddy_mcp_reclaim_results_total", map[string]string{"table": table, "result": r})
	}
	return metricValue(fams, "caddy_mcp_reclaim_sent_total", map[string]string{"table": table}), res("ok"), res("not_found"), res("failed")
}

// startReclaimFleet starts two go-sdk servers with a session cap (and
// /capz), a Redis, and three Caddy replicas whose site routes
// /reclaim-shared/mcp through the redis store, with a 2 s session_ttl, to
// the first server, and /reclaim-sealed/mcp through sealed session IDs
// without a store, with the same TTL, to the second: there every replica
// that adopted a session forgets it on its own (the negative control).
func startReclaimFleet(t *testing.T) *fleet {
	srv := startBackendsWith(t, 2, false, func(string) []string { return []string{"-max-sessions", "1000"} })
	global := func(f *fleet) string {
		return fmt.Sprintf("mcp_sessions reclaim-shared {\n\t\tsession_ttl 2s\n\t\t%s\n\t}\n\t%s", redisStore(f.redis.Addr, sharedTimeout), storeLog)
	}
	body := func(f *fleet) string {
		return fmt.Sprintf("handle_path /reclaim-shared/* {\n\t\tmcp_proxy %s {\n\t\t\ttable reclaim-shared\n\t\t}\n\t}\n\t"+
			"handle_path /reclaim-sealed/* {\n\t\tmcp_proxy %s {\n\t\t\ttable reclaim-sealed\n\t\t\tsession_ttl 2s\n\t\t\tseal_session_ids {env.RECLAIM_SEAL_KEY}\n\t\t}\n\t}\n\t",
			srv[0].Addr(), srv[1].Addr())
	}
	return newFleet(t, withRedis(), withServersOf(srv), withReplicas(3, "c", global, body, "RECLAIM_SEAL_KEY="+newSealKey(t)))
}

// openEverywhere opens n raw sessions of table, each through the next
// replica in turn, and calls whoami in each through every replica, so
// that every replica holds every session; it returns the client's IDs.
func openEverywhere(t *testing.T, f *fleet, table string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = mcpInitialize(t, f.hc, tableURL(f.rs[i%len(f.rs)], table))
		for _, r := range f.rs {
			if status, _ := rawWhoami(t, f.hc, tableURL(r, table), ids[i]); status != http.StatusOK {
				t.Fatalf("whoami of a %s session through %s: %d", table, r.name, status)
			}
		}
	}
	return ids
}

// deleteCounts returns how many sessions of st got each number of DELETEs.
func deleteCounts(st whoamisrv.CapStats) map[int]int {
	out := map[int]int{}
	for _, n := range st.Deletes {
		out[n]++
	}
	return out
}

// reclaimAfterTTL checks reclaim after session_ttl on two servers capped
// at capN sessions: on, behind mcp_proxy with table <prefix>-on, and off,
// behind one with reclaim off (table <prefix>-off), both with session_ttl
// 1s. Each is filled through its proxy (capN initializes answered 200, the
// next 503); once the tables forgot the sessions, on takes capN new ones,
// each of the forgotten sessions got a DELETE answered 2xx, and off still
// answers 503 with no DELETE sent.
func reclaimAfterTTL(t *testing.T, hc *http.Client, prefix, on, off string, capN int) {
	t.Helper()
	site := func(addr, table, reclaim string) string {
		return fmt.Sprintf("mcp_proxy %s {\n\t\ttable %s\n\t\tsession_ttl 1s\n\t\treclaim %s\n\t}", addr, table, reclaim)
	}
	ps := startProxies(t, site(on, prefix+"-on", "on"), site(off, prefix+"-off", "off"))
	for i, p := range ps {
		if got := initStatuses(t, hc, p.url(), capN+1); got[http.StatusOK] != capN || got[http.StatusServiceUnavailable] != 1 {
			t.Fatalf("filling %s: statuses %v; want %d×200 then 503", []string{on, off}[i], got, capN)
		}
	}
	waitEvicted(t, prefix+"-on", "ttl", capN)
	waitEvicted(t, prefix+"-off", "ttl", capN)
	if !testproc.Until(15*time.Second, func() bool { _, ok, _, _ := reclaimCounts(t, prefix+"-on"); return ok >= float64(capN) }) {
		sent, ok, nf, failed := reclaimCounts(t, prefix+"-on")
		t.Fatalf("reclaim: sent %v, ok %v, not_found %v, failed %v; want %d answered 2xx", sent, ok, nf, failed, capN)
	}
	if got := initStatuses(t, hc, ps[0].url(), capN); got[http.StatusOK] != capN {
		t.Errorf("reclaim on: the next %d initializes got %v; want all 200", capN, got)
	}
	if sent, ok, _, failed := reclaimCounts(t, prefix+"-on"); sent != float64(capN) || ok != float64(capN) || failed != 0 {
		t.Errorf("reclaim metrics: sent %v, ok %v, failed %v; want %d sent and answered 2xx", sent, ok, failed, capN)
	}
	if got := initStatuses(t, hc, ps[1].url(), 1); got[http.StatusServiceUnavailable] != 1 {
		t.Errorf("reclaim off: the next initialize got %v; want 503", got)
	}
	if sent, _, _, _ := reclaimCounts(t, prefix+"-off"); sent != 0 {
		t.Errorf("reclaim off: %v DELETEs sent", sent)
	}
}

// fullServer is one run of the full-server scenario (see
// TestFullServerTakesSessionsAgain).
type fullServer struct {
	opened, failed int // of the new sessions, while the capped server was full
	onFull         int // new sessions that landed on the capped server while it was full
	stockFailed    int // initializes stock round_robin failed, over the same servers
	deletes        map[int]int
	liveAfter      int  // sessions the capped server holds after the evictions
	tookAgain      bool // a new session landed on it after the evictions
}

// runFullServer starts three whoami servers, the third capped at 3
// sessions, behind mcp_proxy (table, with reclaim) and stock round_robin;
// fills the capped one through the proxy, opens n new sessions through
// each, evicts the capped server's sessions through the admin API, and
// then opens sessions until one lands on the capped server, for at most
// 10 s.
func runFullServer(t *testing.T, table, reclaim string, n int) fullServer {
	t.Helper()
	servers := refusalFleet(t, "-max-sessions", "3")
	full := servers[2]
	ps := startProxies(t, fmt.Sprintf("mcp_proxy %s {\n\t\ttable %s\n\t\treclaim %s\n\t}", upstreams(servers), table, reclaim), stockRoundRobin(servers))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	before, failed := openRaw(t, hc, ps[0].url(), 9)
	pinned := before[full.Name()]
	if len(pinned) != 3 || len(failed) != 0 {
		t.Fatalf("filling %s through the proxy: %v, failed %v; want 3 on it", full.Name(), before, failed)
	}
	var r fullServer
	got, failedNew := openRaw(t, hc, ps[0].url(), n)
	r.failed, r.onFull = len(failedNew), len(got[full.Name()])
	for _, ids := range got {
		r.opened += len(ids)
	}
	for range n {
		if mcpPost(t, hc, ps[1].url(), "", initBody).status != http.StatusOK {
			r.stockFailed++
		}
	}
	for _, id := range pinned {
		if st, err := adminDo(http.MethodPost, "/mcp_sessions/evict", map[string]string{"table": table, "session_id": id}, nil); st != http.StatusOK {
			t.Fatalf("admin evict: %d %v", st, err)
		}
	}
	if reclaim == "on" {
		waitCapLive(t, hc, full.Addr(), 0)
	}
	r.tookAgain = testproc.Until(10*time.Second, func() bool {
		got, _ := openRaw(t, hc, ps[0].url(), 1)
		return len(got[full.Name()]) == 1
	})
	st := capz(t, hc, full.Addr())
	r.deletes, r.liveAfter = deleteCounts(st), st.Live
	return r
}
