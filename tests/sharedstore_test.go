package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// replicaHashKey is the hash_key the replicas of a test share.
const replicaHashKey = "test-hash-key-0123456789abcdef0123456789"

// metricSum returns the sum over replicas of the samples of family name
// whose labels include want.
func metricSum(t testing.TB, rs []*replica, name string, want map[string]string) float64 {
	t.Helper()
	sum := 0.0
	for _, r := range rs {
		fams, _ := scrapeAt(t, r.admin)
		sum += samplesSum(fams[name], want)
	}
	return sum
}

// samplesSum returns the sum of the samples of f whose labels include want.
func samplesSum(f *dto.MetricFamily, want map[string]string) float64 {
	if f == nil {
		return 0
	}
	sum := 0.0
	for _, m := range f.Metric {
		if v, ok := sampleValue(m); ok && hasLabels(m, want) {
			sum += v
		}
	}
	return sum
}

// sessionCall is a raw JSON-RPC ping of session id, sent to url.
func sessionCall(t testing.TB, hc *http.Client, url, id string) exchange {
	return send(t, hc, http.MethodPost, url, map[string][]string{
		"Mcp-Session-Id": {id}, "Accept": {"application/json, text/event-stream"}, "Mcp-Protocol-Version": {"2025-06-18"},
	}, `{"jsonrpc":"2.0","id":7,"method":"ping"}`)
}

// isProxy404 reports whether ex is the proxy's own 404 for an unknown
// session (code -32001, id null), not an upstream's.
func isProxy404(ex exchange) bool {
	var body struct {
		ID    any `json:"id"`
		Error struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	return ex.status == http.StatusNotFound && json.Unmarshal([]byte(ex.body), &body) == nil && body.ID == nil && body.Error.Code == -32001
}

// tableAt returns replica r's admin view of table name.
func tableAt(t testing.TB, r *replica, name string) caddymodule.TableStatus {
	t.Helper()
	var list []caddymodule.TableStatus
	if _, err := adminDoAt(r.admin, http.MethodGet, "/mcp_sessions/", nil, &list); err != nil {
		t.Fatal(err)
	}
	for _, st := range list {
		if st.Table == name {
			return st
		}
	}
	t.Fatalf("replica %s has no table %q: %+v", r.name, name, list)
	return caddymodule.TableStatus{}
}

// redisStore is the Caddyfile store block of a table shared through the
// Redis at addr, with extra options.
func redisStore(addr, extra string) string {
	return fmt.Sprintf("store redis {\n\t\t\taddress %s\n\t\t\thash_key {env.MCP_SESSIONS_HASH_KEY}\n\t\t\t%s\n\t\t}", addr, extra)
}

// rawSession opens a session through url with raw requests (initialize,
// then notifications/initialized) and returns its ID. Unlike a go-sdk
// client, it keeps no GET stream open, so the session can go idle.
func rawSession(t testing.TB, hc *http.Client, url string) string {
	t.Helper()
	hdr := map[string][]string{"Accept": {"application/json, text/event-stream"}}
	ex := send(t, hc, http.MethodPost, url, hdr, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":`+
		`{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	id := ex.header.Get("Mcp-Session-Id")
	if ex.status != http.StatusOK || id == "" {
		t.Fatalf("initialize through %s: %d %s", url, ex.status, ex.body)
	}
	hdr["Mcp-Session-Id"] = []string{id}
	hdr["Mcp-Protocol-Version"] = []string{"2025-06-18"}
	if ex := send(t, hc, http.MethodPost, url, hdr, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); ex.status != http.StatusAccepted {
		t.Fatalf("notifications/initialized through %s: %d %s", url, ex.status, ex.body)
	}
	return id
}

// tableURL returns replica r's MCP endpoint for table.
func tableURL(r *replica, table string) string { return "http://" + r.addr + "/" + table + "/mcp" }

// storeLog sends the redis store's log lines to the replica's output,
// where the tests count them; the harness discards Caddy's other logs.
// sharedTimeout is the store timeout of the fleets whose tests are not
// about Redis trouble: a learn that waits longer is not in Redis when the
// client's next request reaches another replica, and a test machine busy
// with other end-to-end tests can stall a reply past the default 500ms.
const sharedTimeout = "timeout 3s"

const storeLog = "log store {\n\t\toutput stderr\n\t\tinclude mcp_sessions.stores.redis\n\t}"

// tableRoutes is a site body routing /<table>/mcp to an mcp_proxy over
// ups with that table, for each table.
func tableRoutes(ups string, tables ...string) string {
	var b strings.Builder
	for _, table := range tables {
		fmt.Fprintf(&b, "handle_path /%s/* {\n\t\tmcp_proxy %s {\n\t\t\ttable %s\n\t\t}\n\t}\n\t", table, ups, table)
	}
	return b.String()
}

// startSharedFleet starts three go-sdk servers, a Redis, and three Caddy
// replicas whose site routes /<table>/mcp to an mcp_proxy with that table:
// "shared" in Redis; "local" in memory (the negative control); "short" in
// Redis with a 2 s session_ttl.
func startSharedFleet(t *testing.T) *fleet {
	global := func(f *fleet) string {
		return fmt.Sprintf("mcp_sessions shared {\n\t\t%s\n\t}\n\tmcp_sessions short {\n\t\tsession_ttl 2s\n\t\t%s\n\t}\n\t%s",
			redisStore(f.redis.Addr, sharedTimeout), redisStore(f.redis.Addr, sharedTimeout), storeLog)
	}
	body := func(f *fleet) string { return tableRoutes(upstreams(f.srv), "shared", "local", "short") }
	return newFleet(t, withRedis(), withServers(3, true), withReplicas(3, "c", global, body))
}

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

// clusterView returns, per upstream, the live sessions a replica reports
// for the whole cluster and for itself.
func clusterView(t testing.TB, r *replica, table string) (cluster, local map[string]int64, draining map[string]bool) {
	t.Helper()
	st := tableAt(t, r, table)
	cluster, local, draining = map[string]int64{}, map[string]int64{}, map[string]bool{}
	for _, u := range st.Upstreams {
		if u.ClusterLiveSessions != nil {
			cluster[u.Upstream] = *u.ClusterLiveSessions
		}
		local[u.Upstream], draining[u.Upstream] = u.LiveSessions, u.Draining
	}
	return cluster, local, draining
}

// evictAll forgets every session of the table on every replica, through
// one replica's admin API.
func evictAll(t testing.TB, f *fleet, table string) {
	t.Helper()
	for _, b := range f.srv {
		if st, err := adminDoAt(f.rs[0].admin, http.MethodPost, "/mcp_sessions/evict", map[string]string{"table": table, "upstream": b.Addr()}, nil); st != 200 {
			t.Fatalf("evicting the sessions of %s: %d %v", b.Addr(), st, err)
		}
	}
}

// waitFor polls cond every 50 ms for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// openVia opens n go-sdk sessions through the balancer and returns them
// with the server of each; they stay open.
func openVia(ctx context.Context, t testing.TB, lb *balancer, url string, n int) []*session {
	t.Helper()
	out := make([]*session, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			cs, err := connect(ctx, url, lb.client())
			if err != nil {
				t.Errorf("connect: %v", err)
				return
			}
			t.Cleanup(func() { cs.Close() })
			id, err := whoami(ctx, cs)
			if err != nil {
				t.Errorf("whoami: %v", err)
				return
			}
			out[i] = &session{cs: cs, id: cs.ID()}
			out[i].record(callSpan{who: id})
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return out
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

// spread opens sessions in waves of wave concurrent sessions through lb,
// and returns the gap between the busiest and the idlest server.
func spread(ctx context.Context, t *testing.T, lb *balancer, url string, waves, wave int) (int, map[string]int) {
	per := map[string]int{}
	for range waves {
		for _, s := range openVia(ctx, t, lb, url, wave) {
			per[s.first.Server]++
		}
	}
	counts := []int{}
	for _, n := range per {
		counts = append(counts, n)
	}
	for len(counts) < 3 {
		counts = append(counts, 0)
	}
	return slices.Max(counts) - slices.Min(counts), per
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

// churn is a load of sessions through a balancer: each worker opens a
// session, calls whoami until it has made its calls, closes it, and starts
// again, until stopped.
type churn struct {
	lb     *balancer
	url    string
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	res    churnResult
}

// churnResult sums up a churn.
type churnResult struct {
	sessions, calls, failed, misrouted, retried int
	first                                       error
}

func (r churnResult) String() string {
	return fmt.Sprintf("%d sessions, %d calls answered by the session's server, %d sessions failed, %d calls misrouted, "+
		"%d calls repeated after a broken connection; first failure: %v",
		r.sessions, r.calls, r.failed, r.misrouted, r.retried, r.first)
}

// startChurn starts workers sessions' worth of load on the replicas' site.
func startChurn(t *testing.T, rs []*replica, table string, workers int) *churn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &churn{lb: newBalancer(rs...), url: tableURL(rs[0], table), cancel: cancel}
	for range workers {
		c.wg.Go(func() {
			for ctx.Err() == nil {
				c.record(runChurnSession(ctx, c.lb, c.url, 15))
			}
		})
	}
	t.Cleanup(func() { c.stop() })
	return c
}

// runChurnSession runs one session of calls whoami calls, 50 ms apart.
func runChurnSession(ctx context.Context, lb *balancer, url string, calls int) churnResult {
	var res churnResult
	cs, err := connectReconnecting(ctx, url, lb.client())
	for try := 0; try < 50 && err != nil && (isConnectionError(err) || strings.Contains(err.Error(), "connection refused")) && ctx.Err() == nil; try++ {
		// No session yet: the initialize met a replica that was stopping
		// (every replica, in the all-at-once restart). A client starts its
		// session again; nothing was lost.
		res.retried++
		time.Sleep(200 * time.Millisecond)
		cs, err = connectReconnecting(ctx, url, lb.client())
	}
	if err != nil {
		if ctx.Err() == nil {
			res.failed, res.first = 1, fmt.Errorf("connect: %w", err)
		}
		return res
	}
	defer cs.Close()
	res.sessions = 1
	server := ""
	for i := range calls {
		id, err := whoami(ctx, cs)
		for try := 0; try < 3 && err != nil && isConnectionError(err) && ctx.Err() == nil; try++ {
			// The connection broke before any answer (a replica stopped with
			// the request in its accept queue): the client calls again on the
			// same session. A lost session is a 404 or another server.
			res.retried++
			time.Sleep(200 * time.Millisecond)
			id, err = whoami(ctx, cs)
		}
		switch {
		case ctx.Err() != nil:
			return res
		case err != nil:
			res.failed, res.first = 1, fmt.Errorf("call %d of session %s: %w", i+1, cs.ID(), err)
			return res
		case server == "":
			server = id.Server
		case id.Server != server || id.Session != cs.ID():
			res.misrouted++
			res.first = fmt.Errorf("call %d of session %s on %s answered by %s", i+1, cs.ID(), server, id.Server)
			continue
		}
		res.calls++
		select {
		case <-ctx.Done():
			return res
		case <-time.After(50 * time.Millisecond):
		}
	}
	return res
}

func (c *churn) record(r churnResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.res.sessions += r.sessions
	c.res.calls += r.calls
	c.res.failed += r.failed
	c.res.misrouted += r.misrouted
	c.res.retried += r.retried
	if c.res.first == nil {
		c.res.first = r.first
	}
}

// stop ends the load and returns what it measured.
func (c *churn) stop() churnResult {
	c.cancel()
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.res
}

// troubleLoad is the load during a Redis outage: sessions every replica
// has seen, each sent to a random replica, and new sessions, each kept on
// the replica that created it.
type troubleLoad struct {
	mu       sync.Mutex
	requests int
	failures []string
	fiveXX   int
	slowest  time.Duration
	learned  map[string]*replica // sessions created during the outage, by the replica that learned them
}

func (l *troubleLoad) note(ex exchange, took time.Duration, what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests++
	l.slowest = max(l.slowest, took)
	if ex.status >= 500 {
		l.fiveXX++
	}
	if ex.status/100 != 2 && len(l.failures) < 5 {
		l.failures = append(l.failures, fmt.Sprintf("%s: %d %s", what, ex.status, ex.body))
	}
}

// timedCall is sessionCall, timed.
func timedCall(t testing.TB, hc *http.Client, url, id string) (exchange, time.Duration) {
	start := time.Now()
	ex := sessionCall(t, hc, url, id)
	return ex, time.Since(start)
}

// runTroubleLoad runs the load for d.
func runTroubleLoad(t *testing.T, rs []*replica, known []string, d time.Duration) *troubleLoad {
	l := &troubleLoad{learned: map[string]*replica{}}
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for i, id := range known {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				r := rs[(i+int(time.Now().UnixNano()))%len(rs)]
				ex, took := timedCall(t, hc, tableURL(r, "shared"), id)
				l.note(ex, took, "a session every replica had seen, through "+r.name)
				time.Sleep(30 * time.Millisecond)
			}
		})
	}
	for _, r := range rs {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				start := time.Now()
				id := rawSession(t, hc, tableURL(r, "shared"))
				ex, took := timedCall(t, hc, tableURL(r, "shared"), id)
				l.note(ex, took+time.Since(start)-took, "a session learned meanwhile, through the replica that learned it, "+r.name)
				l.mu.Lock()
				l.learned[id] = r
				l.mu.Unlock()
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return l
}

// unreachableLogs counts the replica's log lines about Redis being unreachable.
func unreachableLogs(r *replica) int {
	return r.proc.Log().Count("redis store unreachable")
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
