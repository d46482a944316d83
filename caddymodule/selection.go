package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(SessionSelection{})
}

// DefaultFallbackPolicy is the selection policy for requests without a
// session when none is configured. least_sessions spread 300 sessions of
// uneven length over 3 upstreams with a mean gap of 0.8 live sessions
// between the busiest and the idlest upstream, round_robin with 3.3
// (tests/operate_test.go, TestLeastSessionsSpreadsBetter).
const DefaultFallbackPolicy = LeastSessionsPolicy

// SessionSelection is a selection policy that sends every request of an MCP
// session to the upstream that created the session, as recorded by the
// `mcp_session` handler ordered before this `reverse_proxy`. Requests without
// a session (`initialize`, 2026-07-28 sessionless traffic, CORS preflights)
// are balanced by the fallback policy.
//
// A pinned request is never sent to another upstream. When its upstream is
// not in the pool, the policy selects nothing and the `mcp_session` handler
// answers 404: the session is gone. When its upstream fails active health
// checks, the upstream is unavailable, not gone: the policy selects nothing,
// the handler answers 503 with Retry-After and keeps the session, until the
// upstream has been unhealthy for `unhealthy_grace`; then the session is
// gone. Passive health checks never stop a pinned request: its upstream is
// the only one that knows the session. An upstream at its `max_requests`
// selects nothing too (503, or a wait with `lb_try_duration`), but keeps
// its sessions.
//
// Passive health checks never leave new sessions without an upstream: when
// the fallback policy finds no upstream available and some are out of
// service for failed requests alone, they get the request in turn, the one
// with the fewest failures first, each at most once per request (a lone
// upstream is never taken out of service by one failed request, as in
// nginx, and one that is really down costs one attempt).
//
// A failover's replayed initialize never goes to the upstream the session
// leaves (unless that upstream answered, 404: it restarted), nor to one
// that already failed the replay; with every other upstream out of service
// for failed requests, it tries them in the same order before the
// failover gives up.
type SessionSelection struct {
	// The name of the session table, the same as the `mcp_session` handler's.
	// The policy reads which upstreams are draining from it. Default: `default`.
	Table string `json:"table,omitempty"`

	// The selection policy for requests that carry no session, or an unknown
	// one with `unknown_session forward`: where new sessions go. Any
	// `lb_policy` module. Default: `least_sessions`, the upstream with the
	// fewest live sessions.
	FallbackRaw json.RawMessage `json:"fallback,omitempty" caddy:"namespace=http.reverse_proxy.selection_policies inline_key=policy"`

	// How long the upstream of a session may fail active health checks
	// before the session ends. Until then the upstream is unavailable, not
	// gone: requests of its sessions get 503 with a JSON-RPC error and
	// Retry-After, their sessions are kept, and they work again when it
	// recovers. A session ends at once when its upstream is removed from
	// the config, refuses the connection, or answers its POST or DELETE with
	// 404. Default: `1m`, two of Caddy's default `health_interval`, so that
	// one failed check never ends a session.
	UnhealthyGrace caddy.Duration `json:"unhealthy_grace,omitempty"`

	fallback reverseproxy.Selector
	table    *session.Table
	logger   *zap.Logger
	// warnedNoHandler: the warning of a request that no mcp_session
	// handler serves was logged.
	warnedNoHandler *atomic.Bool
	lastPool        *atomic.Pointer[*reverseproxy.Upstream] // the first element of the last pool noted
	proxy           *reverseproxy.Handler                   // the reverse_proxy the policy serves; nil outside one
	unhealthy       *unhealthyClock
}

// CaddyModule returns the Caddy module information.
func (SessionSelection) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.mcp_session",
		New: func() caddy.Module { return new(SessionSelection) },
	}
}

// Provision fetches the session table from the mcp_sessions app and loads
// the fallback policy. It returns an error when the fallback policy cannot
// be loaded (an unknown module, or its own provisioning error), or the
// mcp_sessions app cannot be loaded.
func (s *SessionSelection) Provision(ctx caddy.Context) error {
	if s.Table == "" {
		s.Table = session.DefaultTableName
	}
	if s.FallbackRaw == nil {
		s.FallbackRaw = caddyconfig.JSONModuleObject(LeastSessionsSelection{}, "policy", DefaultFallbackPolicy, nil)
	}
	raw, err := withTable(s.FallbackRaw, s.Table)
	if err != nil {
		return fmt.Errorf("loading fallback selection policy: %v", err)
	}
	s.FallbackRaw = raw
	mod, err := ctx.LoadModule(s, "FallbackRaw")
	if err != nil {
		return fmt.Errorf("loading fallback selection policy: %v", err)
	}
	s.fallback = mod.(reverseproxy.Selector)
	app, err := sessionsApp(ctx)
	if err != nil {
		return err
	}
	if s.table, err = app.Table(s.Table, TableConfig{}, "an mcp_session selection policy"); err != nil {
		return err
	}
	s.lastPool = new(atomic.Pointer[*reverseproxy.Upstream])
	s.logger, s.warnedNoHandler = ctx.Logger(), new(atomic.Bool)
	s.proxy, s.unhealthy = parentProxy(ctx), new(unhealthyClock)
	if s.UnhealthyGrace == 0 {
		s.UnhealthyGrace = caddy.Duration(DefaultUnhealthyGrace)
	}
	return s.subscribeHealthEvents(ctx)
}

// Validate checks the policy's settings.
func (s *SessionSelection) Validate() error {
	if s.UnhealthyGrace < 0 {
		return fmt.Errorf("unhealthy_grace must be positive, got %s", time.Duration(s.UnhealthyGrace))
	}
	return nil
}

// withTable gives a least_sessions fallback without a table of its own the
// policy's table.
func withTable(raw json.RawMessage, table string) (json.RawMessage, error) {
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	if t := fields["table"]; fields["policy"] != LeastSessionsPolicy || t != nil && t != "" {
		return raw, nil
	}
	fields["table"] = table
	return json.Marshal(fields)
}

// Select returns the upstream that owns the request's session, or, for a
// request without a known session, the fallback policy's choice.
func (s *SessionSelection) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	ex := exchangeOf(r)
	if !ex.serving && !ex.own && s.warnedNoHandler != nil && !s.warnedNoHandler.Load() && s.warnedNoHandler.CompareAndSwap(false, true) { // once per policy: a config mistake
		s.logger.Warn("lb_policy mcp_session cannot pin sessions: no mcp_session handler serves this request before the " +
			"reverse_proxy, so no session is learned and later requests are balanced; use mcp_proxy, or put " +
			"mcp_session before this reverse_proxy (docs/caddyfile.md#mcp_session-and-lb_policy-mcp_session)")
	}
	var up *reverseproxy.Upstream
	if ex.owner != nil {
		up = s.selectPinned(pool, r, ex.owner.Dial())
	} else {
		s.notePool(pool)
		if ex.selected != nil { // sent again: the upstream picked last failed it
			ex.noteFailed(ex.selected.Dial)
		}
		up = s.selectNew(s.candidates(pool, r), r, w, ex)
	}
	if up != nil {
		ex.selected = up
	}
	return up
}

// notePool records the pool's upstreams in the table once per pool, so
// that the admin API knows every configured upstream, not only those that
// own sessions.
func (s *SessionSelection) notePool(pool reverseproxy.UpstreamPool) {
	if s.table == nil || len(pool) == 0 || s.lastPool.Load() == &pool[0] {
		return
	}
	for _, u := range pool {
		s.table.UseUpstream(u.Dial)
	}
	s.lastPool.Store(&pool[0])
}

// candidates returns the upstreams of pool that may get a new session:
// not draining, not left stuck or refused by this request, not one that
// failed the request if it is a failover's replay (nor the upstream its
// session leaves), and not stuck (see frozen.go) nor refusing new sessions
// (refusal.go) unless no other one is available: a bounded wait, or one
// more try, beats no upstream.
func (s *SessionSelection) candidates(pool reverseproxy.UpstreamPool, r *http.Request) reverseproxy.UpstreamPool {
	ex := exchangeOf(r)
	avoid := ex.replay && len(ex.failedBy) > 0
	if s.table == nil || !avoid && !s.table.AnyDraining() && !s.table.AnyStuck() && !s.table.AnyRefusing() && len(ex.tried) == 0 {
		return pool
	}
	kept := make(reverseproxy.UpstreamPool, 0, len(pool))
	var stuck reverseproxy.UpstreamPool
	for _, u := range pool {
		rec := s.table.KnownUpstream(u.Dial)
		switch {
		case triedBy(r, u.Dial) || avoid && ex.failed(u.Dial) || rec != nil && rec.Draining():
		case rec != nil && (s.table.Stuck(rec) || s.table.Refusing(rec)):
			stuck = append(stuck, u)
		default:
			kept = append(kept, u)
		}
	}
	if !slices.ContainsFunc(kept, (*reverseproxy.Upstream).Available) {
		kept = append(kept, stuck...)
	}
	return kept
}

// selectNew returns the fallback policy's choice for a request without a
// known session or, when it finds no upstream available, an upstream out
// of service by passive health checks alone (see lastResort).
func (s *SessionSelection) selectNew(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter, ex *exchange) *reverseproxy.Upstream {
	if up := s.fallback.Select(pool, r, w); up != nil {
		return up
	}
	return s.lastResort(pool, ex)
}

// lastResort returns, of the upstreams of pool that only passive health
// checks keep out of service and that have not failed the request ex, the
// one with the fewest failures (the first of the pool among equals), or
// nil. A retry after its choice failed gets the next one: each is tried
// once, so that a lone upstream that is really down costs one attempt, not
// lb_retries of them.
func (s *SessionSelection) lastResort(pool reverseproxy.UpstreamPool, ex *exchange) *reverseproxy.Upstream {
	var best *reverseproxy.Upstream
	for _, u := range pool {
		if !u.Full() && s.healthOf(u) == healthPassiveDown && !ex.failed(u.Dial) && (best == nil || u.Fails() < best.Fails()) {
			best = u
		}
	}
	return best
}

// selectPinned returns the upstream of the pool dialed at dial. It returns
// nil, and marks the request's upstream gone, when the upstream is missing
// from the pool or has failed active health checks (or its circuit
// breaker) for longer than the grace; within the grace it returns nil and
// marks the upstream unavailable. Passive health failures do not stop a
// pinned request: its upstream is the only one that knows the session, and
// one client's failed request must not cost every session of a live
// upstream; a refused connection then ends the session. An upstream at its
// max_requests returns nil without ending the session (503).
func (s *SessionSelection) selectPinned(pool reverseproxy.UpstreamPool, r *http.Request, dial string) *reverseproxy.Upstream {
	for _, u := range pool {
		if u.Dial != dial {
			continue
		}
		h, since := s.noteHealth(u)
		if h == healthActiveDown {
			if time.Since(since) < time.Duration(s.UnhealthyGrace) {
				s.unavailable(r, since)
				return nil
			}
			break
		}
		if u.Full() {
			return nil
		}
		return u
	}
	exchangeOf(r).gone = true
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*SessionSelection)(nil)
	_ caddy.Validator       = (*SessionSelection)(nil)
	_ reverseproxy.Selector = (*SessionSelection)(nil)
)
