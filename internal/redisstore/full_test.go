package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestRedisStoreFull: a Redis at maxmemory under noeviction answers
// writes with OOM. The store takes it for a full store, not an unreachable
// one: it stays reachable, an instance that never saw a session learned
// before still finds it in Redis, a session learned meanwhile works on its
// instance and reaches Redis once Redis has room again.
func TestRedisStoreFull(t *testing.T) {
	srv := redistest.Start(t)
	core, logs := observer.New(zap.InfoLevel)
	a, err := session.NewTable("full", 1<<20, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := &redis.UniversalOptions{Addrs: []string{srv.Addr}, DialTimeout: time.Second, MaxRetries: -1}
	ca := New(a, opts, "caddy-mcp", "full", []byte(testHashKey), time.Second, zap.New(core))
	t.Cleanup(func() { _ = ca.Destruct() })
	a.SetStore(ca)
	b := sharedTable(t, srv.Addr, "full", time.Second)
	a.Learn("before", "10.0.0.1:80")
	time.Sleep(1200 * time.Millisecond) // a sync
	srv.Do("CONFIG", "SET", "maxmemory-policy", "noeviction")
	srv.Do("CONFIG", "SET", "maxmemory", "1") // below used_memory: every write that may grow memory is refused
	a.Learn("during", "10.0.0.1:80")
	if up := b.Lookup("before"); up == nil {
		t.Errorf("a full Redis: an instance that never saw a session does not find it")
	}
	if up := a.Lookup("during"); up == nil {
		t.Errorf("a full Redis: the instance that learned a session does not hold it")
	}
	time.Sleep(2500 * time.Millisecond) // syncs and flushes against the full Redis
	for name, tbl := range map[string]*session.Table{"a": a, "b": b} {
		c := storeOf(tbl)
		if !c.Reachable() || c.Writable() {
			t.Errorf("%s, Redis full: reachable %v, writable %v; want reachable, not writable", name, c.Reachable(), c.Writable())
		}
	}
	if n := storeOf(a).ErrorCount(opPut); n != 1 {
		t.Errorf("a counted %d refused puts, want 1", n)
	}
	if b.Lookup("during") != nil {
		t.Fatalf("a session learned while Redis was full reached Redis")
	}
	srv.Do("CONFIG", "SET", "maxmemory", "0")
	if !testproc.Until(3*time.Second, func() bool { return srv.Do("EXISTS", storeOf(a).SessionKey("during")) == "1" }) {
		t.Fatalf("the session learned while Redis was full is not in Redis 3 s after Redis had room")
	}
	if b.Lookup("during") == nil || !storeOf(a).Writable() {
		t.Errorf("after Redis had room: b finds the session %v, a writable %v", b.Lookup("during") != nil, storeOf(a).Writable())
	}
	full, again, unreachable := logs.FilterMessageSnippet("Raise maxmemory").Len(), logs.FilterMessage("redis store: Redis takes writes again").Len(),
		logs.FilterMessageSnippet("unreachable").Len()
	if full != 1 || again != 1 || unreachable != 0 {
		t.Errorf("a logged the full Redis %d times, its end %d times, an outage %d times; want 1, 1, 0", full, again, unreachable)
	}
}

// TestRedisStoreReadOnly: an instance pointed at a replica gets READONLY
// for its writes; it reads on (finds what the master's instances learned)
// and stays reachable.
func TestRedisStoreReadOnly(t *testing.T) {
	master, replica := redistest.Start(t), redistest.Start(t)
	replica.ReplicaOf(master)
	a := sharedTable(t, master.Addr, "ro", time.Second)
	b := sharedTable(t, replica.Addr, "ro", time.Second)
	a.Learn("on-master", "10.0.0.1:80")
	if !testproc.Until(5*time.Second, func() bool { return replica.Do("EXISTS", storeOf(a).SessionKey("on-master")) == "1" }) {
		t.Fatalf("the replica does not replicate")
	}
	b.Learn("on-replica", "10.0.0.2:80")
	if up := b.Lookup("on-master"); up == nil || up.Dial() != "10.0.0.1:80" {
		t.Errorf("an instance on a read-only replica does not read: %v", up)
	}
	time.Sleep(1500 * time.Millisecond)
	if c := storeOf(b); !c.Reachable() || c.Writable() || b.Lookup("on-replica") == nil {
		t.Errorf("on a replica: reachable %v, writable %v; want reachable, not writable, its session held", c.Reachable(), c.Writable())
	}
}

// TestRedisStoreUnconfirmedFlood: a flood of sessions never used after
// their initialize, learned by one instance whose table holds 100: Redis
// holds about the table's bound of them, not the flood, and its memory
// grows by about that much; a flooded session first used on another
// instance gets the table's TTL there and stays in Redis when the
// learner drops it. The control, same run: what a Redis key of an
// unconfirmed and a confirmed session live.
func TestRedisStoreUnconfirmedFlood(t *testing.T) {
	srv := redistest.Start(t)
	const bound = 100
	a, err := session.NewTable("flood", bound, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	attachStore(t, a, srv.Addr, "flood", testHashKey, time.Second)
	b := sharedTable(t, srv.Addr, "flood", time.Second)
	a.Learn("used-elsewhere", "10.0.0.1:80")
	if b.Lookup("used-elsewhere") == nil {
		t.Fatal("b does not find a's session")
	}
	a.Learn("unused", "10.0.0.1:80")
	a.Learn("used-here", "10.0.0.1:80")
	a.Lookup("used-here")
	time.Sleep(500 * time.Millisecond) // a flush
	ttl := func(id string) time.Duration {
		ms, _ := strconv.ParseInt(srv.Do("PTTL", storeOf(a).SessionKey(id)), 10, 64)
		return time.Duration(ms) * time.Millisecond
	}
	t.Logf("TTL in Redis: unconfirmed %s, used on its instance %s, used on another %s", ttl("unused"), ttl("used-here"), ttl("used-elsewhere"))
	if ttl("unused") > unconfirmedTTL || ttl("used-here") <= unconfirmedTTL || ttl("used-elsewhere") <= unconfirmedTTL {
		t.Errorf("want an unconfirmed session's TTL at most %s, and a confirmed one's longer", unconfirmedTTL)
	}
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	before := infoInt(t, srv.Addr, "memory", "used_memory")
	start := time.Now()
	for i := range n {
		a.Learn(fmt.Sprintf("flood-%d", i), "10.0.0.1:80")
	}
	took := time.Since(start)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	sessions := func() int64 {
		keys, _ := rc.Keys(context.Background(), "caddy-mcp:flood:s:*").Result()
		return int64(len(keys))
	}
	if !testproc.Until(5*time.Second, func() bool { return sessions() <= bound+2 }) {
		t.Errorf("after a flood of %d, Redis holds %d sessions of a table of %d", n, sessions(), bound)
	}
	after := infoInt(t, srv.Addr, "memory", "used_memory")
	t.Logf("a flood of %d unconfirmed sessions in %s: Redis holds %d sessions (table bound %d), used_memory %+d bytes", n, took.Round(time.Millisecond), sessions(), bound, after-before)
	if b.Lookup("used-elsewhere") == nil || srv.Do("EXISTS", storeOf(a).SessionKey("used-elsewhere")) != "1" {
		t.Errorf("a session used on another instance left Redis when its learner dropped it")
	}
	if srv.Do("EXISTS", storeOf(a).SessionKey("unused")) != "0" {
		t.Errorf("an unconfirmed session its learner dropped is still in Redis")
	}
}
