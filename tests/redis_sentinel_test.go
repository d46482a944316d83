package tests

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
)

// TestReplicasRedisSentinelFailover: three Caddy replicas share a Redis
// run by Sentinel (one master, one replica, three Sentinels), under load;
// the master is killed (SIGKILL). Sessions every replica had seen, called
// through random replicas, and sessions learned meanwhile, used on their
// replica, lose no call and get no 5xx; sessions learned during the
// failover and sent at once to another replica are measured (they fail
// until Redis has them, as in any outage). Measured too: when Sentinel
// promoted the replica and when each Caddy replica's writes reached it;
// then drains, evictions and live counts work across the replicas on the
// new master.
func TestReplicasRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	master, standby := redistest.Start(t), redistest.Start(t)
	standby.ReplicaOf(master)
	sentinels := redistest.StartSentinels(t, master, "mymaster", 3)
	if !waitFor(30*time.Second, func() bool {
		for _, s := range sentinels {
			if !s.Ready("mymaster", 1, 2) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the Sentinels do not know the replica and each other within 30 s")
	}
	addrs := make([]string, len(sentinels))
	for i, s := range sentinels {
		addrs[i] = s.Addr
	}
	rs, bs, hc, known := sharedStoreReplicas(t, "address "+strings.Join(addrs, " ")+"\n\t\t\tmaster_name mymaster")
	churn := startChurn(t, rs, "shared", 6)
	loadDone := make(chan *troubleLoad)
	go func() { loadDone <- runTroubleLoad(t, rs, known, 10*time.Second) }()
	time.Sleep(2 * time.Second)
	recent := make([]string, 6) // learned right before the kill: perhaps not yet replicated
	for i := range recent {
		recent[i] = rawSession(t, hc, tableURL(rs[i%3], "shared"))
	}
	master.Stop() // SIGKILL
	killed := time.Now()

	promoted := time.Duration(0)
	written := make([]time.Duration, len(rs))
	for time.Since(killed) < 30*time.Second {
		if promoted == 0 && sentinels[0].Master("mymaster") == standby.Addr {
			promoted = time.Since(killed)
		}
		done := true
		for i, r := range rs {
			if written[i] != 0 {
				continue
			}
			done = false
			id := rawSession(t, hc, tableURL(r, "shared"))
			if ex := sessionCall(t, hc, tableURL(rs[(i+1)%3], "shared"), id); ex.status == http.StatusOK {
				written[i] = time.Since(killed)
			}
		}
		if done && promoted != 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	load := <-loadDone
	res := churn.stop()
	t.Logf("Sentinel promoted the replica %s after the kill; a new session of c1, c2, c3 was found by another replica %v after it",
		promoted.Round(10*time.Millisecond), roundAll(written))
	t.Logf("sessions every replica had seen, through random replicas, and sessions learned meanwhile on their replica: %d requests, %d failed (%v), %d 5xx, slowest %s",
		load.requests, len(load.failures), load.failures, load.fiveXX, load.slowest.Round(time.Millisecond))
	t.Logf("new sessions, every call through a random replica (6 at a time): %s; %d answers 5xx", res, len(churn.lb.serverErrors()))
	if load.fiveXX != 0 || len(load.failures) != 0 {
		t.Errorf("requests failed across the failover: %v", load.failures)
	}
	for id, learner := range load.learned {
		for _, r := range rs {
			if ex := sessionCall(t, hc, tableURL(r, "shared"), id); ex.status != http.StatusOK {
				t.Errorf("a session %s learned during the failover is %d on %s afterwards", learner.name, ex.status, r.name)
			}
		}
	}
	if promoted == 0 {
		t.Fatalf("Sentinel did not promote the replica within 30 s")
	}
	for i, d := range written {
		if d == 0 {
			t.Errorf("%s's new sessions did not reach the new master within 30 s", rs[i].name)
		}
	}
	if res.misrouted != 0 {
		t.Errorf("%d calls misrouted: %v", res.misrouted, res.first)
	}
	if errs := churn.lb.serverErrors(); len(errs) != 0 {
		t.Errorf("%d answers 5xx: %v", len(errs), errs)
	}
	for _, id := range recent {
		for _, r := range rs {
			if ex := sessionCall(t, hc, tableURL(r, "shared"), id); ex.status != http.StatusOK {
				t.Errorf("a session learned right before the kill is %d on %s after the failover", ex.status, r.name)
			}
		}
	}
	restarts := metricSum(t, rs, "caddy_mcp_store_write_backs_total", map[string]string{"table": "shared", "cause": "restart"})
	restored := metricSum(t, rs, "caddy_mcp_store_sessions_restored_total", map[string]string{"table": "shared"})
	t.Logf("write-backs for the new run_id: %.0f on 3 replicas, %.0f sessions the new master lacked", restarts, restored)
	if restarts < 3 {
		t.Errorf("want every replica to write back after the promotion; %.0f write-backs", restarts)
	}
	afterFailover(t, rs, bs[0].Addr())
}

// afterFailover checks that the replicas still share drains, ends and live
// counts through Redis: drained through c2, seen by all; a session
// evicted on c1 is the proxy's 404 on c2 and c3; every replica counts the
// same live sessions per upstream.
func afterFailover(t *testing.T, rs []*replica, drained string) {
	t.Helper()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	if st, err := adminDoAt(rs[1].admin, http.MethodPost, "/mcp_sessions/drain", map[string]string{"table": "shared", "upstream": drained}, nil); st != 200 {
		t.Fatalf("drain: %d %v", st, err)
	}
	for _, r := range rs {
		if !waitFor(3*time.Second, func() bool { _, _, d := clusterView(t, r, "shared"); return d[drained] }) {
			t.Errorf("after the failover, %s does not drain %s 3 s after c2 drained it", r.name, drained)
		}
	}
	id := rawSession(t, hc, tableURL(rs[0], "shared"))
	for _, r := range rs[1:] {
		if ex := sessionCall(t, hc, tableURL(r, "shared"), id); ex.status != http.StatusOK {
			t.Fatalf("after the failover, a session of c1 is %d on %s", ex.status, r.name)
		}
	}
	if st, err := adminDoAt(rs[0].admin, http.MethodPost, "/mcp_sessions/evict", map[string]string{"table": "shared", "session_id": id}, nil); st != 200 {
		t.Fatalf("admin evict: %d %v", st, err)
	}
	for _, r := range rs[1:] {
		if !waitFor(2*time.Second, func() bool { return isProxy404(sessionCall(t, hc, tableURL(r, "shared"), id)) }) {
			t.Errorf("after the failover, a session evicted on c1 is not the proxy's 404 on %s", r.name)
		}
	}
	var views []string
	agree := waitFor(5*time.Second, func() bool {
		views = views[:0]
		for _, r := range rs {
			cluster, _, _ := clusterView(t, r, "shared")
			views = append(views, fmt.Sprint(cluster))
		}
		return views[0] == views[1] && views[1] == views[2]
	})
	t.Logf("after the failover, live sessions per upstream on every replica: %v", views)
	if !agree {
		t.Errorf("the replicas count different live sessions per upstream: %v", views)
	}
}

// roundAll rounds each duration to 10 ms.
func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(10 * time.Millisecond)
	}
	return out
}
