package tests

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
)

// TestReplicasRedisCluster: three Caddy replicas share a Redis Cluster of
// three masters with a replica each. Under load, no replica takes the
// cluster for restarted (each master's run_id is compared with its own:
// before, the once-a-second INFO reached a random node and every replica
// wrote its table back 8–11 times a run), and the sessions' keys lie on
// every master (each hashes on its own tag). Two slots move to another
// master under load: one holding sessions, and the table's, which holds
// the upstreams' sets and flags. Then the master of the table's slot is
// killed (SIGKILL): sessions every replica had seen, called through
// random replicas, and sessions learned meanwhile, used on their replica,
// lose no call and get no 5xx; afterwards drains, evictions and live
// counts work across the replicas.
func TestReplicasRedisCluster(t *testing.T) {
	t.Parallel()
	nodes := redistest.StartCluster(t, 3, 1)
	masters := make([]string, 3)
	for i, n := range nodes[:3] {
		masters[i] = n.Addr
	}
	rs, bs, hc, known := sharedStoreReplicas(t, "address "+strings.Join(masters, " "))
	writeBacks := func() float64 {
		return metricSum(t, rs, "caddy_mcp_store_write_backs_total", map[string]string{"table": "shared"})
	}

	steady := runTroubleLoad(t, rs, known, 5*time.Second)
	wb := writeBacks()
	t.Logf("steady cluster, 5 s of load: %d requests, %d failed, %d 5xx; write-backs of the table on 3 replicas: %.0f",
		steady.requests, len(steady.failures), steady.fiveXX, wb)
	if wb != 0 || len(steady.failures) != 0 || steady.fiveXX != 0 {
		t.Errorf("a steady cluster: %.0f write-backs (want 0), failures %v", wb, steady.failures)
	}
	perNode := make([]int, 3)
	total, sessionKey := 0, ""
	for i, n := range nodes[:3] {
		keys := n.Keys("caddy-mcp:shared:s:*")
		perNode[i] = len(keys)
		total += len(keys)
		if sessionKey == "" && len(keys) > 0 {
			sessionKey = keys[0]
		}
	}
	t.Logf("session keys per master: %v of %d", perNode, total)
	for i, n := range perNode {
		if n == 0 || n > total*2/3 {
			t.Errorf("master %s holds %d of the %d session keys; want them spread over the masters", nodes[i].Addr, n, total)
		}
	}
	if sessionKey == "" {
		t.Fatal("no master holds a session key")
	}
	bucketKey := ""
	for _, n := range nodes[:3] {
		if keys := n.Keys("{caddy-mcp:shared:*}:u:*"); len(keys) > 0 {
			bucketKey = keys[0]
			break
		}
	}
	if bucketKey == "" {
		t.Fatal("no master holds a bucket of an upstream's sessions")
	}

	// Three slots move to another master under load: a session's, a bucket
	// of an upstream's sessions, then the table's.
	migrated := make(chan *troubleLoad)
	go func() { migrated <- runTroubleLoad(t, rs, known, 8*time.Second) }()
	time.Sleep(time.Second)
	var owner, target *redistest.Server
	for _, key := range []string{sessionKey, bucketKey, "{caddy-mcp:shared}"} {
		owner = redistest.SlotOwner(t, nodes, key)
		if owner == nil {
			t.Fatalf("no master owns the slot of %s", key)
		}
		target = nodes[0]
		if owner == target {
			target = nodes[1]
		}
		moved := redistest.MigrateSlot(t, nodes, key, target, 5, 100*time.Millisecond)
		t.Logf("slot of %s: %d keys moved from %s to %s, 5 keys every 100 ms, under load", key, moved, owner.Addr, target.Addr)
	}
	mload := <-migrated
	t.Logf("load during the slot migrations: %d requests, %d failed (%v), %d 5xx, slowest %s",
		mload.requests, len(mload.failures), mload.failures, mload.fiveXX, mload.slowest.Round(time.Millisecond))
	if mload.fiveXX != 0 || len(mload.failures) != 0 {
		t.Errorf("requests failed during the slot migration: %v", mload.failures)
	}
	for id, learner := range mload.learned {
		for _, r := range rs {
			if ex := sessionCall(t, hc, tableURL(r, "shared"), id); ex.status != http.StatusOK {
				t.Errorf("a session %s learned during the slot migration is %d on %s afterwards", learner.name, ex.status, r.name)
			}
		}
	}
	t.Logf("store errors during the migration: %.0f", metricSum(t, rs, "caddy_mcp_store_errors_total", map[string]string{"table": "shared"}))

	owner = redistest.SlotOwner(t, nodes, "{caddy-mcp:shared}")
	if owner != target {
		t.Fatalf("the slot is on %v after the migration, want %s", owner, target.Addr)
	}
	loadDone := make(chan *troubleLoad)
	go func() { loadDone <- runTroubleLoad(t, rs, known, 10*time.Second) }()
	time.Sleep(time.Second)
	owner.Stop() // SIGKILL
	killed := time.Now()
	written := time.Duration(0)
	for time.Since(killed) < 30*time.Second {
		id := rawSession(t, hc, tableURL(rs[0], "shared"))
		if ex := sessionCall(t, hc, tableURL(rs[1], "shared"), id); ex.status == http.StatusOK {
			written = time.Since(killed)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	load := <-loadDone
	t.Logf("killed %s, the master of the table's slot: a new session of c1 was found through c2 %s after the kill; load: %d requests, %d failed (%v), %d 5xx, slowest %s",
		owner.Addr, written.Round(10*time.Millisecond), load.requests, len(load.failures), load.failures, load.fiveXX, load.slowest.Round(time.Millisecond))
	if written == 0 {
		t.Fatalf("no new session reached the cluster within 30 s of the failover")
	}
	if load.fiveXX != 0 || len(load.failures) != 0 {
		t.Errorf("requests failed across the cluster failover: %v", load.failures)
	}
	for id, learner := range load.learned {
		for _, r := range rs {
			if ex := sessionCall(t, hc, tableURL(r, "shared"), id); ex.status != http.StatusOK {
				t.Errorf("a session %s learned during the failover is %d on %s afterwards", learner.name, ex.status, r.name)
			}
		}
	}
	t.Logf("write-backs after the failover: %.0f on 3 replicas", writeBacks())
	afterFailover(t, rs, bs[0].Addr())
}
