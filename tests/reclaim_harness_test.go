package tests

import (
	"encoding/json"
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
