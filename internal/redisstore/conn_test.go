package redisstore

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

func TestRedisStoreSharesSessions(t *testing.T) {
	srv := redistest.Start(t)
	name := "shared/" + t.Name()
	a := sharedTable(t, srv.Addr, name, time.Second)
	b := sharedTable(t, srv.Addr, name, time.Second)

	// Learned on a, pinned on b, which asks Redis once and keeps it.
	a.Learn(testSessionID, "10.0.0.1:80")
	if up := b.Lookup(testSessionID); up == nil || up.Dial() != "10.0.0.1:80" {
		t.Fatalf("b.Lookup = %v, want 10.0.0.1:80 from Redis", up)
	}
	if b.Stats.Shared() != 1 || b.Len() != 1 {
		t.Errorf("b took %d sessions from Redis and holds %d; want 1, 1", b.Stats.Shared(), b.Len())
	}
	b.Lookup(testSessionID)
	if b.Stats.Shared() != 1 {
		t.Errorf("a second lookup on b went to Redis again")
	}
	if dump := redistest.Dump(t, srv.Addr); strings.Contains(dump, testSessionID) || !strings.Contains(dump, "10.0.0.1:80") {
		t.Errorf("Redis holds the raw session ID, or not its upstream:\n%s", dump)
	}
	// A session Redis does not hold is unknown everywhere (negative control).
	if up := b.Lookup("never-learned"); up != nil {
		t.Errorf("b.Lookup of an unknown session = %v", up)
	}

	// Ended on b, gone from a within 1 s; a lookup then misses in Redis too.
	b.Evict(testSessionID, session.EvictDelete)
	if !testproc.Until(time.Second, func() bool { return a.Len() == 0 }) {
		t.Fatalf("a still holds the session 1 s after b ended it")
	}
	if a.Evictions(session.EvictDelete) != 1 || a.Lookup(testSessionID) != nil {
		t.Errorf("a: %d delete evictions, lookup %v; want 1, nil", a.Evictions(session.EvictDelete), a.Lookup(testSessionID))
	}

	// Drained on a, draining on b within 1 s, and undrained.
	a.SetDraining("10.0.0.2:80", true)
	if !testproc.Until(time.Second, func() bool { u := b.KnownUpstream("10.0.0.2:80"); return u != nil && u.Draining() }) {
		t.Fatalf("b does not see 10.0.0.2:80 draining 1 s after a drained it")
	}
	a.SetDraining("10.0.0.2:80", false)
	if !testproc.Until(time.Second, func() bool { return !b.AnyDraining() }) {
		t.Fatalf("b still drains 1 s after a undrained")
	}

	// A session bound to a principal on a is bound on b too: every instance
	// hashes principals under the key derived from hash_key.
	a.LearnFrom("BOUND", "10.0.0.1:80", session.Origin{Principal: "alice"})
	if up, mismatch := b.LookupAs("BOUND", "mallory"); up != nil || !mismatch {
		t.Errorf("b let another principal use a session bound on a: %v, mismatch %v", up, mismatch)
	}
	if up, mismatch := b.LookupAs("BOUND", "alice"); up == nil || mismatch {
		t.Errorf("b refused the session's own principal: %v, mismatch %v", up, mismatch)
	}
	if strings.Contains(redistest.Dump(t, srv.Addr), "alice") {
		t.Errorf("Redis holds the raw principal")
	}

	// Live sessions per upstream count on every instance.
	a.Learn("S1", "10.0.0.1:80")
	a.Learn("S2", "10.0.0.1:80")
	b.Learn("S3", "10.0.0.1:80")
	if !testproc.Until(3*time.Second, func() bool {
		u := a.KnownUpstream("10.0.0.1:80")
		return a.ClusterSessions(u) == 4
	}) {
		u := a.KnownUpstream("10.0.0.1:80")
		t.Errorf("a counts %d sessions of 10.0.0.1:80 on every instance (%d here), want 4", a.ClusterSessions(u), u.LiveSessions())
	}
}

func TestRedisStoreWritesBack(t *testing.T) {
	srv := redistest.Start(t)
	relay := redistest.NewRelay(t, srv.Addr)
	name := "writeback/" + t.Name()
	a := sharedTable(t, relay.Addr, name, 200*time.Millisecond)
	b := sharedTable(t, srv.Addr, name, 200*time.Millisecond)
	a.Learn("before", "10.0.0.1:80")

	// Redis blackholed for a: a keeps serving from its table, without
	// waiting on Redis more than once.
	relay.Blackhole(true)
	start := time.Now()
	a.Learn("during", "10.0.0.2:80")
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("learning while Redis is blackholed took %s", d)
	}
	start = time.Now()
	for range 50 {
		a.Learn("more-"+time.Now().String(), "10.0.0.2:80")
		a.Lookup("unknown")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("50 learns and misses after the first failure took %s: the store did not fail fast", d)
	}
	if up := a.Lookup("before"); up == nil {
		t.Errorf("a lost a session it held while Redis was unreachable")
	}
	if a.StoreReachable() || storeOf(a).totalErrors() == 0 {
		t.Errorf("a's store reachable %v, %d errors; want unreachable, errors counted", a.StoreReachable(), storeOf(a).totalErrors())
	}
	if b.Lookup("during") != nil {
		t.Fatalf("b found a session learned while a could not reach Redis")
	}

	// Redis answers again: what a learned meanwhile is written back.
	relay.Blackhole(false)
	if !testproc.Until(5*time.Second, func() bool { return a.StoreReachable() }) {
		t.Fatalf("a did not reach Redis again")
	}
	if !testproc.Until(2*time.Second, func() bool { return b.Lookup("during") != nil }) {
		t.Errorf("b does not find the session a learned during the outage")
	}

	// Redis restarts empty: every instance writes its table back.
	srv.Stop()
	srv.Restart()
	if !testproc.Until(10*time.Second, func() bool { return redistest.Dump(t, srv.Addr) != "" && storeOf(b).Reachable() }) {
		t.Fatalf("nothing written back after Redis restarted empty")
	}
	c := sharedTable(t, srv.Addr, name, time.Second) // a new instance, after the restart
	for _, id := range []string{"before", "during"} {
		if !testproc.Until(5*time.Second, func() bool { return c.Lookup(id) != nil }) {
			t.Errorf("session %q not written back after Redis restarted empty", id)
		}
	}
}

// TestRedisStoreHashKeyClash: instances of one table that use different
// hash_keys cannot find each other's sessions; each notices the other's
// key within a sync and counts it, while instances with the same key do
// not (the control, same Redis).
func TestRedisStoreHashKeyClash(t *testing.T) {
	srv := redistest.Start(t)
	a := sharedTable(t, srv.Addr, "clash", time.Second)
	same := sharedTable(t, srv.Addr, "clash", time.Second)
	a.Learn("s1", "10.0.0.1:80")
	if !testproc.Until(3*time.Second, func() bool { return same.Lookup("s1") != nil }) {
		t.Fatal("an instance with the same hash_key does not find the session")
	}
	if n := storeOf(a).ErrorCount(OpHashKey) + storeOf(same).ErrorCount(OpHashKey); n != 0 {
		t.Errorf("instances with the same hash_key counted %d hash_key errors", n)
	}
	other := sharedTableKey(t, srv.Addr, "clash", strings.Repeat("k", 32), time.Second)
	if other.Lookup("s1") != nil {
		t.Error("an instance with another hash_key found the session: the clash shows nothing")
	}
	for name, tbl := range map[string]*session.Table{"the first instance": a, "the other-key instance": other} {
		c := storeOf(tbl)
		if !testproc.Until(3*time.Second, func() bool { return c.keyClash.Load() && c.ErrorCount(OpHashKey) > 0 }) {
			t.Errorf("%s did not notice the other hash_key", name)
		}
	}
}

// TestRedisMisconfigured tells errors that last until the configuration
// changes (a wrong password, a database index Redis lacks) from outages,
// using a real Redis's answers.
func TestRedisMisconfigured(t *testing.T) {
	srv := redistest.Start(t)
	ping := func(o *redis.Options) error {
		c := redis.NewClient(o)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return c.Ping(ctx).Err()
	}
	if err := ping(&redis.Options{Addr: srv.Addr, DB: 99}); !misconfigured(err) {
		t.Errorf("db 99: %v is not taken for a misconfiguration", err)
	}
	srv.Do("CONFIG", "SET", "requirepass", "right")
	if err := ping(&redis.Options{Addr: srv.Addr, Password: "wrong"}); !misconfigured(err) {
		t.Errorf("a wrong password: %v is not taken for a misconfiguration", err)
	}
	if err := ping(&redis.Options{Addr: srv.Addr}); !misconfigured(err) {
		t.Errorf("no password: %v is not taken for a misconfiguration", err)
	}
	// A Redis that went away: a listener of this test's own that closes
	// every connection at once. (A stopped redis-server's port may be taken
	// by another test process's Redis before the ping.)
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	go func() {
		for {
			c, err := gone.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if err := ping(&redis.Options{Addr: gone.Addr().String(), Password: "right"}); err == nil || misconfigured(err) {
		t.Errorf("a Redis that went away: %v is taken for a misconfiguration", err)
	}
}

// TestRedisStoreInfoFromStore: an instance that has not served a session
// knows its upstream from the store, and says that it knows no more.
func TestRedisStoreInfoFromStore(t *testing.T) {
	srv := redistest.Start(t)
	a := sharedTable(t, srv.Addr, "info", time.Second)
	b := sharedTable(t, srv.Addr, "info", time.Second)
	a.Learn("s1", "10.0.0.1:80")
	if info, ok := a.Info("s1"); !ok || info.FromStore {
		t.Errorf("the learning instance: Info = %+v, %v; want its own record", info, ok)
	}
	if info, ok := b.Info("s1"); !ok || !info.FromStore || info.Upstream != "10.0.0.1:80" {
		t.Errorf("another instance: Info = %+v, %v; want the store's upstream, FromStore", info, ok)
	}
}

// testHashKey is a hash_key for tests.
const testHashKey = "0123456789abcdef0123456789abcdef-test"

// sharedTable returns a table named name connected to Redis at addr
// with the given timeout, as one Caddy instance has it.
func sharedTable(t testing.TB, addr, name string, timeout time.Duration) *session.Table {
	t.Helper()
	return sharedTableKey(t, addr, name, testHashKey, timeout)
}

// sharedTableKey is sharedTable with the store's hash_key.
func sharedTableKey(t testing.TB, addr, name, hashKey string, timeout time.Duration) *session.Table {
	t.Helper()
	tbl, err := session.NewTable(name, 1<<20, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	attachStore(t, tbl, addr, name, hashKey, timeout)
	return tbl
}

// attachStore connects tbl to Redis at addr as table name, with the
// given hash_key and timeout, and the client options of the redis store
// module (caddymodule/redis.go) with its default key prefix.
func attachStore(t testing.TB, tbl *session.Table, addr, name, hashKey string, timeout time.Duration) {
	t.Helper()
	attachStoreAt(t, tbl, []string{addr}, name, hashKey, timeout)
}

// attachStoreAt is attachStore with Redis at addrs: with more than one, a
// Redis Cluster.
func attachStoreAt(t testing.TB, tbl *session.Table, addrs []string, name, hashKey string, timeout time.Duration) {
	t.Helper()
	opts := &redis.UniversalOptions{
		Addrs: addrs, IsClusterMode: len(addrs) > 1, ClientName: "caddy-mcp-affinity",
		DialTimeout: time.Second, DialerRetries: 1,
		ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: timeout,
		MaxRetries: -1, MinIdleConns: 2, ContextTimeoutEnabled: true,
	}
	c := New(tbl, opts, "caddy-mcp", name, []byte(hashKey), timeout, zap.NewNop())
	t.Cleanup(func() { _ = c.Destruct() })
	tbl.SetStore(c)
}

// storeOf returns the redis connection of table t.
func storeOf(t *session.Table) *Conn {
	c, _ := t.Store().(*Conn)
	return c
}

// testSessionID is a session ID shaped as go-sdk's.
const testSessionID = "B5CKDXQ4Z3N7RWJ2YHT6MFEA4U"

// wantEvictions checks every eviction counter: those in want must have the
// given values, all others 0.
func wantEvictions(t *testing.T, tbl *session.Table, want map[session.EvictReason]uint64) {
	t.Helper()
	for _, r := range session.EvictReasons {
		if got := tbl.Evictions(r); got != want[r] {
			t.Errorf("Evictions(%s) = %d, want %d", r, got, want[r])
		}
	}
}
