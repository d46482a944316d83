package session

import (
	"testing"
	"time"
)

// TestForgetHook checks which forgotten sessions the hook hears of: the
// table's own bounds, admin evictions and gone upstreams, with the
// upstream's ID after a failover; never the upstream's own answers.
func TestForgetHook(t *testing.T) {
	tbl, clk := newTestTable(t, 2, time.Minute)
	var got []Forgotten
	hook := &ForgetHook{Fn: func(f Forgotten) { got = append(got, f) }}
	tbl.SetForgetHook(hook)

	tbl.Learn("a", "u1")
	tbl.Learn("b", "u1")
	tbl.Learn("c", "u2") // pushes out a, unconfirmed
	tbl.Evict("b", EvictAdmin)
	tbl.Learn("d", "u2")
	tbl.KeepInit("d", (&Init{Body: []byte("{}")}).MovedTo("upstream-d"))
	tbl.Evict("c", EvictDelete) // the client's DELETE, passed through
	tbl.Learn("e", "u2")
	tbl.Evict("e", EvictUpstream404) // the upstream's 404
	clk.Advance(2 * time.Minute)
	tbl.Sweep() // d expires

	want := []Forgotten{
		{Key: "a", Dial: "u1", Reason: EvictUnconfirmed},
		{Key: "b", Dial: "u1", Reason: EvictAdmin},
		{Key: "d", Dial: "u2", UpstreamID: "upstream-d", Reason: EvictTTL},
	}
	if len(got) != len(want) {
		t.Fatalf("hook heard %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("forgotten %d: %+v, want %+v", i, got[i], want[i])
		}
	}

	if !tbl.ClearForgetHook(hook) || tbl.ClearForgetHook(hook) {
		t.Error("ClearForgetHook: want true once, then false")
	}
	tbl.Learn("f", "u1")
	tbl.Evict("f", EvictAdmin)
	if len(got) != len(want) {
		t.Errorf("a cleared hook heard %+v", got[len(want):])
	}
}
