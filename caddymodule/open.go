package caddymodule

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// Slow is not dead. An upstream that sends no response headers for an
// initialize within initialize_timeout is frozen (a stopped process, a
// deadlocked server: its kernel accepts connections and requests, and
// nothing answers) or merely slow (a cold start, per-session setup). Cut,
// a slow upstream goes on serving an initialize nobody waits for any
// more, and when every upstream is that slow every new session gets 504.
//
// So at the bound the proxy probes the upstream before it gives up: it
// opens a connection of its own to the address reverse_proxy dialed
// ({http.reverse_proxy.upstream.address}) and sends `OPTIONS *`, the
// request that pings a server rather than a resource (RFC 9110 §9.3.7),
// which Go's net/http answers itself, without the MCP handler. An
// upstream whose process answers within probeTimeout, whatever it answers
// (a status line, a TLS alert to a plain request, closing the connection),
// is alive: the initialize goes on waiting, never abandoned, and the probe
// is repeated every initialize_timeout, up to slowInitializeLimit from
// when the request was sent. One that does not answer is frozen: the
// initialize is cut and sent to another upstream (frozen.go).

// slowInitializeLimit is the longest a request that opens a session waits
// for an upstream that answers probes: a minute, or initialize_timeout
// when that is longer.
const slowInitializeLimit = time.Minute

// probeTimeout bounds a probe of an upstream, from dialing to its first
// byte; it is initialize_timeout when that is shorter.
const probeTimeout = time.Second

// probeRequest is the probe: `OPTIONS *` over HTTP/1.1 on a connection of
// its own, closed after the answer.
const probeRequest = "OPTIONS * HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"

// openWait is the headerWait of a request that opens a session: at each
// bound it probes the upstream, and expires only when the upstream does
// not answer, or slowInitializeLimit has passed.
type openWait struct {
	headerWait
	repl  *caddy.Replacer // the request's: reverse_proxy names the upstream it dialed there
	bound time.Duration
	sent  time.Time

	mu    sync.Mutex
	timer *time.Timer
	done  bool // the request is back: the timer must not be armed again
	slow  bool // the upstream answered a probe while the headers were awaited
}

// forwardOpening is forward for a request that opens a session, sw's: at
// each bound, it asks whether the upstream is frozen (see above). expired
// reports that nothing reached the client and the upstream was left; slow,
// that the upstream took longer than bound but answered probes.
// A refusal (refusal.go) is returned as held instead of reaching the client.
func (h *Handler) forwardOpening(sw *sessionWriter, next caddyhttp.Handler, bound time.Duration) (expired, slow bool, held *heldAnswer, err error) {
	if bound <= 0 {
		expired, held, err = h.forward(sw, next, 0, true)
		return expired, false, held, err
	}
	ctx, cancel := context.WithCancelCause(sw.r.Context())
	defer cancel(nil)
	repl, _ := sw.r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	ow := &openWait{headerWait: headerWait{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: sw}, cancel: cancel, hold: true},
		repl: repl, bound: bound, sent: time.Now()}
	ow.mu.Lock()
	ow.timer = time.AfterFunc(bound, ow.check)
	ow.mu.Unlock()
	err = next.ServeHTTP(ow, sw.r.WithContext(ctx))
	slow = ow.finish()
	return ow.expired(), slow, ow.held, err
}

// check runs at each bound while the headers are awaited: it waits on
// while the upstream answers a probe, within slowInitializeLimit, and
// expires the wait otherwise.
func (ow *openWait) check() {
	if ow.state.Load() != headersAwaited {
		return
	}
	left := max(slowInitializeLimit, ow.bound) - time.Since(ow.sent)
	alive := left > 0 && probe(ow.upstreamAddress(), min(probeTimeout, ow.bound))
	ow.mu.Lock()
	defer ow.mu.Unlock()
	switch {
	case ow.done:
	case alive:
		ow.slow = true
		ow.timer.Reset(min(ow.bound, left))
	default:
		ow.expire()
	}
}

// finish stops the timer once the request is back, and reports whether
// the upstream answered a probe meanwhile.
func (ow *openWait) finish() (slow bool) {
	ow.mu.Lock()
	defer ow.mu.Unlock()
	ow.done = true
	ow.timer.Stop()
	return ow.slow && !ow.expired()
}

// upstreamAddress returns the network address reverse_proxy dialed for
// the request, "" if it has dialed none.
func (ow *openWait) upstreamAddress() string {
	if ow.repl == nil {
		return ""
	}
	addr, _ := ow.repl.GetString("http.reverse_proxy.upstream.address")
	return addr
}

// probe reports whether the process at the network address addr (as Caddy
// writes one: `host:port`, `unix//path`) answers `OPTIONS *` within
// timeout: any byte back, or the connection's end, is an answer. A frozen
// process's kernel accepts the connection and the request, and sends
// nothing.
func probe(addr string, timeout time.Duration) bool {
	na, err := caddy.ParseNetworkAddress(addr)
	if addr == "" || err != nil {
		return false
	}
	conn, err := net.DialTimeout(na.Network, na.JoinHostPort(0), timeout)
	if err != nil {
		return false
	}
	defer conn.Close()
	if conn.SetDeadline(time.Now().Add(timeout)) != nil {
		return false
	}
	if _, err := io.WriteString(conn, probeRequest); err != nil {
		return false
	}
	var b [1]byte
	_, err = conn.Read(b[:])
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

// noteSlow logs, once per handler, that the upstream of r took longer than
// initialize_timeout to answer its initialize while it answered probes.
func (h *Handler) noteSlow(r *http.Request, bound time.Duration) {
	if h.warnedSlowInit.CompareAndSwap(false, true) {
		var dial string
		if sel := selectedUpstream(r); sel != nil {
			dial = sel.Dial
		}
		h.logger.Warn("an upstream answered initialize after longer than initialize_timeout; it answered probes meanwhile, "+
			"so the sessions opened, each waiting for it; raise initialize_timeout above the upstream's initialize time",
			zap.String("upstream", dial), zap.Duration("initialize_timeout", bound))
	}
}
