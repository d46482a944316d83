package caddymodule

import (
	"net"
	"net/http"
	"net/netip"
	"strings"

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

// rebinding reports whether r arrived on a loopback address but names a
// host that is not loopback: the signature of a DNS rebinding attack. The
// rule is the MCP Go SDK's (mcp/streamable.go, DisableLocalhostProtection).
//
// The local address is checked whatever the listener's network: TCP for
// HTTP/1.1 and HTTP/2, UDP for HTTP/3 over QUIC.
func rebinding(r *http.Request) bool {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	return ok && isLoopbackAddr(local) && !isLoopbackHost(r.Host)
}

// isLoopbackAddr reports whether a listener's local address is a loopback
// IP address, for any network. Addresses without an IP (unix sockets) are not.
func isLoopbackAddr(a net.Addr) bool {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UDPAddr:
		return a.IP.IsLoopback()
	}
	ap, err := netip.ParseAddrPort(a.String())
	return err == nil && ap.Addr().IsLoopback()
}

// isLoopbackHost reports whether host, with or without a port, is
// `localhost` or a loopback IP address.
func isLoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else {
		host = strings.Trim(host, "[]")
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// proxyHostHeader sends upstreams on this machine their own host:port as
// Host, which the DNS-rebinding protection of MCP SDK servers on loopback
// requires, and every other upstream the client's Host (see
// hostForUpstream).
const proxyHostHeader = "{mcp.host_for_upstream}"
