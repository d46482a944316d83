package tests

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	whoamiserver "github.com/caddy-mcp-affinity/caddy-mcp-affinity/examples/whoami"
)

// TestLegacySSEFailsFast documents a limit (README, "Limits"): the
// 2024-11-05 HTTP+SSE transport carries its session in the POST endpoint's
// query string, not in Mcp-Session-Id, so the proxy does not pin it and its
// POSTs are balanced. What must hold is that such a misrouted POST fails at
// once with the server's 404, never hangs, and no request is rejected by
// the proxy for lack of a session.
func TestLegacySSEFailsFast(t *testing.T) {
	var addrs []string
	for _, name := range []string{"l1", "l2", "l3"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		server := whoamiserver.NewServer(name)
		srv := &http.Server{Handler: mcp.NewSSEHandler(func(*http.Request) *mcp.Server { return server }, nil)}
		go srv.Serve(ln) //nolint:errcheck
		t.Cleanup(func() { srv.Close() })
		addrs = append(addrs, ln.Addr().String())
	}
	p := startProxy(t, "mcp_proxy "+strings.Join(addrs, " "))

	failed, ok := 0, 0
	for range 9 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		client := mcp.NewClient(&mcp.Implementation{Name: "legacy", Version: "v0"}, nil)
		cs, err := client.Connect(ctx, &mcp.SSEClientTransport{Endpoint: "http://" + p.addr + "/sse"}, nil)
		if err == nil {
			_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami"})
			cs.Close()
		}
		took := time.Since(start)
		cancel()
		if took > 5*time.Second {
			t.Errorf("a legacy SSE session took %v: it hung instead of failing fast", took)
		}
		if err != nil {
			failed++
			// The go-sdk client reports the misrouted POST's 404, or, when
			// it closes the SSE stream first, the stream's EOF.
			if msg := err.Error(); !strings.Contains(msg, "session not found") && !strings.Contains(msg, "404") && !strings.Contains(msg, "EOF") {
				t.Errorf("legacy SSE failure is not the server's 404: %v", err)
			}
		} else {
			ok++
		}
	}
	t.Logf("legacy HTTP+SSE through mcp_proxy over 3 servers: %d of 9 sessions worked, %d failed fast with the server's 404", ok, failed)
	if failed == 0 {
		t.Errorf("every legacy SSE session worked: if the proxy now pins them, update README's Limits")
	}
}
