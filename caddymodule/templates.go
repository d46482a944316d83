package caddymodule

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// Placeholder templates: the settings whose value the plugin evaluates per
// request with Caddy's replacer (client_key, bind_principal). Caddy keeps
// no list of placeholder names, and a placeholder it does not know
// evaluates to empty, silently: a client_key that names no placeholder
// Caddy sets makes every client one client. The plugin checks templates
// when a config loads, against what Caddy's http server knows.

// DefaultTemplates returns the placeholder templates the plugin evaluates
// per request unless configured otherwise, keyed by the setting each is
// the default of. Each must expand to a value in a request through Caddy
// (bind_principal's when Caddy authenticates the request).
func DefaultTemplates() map[string]string {
	return map[string]string{
		"client_key":               session.DefaultClientKey,
		"bind_principal":           session.DefaultBindPrincipal,
		"mcp_proxy header_up Host": proxyHostHeader,
	}
}

// templateKeys returns the keys of the placeholders in template, in
// order, as Caddy's replacer reads them: `\{` is no placeholder, nor is a
// brace that is never closed.
func templateKeys(template string) []string {
	var keys []string
	_, _ = caddy.NewEmptyReplacer().ReplaceFunc(template, func(key string, _ any) (any, error) {
		keys = append(keys, key)
		return nil, nil
	})
	return keys
}

// checkHasPlaceholder refuses a template of option that has no
// placeholder: it would evaluate to the same value for every request.
func checkHasPlaceholder(option, v, effect, example string) error {
	if len(templateKeys(v)) > 0 {
		return nil
	}
	return fmt.Errorf("%s %q has no placeholder, so %s; give a placeholder such as %s", option, v, effect, example)
}

// checkClientKey refuses a client_key template without a placeholder:
// every request would be the same client.
func checkClientKey(v string) error {
	return checkHasPlaceholder("client_key", v,
		"every request would be the same client and max_unconfirmed_per_client would cap all clients together",
		"{http.vars.client_ip} or {http.request.header.X-Client-Id}")
}

// requestTimePlaceholders are the placeholders that Caddy's standard HTTP
// modules set while they serve a request, which a made-up request cannot
// show: a name ending in "." stands for every name it begins. Read from
// Caddy v2.11.9 (modules/caddyhttp: repl.Set).
var requestTimePlaceholders = []string{
	"http.auth.",          // authentication: http.auth.user.id, http.auth.user.*, http.auth.<provider>.error
	"http.regexp.",        // the *_regexp matchers' captures
	"http.url_pattern.",   // the url_pattern matcher's groups
	"http.reverse_proxy.", // reverse_proxy: the upstream, its answer, durations
	"http.error",          // error routes
	"http.error.",
	"http.response.status", // set when the response is logged
	"http.response.size",
	"http.response.duration",
	"http.response.duration_ms",
	"http.matchers.file.", // the file matcher
	"http.intercept.",     // the intercept handler
}

// placeholderProbe tells whether Caddy knows a placeholder, by asking the
// replacer that Caddy's http server gives a request, for a request made up
// for the purpose, with this plugin's {mcp.*} placeholders.
type placeholderProbe struct {
	repl *caddy.Replacer
}

// newPlaceholderProbe prepares a made-up request as Caddy's http server
// prepares each request it serves.
func newPlaceholderProbe() placeholderProbe {
	req := &http.Request{
		Method: http.MethodPost, URL: &url.URL{Scheme: "http", Host: "localhost", Path: "/mcp"},
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{}, Host: "localhost",
		RemoteAddr: "127.0.0.1:1", RequestURI: "/mcp",
	}
	local := net.Addr(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80})
	req = req.WithContext(context.WithValue(context.Background(), http.LocalAddrContextKey, local))
	repl := caddy.NewReplacer()
	exchangeOf(caddyhttp.PrepareRequest(req, repl, probeWriter{}, &caddyhttp.Server{})) // adds {mcp.*}
	return placeholderProbe{repl: repl}
}

// knows reports whether key is a placeholder that Caddy's http server, its
// standard modules or this plugin set.
func (p placeholderProbe) knows(key string) bool {
	if strings.HasPrefix(key, "file.") { // read from disk when evaluated
		return true
	}
	for _, name := range requestTimePlaceholders {
		if key == name || strings.HasSuffix(name, ".") && strings.HasPrefix(key, name) {
			return true
		}
	}
	return p.answers(key)
}

// answers reports whether the probe's replacer knows key. A placeholder
// whose evaluation panics on the made-up request is taken to be known.
func (p placeholderProbe) answers(key string) (known bool) {
	defer func() {
		if recover() != nil {
			known = true
		}
	}()
	_, known = p.repl.Get(key)
	return known
}

// unknownPlaceholders returns the placeholders of template, braces
// included, that Caddy does not know (see [placeholderProbe.knows]),
// sorted, each once.
func unknownPlaceholders(template string) []string {
	keys := templateKeys(template)
	if len(keys) == 0 {
		return nil
	}
	p := newPlaceholderProbe()
	seen := map[string]bool{}
	var unknown []string
	for _, k := range keys {
		if !seen[k] && !p.knows(k) {
			unknown = append(unknown, "{"+k+"}")
		}
		seen[k] = true
	}
	sort.Strings(unknown)
	return unknown
}

// warnUnknownPlaceholders logs a warning when template, the value of
// option of table, has placeholders Caddy does not know: they evaluate to
// empty. A module outside Caddy's standard ones (a `map`, a plugin) may set
// them, so the config still loads.
func warnUnknownPlaceholders(logger *zap.Logger, table, option, template string) {
	unknown := unknownPlaceholders(template)
	if len(unknown) == 0 || logger == nil {
		return
	}
	hint := "each evaluates to empty unless a module other than Caddy's standard ones (a map, a plugin) sets it; " +
		"see https://caddyserver.com/docs/conventions#placeholders"
	for _, u := range unknown {
		if full := expandShorthands(u); full != u {
			hint = fmt.Sprintf("%s is a Caddyfile shorthand, which a JSON config must spell %s; %s", u, full, hint)
			break
		}
	}
	if option == "client_key" {
		hint += "; the client's IP address is {http.vars.client_ip}"
	}
	logger.Warn("placeholder template names placeholders Caddy does not set",
		zap.String("table", table), zap.String("option", option), zap.String("template", template),
		zap.Strings("unknown", unknown), zap.String("hint", hint))
}

// expandShorthands replaces the Caddyfile's placeholder shorthands in v
// ({client_ip}, {header.*}, …) by the placeholders they stand for, as the
// Caddyfile adapter does in site blocks (but not in global options).
func expandShorthands(v string) string {
	seg := caddyfile.Segment{{Text: v}}
	httpcaddyfile.NewShorthandReplacer().ApplyToSegment(&seg)
	return seg[0].Text
}

// probeWriter is the response writer of the probe's made-up request, so
// that the replacer knows the response placeholders.
type probeWriter struct{}

func (probeWriter) Header() http.Header         { return http.Header{} }
func (probeWriter) Write(b []byte) (int, error) { return len(b), nil }
func (probeWriter) WriteHeader(int)             {}

// Interface guards
var _ http.ResponseWriter = probeWriter{}

// principalOf evaluates the placeholder template bind for request r: the
// principal a session it opens is bound to, or that must match the
// session's. Placeholders that have no value become empty; "" means none.
func principalOf(r *http.Request, bind string) string {
	if bind == session.BindPrincipalOff {
		return ""
	}
	return placeholderValue(r, bind)
}

// placeholderValue evaluates the placeholder template for request r;
// placeholders without a value become empty, and so does an empty template.
func placeholderValue(r *http.Request, template string) string {
	if template == "" {
		return ""
	}
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return ""
	}
	return repl.ReplaceAll(template, "")
}
