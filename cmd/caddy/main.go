// Command caddy is a Caddy binary with the standard modules and the MCP session affinity plugin built in.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
)

func main() {
	caddycmd.Main()
}
