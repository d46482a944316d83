package caddymodule

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// pinnedRequest returns a request whose session the handler found pinned to dial.
func pinnedRequest(dial string) *http.Request {
	r := newRequest(http.MethodPost, testSessionID)
	exchangeOf(r).owner = session.NewUpstream(dial)
	return r
}

func TestSelectionFallbackSpreads(t *testing.T) {
	s := provisionPolicy(t, &SessionSelection{FallbackRaw: json.RawMessage(`{"policy":"round_robin"}`)})
	pool := testPool()
	counts := map[*reverseproxy.Upstream]int{}
	for range 3 * 4 {
		r := newRequest(http.MethodPost)
		up := s.Select(pool, r, nil)
		if up == nil {
			t.Fatal("Select = nil for a request without a session")
		}
		if sel := selectedUpstream(r); sel != up {
			t.Errorf("selected upstream = %v, want %v", sel, up)
		}
		counts[up]++
	}
	for _, u := range pool {
		if counts[u] != 4 {
			t.Errorf("round_robin sent %d of 12 requests to %s, want 4", counts[u], u.Dial)
		}
	}
}

func TestSelectionConfiguredFallback(t *testing.T) {
	s := provisionPolicy(t, &SessionSelection{FallbackRaw: json.RawMessage(`{"policy":"first"}`)})
	pool := testPool()
	for range 5 {
		if up := s.Select(pool, newRequest(http.MethodPost), nil); up != pool[0] {
			t.Fatalf("fallback first selected %v, want %v", up, pool[0])
		}
	}
	// A pinned request ignores the fallback.
	if up := s.Select(pool, pinnedRequest(pool[2].Dial), nil); up != pool[2] {
		t.Errorf("pinned request selected %v, want %v", up, pool[2])
	}
}

func TestSelectionProvisionErrors(t *testing.T) {
	for _, raw := range []string{`{"policy":"nonexistent"}`, `{"policy":"mcp_session","fallback":{"policy":"nonexistent"}}`} {
		s := &SessionSelection{FallbackRaw: json.RawMessage(raw)}
		if err := s.Provision(newContext(t)); err == nil {
			t.Errorf("Provision with fallback %s succeeded", raw)
		}
	}
}

func TestSelectPinned(t *testing.T) {
	for _, tc := range []struct {
		name     string
		dial     string
		pool     func() reverseproxy.UpstreamPool
		want     int // index in the pool, -1 for nil
		wantGone bool
	}{
		{name: "first", dial: "10.0.0.1:8080", pool: testPool, want: 0},
		{name: "last", dial: "10.0.0.3:8080", pool: testPool, want: 2},
		{name: "not in pool", dial: "10.0.0.9:8080", pool: testPool, want: -1, wantGone: true},
		{name: "empty pool", dial: "10.0.0.1:8080", pool: func() reverseproxy.UpstreamPool { return nil }, want: -1, wantGone: true},
		{name: "same host, other port", dial: "10.0.0.1:9090", pool: testPool, want: -1, wantGone: true},
		{
			name: "below max_requests",
			dial: "10.0.0.2:8080",
			pool: func() reverseproxy.UpstreamPool {
				p := testPool()
				p[1].MaxRequests = 1
				return p
			},
			want: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := provisionPolicy(t, &SessionSelection{})
			pool := tc.pool()
			r := pinnedRequest(tc.dial)
			up := s.Select(pool, r, nil)
			var want *reverseproxy.Upstream
			if tc.want >= 0 {
				want = pool[tc.want]
			}
			if up != want {
				t.Errorf("Select = %v, want %v", up, want)
			}
			gone := exchangeOf(r).gone
			if gone != tc.wantGone {
				t.Errorf("gone = %v, want %v", gone, tc.wantGone)
			}
			sel := selectedUpstream(r)
			if (want == nil) != (sel == nil) {
				t.Errorf("selected upstream = %v, want %v", sel, want)
			}
		})
	}
}

func TestSelectionUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input string
		want  string // FallbackRaw; "" for none
		// wantType is the provisioned fallback's type, checked with a type switch.
		wantType string
	}{
		{name: "bare", input: `mcp_session`, wantType: "least_sessions"},
		{name: "empty block", input: `mcp_session {
		}`, wantType: "least_sessions"},
		{name: "least_conn", input: `mcp_session {
			fallback least_conn
		}`, want: `{"policy":"least_conn"}`, wantType: "least_conn"},
		{name: "with arguments", input: `mcp_session {
			fallback cookie lb
		}`, want: `{"name":"lb","policy":"cookie"}`, wantType: "cookie"},
		{name: "with a block", input: `mcp_session {
			fallback header X-Client-Id {
				fallback random
			}
		}`, want: `{"fallback":{"policy":"random"},"field":"X-Client-Id","policy":"header"}`, wantType: "header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s SessionSelection
			if err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
				t.Fatalf("UnmarshalCaddyfile: %v", err)
			}
			if string(s.FallbackRaw) != tc.want {
				t.Errorf("FallbackRaw = %s, want %s", s.FallbackRaw, tc.want)
			}
			provisionPolicy(t, &s)
			var got string
			switch s.fallback.(type) {
			case *reverseproxy.RoundRobinSelection:
				got = "round_robin"
			case *LeastSessionsSelection:
				got = "least_sessions"
			case *reverseproxy.LeastConnSelection:
				got = "least_conn"
			case *reverseproxy.CookieHashSelection:
				got = "cookie"
			case *reverseproxy.HeaderHashSelection:
				got = "header"
			}
			if got != tc.wantType {
				t.Errorf("fallback is %T, want %s", s.fallback, tc.wantType)
			}
		})
	}
}

// TestReverseProxyLBPolicy parses the policy where users write it: as the
// lb_policy of a reverse_proxy.
func TestReverseProxyLBPolicy(t *testing.T) {
	d := caddyfile.NewTestDispenser(`reverse_proxy 10.0.0.1:8080 10.0.0.2:8080 {
		lb_policy mcp_session {
			fallback least_conn
		}
	}`)
	var rp reverseproxy.Handler
	if err := rp.UnmarshalCaddyfile(d); err != nil {
		t.Fatalf("UnmarshalCaddyfile: %v", err)
	}
	want := `{"fallback":{"policy":"least_conn"},"policy":"mcp_session"}`
	if got := string(rp.LoadBalancing.SelectionPolicyRaw); got != want {
		t.Errorf("selection policy = %s, want %s", got, want)
	}
}

// refusingAddrs returns n loopback addresses where nothing listens: a
// connection to each is refused.
func refusingAddrs(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = ln.Addr().String()
		ln.Close()
	}
	return addrs
}

// TestLastResortOrder: with every upstream out of service by passive
// health checks alone (a real reverse_proxy counted its refused dials: 1,
// 2 and 3), a request without a session that each pick fails gets them in
// turn, the fewest failures first, each once, then nil; a failover's
// replay never gets the upstream its session leaves, though it has the
// fewest failures, and then the others in the same order. Before, the last
// resort answered once per request: the replay got the upstream it was
// leaving, which had just refused, and then nothing.
func TestLastResortOrder(t *testing.T) {
	dials := refusingAddrs(t, 3)
	ups := make([]*reverseproxy.Upstream, len(dials))
	for i, d := range dials {
		ups[i] = &reverseproxy.Upstream{Dial: d}
	}
	raw, _ := json.Marshal(reverseproxy.Handler{
		Upstreams:    ups,
		HealthChecks: &reverseproxy.HealthChecks{Passive: &reverseproxy.PassiveHealthChecks{FailDuration: caddy.Duration(time.Hour)}},
		LoadBalancing: &reverseproxy.LoadBalancing{
			SelectionPolicyRaw: json.RawMessage(`{"policy":"mcp_session","table":"lastresort/` + t.Name() + `"}`),
		},
	})
	mod, err := newContext(t).LoadModuleByID("http.handlers.reverse_proxy", raw)
	if err != nil {
		t.Fatal(err)
	}
	rp := mod.(*reverseproxy.Handler)
	s := rp.LoadBalancing.SelectionPolicy.(*SessionSelection)
	for i, d := range dials { // pinned requests, refused: i+1 failures each
		for range i + 1 {
			r := caddyhttp.PrepareRequest(httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader("{}")), caddy.NewReplacer(), nil, &caddyhttp.Server{})
			exchangeOf(r).owner = session.NewUpstream(d)
			if err := rp.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err == nil {
				t.Fatalf("a request to %s, where nothing listens, succeeded", d)
			}
		}
	}
	for i, u := range rp.Upstreams {
		if u.Available() || u.Host.Fails() != i+1 || s.healthOf(u) != healthPassiveDown {
			t.Fatalf("%s: available %v, %d failures, health %v; want out of service by passive checks with %d", u.Dial, u.Available(), u.Host.Fails(), s.healthOf(u), i+1)
		}
	}
	picks := func(r *http.Request) []string {
		var got []string
		for range len(dials) + 1 { // each Select after the first is a retry: the last pick failed
			up := s.Select(rp.Upstreams, r, nil)
			if up == nil {
				break
			}
			got = append(got, up.Dial)
		}
		return got
	}
	if got, want := picks(newRequest(http.MethodPost)), dials; !slices.Equal(got, want) {
		t.Errorf("a new session's picks, each failing: %v; want every upstream once, fewest failures first: %v", got, want)
	}
	replay := newRequest(http.MethodPost)
	ex := exchangeOf(replay)
	ex.replay = true
	ex.noteFailed(dials[0]) // the session leaves dials[0]
	if got, want := picks(replay), dials[1:]; !slices.Equal(got, want) {
		t.Errorf("a failover's replay leaving %s: picks %v; want %v, never the upstream it leaves", dials[0], got, want)
	}
}

// TestSelectionWarnsWithoutHandler checks that the policy, used without an
// mcp_session handler before its reverse_proxy (which then learns no
// session), says so once; a request the handler serves gets no warning.
func TestSelectionWarnsWithoutHandler(t *testing.T) {
	s := provisionPolicy(t, &SessionSelection{})
	core, logs := observer.New(zapcore.WarnLevel)
	s.logger = zap.New(core)
	pool := testPool()

	served := newRequest(http.MethodPost)
	exchangeOf(served).serving = true // as the handler's observe sets it
	s.Select(pool, served, nil)
	if n := logs.Len(); n != 0 {
		t.Fatalf("a request the handler serves: want no warning, got %d", n)
	}
	s.Select(pool, subrequest(served, []byte(`{}`)), nil) // a failover's replay: the proxy's own request
	if n := logs.Len(); n != 0 {
		t.Fatalf("the proxy's own request (a failover's replay): want no warning, got %d: %v", n, logs.All())
	}
	for range 3 {
		s.Select(pool, newRequest(http.MethodPost), nil)
	}
	if n := logs.FilterMessageSnippet("no mcp_session handler serves this request").Len(); n != 1 {
		t.Fatalf("requests no handler serves: want one warning naming the missing handler, got %d of %d logs", n, logs.Len())
	}
}
