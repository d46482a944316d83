package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestPrincipalSum(t *testing.T) {
	a, b := newPrincipalKeys(nil), newPrincipalKeys(nil)
	if a.sum("") != (principalSum{}) {
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
	if a.sum("alice") == (principalSum{}) {
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

// TestServeHTTPPrincipalMismatch: a request of a session bound to another
// principal gets exactly the answer of an unknown session, never reaches
// next (even with unknown_session forward), does not end the session with
// DELETE, and is counted.
func TestServeHTTPPrincipalMismatch(t *testing.T) {
	for _, unknown := range []string{UnknownSessionReject, UnknownSessionForward} {
		t.Run(unknown, func(t *testing.T) {
			h, _ := provisionHandler(t, &Handler{UnknownSession: unknown})
			h.table.SetBindPrincipal("{http.request.header.Authorization}")
			h.table.LearnFrom(testSessionID, "a:1", Origin{Principal: "Bearer alice"})
			serveOn := func(h *Handler, method, auth, id string) (*httptest.ResponseRecorder, int) {
				r := newRequest(method, id)
				r.Header.Set("Authorization", auth)
				caddyhttp.NewTestReplacer(r)
				rec, next := httptest.NewRecorder(), new(countingNext)
				if err := h.ServeHTTP(rec, r, next); err != nil {
					t.Fatal(err)
				}
				return rec, next.calls
			}
			serve := func(method, auth, id string) (*httptest.ResponseRecorder, int) { return serveOn(h, method, auth, id) }
			// The reference: an unknown session with unknown_session reject.
			ref, _ := provisionHandler(t, &Handler{Table: "reference/" + t.Name()})
			unknownRec, _ := serveOn(ref, http.MethodPost, "Bearer alice", "never-learned")
			for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
				rec, calls := serve(method, "Bearer mallory", testSessionID)
				if calls != 0 || rec.Code != http.StatusNotFound || rec.Body.String() != unknownRec.Body.String() ||
					rec.Header().Get("Content-Type") != unknownRec.Header().Get("Content-Type") {
					t.Errorf("%s as mallory: next called %d times, %d %q; want the unknown session's answer %d %q",
						method, calls, rec.Code, rec.Body, unknownRec.Code, unknownRec.Body)
				}
			}
			if got := h.table.Stats.PrincipalMismatches(); got != 3 {
				t.Errorf("PrincipalMismatches() = %d, want 3", got)
			}
			if rec, calls := serve(http.MethodPost, "Bearer alice", testSessionID); calls != 1 || rec.Code != http.StatusOK {
				t.Errorf("alice after mallory's DELETE: next called %d times, %d; want her session pinned", calls, rec.Code)
			}
		})
	}
}

// TestConflictingBindPrincipalInOneConfig: bind_principal is a table
// setting; two handlers of one config that share a table must agree.
func TestConflictingBindPrincipalInOneConfig(t *testing.T) {
	ctx := newContext(t)
	name := "bind-conflict/" + t.Name()
	for _, h := range []*Handler{{Table: name, BindPrincipal: "{http.auth.user.id}"}, {Table: name}} {
		if err := h.Provision(ctx); err != nil {
			t.Fatalf("agreeing settings: %v", err)
		}
	}
	b := &Handler{Table: name, BindPrincipal: "{http.request.header.Authorization}"}
	err := b.Provision(ctx)
	if err == nil || !strings.Contains(err.Error(), "bind_principal") || !strings.Contains(err.Error(), "Authorization") {
		t.Fatalf("conflicting bind_principal in one config: err = %v, want one that names the option and the value", err)
	}
}
