package tests

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
)

// TestMetricsAfterScenario scrapes Caddy's metrics endpoint after a
// scripted scenario and checks every plugin metric, and that the metrics
// stay registered and current across a reload.
func TestMetricsAfterScenario(t *testing.T) {
	ds := startDoubles(t, 3)
	body := "mcp_proxy " + upstreams(ds) + " {\n\t\ttable metrics\n\t}\n\tmetrics /metrics"
	p := startProxy(t, body)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	owned := map[*double]string{}
	live := map[*double]float64{}
	inits := 0
	for len(owned) < 3 {
		id := initialize(t, hc, p.url())
		inits++
		owned[ownerOf(t, ds, id)] = id
		live[ownerOf(t, ds, id)]++
	}
	a, b, c := owned[ds[0]], owned[ds[1]], owned[ds[2]]
	live[ds[1]]-- // b: deleted below
	live[ds[2]]-- // c: its upstream goes away below
	for range 5 {
		send(t, hc, http.MethodPost, p.url(), sid(a), `{}`)
	}
	send(t, hc, http.MethodPost, p.url(), sid("never-learned"), `{}`) // unknown
	send(t, hc, http.MethodDelete, p.url(), sid(b), "")               // evicted: delete
	for _, d := range ds {                                            // a 2026-07-28 server: no sessions
		d.handle(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{}`) })
	}
	send(t, hc, http.MethodPost, p.url(), map[string][]string{ // a 2026-07-28 request
		"Mcp-Method": {"tools/list"}, "Mcp-Protocol-Version": {"2026-07-28"}}, `{}`)
	for _, d := range ds {
		d.handle(nil)
	}
	ds[2].srv.Close()
	time.Sleep(100 * time.Millisecond)
	send(t, hc, http.MethodPost, p.url(), sid(c), `{}`) // upstream gone
	if st := adminCall(t, http.MethodPost, "/mcp_sessions/drain", map[string]string{"table": "metrics", "upstream": ds[1].addr}, nil); st != http.StatusOK {
		t.Fatalf("drain: %d", st)
	}

	check := func(stage string) {
		families, text := scrape(t)
		tbl := map[string]string{"table": "metrics"}
		with := func(k, v string) map[string]string { return map[string]string{"table": "metrics", k: v} }
		want := []struct {
			name   string
			labels map[string]string
			value  float64
		}{
			{"caddy_mcp_sessions_live", with("upstream", ds[0].addr), live[ds[0]]},
			{"caddy_mcp_sessions_live", with("upstream", ds[1].addr), live[ds[1]]},
			{"caddy_mcp_sessions_live", with("upstream", ds[2].addr), live[ds[2]]},
			{"caddy_mcp_upstream_draining", with("upstream", ds[1].addr), 1},
			{"caddy_mcp_upstream_draining", with("upstream", ds[0].addr), 0},
			{"caddy_mcp_sessions_learned_total", tbl, float64(inits)},
			{"caddy_mcp_requests_pinned_total", tbl, 5 + 1 + 1}, // a ×5, the DELETE, c before it was found gone
			{"caddy_mcp_unknown_session_total", tbl, 1},
			{"caddy_mcp_upstream_gone_total", tbl, 1},
			{"caddy_mcp_sessions_evicted_total", with("reason", "delete"), 1},
			{"caddy_mcp_sessions_evicted_total", with("reason", "upstream_gone"), 1},
			{"caddy_mcp_sessions_evicted_total", with("reason", "ttl"), 0},
			{"caddy_mcp_requests_total", with("era", "legacy_session"), 5 + 1 + 1 + 1},
			{"caddy_mcp_requests_total", with("era", "modern_sessionless"), 1},
			{"caddy_mcp_requests_total", with("era", "other_sessionless"), float64(inits)},
		}
		for _, w := range want {
			if got := metricValue(families, w.name, w.labels); got != w.value {
				t.Errorf("%s: %s%v = %v, want %v", stage, w.name, w.labels, got, w.value)
			}
		}
		for _, id := range []string{a, b, c, "never-learned"} {
			if strings.Contains(text, id) {
				t.Errorf("%s: the metrics expose session ID %q", stage, id)
			}
		}
	}
	check("before reload")
	reloadViaAdmin(t, siteConfig(p.port(), body+"\n"))
	check("after reload")

	adminCall(t, http.MethodPost, "/mcp_sessions/undrain", map[string]string{"table": "metrics", "upstream": ds[1].addr}, nil)
}

// TestAdminAPI drives the admin endpoint over real HTTP: per-upstream
// counts, session lookup and eviction, drain and undrain.
func TestAdminAPI(t *testing.T) {
	ds := startDoubles(t, 2)
	p := startProxy(t, "mcp_proxy "+upstreams(ds)+" {\n\t\ttable admin\n\t\tmax_sessions 500\n\t}")
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	ids := []string{initialize(t, hc, p.url()), initialize(t, hc, p.url()), initialize(t, hc, p.url())}

	table := tableOf(t, "admin")
	if table.Sessions != 3 || table.MaxSessions != 500 {
		t.Fatalf("list: want table admin with 3 sessions of 500, got %+v", table)
	}
	perUpstream := map[string]int64{}
	for _, u := range table.Upstreams {
		perUpstream[u.Upstream] = u.LiveSessions
	}
	for _, d := range ds {
		want := int64(0)
		for _, id := range ids {
			if ownerOf(t, ds, id) == d {
				want++
			}
		}
		if perUpstream[d.addr] != want {
			t.Errorf("upstream %s: %d live sessions, want %d", d.addr, perUpstream[d.addr], want)
		}
	}

	var sess caddymodule.SessionStatus
	if st := adminCall(t, http.MethodPost, "/mcp_sessions/lookup", map[string]string{"table": "admin", "session_id": ids[0]}, &sess); st != http.StatusOK {
		t.Fatalf("lookup: %d", st)
	}
	if sess.Upstream != ownerOf(t, ds, ids[0]).addr || len(sess.Fingerprint) != 12 {
		t.Fatalf("lookup: %+v", sess)
	}
	if st := adminCall(t, http.MethodPost, "/mcp_sessions/evict", map[string]string{"table": "admin", "session_id": ids[0]}, &sess); st != http.StatusOK || !sess.Evicted {
		t.Fatalf("evict: %d %+v", st, sess)
	}
	checkProxy404(t, send(t, hc, http.MethodPost, p.url(), sid(ids[0]), `{}`))
	if st := adminCall(t, http.MethodPost, "/mcp_sessions/lookup", map[string]string{"table": "admin", "session_id": ids[0]}, nil); st != http.StatusNotFound {
		t.Fatalf("lookup of an evicted session: %d, want 404", st)
	}
	if st := adminCall(t, http.MethodPost, "/mcp_sessions/lookup", map[string]string{"table": "nope", "session_id": "x"}, nil); st != http.StatusNotFound {
		t.Fatalf("unknown table: %d, want 404", st)
	}

	var up caddymodule.UpstreamStatus
	adminCall(t, http.MethodPost, "/mcp_sessions/drain", map[string]string{"table": "admin", "upstream": ds[0].addr}, &up)
	if !up.Draining {
		t.Fatalf("drain: %+v", up)
	}
	for range 6 {
		if id := initialize(t, hc, p.url()); ownerOf(t, ds, id) == ds[0] {
			t.Fatalf("a new session went to the draining upstream")
		}
	}
	for _, id := range ids[1:] { // pinned sessions keep working
		if ex := send(t, hc, http.MethodPost, p.url(), sid(id), `{}`); ex.status != http.StatusOK {
			t.Fatalf("pinned session during drain: %d %s", ex.status, ex.body)
		}
	}
	adminCall(t, http.MethodGet, "/mcp_sessions/upstream?table=admin&upstream="+ds[0].addr, nil, &up)
	if !up.Draining {
		t.Fatalf("upstream status: %+v", up)
	}
	adminCall(t, http.MethodPost, "/mcp_sessions/undrain", map[string]string{"table": "admin", "upstream": ds[0].addr}, &up)
	landed := 0
	for range 6 {
		if id := initialize(t, hc, p.url()); ownerOf(t, ds, id) == ds[0] {
			landed++
		}
	}
	if up.Draining || landed == 0 {
		t.Fatalf("after undrain: %+v, %d of 6 new sessions on it", up, landed)
	}
}

// TestLeastSessionsSpreadsBetter compares how evenly round_robin and
// least_sessions spread 300 sessions of uneven length over 3 upstreams: a
// third are long (30-90 steps), the rest short (1-5 steps). least_sessions
// is the directive's default fallback only while it spreads them better.
func TestLeastSessionsSpreadsBetter(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	schedule := make([]int, 300)
	for i := range schedule {
		if rng.IntN(3) == 0 {
			schedule[i] = 30 + rng.IntN(61)
		} else {
			schedule[i] = 1 + rng.IntN(5)
		}
	}
	rrMean, rrWorst := spreadRun(t, "round_robin", schedule)
	lsMean, lsWorst := spreadRun(t, "least_sessions", schedule)
	t.Logf("gap between busiest and idlest upstream over 300 sessions: round_robin mean %.2f worst %d; least_sessions mean %.2f worst %d",
		rrMean, rrWorst, lsMean, lsWorst)
	if lsMean >= rrMean {
		t.Fatalf("least_sessions (mean gap %.2f) does not spread sessions better than round_robin (%.2f)", lsMean, rrMean)
	}
}

// TestDecisionLogs checks the debug log: one line per decision, naming the
// upstream and a fingerprint of the session, never the session ID itself;
// and nothing per request at info level.
func TestDecisionLogs(t *testing.T) {
	ds := startDoubles(t, 2)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	port := mustFreePort()
	cfg := func(level string) string {
		return strings.Replace(siteConfig(port, "mcp_proxy "+upstreams(ds)+" {\n\t\ttable logs\n\t}"), "{\n\tadmin",
			fmt.Sprintf("{\n\tlog mcp {\n\t\toutput file %s\n\t\tlevel %s\n\t\tinclude http.handlers.mcp_session\n\t}\n\tadmin", logFile, level), 1)
	}
	p := proxy{addr: fmt.Sprintf("127.0.0.1:%d", port)}
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	loadCaddyfile(t, cfg("DEBUG"))
	a, b := initialize(t, hc, p.url()), initialize(t, hc, p.url())
	send(t, hc, http.MethodPost, p.url(), sid(a), `{}`)
	send(t, hc, http.MethodPost, p.url(), sid("never-learned-session"), `{}`)
	send(t, hc, http.MethodDelete, p.url(), sid(a), "")
	ownerOf(t, ds, b).srv.Close()
	time.Sleep(100 * time.Millisecond)
	send(t, hc, http.MethodPost, p.url(), sid(b), `{}`)

	lines := readLogLines(t, logFile)
	counts := map[string]int{}
	for _, l := range lines {
		counts[l["msg"].(string)]++
		if fp, _ := l["session"].(string); len(fp) != 12 {
			t.Errorf("log line without a 12-digit session fingerprint: %v", l)
		}
		if l["msg"] != "unknown" && l["upstream"] == "" {
			t.Errorf("log line without its upstream: %v", l)
		}
		if l["msg"] == "evicted" && l["reason"] != "delete" && l["reason"] != "upstream_gone" {
			t.Errorf("evicted line with reason %v, want delete or upstream_gone", l["reason"])
		}
	}
	want := map[string]int{"learned": 2, "pinned": 3, "unknown": 1, "evicted": 2, "upstream_gone": 1} // evicted: delete, upstream_gone
	for msg, n := range want {
		if counts[msg] != n {
			t.Errorf("%d %q lines, want %d (all: %v)", counts[msg], msg, n, counts)
		}
	}
	raw, _ := os.ReadFile(logFile)
	for _, id := range []string{a, b, "never-learned-session"} {
		if strings.Contains(string(raw), id) {
			t.Errorf("the log contains session ID %q", id)
		}
	}

	os.Remove(logFile)
	loadCaddyfile(t, cfg("INFO"))
	hc.CloseIdleConnections() // the old server closes them; see reloadViaAdmin
	c := initialize(t, hc, p.url())
	send(t, hc, http.MethodPost, p.url(), sid(c), `{}`)
	send(t, hc, http.MethodPost, p.url(), sid("never-learned-session"), `{}`)
	if lines := readLogLines(t, logFile); len(lines) != 0 {
		t.Errorf("at INFO level the handler logged %d lines for ordinary requests: %v", len(lines), lines)
	}
}
