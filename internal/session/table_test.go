package session

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

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

// newTestTable returns a table reading time from a fake clock.
func newTestTable(t testing.TB, maxSessions int, ttl time.Duration) (*Table, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	tbl, err := NewTable(t.Name(), maxSessions, ttl, clk.Now)
	if err != nil {
		t.Fatalf("NewTable: %v", err)
	}
	return tbl, clk
}

// allReasons lists every eviction reason, for checking that only the
// expected counter moved.
var allReasons = []EvictReason{EvictTTL, EvictLRU, EvictDelete, EvictUpstream404, EvictUpstreamGone, EvictAdmin, EvictRelearned, EvictUnconfirmed, EvictClientCap, EvictStreamClosed}

// wantEvictions checks every eviction counter: those in want must have the
// given values, all others 0.
func wantEvictions(t *testing.T, tbl *Table, want map[EvictReason]uint64) {
	t.Helper()
	for _, r := range allReasons {
		if got := tbl.Evictions(r); got != want[r] {
			t.Errorf("Evictions(%s) = %d, want %d", r, got, want[r])
		}
	}
}

// liveSessions returns the table's LiveSessions by dial address.
func liveSessions(tbl *Table) map[string]int64 {
	m := map[string]int64{}
	for _, u := range tbl.Upstreams() {
		m[u.Dial()] = u.LiveSessions()
	}
	return m
}

// lookupDial returns the dial address Lookup gives for id, or "" on a miss.
func lookupDial(tbl *Table, id string) string {
	if u := tbl.Lookup(id); u != nil {
		return u.Dial()
	}
	return ""
}

func TestNewTable(t *testing.T) {
	for _, tc := range []struct {
		max     int
		wantErr bool
	}{
		{max: -1, wantErr: true},
		{max: 0, wantErr: true},
		{max: 1},
		{max: DefaultMaxSessions},
	} {
		t.Run(fmt.Sprint(tc.max), func(t *testing.T) {
			tbl, err := NewTable("t", tc.max, time.Hour, nil)
			if tc.wantErr {
				if err == nil {
					t.Fatal("NewTable succeeded, want an error")
				}
				if !strings.Contains(err.Error(), "max_sessions must be at least 1") {
					t.Errorf("error %q does not say max_sessions must be at least 1", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewTable: %v", err)
			}
			if tbl.Name() != "t" || tbl.Len() != 0 {
				t.Errorf("Name() = %q, Len() = %d; want %q, 0", tbl.Name(), tbl.Len(), "t")
			}
		})
	}
}

func TestTableLearnLookup(t *testing.T) {
	tbl, _ := newTestTable(t, 10, time.Hour)
	learns := []struct{ id, dial string }{
		{"s1", "a:1"},
		{"s2", "b:1"},
		{"s3", "a:1"},
	}
	for _, l := range learns {
		if !tbl.Learn(l.id, l.dial) {
			t.Fatalf("Learn(%q, %q) = false, want true", l.id, l.dial)
		}
	}
	for _, tc := range []struct{ id, want string }{
		{"s1", "a:1"},
		{"s2", "b:1"},
		{"s3", "a:1"},
		{"unknown", ""},
		{"S1", ""}, // IDs are case-sensitive
		{"", ""},
	} {
		if got := lookupDial(tbl, tc.id); got != tc.want {
			t.Errorf("Lookup(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
	if tbl.Len() != 3 {
		t.Errorf("Len() = %d, want 3", tbl.Len())
	}
	if got, want := liveSessions(tbl), map[string]int64{"a:1": 2, "b:1": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("LiveSessions = %v, want %v", got, want)
	}
	// One record per dial address, shared by its sessions.
	if tbl.Lookup("s1") != tbl.Lookup("s3") {
		t.Error("sessions of the same upstream got different *Upstream records")
	}
	wantEvictions(t, tbl, nil)
}

// TestTableRelearn covers Learn of a session the table already holds: the
// same upstream changes nothing, another upstream's newer answer wins.
func TestTableRelearn(t *testing.T) {
	const ttl = 10 * time.Second
	for _, tc := range []struct {
		name      string
		advance   time.Duration
		dial      string
		want      bool
		wantDial  string
		wantLive  map[string]int64
		wantEvict map[EvictReason]uint64
	}{
		{
			name: "same upstream, live", advance: ttl, dial: "a:1",
			want: false, wantDial: "a:1",
			wantLive: map[string]int64{"a:1": 1},
		},
		{
			name: "other upstream, live", advance: time.Second, dial: "b:1",
			want: true, wantDial: "b:1",
			wantLive:  map[string]int64{"a:1": 0, "b:1": 1},
			wantEvict: map[EvictReason]uint64{EvictRelearned: 1},
		},
		{
			name: "same upstream, expired", advance: ttl + 1, dial: "a:1",
			want: true, wantDial: "a:1",
			wantLive:  map[string]int64{"a:1": 1},
			wantEvict: map[EvictReason]uint64{EvictTTL: 1},
		},
		{
			name: "other upstream, expired", advance: ttl + 1, dial: "b:1",
			want: true, wantDial: "b:1",
			wantLive:  map[string]int64{"a:1": 0, "b:1": 1},
			wantEvict: map[EvictReason]uint64{EvictRelearned: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, clk := newTestTable(t, 10, ttl)
			if !tbl.Learn("s", "a:1") {
				t.Fatal("first Learn = false, want true")
			}
			clk.Advance(tc.advance)
			if got := tbl.Learn("s", tc.dial); got != tc.want {
				t.Errorf("second Learn(s, %s) = %v, want %v", tc.dial, got, tc.want)
			}
			if got := lookupDial(tbl, "s"); got != tc.wantDial {
				t.Errorf("Lookup = %q, want %q", got, tc.wantDial)
			}
			for dial, want := range tc.wantLive {
				if got := liveSessions(tbl)[dial]; got != want {
					t.Errorf("LiveSessions of %s = %d, want %d", dial, got, want)
				}
			}
			if tbl.Len() != 1 {
				t.Errorf("Len() = %d, want 1", tbl.Len())
			}
			wantEvictions(t, tbl, tc.wantEvict)
		})
	}
}

func TestTableTTL(t *testing.T) {
	const ttl = 10 * time.Second
	// step is one thing done to session "s", learned for a:1 at time 0.
	type step struct {
		advance time.Duration // first move the clock
		do      string        // "lookup", "open", "close", "sweep", "learn-a"
		want    string        // lookup: dial or ""; sweep: removed count; learn-a: "true"/"false"
	}
	for _, tc := range []struct {
		name  string
		steps []step
		// wantTTL is the final count of ttl evictions.
		wantTTL uint64
	}{
		{
			name:  "live at exactly ttl idle",
			steps: []step{{advance: ttl, do: "lookup", want: "a:1"}},
		},
		{
			name:    "expired after ttl idle",
			steps:   []step{{advance: ttl + time.Nanosecond, do: "lookup", want: ""}},
			wantTTL: 1,
		},
		{
			name: "lookups refresh the idle time",
			steps: []step{
				{advance: ttl - time.Second, do: "lookup", want: "a:1"},
				{advance: ttl - time.Second, do: "lookup", want: "a:1"},
				{advance: ttl - time.Second, do: "lookup", want: "a:1"},
				{advance: ttl + time.Nanosecond, do: "lookup", want: ""},
			},
			wantTTL: 1,
		},
		{
			name: "every lookup refreshes the idle time",
			steps: []step{
				{advance: time.Nanosecond, do: "lookup", want: "a:1"},
				{advance: ttl, do: "lookup", want: "a:1"},
				{advance: ttl, do: "lookup", want: "a:1"},
				{advance: ttl + time.Nanosecond, do: "lookup", want: ""},
			},
			wantTTL: 1,
		},
		{
			name: "open stream prevents expiry until closed",
			steps: []step{
				{do: "open"},
				{advance: 100 * ttl, do: "sweep", want: "0"},
				{advance: 100 * ttl, do: "lookup", want: "a:1"},
				{advance: 100 * ttl, do: "close"}, // counts as use
				{advance: ttl, do: "sweep", want: "0"},
				{advance: time.Nanosecond, do: "sweep", want: "1"},
				{do: "lookup", want: ""},
			},
			wantTTL: 1,
		},
		{
			name: "open stream prevents expiry through lookup",
			steps: []step{
				{do: "open"},
				{advance: 100 * ttl, do: "lookup", want: "a:1"},
				{do: "close"},
				{advance: ttl + time.Nanosecond, do: "lookup", want: ""},
			},
			wantTTL: 1,
		},
		{
			name: "every opened stream must close",
			steps: []step{
				{do: "open"},
				{do: "open"},
				{advance: 2 * ttl, do: "close"},
				{advance: 2 * ttl, do: "sweep", want: "0"},
				{advance: 2 * ttl, do: "lookup", want: "a:1"},
				{do: "close"},
				{advance: ttl + time.Nanosecond, do: "lookup", want: ""},
			},
			wantTTL: 1,
		},
		{
			// An unmatched close must not leave the count negative, or
			// the next open would not protect the session.
			name: "unmatched close does not go below zero",
			steps: []step{
				{do: "close"},
				{do: "close"},
				{do: "open"},
				{advance: 2 * ttl, do: "sweep", want: "0"},
				{do: "lookup", want: "a:1"},
			},
		},
		{
			name: "learning an expired session starts it afresh",
			steps: []step{
				{advance: ttl + time.Nanosecond, do: "learn-a", want: "true"},
				{advance: ttl, do: "lookup", want: "a:1"},
			},
			wantTTL: 1,
		},
		{
			name: "learning a live session changes nothing",
			steps: []step{
				{advance: ttl, do: "learn-a", want: "false"},
				// ... and is no use: it does not refresh the idle time.
				{advance: time.Nanosecond, do: "lookup", want: ""},
			},
			wantTTL: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, clk := newTestTable(t, 10, ttl)
			tbl.Learn("s", "a:1")
			for i, s := range tc.steps {
				clk.Advance(s.advance)
				var got string
				switch s.do {
				case "lookup":
					got = lookupDial(tbl, "s")
				case "open":
					tbl.StreamOpened("s")
				case "close":
					tbl.StreamClosed("s")
				case "sweep":
					got = fmt.Sprint(tbl.Sweep())
				case "learn-a":
					got = fmt.Sprint(tbl.Learn("s", "a:1"))
				default:
					t.Fatalf("bad step %q", s.do)
				}
				if got != s.want {
					t.Fatalf("step %d (%s after +%v): got %q, want %q", i, s.do, s.advance, got, s.want)
				}
			}
			wantEvictions(t, tbl, map[EvictReason]uint64{EvictTTL: tc.wantTTL})
			live := int64(0)
			for _, u := range tbl.Upstreams() {
				live += u.LiveSessions()
			}
			if live != int64(tbl.Len()) {
				t.Errorf("sum of LiveSessions = %d, Len() = %d", live, tbl.Len())
			}
		})
	}
}

func TestTableStreamOfUnknownSession(t *testing.T) {
	tbl, _ := newTestTable(t, 10, time.Hour)
	tbl.StreamOpened("nope")
	tbl.StreamClosed("nope")
	if tbl.Len() != 0 || tbl.Lookup("nope") != nil {
		t.Errorf("stream calls created a session: Len() = %d", tbl.Len())
	}
}

func TestTableSweep(t *testing.T) {
	const ttl = 10 * time.Second
	for _, tc := range []struct {
		name string
		// Sessions s0..s(n-1) are learned one second apart, from time 0;
		// then the clock moves to sweepAt and the table is swept.
		n       int
		streams []int // sessions with an open stream
		sweepAt time.Duration
		want    int
	}{
		{name: "none expired", n: 5, sweepAt: ttl, want: 0},
		{name: "oldest expired", n: 5, sweepAt: 12*time.Second + 500*time.Millisecond, want: 3},
		{name: "all expired", n: 5, sweepAt: time.Hour, want: 5},
		{name: "open stream kept", n: 5, streams: []int{1}, sweepAt: 12*time.Second + 500*time.Millisecond, want: 2},
		{name: "all streaming", n: 3, streams: []int{0, 1, 2}, sweepAt: time.Hour, want: 0},
		{name: "more than one batch", n: 3*sweepBatch + 7, sweepAt: time.Hour, want: 3*sweepBatch + 7},
		{name: "exactly one batch", n: sweepBatch, sweepAt: time.Hour, want: sweepBatch},
		{name: "empty", n: 0, sweepAt: time.Hour, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, clk := newTestTable(t, 10*sweepBatch, ttl)
			for i := range tc.n {
				if i > 0 {
					// At most 4 s apart in total for small tables, so the
					// times in the cases above hold; big ones all expire.
					clk.Advance(time.Second)
				}
				tbl.Learn(fmt.Sprintf("s%d", i), "a:1")
			}
			for _, i := range tc.streams {
				tbl.StreamOpened(fmt.Sprintf("s%d", i))
			}
			clk.Advance(tc.sweepAt - time.Duration(max(tc.n-1, 0))*time.Second)
			if got := tbl.Sweep(); got != tc.want {
				t.Errorf("Sweep() = %d, want %d", got, tc.want)
			}
			if got := tbl.Len(); got != tc.n-tc.want {
				t.Errorf("Len() = %d after Sweep, want %d", got, tc.n-tc.want)
			}
			if got := liveSessions(tbl)["a:1"]; got != int64(tc.n-tc.want) {
				t.Errorf("LiveSessions = %d, want %d", got, tc.n-tc.want)
			}
			wantEvictions(t, tbl, map[EvictReason]uint64{EvictTTL: uint64(tc.want)})
			if got := tbl.Sweep(); got != 0 {
				t.Errorf("second Sweep() = %d, want 0", got)
			}
			// The survivors are the newest ones and the streaming ones.
			streaming := map[int]bool{}
			for _, i := range tc.streams {
				streaming[i] = true
			}
			if tc.n <= 10 {
				for i := range tc.n {
					id := fmt.Sprintf("s%d", i)
					expired := tc.sweepAt-time.Duration(i)*time.Second > ttl && !streaming[i]
					if got := tbl.Lookup(id) != nil; got == expired {
						t.Errorf("%s present = %v after Sweep, want %v", id, got, !expired)
					}
				}
			}
		})
	}
}

func TestTableLRU(t *testing.T) {
	tbl, clk := newTestTable(t, 3, time.Hour)
	for _, id := range []string{"a", "b", "c"} {
		tbl.Learn(id, "up:"+id)
		clk.Advance(time.Second)
	}
	// "a" is the oldest learned but the only one used: "b", the oldest
	// never used, must go.
	if lookupDial(tbl, "a") != "up:a" {
		t.Fatal("a not found")
	}
	if !tbl.Learn("d", "up:d") {
		t.Fatal("Learn(d) = false")
	}
	for _, tc := range []struct{ id, want string }{{"a", "up:a"}, {"b", ""}, {"c", "up:c"}, {"d", "up:d"}} {
		if got := lookupDial(tbl, tc.id); got != tc.want {
			t.Errorf("Lookup(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
	// The lookups above ran in order a, b, c, d: every session is used and
	// "a" is the least recently used, even though no time passed.
	tbl.Learn("e", "up:e")
	if tbl.Lookup("a") != nil {
		t.Error("a survived, want it evicted as least recently used")
	}
	if tbl.Len() != 3 {
		t.Errorf("Len() = %d, want 3", tbl.Len())
	}
	wantEvictions(t, tbl, map[EvictReason]uint64{EvictUnconfirmed: 1, EvictLRU: 1})
	if got := liveSessions(tbl); got["up:a"] != 0 || got["up:b"] != 0 || got["up:c"] != 1 || got["up:d"] != 1 || got["up:e"] != 1 {
		t.Errorf("LiveSessions = %v", got)
	}
}

func TestTableConfigure(t *testing.T) {
	tbl, clk := newTestTable(t, 5, 10*time.Second)
	for i := range 5 {
		tbl.Learn(fmt.Sprintf("s%d", i), "a:1")
	}
	tbl.Lookup("s0") // most recently used now

	tbl.Configure(2, 0) // shrink; ttl unchanged
	if tbl.Len() != 2 {
		t.Fatalf("Len() = %d after shrinking to 2, want 2", tbl.Len())
	}
	for _, tc := range []struct {
		id   string
		want bool
	}{{"s0", true}, {"s1", false}, {"s2", false}, {"s3", false}, {"s4", true}} {
		if got := tbl.Lookup(tc.id) != nil; got != tc.want {
			t.Errorf("%s present = %v after shrinking, want %v", tc.id, got, tc.want)
		}
	}
	wantEvictions(t, tbl, map[EvictReason]uint64{EvictUnconfirmed: 3}) // never used: they go first
	if got := liveSessions(tbl)["a:1"]; got != 2 {
		t.Errorf("LiveSessions = %d, want 2", got)
	}

	// ttl 0 left it at 10 s.
	clk.Advance(10*time.Second + time.Nanosecond)
	if tbl.Sweep() != 2 {
		t.Error("ttl changed by Configure(2, 0)")
	}

	// Growing and changing the ttl evicts nothing.
	tbl.Configure(0, time.Minute) // size unchanged
	tbl.Learn("x", "a:1")
	tbl.Learn("y", "a:1")
	tbl.Learn("z", "a:1") // max is still 2
	if tbl.Len() != 2 || tbl.Evictions(EvictUnconfirmed) != 4 {
		t.Errorf("Len() = %d, unconfirmed evictions = %d; want 2, 4", tbl.Len(), tbl.Evictions(EvictUnconfirmed))
	}
	tbl.Configure(100, 0)
	for i := range 50 {
		tbl.Learn(fmt.Sprintf("n%d", i), "a:1")
	}
	if tbl.Len() != 52 || tbl.Evictions(EvictUnconfirmed) != 4 || tbl.Evictions(EvictLRU) != 0 {
		t.Errorf("Len() = %d, unconfirmed and lru evictions = %d, %d after growing; want 52, 4, 0",
			tbl.Len(), tbl.Evictions(EvictUnconfirmed), tbl.Evictions(EvictLRU))
	}
	clk.Advance(59 * time.Second)
	if n := tbl.Sweep(); n != 0 {
		t.Errorf("Sweep() = %d under the new 1m ttl, want 0", n)
	}
}

// TestTableEvictionPaths checks that every way out of the table gives the
// session's upstream back its live count, exactly once, and counts the reason.
func TestTableEvictionPaths(t *testing.T) {
	const ttl = 10 * time.Second
	for _, tc := range []struct {
		name   string
		evict  func(tbl *Table, clk *fakeClock) // removes "s"
		reason EvictReason
	}{
		{"ttl via lookup", func(tbl *Table, clk *fakeClock) { clk.Advance(ttl + 1); tbl.Lookup("s") }, EvictTTL},
		{"ttl via sweep", func(tbl *Table, clk *fakeClock) { clk.Advance(ttl + 1); tbl.Sweep() }, EvictTTL},
		{"ttl via learn", func(tbl *Table, clk *fakeClock) {
			clk.Advance(ttl + 1)
			tbl.Learn("s", "a:1")
			tbl.Evict("s", EvictAdmin)
		}, EvictTTL},
		{"relearned", func(tbl *Table, _ *fakeClock) { tbl.Learn("s", "b:1"); tbl.Evict("s", EvictAdmin) }, EvictRelearned},
		{"lru via learn", func(tbl *Table, _ *fakeClock) { tbl.Learn("t", "b:1"); tbl.Lookup("t"); tbl.Learn("u", "b:1") }, EvictLRU},
		{"lru via configure", func(tbl *Table, _ *fakeClock) { tbl.Learn("t", "b:1"); tbl.Lookup("t"); tbl.Configure(1, 0) }, EvictLRU},
		{"delete", func(tbl *Table, _ *fakeClock) { tbl.Evict("s", EvictDelete) }, EvictDelete},
		{"upstream_404", func(tbl *Table, _ *fakeClock) { tbl.Evict("s", EvictUpstream404) }, EvictUpstream404},
		{"upstream_gone", func(tbl *Table, _ *fakeClock) { tbl.Evict("s", EvictUpstreamGone) }, EvictUpstreamGone},
		{"admin", func(tbl *Table, _ *fakeClock) { tbl.Evict("s", EvictAdmin) }, EvictAdmin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, clk := newTestTable(t, 2, ttl)
			tbl.Learn("s", "a:1")
			up := tbl.Lookup("s")
			if up.LiveSessions() != 1 {
				t.Fatalf("LiveSessions = %d after Learn, want 1", up.LiveSessions())
			}
			tc.evict(tbl, clk)
			if tbl.Lookup("s") != nil {
				t.Error("session still present")
			}
			if up.LiveSessions() != 0 {
				t.Errorf("LiveSessions of a:1 = %d after eviction, want 0", up.LiveSessions())
			}
			if got := tbl.Evictions(tc.reason); got != 1 {
				t.Errorf("Evictions(%s) = %d, want 1", tc.reason, got)
			}
			// Evicting again finds nothing and changes nothing.
			if tbl.Evict("s", tc.reason) {
				t.Error("second Evict = true, want false")
			}
			if tbl.Evict("never-learned", EvictAdmin) {
				t.Error("Evict of an unknown session = true, want false")
			}
			if up.LiveSessions() != 0 {
				t.Errorf("LiveSessions = %d after a second Evict, want 0", up.LiveSessions())
			}
			if got := tbl.Evictions(tc.reason); got != 1 {
				t.Errorf("Evictions(%s) = %d after a second Evict, want 1", tc.reason, got)
			}
			var live int64
			for _, u := range tbl.Upstreams() {
				if u.LiveSessions() < 0 {
					t.Errorf("LiveSessions of %s = %d < 0", u.Dial(), u.LiveSessions())
				}
				live += u.LiveSessions()
			}
			if live != int64(tbl.Len()) {
				t.Errorf("sum of LiveSessions = %d, Len() = %d", live, tbl.Len())
			}
		})
	}
}

// TestTableConcurrent hammers a small table from many goroutines; run it
// with -race. At the end every upstream's live count must match the table.
func TestTableConcurrent(t *testing.T) {
	const (
		goroutines = 16
		ops        = 3000
		ids        = 400
	)
	tbl, clk := newTestTable(t, 150, 5*time.Second)
	dials := []string{"a:1", "b:1", "c:1"}
	reasons := []EvictReason{EvictDelete, EvictUpstream404, EvictUpstreamGone, EvictAdmin}
	var learned atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range ops {
				id := fmt.Sprintf("s%d", rng.IntN(ids))
				switch op := rng.IntN(100); {
				case op < 35:
					if tbl.Learn(id, dials[rng.IntN(len(dials))]) {
						learned.Add(1)
					}
				case op < 70:
					tbl.Lookup(id)
				case op < 80:
					tbl.Evict(id, reasons[rng.IntN(len(reasons))])
				case op < 88:
					tbl.StreamOpened(id)
					tbl.StreamClosed(id)
				case op < 92:
					clk.Advance(time.Second)
				case op < 94:
					tbl.Sweep()
				case op < 96:
					tbl.Configure(100+rng.IntN(100), 0)
				default:
					_ = tbl.Len()
					for _, u := range tbl.Upstreams() {
						_ = u.LiveSessions()
					}
				}
			}
		})
	}
	wg.Wait()

	var live int64
	for _, u := range tbl.Upstreams() {
		if u.LiveSessions() < 0 {
			t.Errorf("LiveSessions of %s = %d < 0", u.Dial(), u.LiveSessions())
		}
		live += u.LiveSessions()
	}
	if live != int64(tbl.Len()) {
		t.Errorf("sum of LiveSessions = %d, Len() = %d", live, tbl.Len())
	}
	var evicted uint64
	for _, r := range allReasons {
		evicted += tbl.Evictions(r)
	}
	if got := learned.Load() - int64(evicted); got != int64(tbl.Len()) {
		t.Errorf("learned %d - evicted %d = %d, Len() = %d", learned.Load(), evicted, got, tbl.Len())
	}
	t.Logf("learned %d, evicted %d, left %d", learned.Load(), evicted, tbl.Len())
}

func TestJanitorInterval(t *testing.T) {
	for _, tc := range []struct{ ttl, want time.Duration }{
		{time.Millisecond, time.Second},
		{8 * time.Second, time.Second},
		{16 * time.Second, 2 * time.Second},
		{8 * time.Minute, time.Minute},
		{DefaultSessionTTL, time.Minute},
	} {
		if got := JanitorInterval(tc.ttl); got != tc.want {
			t.Errorf("janitorInterval(%v) = %v, want %v", tc.ttl, got, tc.want)
		}
	}
}

func TestTableJanitor(t *testing.T) {
	tbl, clk := newTestTable(t, 10, time.Second)
	tbl.Learn("s", "a:1")
	clk.Advance(time.Hour)
	tbl.StartJanitor(func(time.Duration) time.Duration { return time.Millisecond })
	// Wait for the janitor's first sweep (real time: its ticker).
	deadline := time.Now().Add(10 * time.Second)
	for tbl.Len() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := tbl.Destruct(); err != nil {
		t.Errorf("Destruct: %v", err)
	}
	if tbl.Len() != 0 {
		t.Error("the janitor did not sweep the expired session")
	}
	// Destruct of a table without a janitor is a no-op.
	other, _ := newTestTable(t, 1, time.Second)
	if err := other.Destruct(); err != nil {
		t.Errorf("Destruct without janitor: %v", err)
	}
}

func TestTableEvictUpstream(t *testing.T) {
	tbl, _ := newTestTable(t, 10, time.Hour)
	for i, dial := range []string{"a:1", "b:1", "a:1", "a:1", "b:1"} {
		tbl.Learn(fmt.Sprintf("s%d", i), dial)
	}
	if n := tbl.EvictUpstream("a:1", EvictAdmin); n != 3 {
		t.Fatalf("EvictUpstream(a:1) = %d, want 3", n)
	}
	if tbl.Len() != 2 || tbl.KnownUpstream("a:1").LiveSessions() != 0 || tbl.KnownUpstream("b:1").LiveSessions() != 2 {
		t.Errorf("after evicting a:1: Len %d, a:1 live %d, b:1 live %d; want 2, 0, 2",
			tbl.Len(), tbl.KnownUpstream("a:1").LiveSessions(), tbl.KnownUpstream("b:1").LiveSessions())
	}
	if got := tbl.Evictions(EvictAdmin); got != 3 {
		t.Errorf("admin evictions = %d, want 3", got)
	}
	if n := tbl.EvictUpstream("nowhere:1", EvictAdmin); n != 0 {
		t.Errorf("EvictUpstream of an unknown upstream = %d, want 0", n)
	}
}

// TestTableUsedMoreOftenThanTTLNeverExpires: a session whose uses are
// always less than its TTL apart stays, however short the TTL; idle for
// longer than its TTL, it is gone.
func TestTableUsedMoreOftenThanTTLNeverExpires(t *testing.T) {
	for _, ttl := range []time.Duration{MinSessionTTL, 10 * time.Second, DefaultSessionTTL} {
		for _, gap := range []time.Duration{ttl * 6 / 10, ttl - time.Millisecond, ttl} {
			t.Run(fmt.Sprintf("ttl %v every %v", ttl, gap), func(t *testing.T) {
				tbl, clk := newTestTable(t, 10, ttl)
				tbl.Learn("s", "a:1")
				for i := range 500 {
					clk.Advance(gap)
					tbl.Sweep()
					if lookupDial(tbl, "s") == "" {
						t.Fatalf("use %d, %v after the previous one: session expired", i+1, gap)
					}
				}
				clk.Advance(ttl + time.Nanosecond)
				if got := tbl.Sweep(); got != 1 {
					t.Fatalf("idle for ttl + 1ns: Sweep() = %d, want 1", got)
				}
			})
		}
	}
}

// TestInvalidEvictReason: a reason that is none of the Evict constants (the
// zero value, a conversion from a number) evicts and counts nothing, and
// never indexes out of range.
func TestInvalidEvictReason(t *testing.T) {
	tbl, _ := newTestTable(t, 4, time.Hour)
	tbl.Learn("s", "a:1")
	for _, r := range []EvictReason{0, EvictReason(len(evictReasonNames)), 255} {
		if tbl.Evict("s", r) || tbl.EvictUpstream("a:1", r) != 0 {
			t.Errorf("%v evicted the session", r)
		}
		if r.Valid() || tbl.Evictions(r) != 0 {
			t.Errorf("%v: Valid %v, Evictions %d; want false, 0", r, r.Valid(), tbl.Evictions(r))
		}
		if want := fmt.Sprintf("EvictReason(%d)", r); r.String() != want {
			t.Errorf("String = %q, want %q", r.String(), want)
		}
	}
	if up := tbl.Lookup("s"); up == nil || up.LiveSessions() != 1 {
		t.Fatalf("the session was lost: %v", up)
	}
	wantEvictions(t, tbl, nil)
	for i, r := range EvictReasons {
		if !r.Valid() || r.String() != evictReasonNames[i+1] {
			t.Errorf("%d: Valid %v, String %q", r, r.Valid(), r.String())
		}
	}
}

// TestTableTouchResolution: the uses of a confirmed session are recorded
// per touch interval (an eighth of the TTL here). A use within the interval
// that a recorded use covers does not move the session in the LRU order,
// a use after the interval does; and a session used within an interval is
// still forgotten once idle for the TTL: never before, at most one interval
// after.
func TestTableTouchResolution(t *testing.T) {
	const ttl = 80 * time.Second
	every := TouchInterval(ttl) // 10 s
	for _, tc := range []struct {
		name  string
		gap   time.Duration // from the recorded uses to the last use of "a"
		wantA bool          // whether "a" survives the learn of "c"
	}{
		{"used within the interval: not moved", every / 2, false},
		{"used after the interval: moved", every, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, clk := newTestTable(t, 2, ttl)
			tbl.Learn("a", "up:a")
			tbl.Learn("b", "up:b")
			for range 2 { // the first use confirms, the second covers the interval
				lookupDial(tbl, "a")
				lookupDial(tbl, "b")
				clk.Advance(time.Second)
			}
			clk.Advance(tc.gap - 2*time.Second)
			lookupDial(tbl, "a")
			tbl.Learn("c", "up:c") // pushes out the least recently used
			if got := lookupDial(tbl, "a") != ""; got != tc.wantA {
				t.Errorf("a present = %v after learning c, want %v", got, tc.wantA)
			}
			if got := lookupDial(tbl, "b") != ""; got == tc.wantA {
				t.Errorf("b present = %v after learning c, want %v", got, !tc.wantA)
			}
			wantEvictions(t, tbl, map[EvictReason]uint64{EvictLRU: 1})
		})
	}
	t.Run("idle session expires", func(t *testing.T) {
		tbl, clk := newTestTable(t, 2, ttl)
		tbl.Learn("s", "a:1")
		lookupDial(tbl, "s") // confirms s, recorded exactly
		clk.Advance(time.Second)
		lookupDial(tbl, "s") // records the end of the interval, 10 s
		clk.Advance(4 * time.Second)
		if lookupDial(tbl, "s") != "a:1" { // recorded already, at 5 s
			t.Fatal("s not found")
		}
		if info, _ := tbl.Info("s"); info.Idle != 0 {
			t.Errorf("Idle = %v within the recorded interval, want 0", info.Idle)
		}
		clk.Advance(ttl) // idle for exactly the ttl since its last use
		if n := tbl.Sweep(); n != 0 {
			t.Fatalf("Sweep() = %d at ttl after the last use, want 0", n)
		}
		clk.Advance(every - 5*time.Second - time.Nanosecond) // the end of the interval plus the ttl
		if n := tbl.Sweep(); n != 0 {
			t.Fatalf("Sweep() = %d at the interval's end plus the ttl, want 0", n)
		}
		clk.Advance(time.Nanosecond)
		if n := tbl.Sweep(); n != 1 {
			t.Fatalf("Sweep() = %d one interval past the ttl, want 1", n)
		}
		if lookupDial(tbl, "s") != "" {
			t.Error("expired session still found")
		}
	})
}

// TestInvalidEra: an Era that is none of the constants counts nothing and
// names itself, and never indexes out of range.
func TestInvalidEra(t *testing.T) {
	var s Stats
	s.eras[EraModern].Add(1)
	for _, e := range []Era{0, Era(len(EraNames)), 255} {
		if e.Valid() || s.Requests(e) != 0 {
			t.Errorf("Era(%d): Valid %v, Requests %d; want false, 0", e, e.Valid(), s.Requests(e))
		}
		if want := fmt.Sprintf("Era(%d)", e); e.String() != want {
			t.Errorf("String = %q, want %q", e.String(), want)
		}
	}
	labels := map[Era]string{EraLegacySession: "legacy_session", EraModern: "modern_sessionless", EraOther: "other_sessionless"}
	for _, e := range Eras {
		if !e.Valid() || e.String() != labels[e] {
			t.Errorf("%d: Valid %v, String %q; want true, %q", e, e.Valid(), e.String(), labels[e])
		}
	}
	if s.Requests(EraModern) != 1 {
		t.Errorf("Requests(EraModern) = %d, want 1", s.Requests(EraModern))
	}
}
