package main

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
)

// caddyfileWith returns a Caddyfile for one benchmark site on 127.0.0.1:port
// whose route holds body, with more global options (global, possibly
// empty). No access log (the site has no `log`), no HTTPS, no persisted
// config; the admin endpoint (with /debug/pprof) on adminPort.
func caddyfileWith(port, adminPort int, global, body string) string {
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off%s
}

http://:%d {
	bind 127.0.0.1
	%s
}
`, adminPort, global, port, body)
}

// redisStoreOption is the global option that puts the default session
// table in the Redis at addr.
func redisStoreOption(addr string) string {
	return fmt.Sprintf(`
	mcp_sessions {
		store redis {
			address %s
			hash_key bench-hash-key-0123456789abcdef0123456789
		}
	}`, addr)
}

// mcpProxyRoute is the plugin: `mcp_proxy` over the upstreams, all defaults
// except the table bound, which the caller may raise (0 keeps the default).
func mcpProxyRoute(upstreams []string, maxSessions int, extra string) string {
	if maxSessions == 0 && extra == "" {
		return "mcp_proxy " + strings.Join(upstreams, " ")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "mcp_proxy %s {\n", strings.Join(upstreams, " "))
	if maxSessions > 0 {
		fmt.Fprintf(&b, "\t\tmax_sessions %d\n", maxSessions)
	}
	if extra != "" {
		b.WriteString(extra)
	}
	b.WriteString("\t}")
	return b.String()
}

// sealKeyEnv is the environment variable every benchmark Caddy gets the
// sealing key of the sealed rows in.
const sealKeyEnv = "MCP_SESSION_KEY"

// sealKey is the sealed rows' key: 32 random bytes, base64, new each run.
var sealKey = func() string {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return base64.StdEncoding.EncodeToString(k)
}()

// sealedRoute is mcpProxyRoute with sealed session IDs.
func sealedRoute(upstreams []string) string {
	return mcpProxyRoute(upstreams, 0, "\t\tseal_session_ids {env."+sealKeyEnv+"}\n")
}

// stockRoute is stock `reverse_proxy` with the one setting mcp_proxy adds
// that changes the bytes sent upstream: Host rewritten to the upstream's
// address (go-sdk servers on loopback reject other Hosts). With one
// upstream it proxies exactly what `mcp_proxy` proxies, without the plugin.
func stockRoute(upstreams []string, lbPolicy string) string {
	lb := ""
	if lbPolicy != "" {
		lb = "\n\t\tlb_policy " + lbPolicy
	}
	return fmt.Sprintf(`reverse_proxy %s {
		header_up Host {upstream_hostport}%s
	}`, strings.Join(upstreams, " "), lb)
}

// haproxyConfig is HAProxy with a learning stick table (HAProxy manual, "stick store-response"):
// the session ID is stored from the upstream's response header and matched
// on the request header, balancing round-robin otherwise. `option
// http-no-delay` keeps HAProxy from delaying small SSE writes (~200 ms
// otherwise); noDelay=false leaves it out, for comparison only. The timeouts
// are long so that no SSE stream is cut; maxconn stays below the open-file
// limit (20,000 open files on these machines). threads > 0 sets nbthread
// (the proxy's cores in the sidecar and proxy-bound parts); 0 leaves
// HAProxy's default, one thread per CPU it may run on.
func haproxyConfig(port int, upstreams []string, noDelay bool, threads int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "global\n    maxconn 4000\n")
	if threads > 0 {
		fmt.Fprintf(&b, "    nbthread %d\n", threads)
	}
	fmt.Fprintf(&b, `
defaults
    mode http
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
    timeout http-keep-alive 1h
    timeout http-request 1h
`)
	if noDelay {
		b.WriteString("    option http-no-delay\n")
	}
	fmt.Fprintf(&b, `
frontend mcp
    bind 127.0.0.1:%d
    default_backend mcp_servers

backend mcp_servers
    balance roundrobin
    stick-table type string len 64 size 1m expire 30m
    stick store-response res.hdr(mcp-session-id)
    stick match req.hdr(mcp-session-id)
`, port)
	for i, u := range upstreams {
		fmt.Fprintf(&b, "    server s%d %s\n", i+1, u)
	}
	return b.String()
}
