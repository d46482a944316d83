package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// Bounded waits for an upstream's response headers: a frozen upstream (a
// stopped process, a deadlocked server) accepts connections and requests
// but never answers, so without a bound its requests hang for as long as
// their clients wait.

// DefaultInitializeTimeout is how long a request that opens a session waits
// for its upstream's response headers by default. MCP servers answer
// initialize in milliseconds; a few seconds leave room for a loaded one.
const DefaultInitializeTimeout = 5 * time.Second

// maxOpenAttempts is the most upstreams one request that opens a session
// is sent to.
const maxOpenAttempts = 3

// errHeaderTimeout is the cause of the cancelled context of a request whose
// upstream sent no response headers in time.
var errHeaderTimeout = errors.New("the upstream sent no response headers in time")

// The states of a headerWait.
const (
	headersAwaited int32 = iota
	headersPassed
	headersExpired
	headersRefused
)

// headerWait passes a response to the writer it wraps once its headers
// come, unless its bound expired first: then it cancels the request to the
// upstream and drops everything written after, so that the handler may
// answer or retry. Which comes first is decided once, atomically. With
// hold, a refusal (see refusal.go) is held back in held instead of passed.
type headerWait struct {
	caddyhttp.ResponseWriterWrapper
	state  atomic.Int32
	cancel context.CancelCauseFunc
	hold   bool
	held   *heldAnswer
}

// refuse holds back the answer of status, whose headers were written, if
// it is a refusal and the wait holds refusals.
func (hw *headerWait) refuse(status int) bool {
	if !hw.hold || !refusal(status, hw.Header()) || !hw.state.CompareAndSwap(headersAwaited, headersRefused) {
		return false
	}
	hw.held = &heldAnswer{status: status, header: hw.Header().Clone()}
	return true
}

// expire ends the wait unless the headers came.
func (hw *headerWait) expire() {
	if hw.state.CompareAndSwap(headersAwaited, headersExpired) {
		hw.cancel(errHeaderTimeout)
	}
}

// expired reports whether the bound expired before the headers came.
func (hw *headerWait) expired() bool { return hw.state.Load() == headersExpired }

// pass reports whether the response goes to the client: its headers came
// before the bound.
func (hw *headerWait) pass() bool {
	return hw.state.CompareAndSwap(headersAwaited, headersPassed) || hw.state.Load() == headersPassed
}

// WriteHeader passes a final status if the bound has not expired, and an
// informational (1xx) one while it has not.
func (hw *headerWait) WriteHeader(status int) {
	if status < 200 && hw.state.Load() == headersAwaited || status >= 200 && !hw.refuse(status) && hw.pass() {
		hw.ResponseWriter.WriteHeader(status)
	}
}

// Write passes b, after a 200 status if none was written, unless the bound
// expired; a held refusal's body is kept.
func (hw *headerWait) Write(b []byte) (int, error) {
	if hw.state.Load() == headersRefused {
		return hw.held.Write(b)
	}
	if !hw.pass() {
		return 0, errHeaderTimeout
	}
	return hw.ResponseWriter.Write(b)
}

// ReadFrom copies r as the wrapped writer does, unless the bound expired;
// a held refusal's body is kept.
func (hw *headerWait) ReadFrom(r io.Reader) (int64, error) {
	if hw.state.Load() == headersRefused {
		return io.Copy(hw.held, r)
	}
	if !hw.pass() {
		return 0, errHeaderTimeout
	}
	return hw.ResponseWriterWrapper.ReadFrom(r)
}

// FlushError flushes the response, unless the bound expired or a refusal
// is held.
func (hw *headerWait) FlushError() error {
	if hw.state.Load() == headersRefused {
		return nil
	}
	if !hw.pass() {
		return errHeaderTimeout
	}
	return http.NewResponseController(hw.ResponseWriter).Flush()
}

// Flush implements http.Flusher on top of FlushError.
func (hw *headerWait) Flush() { _ = hw.FlushError() }

// forward sends sw's request through next once, its response observed by
// sw. With a positive bound it waits at most that long for the response
// headers; expired then reports that nothing reached the client and the
// upstream was left. With hold, a refusal (see refusal.go) is returned as
// held instead of reaching the client.
func (h *Handler) forward(sw *sessionWriter, next caddyhttp.Handler, bound time.Duration, hold bool) (expired bool, held *heldAnswer, err error) {
	if bound <= 0 && !hold {
		return false, nil, next.ServeHTTP(sw, sw.r)
	}
	ctx, cancel := context.WithCancelCause(sw.r.Context())
	defer cancel(nil)
	hw := &headerWait{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: sw}, cancel: cancel, hold: hold}
	if bound > 0 {
		timer := time.AfterFunc(bound, hw.expire)
		defer timer.Stop()
	}
	err = next.ServeHTTP(hw, sw.r.WithContext(ctx))
	return hw.expired(), hw.held, err
}

// forwardNew forwards a request without a session. One that opens a
// session waits initialize_timeout for each upstream's response headers,
// and longer while the upstream answers probes (open.go); it is sent to
// another upstream when one leaves it waiting and does not answer (see
// [Handler.InitializeTimeout]), or refuses it (refusal.go); the client gets
// a held refusal only when no other upstream takes the session.
func (h *Handler) forwardNew(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	body, opens, f := opening(r, h.table.Failover().MaxInit)
	if f != nil {
		decide(r, decisionRejected, "")
		return f.write(w)
	}
	if !opens {
		sw := newSessionWriter(w, h, r, "", nil)
		defer sw.finishLegacyStream() // also when reverse_proxy aborts a stream with a panic
		return next.ServeHTTP(sw, r)
	}
	bound := max(time.Duration(h.InitializeTimeout), 0)
	var refused *heldAnswer // the last refusal held back
	for attempt := 1; ; attempt++ {
		before := w.Header().Clone()
		sw := newSessionWriter(w, h, r, "", nil)
		retry := attempt < maxOpenAttempts && body != nil
		expired, slow, held, err := h.forwardOpening(sw, next, bound) // open.go: slow is not dead
		if slow {
			h.noteSlow(r, bound)
		}
		switch {
		case held != nil:
			r = withOwnVars(r) // the attempt may still be dialing another upstream
			leftRefusing(h.table, h.logger, r, held)
			clear(w.Header())
			maps.Copy(w.Header(), before)
			if !retry {
				return held.write(w)
			}
			refused = held
			r.Body = io.NopCloser(bytes.NewReader(body))
			continue
		case !expired && err != nil && !sw.wroteHeader && refused != nil:
			return refused.write(w) // no other upstream to send it to
		case !expired && (attempt == 1 || err == nil || sw.wroteHeader):
			return err
		case !expired: // no other upstream to send it to
			return writeTimeout(w, r, fmt.Sprintf("no upstream sent response headers within %s (initialize_timeout)", bound))
		}
		r = withOwnVars(r) // the cut attempt may still be dialing
		dial := leftStuck(h.table, r)
		h.logger.Warn("upstream sent no response headers in time, nor answered a probe; it gets no new sessions for a while",
			zap.String("upstream", dial), zap.Duration("initialize_timeout", bound), zap.Bool("retrying", retry))
		if !retry {
			return writeTimeout(w, r, fmt.Sprintf("no upstream sent response headers within %s (initialize_timeout)", bound))
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
}

// opening reports whether r opens a session: a POST of `initialize` (the
// JSON-RPC method of its body) or of a 2026-07-28 `server/discover` (its
// Mcp-Method header). It reads at most the body's first openingHead
// bytes, or maxInit (max_initialize_size) if larger: a longer body is no
// initialize the proxy sends again, and streams to one upstream. body is the whole
// request body, to send to another upstream, or nil when it is longer or
// could not be read whole. f refuses the request: the proxy holds
// MaxBodyMemory of bodies already (refuseBodyMemory).
func opening(r *http.Request, maxInit int) (body []byte, opens bool, f *fault) {
	if r.Method != http.MethodPost {
		return nil, false, nil
	}
	ex := exchangeOf(r)
	if ex.fromHeaders() && ex.hdrMethod != "server/discover" {
		return nil, false, nil
	}
	if ex.bodyRead { // by an mcp matcher
		if ex.bodyFault != nil {
			return nil, ex.fromHeaders(), nil
		}
		return ex.raw, ex.fromHeaders() || ex.body.Method == "initialize", nil
	}
	limit := int64(max(openingHead, maxInit))
	if r.ContentLength > limit {
		return nil, ex.fromHeaders(), nil
	}
	buf, whole, err := ex.readHead(r, limit)
	switch {
	case errors.Is(err, errBodyMemory):
		return nil, false, refuseBodyMemory(r)
	case err != nil || !whole:
		return nil, ex.fromHeaders(), nil
	}
	head, bad := parseRPC(buf)
	if bad != nil {
		return nil, ex.fromHeaders(), nil
	}
	ex.bodyRead, ex.body, ex.raw = true, head, buf
	return buf, ex.fromHeaders() || head.Method == "initialize", nil
}

// writePinnedTimeout answers a request of session id whose upstream sent no
// response headers within pinned_timeout: 504, the session kept.
func (h *Handler) writePinnedTimeout(w http.ResponseWriter, r *http.Request, id string, up *session.Upstream) error {
	leftStuck(h.table, r)
	h.debug("upstream_timeout", id, up.Dial())
	return writeTimeout(w, r, fmt.Sprintf("the session's upstream sent no response headers within %s (pinned_timeout); "+
		"the session is kept: retry later", time.Duration(h.PinnedTimeout)))
}

// writeTimeout answers 504 with a JSON-RPC error carrying the request's
// id when the proxy read it.
func writeTimeout(w http.ResponseWriter, r *http.Request, why string) error {
	f := &fault{status: http.StatusGatewayTimeout, code: CodeUpstreamTimeout, message: "Gateway Timeout: " + why, id: exchangeOf(r).requestID()}
	return f.write(w)
}

// leftStuck records in t that the upstream the request was last sent to
// let it wait past its bound: the upstream is stuck, and this request is
// not sent there again. It returns the upstream's dial address, "" if none was
// selected.
func leftStuck(t *session.Table, r *http.Request) string {
	sel := selectedUpstream(r)
	if sel == nil {
		return ""
	}
	t.MarkStuck(sel.Dial)
	noteTried(r, sel.Dial)
	return sel.Dial
}

// answered records in t that the upstream of r sent response headers: up, the
// session's, or the one selected for a request without a session.
func answered(t *session.Table, r *http.Request, up *session.Upstream) {
	if up == nil && t.AnyStuck() {
		if sel := selectedUpstream(r); sel != nil {
			up = t.KnownUpstream(sel.Dial)
		}
	}
	if up != nil {
		up.Answered()
	}
}

// Interface guards
var (
	_ http.ResponseWriter = (*headerWait)(nil)
	_ http.Flusher        = (*headerWait)(nil)
	_ io.ReaderFrom       = (*headerWait)(nil)
)
