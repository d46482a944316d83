package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestSubscriptionsListenThroughProxy holds the go-sdk client's 2026-07-28
// subscriptions/listen stream (a long-lived POST whose SSE response carries
// change notifications) open through mcp_proxy to a real sessionless go-sdk
// server: it stays open through a quiet period, a tools/list_changed
// notification crosses it as soon as the server sends it, and the proxy
// counts it as an open stream while it is open. The control is the same
// proxy with a 1 s upstream read timeout, which cuts the quiet stream.
func TestSubscriptionsListenThroughProxy(t *testing.T) {
	server := startEraBackends(t, "m", "modern", 1)[0]
	port := mustFreePort()
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	const quiet = 3 * time.Second
	for i, tc := range []struct {
		name, options string
		cut           bool
	}{
		{name: "read_timeout 1s (control)", options: "transport http {\n\t\t\tread_timeout 1s\n\t\t}", cut: true},
		{name: "mcp_proxy defaults"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loadCaddyfile(t, siteConfig(port, fmt.Sprintf("mcp_proxy %s {\n\t\ttable listen\n\t\t%s\n\t}", server.Addr(), tc.options)))
			hc := newHTTPClient()
			defer hc.CloseIdleConnections()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			changed := make(chan time.Time, 8)
			listener, err := connectListening(ctx, url, hc, changed) // returns once the listen stream is acknowledged
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer listener.Close()
			waitOpenListens(t, "listen", 1)
			time.Sleep(quiet)
			if open := openListens(t, "listen"); (open == 1) == tc.cut {
				t.Errorf("after %v without events: %v open listen streams", quiet, open)
			}
			caller, err := connect(ctx, url, hc)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer caller.Close()
			if _, err := caller.CallTool(ctx, &mcp.CallToolParams{Name: "add_tool", Arguments: map[string]any{"name": fmt.Sprintf("extra%d", i)}}); err != nil {
				t.Fatalf("add_tool: %v", err)
			}
			added := time.Now()
			select {
			case at := <-changed:
				if tc.cut {
					t.Errorf("the notification arrived on a stream the read timeout should have cut")
				}
				t.Logf("notifications/tools/list_changed arrived %v after add_tool returned, %v after the stream opened", at.Sub(added), at.Sub(added)+quiet)
			case <-time.After(5 * time.Second):
				if !tc.cut {
					t.Errorf("no notifications/tools/list_changed within 5 s on a listen stream open for %v", quiet)
				}
			}
			listener.Close()
			waitOpenListens(t, "listen", 0)
		})
	}
}
