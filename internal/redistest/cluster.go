package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/redis/go-redis/v9"
)

// ClusterNodeTimeout is the cluster-node-timeout of StartCluster's nodes,
// in milliseconds: how long a master may not answer before its replica
// takes over.
const ClusterNodeTimeout = 1000

// StartCluster starts a Redis Cluster of masters masters with replicas
// replicas each (redis-server --cluster-enabled yes, joined by redis-cli
// --cluster create), and waits until every node reports cluster_state:ok.
// It returns the nodes, masters first as created; each is killed when the
// test ends.
func StartCluster(t testing.TB, masters, replicas int) []*Server {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		if os.Getenv("MCP_INTEROP_REQUIRED") == "1" {
			t.Fatalf("redis-cli is not installed (.ci/install-deps installs redis-tools): %v", err)
		}
		t.Skipf("redis-cli is not installed: %v", err)
	}
	nodes := make([]*Server, masters*(1+replicas))
	addrs := make([]string, len(nodes))
	for i := range nodes {
		nodes[i] = startWith(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.Itoa(ClusterNodeTimeout))
		addrs[i] = nodes[i].Addr
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	if !testproc.Until(30*time.Second, func() bool {
		for _, n := range nodes {
			if n.Info("cluster", "cluster_enabled") != "1" || clusterState(n) != "ok" {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the cluster is not ok within 30 s")
	}
	return nodes
}

// clusterState returns the node's cluster_state (CLUSTER INFO).
func clusterState(s *Server) string {
	out, err := exec.Command("redis-cli", "-u", "redis://"+s.Addr, "cluster", "info").Output()
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "cluster_state:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// SlotOwner returns the node of nodes that is the master of key's slot,
// as node answers (nil when none is).
func SlotOwner(t testing.TB, nodes []*Server, key string) *Server {
	t.Helper()
	slot := nodes[0].Do("CLUSTER", "KEYSLOT", key)
	for _, n := range nodes {
		out, err := exec.Command("redis-cli", "-u", "redis://"+n.Addr, "cluster", "nodes").Output()
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 9 || !strings.Contains(f[2], "myself") || !strings.Contains(f[2], "master") {
				continue
			}
			s, _ := strconv.Atoi(slot)
			for _, r := range f[8:] {
				lo, hi, _ := strings.Cut(r, "-")
				a, _ := strconv.Atoi(lo)
				b := a
				if hi != "" {
					b, _ = strconv.Atoi(hi)
				}
				if s >= a && s <= b {
					return n
				}
			}
		}
	}
	return nil
}

// Role returns the node's role, "master" or "slave" ("" when it does not
// answer).
func (s *Server) Role() string { return s.Info("replication", "role") }

// String names the server by its address.
func (s *Server) String() string { return fmt.Sprintf("redis %s", s.Addr) }

// MigrateSlot moves the slot of key from its master to the master to,
// as redis-cli --cluster reshard does (SETSLOT IMPORTING and MIGRATING,
// MIGRATE of batch keys at a time with pause between batches, SETSLOT
// NODE on every master), and returns how many keys it moved.
func MigrateSlot(t testing.TB, nodes []*Server, key string, to *Server, batch int, pause time.Duration) int {
	t.Helper()
	ctx := context.Background()
	from := SlotOwner(t, nodes, key)
	if from == nil || from == to {
		t.Fatalf("the slot of %s is on %v, not to be moved to %s", key, from, to.Addr)
	}
	src, dst := redis.NewClient(&redis.Options{Addr: from.Addr}), redis.NewClient(&redis.Options{Addr: to.Addr})
	defer src.Close()
	defer dst.Close()
	slot, err := src.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	srcID, dstID := src.ClusterMyID(ctx).Val(), dst.ClusterMyID(ctx).Val()
	must := func(c *redis.Client, args ...any) {
		if err := c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v on %s: %v", args, c.Options().Addr, err)
		}
	}
	must(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID)
	must(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID)
	host, port, _ := net.SplitHostPort(to.Addr)
	moved := 0
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, int(slot), batch).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "REPLACE", "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		must(src, args...)
		moved += len(keys)
		time.Sleep(pause)
	}
	for _, n := range nodes {
		if n.Role() != "master" {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: n.Addr})
		must(c, "CLUSTER", "SETSLOT", slot, "NODE", dstID)
		c.Close()
	}
	return moved
}
