package tests

import (
	"net/http"
	"slices"
	"testing"
	"time"
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
