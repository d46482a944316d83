package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
)

// TestTombstonesBounded: the set holds at most max tombstones, dropping
// the oldest write first; a tombstone lives until its expiry and no
// longer; burying a key again keeps the later expiry and the stronger
// kind, but an expired tombstone passes nothing on; remove forgets a key;
// and whatever the order of writes, resizes and wraps of the ring, the
// set holds exactly the latest max keys written.
func TestTombstonesBounded(t *testing.T) {
	ts := newTombstones(3)
	for i, k := range []string{"a", "b", "c", "d"} {
		ts.add(k, tombEnded, 100, int64(i))
	}
	if ts.len() != 3 || ts.get("a", 10) != 0 || ts.get("b", 10) != tombEnded || ts.get("d", 10) != tombEnded {
		t.Fatalf("after 4 writes into 3: len %d, a %d b %d d %d; want a dropped, b..d kept", ts.len(), ts.get("a", 10), ts.get("b", 10), ts.get("d", 10))
	}
	if ts.get("b", 100) != 0 || ts.get("b", 99) != tombEnded {
		t.Fatal("a tombstone must live until its expiry, and not at it")
	}
	ts.sweep(100)
	if ts.len() != 0 {
		t.Fatalf("%d tombstones left after every one expired", ts.len())
	}

	ts = newTombstones(4)
	ts.add("x", tombExpired, 50, 0)
	ts.add("x", tombEnded, 40, 1)
	if ts.get("x", 45) != tombEnded || ts.get("x", 49) != tombEnded || ts.get("x", 50) != 0 {
		t.Fatal("burying again must keep the later expiry and the stronger kind")
	}
	ts.add("y", tombEnded, 10, 0)
	ts.add("y", tombExpired, 30, 20) // the first expired at 10
	if ts.get("y", 25) != tombExpired {
		t.Fatalf("y is %d; an expired tombstone must not pass its kind on", ts.get("y", 25))
	}
	ts.remove("x")
	if ts.get("x", 2) != 0 {
		t.Fatal("a removed tombstone still refuses")
	}

	// Against a model: the latest max distinct keys written.
	ts = newTombstones(5)
	var order []string
	for i := range 200 {
		k := fmt.Sprint("k", i%37)
		if i%53 == 52 {
			ts.setMax(3 + i%4)
		}
		ts.add(k, tombEnded, 1<<40, int64(i))
		if j := indexOf(order, k); j >= 0 {
			order = append(order[:j], order[j+1:]...)
		}
		order = append(order, k)
		if n := len(order); n > ts.max {
			order = order[n-ts.max:]
		}
		for m := range 37 {
			k := fmt.Sprint("k", m)
			if want, got := indexOf(order, k) >= 0, ts.get(k, int64(i)) != 0; want != got {
				t.Fatalf("write %d (max %d): %s held %v, want %v (latest %v)", i, ts.max, k, got, want, order)
			}
		}
	}
	if ts.n > ts.max || len(ts.ring) > ts.max+1 {
		t.Fatalf("ring of %d slots, %d in use, for max %d", len(ts.ring), ts.n, ts.max)
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// sealedKey returns a table key shaped as a decoded sealed ID's.
func sealedKey(name string) string { return string([]byte{sealVersionIssuedInit}) + name }

// TestTableTombstones: a DELETE or an admin eviction buries a sealed
// session (and any session of a table with failover), which Adopt then
// refuses, until session_ttl plus a touch interval or failover_max_age,
// whichever is longer, and no longer; a table without failover buries no
// plain session; an expiry buries a sealed session of a failover table
// without a store, for failover only (Adopt still routes it); a new
// session with the ID lifts the tombstone; and max_sessions bounds the
// tombstones.
func TestTableTombstones(t *testing.T) {
	tbl, clk := newTestTable(t, 100, time.Hour)
	key := sealedKey("one")
	tbl.Learn(key, "10.0.0.1:80")
	tbl.Evict(key, EvictDelete)
	if tbl.buried(key) != tombEnded || tbl.Adopt(key, "10.0.0.1:80", Origin{}) != nil {
		t.Fatal("a DELETEd sealed session must be buried, and not adopted")
	}
	tbl.Learn("plain", "10.0.0.1:80")
	tbl.Evict("plain", EvictAdmin)
	if tbl.buried("plain") != 0 {
		t.Fatal("a table without failover buries no plain session")
	}
	life := time.Hour + touchInterval(time.Hour)
	clk.Advance(life - time.Second)
	if tbl.Adopt(key, "10.0.0.1:80", Origin{}) != nil {
		t.Fatal("a tombstone must live session_ttl plus a touch interval")
	}
	clk.Advance(2 * time.Second)
	if tbl.Adopt(key, "10.0.0.1:80", Origin{}) == nil {
		t.Fatal("past its natural end, the ID is adopted again")
	}

	tbl.setFailover(FailoverReinitialize, 0)
	tbl.setFailoverMaxAge(3 * time.Hour)
	two := sealedKey("two")
	tbl.Learn(two, "10.0.0.1:80")
	tbl.Evict(two, EvictAdmin)
	clk.Advance(3*time.Hour - time.Second)
	if tbl.buried(two) != tombEnded {
		t.Fatal("a sealed ID's tombstone must live failover_max_age when that is longer")
	}
	tbl.Learn("plain2", "10.0.0.1:80")
	tbl.Evict("plain2", EvictDelete)
	if tbl.buried("plain2") != tombEnded {
		t.Fatal("a table with failover buries plain sessions too")
	}
	tbl.Learn("plain2", "10.0.0.2:80") // an upstream opens it again
	if tbl.buried("plain2") != 0 {
		t.Fatal("a learned session must lift its tombstone")
	}

	idle := sealedKey("idle")
	tbl.Adopt(idle, "10.0.0.1:80", Origin{})
	clk.Advance(time.Hour + time.Second)
	tbl.Sweep()
	if tbl.buried(idle) != tombExpired || tbl.Adopt(idle, "10.0.0.1:80", Origin{}) == nil {
		t.Fatalf("an expired sealed session: buried %d; want expired, and adopted for routing", tbl.buried(idle))
	}

	tbl.Configure(2, 0)
	for i := range 3 {
		k := sealedKey(fmt.Sprint("cap", i))
		tbl.Learn(k, "10.0.0.1:80")
		tbl.Evict(k, EvictDelete)
	}
	if n := tbl.Tombstones(); n != 2 || tbl.buried(sealedKey("cap0")) != 0 || tbl.buried(sealedKey("cap2")) != tombEnded {
		t.Fatalf("%d tombstones with max_sessions 2; want the 2 latest", n)
	}
}

// TestFailoverRefusedForEndedAndOld: with sealed IDs and failover
// reinitialize, a session the client DELETEd gets the proxy's 404 on the
// replica that saw the DELETE, reaching no upstream; on a replica that
// never saw it, a sealed ID older than failover_max_age, or of a format
// without its issue time, is refused failover when its upstream lost the
// session (404, counted as refused), while a young one fails over
// (negative control).
func TestFailoverRefusedForEndedAndOld(t *testing.T) {
	key := newKey(t)
	a := newSealedFailoverFixture(t, "test/revoke-a", key, 0)
	b := newSealedFailoverFixture(t, "test/revoke-b", key, 0)
	b.h.table.setFailoverMaxAge(time.Hour)
	up, minted := lostSessionUpstream("S1", "S2", "S3", "S4")
	sealed := a.serve(t, bodyRequest(testInitBody, ""), up).Header().Get(HeaderSessionID)
	del := bodyRequest("", sealed)
	del.Method, del.Body = http.MethodDelete, http.NoBody
	if rec := a.serve(t, del, up); rec.Code != http.StatusOK {
		t.Fatalf("DELETE: %d", rec.Code)
	}
	delete(minted, "S1") // the upstream ended it
	calls := len(a.proxy.selected)
	rec := a.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":2,"method":"ping"}`, sealed), up)
	if rec.Code != http.StatusNotFound || len(a.proxy.selected) != calls || a.h.table.Stats.Failovers(FailoverUpstream404, true) != 0 {
		t.Fatalf("after DELETE, on its replica: %d %q, upstream called %v; want the proxy's 404 and no failover", rec.Code, rec.Body, len(a.proxy.selected) != calls)
	}

	dial := a.proxy.last().Dial
	s := newSealer(t, key)
	init := testSealedInit(testInitBody)
	minted["LOST"] = false
	v2 := sealRaw(t, key, sealVersionInit, v2Plaintext(dial, "LOST", init))
	for _, c := range []struct {
		name, id, why string
		ok            bool
	}{
		{"issued now", s.seal(sealedSession{dial: dial, id: "LOST", init: init}), "", true},
		{"issued 61 minutes ago", s.seal(sealedSession{issued: time.Now().Add(-61 * time.Minute).Unix(), dial: dial, id: "LOST", init: init}), "failover_max_age", false},
		{"format version 2", v2, "did not seal its issue time", false},
	} {
		refused := b.h.table.Stats.FailoversRefused(FailoverUpstream404)
		rec := b.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":3,"method":"ping"}`, c.id), up)
		switch {
		case c.ok && (rec.Code != http.StatusOK || !strings.HasPrefix(rec.Body.String(), "answered in S")):
			t.Errorf("%s: %d %q; want it failed over", c.name, rec.Code, rec.Body)
		case !c.ok && (rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), c.why) || b.h.table.Stats.FailoversRefused(FailoverUpstream404) != refused+1):
			t.Errorf("%s: %d %q, refused %d -> %d; want 404 saying %q, one refusal counted", c.name, rec.Code, rec.Body, refused, b.h.table.Stats.FailoversRefused(FailoverUpstream404), c.why)
		}
	}
}

// v2Plaintext is the plaintext of a format version 2 sealed ID, as minted
// before sealed IDs carried their issue time.
func v2Plaintext(dial, id string, init sealedInit) []byte {
	b := plaintext(dial, "", "")[:0]
	for _, f := range []string{dial, "", id, init.accept, init.contentType, init.version} {
		b = append(append(b, byte(len(f))), f...)
	}
	return append(b, init.body...)
}

// TestStoreTombstones: a session ended by its client's DELETE leaves a
// tombstone in Redis before the DELETE is answered, so that another
// instance does not adopt it, a touch of an instance that missed the end
// does not write it back, and a failover finds it ended; an upstream
// opening a session with the same ID lifts the tombstone.
func TestStoreTombstones(t *testing.T) {
	srv := redistest.Start(t)
	ts := failoverTables(t, srv.Addr, 2)
	a, b := ts[0], ts[1]
	a.learnInit(testSessionID, "10.0.0.1:80", Origin{}, testInit())
	if up := b.Lookup(testSessionID); up == nil {
		t.Fatal("b does not find the session a learned")
	}
	stale := storedValue(t, srv.Addr, a, testSessionID)
	a.endByClient(testSessionID, EvictDelete)
	if n := redisCount(srv, "*:x:*"); n != 1 {
		t.Fatalf("Redis holds %d tombstones once the DELETE returned, want 1", n)
	}
	c := failoverTables(t, srv.Addr, 1)[0]
	if up, _, ended := c.lookup(testSessionID, ""); up != nil || !ended {
		t.Fatalf("another instance: lookup = %v, ended %v; want the session ended", up, ended)
	}
	conn := storeOf(b)
	conn.Touch(testSessionID, stale) // b missed the end
	conn.flush()
	if n := redisCount(srv, "*:s:*"); n != 0 {
		t.Fatalf("a touch of an instance that missed the end wrote the session back: %d session keys", n)
	}
	from, init := c.upstream("10.0.0.1:80"), testInit()
	if _, _, ended := c.movedInStore(testSessionID, from, init); !ended {
		t.Fatal("a failover must find the session ended in the store")
	}
	a.learnInit(testSessionID, "10.0.0.2:80", Origin{}, testInit())
	if n := redisCount(srv, "*:x:*"); n != 0 {
		t.Fatalf("a session learned again with the ID leaves %d tombstones, want 0", n)
	}
}

// redisCount returns how many keys of the Redis match pattern.
func redisCount(s *redistest.Server, pattern string) int {
	var n int
	_, _ = fmt.Sscan(s.Do("EVAL", "return #redis.call('KEYS', ARGV[1])", "0", pattern), &n)
	return n
}
