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
// longer. FuzzOpenSealed and FuzzOpenTampered (internal/seal) fuzz sealed
// session IDs; internal/mcpwire fuzzes the wire parsers.

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
