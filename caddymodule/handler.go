package caddymodule

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// DefaultMaxSessionIDLength is the default limit of an Mcp-Session-Id value, in bytes.
const DefaultMaxSessionIDLength = 2048

// Values of [Handler.UnknownSession].
const (
	// UnknownSessionReject answers a request with an unknown session with 404.
	UnknownSessionReject = "reject"
	// UnknownSessionForward sends a request with an unknown session to the fallback policy.
	UnknownSessionForward = "forward"
)

// Handler gives MCP Streamable HTTP sessions affinity to the upstream that
// created them. Order it before `reverse_proxy` and use the `mcp_session`
// selection policy in that `reverse_proxy` (the `mcp_proxy` directive sets
// up both).
//
// It learns a session from the response to a request that carried no
// `Mcp-Session-Id`: a 2xx response carrying the header records session ->
// the upstream that served it, as soon as the response headers pass, before
// any SSE body streams. Every later request carrying the session is then
// pinned to that upstream by the `mcp_session` selection policy.
//
// It pins the legacy HTTP+SSE transport (MCP 2024-11-05) too, unless
// `disable_legacy_sse` is set: the first event of a GET's SSE stream,
// `endpoint`, names the session in its URL's query (`legacy_sse_params`);
// the session is pinned to the stream's upstream, requests carrying it in
// their query (POSTs, and any other method but a CORS preflight) go there,
// and it ends when the stream closes (legacysse.go).
//
// It answers these itself, with a JSON-RPC error body, without contacting an upstream:
//
// | Request | Response |
// |---|---|
// | `Mcp-Session-Id` sent more than once, empty, longer than `max_session_id_length`, or with bytes outside 0x21-0x7E | 400 |
// | a request whose query names a legacy HTTP+SSE session twice, in a way servers read differently (`;`, brackets, bad escapes), or an empty or malformed one | 400 |
// | a request naming one session in `Mcp-Session-Id` and another in its query | 400 |
// | a session the table does not hold (unless `unknown_session` is `forward`) | 404 |
// | a session whose upstream fails active health checks, within the policy's `unhealthy_grace` | 503 with Retry-After; the session is kept |
// | an `initialize` or `server/discover` that no upstream (of at most three tried) sends response headers for within `initialize_timeout`, nor answers a probe for | 504 |
// | a session whose upstream sends no response headers within `pinned_timeout` (off by default) | 504; the session is kept |
// | a session whose upstream was removed, refused the connection, or failed active health checks for `unhealthy_grace` | 404, and the session is dropped (with `failover reinitialize`: see below) |
// | a rule's `Mcp-Param-` header (`handles`) sent twice, empty, or as a Base64 sentinel that does not decode | 400 |
// | a handle the handle table does not hold, with `unknown_handle reject`, or one bound to another principal | `unknown_handle_status` (404) |
// | a handle whose upstream fails active health checks, within the grace | 503 with Retry-After; the handle is kept |
// | a handle whose upstream is gone, with `unknown_handle reject` | 404, and the handle is dropped (with `forward`: dropped, and the request balanced) |
//
// When reverse_proxy ends a request with 502, 503 or 504 before any
// response (no upstream answered, none available, a timeout), and when the
// mcp_sessions app did not start (503), it answers with the same status
// and a JSON-RPC error body instead of Caddy's empty one, and logs the
// cause; handle_errors routes do not see these errors (gateway.go).
//
// An initialize request carrying a session the table does not hold, or
// whose upstream is gone, starts a new session: the stale Mcp-Session-Id
// is dropped and the request balanced (reinit.go).
//
// With `failover reinitialize`, a session whose upstream is gone, or
// answers its POST with 404, or is draining past its deadline, moves to
// another upstream instead of ending (failover.go).
//
// Caddy's server `write` timeout does not cut its streams (SSE responses)
// or the answers of calls in progress: it is lifted while the upstream
// answers a GET or POST, and put back from the response's headers for any
// response but a stream (deadline.go).
//
// It drops a session when the upstream answers its POST or DELETE with 404,
// or its DELETE with 2xx; the upstream's response passes unchanged. A 404
// to a GET keeps the session (see evictAfter).
//
// It sets these placeholders for every request it serves, for access logs
// (`log_append`), `header_up`, `respond`, and the matchers of later routes.
// Each value is computed when it is used:
//
// Placeholder | Description
// ------------|-------------
// `{mcp.method}` | The JSON-RPC method: the `Mcp-Method` header of a request of protocol 2026-07-28 or later, else the body's if an `mcp` matcher with `body` read it or the request is a POST without a session (read for `initialize_timeout`), else empty
// `{mcp.name}` | The tool or prompt name, or resource URI, of `tools/call`, `prompts/get` and `resources/read`, from the same source; empty otherwise
// `{mcp.era}` | `legacy_session`, `modern_sessionless` or `other_sessionless`, as the `era` label of the requests metric
// `{mcp.protocol_version}` | The `MCP-Protocol-Version` header, if sent once
// `{mcp.session_fingerprint}` | The first 12 hex digits of the SHA-256 of `Mcp-Session-Id`, never the ID itself; empty without a session
// `{mcp.pinned_upstream}` | The dial address of the upstream the session (or the handle, see `handles`) is pinned to: for `pinned` and `gone` the session's, for `learned` the one that created it; empty otherwise
// `{mcp.decision}` | `balanced` (no session), `learned`, `pinned`, `unknown` (session not in the table, or bound to another principal), `gone` (its upstream is gone), `rejected` (answered 4xx by the proxy); for a request carrying a handle, the same of the handle, and `learned` for a call whose result minted one
// `{mcp.host_for_upstream}` | In `reverse_proxy`, once it has selected an upstream: the upstream's own host:port if it is on this machine (a loopback or unspecified address, `localhost`), `localhost:80` for a unix socket, and otherwise the client's Host unchanged; `mcp_proxy` sends it as `Host`
//
// An `mcp` matcher that ran before the handler sets the same placeholders;
// `decision` and `pinned_upstream` are then empty until the handler runs.
type Handler struct {
	// The name of the session table, held by the `mcp_sessions` app.
	// Handlers and selection policies with the same table name share
	// sessions; the table survives config reloads while any config uses it.
	// Default: `default`.
	Table string `json:"table,omitempty"`

	// The table's settings: set here, in the `mcp_sessions` app's table of
	// the same name, or in several places that agree.
	TableSettings

	// The longest `Mcp-Session-Id` value accepted, in bytes. The MCP spec sets
	// no limit; SDKs mint 26 to 48 bytes, JWT-shaped IDs are longer. Longer
	// values get 400. Default: 2048.
	MaxSessionIDLength int `json:"max_session_id_length,omitempty"`

	// What to do with a request whose session the table does not hold:
	// `reject` answers 404 with a JSON-RPC error, so spec-compliant clients
	// start a new session (MCP 2025-03-26 transports, §Session Management);
	// `forward` sends it to the fallback selection policy, for upstreams that
	// share session state. Default: `reject`.
	UnknownSession string `json:"unknown_session,omitempty"`

	// Turns off the DNS rebinding protection. By default, a request that
	// arrived on a loopback address but names a host that is not loopback
	// (`localhost`, `127.0.0.0/8`, `::1`) gets 403, as MCP SDK servers bound
	// to loopback answer it (MCP 2025-11-25, Security Best Practices, "Local
	// MCP Server Compromise"). The proxy must check this itself because it
	// sends upstreams their own host:port as Host. Turn it off when a trusted
	// proxy or tunnel on the same machine forwards public hostnames to Caddy
	// on loopback. Default: false.
	DisableLocalhostProtection bool `json:"disable_localhost_protection,omitempty"`

	// Seals session IDs: the client gets a value carrying the upstream and
	// its session ID, encrypted and authenticated under a key the Caddy
	// replicas share, so that any replica routes the session and a restart
	// loses none. See [SealedSessionIDs]. Default: off, the client gets the
	// upstream's own session ID.
	SealSessionIDs *SealedSessionIDs `json:"seal_session_ids,omitempty"`

	// How long a request that opens a session waits for its upstream's
	// response headers: an `initialize` (recognised by the JSON-RPC method
	// of its body, which the proxy reads before forwarding it when it is at
	// most 4 KiB, or max_initialize_size if larger; a longer body streams
	// and is not bounded) or a 2026-07-28 `server/discover` (by its
	// `Mcp-Method` header).
	// When the headers do not come in time, the proxy probes the upstream
	// (`OPTIONS *` on a connection of its own, 1 s): one that answers is
	// slow, not frozen, and the request goes on waiting for it, probed again
	// every initialize_timeout, for at most a minute (or initialize_timeout,
	// if longer). One that does not answer is stuck: it gets no new sessions
	// for 30 s unless it answers a request meanwhile, and the request is
	// sent to another upstream (three upstreams at most), or answered 504
	// with a JSON-RPC error when none is left. Sending it again
	// is safe: an upstream that sent no headers gave the client no session
	// ID, so a session it may have created can never be used, and
	// `initialize` and `server/discover` change nothing else. Other
	// requests without a session (2026-07-28 tool calls, which may be slow)
	// are not bounded. A negative value (`off` in the Caddyfile) waits as
	// long as the upstream takes. Default: `5s`.
	InitializeTimeout caddy.Duration `json:"initialize_timeout,omitempty"`

	// How long a request of a session waits for its upstream's response
	// headers before the proxy answers 504 with a JSON-RPC error, counted
	// from when the proxy has the request's body (one of known length up to
	// MaxInMemoryBody; a longer or chunked body's upload counts). The
	// session is kept, and the upstream gets no new sessions for 30 s
	// unless it answers a request meanwhile. A server answering in JSON
	// mode sends no headers until a tool call finishes, so set it above the
	// longest call. Default: 0, no bound; active health checks then find a
	// frozen upstream (docs/operating.md, "Frozen upstreams").
	PinnedTimeout caddy.Duration `json:"pinned_timeout,omitempty"`

	// Turns off pinning of the legacy HTTP+SSE transport (MCP 2024-11-05).
	// By default, a GET whose response is an SSE stream with an `endpoint`
	// first event teaches the session named in that event's URL (one of
	// `legacy_sse_params`), pinned to the stream's upstream until the stream
	// closes; requests carrying the session in their query go to that
	// upstream, and those of a session the table does not hold get 404 like
	// any unknown session. The endpoint URL is rewritten where the client could
	// not use it (see docs/behaviour.md, "Legacy HTTP+SSE"). Default: false.
	DisableLegacySSE bool `json:"disable_legacy_sse,omitempty"`

	// The query parameters that carry a legacy HTTP+SSE session, in the
	// endpoint event's URL and in the POSTs to it. Names are
	// case-sensitive, as in URLs. A request naming the session more than
	// once, or one session here and another in Mcp-Session-Id, gets 400. Default: `sessionId`, `session_id`, `sessionid` (the
	// TypeScript SDK and mcp-go, the Python SDK, the Go SDK).
	LegacySSEParams []string `json:"legacy_sse_params,omitempty"`

	// Whether the proxy ends upstream the sessions its table forgets while
	// the upstream may still hold them: `on` or `off`. A session forgotten
	// for `session_ttl`, pushed out by `max_sessions`, evicted through the
	// admin API, or whose upstream was gone or answered an initialize with
	// its ID again, gets `DELETE <path>` with its `Mcp-Session-Id` (the
	// upstream's own ID: the inner ID of a sealed one, the new upstream's
	// after a failover) and the `MCP-Protocol-Version` its upstream last
	// saw, sent to its upstream through this handler's reverse_proxy. The
	// path is that of the last initialize the upstream answered. Sessions
	// ended by the upstream's own answer (a DELETE passed through, a 404)
	// are not sent again. MCP servers keep a session until its DELETE, and
	// most clients never send one: a server with a session cap (the Python
	// SDK 2.2 answers initialize 503 past 10,000) fills up, so it is on by
	// default. Best effort: at most 4 in flight and 100 a second per
	// handler, 3 s each, one try, a queue of 4096 that drops (counted) when
	// full; never on a client's request path. With the redis store, only
	// the instance whose write ends the session in Redis sends it.
	// Handlers sharing a table should agree: the one provisioned last
	// decides. Default: `on`.
	Reclaim string `json:"reclaim,omitempty"`

	// Headers the reclaim DELETEs carry, such as a static token the
	// upstream's authentication accepts: name to value, each value a
	// placeholder template evaluated for each DELETE (`{env.MCP_TOKEN}`).
	// The proxy never keeps a client's credentials for them. Default: none.
	ReclaimHeaders map[string]string `json:"reclaim_headers,omitempty"`

	// The handles of MCP 2026-07-28 tools: see [HandleSettings].
	HandleSettings

	handles        *handleRules // nil without Handles
	table          *session.Table
	app            *App         // the config's mcp_sessions app, which configures table
	warnedNoPolicy *atomic.Bool // the missing-policy warning was logged
	warnedDeadline *atomic.Bool // the warning of a write timeout that cannot be lifted was logged
	warnedSlowInit *atomic.Bool // the warning of an initialize slower than initialize_timeout was logged
	logger         *zap.Logger

	sealer   *sealing    // nil unless SealSessionIDs is set
	failover *failover   // moves the table's sessions when failover is on
	journal  *journaling // the table's journal (journal.go)

	reclaim *reclaimer // sends the DELETEs of forgotten sessions (reclaim.go)
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.mcp_session",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision fills in defaults and fetches the session table from the
// mcp_sessions app, giving it this handler's max_sessions and session_ttl.
// It returns Validate's error, the error of loading the mcp_sessions app,
// or the app's error when this handler's settings contradict a setting made
// elsewhere for the same table.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if h.Table == "" {
		h.Table = session.DefaultTableName
	}
	if h.MaxSessionIDLength == 0 {
		h.MaxSessionIDLength = DefaultMaxSessionIDLength
	}
	if h.UnknownSession == "" {
		h.UnknownSession = UnknownSessionReject
	}
	if h.InitializeTimeout == 0 {
		h.InitializeTimeout = caddy.Duration(DefaultInitializeTimeout)
	}
	if h.Reclaim == "" {
		h.Reclaim = ReclaimOn
	}
	if err := h.Validate(); err != nil {
		return err
	}
	var sealer *SessionSealer
	if h.SealSessionIDs != nil {
		var err error
		if sealer, err = h.SealSessionIDs.provision(); err != nil {
			return err
		}
	}
	app, err := sessionsApp(ctx)
	if err != nil {
		return err
	}
	t, err := app.Table(h.Table, TableConfig{TableSettings: h.TableSettings}, "an mcp_session handler")
	if err != nil {
		return err
	}
	h.table, h.app = t, app
	if h.handles, err = h.HandleSettings.provision(app, h.Table, h.BindPrincipal); err != nil {
		return err
	}
	h.warnedNoPolicy, h.warnedDeadline, h.warnedSlowInit = new(atomic.Bool), new(atomic.Bool), new(atomic.Bool)
	h.failover = &failover{table: t, maxIDLen: h.MaxSessionIDLength}
	h.journal = &journaling{table: t}
	if sealer != nil {
		h.sealer = &sealing{SessionSealer: sealer, table: t, maxIDLen: h.MaxSessionIDLength}
	}
	h.setLogger(h.logger)
	h.reclaim = newReclaimer(t, sealer, h.logger, h.Reclaim, h.ReclaimHeaders)
	return nil
}

// Cleanup stops the handler's reclaim DELETEs and removes its hook from
// the table, if the table still has it. It never returns an error.
func (h *Handler) Cleanup() error {
	if h.reclaim != nil {
		h.reclaim.close()
	}
	return nil
}

// setLogger makes l the logger of the handler, its table and its parts.
func (h *Handler) setLogger(l *zap.Logger) {
	h.logger, h.failover.logger, h.journal.logger = l, l, l
	if h.sealer != nil {
		h.sealer.logger = l
	}
	h.table.SetLogger(l)
	if h.handles != nil {
		h.handles.table.SetLogger(l)
	}
	if h.reclaim != nil {
		h.reclaim.logger = l
	}
}

// Validate checks the handler's settings. Its error names the first
// setting that is negative or below its minimum, or an unknown_session
// that is neither reject nor forward.
func (h *Handler) Validate() error {
	if err := checkReclaimHeaders(h.ReclaimHeaders); err != nil {
		return err
	}
	switch {
	case h.MaxSessions < 0:
		return fmt.Errorf("max_sessions must be positive, got %d", h.MaxSessions)
	case h.SessionTTL != 0 && time.Duration(h.SessionTTL) < session.MinSessionTTL:
		return fmt.Errorf("session_ttl %s is below the minimum of %s; sessions would be forgotten between a client's requests",
			time.Duration(h.SessionTTL), session.MinSessionTTL)
	case h.PinnedTimeout < 0:
		return fmt.Errorf("pinned_timeout must be positive, got %s", time.Duration(h.PinnedTimeout))
	case h.MaxSessionIDLength < 0:
		return fmt.Errorf("max_session_id_length must be positive, got %d", h.MaxSessionIDLength)
	case h.UnknownSession != "" && h.UnknownSession != UnknownSessionReject && h.UnknownSession != UnknownSessionForward:
		return fmt.Errorf("unknown_session must be %q or %q, got %q", UnknownSessionReject, UnknownSessionForward, h.UnknownSession)
	case h.Failover != "" && h.Failover != session.FailoverOff && h.Failover != session.FailoverReinitialize:
		return fmt.Errorf("failover must be %q or %q, got %q", session.FailoverOff, session.FailoverReinitialize, h.Failover)
	case h.MaxInitializeSize < 0:
		return fmt.Errorf("max_initialize_size must be positive, got %d", h.MaxInitializeSize)
	case h.Reclaim != "" && h.Reclaim != ReclaimOn && h.Reclaim != ReclaimOff:
		return fmt.Errorf("reclaim must be %q or %q, got %q", ReclaimOn, ReclaimOff, h.Reclaim)
	case h.FailoverMaxAge != 0 && time.Duration(h.FailoverMaxAge) < session.MinSessionTTL:
		return fmt.Errorf("failover_max_age %s is below the minimum of %s; give a duration such as 1h, or leave it out for session_ttl",
			time.Duration(h.FailoverMaxAge), session.MinSessionTTL)
	case slices.ContainsFunc(h.LegacySSEParams, badQueryName):
		return fmt.Errorf("legacy_sse_params %q has an empty name or one with '?', '&', '=', '#' or a space; list query parameter names such as %q", h.LegacySSEParams, DefaultLegacySSEParams)
	}
	if err := h.HandleSettings.validate(h.Table); err != nil {
		return err
	}
	return h.validateJournal()
}

// badQueryName reports whether name cannot be a URL query parameter's name
// as a legacy SSE endpoint writes it (`?<name>=<session>`).
func badQueryName(name string) bool {
	return name == "" || strings.ContainsAny(name, "?&=# ")
}

// ServeHTTP pins the request to its session's upstream, or lets it be
// balanced and learns the session its response creates. The proxy's own
// answers (403, 400, 404 with a JSON-RPC error, see docs/behaviour.md "What happens
// when") are written, not returned, and so are the 502, 503 and 504 the
// next handler (reverse_proxy) returns before any response, and the 503
// of an mcp_sessions app that did not start: Caddy's handle_errors routes
// do not see them (gateway.go). It returns the other errors of the next
// handler, and those of writing the proxy's own answer.
// It sets the {mcp.*} placeholders and counts the request by method
// (placeholders.go).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if h.app != nil {
		// The http app can serve before Caddy starts the mcp_sessions
		// app (see App.Start): the table gets its settings and store first.
		if err := h.app.Start(); err != nil {
			return answerStartFailure(h.logger, w, r, err) // gateway.go
		}
	}
	if h.reclaim != nil {
		h.reclaim.attachTo(r, next)
	}
	return h.observe(w, r, next)
}

// serve is ServeHTTP's work.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !h.DisableLocalhostProtection && rebinding(r) {
		decide(r, decisionRejected, "")
		return mcpwire.WriteError(w, http.StatusForbidden, nil, CodeInvalidRequest, fmt.Sprintf("Forbidden: invalid Host header %q: "+
			"this proxy listens on loopback and serves only localhost names (DNS rebinding protection); "+
			"behind a trusted proxy on this machine, set localhost_protection off", r.Host))
	}
	if err := exchangeOf(r).readWhole(r); err != nil {
		decide(r, decisionRejected, "")
		if errors.Is(err, errBodyMemory) {
			return refuseBodyMemory(r).write(w)
		}
		if r.Context().Err() != nil { // the client went away
			return caddyhttp.Error(499, err)
		}
		return mcpwire.WriteError(w, http.StatusBadRequest, nil, CodeInvalidRequest, fmt.Sprintf(
			"Bad Request: the request body ended after fewer than its Content-Length of %d bytes, or broke: %v", r.ContentLength, err))
	}
	rt := h.route(r) // route.go
	h.table.Stats.CountRequest(rt.era)
	switch rt.kind {
	case routeBadSession:
		decide(r, decisionRejected, "")
		return writeBadSession(w, rt.problem)
	case routeFault:
		return rt.fault.write(w)
	case routeNew:
		return h.serveNew(w, r, next)
	case routeMismatch:
		return h.serveMismatch(w, r, rt.key)
	case routeUnknown:
		return h.serveUnknown(w, r, next, rt.key)
	case routeStaleInitialize:
		return h.serveAsNew(w, r, next, rt.key, nil)
	}
	return h.servePinned(w, r, next, rt.key, rt.up)
}

// headerSession returns the session that r's Mcp-Session-Id names, or why
// r is refused: the header cannot be used (see sessionOf), or the query
// names a legacy HTTP+SSE session that cannot be used (queryProblem), or
// another session than the header (legacy). A request names at most one
// session: the proxy checks the session it routes by against its
// principal, and a server that reads the other name (a legacy server reads
// the query) would act in a session nobody checked. The check compares
// what the request says, before any lookup, so its answer tells nothing of
// either session. The same session in both is served: whichever the
// server reads, it is the session checked.
func (h *Handler) headerSession(r *http.Request, legacy, queryProblem string) (id, problem string) {
	id, problem = mcpwire.SessionOf(r.Header, h.MaxSessionIDLength)
	switch {
	case problem != "":
		return "", problem
	case queryProblem != "":
		return "", queryProblem
	case legacy != "" && id != legacy:
		// Legacy sessions are never sealed: a header naming the same one is
		// that ID itself (a plain ID may look like a sealed value's
		// encoding, so it is not decoded here).
		return "", "the request names two sessions, one in Mcp-Session-Id and another in the query (" +
			strings.Join(h.legacyParams(), ", ") + "); send one: a legacy HTTP+SSE message carries its session " +
			"in the query only, a Streamable HTTP request in Mcp-Session-Id only"
	}
	return id, ""
}

// serveNew serves a request without a session: it is balanced, and its
// response may create a session, which the table learns.
func (h *Handler) serveNew(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	exchangeOf(r).init = h.failover.captureInit(r)
	if h.handles != nil {
		return h.serveHandles(w, r, next)
	}
	return h.forwardNew(w, r, next)
}

// serveUnknown answers a request whose session the table does not hold.
func (h *Handler) serveUnknown(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, id string) error {
	h.table.Stats.CountUnknown()
	decide(r, decisionUnknown, "")
	h.debug("unknown", id, "")
	if h.UnknownSession == UnknownSessionForward {
		return next.ServeHTTP(w, r)
	}
	return writeSessionNotFound(w, "Session not found")
}

// serveMismatch answers a request whose session is bound to another
// principal exactly as an unknown session is answered with `unknown_session
// reject`, so that a client cannot tell the two apart. It is never
// forwarded, even with `unknown_session forward`: the session's upstream
// would serve it. Its decision is `unknown` too; the principal mismatch
// metric and the debug log tell the two apart.
func (h *Handler) serveMismatch(w http.ResponseWriter, r *http.Request, id string) error {
	h.table.Stats.CountMismatch()
	decide(r, decisionUnknown, "")
	h.debug("principal_mismatch", id, "")
	return writeSessionNotFound(w, "Session not found")
}

// servePinned proxies a request of a known session to its upstream and
// applies the upstream's answer to the table.
func (h *Handler) servePinned(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, id string, up *session.Upstream) error {
	pin(r, up)
	h.table.Stats.CountPinned()
	h.debug("pinned", id, up.Dial())
	up.SetProtocolVersion(exchangeOf(r).version)
	if r.Method == http.MethodGet {
		h.table.StreamOpened(id)
		up.AddStreams(1)
		defer func() {
			up.AddStreams(-1)
			h.table.StreamClosed(id)
		}()
	}
	w, r, endJournal, done, err := h.journal.journalHooks(w, r, id) // journal.go
	if done {
		return err
	}
	defer endJournal()
	pw := newSessionWriter(w, h, r, id, up)
	if pw.fo = h.failover.failoverFor(w, r, id); pw.fo != nil && pw.fo.again && h.table.PastDrainDeadline(up) && h.failover.failoverRefused(r, id) == "" {
		return h.serveFailover(w, r, next, id, up, pw.fo, session.FailoverDrainDeadline)
	}
	expired, _, err := h.forward(pw, next, time.Duration(h.PinnedTimeout), false)
	if expired {
		return h.writePinnedTimeout(w, r, id, up)
	}
	if cause := pw.fo.cause(r, err, pw.wroteHeader, up.Dial()); cause != 0 {
		if stale, f := staleInitialize(r, pw.fo); f != nil {
			return f.write(w)
		} else if stale {
			return h.serveAsNew(w, r, next, id, pw.fo)
		}
		return h.serveFailover(w, r, next, id, up, pw.fo, cause)
	}
	if err == nil || pw.wroteHeader {
		return err
	}
	return h.serveFailed(w, r, next, err, id, up)
}

// serveFailed answers a pinned request that reverse_proxy returned err for
// before any response: 503 while its upstream is unavailable (failing
// active health checks within the grace, but not refusing connections),
// 404 once it is gone, which ends the session; any other error as it is.
func (h *Handler) serveFailed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, err error, id string, up *session.Upstream) error {
	if retryAfter := exchangeOf(r).unavailable; retryAfter > 0 && !refused(r, up.Dial()) {
		return h.writeUnavailable(w, id, up, retryAfter)
	}
	if !upstreamGone(r, err, up.Dial()) {
		return err
	}
	if stale, f := staleInitialize(r, nil); f != nil {
		return f.write(w)
	} else if stale {
		return h.serveAsNew(w, r, next, id, nil)
	}
	h.table.Stats.CountGone()
	decide(r, decisionGone, "")
	if r.Method == http.MethodDelete { // the client ended it: failover must not bring it back
		h.table.EndByClient(id, session.EvictUpstreamGone)
	} else {
		h.table.Evict(id, session.EvictUpstreamGone)
	}
	h.debug("upstream_gone", id, up.Dial())
	return writeSessionNotFound(w, "Session not found: its upstream is gone")
}

// writeUnavailable answers a request whose session's upstream fails active
// health checks, within the grace: 503 with Retry-After, the session kept.
func (h *Handler) writeUnavailable(w http.ResponseWriter, id string, up *session.Upstream, retryAfter int) error {
	h.table.Stats.CountUnavailable()
	h.debug("upstream_unavailable", id, up.Dial())
	w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	return mcpwire.WriteError(w, http.StatusServiceUnavailable, nil, CodeUpstreamUnavailable,
		"Service Unavailable: the session's upstream is failing health checks; retry later")
}

// upstreamGone reports whether err, returned by reverse_proxy for a pinned
// request to the upstream dialed at dial, means the session's upstream is
// gone: the policy found it removed, or unhealthy for longer than the
// grace, or unhealthy and refusing connections; or dialing it failed; or
// it closed the kept-alive connection before reading the request and
// nothing listens at its address any more: it died between two requests.
func upstreamGone(r *http.Request, err error, dial string) bool {
	ex := exchangeOf(r)
	if ex.gone {
		return true
	}
	if ex.unavailable > 0 {
		return true // and refusing connections, or serveFailed would have answered 503
	}
	var dialErr reverseproxy.DialError
	return errors.As(err, &dialErr) || closedUnread(err) && refused(r, dial)
}

// closedUnread reports whether err says the upstream closed a kept-alive
// connection before it read the request sent on it: Go's transport returns
// "http: server closed idle connection" when the connection's end was read
// before any byte of a response (net/http errServerClosedIdle, golang/go#19943),
// and retries it itself only for idempotent requests. The request never
// reached the upstream.
func closedUnread(err error) bool {
	return err != nil && strings.Contains(err.Error(), "server closed idle connection")
}

// refused reports whether nothing listens at the upstream dialed at dial: a
// connection to it is refused, or its unix socket does not exist. It is
// asked only of an upstream that fails active health checks, where it
// tells a process that is gone from one that is only unhealthy.
func refused(r *http.Request, dial string) bool {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl != nil {
		dial = repl.ReplaceAll(dial, "")
	}
	addr, err := caddy.ParseNetworkAddress(dial)
	if err != nil {
		return false
	}
	conn, err := net.DialTimeout(addr.Network, addr.JoinHostPort(0), refusedProbeTimeout)
	if err == nil {
		conn.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// refusedProbeTimeout bounds the connection attempt of [refused]. A refusal
// is immediate; a host that does not answer within it counts as unhealthy,
// not gone.
const refusedProbeTimeout = time.Second

// learn records the session a response created, if it carries exactly one
// valid Mcp-Session-Id and the policy recorded which upstream served it.
func (h *Handler) learn(r *http.Request, header http.Header) {
	ids := header[HeaderSessionID]
	if len(ids) == 0 {
		return
	}
	if len(ids) > 1 || mcpwire.CheckSessionID(ids[0], h.MaxSessionIDLength) != "" {
		h.logger.Warn("upstream sent an unusable Mcp-Session-Id; session not pinned",
			zap.Int("fields", len(ids)), zap.Int("length", len(ids[0])), zap.Bool("sealed", h.sealer != nil),
			zap.Int("max_session_id_length", h.MaxSessionIDLength))
		return
	}
	sel := selectedUpstream(r)
	if sel == nil {
		if h.warnedNoPolicy.CompareAndSwap(false, true) { // once per handler: it is a config mistake
			h.logger.Warn("cannot learn sessions: the reverse_proxy after mcp_session must use lb_policy mcp_session")
		}
		return
	}
	origin := session.Origin{Principal: principalOf(r, h.table.BindPrincipal()), Client: placeholderValue(r, h.table.ClientKey())}
	init := exchangeOf(r).init
	if key := h.sealer.tableKey(ids[0]); h.table.LearnInit(key, sel.Dial, origin, init) {
		if h.reclaim != nil {
			h.reclaim.learnedPath(r, h.table.UseUpstream(sel.Dial))
		}
		decide(r, decisionLearned, sel.Dial)
		h.debug("learned", key, sel.Dial)
	}
}

// evictAfter applies the status of the upstream's answer to a pinned
// request to the table: a 404 to a POST or a DELETE, or a 2xx to a DELETE,
// ends the session.
//
// A 404 ends a session only where it can mean nothing but "session
// unknown": POST and DELETE are the requests every Streamable HTTP server
// routes (MCP 2025-03-26 transports, §Session Management). A 404 to a GET
// passes through and keeps the session: the standalone GET stream is
// optional, and many servers without one have no GET route, so their router
// answers 404 (Express: "Cannot GET /mcp") where the spec asks for 405.
// Clients carry on with POSTs, which must keep working. A session that is
// really gone loses nothing by this: its next POST or DELETE gets the
// upstream's 404 and ends it there. With failover reinitialize, a 404 to a
// GET from an upstream that has served GET streams before fails the
// session over instead (pinnedFailover.holds404).
//
// A DELETE answered 2xx or 404 ends the session for good: it leaves a
// tombstone, so that neither failover nor its sealed ID brings it back
// (tombstone.go).
func (h *Handler) evictAfter(r *http.Request, id string, status int) {
	switch { // the table logs the eviction
	case status == http.StatusNotFound && r.Method == http.MethodDelete:
		h.table.EndByClient(id, session.EvictUpstream404)
	case status == http.StatusNotFound && r.Method == http.MethodPost:
		h.table.Evict(id, session.EvictUpstream404)
	case r.Method == http.MethodDelete && status >= 200 && status < 300:
		h.table.EndByClient(id, session.EvictDelete)
	}
}

// debug logs one decision at debug level, with a fingerprint of the session
// instead of the session ID itself.
//
// Caddy's own logs print the ID, and the plugin cannot stop them: the
// server copies each request for its error and access logs before any
// handler runs (caddyhttp.Server.ServeHTTP clones it into a
// LoggableHTTPRequest), reverse_proxy logs the request it sends, which must
// carry the ID, and log encoders come only from the config's logging
// section, which no directive or app can extend. docs/operating.md, "Logs", gives the
// filter that removes the ID, and TestLogRecipeRemovesSessionIDs checks it.
func (h *Handler) debug(msg, id, upstream string, fields ...zap.Field) {
	logDebug(h.logger, msg, id, upstream, fields...)
}

// logDebug logs msg to logger at debug level, naming session id by its
// fingerprint and the upstream by its dial address (see [Handler.debug]).
func logDebug(logger *zap.Logger, msg, id, upstream string, fields ...zap.Field) {
	if c := logger.Check(zapcore.DebugLevel, msg); c != nil {
		c.Write(append(fields, zap.String("session", fingerprint(id)), zap.String("upstream", upstream))...)
	}
}

// sessionTable returns the name of the session table h writes.
func (h *Handler) sessionTable() string { return h.Table }

// Interface guards
var (
	_ tableWriter                 = (*Handler)(nil)
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
