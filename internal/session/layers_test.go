// Package session_test checks the layer rule of the repository: the
// domain core under internal/ imports no Caddy package, so that the Caddy
// modules in caddymodule/ sit on top of it and never below.
package session_test

import (
	"os/exec"
	"strings"
	"testing"
)

// testTooling are the packages under internal/ that exist for tests, and
// may import anything.
var testTooling = map[string]bool{
	"internal/testproc":  true,
	"internal/redistest": true,
}

// TestCoreImportsNoCaddy: no package under internal/ but the test tooling
// depends on github.com/caddyserver/..., directly or through another
// package; and the check sees the packages it is meant to (a negative
// control: caddymodule does depend on Caddy).
func TestCoreImportsNoCaddy(t *testing.T) {
	const module = "github.com/caddy-mcp-affinity/caddy-mcp-affinity/"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}",
		module+"internal/...", module+"caddymodule").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, " ")
		rel := strings.TrimPrefix(pkg, module)
		caddy := ""
		for dep := range strings.FieldsSeq(deps) {
			if strings.HasPrefix(dep, "github.com/caddyserver/") {
				caddy = dep
				break
			}
		}
		switch {
		case rel == "caddymodule":
			if caddy == "" {
				t.Error("caddymodule depends on no Caddy package: the check reads the wrong dependency list")
			}
		case testTooling[rel]:
		case caddy != "":
			t.Errorf("%s depends on %s: the core under internal/ must not import Caddy; move the code that needs it to caddymodule", rel, caddy)
		default:
			checked++
		}
	}
	if checked < 2 {
		t.Errorf("checked %d core packages under internal/, want at least internal/session and internal/loosekeys", checked)
	}
}
