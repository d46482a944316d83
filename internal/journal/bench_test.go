package journal

import (
	"context"
	"fmt"
	"regexp"
	"runtime"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
)

// callEvents are the SSE blocks of one tool call as go-sdk writes them: 10
// progress notifications and the result.
func callEvents() [][]byte {
	var out [][]byte
	for i := 1; i <= 10; i++ {
		out = append(out, fmt.Appendf(nil, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"message\":\"step %d of 10\",\"progress\":%d,\"progressToken\":\"p1\",\"total\":10}}\n\n", i, i))
	}
	return append(out, []byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"done\"}]}}\n\n"))
}

// BenchmarkMemoryPerSession: the heap a session's journal costs in the
// in-memory journal at the default limits, for a session that made one
// tool call of 10 progress notifications and a result (11 events) and one
// that made 100 such calls within the window.
func BenchmarkMemoryPerSession(b *testing.B) {
	for _, calls := range []int{1, 100} {
		b.Run(fmt.Sprintf("calls=%d", calls), func(b *testing.B) {
			const sessions = 2000
			evs := callEvents()
			ctx := context.Background()
			for range b.N {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				m := NewMemory(Limits{})
				for s := range sessions {
					session := fmt.Sprintf("session-%06d", s)
					for c := range calls {
						stream := fmt.Sprintf("%016x", c)
						for i, blk := range evs {
							_ = m.Append(ctx, session, stream, Event{Seq: uint64(i + 1), Block: blk})
						}
						_ = m.End(ctx, session, stream)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/sessions, "heap-B/session")
				b.ReportMetric(float64(m.Stats().Bytes)/sessions, "counted-B/session")
				runtime.KeepAlive(m)
			}
		})
	}
}

// BenchmarkRedisPerEvent: what an event costs in Redis: memory (INFO
// memory's used_memory) and commands (INFO commandstats), for calls of 10
// progress notifications and a result.
func BenchmarkRedisPerEvent(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	j := NewRedis(c, "{t}:j:", func(s string) string { return "{t}:j:h" + s }, Limits{}, 0)
	j.timeout = 5e9
	evs := callEvents()
	ctx := context.Background()
	const sessions, calls = 200, 10
	for range b.N {
		_ = c.FlushAll(ctx).Err()
		mem0, cmds0 := redisMemory(b, c), redisCommands(b, c)
		for s := range sessions {
			session := fmt.Sprintf("session-%06d", s)
			for k := range calls {
				stream := fmt.Sprintf("%016x", k)
				for i, blk := range evs {
					_ = j.Append(ctx, session, stream, Event{Seq: uint64(i + 1), Block: blk})
				}
				_ = j.End(ctx, session, stream)
			}
		}
		events := float64(sessions * calls * len(evs))
		cmds, mem := redisCommands(b, c)-cmds0, redisMemory(b, c)-mem0
		b.ReportMetric(float64(mem)/events, "redis-B/event")
		b.ReportMetric(float64(cmds)/events, "commands/event")
		b.ReportMetric(float64(mem)/sessions, "redis-B/session")
	}
}

var usedMemory = regexp.MustCompile(`used_memory:(\d+)`)

// redisMemory returns the server's used_memory.
func redisMemory(b *testing.B, c *redis.Client) int64 {
	m := usedMemory.FindStringSubmatch(c.Info(context.Background(), "memory").Val())
	if m == nil {
		b.Fatal("INFO memory: no used_memory")
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

var commandCalls = regexp.MustCompile(`cmdstat_([a-z|]+):calls=(\d+)`)

// redisCommands returns the commands the server has run but INFO and
// FLUSHALL.
func redisCommands(b *testing.B, c *redis.Client) int64 {
	var n int64
	for _, m := range commandCalls.FindAllStringSubmatch(c.Info(context.Background(), "commandstats").Val(), -1) {
		if m[1] != "info" && m[1] != "flushall" {
			v, _ := strconv.ParseInt(m[2], 10, 64)
			n += v
		}
	}
	return n
}
