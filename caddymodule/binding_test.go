package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestServeHTTPPrincipalMismatch: a request of a session bound to another
// principal gets exactly the answer of an unknown session, never reaches
// next (even with unknown_session forward), does not end the session with
// DELETE, and is counted.
func TestServeHTTPPrincipalMismatch(t *testing.T) {
	for _, unknown := range []string{UnknownSessionReject, UnknownSessionForward} {
		t.Run(unknown, func(t *testing.T) {
			h, _ := provisionHandler(t, &Handler{UnknownSession: unknown})
			h.table.SetBindPrincipal("{http.request.header.Authorization}")
			h.table.LearnFrom(testSessionID, "a:1", session.Origin{Principal: "Bearer alice"})
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
	for _, h := range []*Handler{{Table: name, TableSettings: TableSettings{BindPrincipal: "{http.auth.user.id}"}}, {Table: name}} {
		if err := h.Provision(ctx); err != nil {
			t.Fatalf("agreeing settings: %v", err)
		}
	}
	b := &Handler{TableSettings: TableSettings{BindPrincipal: "{http.request.header.Authorization}"}, Table: name}
	err := b.Provision(ctx)
	if err == nil || !strings.Contains(err.Error(), "bind_principal") || !strings.Contains(err.Error(), "Authorization") {
		t.Fatalf("conflicting bind_principal in one config: err = %v, want one that names the option and the value", err)
	}
}
