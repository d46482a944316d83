package caddymodule

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
)

// MCP request headers of protocol 2026-07-28, in Go's canonical spelling
// (MCP 2026-07-28 transports, §Request Metadata; SEP-2243).
const (
	// HeaderProtocolVersion carries the request's protocol version (MCP-Protocol-Version).
	HeaderProtocolVersion = "Mcp-Protocol-Version"
	// HeaderMethod mirrors the JSON-RPC method of the body.
	HeaderMethod = "Mcp-Method"
	// HeaderName mirrors params.name (tools/call, prompts/get) or params.uri
	// (resources/read), possibly Base64-encoded as `=?base64?...?=`.
	HeaderName = "Mcp-Name"
)

// varExchange is the request variable holding the request's *exchange.
const varExchange = "mcp_session.exchange"

// exchange is what the plugin knows about one request: what its headers
// (and, once an `mcp` matcher read it, its body) say it is, what the
// `mcp_session` handler decided, and the status of the answer. The first of
// them to look at the request creates it; a request variable shares it, so
// that the headers are parsed and the body is read once per request however
// many matchers run. While a handler serves the request, the exchange is
// also the ResponseWriter that records the status.
type exchange struct {
	caddyhttp.ResponseWriterWrapper // set while a handler serves the request

	era         session.Era
	sessionID   string // the single Mcp-Session-Id, "" if none or several
	version     string // the single MCP-Protocol-Version, "" if none or several
	hdrMethod   string // the single Mcp-Method
	hdrName     string // the single Mcp-Name, Base64 sentinel decoded
	nameSent    bool   // Mcp-Name was sent once
	trusted     bool   // version ≥ 2026-07-28: servers validate the mirrored headers
	headerFault *fault // an MCP header sent twice or malformed, if any
	fault       *fault // the fault a matcher found: the request must be rejected

	bodyRead  bool          // a matcher read the body
	body      *mcpwire.Head // what the body says, nil if it was unreadable
	bodyFault *fault        // why the body was unreadable
	raw       []byte        // the whole body, when it was read and parsed
	sent      []byte        // the whole body as the mcp transport sends it, once read
	mem       bodyHold      // the bytes of the body held in memory, charged to MaxBodyMemory

	repl     *caddy.Replacer // the request's replacer, once the placeholders are registered with it
	serving  bool            // an mcp_session handler is serving the request
	status   int             // the final status written through the handler, 0 before
	limits   writeLimits     // the server's write limits, lifted while the upstream answers (deadline.go)
	decision decision
	pinned   string // dial address of the session's upstream

	// owner is the upstream that owns the request's session, which the
	// selection policy must pick; nil for a request without a known session.
	owner *session.Upstream
	// selected is the upstream the selection policy picked last, nil before.
	selected *reverseproxy.Upstream
	// failedBy holds the dial addresses of the upstreams the policy picked
	// for the request before its last pick, each of which failed it (the
	// request was sent again), and, for a failover's replay, of the
	// upstream the session leaves.
	failedBy []string
	// replay is true for a failover's replayed initialize, and for a call
	// whose handle's upstream is gone: the policy sends it to none of
	// failedBy.
	replay bool
	// own is true for a request the proxy sends of its own (a failover's
	// replay, its notifications/initialized, a reclaim DELETE), which no
	// mcp_session handler serves by design.
	own bool

	// What the handler and the selection policy tell each other about the
	// request besides owner and selected. The request's attempts share
	// them: each attempt gets its own copy of Caddy's request variables
	// (withOwnVars), which nothing here is.

	// tried holds the dial addresses of the upstreams that let the request
	// wait past its bound, or refused its initialize: the policy picks them
	// last.
	tried []string
	// gone is true when the policy found the pinned upstream not in the
	// pool, or failing active health checks for longer than the grace.
	gone bool
	// unavailable is the Retry-After seconds (≥ 1) of a request whose
	// pinned upstream the policy found failing active health checks,
	// within the grace; 0 when it did not.
	unavailable int
	// init is the initialize request the table keeps for failover once its
	// session is learned; nil for other requests.
	init *session.Init
	// failedOver is true once the request's session failed over: the
	// request is sent again, to the new upstream, and may not fail over again.
	failedOver bool
	// legacyPost is true for a POST of a legacy HTTP+SSE session.
	legacyPost bool

	// sealed: the request's Mcp-Session-Id is a sealed ID that opened;
	// issued is its issue time in seconds since the Unix epoch, 0 for the
	// format versions without it (sealed.go).
	sealed bool
	issued int64
}

// noteFailed records that the upstream dialed at dial failed the request.
func (ex *exchange) noteFailed(dial string) {
	if !ex.failed(dial) {
		ex.failedBy = append(ex.failedBy, dial)
	}
}

// failed reports whether the upstream dialed at dial failed the request.
func (ex *exchange) failed(dial string) bool { return slices.Contains(ex.failedBy, dial) }

// exchangeOf returns the request's exchange, creating it on first use.
func exchangeOf(r *http.Request) *exchange {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	if ex, ok := vars[varExchange].(*exchange); ok {
		return ex
	}
	ex := newExchange(r)
	if vars != nil {
		vars[varExchange] = ex
	}
	ex.provide(r)
	return ex
}

// pin records that r's session is pinned to up: the selection policy
// picks it, and the {mcp.*} placeholders name it.
func pin(r *http.Request, up *session.Upstream) {
	ex := exchangeOf(r)
	ex.owner, ex.decision, ex.pinned = up, decisionPinned, up.Dial()
}

// withOwnVars returns r with a copy of its request variables, for another
// attempt at sending it. The attempt before may still be dialing: net/http
// goes on dialing in a goroutine of its own after the request that asked
// for the connection is done (it got another one, or was cancelled), and
// Caddy's dialer reads the request's variables there. The next attempt
// must not write the map that goroutine reads. The exchange is shared: it
// is the same request.
func withOwnVars(r *http.Request) *http.Request {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	return r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, maps.Clone(vars)))
}

// clearSelection forgets what the handler and the selection policy decided
// for r, so that it can be served again: the session's upstream, the one
// selected, and the policy's marks. The upstream selected, which failed
// the request, is remembered as such.
func clearSelection(r *http.Request) {
	ex := exchangeOf(r)
	if ex.selected != nil {
		ex.noteFailed(ex.selected.Dial)
	}
	ex.owner, ex.selected = nil, nil
	ex.gone, ex.unavailable = false, 0
}

// newExchange reads what the request's headers say about it.
func newExchange(r *http.Request) *exchange {
	h := r.Header
	ids := h[HeaderSessionID]
	ex := &exchange{era: eraOf(r, len(ids))}
	ex.mem.ctx = r.Context()
	if len(ids) == 1 {
		ex.sessionID = ids[0]
	}
	ex.version = ex.single(h, HeaderProtocolVersion)
	ex.hdrMethod = ex.single(h, HeaderMethod)
	name := ex.single(h, HeaderName)
	ex.nameSent = len(h[HeaderName]) == 1
	ex.trusted = mcpwire.AtLeast(ex.version, ModernProtocolVersion)
	var ok bool
	if ex.hdrName, ok = decodeSentinel(name); !ok && ex.headerFault == nil {
		ex.headerFault = mismatch("Mcp-Name %q is not valid Base64 inside =?base64?...?=", name)
	}
	return ex
}

// single returns the value of header field k if it was sent once, and ""
// otherwise; sending it more than once is a fault: a proxy and a server
// reading different copies would disagree about the request.
func (ex *exchange) single(h http.Header, k string) string {
	switch v := h[k]; len(v) {
	case 0:
		return ""
	case 1:
		return v[0]
	default:
		if ex.headerFault == nil {
			ex.headerFault = mismatch("%s was sent %d times; send it once", k, len(v))
		}
		return ""
	}
}

// decodeSentinel decodes a header value in the Base64 sentinel form
// `=?base64?<value>?=` (MCP 2026-07-28 transports, §Value Encoding); any
// other value is returned as it is. It reports false for a sentinel whose
// content is not Base64.
func decodeSentinel(v string) (string, bool) {
	inner, ok := strings.CutPrefix(v, "=?base64?")
	if !ok {
		return v, true
	}
	if inner, ok = strings.CutSuffix(inner, "?="); !ok {
		return v, true
	}
	b, err := base64.StdEncoding.DecodeString(inner)
	return string(b), err == nil
}

// fromHeaders reports whether the request's method and name come from its
// Mcp-Method and Mcp-Name headers: only for 2026-07-28 requests, whose
// servers must validate them against the body (MCP 2026-07-28 transports,
// §Server Validation). Older servers never look at them, so trusting them
// would let a client route one call as another.
func (ex *exchange) fromHeaders() bool { return ex.trusted && ex.hdrMethod != "" }

// method returns the request's JSON-RPC method as the plugin knows it: the
// Mcp-Method header of a 2026-07-28 request, otherwise the body's once a
// matcher read it, otherwise "".
func (ex *exchange) method() string {
	switch {
	case ex.fromHeaders():
		return ex.hdrMethod
	case ex.body != nil:
		return ex.body.Method
	}
	return ""
}

// name returns the tool or prompt name, or the resource URI, of a
// tools/call, prompts/get or resources/read request, from the same source
// as method; "" for other requests.
func (ex *exchange) name() string {
	switch {
	case !mcpwire.NamedMethod(ex.method()):
		return ""
	case ex.fromHeaders():
		return ex.hdrName
	case ex.body != nil:
		return ex.body.MirroredName()
	}
	return ""
}

// batch returns the members of the request's JSON-RPC batch once a matcher
// read the body, nil for one message or an unread body. A 2026-07-28
// request's headers name one method, so it is never judged as a batch.
func (ex *exchange) batch() []*mcpwire.Head {
	if ex.fromHeaders() || ex.body == nil {
		return nil
	}
	return ex.body.Batch
}

// batchesAllowed reports whether protocol version v has JSON-RPC batches:
// 2025-03-26 and older, and a request without MCP-Protocol-Version, which a
// server reads as 2025-03-26 (MCP 2025-06-18 transports, §Protocol Version
// Header).
func batchesAllowed(v string) bool {
	return v == "" || mcpwire.Before(v, "2025-06-18")
}

// provide registers the exchange's placeholders with the request's
// replacer, once. The replacer calls back only when a placeholder is used.
func (ex *exchange) provide(r *http.Request) {
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok || ex.repl != nil {
		return
	}
	ex.repl = repl
	repl.Map(ex.placeholder)
}

// WriteHeader records the final status, then writes it. Informational
// (1xx) responses pass unrecorded; reverse_proxy may send them from
// another goroutine.
func (ex *exchange) WriteHeader(status int) {
	if status >= 200 && ex.status == 0 {
		ex.status = status
		if ex.limits.on {
			ex.limits.atHeaders(ex.ResponseWriter, ex.Header())
		}
	}
	ex.ResponseWriter.WriteHeader(status)
}

// Write writes the header first if needed, so that its 200 is recorded.
func (ex *exchange) Write(b []byte) (int, error) {
	if ex.status == 0 {
		ex.WriteHeader(http.StatusOK)
	}
	return ex.ResponseWriter.Write(b)
}

// ReadFrom writes the header first if needed, so that its 200 is
// recorded, then copies from r as the wrapped writer does.
func (ex *exchange) ReadFrom(r io.Reader) (int64, error) {
	if ex.status == 0 {
		ex.WriteHeader(http.StatusOK)
	}
	return ex.ResponseWriterWrapper.ReadFrom(r)
}

// FlushError flushes the response; a flush before any header writes a 200.
func (ex *exchange) FlushError() error {
	if ex.status == 0 {
		ex.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(ex.ResponseWriter).Flush()
}

// Flush implements http.Flusher on top of FlushError.
func (ex *exchange) Flush() { _ = ex.FlushError() }

// fault is a request the proxy refuses after looking at its MCP headers or
// body: it answers status with a JSON-RPC error of code.
type fault struct {
	status  int
	code    int
	message string
	id      json.RawMessage // the JSON-RPC id of the request, nil if unknown

	retryAfter int // seconds, sent as Retry-After when above 0
}

// Error returns the fault's message.
func (f *fault) Error() string { return f.message }

// mismatch returns a HeaderMismatch fault: 400 with JSON-RPC error -32020.
func mismatch(format string, args ...any) *fault {
	return &fault{status: http.StatusBadRequest, code: CodeHeaderMismatch, message: "Header mismatch: " + fmt.Sprintf(format, args...)}
}

// write answers the fault on w, through the one error writer.
func (f *fault) write(w http.ResponseWriter) error {
	if f.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(f.retryAfter))
	}
	return mcpwire.WriteError(w, f.status, f.id, f.code, f.message)
}

// Interface guards
var (
	_ http.ResponseWriter = (*exchange)(nil)
	_ http.Flusher        = (*exchange)(nil)
	_ io.ReaderFrom       = (*exchange)(nil)
	_ error               = (*fault)(nil)
)

// eraOf returns the request's protocol era. A request naming a legacy
// HTTP+SSE session in one of the default query parameters (see
// readsQuerySession) is of a legacy session too.
func eraOf(r *http.Request, sessionFields int) session.Era {
	switch {
	case sessionFields > 0:
		return session.EraLegacySession
	case readsQuerySession(r) && hasLegacySession(r.URL.RawQuery):
		return session.EraLegacySession
	case len(r.Header["Mcp-Method"]) > 0:
		return session.EraModern
	}
	if v := r.Header["Mcp-Protocol-Version"]; len(v) > 0 && mcpwire.AtLeast(v[0], ModernProtocolVersion) {
		return session.EraModern
	}
	return session.EraOther
}

// ModernProtocolVersion is the first MCP protocol version without sessions.
// Versions are dates, so they compare as strings.
const ModernProtocolVersion = mcpwire.ModernVersion

// selectedUpstream returns the upstream the selection policy picked last
// for r, or nil.
func selectedUpstream(r *http.Request) *reverseproxy.Upstream {
	return exchangeOf(r).selected
}

// triedBy reports whether the request already waited past its bound for
// the upstream dialed at dial.
func triedBy(r *http.Request, dial string) bool {
	return slices.Contains(exchangeOf(r).tried, dial)
}

// noteTried records that the upstream dialed at dial let the request wait
// past its bound, or refused its initialize.
func noteTried(r *http.Request, dial string) {
	ex := exchangeOf(r)
	ex.tried = append(ex.tried, dial)
}

// HeaderSessionID is the MCP session header, in Go's canonical spelling.
// Header names are case-insensitive (RFC 9110 §5.1); `mcp-session-id` and
// `MCP-Session-Id` are the same field. Source: MCP 2025-03-26 transports,
// §Session Management.
const HeaderSessionID = mcpwire.HeaderSessionID
