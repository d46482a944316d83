package caddymodule

import (
	"sync"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

// The table helpers of internal/session's tests, for the tests here.

// fakeClock is a clock for [NewTable] that moves only when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// allReasons lists every eviction reason, for checking that only the
// expected counter moved.
var allReasons = session.EvictReasons[:]

// wantEvictions checks every eviction counter: those in want must have the
// given values, all others 0.
func wantEvictions(t *testing.T, tbl *session.Table, want map[session.EvictReason]uint64) {
	t.Helper()
	for _, r := range allReasons {
		if got := tbl.Evictions(r); got != want[r] {
			t.Errorf("Evictions(%s) = %d, want %d", r, got, want[r])
		}
	}
}

// liveSessions returns the table's LiveSessions by dial address.
func liveSessions(tbl *session.Table) map[string]int64 {
	m := map[string]int64{}
	for _, u := range tbl.Upstreams() {
		m[u.Dial()] = u.LiveSessions()
	}
	return m
}

// lookupDial returns the dial address Lookup gives for id, or "" on a miss.
func lookupDial(tbl *session.Table, id string) string {
	if u := tbl.Lookup(id); u != nil {
		return u.Dial()
	}
	return ""
}
