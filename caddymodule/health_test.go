package caddymodule

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestUnhealthyClock: the clock keeps the start of an unhealthy spell until
// the upstream is seen healthy, then starts afresh.
func TestUnhealthyClock(t *testing.T) {
	var c unhealthyClock
	steps := []struct {
		dial string
		down bool
		now  int64
		want int64
	}{
		{"a", false, 1, 0},
		{"a", true, 2, 2},
		{"a", true, 5, 2},
		{"b", true, 6, 6},
		{"a", false, 7, 0},
		{"a", true, 9, 9},
		{"b", true, 10, 6},
	}
	for i, s := range steps {
		if got := c.note(s.dial, s.down, s.now); got != s.want {
			t.Errorf("step %d: note(%s, %v, %d) = %d, want %d", i, s.dial, s.down, s.now, got, s.want)
		}
	}
}

// TestPinnedUpstreamUnavailable: when the policy finds the session's
// upstream failing active health checks within the grace, the handler
// answers 503 with Retry-After and a JSON-RPC error and keeps the session,
// unless nothing listens at the upstream any more: then the session is gone
// (404, evicted).
func TestPinnedUpstreamUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	for _, tc := range []struct {
		name, dial string
		gone       bool
	}{
		{name: "listening", dial: ln.Addr().String()},
		{name: "refusing", dial: closedAddr, gone: true},
		{name: "unix socket missing", dial: "unix/" + filepath.Join(t.TempDir(), "none.sock"), gone: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := provisionHandler(t, &Handler{})
			h.table.Learn(testSessionID, tc.dial)
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				exchangeOf(r).unavailable = 7 // as the policy marks it
				return caddyhttp.Error(http.StatusServiceUnavailable, errors.New("no upstreams available"))
			})
			rec := httptest.NewRecorder()
			if err := h.ServeHTTP(rec, newRequest(http.MethodPost, testSessionID), next); err != nil {
				t.Fatalf("ServeHTTP: %v", err)
			}
			if tc.gone {
				checkRPCError(t, rec, http.StatusNotFound, CodeSessionNotFound, "its upstream is gone")
				wantEvictions(t, h.table, map[session.EvictReason]uint64{session.EvictUpstreamGone: 1})
				return
			}
			checkRPCError(t, rec, http.StatusServiceUnavailable, CodeUpstreamUnavailable, "failing health checks")
			if ra := rec.Header().Get("Retry-After"); ra != "7" {
				t.Errorf("Retry-After = %q, want 7", ra)
			}
			if lookupDial(h.table, testSessionID) != tc.dial || h.table.Stats.Unavailable() != 1 {
				t.Errorf("session lost or not counted: mapped to %q, %d unavailable", lookupDial(h.table, testSessionID), h.table.Stats.Unavailable())
			}
			wantEvictions(t, h.table, nil)
		})
	}
}
