package caddymodule

import (
	"math/rand/v2"
	"net/http"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

func init() {
	caddy.RegisterModule(LeastSessionsSelection{})
}

// LeastSessionsPolicy is the name of the least_sessions selection policy.
const LeastSessionsPolicy = "least_sessions"

// LeastSessionsSelection is a selection policy for new MCP sessions: it
// picks the available, non-draining upstream with the fewest live sessions
// in the session table (on every Caddy instance, when the table has a
// shared store), counting requests in flight to it as well (other
// than sessions' open GET streams, which are counted as their sessions), so
// that a burst of `initialize` requests spreads before their sessions are
// learned. Ties are broken at random.
//
// MCP sessions last minutes to hours, so the number of live sessions, not
// of requests in flight (`least_conn`), is what loads an upstream's memory.
// Use it as the `fallback` of the `mcp_session` policy, where it reads the
// same table.
type LeastSessionsSelection struct {
	// The name of the session table whose live sessions are counted.
	// Default: the table of the `mcp_session` policy it is the fallback of,
	// otherwise `default`.
	Table string `json:"table,omitempty"`

	table *session.Table
}

// CaddyModule returns the Caddy module information.
func (LeastSessionsSelection) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies." + LeastSessionsPolicy,
		New: func() caddy.Module { return new(LeastSessionsSelection) },
	}
}

// Provision fetches the session table from the mcp_sessions app. It
// returns the error of loading the app.
func (s *LeastSessionsSelection) Provision(ctx caddy.Context) error {
	if s.Table == "" {
		s.Table = session.DefaultTableName
	}
	app, err := sessionsApp(ctx)
	if err != nil {
		return err
	}
	s.table, err = app.Table(s.Table, TableConfig{}, "a least_sessions selection policy")
	return err
}

// Select returns the available, non-draining upstream with the fewest live
// sessions plus requests in flight, or nil if there is none.
func (s *LeastSessionsSelection) Select(pool reverseproxy.UpstreamPool, _ *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	var best *reverseproxy.Upstream
	var bestLoad int64
	ties := 0
	for _, u := range pool {
		if !u.Available() {
			continue
		}
		load := int64(u.Host.NumRequests())
		if rec := s.table.KnownUpstream(u.Dial); rec != nil {
			if rec.Draining() {
				continue
			}
			// A session's open GET stream is a request in flight too:
			// count the session once, not twice.
			// With a shared store, sessions count on every instance.
			load += s.table.ClusterSessions(rec) - min(rec.OpenStreams(), load)
		}
		switch {
		case best == nil || load < bestLoad:
			best, bestLoad, ties = u, load, 1
		case load == bestLoad:
			ties++
			if rand.IntN(ties) == 0 {
				best = u
			}
		}
	}
	return best
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy least_sessions {
//	    table <name>
//	}
//
// It returns a Caddyfile error, naming the line, for an unknown option or a
// missing, extra or repeated argument.
func (s *LeastSessionsSelection) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		if d.Val() != "table" {
			return d.Errf("unrecognized least_sessions option '%s'", d.Val())
		}
		if err := unmarshalTable(d, &s.Table); err != nil {
			return err
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*LeastSessionsSelection)(nil)
	_ reverseproxy.Selector = (*LeastSessionsSelection)(nil)
	_ caddyfile.Unmarshaler = (*LeastSessionsSelection)(nil)
)
