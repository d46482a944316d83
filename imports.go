// Package caddymcpaffinity registers the MCP session affinity modules with
// Caddy, so that `xcaddy build --with github.com/caddy-mcp-affinity/caddy-mcp-affinity`
// builds them in. The modules live in package caddymodule.
package caddymcpaffinity

import (
	_ "github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
)
