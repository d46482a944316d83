package mcpwire

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// TestNoCaddyImport: the package stays below the Caddy glue.
func TestNoCaddyImport(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for dep := range bytes.Lines(out) {
		if strings.HasPrefix(string(dep), "github.com/caddyserver/") {
			t.Errorf("internal/mcpwire imports %s", bytes.TrimSpace(dep))
		}
	}
}
