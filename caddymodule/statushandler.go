package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(StatusPage{})
	httpcaddyfile.RegisterHandlerDirective("mcp_status", parseMCPStatus)
	httpcaddyfile.RegisterDirectiveOrder("mcp_status", httpcaddyfile.After, "metrics")
}

// StatusPage serves the session tables' status page on a site route: every
// table's sessions and bounds, and per upstream its live sessions, health,
// drain state and refusals, with the failovers, evictions and the split of
// requests by protocol era of the last minutes. It is the page the admin
// endpoint serves at /mcp_sessions/status; put it behind Caddy's own
// authentication (basic_auth, forward_auth). It shows no session ID. It is
// read-only and answers GET and HEAD, unless Controls adds the drain and
// undrain buttons, which POST to the page itself; other methods get 405.
//
// The page reloads itself every Refresh; a `?refresh=off` or
// `?refresh=<seconds>` query overrides that per view.
type StatusPage struct {
	// Refresh is how often the page reloads itself (a meta refresh); a
	// negative value turns it off. Default: 5s.
	Refresh caddy.Duration `json:"refresh,omitempty"`

	// Controls adds a drain and an undrain button per upstream, as the admin
	// API's drain and undrain (with an optional deadline). Anyone who can
	// load the page can then drain upstreams: only with authentication in
	// front. The buttons' POSTs are accepted only from the page itself (its
	// Origin), never from another site. Default: off, the page is
	// read-only.
	Controls bool `json:"controls,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (StatusPage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.mcp_status",
		New: func() caddy.Module { return new(StatusPage) },
	}
}

// Provision starts sampling the tables' counters for the page's recent
// figures.
func (p *StatusPage) Provision(caddy.Context) error {
	recentActivity.run()
	return nil
}

// refresh returns the page's default refresh: 0 for none.
func (p *StatusPage) refresh() time.Duration {
	switch {
	case p.Refresh < 0:
		return 0
	case p.Refresh == 0:
		return DefaultStatusRefresh
	}
	return time.Duration(p.Refresh)
}

// ServeHTTP serves the page; it never calls next.
func (p *StatusPage) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if rebinding(r) {
		// The page names the upstreams: a page of another site must not read
		// it through a DNS name rebound to this loopback listener.
		http.Error(w, fmt.Sprintf("Forbidden: invalid Host header %q: this status page listens on loopback and "+
			"serves only localhost names (DNS rebinding protection)", r.Host), http.StatusForbidden)
		return nil
	}
	switch {
	case r.Method == http.MethodGet || r.Method == http.MethodHead:
		opts := statusOptions{refresh: statusRefresh(r.URL.Query(), p.refresh())}
		if p.Controls {
			opts.action = r.URL.Path
		}
		return writeStatusPage(w, opts)
	case r.Method == http.MethodPost && p.Controls:
		if err := statusAction(w, r); err != nil {
			var apiErr caddy.APIError
			if !errors.As(err, &apiErr) {
				return err
			}
			http.Error(w, apiErr.Message, apiErr.HTTPStatus)
		}
		return nil
	}
	allow := "GET, HEAD"
	if p.Controls {
		allow += ", POST"
	}
	w.Header().Set("Allow", allow)
	return caddyhttp.Error(http.StatusMethodNotAllowed, nil)
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens:
//
//	mcp_status [<matcher>] {
//		refresh <duration>|off
//		controls
//	}
func (p *StatusPage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "refresh":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if p.Refresh != 0 {
				return d.Err("refresh already specified")
			}
			if d.Val() == "off" {
				p.Refresh = -1
			} else {
				v, err := caddy.ParseDuration(d.Val())
				if err != nil || v < time.Second {
					return d.Errf("invalid refresh %q: give a duration of 1s or more, such as 5s, or off", d.Val())
				}
				p.Refresh = caddy.Duration(v)
			}
			if d.NextArg() {
				return d.ArgErr()
			}
		case "controls":
			if d.NextArg() {
				return d.ArgErr()
			}
			if p.Controls {
				return d.Err("controls already specified")
			}
			p.Controls = true
		default:
			return d.Errf("unrecognized mcp_status option %q; the options are refresh and controls", d.Val())
		}
	}
	return nil
}

// parseMCPStatus parses the mcp_status directive.
func parseMCPStatus(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	p := new(StatusPage)
	err := p.UnmarshalCaddyfile(h.Dispenser)
	return p, err
}

// Interface guards
var (
	_ caddy.Provisioner           = (*StatusPage)(nil)
	_ caddyhttp.MiddlewareHandler = (*StatusPage)(nil)
	_ caddyfile.Unmarshaler       = (*StatusPage)(nil)
)
