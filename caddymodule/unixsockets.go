package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

func init() {
	caddy.RegisterModule(UnixSocketUpstreams{})
}

// DefaultUnixSocketsRefresh is how long the unix_sockets upstream source
// reuses a directory listing by default.
const DefaultUnixSocketsRefresh = time.Second

// UnixSocketUpstreams is a dynamic upstream source: every unix socket in a
// directory whose name matches a pattern is an upstream, dialed as
// `unix/<path>`. It suits servers that give each worker a socket of its own,
// such as gunicorn with `examples/gunicorn/mcp_affinity_hooks.py`: changing
// the number of workers, or a worker's replacement, needs no Caddy change.
//
// Files that are not sockets are ignored. A socket that disappears leaves
// the pool at the next listing; the `mcp_session` policy then answers its
// sessions' requests with 404 (its upstream is gone). A socket that is
// present but refuses connections counts as a failed dial. Caddy's active
// health checks do not run on dynamic upstreams; passive ones do.
type UnixSocketUpstreams struct {
	// The sockets, as a path whose last element is a pattern in the syntax
	// of Go's filepath.Match (`*`, `?`, `[...]`), e.g.
	// `/run/mcp/worker-*.sock`. The directory part is literal. Required.
	Pattern string `json:"pattern,omitempty"`

	// How long a directory listing is reused. A failed request's retry
	// lists the directory again at once. Default: `1s`.
	Refresh caddy.Duration `json:"refresh,omitempty"`

	dir, glob string
	cache     *socketListing
}

// socketListing is the last directory listing of a source, shared by the
// requests of one config.
type socketListing struct {
	mu    sync.Mutex
	dials []string
	at    time.Time
}

// CaddyModule returns the Caddy module information.
func (UnixSocketUpstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.upstreams.unix_sockets",
		New: func() caddy.Module { return new(UnixSocketUpstreams) },
	}
}

// Provision checks the pattern and fills in defaults.
func (u *UnixSocketUpstreams) Provision(caddy.Context) error {
	if u.Refresh == 0 {
		u.Refresh = caddy.Duration(DefaultUnixSocketsRefresh)
	}
	dir, glob, err := splitSocketPattern(u.Pattern)
	if err != nil {
		return err
	}
	u.dir, u.glob, u.cache = dir, glob, new(socketListing)
	return nil
}

// splitSocketPattern splits pattern into its literal directory and the
// pattern of the file names, or says what is wrong with it.
func splitSocketPattern(pattern string) (dir, glob string, err error) {
	if pattern == "" {
		return "", "", fmt.Errorf("unix_sockets: a pattern is required, such as /run/mcp/*.sock")
	}
	dir, glob = filepath.Split(filepath.Clean(pattern))
	if !filepath.IsAbs(dir) || strings.ContainsAny(dir, `*?[\`) {
		return "", "", fmt.Errorf("unix_sockets: pattern %q: the directory must be an absolute path without wildcards, such as /run/mcp/*.sock", pattern)
	}
	if _, err := filepath.Match(glob, ""); err != nil {
		return "", "", fmt.Errorf("unix_sockets: pattern %q: %v", pattern, err)
	}
	return dir, glob, nil
}

// GetUpstreams returns an upstream for every matching socket, in name order.
// A directory that does not exist yet gives no upstreams, not an error.
func (u *UnixSocketUpstreams) GetUpstreams(*http.Request) ([]*reverseproxy.Upstream, error) {
	dials, err := u.list()
	if err != nil {
		return nil, err
	}
	ups := make([]*reverseproxy.Upstream, len(dials))
	for i, d := range dials {
		ups[i] = &reverseproxy.Upstream{Dial: d}
	}
	return ups, nil
}

// list returns the dial addresses of the matching sockets, from the cache
// while it is fresh.
func (u *UnixSocketUpstreams) list() ([]string, error) {
	c := u.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dials != nil && time.Since(c.at) < time.Duration(u.Refresh) {
		return c.dials, nil
	}
	dials, err := listSockets(u.dir, u.glob)
	if err != nil {
		return nil, err
	}
	c.dials, c.at = dials, time.Now()
	return dials, nil
}

// listSockets returns `unix/<path>` for every socket in dir whose name matches glob.
func listSockets(dir, glob string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return []string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("unix_sockets: listing %s: %v", dir, err)
	}
	dials := []string{}
	for _, e := range entries {
		if ok, _ := filepath.Match(glob, e.Name()); ok && e.Type()&fs.ModeSocket != 0 {
			dials = append(dials, "unix/"+filepath.Join(dir, e.Name()))
		}
	}
	slices.Sort(dials)
	return dials, nil
}

// ResetCache makes the next GetUpstreams list the directory again. Caddy
// calls it before retrying a failed request.
func (u *UnixSocketUpstreams) ResetCache(*http.Request) error {
	u.cache.mu.Lock()
	u.cache.dials = nil
	u.cache.mu.Unlock()
	return nil
}

// UnmarshalCaddyfile sets up the source from Caddyfile tokens. Syntax:
//
//	dynamic unix_sockets <pattern> {
//	    refresh <interval>
//	}
func (u *UnixSocketUpstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume source name
	if !d.NextArg() {
		return d.Err("unix_sockets needs a pattern, such as 'dynamic unix_sockets /run/mcp/*.sock'")
	}
	u.Pattern = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		if d.Val() != "refresh" {
			return d.Errf("unrecognized unix_sockets option '%s'", d.Val())
		}
		if !d.NextArg() {
			return d.ArgErr()
		}
		dur, err := caddy.ParseDuration(d.Val())
		if err != nil || dur <= 0 {
			return d.Errf("refresh: '%s' is not a positive duration such as 1s", d.Val())
		}
		u.Refresh = caddy.Duration(dur)
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	return nil
}

// isUnixSocketsSource reports whether raw, a reverse_proxy's
// dynamic_upstreams, is the unix_sockets source.
func isUnixSocketsSource(raw json.RawMessage) bool {
	var src struct {
		Source string `json:"source"`
	}
	return json.Unmarshal(raw, &src) == nil && src.Source == "unix_sockets"
}

// adjustForSocketSource changes two defaults of an mcp_proxy whose upstreams
// come from the unix_sockets source, unless its block sets them (used):
// `fail_duration 0`, because a socket outlives its workers (a failure of a
// worker being replaced says nothing of the next one, and would keep every
// new session off the slot for the fail duration), and `keepalive off`,
// because a worker being replaced closes its idle connections under the
// proxy, failing the requests the proxy sends on them at that moment.
func adjustForSocketSource(rp *reverseproxy.Handler, used map[string]bool) {
	if rp.DynamicUpstreamsRaw == nil || !isUnixSocketsSource(rp.DynamicUpstreamsRaw) {
		return
	}
	if !used["fail_duration"] && rp.HealthChecks != nil && rp.HealthChecks.Passive != nil {
		rp.HealthChecks.Passive.FailDuration = 0
		if reflect.ValueOf(*rp.HealthChecks.Passive).IsZero() {
			rp.HealthChecks.Passive = nil
		}
		if reflect.ValueOf(*rp.HealthChecks).IsZero() {
			rp.HealthChecks = nil
		}
	}
	if !used["transport"] && rp.TransportRaw == nil {
		off := false
		rp.TransportRaw = caddyconfig.JSONModuleObject(&reverseproxy.HTTPTransport{KeepAlive: &reverseproxy.KeepAlive{Enabled: &off}},
			"protocol", "http", nil)
	}
}

// Interface guards
var (
	_ caddy.Provisioner                  = (*UnixSocketUpstreams)(nil)
	_ reverseproxy.CachingUpstreamSource = (*UnixSocketUpstreams)(nil)
	_ caddyfile.Unmarshaler              = (*UnixSocketUpstreams)(nil)
)
