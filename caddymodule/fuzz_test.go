package caddymodule

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Native fuzz tests of the plugin's parsers of untrusted input. Their seed
// corpora run as ordinary tests; CONTRIBUTING.md says how to fuzz
// longer. FuzzOpenSealed and FuzzOpenTampered (sealed_test.go) fuzz sealed
// session IDs.

// FuzzParseRPC feeds arbitrary bodies to the JSON-RPC parser that the mcp
// matcher and initialize_timeout read requests with: it must never panic,
// and whatever it accepts, encoding/json (as mcp-go decodes it) must read
// the same method, id and params.name: a body the proxy routes as one call
// cannot reach the server as another. FuzzLooseKeys builds the keys that
// only fold to these names.
func FuzzParseRPC(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}`,
		`{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"render","arguments":{}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"method":"tools/call","Method":"initialize"}`,
		`{"method":"a","method":"b"}`,
		`{"method":"\u0069nitialize"}`,
		`[{"method":"initialize"}]`,
		`{"params":{"name":"x","name":"y"},"method":"tools/call"}`,
		`"initialize"`, ``, `{`, `{"method":1}`, `{"id":null,"method":"ping"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		head, fault := parseRPC(body)
		if fault != nil {
			if head != nil && fault.status == 0 {
				t.Fatalf("fault without a status: %+v", fault)
			}
			return
		}
		var std struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		if err := json.Unmarshal(body, &std); err != nil {
			return // a shape encoding/json refuses (e.g. method not a string) reaches no method
		}
		if std.Method != head.Method || head.Method == "tools/call" && std.Params.Name != head.Name {
			t.Fatalf("parseRPC read method %q name %q; encoding/json reads %q %q in %s", head.Method, head.Name, std.Method, std.Params.Name, body)
		}
	})
}

// FuzzCaddyfile feeds arbitrary option blocks to the mcp_proxy and
// mcp_session directives and the mcp_sessions global option, seeded with
// every golden Caddyfile: adapting must never panic, and what adapts must
// be JSON.
func FuzzCaddyfile(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "caddyfile_adapt", "*.caddyfiletest"))
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		cfg, _, _ := strings.Cut(string(data), "----------")
		f.Add(cfg)
	}
	f.Add(":8080 {\n\tmcp_proxy 127.0.0.1:9001 {\n\t\tinitialize_timeout\n\t}\n}\n")
	f.Add("{\n\tmcp_sessions {\n\t\tstore redis {\n\t\t\taddress\n\t\t}\n\t}\n}\n:8080\n")
	f.Fuzz(func(t *testing.T, cfg string) {
		out, _, err := adapt(cfg)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("adapted to invalid JSON: %s", out)
		}
	})
}
