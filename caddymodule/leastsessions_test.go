package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// provisionLeastSessions provisions s (on a table named after the test
// unless it names one) in a config of its own.
func provisionLeastSessions(t *testing.T, s *LeastSessionsSelection) *LeastSessionsSelection {
	t.Helper()
	if s.Table == "" {
		s.Table = "least/" + t.Name()
	}
	if err := s.Provision(newContext(t)); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	return s
}

// unexportedField returns a pointer to the unexported field name of the
// struct *p, of type T. Caddy v2.11.9 offers no exported way to change an
// upstream's in-flight count or active health from outside its package;
// the tests reach them this way, and fail loudly if Caddy renames them.
func unexportedField[T any](t *testing.T, p any, name string) *T {
	t.Helper()
	f := reflect.ValueOf(p).Elem().FieldByName(name)
	if !f.IsValid() || f.Type() != reflect.TypeFor[T]() {
		t.Fatalf("%T has no field %s of type %v: the test needs updating for this Caddy version", p, name, reflect.TypeFor[T]())
	}
	return (*T)(unsafe.Pointer(f.UnsafeAddr()))
}

// setInFlight sets the number of requests in flight to u, as reverse_proxy counts them.
func setInFlight(t *testing.T, u *reverseproxy.Upstream, n int) {
	t.Helper()
	unexportedField[atomic.Int64](t, u.Host, "numRequests").Store(int64(n))
	if u.NumRequests() != n {
		t.Fatalf("NumRequests() = %d after setting %d", u.NumRequests(), n)
	}
}

// setUnhealthy marks u unhealthy, as a failing active health check does.
func setUnhealthy(t *testing.T, u *reverseproxy.Upstream, unhealthy bool) {
	t.Helper()
	var v int32
	if unhealthy {
		v = 1
	}
	unexportedField[atomic.Int32](t, u, "unhealthy").Store(v)
	if u.Healthy() == unhealthy {
		t.Fatalf("Healthy() = %v after marking unhealthy %v", u.Healthy(), unhealthy)
	}
}

// learnN teaches tbl n sessions on dial, with IDs dial/k/0 to dial/k/n-1,
// where k is the number of sessions the table learned before.
func learnN(tbl *session.Table, dial string, n int) {
	k := tbl.Stats.Learned()
	for i := range n {
		tbl.Learn(fmt.Sprintf("%s/%d/%d", dial, k, i), dial)
	}
}

// pickCounts returns how often each upstream of pool was selected in n calls; nil selections count under "".
func pickCounts(s reverseproxy.Selector, pool reverseproxy.UpstreamPool, n int) map[string]int {
	counts := map[string]int{}
	for range n {
		up := s.Select(pool, newRequest(http.MethodPost), nil)
		if up == nil {
			counts[""]++
			continue
		}
		counts[up.Dial]++
	}
	return counts
}

func TestLeastSessionsModule(t *testing.T) {
	info := LeastSessionsSelection{}.CaddyModule()
	if info.ID != "http.reverse_proxy.selection_policies.least_sessions" {
		t.Errorf("ID = %q", info.ID)
	}
	if _, ok := info.New().(reverseproxy.Selector); !ok {
		t.Errorf("New() = %T, not a Selector", info.New())
	}
}

func TestLeastSessionsPicksFewest(t *testing.T) {
	s := provisionLeastSessions(t, &LeastSessionsSelection{})
	pool := testPool()
	learnN(s.table, pool[0].Dial, 3)
	learnN(s.table, pool[1].Dial, 1)
	learnN(s.table, pool[2].Dial, 2)
	for range 20 {
		if up := s.Select(pool, newRequest(http.MethodPost), nil); up != pool[1] {
			t.Fatalf("Select = %v, want %v (1 session against 3 and 2)", up, pool[1])
		}
	}
	// Learning moves the minimum.
	learnN(s.table, pool[1].Dial, 2) // 3, 3, 2
	if up := s.Select(pool, newRequest(http.MethodPost), nil); up != pool[2] {
		t.Errorf("Select = %v, want %v", up, pool[2])
	}
	// Evicting too.
	s.table.Evict(pool[0].Dial+"/0/0", session.EvictDelete) // 2, 3, 2 -> tie between 0 and 2
	s.table.Evict(pool[0].Dial+"/0/1", session.EvictDelete) // 1, 3, 2
	if up := s.Select(pool, newRequest(http.MethodPost), nil); up != pool[0] {
		t.Errorf("after evictions Select = %v, want %v; live: %v", up, pool[0], liveSessions(s.table))
	}
	// An upstream the table has never seen has no sessions: it is the least loaded.
	fresh := &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: "10.0.0.4:8080"}
	if up := s.Select(append(pool, fresh), newRequest(http.MethodPost), nil); up != fresh {
		t.Errorf("Select = %v, want the new upstream %v", up, fresh)
	}
	if s.table.KnownUpstream(fresh.Dial) != nil {
		t.Error("Select created a record for the new upstream")
	}
}

func TestLeastSessionsCountsInFlight(t *testing.T) {
	s := provisionLeastSessions(t, &LeastSessionsSelection{})
	pool := testPool()
	learnN(s.table, pool[0].Dial, 1)
	learnN(s.table, pool[1].Dial, 2)
	learnN(s.table, pool[2].Dial, 3)
	// A burst of initialize requests in flight to the emptiest upstream,
	// whose sessions are not learned yet, counts as load.
	setInFlight(t, pool[0], 3) // load 4, 2, 3
	if up := s.Select(pool, newRequest(http.MethodPost), nil); up != pool[1] {
		t.Errorf("Select = %v, want %v; loads 4, 2, 3", up, pool[1])
	}
	setInFlight(t, pool[1], 5) // load 4, 7, 3
	if up := s.Select(pool, newRequest(http.MethodPost), nil); up != pool[2] {
		t.Errorf("Select = %v, want %v; loads 4, 7, 3", up, pool[2])
	}
	setInFlight(t, pool[0], 0) // load 1, 7, 3
	if up := s.Select(pool, newRequest(http.MethodPost), nil); up != pool[0] {
		t.Errorf("Select = %v, want %v; loads 1, 7, 3", up, pool[0])
	}
	// In-flight requests alone, on upstreams without sessions.
	bare := testPool()
	setInFlight(t, bare[0], 2)
	setInFlight(t, bare[2], 1)
	s2 := provisionLeastSessions(t, &LeastSessionsSelection{Table: "least/" + t.Name() + "/empty"})
	if up := s2.Select(bare, newRequest(http.MethodPost), nil); up != bare[1] {
		t.Errorf("Select = %v, want %v with no requests in flight", up, bare[1])
	}
}

func TestLeastSessionsSkips(t *testing.T) {
	s := provisionLeastSessions(t, &LeastSessionsSelection{})
	pool := testPool()
	learnN(s.table, pool[0].Dial, 1)
	learnN(s.table, pool[1].Dial, 5)
	learnN(s.table, pool[2].Dial, 9)

	s.table.SetDraining(pool[0].Dial, true)
	if got := pickCounts(s, pool, 20); got[pool[1].Dial] != 20 {
		t.Errorf("with the least loaded draining: picks %v, want all on %s", got, pool[1].Dial)
	}
	// Unhealthy (active health checks).
	setUnhealthy(t, pool[1], true)
	if got := pickCounts(s, pool, 20); got[pool[2].Dial] != 20 {
		t.Errorf("with %s unhealthy: picks %v, want all on %s", pool[1].Dial, got, pool[2].Dial)
	}
	// Full: at max_requests.
	pool[2].MaxRequests = 1
	setInFlight(t, pool[2], 1)
	if got := pickCounts(s, pool, 5); got[""] != 5 {
		t.Errorf("with every upstream draining, unhealthy or full: picks %v, want nil", got)
	}
	// Back: below max_requests, healthy, undrained.
	setInFlight(t, pool[2], 0)
	if up := s.Select(pool, newRequest(http.MethodPost), nil); up != pool[2] {
		t.Errorf("Select = %v, want %v once below max_requests", up, pool[2])
	}
	setUnhealthy(t, pool[1], false)
	if up := s.Select(pool, newRequest(http.MethodPost), nil); up != pool[1] {
		t.Errorf("Select = %v, want %v once healthy", up, pool[1])
	}
	s.table.SetDraining(pool[0].Dial, false)
	if up := s.Select(pool, newRequest(http.MethodPost), nil); up != pool[0] {
		t.Errorf("Select = %v, want %v once undrained", up, pool[0])
	}
	// A drained upstream whose sessions are all gone still gets nothing.
	s.table.SetDraining(pool[0].Dial, true)
	s.table.Evict(pool[0].Dial+"/0/0", session.EvictDelete)
	if up := s.Select(pool, newRequest(http.MethodPost), nil); up != pool[1] {
		t.Errorf("Select = %v, want %v: a drained upstream with 0 sessions is still draining", up, pool[1])
	}
}

func TestLeastSessionsNil(t *testing.T) {
	s := provisionLeastSessions(t, &LeastSessionsSelection{})
	if up := s.Select(nil, newRequest(http.MethodPost), nil); up != nil {
		t.Errorf("Select(nil) = %v", up)
	}
	if up := s.Select(reverseproxy.UpstreamPool{}, newRequest(http.MethodPost), nil); up != nil {
		t.Errorf("Select(empty) = %v", up)
	}
	pool := testPool()
	for _, u := range pool {
		s.table.SetDraining(u.Dial, true)
	}
	if up := s.Select(pool, newRequest(http.MethodPost), nil); up != nil {
		t.Errorf("Select with every upstream draining = %v", up)
	}
}

func TestLeastSessionsTies(t *testing.T) {
	s := provisionLeastSessions(t, &LeastSessionsSelection{})
	pool := testPool()
	learnN(s.table, pool[0].Dial, 2)
	learnN(s.table, pool[1].Dial, 2)
	learnN(s.table, pool[2].Dial, 3)
	const n = 3000
	got := pickCounts(s, pool, n)
	if got[pool[2].Dial] != 0 || got[""] != 0 {
		t.Errorf("picks %v: the loaded upstream or nil was picked", got)
	}
	// Each tied upstream gets about half; 1200 is more than 7 standard deviations away.
	for _, u := range pool[:2] {
		if got[u.Dial] < 1200 {
			t.Errorf("picks %v: tied %s picked %d of %d times, want about half", got, u.Dial, got[u.Dial], n)
		}
	}
	// Three-way tie: uniform, not biased to the first or last.
	fresh := testPool()
	s2 := provisionLeastSessions(t, &LeastSessionsSelection{Table: "least/" + t.Name() + "/3"})
	got = pickCounts(s2, fresh, n)
	for _, u := range fresh {
		if got[u.Dial] < 800 {
			t.Errorf("three-way tie picks %v: %s picked %d of %d times, want about a third", got, u.Dial, got[u.Dial], n)
		}
	}
}

func TestLeastSessionsProvision(t *testing.T) {
	// Default table.
	var d LeastSessionsSelection
	if err := d.Provision(newContext(t)); err != nil {
		t.Fatal(err)
	}
	if d.Table != session.DefaultTableName || d.table == nil || d.table.Name() != session.DefaultTableName {
		t.Errorf("Table = %q, table %p; want the default table", d.Table, d.table)
	}

	// A named table is shared with a handler of the same name, in the same
	// config or another, and the policy's config keeps it alive.
	name := "least/" + t.Name()
	ctx := newContext(t)
	h := &Handler{TableSettings: TableSettings{MaxSessions: 7}, Table: name}
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	s := provisionLeastSessions(t, &LeastSessionsSelection{Table: name})
	if s.table != h.table {
		t.Fatal("policy and handler with the same table name got different tables")
	}
	startApp(t, ctx)
	if s.table.MaxSessions() != 7 {
		t.Errorf("the policy changed the handler's max_sessions: %d", s.table.MaxSessions())
	}
	h2, _ := provisionHandler(t, &Handler{TableSettings: TableSettings{MaxSessions: 7}, Table: name})
	if h2.table != s.table {
		t.Error("the table did not survive while the policy still used it")
	}
}

func TestLeastSessionsUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input, want string
	}{
		{input: `least_sessions`},
		{input: "least_sessions {\n}"},
		{input: "least_sessions {\n table mcp\n}", want: "mcp"},
	} {
		var s LeastSessionsSelection
		if err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
			t.Errorf("UnmarshalCaddyfile(%q): %v", tc.input, err)
			continue
		}
		if s.Table != tc.want {
			t.Errorf("UnmarshalCaddyfile(%q): Table = %q, want %q", tc.input, s.Table, tc.want)
		}
	}
	for _, tc := range []struct {
		name, input, want string
	}{
		{name: "extra argument", input: `least_sessions mcp`, want: "wrong argument count or unexpected line ending after 'mcp'"},
		{name: "unknown option", input: "least_sessions {\n tabel a\n}", want: "unrecognized least_sessions option 'tabel'"},
		{name: "fallback", input: "least_sessions {\n fallback random\n}", want: "unrecognized least_sessions option 'fallback'"},
		{name: "duplicate table", input: "least_sessions {\n table a\n table b\n}", want: "duplicate option 'table'"},
		{name: "duplicate table, same name", input: "least_sessions {\n table a\n table a\n}", want: "duplicate option 'table'"},
		{name: "table without name", input: "least_sessions {\n table\n}", want: "after 'table'"},
		{name: "table with two names", input: "least_sessions {\n table a b\n}", want: "after 'b'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := new(LeastSessionsSelection).UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("UnmarshalCaddyfile(%q) = %v, want an error containing %q", tc.input, err, tc.want)
			}
		})
	}
}

// TestLeastSessionsInReverseProxy parses the policy where users write it.
func TestLeastSessionsInReverseProxy(t *testing.T) {
	for _, tc := range []struct{ input, want string }{
		{
			input: "reverse_proxy a:1 b:1 {\n lb_policy least_sessions {\n table mcp\n }\n}",
			want:  `{"policy":"least_sessions","table":"mcp"}`,
		},
		{
			input: "reverse_proxy a:1 b:1 {\n lb_policy least_sessions\n}",
			want:  `{"policy":"least_sessions"}`,
		},
		{
			input: "reverse_proxy a:1 b:1 {\n lb_policy mcp_session {\n table mcp\n fallback least_sessions\n }\n}",
			want:  `{"fallback":{"policy":"least_sessions"},"policy":"mcp_session","table":"mcp"}`,
		},
		{
			input: "reverse_proxy a:1 b:1 {\n lb_policy mcp_session {\n fallback least_sessions {\n table other\n }\n }\n}",
			want:  `{"fallback":{"policy":"least_sessions","table":"other"},"policy":"mcp_session"}`,
		},
	} {
		var rp reverseproxy.Handler
		if err := rp.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
			t.Errorf("UnmarshalCaddyfile(%q): %v", tc.input, err)
			continue
		}
		if got := string(rp.LoadBalancing.SelectionPolicyRaw); got != tc.want {
			t.Errorf("UnmarshalCaddyfile(%q): policy = %s, want %s", tc.input, got, tc.want)
		}
	}
	var rp reverseproxy.Handler
	err := rp.UnmarshalCaddyfile(caddyfile.NewTestDispenser("reverse_proxy a:1 {\n lb_policy least_sessions {\n bogus\n }\n}"))
	if err == nil || !strings.Contains(err.Error(), "unrecognized least_sessions option 'bogus'") {
		t.Errorf("bad option in reverse_proxy: %v", err)
	}
}

func TestWithTable(t *testing.T) {
	for _, tc := range []struct {
		name, raw, want string
	}{
		{name: "least_sessions without table", raw: `{"policy":"least_sessions"}`, want: `{"policy":"least_sessions","table":"mine"}`},
		{name: "least_sessions with its own table", raw: `{"policy":"least_sessions","table":"theirs"}`, want: `{"policy":"least_sessions","table":"theirs"}`},
		{name: "least_sessions with a null table", raw: `{"policy":"least_sessions","table":null}`, want: `{"policy":"least_sessions","table":"mine"}`},
		// An empty table is the zero value, which Caddy's JSON treats as
		// unset: LeastSessionsSelection documents its default as the
		// table of the mcp_session policy it is the fallback of. withTable
		// keeps "" instead, and the fallback then counts the sessions of
		// the "default" table.
		{name: "least_sessions with an empty table", raw: `{"policy":"least_sessions","table":""}`, want: `{"policy":"least_sessions","table":"mine"}`},
		{name: "other policy", raw: `{ "policy": "least_conn" }`, want: `{ "policy": "least_conn" }`},
		{name: "other policy with a table field", raw: `{"policy":"random","table":"x"}`, want: `{"policy":"random","table":"x"}`},
		{name: "nested least_sessions is left alone", raw: `{"policy":"header","field":"X","fallback":{"policy":"least_sessions"}}`, want: `{"policy":"header","field":"X","fallback":{"policy":"least_sessions"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := withTable(json.RawMessage(tc.raw), "mine")
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("withTable(%s) = %s, want %s", tc.raw, got, tc.want)
			}
		})
	}
	for _, raw := range []string{`{`, `[]`, `"least_sessions"`} {
		if got, err := withTable(json.RawMessage(raw), "mine"); err == nil {
			t.Errorf("withTable(%s) = %s, want an error", raw, got)
		}
	}
}

// TestFallbackInheritsTable checks that a least_sessions fallback without a
// table of its own reads the mcp_session policy's table.
func TestFallbackInheritsTable(t *testing.T) {
	name := "least/" + t.Name()
	for _, tc := range []struct {
		name, fallback, want string
	}{
		{name: "default fallback", fallback: "", want: name},
		{name: "inherits", fallback: `{"policy":"least_sessions"}`, want: name},
		// See TestWithTable: "" should mean unset, as everywhere in Caddy's JSON.
		{name: "empty table", fallback: `{"policy":"least_sessions","table":""}`, want: name},
		{name: "own table", fallback: `{"policy":"least_sessions","table":"` + name + `/own"}`, want: name + "/own"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &SessionSelection{Table: name}
			if tc.fallback != "" {
				s.FallbackRaw = json.RawMessage(tc.fallback)
			}
			provisionPolicy(t, s)
			ls, ok := s.fallback.(*LeastSessionsSelection)
			if !ok {
				t.Fatalf("fallback is %T", s.fallback)
			}
			if ls.Table != tc.want {
				t.Errorf("fallback table = %q, want %q", ls.Table, tc.want)
			}
			if (ls.table == s.table) != (tc.want == name) {
				t.Errorf("fallback shares the policy's table: %v, want %v", ls.table == s.table, tc.want == name)
			}
		})
	}
	// From a Caddyfile.
	var s SessionSelection
	if err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser("mcp_session {\n table " + name + "\n fallback least_sessions\n}")); err != nil {
		t.Fatal(err)
	}
	provisionPolicy(t, &s)
	if ls, ok := s.fallback.(*LeastSessionsSelection); !ok || ls.Table != name || ls.table != s.table {
		t.Errorf("Caddyfile fallback = %#v, want least_sessions on table %q", s.fallback, name)
	}
}

// TestMCPProxyFallbackLeastSessions adapts mcp_proxy with a least_sessions
// fallback, with and without a table of its own.
func TestMCPProxyFallbackLeastSessions(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{block: "table t\n\t\tfallback least_sessions", want: `"selection_policy":{"fallback":{"policy":"least_sessions"},"policy":"mcp_session","table":"t"}`},
		{block: "table t\n\t\tfallback least_sessions {\n\t\t\ttable other\n\t\t}\n\t\tlb_try_duration 1s", want: `"selection_policy":{"fallback":{"policy":"least_sessions","table":"other"},"policy":"mcp_session","table":"t"}`},
		{block: "table t", want: `"selection_policy":{"policy":"mcp_session","table":"t"}`},
	} {
		cfg := ":8080 {\n\tmcp_proxy 127.0.0.1:9001 127.0.0.1:9002 {\n\t\t" + tc.block + "\n\t}\n}\n"
		out, warnings, err := adapt(cfg)
		if err != nil || len(warnings) != 0 {
			t.Errorf("adapt(%q): %v, warnings %v", cfg, err, warnings)
			continue
		}
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("adapt(%q) = %s\nwant it to contain %s", cfg, out, tc.want)
		}
	}
	err := func() error {
		_, _, err := adapt(":8080 {\n\tmcp_proxy 127.0.0.1:9001 {\n\t\tfallback least_sessions {\n\t\t\tbogus\n\t\t}\n\t}\n}\n")
		return err
	}()
	if err == nil || !strings.Contains(err.Error(), "unrecognized least_sessions option 'bogus'") {
		t.Errorf("bad least_sessions option in mcp_proxy: %v", err)
	}
}

// TestSessionSelectionLeastSessions checks new sessions spread by live
// sessions through the mcp_session policy, and pinned requests stay.
func TestSessionSelectionLeastSessions(t *testing.T) {
	name := "least/" + t.Name()
	s := provisionPolicy(t, &SessionSelection{Table: name, FallbackRaw: json.RawMessage(`{"policy":"least_sessions"}`)})
	pool := testPool()
	learnN(s.table, pool[0].Dial, 4)
	learnN(s.table, pool[2].Dial, 1)
	// New sessions fill the emptiest upstream first: 4, 0, 1 -> 4, 1, 1 ->
	// (a tie) -> 4, 2, 2 after three.
	for i := range 3 {
		up := s.Select(pool, newRequest(http.MethodPost), nil)
		if up == nil || up == pool[0] || (i == 0 && up != pool[1]) {
			t.Fatalf("new session %d went to %v; live %v", i, up, liveSessions(s.table))
		}
		s.table.Learn(fmt.Sprintf("new-%d", i), up.Dial)
	}
	if got := liveSessions(s.table); got[pool[0].Dial] != 4 || got[pool[1].Dial] != 2 || got[pool[2].Dial] != 2 {
		t.Errorf("live sessions after three new ones = %v, want 4, 2, 2", got)
	}
	// A pinned request goes to its upstream whatever its load.
	if up := s.Select(pool, pinnedRequest(pool[0].Dial), nil); up != pool[0] {
		t.Errorf("pinned request went to %v, want %v", up, pool[0])
	}
}

// TestSessionSelectionDraining checks that new sessions never go to a
// draining upstream, whatever the fallback, while pinned requests still do.
func TestSessionSelectionDraining(t *testing.T) {
	for _, fallback := range []string{"", `{"policy":"round_robin"}`, `{"policy":"least_sessions"}`, `{"policy":"first"}`, `{"policy":"random"}`, `{"policy":"least_conn"}`} {
		t.Run(fmt.Sprintf("fallback %s", fallback), func(t *testing.T) {
			s := &SessionSelection{Table: "drain/" + t.Name()}
			if fallback != "" {
				s.FallbackRaw = json.RawMessage(fallback)
			}
			provisionPolicy(t, s)
			pool := testPool()
			learnN(s.table, pool[1].Dial, 1) // least_sessions would prefer pool[0] or pool[2]...
			learnN(s.table, pool[2].Dial, 1)
			// ...but pool[0], the emptiest and first, drains.
			s.table.SetDraining(pool[0].Dial, true)
			got := pickCounts(s, pool, 60)
			if got[pool[0].Dial] != 0 || got[""] != 0 {
				t.Errorf("new sessions with %s draining: %v", pool[0].Dial, got)
			}
			if fallback == `{"policy":"round_robin"}` && (got[pool[1].Dial] != 30 || got[pool[2].Dial] != 30) {
				t.Errorf("round_robin over the rest: %v, want 30 each", got)
			}
			// The caller's pool is not modified.
			if len(pool) != 3 || pool[0].Dial != "10.0.0.1:8080" {
				t.Errorf("pool changed: %v", pool)
			}
			// Pinned requests still reach the draining upstream.
			if up := s.Select(pool, pinnedRequest(pool[0].Dial), nil); up != pool[0] {
				t.Errorf("pinned request to the draining upstream went to %v", up)
			}
			// Everything draining: no upstream for new sessions, pinned ones unaffected.
			for _, u := range pool {
				s.table.SetDraining(u.Dial, true)
			}
			if got := pickCounts(s, pool, 10); got[""] != 10 {
				t.Errorf("new sessions with every upstream draining: %v, want nil", got)
			}
			if up := s.Select(pool, pinnedRequest(pool[2].Dial), nil); up != pool[2] {
				t.Errorf("pinned request with every upstream draining went to %v", up)
			}
			// Undrained: pool[0] gets new sessions again.
			for _, u := range pool {
				s.table.SetDraining(u.Dial, false)
			}
			if got := pickCounts(s, pool, 60); got[pool[0].Dial] == 0 {
				t.Errorf("after undrain %s gets no new session: %v", pool[0].Dial, got)
			}
		})
	}
}

// TestCandidates checks the pool filter of new sessions directly:
// draining upstreams are left out, stuck ones too unless no other one is
// available, and those a request already waited for in vain always.
func TestCandidates(t *testing.T) {
	s := provisionPolicy(t, &SessionSelection{Table: "drain/" + t.Name()})
	pool := testPool()
	r := newRequest(http.MethodPost)
	if got := s.candidates(pool, r); &got[0] != &pool[0] || len(got) != 3 {
		t.Error("with nothing draining or stuck, the pool is not returned as is")
	}
	s.table.SetDraining(pool[1].Dial, true)
	s.table.SetDraining("10.9.9.9:1", true) // not in the pool
	got := s.candidates(pool, r)
	if len(got) != 2 || got[0] != pool[0] || got[1] != pool[2] {
		t.Errorf("candidates = %v, want [%v %v]", got, pool[0], pool[2])
	}
	if got := s.candidates(nil, r); len(got) != 0 {
		t.Errorf("candidates(nil) = %v", got)
	}
	s.table.MarkStuck(pool[0].Dial)
	if got := s.candidates(pool, r); len(got) != 1 || got[0] != pool[2] {
		t.Errorf("with %s stuck: candidates = %v, want [%v]", pool[0].Dial, got, pool[2])
	}
	s.table.MarkStuck(pool[2].Dial)
	if got := s.candidates(pool, r); len(got) != 2 {
		t.Errorf("with every undrained upstream stuck: candidates = %v, want both stuck ones", got)
	}
	noteTried(r, pool[0].Dial)
	if got := s.candidates(pool, r); len(got) != 1 || got[0] != pool[2] {
		t.Errorf("after waiting for %s in vain: candidates = %v, want [%v]", pool[0].Dial, got, pool[2])
	}
	s.table.KnownUpstream(pool[2].Dial).Answered()
	if s.table.Stuck(s.table.KnownUpstream(pool[2].Dial)) {
		t.Error("an upstream that answered is still stuck")
	}
	var unprovisioned SessionSelection
	if got := unprovisioned.candidates(pool, r); len(got) != 3 {
		t.Errorf("without a table: %v", got)
	}
}

// TestLeastSessionsCountsStreamsOnce: a session's open GET stream is also a
// request in flight; it must not make its session count twice.
func TestLeastSessionsCountsStreamsOnce(t *testing.T) {
	s := &LeastSessionsSelection{Table: "least/" + t.Name()}
	if err := s.Provision(newContext(t)); err != nil {
		t.Fatal(err)
	}
	pool := testPool()[:2]
	// pool[0]: 2 sessions, both with an open GET stream (2 requests in flight);
	// pool[1]: 3 sessions without streams. pool[0] has fewer sessions.
	for i := range 2 {
		s.table.Learn(fmt.Sprintf("a%d", i), pool[0].Dial)
	}
	for i := range 3 {
		s.table.Learn(fmt.Sprintf("b%d", i), pool[1].Dial)
	}
	s.table.KnownUpstream(pool[0].Dial).AddStreams(2)
	setInFlight(t, pool[0], 2)
	for range 10 {
		if got := s.Select(pool, newRequest(http.MethodPost), nil); got != pool[0] {
			t.Fatalf("Select = %s, want %s (2 sessions with streams vs 3 without)", got.Dial, pool[0].Dial)
		}
	}
}
