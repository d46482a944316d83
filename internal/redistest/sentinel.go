package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/redis/go-redis/v9"
)

// Sentinel is a Redis Sentinel process (redis-server --sentinel) started by
// a test, monitoring one master.
type Sentinel struct {
	// Addr is the Sentinel's host:port.
	Addr string
	proc *testproc.Proc
}

// SentinelDownAfter is how long, in milliseconds, the Sentinels of
// StartSentinels wait before they take an unanswering master for down.
const SentinelDownAfter = 1000

// StartSentinels starts n Sentinels on free ports of 127.0.0.1, monitoring
// master under name with a quorum of n/2+1, which take the master for down
// after SentinelDownAfter ms; each is killed when the test ends.
func StartSentinels(t testing.TB, master *Server, name string, n int) []*Sentinel {
	t.Helper()
	host, port, _ := net.SplitHostPort(master.Addr)
	out := make([]*Sentinel, 0, n)
	for i := range n {
		p, err := testproc.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nloglevel warning\n"+
			"sentinel monitor %s %s %s %d\nsentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s 10000\nsentinel parallel-syncs %s 1\n",
			p, dir, name, host, port, n/2+1, name, SentinelDownAfter, name, name)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		addr := "127.0.0.1:" + strconv.Itoa(p)
		proc, err := testproc.Start(fmt.Sprintf("sentinel%d", i+1), addr, exec.Command("redis-server", conf, "--sentinel"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := proc.Wait(startTimeout, testproc.Listening()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(proc.Kill)
		out = append(out, &Sentinel{Addr: addr, proc: proc})
	}
	return out
}

// Master returns the address of the master the Sentinel names for name
// ("" when it does not answer).
func (s *Sentinel) Master(name string) string {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	hp, err := c.GetMasterAddrByName(ctx, name).Result()
	if err != nil || len(hp) != 2 {
		return ""
	}
	return net.JoinHostPort(hp[0], hp[1])
}

// Ready reports whether the Sentinel knows at least replicas replicas of
// name's master and sentinels other Sentinels: what a failover needs.
func (s *Sentinel) Ready(name string, replicas, sentinels int) bool {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rs, err := c.Replicas(ctx, name).Result()
	if err != nil || len(rs) < replicas {
		return false
	}
	ss, err := c.Sentinels(ctx, name).Result()
	return err == nil && len(ss) >= sentinels
}

// Kill kills the Sentinel.
func (s *Sentinel) Kill() { s.proc.Kill() }
