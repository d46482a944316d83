package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
)

// testInitBody is the initialize request of the MCP go-sdk client (190
// bytes), the one docs/caddyfile.md's memory figures name.
const testInitBody = testInitGo

// bodyRequest returns a POST of body carrying Caddy's request variables
// and, if id is not empty, Mcp-Session-Id id.
func bodyRequest(body, id string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	r.Header.Set("Accept", "application/json, text/event-stream")
	r.Header.Set("Content-Type", "application/json")
	if id != "" {
		r.Header.Set(HeaderSessionID, id)
	}
	return r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
}

// lostSessionUpstream answers as an MCP server that restarted and lost
// session "OLD": initialize mints the next of ids, notifications/initialized
// gets 202, a request of a session it minted is echoed, any other gets 404.
// It returns the sessions it holds too.
func lostSessionUpstream(ids ...string) (func(http.ResponseWriter, *http.Request, *reverseproxy.Upstream), map[string]bool) {
	minted := map[string]bool{}
	return func(w http.ResponseWriter, r *http.Request, _ *reverseproxy.Upstream) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get(HeaderSessionID)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case id == "" && isInitialize(body, false):
			w.Header().Set(HeaderSessionID, ids[0])
			minted[ids[0]], ids = true, ids[1:]
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25"}}`)
		case !minted[id]:
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}`)
		case strings.Contains(string(body), "notifications/initialized"):
			w.WriteHeader(http.StatusAccepted)
		default:
			w.Header().Set(HeaderSessionID, id)
			_, _ = io.WriteString(w, "answered in "+id+": "+string(body))
		}
	}, minted
}

// TestFailoverOnUpstream404: with failover reinitialize, a POST that its
// upstream answers 404 (it lost the session) is answered by a new upstream
// session made from the kept initialize, under the client's session ID,
// with none of the held 404's headers or body; without failover the 404
// passes and the session ends.
func TestFailoverOnUpstream404(t *testing.T) {
	for _, on := range []bool{true, false} {
		f := newAffinityFixture(t)
		f.h.table.SetFailover(map[bool]string{true: session.FailoverReinitialize, false: session.FailoverOff}[on], 0)
		f.proxy.pool = f.proxy.pool[:1]
		up, minted := lostSessionUpstream("OLD", "NEW")
		f.serve(t, bodyRequest(testInitBody, ""), up)
		f.serve(t, bodyRequest(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, "OLD"), up)
		delete(minted, "OLD") // the upstream restarts and forgets it
		rec := f.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":2,"method":"tools/call"}`, "OLD"), up)
		body := rec.Body.String()
		if !on {
			if rec.Code != http.StatusNotFound || f.h.table.Lookup("OLD") != nil {
				t.Fatalf("failover off: %d %q, session held %v; want the upstream's 404 and the session ended", rec.Code, body, f.h.table.Lookup("OLD") != nil)
			}
			continue
		}
		if rec.Code != http.StatusOK || body != `answered in NEW: {"jsonrpc":"2.0","id":2,"method":"tools/call"}` ||
			rec.Header().Values(HeaderSessionID)[0] != "OLD" || len(rec.Header().Values("Content-Type")) != 1 {
			t.Fatalf("failover on: %d %v %q; want 200 answered in the new session, the client's ID, one Content-Type", rec.Code, rec.Header(), body)
		}
		if f.h.table.Lookup("OLD") == nil || f.h.table.Stats.Failovers(session.FailoverUpstream404, true) != 1 {
			t.Fatalf("the session is not held, or the failover not counted: %d", f.h.table.Stats.Failovers(session.FailoverUpstream404, true))
		}
		rec = f.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":3,"method":"ping"}`, "OLD"), up)
		if !strings.HasPrefix(rec.Body.String(), "answered in NEW") {
			t.Fatalf("the next request: %d %q, want it answered in the new session", rec.Code, rec.Body.String())
		}
	}
}

// getRequest returns the GET stream request of session id.
func getRequest(id string) *http.Request {
	r := bodyRequest("", id)
	r.Method, r.Body = http.MethodGet, http.NoBody
	r.Header.Set("Accept", "text/event-stream")
	return r
}

// TestFailoverOnGET404: with failover reinitialize, a GET that its upstream
// answers 404 fails the session over when that upstream has served a GET
// stream before (it was restarted and forgot the session), and passes
// through, moving nothing, when it never has (it may have no GET route).
func TestFailoverOnGET404(t *testing.T) {
	for _, streamed := range []bool{true, false} {
		// a subtest each: its own table, whose upstreams have served no GET yet
		t.Run(map[bool]string{true: "served-streams", false: "no-GET-route"}[streamed], func(t *testing.T) {
			get404FailsOver(t, streamed)
		})
	}
}

// get404FailsOver runs TestFailoverOnGET404 with an upstream that has a GET
// route (streamed) or none.
func get404FailsOver(t *testing.T, streamed bool) {
	f := newAffinityFixture(t)
	f.h.table.SetFailover(session.FailoverReinitialize, 0)
	f.proxy.pool = f.proxy.pool[:1]
	up, minted := lostSessionUpstream("OLD", "NEW")
	if !streamed { // no GET route: every GET gets the router's 404
		mcp := up
		up = func(w http.ResponseWriter, r *http.Request, u *reverseproxy.Upstream) {
			if r.Method == http.MethodGet {
				http.Error(w, "Cannot GET /mcp", http.StatusNotFound)
				return
			}
			mcp(w, r, u)
		}
	}
	f.serve(t, bodyRequest(testInitBody, ""), up)
	if rec := f.serve(t, getRequest("OLD"), up); (rec.Code == http.StatusOK) != streamed {
		t.Fatalf("GET stream before the restart: %d", rec.Code)
	}
	delete(minted, "OLD") // the upstream restarts and forgets it
	rec := f.serve(t, getRequest("OLD"), up)
	moves := f.h.table.Stats.Failovers(session.FailoverUpstream404, true)
	if !streamed {
		if rec.Code != http.StatusNotFound || moves != 0 || f.h.table.Lookup("OLD") == nil {
			t.Fatalf("no GET route: %d, %d moves, session held %v; want the 404 passed, nothing moved, the session kept",
				rec.Code, moves, f.h.table.Lookup("OLD") != nil)
		}
		return
	}
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Body.String(), "answered in NEW") ||
		rec.Header().Get(HeaderSessionID) != "OLD" || moves != 1 {
		t.Fatalf("restarted upstream: %d %v %q, %d moves; want the GET answered in the new session under the client's ID, 1 move",
			rec.Code, rec.Header(), rec.Body.String(), moves)
	}
}

// BenchmarkServePinnedFailover measures a pinned POST through the handler
// with failover off and with `failover reinitialize` (the session's
// initialize kept: the handler also looks it up and keeps the request's
// body to send it again after a 404). The upstream is a function that
// reads the body and answers 200.
func BenchmarkServePinnedFailover(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "reinitialize"}[on], func(b *testing.B) {
			f := newAffinityFixture(b)
			f.h.table.SetFailover(map[bool]string{true: session.FailoverReinitialize, false: session.FailoverOff}[on], 0)
			up, _ := lostSessionUpstream("S1")
			f.serve(b, bodyRequest(testInitBody, ""), up)
			if _, init := f.h.table.InitOf("S1"); (init != nil) != on {
				b.Fatalf("initialize kept: %v, want %v", init != nil, on)
			}
			f.h.setLogger(zap.NewNop())
			const call = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`
			b.ReportAllocs()
			for b.Loop() {
				f.proxy.selected = f.proxy.selected[:0]
				rec := httptest.NewRecorder()
				if err := f.h.ServeHTTP(rec, bodyRequest(call, "S1"), f.proxy); err != nil || rec.Code != http.StatusOK {
					b.Fatalf("ServeHTTP: %v, %d", err, rec.Code)
				}
			}
		})
	}
}

// BenchmarkInitializeMemory reports the heap bytes a kept initialize adds
// to a session (failover reinitialize), for the go-sdk client's 190-byte
// initialize, in a table of 100,000 sessions, measured after GC. Its ns/op
// is meaningless and suppressed.
func BenchmarkInitializeMemory(b *testing.B) {
	const n = 100_000
	tbl, err := NewTable("initmemory", n, session.DefaultSessionTTL, nil)
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, n)
	sessionIDs(ids)
	for _, id := range ids {
		tbl.Learn(id, "10.0.0.1:8080")
	}
	r := bodyRequest(testInitBody, "")
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for _, id := range ids {
		tbl.KeepInit(id, &session.Init{Body: []byte(testInitBody), Accept: r.Header.Get("Accept"), ContentType: r.Header.Get("Content-Type")})
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	runtime.KeepAlive(tbl)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/n, "B/session")
}

// TestUpstreamGoneClosedUnread: a request that found its kept-alive
// connection closed before the upstream read it (Go's transport: "server
// closed idle connection") means the upstream is gone when nothing listens
// at its address any more, and not while something does; an error after
// the request was written (EOF) never does. The end-to-end case, a server
// killed between two calls, is TestFailoverReplicasRedisDown.
func TestUpstreamGoneClosedUnread(t *testing.T) {
	live, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	deadLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := deadLn.Addr().String()
	deadLn.Close()
	closedIdle := &url.Error{Op: "Post", URL: "http://" + dead + "/mcp", Err: errors.New("http: server closed idle connection")}
	broken := errors.New("net/http: HTTP/1.x transport connection broken: EOF")
	for _, tc := range []struct {
		name string
		err  error
		dial string
		want bool
	}{
		{"closed unread, nothing listens", closedIdle, dead, true},
		{"closed unread, still listening", closedIdle, live.Addr().String(), false},
		{"broken after the request was written", broken, dead, false},
	} {
		if got := upstreamGone(newRequest(http.MethodPost), tc.err, tc.dial); got != tc.want {
			t.Errorf("%s: upstreamGone = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestFailoverAfterAMoveSeenHalfway: a request that looked its session up
// on upstream A, then read the session's failover record after a
// concurrent request had moved the session to B, holds B's record with A.
// When A fails it, the session has moved already: the request follows it
// to B, and no upstream opens a second session for it. (Under load, the
// end-to-end failover tests saw such a session failed over twice.)
func TestFailoverAfterAMoveSeenHalfway(t *testing.T) {
	f := newAffinityFixture(t)
	f.h.table.SetFailover(session.FailoverReinitialize, 0)
	f.proxy.pool = f.proxy.pool[:2]
	up, minted := lostSessionUpstream("OLD", "NEW", "NEWER")
	f.serve(t, bodyRequest(testInitBody, ""), up)
	f.serve(t, bodyRequest(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, "OLD"), up)
	from, _ := f.h.table.InitOf("OLD") // where the late request looked the session up
	delete(minted, "OLD")              // A loses it: the next request moves it to B
	f.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":2,"method":"tools/call"}`, "OLD"), up)
	to, _ := f.h.table.InitOf("OLD")
	dial := func(u *session.Upstream) string {
		if u == nil {
			return "none"
		}
		return u.Dial()
	}
	if to == nil || to == from || f.h.table.Stats.Failovers(session.FailoverUpstream404, true) != 1 {
		t.Fatalf("setup: the session is on %s (was on %s), %d failovers; want it moved once to another upstream",
			dial(to), dial(from), f.h.table.Stats.Failovers(session.FailoverUpstream404, true))
	}

	r := bodyRequest(`{"jsonrpc":"2.0","id":3,"method":"ping"}`, "OLD")
	w := httptest.NewRecorder()
	pf := f.h.failover.failoverFor(w, r, "OLD") // the record after the move
	f.proxy.respond = up
	got, retry, err := f.h.failover.failOver(w, r, f.proxy, "OLD", from, pf, session.FailoverRefused)
	if err != nil {
		t.Fatalf("failover of the late request: %v", err)
	}
	if got != to || retry.Header.Get(HeaderSessionID) != "NEW" {
		t.Fatalf("failover of the late request: to %s, Mcp-Session-Id %q; want %s and NEW, where the session is",
			dial(got), retry.Header.Get(HeaderSessionID), dial(to))
	}
	if minted["NEWER"] || f.h.table.Stats.Failovers(session.FailoverRefused, true) != 0 {
		t.Fatalf("the late request failed the session over again (a new upstream session: %v)", minted["NEWER"])
	}
}

// dialingProxy stands for reverse_proxy whose upstreams refuse connections:
// each attempt sets a request variable, selects the next upstream and
// fails to dial, and leaves behind a goroutine that reads the attempt's
// variables, as net/http's dial does after the request that asked for it is
// done.
type dialingProxy struct {
	attempts int
	readers  sync.WaitGroup
	stop     chan struct{}
}

func (p *dialingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	p.attempts++
	caddyhttp.SetVar(r.Context(), "dial_info", p.attempts) // as Caddy's proxy loop does
	exchangeOf(r).selected = &reverseproxy.Upstream{Dial: fmt.Sprintf("10.0.0.%d:80", p.attempts)}
	ctx := r.Context()
	p.readers.Go(func() {
		for {
			select {
			case <-p.stop:
				return
			default:
				_ = caddyhttp.GetVar(ctx, "dial_info")
			}
		}
	})
	if p.attempts == 3 {
		w.WriteHeader(http.StatusOK)
		return nil
	}
	return reverseproxy.NewDialError(errors.New("connection refused"))
}

// TestReplayAttemptsOwnTheirVariables: each attempt of a replayed
// initialize gets its own request variables, so a dial net/http goes on
// with after an attempt never reads a map the next attempt writes (under
// -race, sharing one map is a data race, seen in the failover tests).
func TestReplayAttemptsOwnTheirVariables(t *testing.T) {
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
	ir := subrequest(bodyRequest(string(body), ""), body)
	p := &dialingProxy{stop: make(chan struct{})}
	ans, last, err := sendReplay(caddyhttp.HandlerFunc(p.ServeHTTP), ir, body)
	close(p.stop)
	p.readers.Wait()
	if err != nil || ans.status != http.StatusOK || p.attempts != 3 {
		t.Fatalf("replay: status %d, error %v after %d attempts; want 200 on the third", ans.status, err, p.attempts)
	}
	if v := caddyhttp.GetVar(ir.Context(), "dial_info"); v != 1 {
		t.Fatalf("the first attempt's variables hold %v, want its own 1: a later attempt wrote them", v)
	}
	if v := caddyhttp.GetVar(last.Context(), "dial_info"); v != 3 {
		t.Fatalf("the last attempt's variables hold %v, want 3", v)
	}
}
