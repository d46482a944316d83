package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestRedisStoreNoticesFlush: after FLUSHALL or FLUSHDB, while Redis keeps
// its run_id, every instance writes back the sessions it holds and its
// drain flags within two syncs, so that an instance that never saw a
// session finds it, and a drain in force stays in force everywhere. A
// session no instance holds any more stays lost (the control: what comes
// back comes from the instances' tables).
func TestRedisStoreNoticesFlush(t *testing.T) {
	srv := redistest.Start(t)
	for _, flush := range []string{"FLUSHALL", "FLUSHDB"} {
		t.Run(flush, func(t *testing.T) {
			name := "flush/" + flush
			a := sharedTable(t, srv.Addr, name, time.Second)
			b := sharedTable(t, srv.Addr, name, time.Second)
			c := sharedTable(t, srv.Addr, name, time.Second) // has seen none of a's and b's sessions
			a.Learn("on-a", "10.0.0.1:80")
			b.Learn("on-b", "10.0.0.2:80")
			a.Learn("forgotten", "10.0.0.1:80")
			a.Evict("forgotten", session.EvictTTL) // gone from a's table; Redis still holds it
			a.SetDraining("10.0.0.3:80", true)
			for _, tbl := range []*session.Table{a, b, c} {
				if !testproc.Until(3*time.Second, func() bool {
					u := tbl.KnownUpstream("10.0.0.3:80")
					return u != nil && u.Draining() && storeOf(tbl).markerSeen() != ""
				}) {
					t.Fatalf("an instance does not see the drain, or the marker, 3 s after it")
				}
			}
			runID := serverRunID(t, srv.Addr)
			flushed := time.Now()
			if r := srv.Do(flush); r != "OK" {
				t.Fatalf("%s: %q", flush, r)
			}
			for id, dial := range map[string]string{"on-a": "10.0.0.1:80", "on-b": "10.0.0.2:80"} {
				if !testproc.Until(3*time.Second, func() bool { return srv.Do("EXISTS", storeOf(c).SessionKey(id)) == "1" }) {
					t.Errorf("session %s not written back 3 s after %s", id, flush)
				}
				if up := c.Lookup(id); up == nil || up.Dial() != dial {
					t.Errorf("an instance that never saw %s finds %v after %s, want %s", id, up, flush, dial)
				}
			}
			t.Logf("%s: sessions back in Redis %s after it", flush, time.Since(flushed).Round(10*time.Millisecond))
			if c.Lookup("forgotten") != nil {
				t.Errorf("a session no instance held came back after %s", flush)
			}
			// The drain stays in force on every instance, over several syncs.
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				for i, tbl := range []*session.Table{a, b, c} {
					if u := tbl.KnownUpstream("10.0.0.3:80"); u == nil || !u.Draining() {
						t.Fatalf("instance %d undrained 10.0.0.3:80 %s after %s", i, time.Since(flushed).Round(10*time.Millisecond), flush)
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			if srv.Do("HEXISTS", "{caddy-mcp:"+name+"}:draining", "10.0.0.3:80") != "1" {
				t.Errorf("the drain flag is not back in Redis after %s", flush)
			}
			if got := serverRunID(t, srv.Addr); got != runID {
				t.Fatalf("Redis restarted during the test: run_id %s, then %s", runID, got)
			}
			for i, tbl := range []*session.Table{a, b} {
				if n := writeBacksOf(tbl)[CauseFlush]; n != 1 {
					t.Errorf("instance %d counted %d flush write-backs, want 1", i, n)
				}
				if n := writeBacksOf(tbl)[""]; n != 1 {
					t.Errorf("instance %d counted %d sessions restored, want 1", i, n)
				}
				if n := writeBacksOf(tbl)[CauseRestart]; n != 0 {
					t.Errorf("instance %d counted %d restart write-backs, want 0", i, n)
				}
			}
		})
	}
}

// TestRedisStoreNoticesEviction: a Redis with maxmemory and volatile-lru,
// the default of managed services, filled by another application's keys,
// evicts the table's sessions; the instance that holds them writes them
// back, so that an instance that never saw them finds every one. The
// control, same run: the number Redis evicted.
func TestRedisStoreNoticesEviction(t *testing.T) {
	srv := redistest.Start(t)
	a := sharedTable(t, srv.Addr, "evict", time.Second)
	b := sharedTable(t, srv.Addr, "evict", time.Second)
	const n = 30
	for i := range n {
		a.Learn(fmt.Sprintf("live-%d", i), "10.0.0.1:80")
	}
	time.Sleep(1200 * time.Millisecond) // a sync: a knows the marker and evicted_keys
	used := infoInt(t, srv.Addr, "memory", "used_memory")
	srv.Do("CONFIG", "SET", "maxmemory", fmt.Sprint(used+256<<10))
	srv.Do("CONFIG", "SET", "maxmemory-policy", "volatile-lru")
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	ctx := context.Background()
	value := strings.Repeat("v", 1024)
	missing := 0
	for i := 0; i < 4000 && missing < n/2; i++ { // the other application, with TTLs, as caches have
		rc.Set(ctx, fmt.Sprintf("other:%d", i), value, time.Hour)
		if i%100 == 99 {
			missing = 0
			for j := range n {
				if rc.Exists(ctx, storeOf(a).SessionKey(fmt.Sprintf("live-%d", j))).Val() == 0 {
					missing++
				}
			}
		}
	}
	evicted := infoInt(t, srv.Addr, "stats", "evicted_keys")
	t.Logf("Redis evicted %d keys; %d of %d live sessions were missing at once", evicted, missing, n)
	if missing == 0 {
		t.Fatalf("Redis evicted none of the table's sessions: the test shows nothing")
	}
	// The other application stops; a writes back what Redis evicted.
	srv.Do("CONFIG", "SET", "maxmemory", "0")
	for i := range n {
		id := fmt.Sprintf("live-%d", i)
		if !testproc.Until(3*time.Second, func() bool { return rc.Exists(ctx, storeOf(a).SessionKey(id)).Val() == 1 }) {
			t.Errorf("session %s not back in Redis 3 s after the eviction", id)
			continue
		}
		if b.Lookup(id) == nil {
			t.Errorf("an instance that never saw %s does not find it", id)
		}
	}
	if wb := writeBacksOf(a); wb[CauseEviction] == 0 || wb[""] == 0 {
		t.Errorf("write-backs counted: %v; want eviction write-backs and restored sessions", wb)
	}
	if storeOf(a).policyUnread() {
		t.Errorf("the store did not read maxmemory-policy")
	}
}

// TestEvictingPolicy names the maxmemory-policy values that warn.
func TestEvictingPolicy(t *testing.T) {
	for policy, want := range map[string]bool{
		"noeviction": false, "volatile-lru": true, "volatile-ttl": true, "allkeys-lru": true, "allkeys-lfu": true, "": false,
	} {
		if got := evictingPolicy(policy); got != want {
			t.Errorf("evictingPolicy(%q) = %v, want %v", policy, got, want)
		}
	}
}

// TestRestartedNode compares run_ids per node: a node with another run_id
// restarted; a new master among known ones was promoted; nodes listed in
// another order did not restart.
func TestRestartedNode(t *testing.T) {
	before := map[string]string{"a": "1", "b": "2", "c": "3"}
	for _, tc := range []struct {
		name string
		now  map[string]string
		want bool
	}{
		{"same nodes", map[string]string{"c": "3", "a": "1", "b": "2"}, false},
		{"one restarted", map[string]string{"a": "1", "b": "9", "c": "3"}, true},
		{"a replica promoted", map[string]string{"a": "1", "d": "4", "c": "3"}, true},
		{"a master left", map[string]string{"a": "1", "c": "3"}, false},
	} {
		if got := restartedNode(before, tc.now); got != tc.want {
			t.Errorf("%s: restartedNode = %v, want %v", tc.name, got, tc.want)
		}
	}
	if restartedNode(map[string]string{"": "x"}, map[string]string{"": "x"}) || !restartedNode(map[string]string{"": "x"}, map[string]string{"": "y"}) {
		t.Error("a standalone server's run_id is not compared with its own")
	}
}

// markerSeen returns the marker token the connection last saw.
func (c *Conn) markerSeen() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.marker
}

// writeBacksOf returns the write-backs of tbl's store by cause, and under
// "" the sessions they restored.
func writeBacksOf(tbl *session.Table) map[string]uint64 {
	m := map[string]uint64{}
	storeOf(tbl).WriteBacks(func(cause string, n uint64) { m[cause] = n })
	return m
}

// serverRunID returns the run_id of the Redis at addr.
func serverRunID(t *testing.T, addr string) string {
	t.Helper()
	return infoString(t, addr, "server", "run_id")
}

// infoInt returns an integer field of a section of INFO.
func infoInt(t *testing.T, addr, section, field string) int64 {
	t.Helper()
	var n int64
	fmt.Sscan(infoString(t, addr, section, field), &n)
	return n
}

func infoString(t *testing.T, addr, section, field string) string {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	info, err := rc.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	return infoField(info, field)
}

// TestRedisStoreOutageMoves: two instances hold a session whose upstream
// dies while Redis is blackholed; each fails it over on its own, to
// different upstream sessions. When Redis answers again they agree on one
// within two seconds: the first move written wins the compare-and-set, and
// the other instance follows it (before, each wrote its own value and they
// alternated until a touch, 46 s in a measured run).
func TestRedisStoreOutageMoves(t *testing.T) {
	srv := redistest.Start(t)
	relay := redistest.NewRelay(t, srv.Addr)
	a := sharedTable(t, relay.Addr, "moves", 200*time.Millisecond)
	b := sharedTable(t, relay.Addr, "moves", 200*time.Millisecond)
	for _, tbl := range []*session.Table{a, b} {
		tbl.SetFailover(session.FailoverReinitialize, 0)
	}
	init := &session.Init{Body: []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize"}`), Accept: "application/json, text/event-stream", ContentType: "application/json"}
	a.LearnInit(testSessionID, "10.0.0.1:80", session.Origin{}, init)
	if b.Lookup(testSessionID) == nil {
		t.Fatal("b does not find the session")
	}
	relay.Blackhole(true)
	for tbl, to := range map[*session.Table]string{a: "10.0.0.2:80", b: "10.0.0.3:80"} {
		from, kept := tbl.InitOf(testSessionID)
		if _, err := tbl.RecordMove(testSessionID, from, kept, tbl.UseUpstream(to), kept.MovedTo("ID-ON-"+to)); err != nil {
			t.Fatal(err)
		}
	}
	if dial(a) == dial(b) {
		t.Fatalf("both instances moved the session to %s during the outage: the test shows nothing", dial(a))
	}
	relay.Blackhole(false)
	back := time.Now()
	if !testproc.Until(5*time.Second, func() bool { return dial(a) == dial(b) && dial(a) != "10.0.0.1:80" }) {
		t.Fatalf("5 s after Redis answered again the instances disagree: a on %s, b on %s", dial(a), dial(b))
	}
	t.Logf("the instances agree on %s %s after Redis answered again", dial(a), time.Since(back).Round(10*time.Millisecond))
	time.Sleep(1500 * time.Millisecond)
	if dial(a) != dial(b) {
		t.Errorf("the instances disagree again: a on %s, b on %s", dial(a), dial(b))
	}
}

// dial returns the upstream table tbl has testSessionID on.
func dial(tbl *session.Table) string {
	up, _ := tbl.InitOf(testSessionID)
	if up == nil {
		return ""
	}
	return up.Dial()
}

// TestRedisStorePolicyWarning: at its first sync, an instance on a Redis
// whose maxmemory is set and whose maxmemory-policy evicts logs one
// warning naming the fix; on noeviction (the control, same run), none.
func TestRedisStorePolicyWarning(t *testing.T) {
	for policy, warns := range map[string]bool{"volatile-lru": true, "allkeys-lru": true, "noeviction": false} {
		t.Run(policy, func(t *testing.T) {
			srv := redistest.Start(t)
			srv.Do("CONFIG", "SET", "maxmemory", "100mb")
			srv.Do("CONFIG", "SET", "maxmemory-policy", policy)
			core, logs := observer.New(zap.WarnLevel)
			tbl, err := session.NewTable("policy", 100, time.Hour, nil)
			if err != nil {
				t.Fatal(err)
			}
			opts := &redis.UniversalOptions{Addrs: []string{srv.Addr}, DialTimeout: time.Second, MaxRetries: -1}
			c := New(tbl, opts, "caddy-mcp", "policy", []byte(testHashKey), time.Second, zap.New(core))
			t.Cleanup(func() { _ = c.Destruct() })
			tbl.SetStore(c)
			if !testproc.Until(3*time.Second, func() bool { return !c.policyUnread() }) {
				t.Fatal("the store did not read maxmemory-policy within 3 s")
			}
			time.Sleep(1500 * time.Millisecond) // more syncs: still one warning
			found := logs.FilterMessageSnippet("maxmemory-policy noeviction").Len()
			if warns && found != 1 || !warns && found != 0 {
				t.Errorf("maxmemory-policy %s: %d warnings naming the fix, want %v", policy, found, warns)
			}
		})
	}
}
