package caddymodule

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestProxyCommandAdaptsLikeItsCaddyfile checks that `caddy mcp-proxy`
// runs the config of the Caddyfile a user would write for the same flags:
// the JSON of what the command builds equals the JSON of that hand-written
// Caddyfile.
func TestProxyCommandAdaptsLikeItsCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		name      string
		flags     proxyFlags
		caddyfile string
	}{{
		name:  "defaults",
		flags: proxyFlags{from: defaultProxyFrom, to: []string{"127.0.0.1:9001", "127.0.0.1:9002"}, admin: "localhost:2019"},
		caddyfile: `{
	admin localhost:2019
	persist_config off
}
http://:8000 {
	bind localhost
	handle /mcp-status {
		mcp_status
	}
	handle {
		mcp_proxy 127.0.0.1:9001 127.0.0.1:9002
	}
}`,
	}, {
		name: "every option",
		flags: proxyFlags{from: "127.0.0.1:8123", to: []string{"127.0.0.1:9001-9003", "unix//run/mcp.sock"},
			failover: true, redis: []string{"10.0.0.1:6379", "10.0.0.2:6379"}, hashKey: "{file./run/secrets/hash}",
			sealKey: "{env.MCP_SEAL_KEY}", status: "off", admin: "127.0.0.1:2999", accessLog: true, debug: true},
		caddyfile: `{
	debug
	admin 127.0.0.1:2999
	persist_config off
	mcp_sessions {
		store redis {
			address 10.0.0.1:6379 10.0.0.2:6379
			hash_key {file./run/secrets/hash}
		}
	}
}
http://:8123 {
	bind 127.0.0.1
	log {
		format filter {
			request>headers>Mcp-Session-Id delete
			resp_headers>Mcp-Session-Id delete
		}
	}
	mcp_proxy 127.0.0.1:9001-9003 unix//run/mcp.sock {
		seal_session_ids {env.MCP_SEAL_KEY}
		failover reinitialize
	}
}`,
	}, {
		name:  "gunicorn sockets",
		flags: proxyFlags{from: ":8000", to: []string{"unix//run/mcp/worker-*.sock"}, status: "/ops/status", admin: "off"},
		caddyfile: `{
	admin off
	persist_config off
}
http://:8000 {
	handle /ops/status {
		mcp_status
	}
	handle {
		mcp_proxy {
			dynamic unix_sockets /run/mcp/worker-*.sock
		}
	}
}`,
	}, {
		name: "handles, shared through redis",
		flags: proxyFlags{from: "127.0.0.1:8000", to: []string{"127.0.0.1:9001", "127.0.0.1:9002"}, admin: "localhost:2019", status: "off",
			redis: []string{"10.0.0.1:6379"}, hashKey: "{env.K}",
			handles: []HandleRule{{Tool: "open_browser", From: "/browser_id", Header: "Mcp-Param-Browser"}, {Tool: "db_*", From: "text", Header: "Mcp-Param-Cursor"}}},
		caddyfile: `{
	admin localhost:2019
	persist_config off
	mcp_sessions {
		store redis {
			address 10.0.0.1:6379
			hash_key {env.K}
		}
	}
	mcp_sessions default_handles {
		store redis {
			address 10.0.0.1:6379
			hash_key {env.K}
		}
	}
}
http://:8000 {
	bind 127.0.0.1
	mcp_proxy 127.0.0.1:9001 127.0.0.1:9002 {
		handle open_browser /browser_id Mcp-Param-Browser
		handle db_* text Mcp-Param-Cursor
	}
}`,
	}, {
		name:  "https",
		flags: proxyFlags{from: "https://mcp.example.com", to: []string{"127.0.0.1:9001"}, admin: "localhost:2019"},
		caddyfile: `{
	admin localhost:2019
	persist_config off
}
https://mcp.example.com {
	mcp_proxy 127.0.0.1:9001
}`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.flags.check(); err != nil {
				t.Fatal(err)
			}
			site, err := tc.flags.site()
			if err != nil {
				t.Fatal(err)
			}
			built, err := tc.flags.caddyfile(site)
			if err != nil {
				t.Fatal(err)
			}
			got := adaptedJSON(t, built)
			want := adaptedJSON(t, tc.caddyfile)
			if got != want {
				t.Fatalf("the command's config differs from the Caddyfile's.\ncommand's Caddyfile:\n%s\ncommand JSON:\n%s\nCaddyfile JSON:\n%s", built, got, want)
			}
		})
	}
}

// adaptedJSON adapts a Caddyfile and returns its JSON, indented.
func adaptedJSON(t *testing.T, cfg string) string {
	t.Helper()
	out, err := adaptCaddyfile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := json.Indent(&b, out, "", "  "); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestProxyCommandRefusesBadFlags checks that flags that cannot run get an
// error naming the flag and the way out, and never reach the Caddyfile.
func TestProxyCommandRefusesBadFlags(t *testing.T) {
	base := func() proxyFlags {
		return proxyFlags{from: defaultProxyFrom, to: []string{"127.0.0.1:9001"}, admin: "localhost:2019"}
	}
	for _, tc := range []struct {
		name string
		edit func(*proxyFlags)
		want string
	}{
		{"no upstream", func(f *proxyFlags) { f.to = nil }, "--to is required"},
		{"an upstream twice", func(f *proxyFlags) { f.to = []string{"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9001"} }, "--to 127.0.0.1:9001 is given twice"},
		{"a space would add an option", func(f *proxyFlags) { f.to = []string{"127.0.0.1:9001 {"} }, `invalid --to "127.0.0.1:9001 {"`},
		{"a newline would add a directive", func(f *proxyFlags) { f.sealKey = "k\n}\nrespond 200" }, "invalid --seal-key"},
		{"a brace token", func(f *proxyFlags) { f.redis = []string{"}"} }, "invalid --redis"},
		{"a brace ending an address", func(f *proxyFlags) { f.to = []string{"127.0.0.1:9001}"} }, "must not contain braces"},
		{"a brace inside", func(f *proxyFlags) { f.to = []string{"a{b"} }, "must not contain braces"},
		{"a key that is not a placeholder", func(f *proxyFlags) { f.sealKey = "{env.K}x" }, "must not contain braces"},
		{"a comment", func(f *proxyFlags) { f.admin = "#x" }, "invalid --admin"},
		{"a path", func(f *proxyFlags) { f.from = "localhost:8000/mcp" }, "paths are not allowed"},
		{"two patterns", func(f *proxyFlags) { f.to = []string{"unix//a/*.sock", "unix//b/*.sock"} }, "only one socket pattern"},
		{"pattern and fixed", func(f *proxyFlags) { f.to = []string{"unix//a/*.sock", "127.0.0.1:9001"} }, "cannot be mixed"},
		{"a status page that is no path", func(f *proxyFlags) { f.status = "status" }, "give a path such as /mcp-status"},
		{"a status page over the MCP endpoint", func(f *proxyFlags) { f.status = "/mcp" }, "would hide the MCP endpoint"},
		{"a status page over every path", func(f *proxyFlags) { f.status = "/" }, "would hide the MCP endpoint"},
		{"an upstream without a port", func(f *proxyFlags) { f.to = []string{"19101"} }, "give host:port"},
		{"an upstream on port 0", func(f *proxyFlags) { f.to = []string{"127.0.0.1:0"} }, "port 0"},
		{"listening on port 0", func(f *proxyFlags) { f.from = "127.0.0.1:0" }, "give the port to listen on"},
		{"listening on a socket", func(f *proxyFlags) { f.from = "unix//tmp/x.sock" }, "listens on TCP"},
		{"a hash key without redis", func(f *proxyFlags) { f.hashKey = "{env.K}" }, "give --redis too"},
		{"redis without a hash key", func(f *proxyFlags) { f.redis = []string{"127.0.0.1:6379"}; t.Setenv(hashKeyEnv, "") }, "export MCP_SESSIONS_HASH_KEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := base()
			tc.edit(&f)
			err := f.check()
			if err == nil {
				var site proxySite
				if site, err = f.site(); err == nil {
					_, err = f.caddyfile(site)
				}
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got %v", tc.want, err)
			}
		})
	}
}

// TestProxyCommandHandleFlag: --handle takes one rule per value, checked
// as the Caddyfile's handle option is.
func TestProxyCommandHandleFlag(t *testing.T) {
	if rule, err := parseHandleFlag("open_counter /handle Mcp-Param-Handle"); err != nil || rule != (HandleRule{Tool: "open_counter", From: "/handle", Header: "Mcp-Param-Handle"}) {
		t.Errorf("a rule: %+v, %v", rule, err)
	}
	for v, want := range map[string]string{
		"open_counter /handle":                 "in one argument",
		"open_counter handle Mcp-Param-Handle": "neither a JSON pointer",
		"open_counter /handle X-Handle":        "must be Mcp-Param-",
		"open_counter /handle Mcp-Param-H {":   "in one argument",
		"open_counter /a{b} Mcp-Param-Handle":  "invalid --handle",
	} {
		if _, err := parseHandleFlag(v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--handle %q: %v, want %q", v, err, want)
		}
	}
}
