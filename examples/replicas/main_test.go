package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// TestMain lets the test binary serve as a whoami server or a Caddy
// replica, as the command's binary does.
func TestMain(m *testing.M) {
	if serveChild(os.Args) {
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// needRedis skips the test without redis-server, unless
// MCP_INTEROP_REQUIRED=1 makes it fail.
func needRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("MCP_INTEROP_REQUIRED") == "1" {
			t.Fatalf("redis-server is not installed (.ci/install-deps installs it): %v", err)
		}
		t.Skipf("redis-server is not installed: %v", err)
	}
}

func TestSelfCheckWithRedis(t *testing.T) {
	testproc.SkipShort(t, "builds Caddy and starts real replicas and redis-server")
	needRedis(t)
	if err := run([]string{"-check", "-sessions", "8", "-calls", "3"}); err != nil {
		t.Errorf("self-check with the redis store: %v", err)
	}
}

func TestSelfCheckMemoryFails(t *testing.T) {
	testproc.SkipShort(t, "builds Caddy and starts real replicas and redis-server")
	err := run([]string{"-check", "-memory", "-sessions", "8", "-calls", "3"})
	if err == nil || !strings.Contains(err.Error(), "sessions broken") {
		t.Errorf("memory store: err = %v, want broken sessions", err)
	}
}

func TestParseFlags(t *testing.T) {
	for _, args := range [][]string{{"-replicas", "1"}, {"-sessions", "0"}, {"extra"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}
