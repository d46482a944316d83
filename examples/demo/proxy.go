package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	// Caddy's standard modules, including the Caddyfile adapter and
	// reverse_proxy, and the session affinity plugin (mcp_proxy).
	_ "github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// proxy describes the running Caddy instance.
type proxy struct {
	url       string // MCP endpoint to give clients
	caddyfile string // configuration in use
}

// caddyfileTemplate is the demo's Caddyfile: global options, then one site
// bound to loopback whose only handler is the proxy directive.
const caddyfileTemplate = `{
	admin %s
	auto_https off
	persist_config off
	grace_period 2s
	log {
		level %s
	}
}

http://:%s {
	bind %s
	%s
}
`

// startProxy starts Caddy in process in front of the given upstreams.
func startProxy(cfg config, upstreams []string) (*proxy, error) {
	host, port, err := proxyAddr(cfg.listen)
	if err != nil {
		return nil, err
	}
	admin, err := freeAddr("127.0.0.1")
	if err != nil {
		return nil, err
	}
	level := "ERROR"
	if cfg.verbose {
		level = "INFO"
	}
	caddyfile := fmt.Sprintf(caddyfileTemplate, admin, level, port, host, proxyDirective(cfg.stock, upstreams))
	if err := loadCaddyfile(caddyfile); err != nil {
		return nil, err
	}
	url := "http://" + net.JoinHostPort(host, port) + "/mcp"
	return &proxy{url: url, caddyfile: caddyfile}, nil
}

// proxyDirective returns the site's handler: mcp_proxy, or with stock set a
// plain round-robin reverse_proxy. The stock proxy rewrites Host to the
// upstream's, which the backends' DNS-rebinding protection accepts.
func proxyDirective(stock bool, upstreams []string) string {
	list := strings.Join(upstreams, " ")
	if !stock {
		return "mcp_proxy " + list
	}
	return "reverse_proxy " + list + ` {
		lb_policy round_robin
		header_up Host {upstream_hostport}
	}`
}

// loadCaddyfile adapts a Caddyfile to JSON and runs it.
func loadCaddyfile(caddyfile string) error {
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		return fmt.Errorf("caddyfile adapter not registered")
	}
	cfgJSON, warnings, err := adapter.Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		return fmt.Errorf("adapting Caddyfile: %w", err)
	}
	for _, w := range warnings {
		fmt.Fprintln(os.Stderr, "Caddyfile warning:", w.String())
	}
	if err := caddy.Load(cfgJSON, true); err != nil {
		return fmt.Errorf("starting Caddy: %w", err)
	}
	return nil
}

// stopProxy stops Caddy, reporting any error.
func stopProxy() {
	if err := caddy.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "demo: stopping Caddy:", err)
	}
}

// proxyAddr resolves the -listen flag to a host and a port: an empty host
// means 127.0.0.1, and an empty flag or port 0 picks a free port.
func proxyAddr(listen string) (host, port string, err error) {
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	host, port, err = net.SplitHostPort(listen)
	if err != nil {
		return "", "", fmt.Errorf("-listen %q: %w", listen, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	if port != "0" {
		return host, port, nil
	}
	addr, err := freeAddr(host)
	if err != nil {
		return "", "", err
	}
	_, port, err = net.SplitHostPort(addr)
	return host, port, err
}

// freeAddr returns host:port with a port that was free a moment ago.
func freeAddr(host string) (string, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("finding a free port on %s: %w", host, err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	return net.JoinHostPort(host, strconv.Itoa(port)), nil
}
