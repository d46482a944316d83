package caddymodule

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

var update = flag.Bool("update", false, "rewrite the expected JSON or error of testdata/caddyfile_adapt/*.caddyfiletest")

// adapt adapts a Caddyfile to JSON.
func adapt(cfg string) ([]byte, []caddyconfig.Warning, error) {
	return caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
}

func TestHandlerUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input string
		want  Handler
	}{
		{input: `mcp_session`},
		{input: `mcp_session {
		}`},
		{input: `mcp_session {
			table                 mcp
			max_sessions          5000
			session_ttl           90m
			max_session_id_length 64
			unknown_session       forward
		}`, want: Handler{
			TableSettings:      TableSettings{MaxSessions: 5000, SessionTTL: caddy.Duration(90 * time.Minute)},
			Table:              "mcp",
			MaxSessionIDLength: 64,
			UnknownSession:     UnknownSessionForward,
		}},
		{input: `mcp_session {
			session_ttl 1d
			unknown_session reject
		}`, want: Handler{TableSettings: TableSettings{SessionTTL: caddy.Duration(24 * time.Hour)}, UnknownSession: UnknownSessionReject}},
		{input: `mcp_session {
			bind_principal {http.request.header.Authorization}
		}`, want: Handler{TableSettings: TableSettings{BindPrincipal: "{http.request.header.Authorization}"}}},
		{input: `mcp_session {
			bind_principal off
		}`, want: Handler{TableSettings: TableSettings{BindPrincipal: session.BindPrincipalOff}}},
		{input: `mcp_session {
			legacy_sse off
		}`, want: Handler{DisableLegacySSE: true}},
		{input: `mcp_session {
			legacy_sse session_id sid
		}`, want: Handler{LegacySSEParams: []string{"session_id", "sid"}}},
	} {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
			t.Errorf("UnmarshalCaddyfile(%s): %v", tc.input, err)
			continue
		}
		if !reflect.DeepEqual(h, tc.want) {
			t.Errorf("UnmarshalCaddyfile(%s) = %+v, want %+v", tc.input, h, tc.want)
		}
	}
}

// TestMCPProxyAdapts covers mcp_proxy blocks that must adapt, checked by a
// fragment of the JSON; the golden files cover whole configurations.
func TestMCPProxyAdapts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		block string // the mcp_proxy block's body
		want  []string
	}{
		{name: "fallback last", block: "lb_retries 0\n\t\tfallback first", want: []string{`"fallback":{"policy":"first"}`, `"load_balancing":{"selection_policy"`}},
		{name: "fallback with options", block: "fallback random_choose 3", want: []string{`"fallback":{"choose":3,"policy":"random_choose"}`}},
		{name: "fallback with an empty block", block: "fallback random {\n\t\t}", want: []string{`"fallback":{"policy":"random"}`}},
		{name: "options only", block: "table t\n\t\tmax_sessions 10", want: []string{`{"handler":"mcp_session","max_sessions":10,"table":"t"}`, `"retries":2`}},
		{name: "unhealthy_grace", block: "unhealthy_grace 5m\n\t\ttable t", want: []string{`"policy":"mcp_session","table":"t","unhealthy_grace":300000000000`, `{"handler":"mcp_session","table":"t"}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ":8080 {\n\tmcp_proxy a {\n\t\t" + tc.block + "\n\t}\n}\n"
			out, _, err := adapt(cfg)
			if err != nil {
				t.Fatalf("adapting:\n%s\n%v", cfg, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("adapted JSON %s does not contain %s", out, w)
				}
			}
		})
	}
}

// TestHealthURIWarning: active health checks that probe the MCP endpoint
// (`/mcp`, or the path of the directive's path matcher) get a warning, since
// MCP servers answer them with 400 or 405; a health endpoint does not.
func TestHealthURIWarning(t *testing.T) {
	for _, tc := range []struct {
		name, matcher, uri string
		warn               bool
	}{
		{name: "/mcp", uri: "/mcp", warn: true},
		{name: "/mcp/", uri: "/mcp/", warn: true},
		{name: "/mcp with a query", uri: "/mcp?probe=1", warn: true},
		{name: "matcher's path", matcher: `["/api/mcp*"]`, uri: "/api/mcp", warn: true},
		{name: "exact matcher path", matcher: `["/rpc"]`, uri: "/rpc", warn: true},
		{name: "/healthz", uri: "/healthz"},
		{name: "/healthz under the matcher", matcher: `["/mcp*"]`, uri: "/mcp-health"},
		{name: "under a wildcard matcher", matcher: `["/api/*"]`, uri: "/api/healthz"},
		{name: "no active checks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rp := &reverseproxy.Handler{}
			if tc.uri != "" {
				rp.HealthChecks = &reverseproxy.HealthChecks{Active: &reverseproxy.ActiveHealthChecks{URI: tc.uri}}
			}
			var m caddy.ModuleMap
			if tc.matcher != "" {
				m = caddy.ModuleMap{"path": json.RawMessage(tc.matcher)}
			}
			got := healthURIWarning(rp, m)
			if (got != "") != tc.warn || tc.warn && !strings.Contains(got, "health_uri "+tc.uri+" is the MCP endpoint") {
				t.Errorf("healthURIWarning(%s, matcher %s) = %q, want a warning: %v", tc.uri, tc.matcher, got, tc.warn)
			}
		})
	}
}

// TestMCPProxyOptionNamesAsArguments checks that the affinity options are
// recognized only as subdirectives of mcp_proxy, not where their names
// appear as arguments of reverse_proxy subdirectives.
func TestMCPProxyOptionNamesAsArguments(t *testing.T) {
	for _, tc := range []struct {
		name string
		line string // a reverse_proxy subdirective
		want string // in the adapted reverse_proxy handler
	}{
		{name: "header value", line: "header_up X-Tier fallback", want: `"X-Tier":["fallback"]`},
		{name: "header replace", line: "header_up X-Table table desk", want: `"replace":"desk","search_regexp":"table"`},
		{name: "upstream host", line: "to table:8080 fallback:8080", want: `"dial":"fallback:8080"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ":8080 {\n\tmcp_proxy a {\n\t\t" + tc.line + "\n\t}\n}\n"
			out, _, err := adapt(cfg)
			if err != nil {
				t.Fatalf("adapting %q: %v", tc.line, err)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("adapting %q gave %s, want it to contain %s", tc.line, out, tc.want)
			}
			if strings.Contains(string(out), `"table":`) || strings.Contains(string(out), `"fallback":`) {
				t.Errorf("adapting %q set an affinity option: %s", tc.line, out)
			}
		})
	}
}

// TestCaddyfileAdapt checks each testdata/caddyfile_adapt/*.caddyfiletest:
// a Caddyfile, a line of ten dashes, and the JSON it must adapt to, or, when
// what follows the dashes is not JSON, the error adapting it must give (the
// convention of Caddy's caddytest/integration/caddyfile_adapt). Run with
// -update to rewrite the JSON and the errors; then read the diff before
// committing it.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "caddyfile_adapt", "*.caddyfiletest"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no golden files")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".caddyfiletest"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			parts := strings.Split(string(data), "----------")
			if len(parts) != 2 {
				t.Fatalf("%s: want one line of ten dashes, found %d", file, len(parts)-1)
			}
			cfg, want := strings.TrimSpace(parts[0])+"\n", strings.TrimSpace(parts[1])

			out, warnings, err := adapt(cfg)
			if !strings.HasPrefix(want, "{") {
				checkAdaptError(t, file, cfg, want, err)
				return
			}
			if err != nil {
				t.Fatalf("adapting: %v", err)
			}
			for _, w := range warnings {
				t.Errorf("warning: %s:%d: %s: %s", w.File, w.Line, w.Directive, w.Message)
			}
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, out, "", "\t"); err != nil {
				t.Fatal(err)
			}
			got := pretty.String()

			if *update {
				if err := os.WriteFile(file, []byte(cfg+"----------\n"+got+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if got != want {
				t.Errorf("%s adapts to:\n%s\n\nwant:\n%s\n\n(run go test -run TestCaddyfileAdapt -update to rewrite, then review the diff)", file, got, want)
			}
		})
	}
}

// checkAdaptError checks a golden file whose Caddyfile must not adapt: the
// error must contain want, and name the Caddyfile's line. With -update it
// rewrites want to the whole error.
func checkAdaptError(t *testing.T, file, cfg, want string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s adapts, want an error containing %q", file, want)
	}
	if *update {
		if err := os.WriteFile(file, []byte(cfg+"----------\n"+err.Error()+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("%s: error %q does not contain %q", file, err, want)
	}
	if !strings.Contains(err.Error(), "Caddyfile:") {
		t.Errorf("%s: error %q does not name the line", file, err)
	}
}

// TestCaddyfileExampleDefaults: the options Caddyfile.example shows
// commented out with their defaults, uncommented as a user would, adapt.
func TestCaddyfileExampleDefaults(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "Caddyfile.example"))
	if err != nil {
		t.Fatal(err)
	}
	option := regexp.MustCompile(`^(\t\t)# ([a-z_]+ +.*?)(\s*\(off by default\))?$`)
	var cfg strings.Builder
	n, inDefaults := 0, false
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSuffix(line, "\n")
		switch m := option.FindStringSubmatch(line); {
		case strings.Contains(line, "defaults shown"):
			inDefaults = true
		case strings.TrimSpace(line) == "":
			inDefaults = false
		case inDefaults && m != nil:
			line, n = m[1]+m[2], n+1
		}
		cfg.WriteString(line + "\n")
	}
	if n < 15 {
		t.Fatalf("found %d commented options under \"defaults shown\" in Caddyfile.example; want every mcp_proxy option", n)
	}
	if _, _, err := adapt(cfg.String()); err != nil {
		t.Errorf("Caddyfile.example with its %d default options uncommented: %v", n, err)
	}
}
