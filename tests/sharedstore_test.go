package tests

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// TestReplicasShareSessions covers behaviours 1 to 3 of sessions shared
// through Redis by three Caddy replicas, each a process of its own.
func TestReplicasShareSessions(t *testing.T) {
	t.Parallel()
	f := startSharedFleet(t)
	t.Run("learned on one replica, pinned on every replica", func(t *testing.T) { testPinnedEverywhere(t, f) })
	t.Run("ended on one replica, ended on all", func(t *testing.T) { testEndedEverywhere(t, f) })
	t.Run("drain and counts across replicas", func(t *testing.T) { testDrainAcrossReplicas(t, f) })
	t.Run("least_sessions across replicas", func(t *testing.T) { testLeastSessionsAcrossReplicas(t, f) })
}

// testPinnedEverywhere: every request of a session goes to a random
// replica; with the redis store every call reaches the session's server,
// with the memory store (negative control, same run) sessions break.
func testPinnedEverywhere(t *testing.T, f *fleet) {
	lb := newBalancer(f.rs...)
	res := runSessionsWith(t, tableURL(f.rs[0], "shared"), lb.client(), 100, sessionPlan{calls: 10})
	shared := metricSum(t, f.rs, "caddy_mcp_sessions_shared_total", map[string]string{"table": "shared"})
	t.Logf("redis store, 3 replicas, every request to a random replica: %s; %.0f sessions taken from Redis by a replica that had not seen them", res, shared)
	if res.ok != 100 || res.onCreator != 1000 {
		t.Errorf("redis store: want 100/100 sessions and 1000/1000 calls answered by the session's server; got %s", res)
	}
	if shared < 100 {
		t.Errorf("replicas took %.0f sessions from Redis; with 100 sessions over 3 replicas, want at least 100", shared)
	}
	neg := newBalancer(f.rs...)
	bad := runSessionsWith(t, tableURL(f.rs[0], "local"), neg.client(), 100, sessionPlan{calls: 10})
	t.Logf("memory store (negative control), same replicas and servers: %s", bad)
	if bad.ok > 10 {
		t.Errorf("memory store: %d/100 sessions survived random replicas; the negative control shows nothing", bad.ok)
	}
	if errs := lb.serverErrors(); len(errs) != 0 {
		t.Errorf("redis store: %d answers 5xx: %v", len(errs), errs)
	}
}

// testEndedEverywhere: a session ended on one replica (DELETE, the
// upstream's 404, admin eviction, TTL) is not pinned by the others 1 s
// later: their next request gets the proxy's own 404.
func testEndedEverywhere(t *testing.T, f *fleet) {
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	c1, c2, c3 := f.rs[0], f.rs[1], f.rs[2]
	ends := []struct {
		name string
		end  func(id string)
	}{
		{"DELETE through c1", func(id string) {
			ex := send(t, hc, http.MethodDelete, tableURL(c1, "shared"), map[string][]string{"Mcp-Session-Id": {id}}, "")
			if ex.status/100 != 2 {
				t.Fatalf("DELETE: %d %s", ex.status, ex.body)
			}
		}},
		{"upstream 404 through c1", func(id string) {
			for _, b := range f.srv { // the server forgets the session behind the proxies' backs
				send(t, hc, http.MethodDelete, "http://"+b.Addr()+"/mcp", map[string][]string{"Mcp-Session-Id": {id}}, "")
			}
			if ex := sessionCall(t, hc, tableURL(c1, "shared"), id); ex.status != http.StatusNotFound || isProxy404(ex) {
				t.Fatalf("want the upstream's own 404 through c1, got %d %s", ex.status, ex.body)
			}
		}},
		{"admin evict on c1", func(id string) {
			if st, err := adminDoAt(c1.admin, http.MethodPost, "/mcp_sessions/evict", map[string]string{"table": "shared", "session_id": id}, nil); st != 200 {
				t.Fatalf("admin evict: %d %v", st, err)
			}
		}},
	}
	for _, tc := range ends {
		id := rawSession(t, hc, tableURL(c1, "shared"))
		for _, r := range []*replica{c2, c3} {
			if ex := sessionCall(t, hc, tableURL(r, "shared"), id); ex.status != http.StatusOK {
				t.Fatalf("%s: a session learned on c1 is not pinned on %s: %d %s", tc.name, r.name, ex.status, ex.body)
			}
		}
		tc.end(id)
		time.Sleep(time.Second)
		for _, r := range []*replica{c2, c3} {
			if ex := sessionCall(t, hc, tableURL(r, "shared"), id); !isProxy404(ex) {
				t.Errorf("%s: 1 s later %s answered %d %s, want the proxy's 404", tc.name, r.name, ex.status, ex.body)
			}
		}
	}

	// TTL: a session idle on every replica is forgotten by all of them
	// between session_ttl (2 s) and one touch interval (1 s) later.
	id := rawSession(t, hc, tableURL(c1, "short"))
	if ex := sessionCall(t, hc, tableURL(c2, "short"), id); ex.status != http.StatusOK {
		t.Fatalf("ttl: not pinned on c2: %d %s", ex.status, ex.body)
	}
	time.Sleep(1500 * time.Millisecond)
	if ex := sessionCall(t, hc, tableURL(c3, "short"), id); ex.status != http.StatusOK { // used within the TTL: kept, everywhere
		t.Fatalf("ttl: a session used within its TTL is not pinned on c3: %d %s", ex.status, ex.body)
	}
	time.Sleep(2*time.Second + time.Second + 200*time.Millisecond)
	for _, r := range f.rs {
		if ex := sessionCall(t, hc, tableURL(r, "short"), id); !isProxy404(ex) {
			t.Errorf("ttl: 3.2 s after its last use %s answered %d %s, want the proxy's 404", r.name, ex.status, ex.body)
		}
	}
}

// testDrainAcrossReplicas: drain and undrain through any replica's admin
// API apply on all; the admin API and metrics count live sessions per
// upstream across replicas beside the replica's own view.
func testDrainAcrossReplicas(t *testing.T, f *fleet) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	evictAll(t, f, "shared")
	lb, url := newBalancer(f.rs...), tableURL(f.rs[0], "shared")
	open := openVia(ctx, t, lb, url, 30)
	perServer := map[string]int64{}
	for _, s := range open {
		perServer[s.first.Server]++
	}
	want := map[string]int64{}
	for _, b := range f.srv {
		want[b.Addr()] = perServer[b.Name()]
	}
	for _, r := range f.rs {
		var cluster, local map[string]int64
		ok := waitFor(3*time.Second, func() bool {
			cluster, local, _ = clusterView(t, r, "shared")
			return fmt.Sprint(cluster) == fmt.Sprint(want)
		})
		t.Logf("%s: cluster-wide live sessions %v, its own %v (sessions per server %v)", r.name, cluster, local, perServer)
		if !ok {
			t.Errorf("%s reports cluster-wide live sessions %v, want %v", r.name, cluster, want)
		}
		fams, _ := scrapeAt(t, r.admin)
		for dial, n := range want {
			if v := metricValue(fams, "caddy_mcp_sessions_cluster_live", map[string]string{"table": "shared", "upstream": dial}); v != float64(n) {
				t.Errorf("%s: caddy_mcp_sessions_cluster_live{upstream=%q} = %v, want %d", r.name, dial, v, n)
			}
		}
	}

	// Drain s1 through c2: every replica sees it within 1 s, and no new
	// session goes to s1 through any replica.
	s1 := f.srv[0]
	if st, err := adminDoAt(f.rs[1].admin, http.MethodPost, "/mcp_sessions/drain", map[string]string{"table": "shared", "upstream": s1.Addr()}, nil); st != 200 {
		t.Fatalf("drain: %d %v", st, err)
	}
	time.Sleep(time.Second)
	for _, r := range f.rs {
		if _, _, draining := clusterView(t, r, "shared"); !draining[s1.Addr()] {
			t.Errorf("%s does not drain %s 1 s after c2 drained it", r.name, s1.Addr())
		}
	}
	for _, s := range openVia(ctx, t, lb, url, 15) {
		if s.first.Server == s1.Name() {
			t.Errorf("a new session went to the draining %s", s1.Name())
		}
	}
	for _, s := range open {
		if id, err := whoami(ctx, s.cs); err != nil || id.Server != s.first.Server {
			t.Errorf("a session of %s broke while its upstream drained: %v %+v", s.first.Server, err, id)
		}
	}
	// Undrain through c3: every replica sees it within 1 s.
	if st, err := adminDoAt(f.rs[2].admin, http.MethodPost, "/mcp_sessions/undrain", map[string]string{"table": "shared", "upstream": s1.Addr()}, nil); st != 200 {
		t.Fatalf("undrain: %d %v", st, err)
	}
	time.Sleep(time.Second)
	for _, r := range f.rs {
		if _, _, draining := clusterView(t, r, "shared"); draining[s1.Addr()] {
			t.Errorf("%s still drains %s 1 s after c3 undrained it", r.name, s1.Addr())
		}
	}
}

// testLeastSessionsAcrossReplicas: least_sessions spreads the new sessions
// of three replicas sharing Redis as evenly as one replica spreads its own.
func testLeastSessionsAcrossReplicas(t *testing.T, f *fleet) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	evictAll(t, f, "shared")
	evictAll(t, f, "local")
	time.Sleep(1200 * time.Millisecond) // a sync: counts start at 0 everywhere
	three, perThree := spread(ctx, t, newBalancer(f.rs...), tableURL(f.rs[0], "shared"), 10, 6)
	one, perOne := spread(ctx, t, newBalancer(f.rs[0]), tableURL(f.rs[0], "local"), 10, 6)
	t.Logf("60 sessions in waves of 6: 3 replicas sharing Redis %v (gap %d); 1 replica %v (gap %d)", perThree, three, perOne, one)
	if three > max(one, 2)+1 {
		t.Errorf("3 replicas spread sessions with a gap of %d, 1 replica with %d", three, one)
	}
}

// TestReplicasSurviveRestarts: under load, restart one replica, then every
// replica one by one, then all at once: with the redis store no session is
// lost; with the memory store (negative control, same run) sessions are.
func TestReplicasSurviveRestarts(t *testing.T) {
	t.Parallel()
	f := startSharedFleet(t)
	shared, local := startChurn(t, f.rs, "shared", 24), startChurn(t, f.rs, "local", 12)
	pause := func() { time.Sleep(1500 * time.Millisecond) }
	pause()
	restartOne := func(r *replica, lbs ...*balancer) {
		for _, lb := range lbs {
			lb.remove(r) // the balancer's health check notices, as before a deploy
		}
		time.Sleep(drainDelay)
		r.stop()
		r.start(t)
		for _, lb := range lbs {
			lb.add(r)
		}
	}
	t.Log("restarting c1")
	restartOne(f.rs[0], shared.lb, local.lb)
	pause()
	t.Log("restarting c1, c2, c3 one by one")
	for _, r := range f.rs {
		restartOne(r, shared.lb, local.lb)
		pause()
	}
	t.Log("restarting c1, c2, c3 at once")
	var wg sync.WaitGroup
	for _, r := range f.rs {
		wg.Go(r.stop)
	}
	wg.Wait()
	for _, r := range f.rs {
		r.start(t)
	}
	pause()
	rs, rl := shared.stop(), local.stop()
	t.Logf("redis store: %s", rs)
	t.Logf("memory store (negative control): %s", rl)
	if rs.failed != 0 || rs.misrouted != 0 || rs.sessions < 50 {
		t.Errorf("redis store: %d sessions lost, %d calls misrouted in %d sessions; want 0 lost: first failure: %v", rs.failed, rs.misrouted, rs.sessions, rs.first)
	}
	if errs := shared.lb.serverErrors(); len(errs) != 0 {
		t.Errorf("redis store: %d answers 5xx: %v", len(errs), errs)
	}
	if rl.failed == 0 {
		t.Errorf("memory store: no session lost across restarts; the negative control shows nothing")
	}
}

// TestReplicasRedisTrouble: Redis stopped, blackholed, slow, or restarted
// empty under load: no request gets a 5xx because of Redis; sessions known
// locally stay pinned; sessions learned meanwhile work on the replica that
// learned them, and on every replica once Redis is back; errors are counted
// and each outage is logged once per replica, not per request.
func TestReplicasRedisTrouble(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	relay := redistest.NewRelay(t, srv.Addr)
	bs := startBackends(t, 3, true)
	global := "mcp_sessions shared {\n\t\t" + redisStore(relay.Addr, "timeout 1s") + "\n\t}\n\t" + storeLog
	rs := startStoreReplicas(t, 3, global, tableRoutes(upstreams(bs), "shared"))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	troubles := []struct {
		name       string
		start, end func()
	}{
		{"stopped, then back empty", srv.Stop, srv.Restart},
		{"blackholed", func() { relay.Blackhole(true) }, func() { relay.Blackhole(false) }},
		{"slow: 3 s per reply, timeout 1s", func() { relay.Slow(3 * time.Second) }, func() { relay.Slow(0) }},
		{"restarted empty", func() { srv.Stop(); srv.Restart() }, func() {}},
	}
	for _, tr := range troubles {
		t.Run(tr.name, func(t *testing.T) {
			known := make([]string, 9)
			for i := range known {
				known[i] = rawSession(t, hc, tableURL(rs[i%3], "shared"))
				for _, r := range rs {
					if ex := sessionCall(t, hc, tableURL(r, "shared"), known[i]); ex.status != http.StatusOK {
						t.Fatalf("warming up: %s does not pin a session: %d %s", r.name, ex.status, ex.body)
					}
				}
			}
			elsewhere := rawSession(t, hc, tableURL(rs[0], "shared")) // c1 learned it; c3 never saw it
			logsBefore := []int{unreachableLogs(rs[0]), unreachableLogs(rs[1]), unreachableLogs(rs[2])}
			errsBefore := metricSum(t, rs, "caddy_mcp_store_errors_total", map[string]string{"table": "shared"})

			tr.start()
			load := runTroubleLoad(t, rs, known, 3*time.Second)
			ex, took := timedCall(t, hc, tableURL(rs[2], "shared"), elsewhere)
			tr.end()
			t.Logf("during the trouble: %d requests, %d failed (%v), %d 5xx, slowest %s; a session c3 never saw: %d in %s",
				load.requests, len(load.failures), load.failures, load.fiveXX, load.slowest.Round(time.Millisecond), ex.status, took.Round(time.Millisecond))
			if load.fiveXX != 0 || len(load.failures) != 0 {
				t.Errorf("requests failed during the trouble: %v", load.failures)
			}
			if ex.status >= 500 || took > 3*time.Second {
				t.Errorf("a session c3 never saw, during the trouble: %d after %s; want no 5xx, no long wait", ex.status, took)
			}

			// Redis is back: what was learned meanwhile reaches every replica.
			if !waitFor(15*time.Second, func() bool {
				return metricSum(t, rs, "caddy_mcp_store_up", map[string]string{"table": "shared"}) == 3
			}) {
				t.Fatalf("the replicas do not reach Redis again")
			}
			for id, learner := range load.learned {
				for _, r := range rs {
					ok := waitFor(5*time.Second, func() bool { return sessionCall(t, hc, tableURL(r, "shared"), id).status == http.StatusOK })
					if !ok {
						t.Errorf("a session %s learned during the trouble is not pinned on %s once Redis is back", learner.name, r.name)
					}
				}
			}
			if ex := sessionCall(t, hc, tableURL(rs[2], "shared"), elsewhere); ex.status != http.StatusOK {
				t.Errorf("after the trouble, c3 does not pin a session c1 learned before it: %d %s", ex.status, ex.body)
			}
			errs := metricSum(t, rs, "caddy_mcp_store_errors_total", map[string]string{"table": "shared"}) - errsBefore
			for i, r := range rs {
				n := unreachableLogs(r) - logsBefore[i]
				t.Logf("%s logged the outage %d times", r.name, n)
				if n > 1 {
					t.Errorf("%s logged one outage %d times: want once per burst", r.name, n)
				}
			}
			t.Logf("store errors counted: %.0f, over %d requests", errs, load.requests)
			if errs == 0 && tr.name != "restarted empty" {
				t.Errorf("no store error counted")
			}
		})
	}
}

// TestUpstreamRecordsExpire: the record of an upstream that no config lists
// any more and that owns no session is dropped after upstream_ttl, with its
// draining flag and metric series, here and in Redis; configured upstreams
// stay.
func TestUpstreamRecordsExpire(t *testing.T) {
	srv := redistest.Start(t)
	bs := startBackends(t, 3, true)
	port := mustFreePort()
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	global := fmt.Sprintf("mcp_sessions records {\n\t\tupstream_ttl 2s\n\t\tstore redis {\n\t\t\taddress %s\n\t\t\thash_key %s\n\t\t}\n\t}", srv.Addr, replicaHashKey)
	cfg := func(ups []*testproc.Proc) string {
		return withGlobal(siteConfig(port, "mcp_proxy "+upstreams(ups)+" {\n\t\ttable records\n\t}"), global)
	}
	loadCaddyfile(t, cfg(bs))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	for range 6 {
		rawSession(t, hc, url) // no GET stream: a stream open to an upstream keeps its record
	}
	gone := bs[2].Addr()
	adminCall(t, http.MethodPost, "/mcp_sessions/drain", map[string]string{"table": "records", "upstream": gone}, nil)

	// s3 leaves the config, as a pod goes away; its sessions end.
	reloadViaAdmin(t, cfg(bs[:2]))
	adminCall(t, http.MethodPost, "/mcp_sessions/evict", map[string]string{"table": "records", "upstream": gone}, nil)
	listed := func() []string {
		var out []string
		for _, u := range tableOf(t, "records").Upstreams {
			out = append(out, u.Upstream)
		}
		return out
	}
	if !slices.Contains(listed(), gone) {
		t.Fatalf("%s is not listed right after it left the config: %v", gone, listed())
	}
	start := time.Now()
	if !waitFor(10*time.Second, func() bool { return !slices.Contains(listed(), gone) }) {
		t.Fatalf("%s is still listed 10 s after it left the config with no session: %v", gone, listed())
	}
	t.Logf("%s dropped %s after its last session ended (upstream_ttl 2s)", gone, time.Since(start).Round(100*time.Millisecond))
	for _, b := range bs[:2] {
		if !slices.Contains(listed(), b.Addr()) {
			t.Errorf("configured upstream %s was dropped too: %v", b.Addr(), listed())
		}
	}
	_, text := scrape(t)
	if strings.Contains(text, `upstream="`+gone+`"`) {
		t.Errorf("metrics still carry series of %s", gone)
	}
	ups := srv.Do("ZSCORE", "{caddy-mcp:records}:upstreams", gone)
	drain := srv.Do("HEXISTS", "{caddy-mcp:records}:draining", gone)
	if !waitFor(5*time.Second, func() bool {
		ups, drain = srv.Do("ZSCORE", "{caddy-mcp:records}:upstreams", gone), srv.Do("HEXISTS", "{caddy-mcp:records}:draining", gone)
		return ups == "-1" && drain == "0"
	}) {
		t.Errorf("Redis still holds the record of %s: score %q, draining %q", gone, ups, drain)
	}
	if s := srv.Do("ZSCORE", "{caddy-mcp:records}:upstreams", bs[0].Addr()); s == "-1" || s == "" {
		t.Errorf("Redis dropped the record of the configured %s: %q", bs[0].Addr(), s)
	}
}
