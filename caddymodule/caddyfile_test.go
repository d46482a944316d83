package caddymodule

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

var update = flag.Bool("update", false, "rewrite the expected JSON of testdata/caddyfile_adapt/*.caddyfiletest")

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
			Table:              "mcp",
			MaxSessions:        5000,
			SessionTTL:         caddy.Duration(90 * time.Minute),
			MaxSessionIDLength: 64,
			UnknownSession:     UnknownSessionForward,
		}},
		{input: `mcp_session {
			session_ttl 1d
			unknown_session reject
		}`, want: Handler{SessionTTL: caddy.Duration(24 * time.Hour), UnknownSession: UnknownSessionReject}},
	} {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
			t.Errorf("UnmarshalCaddyfile(%s): %v", tc.input, err)
			continue
		}
		if h != tc.want {
			t.Errorf("UnmarshalCaddyfile(%s) = %+v, want %+v", tc.input, h, tc.want)
		}
	}
}

// TestUnmarshalCaddyfileErrors lists inputs that must fail, and what their
// error must say. The golden adapt tests can only show that valid input
// adapts, not that bad input fails.
func TestUnmarshalCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input string // the handler's or the policy's tokens
		// policy: parse with SessionSelection.UnmarshalCaddyfile instead of Handler's.
		policy bool
		want   string
	}{
		{name: "extra argument", input: `mcp_session extra`, want: "wrong argument count or unexpected line ending after 'extra'"},
		{name: "unknown option", input: "mcp_session {\n bogus 1\n}", want: "unrecognized mcp_session option 'bogus'"},
		{name: "fallback in the handler", input: "mcp_session {\n fallback random\n}", want: "unrecognized mcp_session option 'fallback'"},
		{name: "duplicate table", input: "mcp_session {\n table a\n table b\n}", want: "duplicate option 'table'"},
		{name: "duplicate ttl", input: "mcp_session {\n session_ttl 1h\n session_ttl 2h\n}", want: "duplicate option 'session_ttl'"},
		{name: "table without name", input: "mcp_session {\n table\n}", want: "after 'table'"},
		{name: "table with two names", input: "mcp_session {\n table a b\n}", want: "after 'b'"},
		{name: "table with a block", input: "mcp_session {\n table {\n }\n}", want: "after 'table'"},
		{name: "bad duration", input: "mcp_session {\n session_ttl soon\n}", want: "session_ttl: 'soon' is not a positive duration such as 30m or 24h"},
		{name: "zero ttl", input: "mcp_session {\n session_ttl 0\n}", want: "session_ttl: '0' is not a positive duration"},
		{name: "zero ttl with unit", input: "mcp_session {\n session_ttl 0s\n}", want: "session_ttl: '0s' is not a positive duration"},
		{name: "negative ttl", input: "mcp_session {\n session_ttl -5m\n}", want: "session_ttl: '-5m' is not a positive duration"},
		{name: "ttl below the minimum", input: "mcp_session {\n session_ttl 1ns\n}", want: "session_ttl: '1ns' is below the minimum of 1s"},
		{name: "ttl just below the minimum", input: "mcp_session {\n session_ttl 999ms\n}", want: "session_ttl: '999ms' is below the minimum of 1s"},
		{name: "max_sessions -1", input: "mcp_session {\n max_sessions -1\n}", want: "max_sessions: '-1' is not a positive whole number"},
		{name: "max_sessions 0", input: "mcp_session {\n max_sessions 0\n}", want: "max_sessions: '0' is not a positive whole number"},
		{name: "max_sessions abc", input: "mcp_session {\n max_sessions abc\n}", want: "max_sessions: 'abc' is not a positive whole number"},
		{name: "max_sessions 1.5", input: "mcp_session {\n max_sessions 1.5\n}", want: "max_sessions: '1.5' is not a positive whole number"},
		{name: "max_sessions 10k", input: "mcp_session {\n max_sessions 10k\n}", want: "max_sessions: '10k' is not a positive whole number"},
		{name: "max_session_id_length 0", input: "mcp_session {\n max_session_id_length 0\n}", want: "max_session_id_length: '0' is not a positive whole number"},
		{name: "unknown_session maybe", input: "mcp_session {\n unknown_session maybe\n}", want: "unknown_session: 'maybe' must be 'reject' or 'forward'"},
		{name: "unknown_session in caps", input: "mcp_session {\n unknown_session Reject\n}", want: "must be 'reject' or 'forward'"},

		{name: "policy: extra argument", policy: true, input: `mcp_session least_conn`, want: "after 'least_conn'"},
		{name: "policy: unknown option", policy: true, input: "mcp_session {\n tabel a\n}", want: "unrecognized mcp_session policy option 'tabel'"},
		{name: "policy: fallback without policy", policy: true, input: "mcp_session {\n fallback\n}", want: "fallback needs a selection policy name"},
		{name: "policy: fallback itself", policy: true, input: "mcp_session {\n fallback mcp_session\n}", want: "the fallback policy cannot be mcp_session itself"},
		{name: "policy: duplicate fallback", policy: true, input: "mcp_session {\n fallback random\n fallback first\n}", want: "fallback selection policy already specified"},
		{name: "policy: unknown fallback", policy: true, input: "mcp_session {\n fallback nonexistent\n}", want: "module not registered: http.reverse_proxy.selection_policies.nonexistent"},
		{name: "policy: fallback with a bad option", policy: true, input: "mcp_session {\n fallback random_choose x\n}", want: "invalid choice value 'x'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := caddyfile.NewTestDispenser(tc.input)
			var err error
			if tc.policy {
				err = new(SessionSelection).UnmarshalCaddyfile(d)
			} else {
				err = new(Handler).UnmarshalCaddyfile(d)
			}
			if err == nil {
				t.Fatalf("UnmarshalCaddyfile succeeded, want an error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// TestAdaptErrors feeds whole Caddyfiles to the adapter: the mcp_proxy
// directive, and the other two where Caddy's parsers surround them.
func TestAdaptErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		site string // the site block's body
		want string
	}{
		{name: "lb_policy in mcp_proxy", site: "mcp_proxy a {\n\tlb_policy random\n}", want: "use 'fallback <policy>' to choose how new sessions are balanced"},
		{name: "lb_policy mcp_session in mcp_proxy", site: "mcp_proxy a {\n\tlb_policy mcp_session\n}", want: "'fallback <policy>'"},
		{name: "fallback without policy", site: "mcp_proxy a {\n\tfallback\n}", want: "fallback needs a selection policy name"},
		{name: "fallback mcp_session", site: "mcp_proxy a {\n\tfallback mcp_session\n}", want: "the fallback policy cannot be mcp_session itself"},
		{name: "fallback unknown", site: "mcp_proxy a {\n\tfallback nonexistent\n}", want: "module not registered: http.reverse_proxy.selection_policies.nonexistent"},
		{name: "fallback extra argument", site: "mcp_proxy a {\n\tfallback first extra\n}", want: "after 'extra'"},
		{name: "duplicate fallback", site: "mcp_proxy a {\n\tfallback random\n\tfallback first\n}", want: "fallback selection policy already specified"},
		{name: "duplicate option", site: "mcp_proxy a {\n\ttable x\n\ttable y\n}", want: "duplicate option 'table'"},
		{name: "bad duration", site: "mcp_proxy a {\n\tsession_ttl soon\n}", want: "session_ttl: 'soon' is not a positive duration such as 30m or 24h"},
		{name: "session_ttl 0", site: "mcp_proxy a {\n\tsession_ttl 0\n}", want: "session_ttl: '0' is not a positive duration"},
		{name: "max_sessions -1", site: "mcp_proxy a {\n\tmax_sessions -1\n}", want: "max_sessions: '-1' is not a positive whole number"},
		{name: "max_sessions abc", site: "mcp_proxy a {\n\tmax_sessions abc\n}", want: "max_sessions: 'abc' is not a positive whole number"},
		{name: "unknown_session maybe", site: "mcp_proxy a {\n\tunknown_session maybe\n}", want: "unknown_session: 'maybe' must be 'reject' or 'forward'"},
		{name: "option with extra argument", site: "mcp_proxy a {\n\ttable a b\n}", want: "after 'b'"},
		{name: "unknown option", site: "mcp_proxy a {\n\tbogus 1\n}", want: "unrecognized subdirective bogus"},
		{name: "line and directive named", site: "mcp_proxy a {\n\tmax_sessions abc\n}", want: "parsing caddyfile tokens for 'mcp_proxy'"},
		{name: "mcp_session extra argument", site: "mcp_session a", want: "after 'a'"},
		{name: "mcp_session unknown option", site: "mcp_session {\n\tbogus\n}", want: "unrecognized mcp_session option 'bogus'"},
		{name: "lb_policy mcp_session unknown option", site: "reverse_proxy a {\n\tlb_policy mcp_session {\n\t\tbogus\n\t}\n}", want: "unrecognized mcp_session policy option 'bogus'"},
		{name: "lb_policy mcp_session fallback without policy", site: "reverse_proxy a {\n\tlb_policy mcp_session {\n\t\tfallback\n\t}\n}", want: "fallback needs a selection policy name"},
		{name: "lb_policy mcp_session fallback itself", site: "reverse_proxy a {\n\tlb_policy mcp_session {\n\t\tfallback mcp_session\n\t}\n}", want: "cannot be mcp_session itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ":8080 {\n" + tc.site + "\n}\n"
			_, _, err := adapt(cfg)
			if err == nil {
				t.Fatalf("adapting succeeded, want an error containing %q:\n%s", tc.want, cfg)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "Caddyfile:") {
				t.Errorf("error %q does not name the line", err)
			}
		})
	}
}

// TestAppOptionErrors feeds the mcp_sessions global option bad input.
func TestAppOptionErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		global string // the global options block's body
		want   string
	}{
		{name: "two names", global: "mcp_sessions a b", want: "after 'b'"},
		{name: "unknown option", global: "mcp_sessions {\n\tbogus 1\n}", want: "unrecognized mcp_sessions option 'bogus'"},
		{name: "handler option", global: "mcp_sessions {\n\tunknown_session forward\n}", want: "unrecognized mcp_sessions option 'unknown_session'"},
		{name: "table twice", global: "mcp_sessions {\n}\nmcp_sessions default {\n}", want: "session table 'default' is configured twice"},
		{name: "bad max_sessions", global: "mcp_sessions {\n\tmax_sessions abc\n}", want: "max_sessions: 'abc' is not a positive whole number"},
		{name: "duplicate option", global: "mcp_sessions {\n\tsession_ttl 1h\n\tsession_ttl 2h\n}", want: "duplicate option 'session_ttl'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := "{\n" + tc.global + "\n}\n:8080 {\n\tmcp_proxy a\n}\n"
			_, _, err := adapt(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("adapting %q: err = %v, want one containing %q", cfg, err, tc.want)
			}
		})
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
// a Caddyfile, a line of ten dashes, and the JSON it must adapt to, in the
// format of Caddy's caddytest/integration/caddyfile_adapt. Run with -update
// to rewrite the JSON; then read the diff before committing it.
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
