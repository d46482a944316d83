package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestBodyBudget: charges add up to the bound and no further; a refusal is
// counted; a request's release gives back all it held, once, and refuses
// its later charges.
func TestBodyBudget(t *testing.T) {
	b := &bodyBudget{max: 100}
	one, two := &bodyHold{budget: b}, &bodyHold{budget: b}
	if !one.charge(60) || !one.charge(0) {
		t.Fatal("a charge within the bound was refused")
	}
	if two.charge(50) {
		t.Fatal("a charge past the bound was taken")
	}
	if b.Refused() != 1 || b.Held() != 60 {
		t.Fatalf("after one refusal: held %d, refused %d; want 60, 1", b.Held(), b.Refused())
	}
	if !two.charge(40) || b.Held() != 100 {
		t.Fatalf("a charge up to the bound was refused: held %d", b.Held())
	}
	one.release()
	one.release()
	if b.Held() != 40 {
		t.Fatalf("after releasing 60 of 100 (twice): held %d, want 40", b.Held())
	}
	if one.charge(1) || b.Held() != 40 {
		t.Fatal("a request that ended could still charge the budget")
	}
	two.release()
	if b.Held() != 0 {
		t.Fatalf("after every release: held %d, want 0", b.Held())
	}
}

// TestBodyHoldEndsWithContext: a request whose body an mcp matcher read,
// with no mcp_session handler to release it, gives its bytes back when its
// context ends (the client went away, or Go's server finished the request).
func TestBodyHoldEndsWithContext(t *testing.T) {
	before := bodyMemory.Held()
	r := newRequest(http.MethodPost)
	ctx, cancel := context.WithCancel(r.Context())
	r = r.WithContext(ctx)
	if _, f := exchangeOf(r).readBody(r, DefaultMaxBodySize); f != nil {
		t.Fatal(f)
	}
	if bodyMemory.Held() <= before {
		t.Fatal("reading the body charged nothing")
	}
	cancel()
	waitHeld(t, before)
}

// waitHeld waits for the budget to hold want bytes.
func waitHeld(t *testing.T, want int64) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); bodyMemory.Held() != want; {
		if time.Now().After(deadline) {
			t.Fatalf("body memory held %d bytes, want %d", bodyMemory.Held(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReadHead: a head is read at most to its bound and one byte more,
// charged before it is allocated, read again at no charge, and put back:
// the body passes on unchanged, also when the budget refuses the read. A
// head shorter than the body is given back once it passed on; a whole
// body stays charged until the request ends.
func TestReadHead(t *testing.T) {
	body := strings.Repeat("x", 100<<10)
	for _, known := range []bool{true, false} {
		b := &bodyBudget{max: 1 << 20}
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		if !known {
			r.ContentLength = -1
		}
		ex := &exchange{mem: bodyHold{budget: b}}
		buf, whole, err := ex.readHead(r, 4096)
		if err != nil || whole || len(buf) != 4097 {
			t.Fatalf("known length %v: read %d bytes, whole %v, err %v; want 4097, false, nil", known, len(buf), whole, err)
		}
		if b.Held() != 4097 {
			t.Errorf("known length %v: charged %d bytes, want 4097", known, b.Held())
		}
		if buf, whole, _ = ex.readHead(r, 1024); len(buf) != 1025 || whole || b.Held() != 4097 {
			t.Errorf("known length %v: a shorter head again: %d bytes, whole %v, held %d; want 1025 from the head read", known, len(buf), whole, b.Held())
		}
		if got, _ := io.ReadAll(r.Body); string(got) != body {
			t.Errorf("known length %v: the body passed on is %d bytes, want the %d sent", known, len(got), len(body))
		}
		if b.Held() != 0 {
			t.Errorf("known length %v: a head that is not the whole body is still charged (%d bytes) after it passed on", known, b.Held())
		}

		r = httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		if !known {
			r.ContentLength = -1
		}
		ex = &exchange{mem: bodyHold{budget: b}}
		buf, whole, err = ex.readHead(r, int64(len(body)))
		if err != nil || !whole || string(buf) != body {
			t.Fatalf("known length %v: the whole body: %d bytes, whole %v, err %v", known, len(buf), whole, err)
		}
		if buf, whole, _ = ex.readHead(r, int64(len(body))); !whole || len(buf) != len(body) {
			t.Errorf("known length %v: the whole body read again is %d bytes, whole %v", known, len(buf), whole)
		}
		_, _ = io.ReadAll(r.Body)
		if h := b.Held(); h < int64(len(body)) || h > int64(len(body))+1 { // one byte more to see the end of a body of unknown length
			t.Errorf("known length %v: a whole body, which callers keep, is charged %d bytes, want %d until the request ends", known, h, len(body))
		}
		ex.mem.release()
	}

	b := &bodyBudget{max: 8 << 10}
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	r.ContentLength = -1
	ex := &exchange{mem: bodyHold{budget: b}}
	if _, _, err := ex.readHead(r, DefaultMaxBodySize); !errors.Is(err, errBodyMemory) {
		t.Fatalf("a read past the budget: err %v, want errBodyMemory", err)
	}
	if got, _ := io.ReadAll(r.Body); string(got) != body {
		t.Errorf("after a refused read, the body passed on is %d bytes, want the %d sent", len(got), len(body))
	}
	ex.mem.release()
	if b.Held() != 0 {
		t.Errorf("after the request's release, held %d", b.Held())
	}
}

// bigPost returns a POST without a session of a JSON-RPC message of about
// size bytes, of method, Content-Length unknown unless known.
func bigPost(method string, size int, known bool) (*http.Request, string) {
	body := `{"jsonrpc":"2.0","id":1,"method":"` + method + `","params":{"pad":"` + strings.Repeat("x", size) + `"}}`
	r := newRequest(http.MethodPost)
	r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
	if !known {
		r.ContentLength = -1
	}
	return r, body
}

// TestLargeSessionlessPostStreams: a POST without a session longer than
// openingHead is not held: the proxy reads its head, and the rest streams
// to the upstream, which gets it byte for byte, while the proxy holds no
// more than the head. Everything is given back when the request ends.
func TestLargeSessionlessPostStreams(t *testing.T) {
	h, _ := provisionHandler(t, &Handler{TableSettings: TableSettings{Failover: FailoverReinitialize}})
	before := bodyMemory.Held()
	for _, method := range []string{"initialize", "tools/call"} {
		for _, known := range []bool{true, false} {
			r, body := bigPost(method, 4<<20, known)
			var peak int64
			var got bytes.Buffer
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				chunk := make([]byte, 32<<10)
				for {
					peak = max(peak, bodyMemory.Held()-before)
					n, err := r.Body.Read(chunk)
					got.Write(chunk[:n])
					if err != nil {
						break
					}
				}
				w.WriteHeader(http.StatusOK)
				return nil
			})
			if err := h.ServeHTTP(httptest.NewRecorder(), r, next); err != nil {
				t.Fatal(err)
			}
			if got.String() != body {
				t.Errorf("%s, known length %v: the upstream got %d bytes, want the %d sent", method, known, got.Len(), len(body))
			}
			if peak > openingHead+1 {
				t.Errorf("%s, known length %v: the proxy held %d bytes of a 4 MiB body, want at most its %d-byte head", method, known, peak, openingHead+1)
			}
			if held := bodyMemory.Held(); held != before {
				t.Errorf("%s, known length %v: after the request, %d bytes are held, want %d", method, known, held, before)
			}
		}
	}
}

// TestBodyMemoryFull: with the budget spent, a request whose body the proxy
// would read is answered 503 with Retry-After: 1 and a JSON-RPC error that
// says why, without an upstream; its body is drained so that the connection
// can carry the next request, and the refusal is counted.
func TestBodyMemoryFull(t *testing.T) {
	h, _ := provisionHandler(t, &Handler{})
	// Other tests' requests whose context never ends (httptest's) may still
	// hold bytes: count this test's own.
	before := bodyMemory.Held()
	fill := &bodyHold{}
	if !fill.charge(MaxBodyMemory - before) {
		t.Fatal("could not fill the budget")
	}
	defer fill.release()
	refused := bodyMemory.Refused()
	for _, known := range []bool{true, false} {
		r, _ := bigPost("initialize", 1<<20, known)
		if known { // a small body, read before it is routed
			r = newRequest(http.MethodPost)
		}
		rest := r.Body
		next := new(countingNext)
		rec := httptest.NewRecorder()
		if err := h.ServeHTTP(rec, r, next); err != nil {
			t.Fatal(err)
		}
		checkRPCError(t, rec, http.StatusServiceUnavailable, CodeBodyMemory, "most request body bytes")
		if ra := rec.Header().Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After = %q, want 1", ra)
		}
		if next.calls != 0 {
			t.Errorf("next called %d times, want 0", next.calls)
		}
		if n, _ := io.Copy(io.Discard, rest); n != 0 {
			t.Errorf("%d bytes of the refused body were left unread", n)
		}
	}
	if got := bodyMemory.Refused() - refused; got != 2 {
		t.Errorf("refusals counted: %d, want 2", got)
	}
	fill.release()
	if held := bodyMemory.Held(); held != before {
		t.Errorf("held %d after every request ended, want the %d held before the test", held, before)
	}
}

// TestBodyMemoryReleasedOnPanic: a request whose next handler panics (Caddy
// recovers it) gives back the bytes read of its body.
func TestBodyMemoryReleasedOnPanic(t *testing.T) {
	h, _ := provisionHandler(t, &Handler{})
	before := bodyMemory.Held()
	var during atomic.Int64
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		during.Store(bodyMemory.Held() - before)
		panic("upstream handler broke")
	})
	func() {
		defer func() { _ = recover() }()
		_ = h.ServeHTTP(httptest.NewRecorder(), newRequest(http.MethodPost), next)
	}()
	if during.Load() <= 0 {
		t.Fatal("the body read before routing charged nothing")
	}
	if held := bodyMemory.Held(); held != before {
		t.Errorf("after a panic, %d bytes are held, want %d", held, before)
	}
}

// TestMaxBodySizeAboveBudget: a matcher bound above what the proxy holds of
// all bodies fails to load, with a message saying what to write.
func TestMaxBodySizeAboveBudget(t *testing.T) {
	m := &MatchMCP{Body: true, MaxBodySize: MaxBodyMemory + 1}
	err := m.Validate()
	if err == nil || !strings.Contains(err.Error(), "up to 64MiB") {
		t.Fatalf("Validate = %v, want an error saying to write a size up to 64MiB", err)
	}
	m.MaxBodySize = MaxBodyMemory
	if err := m.Validate(); err != nil {
		t.Fatalf("Validate at the bound: %v", err)
	}
}
