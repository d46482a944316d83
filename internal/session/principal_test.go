package session

import (
	"testing"
	"time"
)

func TestPrincipalSum(t *testing.T) {
	a, b := newPrincipalKeys(nil), newPrincipalKeys(nil)
	if a.sum("") != (PrincipalSum{}) {
		t.Error(`sum("") is not the zero sum that marks an unbound session`)
	}
	if s1, s2 := a.sum("alice"), a.sum("alice"); s1 != s2 {
		t.Error("the same principal under one key gives two sums")
	}
	if a.sum("alice") == a.sum("alicf") || a.sum("alice") == a.sum("Alice") {
		t.Error("two principals give the same sum")
	}
	if a.sum("alice") == b.sum("alice") {
		t.Error("two keys give the same sum: the key is not random")
	}
	if a.sum("alice") == (PrincipalSum{}) {
		t.Error("a principal's sum is the zero sum")
	}
}

// TestTableBinding covers which principals may use a session.
func TestTableBinding(t *testing.T) {
	tbl, _ := newTestTable(t, 10, time.Hour)
	tbl.LearnFrom("bound", "a:1", Origin{Principal: "alice"})
	tbl.Learn("unbound", "a:1")
	for _, tc := range []struct {
		id, principal string
		found         bool
		mismatch      bool
	}{
		{"bound", "alice", true, false},
		{"bound", "mallory", false, true},
		{"bound", "", false, true},
		{"bound", "alice ", false, true},
		{"unbound", "", true, false},
		{"unbound", "mallory", true, false},
		{"never-learned", "alice", false, false},
	} {
		up, mismatch := tbl.LookupAs(tc.id, tc.principal)
		if (up != nil) != tc.found || mismatch != tc.mismatch {
			t.Errorf("LookupAs(%q, %q) = %v, %v; want found %v, mismatch %v", tc.id, tc.principal, up, mismatch, tc.found, tc.mismatch)
		}
	}
	if info, _ := tbl.Info("bound"); !info.Bound {
		t.Error("Info(bound).Bound = false")
	}
	if info, _ := tbl.Info("unbound"); info.Bound {
		t.Error("Info(unbound).Bound = true")
	}

	// off turns binding off, for sessions bound before too.
	tbl.SetBindPrincipal(BindPrincipalOff)
	if up, mismatch := tbl.LookupAs("bound", "mallory"); up == nil || mismatch {
		t.Errorf("bind_principal off: LookupAs(bound, mallory) = %v, %v; want found", up, mismatch)
	}
}

// TestTableMismatchChangesNothing: a request with the wrong principal
// neither refreshes the session's idle time nor its LRU position.
func TestTableMismatchChangesNothing(t *testing.T) {
	const ttl = 10 * time.Second
	tbl, clk := newTestTable(t, 2, ttl)
	tbl.LearnFrom("s", "a:1", Origin{Principal: "alice"})
	tbl.LearnFrom("t", "a:1", Origin{Principal: "bob"})
	clk.Advance(ttl / 2)
	if _, mismatch := tbl.LookupAs("s", "mallory"); !mismatch {
		t.Fatal("mallory's lookup of alice's session was not a mismatch")
	}
	clk.Advance(ttl/2 + time.Nanosecond)
	if up, _ := tbl.LookupAs("s", "alice"); up != nil {
		t.Error("a mismatched lookup refreshed the session's idle time: it outlived its TTL")
	}

	tbl, _ = newTestTable(t, 2, ttl)
	tbl.LearnFrom("s", "a:1", Origin{Principal: "alice"})
	tbl.LearnFrom("t", "a:1", Origin{Principal: "bob"})
	tbl.LookupAs("s", "mallory") // must not make "s" the most recently used
	tbl.Learn("u", "a:1")        // evicts the least recently used
	if up, _ := tbl.LookupAs("s", "alice"); up != nil {
		t.Error(`a mismatched lookup moved "s" in the LRU order`)
	}
	if up, _ := tbl.LookupAs("t", "bob"); up == nil {
		t.Error(`"t" was evicted instead of "s"`)
	}
}

// TestTableRelearnWithAnotherPrincipal: an initialize answered with a
// session ID the table holds for another principal rebinds it.
func TestTableRelearnWithAnotherPrincipal(t *testing.T) {
	tbl, _ := newTestTable(t, 10, time.Hour)
	tbl.LearnFrom("s", "a:1", Origin{Principal: "alice"})
	if tbl.LearnFrom("s", "a:1", Origin{Principal: "alice"}) {
		t.Error("learning the same session, upstream and principal changed the table")
	}
	if !tbl.LearnFrom("s", "a:1", Origin{Principal: "bob"}) {
		t.Fatal("learning the session for another principal did not change the table")
	}
	if _, mismatch := tbl.LookupAs("s", "alice"); !mismatch {
		t.Error("alice still owns the session")
	}
	wantEvictions(t, tbl, map[EvictReason]uint64{EvictRelearned: 1})
}
