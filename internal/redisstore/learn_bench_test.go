package redisstore

import (
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// BenchmarkLearnShared learns sessions through one instance's table into
// Redis: one standalone server against a cluster of three masters. It
// reports the sessions learned per second (each Put waits for Redis) and
// Redis's memory per session (used_memory growth over every master,
// divided by the sessions), and the share of that growth on the master
// that grew most: each session's keys hash on their own tag, and the
// upstream's set is split in buckets spread over the slots (buckets.go),
// so on a cluster of three it is about a third. The -16-writers variants
// learn from 16 goroutines at once.
//
//	go test -run '^$' -bench LearnShared -benchtime 20000x ./internal/redisstore
func BenchmarkLearnShared(b *testing.B) {
	for _, v := range []struct {
		suffix   string
		failover bool // each value carries its sealed initialize
		writers  int
	}{{"", false, 1}, {"-failover", true, 1}, {"-16-writers", false, 16}} {
		b.Run("standalone"+v.suffix, func(b *testing.B) {
			srv := redistest.Start(b)
			benchLearn(b, []*redistest.Server{srv}, []string{srv.Addr}, v.failover, v.writers)
		})
		b.Run("cluster-3-masters"+v.suffix, func(b *testing.B) {
			nodes := redistest.StartCluster(b, 3, 0)
			addrs := make([]string, len(nodes))
			for i, n := range nodes {
				addrs[i] = n.Addr
			}
			benchLearn(b, nodes, addrs, v.failover, v.writers)
		})
	}
}

// benchInit is the initialize a failover record keeps: a typical client's.
var benchInit = &session.Init{UpstreamID: "5f2b9c4e-8a1d-4e6f-9b3a-7c2d1e0f4a6b", Accept: "application/json, text/event-stream",
	ContentType: "application/json", Version: "2025-06-18",
	Body: []byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1.0.0"}}}`)}

func benchLearn(b *testing.B, masters []*redistest.Server, addrs []string, failover bool, writers int) {
	tbl, err := session.NewTable("bench", max(b.N, 1), time.Hour, nil)
	if err != nil {
		b.Fatal(err)
	}
	opts := &redis.UniversalOptions{Addrs: addrs, IsClusterMode: len(addrs) > 1, DialTimeout: time.Second,
		ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: -1, MinIdleConns: 2, ContextTimeoutEnabled: true}
	c := New(tbl, opts, "caddy-mcp", "bench", []byte(testHashKey), time.Second, zap.NewNop())
	b.Cleanup(func() { _ = c.Destruct() })
	tbl.SetStore(c)
	time.Sleep(1200 * time.Millisecond) // the first sync: the marker, the hash_key's record
	used := func() []int64 {
		out := make([]int64, len(masters))
		for i, m := range masters {
			out[i], _ = strconv.ParseInt(m.Info("memory", "used_memory"), 10, 64)
		}
		return out
	}
	before := used()
	b.ResetTimer()
	if failover {
		tbl.SetFailover(session.FailoverReinitialize, 0)
	}
	learn := func(i int64) {
		id := fmt.Sprintf("bench-session-%08d", i)
		if failover {
			tbl.LearnInit(id, "10.0.0.1:80", session.Origin{}, benchInit)
		} else {
			tbl.Learn(id, "10.0.0.1:80")
		}
	}
	if writers == 1 {
		for i := range b.N {
			learn(int64(i))
		}
	} else {
		var next atomic.Int64
		b.SetParallelism(max(writers/runtime.GOMAXPROCS(0), 1))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				learn(next.Add(1))
			}
		})
	}
	b.StopTimer()
	after := used()
	var grew, most int64
	for i := range after {
		d := after[i] - before[i]
		grew += d
		most = max(most, d)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "sessions/s")
	b.ReportMetric(float64(grew)/float64(b.N), "redis-bytes/session")
	b.ReportMetric(float64(most)/float64(grew), "share-on-one-master")
}
