package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/examples/whoami"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// TestMain lets the test binary serve as a backend, as the demo binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == backendCommand {
		if err := whoami.Main(os.Args[2:]); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestSelfCheckWithPlugin(t *testing.T) {
	testproc.SkipShort(t, "builds Caddy and starts real servers")
	for _, args := range [][]string{
		{"-check", "-sessions", "6", "-calls", "3"},
		{"-check", "-sessions", "6", "-calls", "3", "-json"},
	} {
		if err := run(args); err != nil {
			t.Errorf("run %q: %v", args, err)
		}
	}
}

func TestSelfCheckStockFails(t *testing.T) {
	testproc.SkipShort(t, "builds Caddy and starts real servers")
	err := run([]string{"-check", "-stock", "-sessions", "6", "-calls", "3"})
	if err == nil || !strings.Contains(err.Error(), "sessions broken") {
		t.Errorf("stock round_robin: err = %v, want broken sessions", err)
	}
}

func TestParseFlags(t *testing.T) {
	for _, args := range [][]string{{"-listen", "nonsense"}, {"-sessions", "0"}, {"extra"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func TestProxyAddr(t *testing.T) {
	host, port, err := proxyAddr("")
	if err != nil || host != "127.0.0.1" || port == "0" || port == "" {
		t.Errorf("default: %s %s %v", host, port, err)
	}
	host, port, err = proxyAddr(":8123")
	if err != nil || host != "127.0.0.1" || port != "8123" {
		t.Errorf(":8123: %s %s %v", host, port, err)
	}
}

func TestProxyDirective(t *testing.T) {
	if got := proxyDirective(false, []string{"a:1", "b:2"}); got != "mcp_proxy a:1 b:2" {
		t.Errorf("plugin: %q", got)
	}
	got := proxyDirective(true, []string{"a:1"})
	if !strings.Contains(got, "lb_policy round_robin") || !strings.HasPrefix(got, "reverse_proxy a:1 {") {
		t.Errorf("stock: %q", got)
	}
}

func TestSummarize(t *testing.T) {
	reports := []sessionReport{
		{backend: "s1", calls: 2},
		{backend: "s2", calls: 1, err: context.Canceled},
		{err: context.Canceled},
	}
	if failed := summarize(reports, 2, []string{"s1", "s2"}); failed != 2 {
		t.Errorf("failed = %d, want 2", failed)
	}
}
