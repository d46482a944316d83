package caddymodule

import (
	"crypto/rand"
	mrand "math/rand/v2"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// benchSessions is how many live sessions the benchmarks hold.
const benchSessions = 1_000_000

// sessionIDs fills ids with IDs shaped like the MCP go-sdk's: 26 characters
// of uppercase base32 (crypto/rand.Text).
func sessionIDs(ids []string) {
	for i := range ids {
		ids[i] = rand.Text()
	}
}

// benchTable is a table of benchSessions live sessions spread over the
// three upstreams of pool, built once for all benchmarks. It reads the real
// clock, as a table in Caddy does (one monotonic clock read per lookup).
var benchTable = sync.OnceValues(func() (*session.Table, []string) {
	ids := make([]string, benchSessions)
	sessionIDs(ids)
	tbl, err := NewTable("bench", benchSessions, session.DefaultSessionTTL, nil)
	if err != nil {
		panic(err)
	}
	pool := testPool()
	for i, id := range ids {
		tbl.Learn(id, pool[i%len(pool)].Dial)
	}
	return tbl, ids
})

// inUse makes every session of tbl a session in use, with the timer
// stopped: used twice in the current touch interval, as a session is that
// sends requests more often than that. The first use confirms a session;
// the second records the interval, after which a lookup only reads. It
// then holds that state past the end of the interval (1 min at the default
// TTL): a run that crossed it would see each of a million sessions record
// its next use, the once-a-minute write of a session in use all at once.
func inUse(b *testing.B, tbl *session.Table, ids []string) {
	b.StopTimer()
	defer b.StartTimer()
	for range 2 {
		for _, id := range ids {
			if tbl.Lookup(id) == nil {
				b.Fatal("session not found")
			}
		}
	}
	tbl.HoldUses(ids)
}

// benchPolicy returns a provisioned mcp_session policy with the default fallback.
func benchPolicy(b *testing.B) *SessionSelection {
	ctx := newContext(b)
	s := new(SessionSelection)
	if err := s.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	return s
}

// pinnedDecision is what a pinned request costs the plugin before
// reverse_proxy dials: the handler's table lookup, then the policy's
// selection of the pinned upstream from the pool.
func pinnedDecision(tbl *session.Table, s *SessionSelection, pool reverseproxy.UpstreamPool, r *http.Request, id string) *reverseproxy.Upstream {
	up := tbl.Lookup(id)
	if up == nil {
		return nil
	}
	exchangeOf(r).owner = up
	return s.Select(pool, r, nil)
}

// BenchmarkPinnedLookup measures the decision for a request of a random
// session in use among 1,000,000 (see inUse): Lookup alone, and Lookup
// plus the policy's Select over a pool of 3. At this size every lookup
// misses the CPU caches several times (map group, key, list element);
// "lookup-active1k" draws from 1,000 sessions only, a working set that
// stays cached, and "map-baseline" is a bare map[string]*Upstream lookup of
// the same random IDs, the floor any hash table of this size pays.
func BenchmarkPinnedLookup(b *testing.B) {
	tbl, ids := benchTable()
	pool := testPool()
	s := benchPolicy(b)
	b.Run("map-baseline", func(b *testing.B) {
		m := make(map[string]*session.Upstream, len(ids))
		for _, id := range ids {
			m[id] = &session.Upstream{}
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if m[ids[mrand.IntN(len(ids))]] == nil {
				b.Fatal("session not found")
			}
		}
	})
	b.Run("lookup-active1k", func(b *testing.B) {
		active := ids[:1000]
		inUse(b, tbl, active)
		b.ReportAllocs()
		for b.Loop() {
			if tbl.Lookup(active[mrand.IntN(len(active))]) == nil {
				b.Fatal("session not found")
			}
		}
	})
	b.Run("select", func(b *testing.B) {
		r := pinnedRequest(pool[2].Dial)
		b.ReportAllocs()
		for b.Loop() {
			if s.Select(pool, r, nil) != pool[2] {
				b.Fatal("wrong upstream")
			}
		}
	})
	b.Run("lookup", func(b *testing.B) {
		inUse(b, tbl, ids)
		b.ReportAllocs()
		for b.Loop() {
			if tbl.Lookup(ids[mrand.IntN(len(ids))]) == nil {
				b.Fatal("session not found")
			}
		}
	})
	b.Run("lookup+select", func(b *testing.B) {
		inUse(b, tbl, ids)
		r := newRequest(http.MethodPost)
		b.ReportAllocs()
		for b.Loop() {
			if pinnedDecision(tbl, s, pool, r, ids[mrand.IntN(len(ids))]) == nil {
				b.Fatal("no upstream")
			}
		}
	})
}

// benchMap is a bare map of the IDs of benchTable, the baseline of the decision.
var benchMap = sync.OnceValue(func() map[string]*session.Upstream {
	_, ids := benchTable()
	m := make(map[string]*session.Upstream, len(ids))
	for _, id := range ids {
		m[id] = &session.Upstream{}
	}
	return m
})

// vsMap runs a decide made by newDecide on random IDs of ids in every
// goroutine of RunParallel, in chunks of 1,000 that alternate with as many bare map
// lookups of random IDs, and reports the decision's and the map lookup's
// ns per operation on one goroutine, and their ratio (x-map): load that
// comes and goes on a shared machine weighs on both alike.
//
// With serial, each lookup's ID depends on the result of the lookup before
// it (through a value that is always 0 but that the CPU must wait for), so
// that a lookup cannot start before the previous one has finished: each
// costs its latency, as the one lookup of a request does. Without it,
// independent lookups in a tight loop overlap their cache misses, which
// the bare map does and the table's read lock (locked instructions, which
// order memory) prevents.
func vsMap(b *testing.B, ids []string, serial bool, newDecide func() func(id string) unsafe.Pointer) {
	const chunk = 1000
	m := benchMap()
	var tMap, tDecide atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		decide := newDecide()
		var prev unsafe.Pointer // the previous lookup's result, with serial
		next := func() string {
			return ids[(mrand.IntN(len(ids))+int(uintptr(prev)>>63))%len(ids)]
		}
		for n := chunk; n == chunk; {
			start := time.Now()
			for n = 0; n < chunk && pb.Next(); n++ {
				p := unsafe.Pointer(m[next()])
				if p == nil {
					panic("session not found")
				}
				if serial {
					prev = p
				}
			}
			mid := time.Now()
			for range n {
				p := decide(next())
				if p == nil {
					panic("no upstream")
				}
				if serial {
					prev = p
				}
			}
			tDecide.Add(int64(time.Since(mid)))
			tMap.Add(int64(mid.Sub(start)))
		}
	})
	b.ReportMetric(float64(tDecide.Load())/float64(b.N), "ns/decision")
	b.ReportMetric(float64(tMap.Load())/float64(b.N), "ns/map-lookup")
	b.ReportMetric(float64(tDecide.Load())/float64(tMap.Load()), "x-map")
}

// lookupsParallel looks up random sessions in use of ids from every
// goroutine of RunParallel.
func lookupsParallel(b *testing.B, tbl *session.Table, ids []string) {
	inUse(b, tbl, ids)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if tbl.Lookup(ids[mrand.IntN(len(ids))]) == nil {
				panic("session not found")
			}
		}
	})
}

// BenchmarkPinnedLookupParallel is BenchmarkPinnedLookup from GOMAXPROCS
// goroutines at once, to show contention on the table's lock (lookups of
// sessions in use take a read lock). Compare -cpu 1,2,4; lookup-active1k,
// whose sessions stay cached, shows it without the cache misses.
func BenchmarkPinnedLookupParallel(b *testing.B) {
	tbl, ids := benchTable()
	pool := testPool()
	s := benchPolicy(b)
	b.Run("lookup", func(b *testing.B) { lookupsParallel(b, tbl, ids) })
	b.Run("lookup-active1k", func(b *testing.B) { lookupsParallel(b, tbl, ids[:1000]) })
	decide := func() func(string) unsafe.Pointer {
		r := newRequest(http.MethodPost)
		return func(id string) unsafe.Pointer { return unsafe.Pointer(pinnedDecision(tbl, s, pool, r, id)) }
	}
	b.Run("lookup+select-vs-map", func(b *testing.B) {
		inUse(b, tbl, ids)
		vsMap(b, ids, false, decide)
	})
	b.Run("lookup+select-vs-map-serial", func(b *testing.B) {
		inUse(b, tbl, ids)
		vsMap(b, ids, true, decide)
	})
	b.Run("lookup+select", func(b *testing.B) {
		inUse(b, tbl, ids)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r := newRequest(http.MethodPost)
			for pb.Next() {
				if pinnedDecision(tbl, s, pool, r, ids[mrand.IntN(len(ids))]) == nil {
					panic("no upstream")
				}
			}
		})
	})
}

// sessionMemory is the heap cost of one session in a table of n sessions.
type sessionMemory struct {
	id    float64 // the ID string's bytes (allocation size class included)
	table float64 // everything else the table keeps per session
}

// measureSessionMemory fills a table with n sessions and returns what each
// costs on the heap, measured after GC, the IDs' own bytes apart.
func measureSessionMemory(n int) sessionMemory {
	var m0, m1, m2 runtime.MemStats
	ids := make([]string, n) // not counted: the table keeps its own string headers
	runtime.GC()
	runtime.ReadMemStats(&m0)
	sessionIDs(ids)
	runtime.GC()
	runtime.ReadMemStats(&m1)
	tbl, err := NewTable("memory", n, session.DefaultSessionTTL, nil)
	if err != nil {
		panic(err)
	}
	dials := []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"}
	for i, id := range ids {
		tbl.Learn(id, dials[i%len(dials)])
	}
	runtime.GC()
	runtime.ReadMemStats(&m2)
	if tbl.Len() != n {
		panic("sessions lost")
	}
	runtime.KeepAlive(ids)
	runtime.KeepAlive(tbl)
	return sessionMemory{
		id:    float64(m1.HeapAlloc-m0.HeapAlloc) / float64(n),
		table: float64(m2.HeapAlloc-m1.HeapAlloc) / float64(n),
	}
}

var sessionMemoryAt1M = sync.OnceValue(func() sessionMemory { return measureSessionMemory(benchSessions) })

// BenchmarkSessionMemory reports the heap bytes per session of a table
// holding 1,000,000 sessions: B/session in all, of which ID-B/session for
// the ID string and table-B/session beyond it. It measures once; its
// ns/op is meaningless and suppressed.
func BenchmarkSessionMemory(b *testing.B) {
	m := sessionMemoryAt1M()
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(m.id+m.table, "B/session")
	b.ReportMetric(m.id, "ID-B/session")
	b.ReportMetric(m.table, "table-B/session")
}
