package caddymodule

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
)

// MaxBodyMemory is the most bytes of request bodies, over all requests in
// flight, that the proxy holds in memory to inspect them: the head of a
// POST without a session (to find an initialize), an `mcp` matcher's read
// (max_body_size), a body kept for failover, a small body read before it
// is routed (MaxInMemoryBody). 64 MiB: 16 bodies at the matcher's default
// bound of 4 MiB, or a thousand 64 KiB bodies. A request whose read would
// pass it is answered 503 (see refuseBodyMemory); bodies that are not
// inspected stream to the upstream and count nothing.
const MaxBodyMemory = 64 << 20

// openingHead is the most bytes of a POST without a session the handler
// reads to tell whether it opens a session, unless max_initialize_size is
// larger: SDK clients send initialize requests of 150 to 500 bytes. A longer
// body is not an initialize the proxy keeps or sends again: it streams.
const openingHead = 4 << 10

// drainRefused is the most bytes of a refused request's body the proxy
// reads and discards, so that the client's connection can carry its next
// request: the matcher's default bound.
const drainRefused = DefaultMaxBodySize

// headChunk is the first allocation, in bytes, of a read of a body of
// unknown length; it doubles up to the read's bound, each step charged
// before it is allocated.
const headChunk = 32 << 10

// CodeBodyMemory answers a request refused because the proxy holds
// MaxBodyMemory of request bodies already (HTTP 503), in the
// implementation-defined server error range (JSON-RPC 2.0 §5.1).
const CodeBodyMemory = -32005

// errBodyMemory is why a body was not read: the budget is spent.
var errBodyMemory = errors.New("the proxy holds the most request body bytes it keeps in memory (64 MiB)")

// bodyBudget counts the bytes of request bodies held in memory, over
// every request in flight, against a bound.
type bodyBudget struct {
	max     int64         // bytes
	held    atomic.Int64  // bytes charged and not yet released
	refused atomic.Uint64 // charges refused
}

// bodyMemory is the process's budget; it outlives config reloads, as the
// requests it counts may.
var bodyMemory = &bodyBudget{max: MaxBodyMemory}

// take charges n bytes, or reports false, and counts a refusal, when they
// would pass the bound.
func (b *bodyBudget) take(n int64) bool {
	for {
		h := b.held.Load()
		if h+n > b.max {
			b.refused.Add(1)
			return false
		}
		if b.held.CompareAndSwap(h, h+n) {
			return true
		}
	}
}

// give releases n bytes charged before.
func (b *bodyBudget) give(n int64) { b.held.Add(-n) }

// Held returns the bytes of request bodies held in memory now.
func (b *bodyBudget) Held() int64 { return b.held.Load() }

// Refused returns how many reads of request bodies were refused because
// the budget was spent.
func (b *bodyBudget) Refused() uint64 { return b.refused.Load() }

// bodyHold is what one request holds of the budget. It is released once,
// when the request ends: when its mcp_session handler returns (also when
// it panics), or when its context ends (Go's server cancels it once the
// request's handler returned, or when the client goes away), whichever
// comes first; a charge after that is refused.
type bodyHold struct {
	mu     sync.Mutex
	budget *bodyBudget     // nil: bodyMemory
	ctx    context.Context // the request's, nil when unknown
	held   int64           // bytes
	ended  bool
	watch  bool // a release is registered on ctx
	owned  bool // an mcp_session handler serves the request and releases on return
}

// charge takes n bytes of the budget for the request.
func (h *bodyHold) charge(n int64) bool {
	if n <= 0 {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.budget == nil {
		h.budget = bodyMemory
	}
	if h.ended || !h.budget.take(n) {
		return false
	}
	h.held += n
	if !h.watch && !h.owned && h.ctx != nil {
		h.watch = true
		context.AfterFunc(h.ctx, h.release)
	}
	return true
}

// own tells the hold that an mcp_session handler serves the request and
// releases the hold when it returns: later charges need no watch on the
// request's context (a context.AfterFunc, two allocations per request).
func (h *bodyHold) own() {
	h.mu.Lock()
	h.owned = true
	h.mu.Unlock()
}

// release gives back everything the request holds; later charges are refused.
func (h *bodyHold) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held > 0 {
		h.budget.give(h.held)
	}
	h.held, h.ended = 0, true
}

// giveBack releases n of the bytes the request holds, before it ends.
func (h *bodyHold) giveBack(n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n = min(n, h.held); n > 0 {
		h.budget.give(n)
		h.held -= n
	}
}

// readHead reads r's body into memory, at most limit bytes and one more to
// tell a longer body, charging the bytes to the budget before it allocates
// them, and puts them back in front of the rest: the body passes on
// unchanged. whole reports that buf is the whole body, of at most limit
// bytes; a head that is not is given back to the budget once it has passed
// on (callers keep only whole bodies). A head read before and not yet
// consumed is returned again, at no charge. err is the body's read error, or errBodyMemory when the budget
// is spent; what was read is put back then too.
func (ex *exchange) readHead(r *http.Request, limit int64) (buf []byte, whole bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true, nil
	}
	if rb, ok := r.Body.(*replayBody); ok && !rb.started && (rb.eof || int64(len(rb.buf)) > limit) {
		n := min(int64(len(rb.buf)), limit+1)
		return rb.buf[:n], rb.eof && n <= limit, nil
	}
	want := limit + 1
	if r.ContentLength >= 0 && r.ContentLength <= limit {
		want = r.ContentLength
	}
	buf, eof, err := ex.readUpTo(r.Body, want)
	rb := &replayBody{buf: buf, rest: r.Body, eof: eof || err == nil && int64(len(buf)) == r.ContentLength}
	r.Body = rb
	whole = err == nil && int64(len(buf)) <= limit
	if !whole {
		rb.hold, rb.charged = &ex.mem, int64(cap(buf))
	}
	return buf, whole, err
}

// readUpTo reads at most want bytes of body, growing its buffer from
// headChunk and charging each step before allocating it. eof reports that
// the body ended.
func (ex *exchange) readUpTo(body io.Reader, want int64) (buf []byte, eof bool, err error) {
	size := min(want, headChunk)
	if !ex.mem.charge(size) {
		return nil, false, errBodyMemory
	}
	buf = make([]byte, 0, size)
	for int64(len(buf)) < want {
		if len(buf) == cap(buf) {
			grow := min(want, 2*int64(cap(buf)))
			if !ex.mem.charge(grow - int64(cap(buf))) {
				return buf, false, errBodyMemory
			}
			buf = append(make([]byte, 0, grow), buf...)
		}
		n, rerr := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case rerr == io.EOF:
			return buf, true, nil
		case rerr != nil:
			return buf, false, rerr
		}
	}
	return buf, false, nil
}

// refuseBodyMemory answers a request whose body the proxy could not read
// because the budget was spent: 503 with Retry-After: 1 and a JSON-RPC
// error saying why. It first reads and discards up to drainRefused bytes
// of the body, so that the client's connection can be used again.
func refuseBodyMemory(r *http.Request) *fault {
	if r.Body != nil {
		_, _ = io.CopyN(io.Discard, r.Body, drainRefused)
	}
	return &fault{status: http.StatusServiceUnavailable, code: CodeBodyMemory, retryAfter: 1, message: "Service Unavailable: " +
		"the proxy holds the most request body bytes it reads to route requests (64 MiB, over all requests in flight); retry shortly"}
}
