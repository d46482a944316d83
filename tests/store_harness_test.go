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
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// Shared-store helpers: the redis store and table routes of the replicas,
// the metrics summed over replicas, and the churn and trouble loads.

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

// waitFor polls cond for up to d (see testproc.Until).
func waitFor(d time.Duration, cond func() bool) bool { return testproc.Until(d, cond) }

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

// sharedStoreReplicas starts three Caddy replicas in front of three
// backends (returned with them) whose table "shared" uses the redis store with storeOpts (its
// address, master_name ...) and the test hash key, and opens 18 sessions,
// each used through every replica so that every replica holds them. The
// client is closed when the test ends.
func sharedStoreReplicas(t *testing.T, storeOpts string) ([]*replica, []*testproc.Proc, *http.Client, []string) {
	t.Helper()
	bs := startBackends(t, 3, true)
	store := "store redis {\n\t\t\t" + storeOpts + "\n\t\t\thash_key {env.MCP_SESSIONS_HASH_KEY}\n\t\t\ttimeout 1s\n\t\t}"
	global := "mcp_sessions shared {\n\t\t" + store + "\n\t}\n\t" + storeLog
	rs := startStoreReplicas(t, 3, global, tableRoutes(upstreams(bs), "shared"))
	hc := newHTTPClient()
	t.Cleanup(hc.CloseIdleConnections)
	known := make([]string, 18)
	for i := range known {
		known[i] = rawSession(t, hc, tableURL(rs[i%3], "shared"))
		for _, r := range rs {
			if ex := sessionCall(t, hc, tableURL(r, "shared"), known[i]); ex.status != http.StatusOK {
				t.Fatalf("warming up: %s does not pin a session: %d %s", r.name, ex.status, ex.body)
			}
		}
	}
	return rs, bs, hc, known
}
