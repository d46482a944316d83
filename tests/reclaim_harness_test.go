package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
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

// upstreamEviction is one run of the upstream-eviction scenario (see
// TestReclaimEvictedUpstream) on one table: the sessions it opened on the
// evicted upstream and on the other, and the one learned on the evicted
// upstream after the eviction.
type upstreamEviction struct {
	evicted, kept []string
	after         string
	evictedHere   int // what the admin API answered: the sessions the evicting Caddy held
}

// evictUpstreamRun opens sessions through urls[0] in turn with urls[1:]
// (one URL per Caddy, the same table behind each), each initialized
// through the next URL and called through every one, until at least n
// are on gone and one on the other server; evicts gone's sessions through
// the admin API at admin; and then opens sessions through the last URL
// until one lands on gone again, which it calls through every URL.
func evictUpstreamRun(t *testing.T, hc *http.Client, urls []string, admin, table string, gone, other *testproc.Proc, n int) upstreamEviction {
	t.Helper()
	var r upstreamEviction
	for i := 0; len(r.evicted) < n || len(r.kept) == 0; i++ {
		if i == 4*n {
			t.Fatalf("%s: %d sessions on %s and %d on %s after %d initializes", table, len(r.evicted), gone.Name(), len(r.kept), other.Name(), i)
		}
		id, server := openCalledEverywhere(t, hc, urls, i%len(urls))
		if server == gone.Name() {
			r.evicted = append(r.evicted, id)
		} else {
			r.kept = append(r.kept, id)
		}
	}
	var ev caddymodule.UpstreamEviction
	if st, err := adminDoAt(admin, http.MethodPost, "/mcp_sessions/evict", map[string]string{"table": table, "upstream": gone.Addr()}, &ev); st != http.StatusOK {
		t.Fatalf("admin evict of %s: %d %v", gone.Addr(), st, err)
	}
	r.evictedHere = ev.EvictedSessions
	for i := 0; r.after == ""; i++ {
		if i == 20 {
			t.Fatalf("%s: no new session on %s after the eviction in 20 initializes", table, gone.Name())
		}
		id, server := openCalledEverywhere(t, hc, urls, len(urls)-1)
		if server == gone.Name() {
			r.after = id
		} else {
			r.kept = append(r.kept, id)
		}
	}
	return r
}

// openCalledEverywhere opens a raw session through urls[first] and calls
// whoami in it through every URL, so that every Caddy holds it; it returns
// the session's ID and the server that answered.
func openCalledEverywhere(t *testing.T, hc *http.Client, urls []string, first int) (id, server string) {
	t.Helper()
	id = mcpInitialize(t, hc, urls[first])
	for _, u := range urls {
		status, who := rawWhoami(t, hc, u, id)
		if status != http.StatusOK || (server != "" && who.Server != server) {
			t.Fatalf("whoami of a new session through %s: %d from %q, first answered by %q", u, status, who.Server, server)
		}
		server = who.Server
	}
	return id, server
}

// callStatuses calls whoami in each of ids through each of urls and
// returns the statuses by count, and the calls a server other than want
// answered.
func callStatuses(t *testing.T, hc *http.Client, urls, ids []string, want string) (statuses map[int]int, misrouted int) {
	t.Helper()
	statuses = map[int]int{}
	for _, id := range ids {
		for _, u := range urls {
			status, who := rawWhoami(t, hc, u, id)
			statuses[status]++
			if status == http.StatusOK && who.Server != want {
				misrouted++
			}
		}
	}
	return statuses, misrouted
}

// evictRoutes is a site body routing /<on>/mcp to an mcp_proxy over the
// first two of srv with table on, and /<off>/mcp to one over the other two
// with table off and reclaim off.
func evictRoutes(srv []*testproc.Proc, on, off string) string {
	return fmt.Sprintf("handle_path /%s/* {\n\t\tmcp_proxy %s %s {\n\t\t\ttable %s\n\t\t}\n\t}\n\t"+
		"handle_path /%s/* {\n\t\tmcp_proxy %s %s {\n\t\t\ttable %s\n\t\t\treclaim off\n\t\t}\n\t}\n\t",
		on, srv[0].Addr(), srv[1].Addr(), on, off, srv[2].Addr(), srv[3].Addr(), off)
}

// checkUpstreamEviction checks one run of evictUpstreamRun through urls,
// once the evicted server's DELETEs had their time: with reclaim, each
// session of gone got exactly one DELETE there and the server holds only
// the one learned after the eviction; without, it got none and holds them
// all. Either way the other server got no DELETE and holds its sessions,
// which answer through every URL, from their server, as the session
// learned after the eviction does; the evicted ones get the proxy's 404.
func checkUpstreamEviction(t *testing.T, hc *http.Client, urls []string, r upstreamEviction, gone, other *testproc.Proc, reclaim bool) {
	t.Helper()
	st := capz(t, hc, gone.Addr())
	if reclaim {
		once := 0
		for _, id := range r.evicted {
			if st.Deletes[id] == 1 {
				once++
			}
		}
		if once != len(r.evicted) || len(st.Deletes) != len(r.evicted) || st.Live != 1 {
			t.Errorf("%s: %d of its %d evicted sessions DELETEd exactly once, DELETEs per session %v, %d live; want all once, no other, 1 live (the one learned after)",
				gone.Name(), once, len(r.evicted), deleteCounts(st), st.Live)
		}
	} else if len(st.Deletes) != 0 || st.Live != len(r.evicted)+1 {
		t.Errorf("reclaim off: %s got DELETEs %v and holds %d; want none, %d", gone.Name(), deleteCounts(st), st.Live, len(r.evicted)+1)
	}
	if st := capz(t, hc, other.Addr()); len(st.Deletes) != 0 || st.Live != len(r.kept) {
		t.Errorf("the other upstream %s got DELETEs %v and holds %d; want none, %d", other.Name(), deleteCounts(st), st.Live, len(r.kept))
	}
	if got, mis := callStatuses(t, hc, urls, r.kept, other.Name()); got[http.StatusOK] != len(r.kept)*len(urls) || mis != 0 {
		t.Errorf("the other upstream's %d sessions through %d proxies: statuses %v, %d misrouted; want all 200 from %s", len(r.kept), len(urls), got, mis, other.Name())
	}
	if got, mis := callStatuses(t, hc, urls, []string{r.after}, gone.Name()); got[http.StatusOK] != len(urls) || mis != 0 {
		t.Errorf("the session learned on %s after the eviction: statuses %v, %d misrouted; want 200 from it through every proxy", gone.Name(), got, mis)
	}
	if got, _ := callStatuses(t, hc, urls, r.evicted, ""); got[http.StatusNotFound] != len(r.evicted)*len(urls) {
		t.Errorf("the evicted sessions: statuses %v; want 404 through every proxy", got)
	}
	if st := capz(t, hc, gone.Addr()); reclaim && len(st.Deletes) != len(r.evicted) {
		t.Errorf("%s: DELETEs of %d sessions after the calls; want %d", gone.Name(), len(st.Deletes), len(r.evicted))
	}
}
