package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// TestHostForUpstream: {mcp.host_for_upstream} is the upstream's own
// host:port for upstreams on this machine, localhost:80 for unix sockets,
// and the client's Host, port included, for every other upstream. The
// replacer holds what reverse_proxy sets after selecting the upstream.
func TestHostForUpstream(t *testing.T) {
	const client = "mcp.example.com:8443"
	for _, tc := range []struct{ dial, want string }{
		{"127.0.0.1:9001", "127.0.0.1:9001"},
		{"127.0.0.2:9001", "127.0.0.2:9001"},
		{"[::1]:9001", "[::1]:9001"},
		{"localhost:9001", "localhost:9001"},
		{"0.0.0.0:9001", "0.0.0.0:9001"},
		{"[::]:9001", "[::]:9001"},
		{":9001", ":9001"},
		{"[::ffff:127.0.0.1]:9001", "[::ffff:127.0.0.1]:9001"},
		{"unix//run/mcp/worker-0.sock", unixSocketHost},
		{"10.0.0.11:9001", client},
		{"[2001:db8::11]:9001", client},
		{"mcp-1.mcp.svc.cluster.local:8080", client},
		{"localhost.example.com:9001", client},
		{"mcp-1:9001", client},
	} {
		t.Run(tc.dial, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
			r.Host = client
			repl := caddyhttp.NewTestReplacer(r)
			r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
			exchangeOf(r)
			if v, _ := repl.GetString("mcp.host_for_upstream"); v != "" {
				t.Errorf("before an upstream is selected: %q, want empty", v)
			}
			setUpstreamPlaceholders(t, repl, tc.dial)
			if got, _ := repl.GetString("mcp.host_for_upstream"); got != tc.want {
				t.Errorf("{mcp.host_for_upstream} = %q, want %q", got, tc.want)
			}
		})
	}
}

// setUpstreamPlaceholders sets the upstream placeholders that
// reverse_proxy sets after selecting the upstream dialed at dial
// (reverseproxy.Upstream.fillDialInfo, Caddy v2.11.9).
func setUpstreamPlaceholders(t *testing.T, repl *caddy.Replacer, dial string) {
	t.Helper()
	addr, err := caddy.ParseNetworkAddress(dial)
	if err != nil {
		t.Fatal(err)
	}
	di := reverseproxy.DialInfo{Network: addr.Network, Address: addr.JoinHostPort(0), Host: addr.Host, Port: strconv.Itoa(int(addr.StartPort))}
	repl.Set("http.reverse_proxy.upstream.address", di.String())
	repl.Set("http.reverse_proxy.upstream.hostport", di.Address)
}
