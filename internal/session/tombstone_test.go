package session

import (
	"fmt"
	"testing"
	"time"
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
		ts.add(k, TombEnded, 100, int64(i))
	}
	if ts.len() != 3 || ts.get("a", 10) != 0 || ts.get("b", 10) != TombEnded || ts.get("d", 10) != TombEnded {
		t.Fatalf("after 4 writes into 3: len %d, a %d b %d d %d; want a dropped, b..d kept", ts.len(), ts.get("a", 10), ts.get("b", 10), ts.get("d", 10))
	}
	if ts.get("b", 100) != 0 || ts.get("b", 99) != TombEnded {
		t.Fatal("a tombstone must live until its expiry, and not at it")
	}
	ts.sweep(100)
	if ts.len() != 0 {
		t.Fatalf("%d tombstones left after every one expired", ts.len())
	}

	ts = newTombstones(4)
	ts.add("x", TombExpired, 50, 0)
	ts.add("x", TombEnded, 40, 1)
	if ts.get("x", 45) != TombEnded || ts.get("x", 49) != TombEnded || ts.get("x", 50) != 0 {
		t.Fatal("burying again must keep the later expiry and the stronger kind")
	}
	ts.add("y", TombEnded, 10, 0)
	ts.add("y", TombExpired, 30, 20) // the first expired at 10
	if ts.get("y", 25) != TombExpired {
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
		ts.add(k, TombEnded, 1<<40, int64(i))
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

// testSealedVersion begins the keys sealedKey makes, as the version byte
// of a decoded sealed session ID begins its table key.
const testSealedVersion byte = 4

// sealedKinds tells a table that the keys sealedKey makes are sealed IDs'.
var sealedKinds = KeyKinds{Sealed: func(k string) bool { return len(k) > 0 && k[0] == testSealedVersion }}

// sealedKey returns a table key shaped as a decoded sealed ID's.
func sealedKey(name string) string { return string([]byte{testSealedVersion}) + name }

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
	tbl.SetKeyKinds(sealedKinds)
	key := sealedKey("one")
	tbl.Learn(key, "10.0.0.1:80")
	tbl.Evict(key, EvictDelete)
	if tbl.Buried(key) != TombEnded || tbl.Adopt(key, "10.0.0.1:80", Origin{}) != nil {
		t.Fatal("a DELETEd sealed session must be buried, and not adopted")
	}
	tbl.Learn("plain", "10.0.0.1:80")
	tbl.Evict("plain", EvictAdmin)
	if tbl.Buried("plain") != 0 {
		t.Fatal("a table without failover buries no plain session")
	}
	life := time.Hour + TouchInterval(time.Hour)
	clk.Advance(life - time.Second)
	if tbl.Adopt(key, "10.0.0.1:80", Origin{}) != nil {
		t.Fatal("a tombstone must live session_ttl plus a touch interval")
	}
	clk.Advance(2 * time.Second)
	if tbl.Adopt(key, "10.0.0.1:80", Origin{}) == nil {
		t.Fatal("past its natural end, the ID is adopted again")
	}

	tbl.SetFailover(FailoverReinitialize, 0)
	tbl.SetFailoverMaxAge(3 * time.Hour)
	two := sealedKey("two")
	tbl.Learn(two, "10.0.0.1:80")
	tbl.Evict(two, EvictAdmin)
	clk.Advance(3*time.Hour - time.Second)
	if tbl.Buried(two) != TombEnded {
		t.Fatal("a sealed ID's tombstone must live failover_max_age when that is longer")
	}
	tbl.Learn("plain2", "10.0.0.1:80")
	tbl.Evict("plain2", EvictDelete)
	if tbl.Buried("plain2") != TombEnded {
		t.Fatal("a table with failover buries plain sessions too")
	}
	tbl.Learn("plain2", "10.0.0.2:80") // an upstream opens it again
	if tbl.Buried("plain2") != 0 {
		t.Fatal("a learned session must lift its tombstone")
	}

	idle := sealedKey("idle")
	tbl.Adopt(idle, "10.0.0.1:80", Origin{})
	clk.Advance(time.Hour + time.Second)
	tbl.Sweep()
	if tbl.Buried(idle) != TombExpired || tbl.Adopt(idle, "10.0.0.1:80", Origin{}) == nil {
		t.Fatalf("an expired sealed session: buried %d; want expired, and adopted for routing", tbl.Buried(idle))
	}

	tbl.Configure(2, 0)
	for i := range 3 {
		k := sealedKey(fmt.Sprint("cap", i))
		tbl.Learn(k, "10.0.0.1:80")
		tbl.Evict(k, EvictDelete)
	}
	if n := tbl.Tombstones(); n != 2 || tbl.Buried(sealedKey("cap0")) != 0 || tbl.Buried(sealedKey("cap2")) != TombEnded {
		t.Fatalf("%d tombstones with max_sessions 2; want the 2 latest", n)
	}
}
