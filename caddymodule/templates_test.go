package caddymodule

import (
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// servedReplacer sends one real request over TCP to a net/http server
// whose handler prepares it as Caddy's http server prepares every request
// (caddyhttp.PrepareRequest: the replacer, the request variables, the
// client IP), with the plugin's {mcp.*} placeholders, and calls inspect
// with it while it is served.
func servedReplacer(t *testing.T, inspect func(r *http.Request, repl *caddy.Replacer)) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		repl := caddy.NewReplacer()
		r = caddyhttp.PrepareRequest(r, repl, w, &caddyhttp.Server{})
		exchangeOf(r)
		inspect(r, repl)
	}))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/mcp?x=1", "application/json", strings.NewReader(testInitBody))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// TestPlaceholderCheckAgreesWithCaddy: the check that warns of unknown
// placeholders at load (placeholderProbe, on a request it makes up) knows
// a placeholder exactly when the replacer of a real request served as
// Caddy serves it does: every fixed name and prefix of caddyhttp's
// replacer (v2.11.9 replacer.go), the global ones, the plugin's {mcp.*},
// and typos such as the old default {http.request.client_ip}.
func TestPlaceholderCheckAgreesWithCaddy(t *testing.T) {
	known := []string{
		"http.request.method", "http.request.scheme", "http.request.proto", "http.request.proto_name",
		"http.request.host", "http.request.port", "http.request.hostport",
		"http.request.local", "http.request.local.host", "http.request.local.port",
		"http.request.remote", "http.request.remote.host", "http.request.remote.port", "http.request.remote.host/24",
		"http.request.uri", "http.request.uri_escaped", "http.request.uri.path", "http.request.uri.path_escaped",
		"http.request.uri.path.file", "http.request.uri.path.dir", "http.request.uri.path.file.base",
		"http.request.uri.path.file.ext", "http.request.uri.query", "http.request.uri.query_escaped",
		"http.request.uri.prefixed_query", "http.request.uri.query.x", "http.request.uri.path.0",
		"http.request.duration", "http.request.duration_ms", "http.request.uuid",
		"http.request.body", "http.request.body_base64",
		"http.request.orig_method", "http.request.orig_uri", "http.request.orig_uri.path",
		"http.request.orig_uri.path.file", "http.request.orig_uri.path.file_escaped", "http.request.orig_uri.path.dir",
		"http.request.orig_uri.query", "http.request.orig_uri.prefixed_query", "http.request.orig_uri.path.0",
		"http.request.header.X-Client", "http.request.cookie.sid", "http.request.host.labels.0",
		"http.request.tls.version", "http.request.tls.client.fingerprint", "http.request.tls.client.san.dns_names.0",
		"http.response.header.Content-Type", "http.vars.client_ip", "http.vars.anything",
		"http.shutting_down", "http.time_until_shutdown",
		"env.HOME", "system.hostname", "time.now.unix",
	}
	known = append(known, "mcp.host_for_upstream")
	for _, k := range placeholderKeys { // placeholders_test.go
		known = append(known, "mcp."+k)
	}
	unknown := []string{
		"http.request.client_ip", "client_ip", "remote_host", "http.request.remote_host", "http.request.ip",
		"http.request.uri.path.x", "http.request.host.labels.x", "http.request.tls.nonsense",
		"http.request.tls.client.nonsense", "http.vars", "mcp.nonsense", "mcp", "env", "header.X-Client",
	}
	p := newPlaceholderProbe()
	servedReplacer(t, func(r *http.Request, repl *caddy.Replacer) {
		for _, keys := range [][]string{known, unknown} {
			for _, k := range keys {
				_, real := repl.Get(k)
				if checked := p.knows(k); checked != real {
					t.Errorf("{%s}: the load-time check says known=%v, the replacer of a real request %v", k, checked, real)
				}
				if want := slices.Contains(known, k); real != want {
					t.Errorf("{%s}: the replacer of a real request says known=%v, want %v (Caddy changed?)", k, real, want)
				}
			}
		}
	})
}

// TestDefaultTemplatesExpand: every placeholder template the plugin
// evaluates by default is known to the load-time check and, where the
// request has what it names, expands to a value in a real request: the
// default client_key to the client's IP address. The old default,
// {http.request.client_ip}, is no placeholder and expanded to nothing, so
// that every client was one client and max_unconfirmed_per_client capped
// no one. (bind_principal's default is set by Caddy's authentication and
// {mcp.host_for_upstream} by reverse_proxy; tests/ expands them through
// Caddy.)
func TestDefaultTemplatesExpand(t *testing.T) {
	for option, tmpl := range DefaultTemplates() {
		if u := unknownPlaceholders(tmpl); len(u) != 0 {
			t.Errorf("default %s %s: placeholders unknown to Caddy: %v", option, tmpl, u)
		}
	}
	servedReplacer(t, func(r *http.Request, _ *caddy.Replacer) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if got := placeholderValue(r, session.DefaultClientKey); got != host {
			t.Errorf("default client_key %s expands to %q for a request from %s; want the client's IP address", session.DefaultClientKey, got, r.RemoteAddr)
		}
	})
}

// TestUnknownPlaceholderWarning: when a config loads, a table's client_key
// or bind_principal naming a placeholder Caddy does not set is logged as a
// warning that names the table, the option and the placeholder, and says
// what to write instead; known templates, the plugin's own placeholders
// and `off` are not.
func TestUnknownPlaceholderWarning(t *testing.T) {
	base := "templates/" + t.Name() + "/"
	a := &App{Tables: map[string]*TableConfig{
		base + "typo":      {TableSettings: TableSettings{MaxUnconfirmedPerClient: 5, ClientKey: "{http.request.client_ip}"}},
		base + "shorthand": {TableSettings: TableSettings{BindPrincipal: "{header.X-User}"}},
		base + "mapped":    {TableSettings: TableSettings{ClientKey: "ip={my_map_output}"}},
		base + "known": {TableSettings: TableSettings{MaxUnconfirmedPerClient: 5, ClientKey: "{http.request.header.X-Client}/{mcp.method}/{http.vars.client_ip}",
			BindPrincipal: "{http.auth.user.id}{http.request.tls.client.fingerprint}"}},
		base + "off":     {TableSettings: TableSettings{BindPrincipal: session.BindPrincipalOff}},
		base + "default": {},
	}}
	ctx := newContext(t)
	if err := a.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Cleanup() })
	core, logs := observer.New(zap.WarnLevel)
	a.logger = zap.New(core)
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct{ option, unknown, hint string }{
		base + "typo":      {"client_key", "{http.request.client_ip}", "{http.vars.client_ip}"},
		base + "shorthand": {"bind_principal", "{header.X-User}", "{http.request.header.X-User}"},
		base + "mapped":    {"client_key", "{my_map_output}", "a map, a plugin"},
	}
	got := map[string]bool{}
	for _, e := range logs.All() {
		f := e.ContextMap()
		table, _ := f["table"].(string)
		w, ok := want[table]
		got[table] = true
		if !ok {
			t.Errorf("warning for table %s: %s %v", table, e.Message, f)
			continue
		}
		unknown, _ := f["unknown"].([]any)
		if f["option"] != w.option || len(unknown) != 1 || unknown[0] != w.unknown || !strings.Contains(f["hint"].(string), w.hint) {
			t.Errorf("warning for table %s: %v; want option %s, unknown [%s], a hint naming %s", table, f, w.option, w.unknown, w.hint)
		}
	}
	for table := range want {
		if !got[table] {
			t.Errorf("no warning for table %s", table)
		}
	}
}

// TestClientKeyWithoutPlaceholder: a client_key without a placeholder
// would make every request one client: it fails to load, saying what to
// write instead, as a bind_principal without one does.
func TestClientKeyWithoutPlaceholder(t *testing.T) {
	for _, v := range []string{"everyone", `\{http.vars.client_ip\}`, "{unclosed"} {
		err := TableConfig{TableSettings: TableSettings{MaxUnconfirmedPerClient: 5, ClientKey: v}}.validate("t")
		if err == nil || !strings.Contains(err.Error(), "has no placeholder") || !strings.Contains(err.Error(), "{http.vars.client_ip}") {
			t.Errorf("client_key %q: %v; want an error saying it has no placeholder and naming {http.vars.client_ip}", v, err)
		}
	}
	if err := (TableConfig{TableSettings: TableSettings{ClientKey: "{http.request.header.X-Client}"}}).validate("t"); err != nil {
		t.Errorf("client_key with a placeholder: %v", err)
	}
}

// TestExpandShorthands: the Caddyfile's placeholder shorthands, which the
// adapter expands in site blocks only, are expanded in the mcp_sessions
// global option too.
func TestExpandShorthands(t *testing.T) {
	for in, want := range map[string]string{
		"{client_ip}":               "{http.vars.client_ip}",
		"{header.X-User}":           "{http.request.header.X-User}",
		"{remote_host}/{cookie.id}": "{http.request.remote.host}/{http.request.cookie.id}",
		"{http.auth.user.id}":       "{http.auth.user.id}",
		"off":                       "off",
		"":                          "",
	} {
		if got := expandShorthands(in); got != want {
			t.Errorf("expandShorthands(%q) = %q, want %q", in, got, want)
		}
	}
}
