package caddymodule

import (
	"net/http"
	"testing"
	"time"
)

// TestRefusal: which answers to a request opening a session refuse it, and
// how long the upstream then gets no new sessions.
func TestRefusal(t *testing.T) {
	for _, c := range []struct {
		status  int
		session bool
		want    bool
	}{
		{503, false, true}, {500, false, true}, {502, false, true}, {429, false, true},
		{503, true, false}, {200, false, false}, {404, false, false}, {400, false, false},
	} {
		h := http.Header{}
		if c.session {
			h.Set(HeaderSessionID, "s")
		}
		if got := refusal(c.status, h); got != c.want {
			t.Errorf("refusal(%d, session %v) = %v, want %v", c.status, c.session, got, c.want)
		}
	}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":     DefaultRefusalCooloff,
		"5":    5 * time.Second,
		"0":    minRefusalCooloff,
		"3600": maxRefusalCooloff,
		"soon": DefaultRefusalCooloff,
		now.Add(20 * time.Second).Format(http.TimeFormat): 20 * time.Second,
	} {
		h := http.Header{}
		if v != "" {
			h.Set("Retry-After", v)
		}
		if got := refusalCooloff(h, now); got != want {
			t.Errorf("Retry-After %q: cooloff %v, want %v", v, got, want)
		}
	}
}
