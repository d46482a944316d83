package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"golang.org/x/time/rate"
)

// Reclaim: when a table forgets a session its upstream may still hold
// (session_ttl, max_sessions, an admin eviction, an upstream gone or
// relearned; see session.EvictReason.Reclaims), the proxy sends the
// upstream `DELETE` with the session's Mcp-Session-Id, as a client ending
// the session would (MCP 2025-03-26 transports, §Session Management). MCP
// servers keep sessions until DELETE, and some keep a bounded number: the
// Python SDK 2.2 answers initialize 503 past 10,000 live sessions, and
// FastMCP turns its idle reaper off. It is best effort: a bounded queue
// that drops (counted) when full, a few senders at a bounded rate, a short
// timeout, one try; it never delays a client's request.

// Values of [Handler.Reclaim].
const (
	ReclaimOn  = "on"
	ReclaimOff = "off"
)

// Bounds of the reclaim DELETEs.
const (
	// reclaimQueue is the most forgotten sessions waiting for their DELETE;
	// more are dropped and counted.
	reclaimQueue = 4096
	// reclaimSenders is the most DELETEs in flight per handler.
	reclaimSenders = 4
	// reclaimRate is the most DELETEs sent per second per handler, with
	// bursts of reclaimBurst: a table that forgets many sessions at once (a
	// smaller max_sessions, an upstream evicted) spreads their DELETEs.
	reclaimRate  = 100
	reclaimBurst = 20
	// reclaimTimeout bounds one DELETE, from sending to its answer's end.
	reclaimTimeout = 3 * time.Second
)

// reclaimer sends the DELETEs of one handler's forgotten sessions. The
// table tells it of a session through its hook (session.ForgetHook); the
// DELETE goes through the handler's next handler (its reverse_proxy: the
// same transport, TLS and header operations as the session's requests),
// pinned to the session's upstream.
type reclaimer struct {
	table   *session.Table
	sealer  *SessionSealer      // the handler's; nil without sealed IDs
	logger  *zap.Logger         // the handler's (see [Handler.setLogger])
	headers map[string]string   // reclaim_headers, placeholders unexpanded
	hook    *session.ForgetHook // Fn nil with reclaim off
	prev    *session.ForgetHook // the table's hook before this one
	closed  atomic.Bool
	queue   chan session.Forgotten
	limit   *rate.Limiter
	route   atomic.Pointer[reclaimRoute]
	attach  sync.Once
	stop    chan struct{}
	wg      sync.WaitGroup
}

// reclaimRoute is what a reclaim DELETE is sent through: the handler's
// next handler, the server and Host of a request the handler served, and
// the path of the last initialize it served.
type reclaimRoute struct {
	next   caddyhttp.Handler
	server *caddyhttp.Server
	host   string
	path   atomic.Pointer[string]
}

// newReclaimer returns the reclaimer of a handler of table t, with its
// sealer, reclaim setting and reclaim_headers, and makes its hook the
// table's: the
// handler provisioned last decides for the table, and the sessions the
// table forgets from then on wait in the queue until the handler serves
// its first request, which tells the senders where to send. With reclaim
// off its hook receives nothing.
func newReclaimer(t *session.Table, sealer *SessionSealer, logger *zap.Logger, reclaim string, headers map[string]string) *reclaimer {
	rc := &reclaimer{table: t, sealer: sealer, logger: logger, headers: headers, stop: make(chan struct{}), hook: &session.ForgetHook{}}
	if reclaim != ReclaimOff {
		rc.queue = make(chan session.Forgotten, reclaimQueue)
		rc.limit = rate.NewLimiter(reclaimRate, reclaimBurst)
		rc.hook.Fn = rc.enqueue
	}
	rc.prev = t.SetForgetHook(rc.hook)
	openReclaimers.Store(rc.hook, rc)
	return rc
}

// openReclaimers holds the hook of every reclaimer not closed yet, so that
// a closing one gives its table back only a hook that still works.
var openReclaimers sync.Map // *session.ForgetHook -> *reclaimer

// attachTo records next, through which the DELETEs go, from the first
// request the handler serves, and starts the senders.
func (rc *reclaimer) attachTo(r *http.Request, next caddyhttp.Handler) {
	rc.attach.Do(func() {
		srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
		rc.route.Store(&reclaimRoute{next: next, server: srv, host: strings.Clone(r.Host)})
		if rc.hook.Fn != nil {
			rc.wg.Add(reclaimSenders)
			for range reclaimSenders {
				go rc.run()
			}
		}
	})
}

// learnedPath records the path of an initialize that opened a session on
// up, where the DELETEs of its sessions go.
func (rc *reclaimer) learnedPath(r *http.Request, up *session.Upstream) {
	if rc.hook.Fn == nil {
		return
	}
	up.SetMCPPath(r.URL.Path)
	if rt := rc.route.Load(); rt != nil {
		if p := rt.path.Load(); p == nil || *p != r.URL.Path {
			path := strings.Clone(r.URL.Path)
			rt.path.Store(&path)
		}
	}
}

// enqueue queues the DELETE of s, or counts it dropped when the queue is
// full. It runs with the table's lock held, so it never waits.
func (rc *reclaimer) enqueue(s session.Forgotten) {
	if rc.closed.Load() {
		rc.table.Stats.Reclaims.Dropped.Add(1)
		return
	}
	select {
	case rc.queue <- s:
	default:
		rc.table.Stats.Reclaims.Dropped.Add(1)
	}
}

// close gives the table back the hook it had before this handler's, if it
// still has this one (a config that failed to load) and that hook's
// handler still runs, and stops the senders; queued sessions are dropped
// and counted. Closing again does nothing.
func (rc *reclaimer) close() {
	if rc.closed.Swap(true) {
		return // closed already
	}
	openReclaimers.Delete(rc.hook)
	prev := rc.prev
	if _, open := openReclaimers.Load(prev); !open {
		prev = nil // closed too: the config that set it is gone
	}
	rc.table.RestoreForgetHook(rc.hook, prev)
	rc.prev = nil
	rc.attach.Do(func() {}) // no senders start after this
	if rc.queue == nil {
		return
	}
	close(rc.stop)
	rc.wg.Wait()
	for {
		select {
		case <-rc.queue:
			rc.table.Stats.Reclaims.Dropped.Add(1)
		default:
			return
		}
	}
}

// run sends queued DELETEs, at most reclaimRate a second across senders,
// until close.
func (rc *reclaimer) run() {
	defer rc.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-rc.stop; cancel() }()
	for {
		select {
		case <-rc.stop:
			return
		case s := <-rc.queue:
			if rc.limit.Wait(ctx) != nil {
				return
			}
			rc.send(ctx, s)
		}
	}
}

// send sends the DELETE of s once, and counts its outcome.
func (rc *reclaimer) send(ctx context.Context, s session.Forgotten) {
	stats := &rc.table.Stats.Reclaims
	req, up := rc.request(ctx, s)
	if req == nil {
		stats.Failed.Add(1)
		return
	}
	ctx, cancel := context.WithTimeout(req.Context(), reclaimTimeout)
	defer cancel()
	stats.Sent.Add(1)
	ans := newUpstreamAnswer()
	err := rc.route.Load().next.ServeHTTP(ans, req.WithContext(ctx))
	switch {
	case err == nil && ans.ok():
		stats.OK.Add(1)
	case err == nil && ans.status == http.StatusNotFound:
		stats.NotFound.Add(1)
	default:
		stats.Failed.Add(1)
		if c := rc.logger.Check(zap.DebugLevel, "reclaim DELETE failed"); c != nil {
			c.Write(zap.String("session", fingerprint(s.Key)), zap.String("upstream", up.Dial()),
				zap.Int("status", ans.status), zap.Error(err))
		}
	}
}

// request returns the DELETE of s, pinned to its upstream, and the
// upstream; nil when it cannot be built: no request served yet, the
// upstream's record dropped, or no upstream session ID or path known.
func (rc *reclaimer) request(ctx context.Context, s session.Forgotten) (*http.Request, *session.Upstream) {
	rt := rc.route.Load()
	up := rc.table.KnownUpstream(s.Dial)
	id := rc.upstreamID(s)
	if rt == nil || up == nil || id == "" {
		return nil, nil
	}
	path := up.MCPPath()
	if p := rt.path.Load(); path == "" && p != nil {
		path = *p
	}
	if path == "" {
		return nil, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, "http://"+rt.host+path, nil)
	if err != nil {
		return nil, nil
	}
	req.Host, req.RemoteAddr, req.RequestURI = rt.host, "127.0.0.1:0", path
	repl := caddy.NewReplacer()
	req = caddyhttp.PrepareRequest(req, repl, nil, rt.server)
	for name, v := range rc.headers {
		req.Header.Set(name, repl.ReplaceAll(v, ""))
	}
	req.Header.Set(HeaderSessionID, id)
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Accept-Encoding", identityEncoding)
	if v := up.ProtocolVersion(); v != "" {
		req.Header.Set(HeaderProtocolVersion, v)
	}
	ex := exchangeOf(req)
	ex.owner, ex.own = up, true
	return req, up
}

// upstreamID returns the ID s's upstream knows it by: the one a failover
// gave it; for a sealed session ID, the ID it carries; otherwise its key.
// "" when a sealed ID does not open.
func (rc *reclaimer) upstreamID(s session.Forgotten) string {
	if s.UpstreamID != "" {
		return s.UpstreamID
	}
	if len(s.Key) == 0 || !isSealVersion(s.Key[0]) {
		return s.Key
	}
	if rc.sealer == nil {
		return ""
	}
	_, ss, ok := rc.sealer.open(clientID(s.Key))
	if !ok {
		return ""
	}
	return strings.Clone(ss.ID)
}

// validHeaderName reports whether name is an HTTP field name (RFC 9110
// §5.1: a token).
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range []byte(name) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

// reservedReclaimHeader reports whether the proxy sets header name on
// each reclaim DELETE itself.
func reservedReclaimHeader(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case HeaderSessionID, HeaderProtocolVersion, "Host", "Content-Length":
		return true
	}
	return false
}

// checkReclaimHeaders returns an error naming a header of headers
// (reclaim_headers) that is not a header name or is one the proxy sets
// on each DELETE itself; nil if there is none.
func checkReclaimHeaders(headers map[string]string) error {
	for name := range headers {
		if !validHeaderName(name) || reservedReclaimHeader(name) {
			return fmt.Errorf("reclaim_headers: %q is not a header name, or one the proxy sets on each DELETE itself (Mcp-Session-Id, MCP-Protocol-Version, Host, Content-Length)", name)
		}
	}
	return nil
}
