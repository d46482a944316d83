package caddymodule

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("mcp_session", parseMCPSession)
	httpcaddyfile.RegisterDirectiveOrder("mcp_session", httpcaddyfile.Before, "reverse_proxy")
	httpcaddyfile.RegisterDirective("mcp_proxy", parseMCPProxy)
	httpcaddyfile.RegisterDirectiveOrder("mcp_proxy", httpcaddyfile.After, "reverse_proxy")
	httpcaddyfile.RegisterGlobalOption(AppName, parseAppOption)
}

// Defaults that the mcp_proxy directive puts in front of the user's
// reverse_proxy subdirectives; each can be overridden in its block.
const (
	// proxyRetries lets a new session's initialize try another upstream when
	// dialing one fails (dial errors only: nothing was sent).
	proxyRetries = 2
	// proxyFailDuration is the passive health check window: an upstream that
	// refused a connection gets no new sessions for this long.
	proxyFailDuration = 10 * time.Second
	// proxyIdleConnTimeout closes idle upstream connections before the
	// common servers do (gunicorn 2 s; uvicorn, hypercorn and Node 5 s; Go
	// never), so that the proxy never reuses a connection the upstream is
	// closing. A request written onto such a connection fails with 502, and
	// neither Go nor Caddy may retry it: the upstream may have read a POST.
	// Caddy's own default is 2 minutes.
	proxyIdleConnTimeout = time.Second
)

// parseMCPSession sets up the handler from Caddyfile tokens.
func parseMCPSession(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	mcp_session [<matcher>] {
//	    table                 <name>
//	    max_sessions          <count>
//	    session_ttl           <duration>
//	    max_session_id_length <bytes>
//	    unknown_session       reject|forward
//	    localhost_protection  on|off
//	    bind_principal        <placeholder template>|off
//	    seal_session_ids      <key> [<older keys>...]
//	    failover              reinitialize|off
//	    max_initialize_size   <bytes>
//	    failover_max_age      <duration>
//	    journal               on|off
//	    journal_window        <duration>
//	    journal_session_bytes <size>
//	    journal_total_bytes   <size>
//	    max_unconfirmed_per_client <count>
//	    client_key            <placeholder template>
//	    initialize_timeout    <duration>|off
//	    pinned_timeout        <duration>|off
//	    legacy_sse            off|<query parameters...>
//	    reclaim               on|off
//	    reclaim_header        <name> <value>
//	    handle                <tool or pattern> <JSON pointer>|text <Mcp-Param-Name>
//	    handle_table          <name>
//	    unknown_handle        forward|reject [<4xx status>]
//	}
//
// It returns a Caddyfile error, naming the line, for an unknown option, a
// missing or extra argument, or a value that is not valid for its option.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		n, err := h.unmarshalOption(d, seen)
		if err != nil {
			return err
		}
		if n == 0 {
			return d.Errf("unrecognized mcp_session option '%s'", d.Val())
		}
	}
	return nil
}

// unmarshalOption parses the handler option at the dispenser's cursor and
// returns how many tokens it took, its name included, or 0 if it is not
// one of the handler's options. It rejects an option given twice.
func (h *Handler) unmarshalOption(d *caddyfile.Dispenser, seen map[string]bool) (int, error) {
	name := d.Val()
	switch name {
	case "seal_session_ids":
		return unmarshalSealKeys(d, seen, &h.SealSessionIDs)
	case "legacy_sse":
		return unmarshalLegacySSE(d, seen, &h.DisableLegacySSE, &h.LegacySSEParams)
	case "reclaim_header":
		return unmarshalReclaimHeader(d, &h.ReclaimHeaders)
	case "handle":
		return h.HandleSettings.unmarshalHandle(d)
	case "unknown_handle":
		return h.HandleSettings.unmarshalUnknownHandle(d, seen)
	}
	if n, err := h.TableSettings.unmarshalOption(d, seen); n != 0 || err != nil {
		return n, err
	}
	var set func(string) error
	switch name {
	case "table":
		set = func(v string) error { h.Table = v; return nil }
	case "handle_table":
		set = func(v string) error { h.HandleTable = v; return nil }
	case "max_session_id_length":
		set = func(v string) error { return parsePositiveInt(d, name, v, &h.MaxSessionIDLength) }
	case "initialize_timeout":
		set = func(v string) error { return parseTimeout(d, name, v, -1, &h.InitializeTimeout) }
	case "pinned_timeout":
		set = func(v string) error { return parseTimeout(d, name, v, 0, &h.PinnedTimeout) }
	case "localhost_protection":
		set = func(v string) error {
			if v != "on" && v != "off" {
				return d.Errf("localhost_protection: '%s' must be 'on' or 'off'", v)
			}
			h.DisableLocalhostProtection = v == "off"
			return nil
		}
	case "reclaim":
		set = func(v string) error {
			if v != ReclaimOn && v != ReclaimOff {
				return d.Errf("reclaim: '%s' must be '%s' or '%s'", v, ReclaimOn, ReclaimOff)
			}
			h.Reclaim = v
			return nil
		}
	case "unknown_session":
		set = func(v string) error {
			if v != UnknownSessionReject && v != UnknownSessionForward {
				return d.Errf("unknown_session: '%s' must be '%s' or '%s'", v, UnknownSessionReject, UnknownSessionForward)
			}
			h.UnknownSession = v
			return nil
		}
	default:
		return 0, nil
	}
	return unmarshalSetting(d, name, seen, set)
}

// unmarshalSetting parses the one argument of option name at the cursor
// with set, and returns the tokens it took. It rejects an option given
// twice.
func unmarshalSetting(d *caddyfile.Dispenser, name string, seen map[string]bool, set func(string) error) (int, error) {
	if seen[name] {
		return 0, d.Errf("duplicate option '%s'", name)
	}
	seen[name] = true
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	v := d.Val()
	if d.NextArg() {
		return 0, d.ArgErr()
	}
	return 2, set(v)
}

// unmarshalOption parses the table setting at the dispenser's cursor and
// returns how many tokens it took, its name included, or 0 if it is not a
// table setting. It rejects a setting given twice.
func (s *TableSettings) unmarshalOption(d *caddyfile.Dispenser, seen map[string]bool) (int, error) {
	name := d.Val()
	var set func(string) error
	switch name {
	case "max_sessions":
		set = func(v string) error { return parsePositiveInt(d, name, v, &s.MaxSessions) }
	case "session_ttl":
		set = func(v string) error {
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("session_ttl: '%s' is not a positive duration such as 30m or 24h", v)
			}
			if dur < session.MinSessionTTL {
				return d.Errf("session_ttl: '%s' is below the minimum of %s", v, session.MinSessionTTL)
			}
			s.SessionTTL = caddy.Duration(dur)
			return nil
		}
	case "bind_principal":
		set = func(v string) error {
			if v == "" {
				return d.Errf("bind_principal: give a placeholder template, such as {http.auth.user.id}, or off")
			}
			if err := checkBindPrincipal(v); err != nil {
				return d.Err(err.Error())
			}
			s.BindPrincipal = v
			return nil
		}
	case "failover":
		set = func(v string) error {
			if v != session.FailoverOff && v != session.FailoverReinitialize {
				return d.Errf("failover: '%s' must be '%s' or '%s'", v, session.FailoverReinitialize, session.FailoverOff)
			}
			s.Failover = v
			return nil
		}
	case "max_initialize_size":
		set = func(v string) error { return parsePositiveInt(d, name, v, &s.MaxInitializeSize) }
	case "failover_max_age":
		set = func(v string) error {
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("failover_max_age: '%s' is not a positive duration such as 1h or 24h", v)
			}
			if dur < session.MinSessionTTL {
				return d.Errf("failover_max_age: '%s' is below the minimum of %s", v, session.MinSessionTTL)
			}
			s.FailoverMaxAge = caddy.Duration(dur)
			return nil
		}
	case "journal", "journal_window", "journal_session_bytes", "journal_total_bytes":
		set = s.journalOption(d, name) // journal.go
	case "max_unconfirmed_per_client":
		set = func(v string) error { return parseCap(d, name, v, &s.MaxUnconfirmedPerClient) }
	case "client_key":
		set = func(v string) error {
			if err := checkClientKey(v); err != nil {
				return d.Err(err.Error())
			}
			s.ClientKey = v
			return nil
		}
	default:
		return 0, nil
	}
	return unmarshalSetting(d, name, seen, set)
}

// unmarshalSealKeys parses `seal_session_ids <key> [<key>...]` at the
// cursor into dst and returns how many tokens it took.
func unmarshalSealKeys(d *caddyfile.Dispenser, seen map[string]bool, dst **SealedSessionIDs) (int, error) {
	if seen["seal_session_ids"] {
		return 0, d.Err("duplicate option 'seal_session_ids'; list every key on one line, the sealing key first")
	}
	seen["seal_session_ids"] = true
	keys := d.RemainingArgs()
	if len(keys) == 0 {
		return 0, d.Err("seal_session_ids needs at least one key, such as 'seal_session_ids {env.MCP_SESSION_KEY}'")
	}
	*dst = &SealedSessionIDs{Keys: keys}
	return 1 + len(keys), nil
}

// unmarshalHandle parses `handle <tool> <where> <header>` at the cursor,
// one handle rule (the option may be given once per rule), and returns how
// many tokens it took. The order follows the handle's life: the tool
// mints it, its result holds it there, and calls carry it back in the
// header.
func (s *HandleSettings) unmarshalHandle(d *caddyfile.Dispenser) (int, error) {
	args := d.RemainingArgs()
	if len(args) != 3 {
		return 0, d.Errf("handle needs three arguments, got %d: the tool whose result mints the handle (a name, or a pattern with *), "+
			"where the result holds it (a JSON pointer into structuredContent such as /handle, or text), and the header that carries it back "+
			"(Mcp-Param- and the x-mcp-header name of its parameter); such as 'handle open_browser /browser_id Mcp-Param-Browser'", len(args))
	}
	rule := HandleRule{Tool: args[0], From: args[1], Header: args[2]}
	if err := rule.check(); err != nil {
		return 0, d.Err(err.Error())
	}
	s.Handles = append(s.Handles, rule)
	return 4, nil
}

// unmarshalUnknownHandle parses `unknown_handle forward|reject [<status>]`
// at the cursor and returns how many tokens it took.
func (s *HandleSettings) unmarshalUnknownHandle(d *caddyfile.Dispenser, seen map[string]bool) (int, error) {
	if seen["unknown_handle"] {
		return 0, d.Err("duplicate option 'unknown_handle'")
	}
	seen["unknown_handle"] = true
	args := d.RemainingArgs()
	switch {
	case len(args) == 1 && (args[0] == UnknownHandleForward || args[0] == UnknownHandleReject):
		s.UnknownHandle = args[0]
		return 2, nil
	case len(args) == 2 && args[0] == UnknownHandleReject:
		status, err := strconv.Atoi(args[1])
		if err != nil || status < 400 || status > 499 {
			return 0, d.Errf("unknown_handle reject: '%s' is not a 4xx status; write such as 'unknown_handle reject 404'", args[1])
		}
		s.UnknownHandle, s.UnknownHandleStatus = args[0], status
		return 3, nil
	}
	return 0, d.Errf("unknown_handle takes 'forward', or 'reject' with an optional 4xx status such as 'unknown_handle reject 404'; got %q", strings.Join(args, " "))
}

// parseTimeout parses v, a positive duration or `off`, into dst; off is
// stored as off.
func parseTimeout(d *caddyfile.Dispenser, name, v string, off caddy.Duration, dst *caddy.Duration) error {
	if v == "off" {
		*dst = off
		return nil
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil || dur <= 0 {
		return d.Errf("%s: '%s' is neither a positive duration such as 5s nor 'off'", name, v)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// unmarshalLegacySSE parses `legacy_sse off|<query parameters...>` at the
// cursor into off (legacy_sse off) or params, and returns how many tokens
// it took.
func unmarshalLegacySSE(d *caddyfile.Dispenser, seen map[string]bool, off *bool, params *[]string) (int, error) {
	if seen["legacy_sse"] {
		return 0, d.Err("duplicate option 'legacy_sse'; list every query parameter on one line")
	}
	seen["legacy_sse"] = true
	args := d.RemainingArgs()
	switch {
	case len(args) == 0:
		return 0, d.Err("legacy_sse needs 'off' or the query parameters that carry the session, such as 'legacy_sse session_id'")
	case len(args) == 1 && args[0] == "off":
		*off = true
	case slices.Contains(args, "off"):
		return 0, d.Err("legacy_sse: 'off' cannot be listed with query parameters")
	case slices.ContainsFunc(args, badQueryName):
		return 0, d.Errf("legacy_sse: %q has a name with '?', '&', '=', '#' or a space; list query parameter names, such as 'legacy_sse session_id'", args)
	case slices.Contains(args, "on"):
		return 0, d.Errf("legacy_sse: 'on' would be read as a query parameter name; legacy SSE sessions are pinned by default, by %s: leave legacy_sse out, or list the parameter names", strings.Join(DefaultLegacySSEParams, ", "))
	default:
		*params = args
	}
	return 1 + len(args), nil
}

// unmarshalReclaimHeader parses `reclaim_header <name> <value>` at the
// cursor into headers and returns how many tokens it took. It may be given
// once per name.
func unmarshalReclaimHeader(d *caddyfile.Dispenser, headers *map[string]string) (int, error) {
	args := d.RemainingArgs()
	if len(args) != 2 {
		return 0, d.Err("reclaim_header needs a header name and a value, such as 'reclaim_header Authorization \"Bearer {env.MCP_TOKEN}\"'")
	}
	name := http.CanonicalHeaderKey(args[0])
	if !validHeaderName(name) {
		return 0, d.Errf("reclaim_header: '%s' is not a header name", args[0])
	}
	if _, dup := (*headers)[name]; dup {
		return 0, d.Errf("reclaim_header: duplicate header '%s'", name)
	}
	if reservedReclaimHeader(name) {
		return 0, d.Errf("reclaim_header: '%s' is set by the proxy for each DELETE", name)
	}
	if *headers == nil {
		*headers = map[string]string{}
	}
	(*headers)[name] = args[1]
	return 3, nil
}

// parseCap parses a cap whose 0, its default, means no cap.
func parseCap(d *caddyfile.Dispenser, name, v string, dst *int) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return d.Errf("%s: '%s' is not a whole number; 0 (the default) sets no cap", name, v)
	}
	*dst = n
	return nil
}

func parsePositiveInt(d *caddyfile.Dispenser, name, v string, dst *int) error {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return d.Errf("%s: '%s' is not a positive whole number", name, v)
	}
	*dst = n
	return nil
}

// UnmarshalCaddyfile sets up the selection policy from Caddyfile tokens. Syntax:
//
//	lb_policy mcp_session {
//	    table           <name>
//	    fallback        <policy> [<policy options...>]
//	    unhealthy_grace <duration>
//	}
//
// It returns a Caddyfile error, naming the line, for an unknown option, a
// repeated table or fallback, a missing policy name, or the fallback
// policy's own error for its options.
func (s *SessionSelection) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "table":
			if err := unmarshalTable(d, &s.Table); err != nil {
				return err
			}
		case "fallback":
			if s.FallbackRaw != nil {
				return d.Err("fallback selection policy already specified")
			}
			if !d.NextArg() {
				return d.Err("fallback needs a selection policy name, such as 'fallback least_conn'")
			}
			raw, err := unmarshalFallback(d)
			if err != nil {
				return err
			}
			s.FallbackRaw = raw
		case "unhealthy_grace":
			if err := unmarshalGrace(d, &s.UnhealthyGrace); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized mcp_session policy option '%s'", d.Val())
		}
	}
	return nil
}

// unmarshalGrace parses the argument of `unhealthy_grace` at the cursor
// into dst, which must not be set yet.
func unmarshalGrace(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	if *dst != 0 {
		return d.Err("duplicate option 'unhealthy_grace'")
	}
	if !d.NextArg() {
		return d.ArgErr()
	}
	dur, err := caddy.ParseDuration(d.Val())
	if err != nil || dur <= 0 {
		return d.Errf("unhealthy_grace: '%s' is not a positive duration such as 30s or 5m", d.Val())
	}
	*dst = caddy.Duration(dur)
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// unmarshalFallback parses the selection policy whose name is at the
// dispenser's cursor, with its arguments and block.
func unmarshalFallback(d *caddyfile.Dispenser) (json.RawMessage, error) {
	name := d.Val()
	if name == "mcp_session" {
		return nil, d.Err("the fallback policy cannot be mcp_session itself")
	}
	const ns = "http.reverse_proxy.selection_policies"
	modID := ns + "." + name
	if _, err := caddy.GetModule(modID); err != nil {
		var names []string
		for _, m := range caddy.GetModules(ns) {
			if n := m.ID.Name(); n != "mcp_session" {
				names = append(names, n)
			}
		}
		return nil, d.Errf("fallback %q: no such selection policy; use one of %s", name, strings.Join(names, ", "))
	}
	unm, err := caddyfile.UnmarshalModule(d, modID)
	if err != nil {
		return nil, err
	}
	sel, ok := unm.(reverseproxy.Selector)
	if !ok {
		return nil, d.Errf("module %s (%T) is not a selection policy", modID, unm)
	}
	return caddyconfig.JSONModuleObject(sel, "policy", name, nil), nil
}

// parseMCPProxy expands the mcp_proxy directive into the mcp_session handler
// followed by a reverse_proxy that uses the mcp_session selection policy.
// Syntax:
//
//	mcp_proxy [<matcher>] [<upstreams...>] {
//	    # session affinity
//	    table                 <name>
//	    max_sessions          <count>
//	    session_ttl           <duration>
//	    max_session_id_length <bytes>
//	    unknown_session       reject|forward
//	    localhost_protection  on|off
//	    bind_principal        <placeholder template>|off
//	    seal_session_ids      <key> [<older keys>...]
//	    failover              reinitialize|off
//	    max_initialize_size   <bytes>
//	    failover_max_age      <duration>
//	    journal               on|off
//	    journal_window        <duration>
//	    journal_session_bytes <size>
//	    journal_total_bytes   <size>
//	    max_unconfirmed_per_client <count>
//	    client_key            <placeholder template>
//	    initialize_timeout    <duration>|off
//	    pinned_timeout        <duration>|off
//	    legacy_sse            off|<query parameters...>
//	    reclaim               on|off
//	    reclaim_header        <name> <value>
//	    handle                <tool or pattern> <JSON pointer>|text <Mcp-Param-Name>
//	    handle_table          <name>
//	    unknown_handle        forward|reject [<4xx status>]
//	    fallback              <policy> [<policy options...>]
//	    unhealthy_grace       <duration>
//
//	    # any reverse_proxy subdirective except lb_policy
//	}
//
// Defaults that differ from reverse_proxy's, each overridable in the block:
// `lb_retries 2`, `fail_duration 10s`, `header_up Host {mcp.host_for_upstream}`
// (except to HTTPS upstreams, which get Caddy's own default), the `mcp`
// transport (the http transport's options; see [Transport]) and for it
// `keepalive 1s`.
func parseMCPProxy(h httpcaddyfile.Helper) ([]httpcaddyfile.ConfigValue, error) {
	if !h.Next() {
		return nil, h.ArgErr()
	}
	userMatcherSet, err := h.ExtractMatcherSet()
	if err != nil {
		return nil, err
	}
	d := h.NewFromNextSegment()
	used := subdirectives(d)
	d.Reset()
	if err := checkUpstreamTokens(d); err != nil {
		return nil, err
	}
	d.Reset()
	handler, policy, err := extractAffinityOptions(d)
	if err != nil {
		return nil, err
	}
	d.Reset()

	rp := newProxyHandler(policy)
	d.Next() // the segment starts with an empty token; see fastcgi's caddyfile.go
	if err := rp.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	if err := rp.FinalizeUnmarshalCaddyfile(h); err != nil {
		return nil, err
	}
	if len(rp.Upstreams) == 0 && rp.DynamicUpstreamsRaw == nil {
		return nil, h.Err("mcp_proxy has no upstreams, so it would answer every request 503: list them after the directive " +
			"(mcp_proxy 127.0.0.1:9001 127.0.0.1:9002), with 'to', or as a 'dynamic' source")
	}
	adjustHostForTLS(rp)
	adjustForSocketSource(rp, used)
	if rp.TransportRaw, err = mcpTransport(rp.TransportRaw, used["transport"]); err != nil {
		return nil, h.Errf("transport: %v", err)
	}
	if msg := healthURIWarning(rp, userMatcherSet); msg != "" {
		caddy.Log().Warn(msg, zap.String("adapter", "caddyfile"), zap.String("file", h.File()), zap.Int("line", h.Line()))
	}

	subroute := caddyhttp.Subroute{Routes: caddyhttp.RouteList{{
		HandlersRaw: []json.RawMessage{
			caddyconfig.JSONModuleObject(handler, "handler", "mcp_session", nil),
			caddyconfig.JSONModuleObject(rp, "handler", "reverse_proxy", nil),
		},
	}}}
	if userMatcherSet != nil {
		return []httpcaddyfile.ConfigValue{{Class: "route", Value: caddyhttp.Route{
			MatcherSetsRaw: []caddy.ModuleMap{userMatcherSet},
			HandlersRaw:    []json.RawMessage{caddyconfig.JSONModuleObject(subroute, "handler", "subroute", nil)},
		}}}, nil
	}
	return []httpcaddyfile.ConfigValue{{Class: "route", Value: subroute}}, nil
}

// extractAffinityOptions reads the session affinity options out of an
// mcp_proxy block and deletes their tokens, so that reverse_proxy's parser
// sees only its own. Only the first token of a line at the block's top level
// names an option: `header_up X-Table table` is reverse_proxy's.
func extractAffinityOptions(d *caddyfile.Dispenser) (*Handler, *SessionSelection, error) {
	handler, policy := new(Handler), new(SessionSelection)
	seen := map[string]bool{}
	for d.Next() {
		for d.NextBlock(0) {
			if d.Nesting() != 1 {
				continue
			}
			switch d.Val() {
			case "lb_policy":
				return nil, nil, d.Err("mcp_proxy chooses upstreams with the mcp_session policy; " +
					"use 'fallback <policy>' to choose how new sessions are balanced")
			case "store", "upstream_ttl":
				return nil, nil, d.Errf("%s is a setting of the session table, given in the global option: "+
					"{ %s [<table>] { %s ... } }", d.Val(), AppName, d.Val())
			case "fallback":
				if err := extractFallback(d, policy); err != nil {
					return nil, nil, err
				}
				continue
			case "unhealthy_grace":
				if err := unmarshalGrace(d, &policy.UnhealthyGrace); err != nil {
					return nil, nil, err
				}
				d.DeleteN(2)
				continue
			}
			n, err := handler.unmarshalOption(d, seen)
			if err != nil {
				return nil, nil, err
			}
			if n > 0 {
				d.DeleteN(n)
				continue
			}
			for d.NextArg() { // a reverse_proxy subdirective: skip its arguments
			}
		}
	}
	policy.Table = handler.Table
	return handler, policy, nil
}

// extractFallback parses `fallback <policy> ...` at the cursor into policy
// and deletes its tokens.
func extractFallback(d *caddyfile.Dispenser, policy *SessionSelection) error {
	if policy.FallbackRaw != nil {
		return d.Err("fallback selection policy already specified")
	}
	if !d.NextArg() {
		return d.Err("fallback needs a selection policy name, such as 'fallback least_conn'")
	}
	seg := d.NextSegment()
	n := len(seg) + 1 // the policy's tokens and "fallback"
	if d.Val() == "}" && seg[len(seg)-1].Text != "}" {
		n += 2 // an empty block, "{ }", which the segment leaves out
	}
	d.DeleteN(n)
	sd := caddyfile.NewDispenser(seg)
	sd.Next()
	raw, err := unmarshalFallback(sd)
	if err != nil {
		return err
	}
	policy.FallbackRaw = raw
	return nil
}

// subdirectives returns the names of the subdirectives in the block at the
// dispenser's cursor.
func subdirectives(d *caddyfile.Dispenser) map[string]bool {
	used := map[string]bool{}
	for d.Next() {
		for d.NextBlock(0) {
			if d.Nesting() == 1 {
				used[d.Val()] = true
				for d.NextArg() {
				}
			}
		}
	}
	return used
}

// checkUpstreamTokens refuses an upstream of the directive's line or of
// its `to` with a path, such as the URL an MCP server prints
// (127.0.0.1:9001/mcp): reverse_proxy would take it for the network
// "127.0.0.1:9001" and fail every dial, while the proxy keeps the path
// the client asked for. (A URL with a scheme and a path reverse_proxy
// refuses itself.)
func checkUpstreamTokens(d *caddyfile.Dispenser) error {
	d.Next() // the segment's empty first token
	d.Next() // the directive
	check := func() error {
		for d.NextArg() {
			if host, path, ok := upstreamPath(d.Val()); ok {
				return d.Errf("upstream %q has a path: give %s; the proxy sends each request to the path the client asked for, "+
					"so clients use the proxy's URL with /%s", d.Val(), host, path)
			}
		}
		return nil
	}
	if err := check(); err != nil {
		return err
	}
	for d.NextBlock(0) {
		if d.Nesting() == 1 && d.Val() == "to" {
			if err := check(); err != nil {
				return err
			}
		}
	}
	return nil
}

// upstreamPath splits an upstream token without a scheme into its host
// and a path, if it has one: not a socket (unix/…), a placeholder, a
// network-qualified address (tcp/…) or a URL.
func upstreamPath(token string) (host, path string, ok bool) {
	if strings.Contains(token, "{") || strings.Contains(token, "://") {
		return "", "", false
	}
	host, path, ok = strings.Cut(token, "/")
	if !ok || !strings.ContainsAny(host, ".:[") && host != "localhost" {
		return "", "", false // unix/…, tcp/…, or no slash
	}
	return host, path, true
}

// adjustHostForTLS removes mcp_proxy's default Host from a proxy to HTTPS
// upstreams, unless the user set Host themselves: reverse_proxy then
// sends the upstream's own host:port, which its certificate and virtual
// hosts expect, whatever the upstream's address.
func adjustHostForTLS(rp *reverseproxy.Handler) {
	if !tlsTransport(rp.TransportRaw) || rp.Headers == nil || rp.Headers.Request == nil {
		return
	}
	ops := rp.Headers.Request
	if host := ops.Set["Host"]; len(host) != 1 || host[0] != proxyHostHeader {
		return
	}
	delete(ops.Set, "Host")
	if len(ops.Set)+len(ops.Add)+len(ops.Delete)+len(ops.Replace) == 0 && rp.Headers.Response == nil {
		rp.Headers = nil
	}
}

// tlsTransport reports whether raw, a reverse_proxy transport, is the http
// or mcp transport with TLS to the upstreams.
func tlsTransport(raw json.RawMessage) bool {
	var t struct {
		Protocol string          `json:"protocol"`
		TLS      json.RawMessage `json:"tls"`
	}
	return json.Unmarshal(raw, &t) == nil && (t.Protocol == "http" || t.Protocol == "mcp") && t.TLS != nil
}

// mcpTransport gives an mcp_proxy its default transport: the mcp
// transport (see [Transport]) in place of the http transport that
// reverse_proxy sets up when the block names none (explicit is false), with
// the default idle connection timeout, proxyIdleConnTimeout, unless
// `keepalive <duration>` or `keepalive off` is set. A transport the block
// names is kept; when it is http or mcp, it gets the idle connection
// timeout too. Other transports are left as they are.
func mcpTransport(raw json.RawMessage, explicit bool) (json.RawMessage, error) {
	idle := caddy.Duration(proxyIdleConnTimeout)
	if raw == nil {
		ht := reverseproxy.HTTPTransport{KeepAlive: &reverseproxy.KeepAlive{IdleConnTimeout: idle}}
		if explicit { // reverse_proxy leaves out a `transport http` without options
			return caddyconfig.JSONModuleObject(&ht, "protocol", "http", nil), nil
		}
		return caddyconfig.JSONModuleObject(&Transport{ht}, "protocol", "mcp", nil), nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	switch string(fields["protocol"]) {
	case `"http"`:
		if !explicit {
			fields["protocol"] = json.RawMessage(`"mcp"`)
		}
	case `"mcp"`:
	default:
		return raw, nil
	}
	var ka map[string]json.RawMessage
	if fields["keep_alive"] != nil {
		if err := json.Unmarshal(fields["keep_alive"], &ka); err != nil {
			return nil, err
		}
	}
	if ka["idle_timeout"] == nil && string(ka["enabled"]) != "false" {
		if ka == nil {
			ka = map[string]json.RawMessage{}
		}
		ka["idle_timeout"] = caddyconfig.JSON(idle, nil)
		fields["keep_alive"] = caddyconfig.JSON(ka, nil)
	}
	return json.Marshal(fields)
}

// healthURIWarning returns a warning when the active health checks of rp
// probe the MCP endpoint: `/mcp`, or the path of the directive's path
// matcher (its pattern without a trailing `*`). An MCP server answers a
// GET without a session there with 400 or 405, so every upstream would be
// unhealthy and every new session would get 503.
func healthURIWarning(rp *reverseproxy.Handler, matcher caddy.ModuleMap) string {
	if rp.HealthChecks == nil || rp.HealthChecks.Active == nil {
		return ""
	}
	a := rp.HealthChecks.Active
	//lint:ignore SA1019 the Caddyfile's health_path still sets Path
	uri := cmp.Or(a.URI, a.Path)
	u, err := url.Parse(uri)
	if uri == "" || err != nil {
		return ""
	}
	var paths []string
	_ = json.Unmarshal(matcher["path"], &paths)
	for _, p := range append(paths, "/mcp") {
		if p = strings.TrimSuffix(strings.TrimSuffix(p, "*"), "/"); p != "" && p == strings.TrimSuffix(u.Path, "/") {
			return fmt.Sprintf("mcp_proxy: health_uri %s is the MCP endpoint, which MCP servers answer with 400 or 405 "+
				"without a session: every upstream would fail active health checks and every new session get 503; "+
				"probe a health endpoint instead, such as /healthz", uri)
		}
	}
	return ""
}

// newProxyHandler returns a reverse_proxy handler with mcp_proxy's defaults.
func newProxyHandler(policy *SessionSelection) *reverseproxy.Handler {
	return &reverseproxy.Handler{
		LoadBalancing: &reverseproxy.LoadBalancing{
			SelectionPolicyRaw: caddyconfig.JSONModuleObject(policy, "policy", "mcp_session", nil),
			Retries:            proxyRetries,
		},
		HealthChecks: &reverseproxy.HealthChecks{
			Passive: &reverseproxy.PassiveHealthChecks{FailDuration: caddy.Duration(proxyFailDuration)},
		},
		Headers: &headers.Handler{
			Request: &headers.HeaderOps{Set: http.Header{"Host": []string{proxyHostHeader}}},
		},
	}
}

// parseAppOption sets up a table of the mcp_sessions app from the global
// option of that name; the option may be given once per table. Syntax:
//
//	mcp_sessions [<table>] {
//	    max_sessions   <count>
//	    session_ttl    <duration>
//	    bind_principal <placeholder template>|off
//	    failover       reinitialize|off
//	    max_initialize_size <bytes>
//	    failover_max_age <duration>
//	    journal        on|off
//	    journal_window <duration>
//	    journal_session_bytes <size>
//	    journal_total_bytes <size>
//	    upstream_ttl   <duration>
//	    store          memory|redis [{ <redis options> }]
//	    max_unconfirmed_per_client <count>
//	    client_key     <placeholder template>
//	}
//
// The table's name defaults to `default`. See [RedisStore.UnmarshalCaddyfile]
// for the options of the redis store.
func parseAppOption(d *caddyfile.Dispenser, existing any) (any, error) {
	app := new(App)
	if prev, ok := existing.(httpcaddyfile.App); ok {
		if err := json.Unmarshal(prev.Value, app); err != nil {
			return nil, err
		}
	}
	if app.Tables == nil {
		app.Tables = map[string]*TableConfig{}
	}
	if err := app.unmarshalTable(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: AppName, Value: caddyconfig.JSON(app, nil)}, nil
}

// unmarshalTable parses one mcp_sessions global option into a table of a.
func (a *App) unmarshalTable(d *caddyfile.Dispenser) error {
	d.Next() // consume option name
	name := session.DefaultTableName
	if d.NextArg() {
		name = d.Val()
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	if _, dup := a.Tables[name]; dup {
		return d.Errf("session table '%s' is configured twice", name)
	}
	cfg := new(TableConfig)
	a.Tables[name] = cfg
	seen := map[string]bool{}
	for d.NextBlock(0) {
		if err := unmarshalTableOption(d, cfg, seen); err != nil {
			return err
		}
	}
	// The adapter expands placeholder shorthands such as {client_ip} in
	// site blocks only: a global option must do it itself.
	cfg.BindPrincipal, cfg.ClientKey = expandShorthands(cfg.BindPrincipal), expandShorthands(cfg.ClientKey)
	return nil
}

// unmarshalTableOption parses the table option at the cursor into cfg:
// the table settings as the handler parses them, and the app's own.
func unmarshalTableOption(d *caddyfile.Dispenser, cfg *TableConfig, seen map[string]bool) error {
	if n, err := cfg.TableSettings.unmarshalOption(d, seen); n != 0 || err != nil {
		return err
	}
	name := d.Val()
	if seen[name] {
		return d.Errf("duplicate option '%s'", name)
	}
	switch name {
	case "upstream_ttl":
		seen[name] = true
		return unmarshalDuration(d, &cfg.UpstreamTTL)
	case "store":
		seen[name] = true
		return unmarshalStore(d, cfg)
	}
	return d.Errf("unrecognized %s option '%s'", AppName, name)
}

// unmarshalDuration parses the one positive duration argument of the option
// at the cursor into dst.
func unmarshalDuration(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	name := d.Val()
	if !d.NextArg() {
		return d.ArgErr()
	}
	dur, err := caddy.ParseDuration(d.Val())
	if err != nil || dur <= 0 {
		return d.Errf("%s: '%s' is not a positive duration such as 500ms or 10m", name, d.Val())
	}
	*dst = caddy.Duration(dur)
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// unmarshalStore parses `store <type> [{ ... }]` at the cursor into cfg.
func unmarshalStore(d *caddyfile.Dispenser, cfg *TableConfig) error {
	if !d.NextArg() {
		return d.Err("store needs a type: memory or redis")
	}
	name := d.Val()
	mod, err := caddyfile.UnmarshalModule(d, "mcp_sessions.stores."+name)
	if err != nil {
		return err
	}
	cfg.StoreRaw = caddyconfig.JSONModuleObject(mod, "type", name, nil)
	return nil
}

// UnmarshalCaddyfile sets up the memory store, which has no options:
//
//	store memory
func (MemoryStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume store name
	if d.NextArg() || d.NextBlock(0) {
		return d.Err("the memory store takes no options")
	}
	return nil
}

// UnmarshalCaddyfile sets up the redis store from Caddyfile tokens. Syntax:
//
//	store redis {
//	    address           <host:port...>
//	    master_name       <name>
//	    cluster
//	    username          <user>
//	    password          <password>
//	    sentinel_password <password>
//	    db                <index>
//	    tls {
//	        server_name          <name>
//	        ca_file              <path>
//	        insecure_skip_verify
//	    }
//	    dial_timeout      <duration>
//	    timeout           <duration>
//	    key_prefix        <prefix>
//	    hash_key          <secret>
//	}
//
// `tls` may be given without a block. Use `{env.*}` placeholders for
// secrets; they are replaced when the config loads.
func (s *RedisStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume store name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		name := d.Val()
		if seen[name] {
			return d.Errf("duplicate redis store option '%s'", name)
		}
		seen[name] = true
		if err := s.unmarshalOption(d, name); err != nil {
			return err
		}
	}
	return nil
}

// unmarshalOption parses one option of the redis store.
func (s *RedisStore) unmarshalOption(d *caddyfile.Dispenser, name string) error {
	strs := map[string]*string{"master_name": &s.MasterName, "username": &s.Username, "password": &s.Password,
		"sentinel_password": &s.SentinelPassword, "key_prefix": &s.KeyPrefix, "hash_key": &s.HashKey}
	switch {
	case strs[name] != nil:
		return unmarshalString(d, strs[name])
	case name == "address":
		s.Addresses = d.RemainingArgs()
		if len(s.Addresses) == 0 {
			return d.Err("address needs at least one host:port")
		}
	case name == "cluster":
		s.Cluster = true
		if d.NextArg() {
			return d.ArgErr()
		}
	case name == "db":
		if !d.NextArg() {
			return d.ArgErr()
		}
		n, err := strconv.Atoi(d.Val())
		if err != nil || n < 0 {
			return d.Errf("db: '%s' is not a database index (0 or more)", d.Val())
		}
		s.DB = n
	case name == "dial_timeout":
		return unmarshalDuration(d, &s.DialTimeout)
	case name == "timeout":
		return unmarshalDuration(d, &s.Timeout)
	case name == "tls":
		s.TLS = new(RedisTLS)
		return s.TLS.unmarshal(d)
	default:
		return d.Errf("unrecognized redis store option '%s'", name)
	}
	return nil
}

// unmarshalString parses the one argument of the option at the cursor into dst.
func unmarshalString(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// unmarshal parses the optional block of the redis store's tls option.
func (t *RedisTLS) unmarshal(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "server_name":
			if err := unmarshalString(d, &t.ServerName); err != nil {
				return err
			}
		case "ca_file":
			if err := unmarshalString(d, &t.CAFile); err != nil {
				return err
			}
		case "insecure_skip_verify":
			t.InsecureSkipVerify = true
		default:
			return d.Errf("unrecognized redis store tls option '%s'", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*Handler)(nil)
	_ caddyfile.Unmarshaler = (*SessionSelection)(nil)
	_ caddyfile.Unmarshaler = (*RedisStore)(nil)
	_ caddyfile.Unmarshaler = (*MemoryStore)(nil)
)
