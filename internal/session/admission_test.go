package session

import (
	"fmt"
	"testing"
	"time"
)

// TestTableFloodCannotEvictUsedSessions: 10,000 sessions learned and never
// used (an initialize flood) through a table of 100 push out only each
// other: the 30 sessions in use, 10 of them with an open GET stream, all
// stay. The flood's own sessions are evicted, as unconfirmed.
func TestTableFloodCannotEvictUsedSessions(t *testing.T) {
	tbl, clk := newTestTable(t, 100, time.Hour)
	for i := range 30 {
		id := fmt.Sprintf("real%d", i)
		tbl.Learn(id, "a:1")
		tbl.Lookup(id)
		if i < 10 {
			tbl.StreamOpened(id)
		}
	}
	for i := range 10_000 {
		tbl.Learn(fmt.Sprintf("flood%d", i), "b:1")
		if i%100 == 0 {
			clk.Advance(time.Second)
		}
	}
	for i := range 30 {
		if tbl.Lookup(fmt.Sprintf("real%d", i)) == nil {
			t.Errorf("real%d was evicted by the flood", i)
		}
	}
	if tbl.Len() != 100 || tbl.Unconfirmed() != 70 {
		t.Errorf("Len() = %d, Unconfirmed() = %d; want 100, 70", tbl.Len(), tbl.Unconfirmed())
	}
	wantEvictions(t, tbl, map[EvictReason]uint64{EvictUnconfirmed: 10_000 - 70})
}

// TestTableFullOfUsedSessions: when every session has been used, a new
// one takes the least recently used one's place (reason lru), and until it
// is used itself it is the first to go.
func TestTableFullOfUsedSessions(t *testing.T) {
	tbl, _ := newTestTable(t, 3, time.Hour)
	for _, id := range []string{"a", "b", "c"} {
		tbl.Learn(id, "a:1")
		tbl.Lookup(id)
	}
	tbl.Learn("new1", "a:1") // pushes out a, the least recently used
	tbl.Learn("new2", "a:1") // pushes out new1, never used
	for _, tc := range []struct {
		id   string
		want bool
	}{{"a", false}, {"b", true}, {"c", true}, {"new1", false}, {"new2", true}} {
		if got := tbl.Lookup(tc.id) != nil; got != tc.want {
			t.Errorf("%s present = %v, want %v", tc.id, got, tc.want)
		}
	}
	wantEvictions(t, tbl, map[EvictReason]uint64{EvictLRU: 1, EvictUnconfirmed: 1})
}

// TestTableNeverEvictsOpenStreams: the least recently used session is
// skipped while its GET stream is open, when learning and when shrinking;
// when every session has an open stream, a new session finds no room and
// is counted as evicted at once.
func TestTableNeverEvictsOpenStreams(t *testing.T) {
	tbl, _ := newTestTable(t, 3, time.Hour)
	for _, id := range []string{"a", "b", "c"} {
		tbl.Learn(id, "a:1")
		tbl.Lookup(id)
	}
	tbl.StreamOpened("a") // the least recently used
	tbl.Lookup("b")
	tbl.Lookup("c")
	tbl.Learn("d", "a:1")
	if tbl.Lookup("a") == nil || tbl.Lookup("b") != nil {
		t.Fatal("learning evicted a, whose GET stream is open, instead of b")
	}
	tbl.StreamOpened("c")
	tbl.StreamOpened("d")
	tbl.Configure(1, 0)
	if tbl.Len() != 3 {
		t.Fatalf("shrinking to 1 with 3 open streams: Len() = %d, want 3", tbl.Len())
	}
	if tbl.Learn("e", "a:1") || tbl.Lookup("e") != nil {
		t.Fatal("a table full of open streams learned e")
	}
	if got := liveSessions(tbl)["a:1"]; got != 3 {
		t.Errorf("LiveSessions = %d, want 3", got)
	}
	wantEvictions(t, tbl, map[EvictReason]uint64{EvictLRU: 2}) // b, and e at once
	if tbl.Stats.Learned() != 5 {
		t.Errorf("Learned() = %d, want 5", tbl.Stats.Learned())
	}
	tbl.StreamClosed("a")
	tbl.Configure(1, 0)
	if tbl.Lookup("a") != nil || tbl.Len() != 2 {
		t.Errorf("after a's stream closed, shrinking kept a; Len() = %d, want 2", tbl.Len())
	}
}

// TestTableClientCap: with max_unconfirmed_per_client 2, a client's third
// unconfirmed session pushes out its own first; other clients and used
// sessions are untouched, and a used session frees its client's slot.
func TestTableClientCap(t *testing.T) {
	tbl, _ := newTestTable(t, 100, time.Hour)
	tbl.SetClientCap(2, "{http.request.client_ip}")
	if tbl.ClientKey() != "{http.request.client_ip}" {
		t.Fatalf("ClientKey() = %q", tbl.ClientKey())
	}
	learn := func(id, client string) { tbl.LearnFrom(id, "a:1", Origin{Client: client}) }
	learn("x1", "10.0.0.1")
	learn("y1", "10.0.0.2")
	learn("x2", "10.0.0.1")
	learn("x3", "10.0.0.1") // pushes out x1
	learn("n1", "")         // no client: not capped
	if tbl.Lookup("x1") != nil {
		t.Error("x1 survived its client's third unconfirmed session")
	}
	for _, id := range []string{"y1", "x2", "x3", "n1"} {
		if tbl.Lookup(id) == nil {
			t.Errorf("%s was evicted", id)
		}
	}
	// x2 and x3 are used now: the client may open two more.
	learn("x4", "10.0.0.1")
	learn("x5", "10.0.0.1")
	if tbl.Lookup("x2") == nil || tbl.Lookup("x4") == nil || tbl.Lookup("x5") == nil {
		t.Error("used sessions freed no slot of their client")
	}
	wantEvictions(t, tbl, map[EvictReason]uint64{EvictClientCap: 1})
	tbl.mu.Lock()
	defer tbl.mu.Unlock()
	if len(tbl.perClient.clientOf) != 0 || len(tbl.perClient.sessions) != 0 {
		t.Errorf("bookkeeping of confirmed sessions left: %v %v", tbl.perClient.clientOf, tbl.perClient.sessions)
	}
}

// TestTableClientCapOff: without a cap, ClientKey is empty (the handler
// evaluates nothing) and one client may fill the table.
func TestTableClientCapOff(t *testing.T) {
	tbl, _ := newTestTable(t, 10, time.Hour)
	if tbl.ClientKey() != "" {
		t.Fatalf("ClientKey() = %q without a cap", tbl.ClientKey())
	}
	for i := range 10 {
		tbl.LearnFrom(fmt.Sprintf("s%d", i), "a:1", Origin{Client: "10.0.0.1"})
	}
	if tbl.Len() != 10 {
		t.Errorf("Len() = %d, want 10", tbl.Len())
	}
	wantEvictions(t, tbl, nil)
}
