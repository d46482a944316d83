package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// frozenNext stands in for reverse_proxy in front of upstreams of which
// those in frozen never answer: it selects the next upstream of pool as the
// mcp_session policy records it, and, for a frozen one, waits until the
// request is cancelled and answers 499 as reverse_proxy does then. Others
// answer 200 with a session ID, after delay. It records the bodies it got.
type frozenNext struct {
	pool   reverseproxy.UpstreamPool
	frozen map[string]bool
	delay  time.Duration
	calls  atomic.Int32
	bodies []string
}

func (n *frozenNext) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	up := n.pool[int(n.calls.Add(1)-1)%len(n.pool)]
	exchangeOf(r).selected = up
	body, _ := io.ReadAll(r.Body)
	n.bodies = append(n.bodies, string(body))
	if n.frozen[up.Dial] {
		<-r.Context().Done()
		w.WriteHeader(499)
		return nil
	}
	time.Sleep(n.delay)
	w.Header().Set(HeaderSessionID, "S-"+up.Dial)
	w.WriteHeader(http.StatusOK)
	_, err := io.WriteString(w, `{"jsonrpc":"2.0","id":7,"result":{}}`)
	return err
}

// initializeRequest returns a legacy initialize request with JSON-RPC id 7.
func initializeRequest() *http.Request {
	body := `{"jsonrpc":"2.0","id":7,"method":"initialize","params":{}}`
	r := newRequest(http.MethodPost)
	r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
	return r
}

// TestInitializeTimeoutRetries: an initialize left without response headers
// by a frozen upstream is sent, whole, to the next upstream, which opens
// the session; the frozen one is stuck. With every upstream frozen, the
// client gets 504 with a JSON-RPC error carrying its request's id after
// three upstreams, not a hang.
func TestInitializeTimeoutRetries(t *testing.T) {
	h, _ := provisionHandler(t, &Handler{InitializeTimeout: caddy.Duration(50 * time.Millisecond)})
	pool := testPool()
	next := &frozenNext{pool: pool, frozen: map[string]bool{pool[0].Dial: true}}
	rec := httptest.NewRecorder()
	start := time.Now()
	if err := h.ServeHTTP(rec, initializeRequest(), next); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusOK || rec.Header().Get(HeaderSessionID) != "S-"+pool[1].Dial {
		t.Fatalf("status %d, session %q after %v; want 200 from %s", rec.Code, rec.Header().Get(HeaderSessionID), time.Since(start), pool[1].Dial)
	}
	if len(next.bodies) != 2 || next.bodies[0] != next.bodies[1] || !strings.Contains(next.bodies[1], "initialize") {
		t.Errorf("bodies sent = %q, want the initialize twice", next.bodies)
	}
	if up := h.table.Lookup("S-" + pool[1].Dial); up == nil || up.Dial() != pool[1].Dial {
		t.Errorf("session learned on %v, want %s", up, pool[1].Dial)
	}
	if !h.table.Stuck(h.table.KnownUpstream(pool[0].Dial)) || h.table.Stuck(h.table.KnownUpstream(pool[1].Dial)) {
		t.Error("the frozen upstream is not stuck, or the one that answered is")
	}

	next = &frozenNext{pool: pool, frozen: map[string]bool{pool[0].Dial: true, pool[1].Dial: true, pool[2].Dial: true}}
	rec = httptest.NewRecorder()
	if err := h.ServeHTTP(rec, initializeRequest(), next); err != nil {
		t.Fatal(err)
	}
	checkTimeout(t, rec, `7`, "initialize_timeout")
	if next.calls.Load() != maxOpenAttempts {
		t.Errorf("sent to %d upstreams, want %d", next.calls.Load(), maxOpenAttempts)
	}
}

// TestInitializeTimeoutSpares: requests that open no session are never cut,
// however long their headers take, and neither is an initialize with the
// bound off.
func TestInitializeTimeoutSpares(t *testing.T) {
	bound := caddy.Duration(20 * time.Millisecond)
	modern := newRequest(http.MethodPost)
	modern.Header.Set(HeaderProtocolVersion, ModernProtocolVersion)
	modern.Header.Set(HeaderMethod, "tools/call")
	for _, tc := range []struct {
		name  string
		bound caddy.Duration
		req   *http.Request
	}{
		{"ping", bound, newRequest(http.MethodPost)},
		{"2026-07-28 tools/call", bound, modern},
		{"GET", bound, newRequest(http.MethodGet)},
		{"initialize, off", -1, initializeRequest()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := provisionHandler(t, &Handler{InitializeTimeout: tc.bound})
			next := &frozenNext{pool: testPool(), delay: 60 * time.Millisecond}
			rec := httptest.NewRecorder()
			if err := h.ServeHTTP(rec, tc.req, next); err != nil || rec.Code != http.StatusOK || next.calls.Load() != 1 {
				t.Errorf("status %d, err %v, %d calls; want 200 from one upstream", rec.Code, err, next.calls.Load())
			}
		})
	}
}

// TestPinnedTimeout: with pinned_timeout, a request of a session whose
// upstream sends no headers gets 504 within the bound and the session is
// kept; without it (the default), the same request is not cut.
func TestPinnedTimeout(t *testing.T) {
	pool := testPool()
	for _, bound := range []time.Duration{30 * time.Millisecond, 0} {
		h, _ := provisionHandler(t, &Handler{PinnedTimeout: caddy.Duration(bound)})
		h.table.Learn(testSessionID, pool[0].Dial)
		next := &frozenNext{pool: pool, frozen: map[string]bool{pool[0].Dial: bound > 0}, delay: 60 * time.Millisecond}
		rec := httptest.NewRecorder()
		if err := h.ServeHTTP(rec, newRequest(http.MethodPost, testSessionID), next); err != nil {
			t.Fatal(err)
		}
		if bound == 0 {
			if rec.Code != http.StatusOK {
				t.Errorf("no bound: status %d after a 60 ms wait, want 200", rec.Code)
			}
			continue
		}
		checkTimeout(t, rec, `1`, "pinned_timeout") // the id of the body the proxy read whole to send
		if h.table.Lookup(testSessionID) == nil {
			t.Error("the session was dropped")
		}
		if !h.table.Stuck(h.table.KnownUpstream(pool[0].Dial)) {
			t.Error("the frozen upstream is not stuck")
		}
	}
}

// checkTimeout checks that rec holds a 504 with a JSON-RPC error of
// CodeUpstreamTimeout for the request id, naming option.
func checkTimeout(t *testing.T, rec *httptest.ResponseRecorder, id, option string) {
	t.Helper()
	var body rpcBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q is not JSON: %v", rec.Body, err)
	}
	if rec.Code != http.StatusGatewayTimeout || body.Error.Code != CodeUpstreamTimeout || string(body.ID) != id ||
		!strings.Contains(body.Error.Message, option) {
		t.Errorf("status %d, body %s; want 504, code %d, id %s, naming %s", rec.Code, rec.Body, CodeUpstreamTimeout, id, option)
	}
}

// TestHeaderWaitRace: whichever of the headers and the bound comes first
// wins, once: the client gets either the upstream's response or nothing
// from this attempt, never both.
func TestHeaderWaitRace(t *testing.T) {
	for range 200 {
		rec := httptest.NewRecorder()
		cancelled := false
		hw := &headerWait{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: rec}, cancel: func(error) { cancelled = true }}
		done := make(chan struct{})
		go func() { hw.expire(); close(done) }()
		hw.WriteHeader(http.StatusOK)
		_, err := hw.Write([]byte("x"))
		<-done
		if hw.expired() != cancelled || hw.expired() == (err == nil) || hw.expired() == (rec.Body.Len() == 1) {
			t.Fatalf("expired %v, cancelled %v, write error %v, %d bytes passed", hw.expired(), cancelled, err, rec.Body.Len())
		}
	}
}
