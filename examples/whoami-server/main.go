// Command whoami-server runs one whoami MCP server (see package
// examples/whoami) as a standalone process. It does not import Caddy, so it
// builds in seconds; integration tests start several of them as backends.
//
// Usage:
//
//	whoami-server [-listen 127.0.0.1:0] [-name NAME] [-json] [-era legacy|modern|dual] [-addr-file PATH] [-down-file PATH]
//	              [-session-timeout DURATION] [-bearer-token TOKEN] [-any-host] [-initialize-delay DURATION]
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/examples/whoami"
)

func main() {
	err := whoami.Main(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "whoami-server:", err)
		os.Exit(1)
	}
}
