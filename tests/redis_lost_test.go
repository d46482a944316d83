package tests

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
)

// TestReplicasRedisFlushed: FLUSHALL on the Redis of three replicas, with
// the same run_id, under load: sessions each replica learned alone, and a
// drain in force, are back on every replica within a few seconds, and the
// drain is never undone. The control, same run: right after FLUSHALL,
// replicas that had not seen those sessions answer 404 for them, which is
// what lasted 50–55 s before the replicas noticed lost keys.
func TestReplicasRedisFlushed(t *testing.T) {
	t.Parallel()
	f := startSharedFleet(t)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	drained := f.srv[0].Addr()
	if st, err := adminDoAt(f.rs[1].admin, http.MethodPost, "/mcp_sessions/drain", map[string]string{"table": "shared", "upstream": drained}, nil); st != 200 {
		t.Fatalf("drain: %d %v", st, err)
	}
	known := make([]string, 6)
	for i := range known {
		known[i] = rawSession(t, hc, tableURL(f.rs[i%3], "shared"))
		for _, r := range f.rs {
			if ex := sessionCall(t, hc, tableURL(r, "shared"), known[i]); ex.status != http.StatusOK {
				t.Fatalf("warming up: %s does not pin a session: %d %s", r.name, ex.status, ex.body)
			}
		}
	}
	alone := map[string]*replica{} // learned by one replica, used there only
	for i := range 9 {
		r := f.rs[i%3]
		alone[rawSession(t, hc, tableURL(r, "shared"))] = r
	}
	if !waitFor(3*time.Second, func() bool {
		for _, r := range f.rs {
			if _, _, d := clusterView(t, r, "shared"); !d[drained] {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("not every replica drains %s", drained)
	}
	before := metricSum(t, f.rs, "caddy_mcp_store_write_backs_total", map[string]string{"table": "shared", "cause": "flush"})

	if r := f.redis.Do("FLUSHALL"); r != "OK" {
		t.Fatalf("FLUSHALL: %q", r)
	}
	flushed := time.Now()
	missing := 0 // the control
	for id, learner := range alone {
		other := f.rs[(slices.Index(f.rs, learner)+1)%3]
		if isProxy404(sessionCall(t, hc, tableURL(other, "shared"), id)) {
			missing++
		}
	}
	t.Logf("right after FLUSHALL: %d of %d sessions learned by one replica were 404 on another", missing, len(alone))
	undrained := ""
	load := runTroubleLoad(t, f.rs, known, 3*time.Second)
	for _, r := range f.rs {
		if _, _, d := clusterView(t, r, "shared"); !d[drained] {
			undrained += " " + r.name
		}
	}
	t.Logf("under load, 3 s from FLUSHALL: %d requests, %d failed (%v), %d 5xx", load.requests, len(load.failures), load.failures, load.fiveXX)
	if load.fiveXX != 0 || len(load.failures) != 0 {
		t.Errorf("requests failed after FLUSHALL: %v", load.failures)
	}
	if undrained != "" {
		t.Errorf("the drain of %s was undone after FLUSHALL on%s", drained, undrained)
	}
	for id, learner := range alone {
		for _, r := range f.rs {
			if ex := sessionCall(t, hc, tableURL(r, "shared"), id); ex.status != http.StatusOK {
				t.Errorf("a session %s learned is %d on %s %s after FLUSHALL: %s", learner.name, ex.status, r.name, time.Since(flushed).Round(100*time.Millisecond), ex.body)
			}
		}
	}
	for id, learner := range load.learned {
		for _, r := range f.rs {
			if ex := sessionCall(t, hc, tableURL(r, "shared"), id); ex.status != http.StatusOK {
				t.Errorf("a session %s learned under load is %d on %s", learner.name, ex.status, r.name)
			}
		}
	}
	// New sessions through the other replicas still avoid the drained upstream.
	for i := range 6 {
		id := rawSession(t, hc, tableURL(f.rs[i%3], "shared"))
		if ex := sessionCall(t, hc, tableURL(f.rs[(i+1)%3], "shared"), id); ex.status != http.StatusOK {
			t.Errorf("a session learned after FLUSHALL is %d elsewhere", ex.status)
		}
	}
	_, _, d := clusterView(t, f.rs[0], "shared")
	wb := metricSum(t, f.rs, "caddy_mcp_store_write_backs_total", map[string]string{"table": "shared", "cause": "flush"}) - before
	restored := metricSum(t, f.rs, "caddy_mcp_store_sessions_restored_total", map[string]string{"table": "shared"})
	restarts := metricSum(t, f.rs, "caddy_mcp_store_write_backs_total", map[string]string{"table": "shared", "cause": "restart"})
	t.Logf("flush write-backs: %.0f on 3 replicas; sessions restored %.0f; restart write-backs %.0f; draining on c1 %v", wb, restored, restarts, d[drained])
	if wb < 3 || restored < float64(len(alone)) {
		t.Errorf("want a flush write-back on each of 3 replicas and at least %d sessions restored; got %.0f, %.0f", len(alone), wb, restored)
	}
	if restarts != 0 {
		t.Errorf("%.0f restart write-backs without a restart", restarts)
	}
}

// TestReplicasRedisFlood: an initialize flood from one client through one
// of three replicas sharing a Redis with maxmemory, under noeviction (a
// full Redis answers OOM) and under volatile-lru (it evicts): Redis holds
// about the tables' bounds of the flood, not the flood, and sessions in use
// keep working on every replica, as do sessions opened after the flood.
func TestReplicasRedisFlood(t *testing.T) {
	t.Parallel()
	const (
		maxSessions = 200
		floodSize   = 5_000
	)
	srv := redistest.Start(t)
	bs := startBackends(t, 2, true)
	fl := startFloodServer(t)
	global := fmt.Sprintf("mcp_sessions fl {\n\t\tmax_sessions %d\n\t\t%s\n\t}\n\t%s", maxSessions, redisStore(srv.Addr, sharedTimeout), storeLog)
	body := fmt.Sprintf("handle_path /fl/* {\n\t\tmcp_proxy %s {\n\t\t\ttable fl\n\t\t}\n\t}\n\thandle_path /flood/* {\n\t\tmcp_proxy %s {\n\t\t\ttable fl\n\t\t}\n\t}",
		upstreams(bs), fl.Addr())
	rs := startStoreReplicas(t, 3, global, body)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	for _, policy := range []string{"noeviction", "volatile-lru"} {
		t.Run(policy, func(t *testing.T) {
			live := make([]string, 30)
			for i := range live {
				live[i] = rawSession(t, hc, tableURL(rs[i%3], "fl"))
			}
			base := srv.Info("memory", "used_memory")
			var used int64
			fmt.Sscan(base, &used)
			srv.Do("CONFIG", "SET", "maxmemory-policy", policy)
			srv.Do("CONFIG", "SET", "maxmemory", fmt.Sprint(used+1<<20)) // room for about 2,500 sessions: the flood's 5,000 would fill it
			unreachable := []int{unreachableLogs(rs[0]), unreachableLogs(rs[1]), unreachableLogs(rs[2])}
			defer srv.Do("CONFIG", "SET", "maxmemory", "0")
			stop := make(chan struct{})
			loadDone := make(chan *troubleLoad)
			go func() { loadDone <- runLiveLoad(t, rs, live, stop) }()
			res := flood(rs[0].addr, "/flood/mcp", floodSize, 8, "", nil)
			close(stop)
			load := <-loadDone
			sessionKeys := srv.Do("EVAL", "return #redis.call('KEYS', ARGV[1])", "0", "caddy-mcp:fl:s:*")
			peak := srv.Info("memory", "used_memory_peak")
			t.Logf("%s: flood of %d in %s (%d learned, %d failed); Redis then holds %s session keys, used_memory %s -> peak %s (maxmemory +1 MiB); live load: %d requests, %d failed, %d 5xx",
				policy, floodSize, res.took.Round(time.Millisecond), res.learned, res.failed, sessionKeys, base, peak, load.requests, len(load.failures), load.fiveXX)
			if load.fiveXX != 0 || len(load.failures) != 0 {
				t.Errorf("%s: live sessions failed during the flood: %v", policy, load.failures)
			}
			for i, r := range rs {
				if n := unreachableLogs(r) - unreachable[i]; n != 0 {
					t.Errorf("%s: %s took Redis for unreachable %d times during the flood", policy, r.name, n)
				}
			}
			var keys int
			fmt.Sscan(sessionKeys, &keys)
			if keys > 3*maxSessions+len(live) {
				t.Errorf("%s: Redis holds %d session keys after the flood; want at most the tables' bounds, %d", policy, keys, 3*maxSessions+len(live))
			}
			for _, id := range live {
				for _, r := range rs {
					if ex := sessionCall(t, hc, tableURL(r, "fl"), id); ex.status != http.StatusOK {
						t.Errorf("%s: a live session is %d on %s after the flood", policy, ex.status, r.name)
					}
				}
			}
			for i := range 6 {
				id := rawSession(t, hc, tableURL(rs[i%3], "fl"))
				if ex := sessionCall(t, hc, tableURL(rs[(i+1)%3], "fl"), id); ex.status != http.StatusOK {
					t.Errorf("%s: a session opened after the flood is %d on another replica", policy, ex.status)
				}
			}
		})
	}
}

// runLiveLoad calls each of ids through random replicas until stop closes.
func runLiveLoad(t *testing.T, rs []*replica, ids []string, stop <-chan struct{}) *troubleLoad {
	l := &troubleLoad{learned: map[string]*replica{}}
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	var wg sync.WaitGroup
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for i, id := range ids {
		wg.Go(func() {
			for !stopped() {
				r := rs[(i+int(time.Now().UnixNano()))%len(rs)]
				ex, took := timedCall(t, hc, tableURL(r, "fl"), id)
				l.note(ex, took, "a live session through "+r.name)
				time.Sleep(300 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return l
}

// TestReplicasRedisEvicts: a Redis with maxmemory and volatile-lru (the
// default of managed services) that another application fills evicts live
// sessions; the replica that learned each one writes it back, so that 2 s
// after the other application stops, every live session works on every
// replica, including those that had never seen it. The control, same run:
// how many live sessions Redis had evicted (before, a replica that had not
// seen them answered them 404 for about a minute).
func TestReplicasRedisEvicts(t *testing.T) {
	t.Parallel()
	f := startSharedFleet(t)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	live := map[string]*replica{}
	for i := range 30 {
		live[rawSession(t, hc, tableURL(f.rs[i%3], "shared"))] = f.rs[i%3]
	}
	time.Sleep(1200 * time.Millisecond) // a sync: every replica knows evicted_keys
	var used int64
	fmt.Sscan(f.redis.Info("memory", "used_memory"), &used)
	f.redis.Do("CONFIG", "SET", "maxmemory", fmt.Sprint(used+256<<10))
	f.redis.Do("CONFIG", "SET", "maxmemory-policy", "volatile-lru")
	evictedBefore := f.redis.Info("stats", "evicted_keys")
	value := strings.Repeat("v", 1024)
	for i := range 3000 { // the other application: cache entries with a TTL
		f.redis.Do("SET", fmt.Sprintf("other:%d", i), value, "EX", "3600")
	}
	f.redis.Do("CONFIG", "SET", "maxmemory", "0")
	stopped := time.Now()
	t.Logf("Redis evicted %s keys (from %s) while the other application wrote 3,000", f.redis.Info("stats", "evicted_keys"), evictedBefore)
	time.Sleep(2 * time.Second)
	failed := 0
	for id, learner := range live {
		for _, r := range f.rs {
			if ex := sessionCall(t, hc, tableURL(r, "shared"), id); ex.status != http.StatusOK {
				failed++
				t.Errorf("%s after the evictions, a session %s learned is %d on %s", time.Since(stopped).Round(100*time.Millisecond), learner.name, ex.status, r.name)
			}
		}
	}
	wb := metricSum(t, f.rs, "caddy_mcp_store_write_backs_total", map[string]string{"table": "shared", "cause": "eviction"})
	restored := metricSum(t, f.rs, "caddy_mcp_store_sessions_restored_total", map[string]string{"table": "shared"})
	t.Logf("eviction write-backs on 3 replicas: %.0f, sessions restored: %.0f; live sessions failing on some replica 2 s later: %d of 90 calls", wb, restored, failed)
	if restored == 0 {
		t.Errorf("no session restored: Redis evicted none of the live sessions, and the test shows nothing")
	}
}
