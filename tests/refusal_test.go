package tests

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestNoBlackHoleForRefusingUpstream: one of three upstreams refuses new
// sessions — a server at its session cap answering initialize 503 as the
// Python SDK 2.2 does, or one answering every initialize 500 — and 100 new
// sessions through mcp_proxy all open on the others: the refused initialize
// goes to another upstream, and the refusing one gets no new sessions for a
// while, visible in the admin API and the metrics, while the sessions it
// holds keep working. The control, same run: stock round_robin over the
// same servers hands the refusal to about a third of the clients. With no
// other upstream, the client gets the server's refusal itself, not a 502.
func TestNoBlackHoleForRefusingUpstream(t *testing.T) {
	const sessions = 100
	for _, tc := range []struct {
		name  string
		flags []string
		want  int // the refusal's status
		held  int // sessions the refusing server holds
	}{
		{"capped server answering 503", []string{"-max-sessions", "3"}, http.StatusServiceUnavailable, 3},
		{"server answering 500", []string{"-initialize-status", "500"}, http.StatusInternalServerError, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			servers := refusalFleet(t, tc.flags...)
			refusing := servers[2]
			table := "refusal-" + strings.Fields(tc.name)[1]
			ps := startProxies(t, fmt.Sprintf("mcp_proxy %s {\n\t\ttable %s\n\t}", upstreams(servers), table), stockRoundRobin(servers))
			hc := newHTTPClient()
			defer hc.CloseIdleConnections()

			// Fill the capped server first, through the proxy: its sessions
			// must keep working while it refuses new ones.
			var pinned []string
			if tc.held > 0 {
				before, failed := openRaw(t, hc, ps[0].url(), 3*tc.held)
				pinned = before[refusing.Name()]
				if len(pinned) != tc.held || len(failed) != 0 {
					t.Fatalf("filling %s through the proxy: %v, failed %v; want %d on it", refusing.Name(), before, failed, tc.held)
				}
			}
			got, failed := openRaw(t, hc, ps[0].url(), sessions)
			if len(failed) != 0 || len(got[refusing.Name()]) != 0 || len(got[servers[0].Name()])+len(got[servers[1].Name()]) != sessions {
				t.Errorf("mcp_proxy: %v, failed %v; want %d/%d sessions, none on %s", got, failed, sessions, sessions, refusing.Name())
			}
			for _, id := range pinned {
				if status, who := rawWhoami(t, hc, ps[0].url(), id); status != http.StatusOK || who.Server != refusing.Name() {
					t.Errorf("a session pinned to the refusing %s: %d from %q; want 200 from it", refusing.Name(), status, who.Server)
				}
			}
			st, err := upstreamOf(table, refusing.Addr())
			if err != nil || st.Refusals == 0 || st.RefusingUntil == "" {
				t.Errorf("admin API for %s: %+v (%v); want refusals counted and refusing_until set", refusing.Name(), st, err)
			}
			families, _ := scrape(t)
			labels := map[string]string{"table": table, "upstream": refusing.Addr()}
			if n := metricValue(families, "caddy_mcp_upstream_refusals_total", labels); n == 0 || float64(st.Refusals) < n {
				t.Errorf("caddy_mcp_upstream_refusals_total = %v; want it counted (admin API says %d)", n, st.Refusals)
			}
			if v := metricValue(families, "caddy_mcp_upstream_refusing", labels); v != 1 {
				t.Errorf("caddy_mcp_upstream_refusing = %v, want 1", v)
			}

			// Stock round_robin breaks sessions anyway; count its initializes only.
			var stockFailed []int
			for range sessions {
				if ex := mcpPost(t, hc, ps[1].url(), "", initBody); ex.status != http.StatusOK {
					stockFailed = append(stockFailed, ex.status)
				}
			}
			if len(stockFailed) < sessions/6 || stockFailed[0] != tc.want {
				t.Errorf("the control, stock round_robin: initializes failed %v; want about a third refused with %d", stockFailed, tc.want)
			}
			t.Logf("mcp_proxy %d/%d sessions opened; stock round_robin %d/%d", sessions-len(failed), sessions, sessions-len(stockFailed), sessions)
		})
	}

	t.Run("no other upstream", func(t *testing.T) {
		servers := startBackendsWith(t, 1, false, func(string) []string { return []string{"-initialize-status", "503"} })
		p := startProxy(t, "mcp_proxy "+upstreams(servers)+" {\n\t\ttable refusal-alone\n\t}")
		hc := newHTTPClient()
		defer hc.CloseIdleConnections()
		start := time.Now()
		ex := mcpPost(t, hc, p.url(), "", initBody)
		if ex.status != http.StatusServiceUnavailable || ex.header.Get("Retry-After") != "1" || rpcErrorCode(ex.body) != -32000 {
			t.Errorf("initialize with the only upstream refusing: %d %v %q; want the server's 503 with its Retry-After and JSON-RPC error", ex.status, ex.header, ex.body)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the refusal took %v to reach the client", took)
		}
	})
}
