package caddymodule

import (
	"net/netip"

	"github.com/caddyserver/caddy/v2"
)

// unixSocketHost is the Host sent to unix socket upstreams, which have no
// host:port (Go would send an empty Host for a socket path): a loopback
// name with a port, which the Python SDK's host check (`localhost:*`) and
// the Go SDK's accept.
const unixSocketHost = "localhost:80"

// hostForUpstream returns the Host that mcp_proxy sends the upstream that
// reverse_proxy selected, the value of {mcp.host_for_upstream}: for an
// upstream on this machine (a loopback or unspecified address,
// `localhost`, a unix socket) a Host its DNS-rebinding protection accepts,
// its own host:port; for any other upstream the client's Host, unchanged,
// as reverse_proxy passes it. MCP SDK servers refuse a request that
// reached them on loopback with a Host that is not loopback (Go SDK 403,
// Python SDK 421, TypeScript SDK 403), so only local upstreams need the
// rewrite, and every other upstream can build absolute URLs (OAuth
// protected-resource metadata, links) from the name the client used. It
// returns "" before reverse_proxy has selected an upstream.
func hostForUpstream(repl *caddy.Replacer) string {
	addr, _ := repl.GetString("http.reverse_proxy.upstream.address")
	na, err := caddy.ParseNetworkAddress(addr)
	switch {
	case addr == "" || err != nil:
		return ""
	case na.IsUnixNetwork():
		return unixSocketHost
	case localHost(na.Host):
		hostport, _ := repl.GetString("http.reverse_proxy.upstream.hostport")
		return hostport
	}
	client, _ := repl.GetString("http.request.hostport")
	return client
}

// localHost reports whether dialing host reaches this machine on a
// loopback connection: `localhost`, a loopback IP address, or an empty or
// unspecified address (0.0.0.0, ::), which the kernel connects over
// loopback. Other names count as remote, even if they resolve to loopback.
func localHost(host string) bool {
	if host == "" || isLoopbackHost(host) {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsUnspecified()
}
