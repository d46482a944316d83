package caddymodule

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

// BenchmarkStoreDecision is the pinned-request lookup of a session this
// instance has seen, among 1,000, with the memory store and with the redis
// store: the redis store must add no round trip and next to no cost.
func BenchmarkStoreDecision(b *testing.B) {
	srv := redistest.Start(b)
	for _, store := range []string{"memory", "redis"} {
		b.Run(store, func(b *testing.B) {
			tbl, err := NewTable("bench-decision-"+store, 1<<20, time.Hour, nil)
			if err != nil {
				b.Fatal(err)
			}
			if store == "redis" {
				tbl = sharedTable(b, srv.Addr, "bench-decision", time.Second)
			}
			ids := make([]string, 1000)
			sessionIDs(ids)
			pool := testPool()
			for i, id := range ids {
				tbl.Learn(id, pool[i%len(pool)].Dial)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if tbl.Lookup(ids[i%len(ids)]) == nil {
					b.Fatal("lost a session")
				}
			}
		})
	}
}

// BenchmarkFirstRequestElsewhere is the lookup of a session another
// instance learned, at the first request this instance sees of it: one
// round trip to Redis (on loopback here). It reports the latency's p50 and
// p99 in microseconds.
func BenchmarkFirstRequestElsewhere(b *testing.B) {
	srv := redistest.Start(b)
	learner := sharedTable(b, srv.Addr, "bench-elsewhere", time.Second)
	other := sharedTable(b, srv.Addr, "bench-elsewhere", time.Second)
	ids := make([]string, min(b.N, 20_000)) // each learn is a round trip too
	sessionIDs(ids)
	for _, id := range ids {
		learner.Learn(id, "10.0.0.1:8080")
	}
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		if i > 0 && i%len(ids) == 0 { // every session seen: forget them here, not in Redis
			b.StopTimer()
			other.Purge()
			b.StartTimer()
		}
		start := time.Now()
		if other.Lookup(ids[i%len(ids)]) == nil {
			b.Fatal("the other instance did not find the session")
		}
		lat[i] = time.Since(start)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// BenchmarkRedisBytesPerSession measures what a session costs in Redis:
// used_memory after learning 20,000 sessions of go-sdk-shaped IDs over 3
// upstreams, less before, per session. Run it with -benchtime 1x.
func BenchmarkRedisBytesPerSession(b *testing.B) { benchRedisBytes(b, nil) }

// BenchmarkRedisBytesPerSessionFailover is BenchmarkRedisBytesPerSession
// for a table with failover reinitialize: each session's value carries its
// failover record, here the go-sdk client's 190-byte initialize.
func BenchmarkRedisBytesPerSessionFailover(b *testing.B) {
	benchRedisBytes(b, &session.Init{Body: []byte(testInitBody), Accept: "application/json, text/event-stream", ContentType: "application/json"})
}

func benchRedisBytes(b *testing.B, init *session.Init) {
	srv := redistest.Start(b)
	tbl := sharedTable(b, srv.Addr, "default", time.Second)
	if init != nil {
		tbl.SetFailover(session.FailoverReinitialize, 0)
	}
	before := usedMemory(b, srv.Addr)
	const n = 20_000
	ids := make([]string, n)
	sessionIDs(ids)
	pool := testPool()
	b.ResetTimer()
	for i, id := range ids {
		tbl.LearnInit(id, pool[i%len(pool)].Dial, session.Origin{}, init)
	}
	b.StopTimer()
	b.ReportMetric(float64(usedMemory(b, srv.Addr)-before)/n, "B/session")
	b.ReportMetric(0, "ns/op")
}

// usedMemory returns Redis's used_memory, in bytes.
func usedMemory(b *testing.B, addr string) int64 {
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	info, err := rc.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	b.Fatal("no used_memory in INFO memory")
	return 0
}
