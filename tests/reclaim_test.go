package tests

import (
	"fmt"
	"net/http"
	"testing"
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
