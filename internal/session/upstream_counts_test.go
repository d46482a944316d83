package session

import (
	"testing"
	"time"
)

// TestUpstreamCounters: each upstream counts its own sessions that left the
// table and those failed over away from it, and no other upstream's.
func TestUpstreamCounters(t *testing.T) {
	tbl, _ := newTestTable(t, 10, time.Hour)
	tbl.SetFailover(FailoverReinitialize, 0)
	init := &Init{Body: []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)}
	for _, s := range []struct{ id, dial string }{{"a1", "a:1"}, {"a2", "a:1"}, {"b1", "b:1"}} {
		if !tbl.LearnInit(s.id, s.dial, Origin{}, init) {
			t.Fatalf("LearnInit(%s, %s) = false", s.id, s.dial)
		}
	}
	tbl.Evict("a2", EvictAdmin)
	from, kept := tbl.InitOf("a1")
	if _, err := tbl.RecordMove("a1", from, kept, tbl.UseUpstream("b:1"), kept.MovedTo("NEW")); err != nil {
		t.Fatal(err)
	}
	a, b := tbl.KnownUpstream("a:1"), tbl.KnownUpstream("b:1")
	if a.Evicted() != 1 || a.MovedAway() != 1 || b.Evicted() != 0 || b.MovedAway() != 0 {
		t.Fatalf("a:1 evicted %d, moved away %d; b:1 evicted %d, moved away %d; want 1, 1, 0, 0",
			a.Evicted(), a.MovedAway(), b.Evicted(), b.MovedAway())
	}
	if a.LiveSessions() != 0 || b.LiveSessions() != 2 {
		t.Fatalf("live sessions a:1 %d, b:1 %d; want 0 and 2", a.LiveSessions(), b.LiveSessions())
	}
}
