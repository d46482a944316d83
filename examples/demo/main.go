// Command demo shows MCP session affinity end to end, with nothing but Go.
//
// It starts three stateful whoami MCP servers as separate processes (each
// keeps its sessions in its own memory), puts Caddy with the mcp_proxy
// directive in front of them, in process, and prints the URL to give any MCP
// client. Every session then stays on the backend that created it.
//
//	go run ./examples/demo            # serve until Ctrl-C
//	go run ./examples/demo -check     # run a self-check with real MCP clients
//	go run ./examples/demo -stock     # stock reverse_proxy round_robin: see the bug
//
// Flags:
//
//	-listen ADDR   proxy address (default 127.0.0.1 on a free port)
//	-json          backends answer with application/json instead of SSE
//	-stock         use stock reverse_proxy with lb_policy round_robin
//	-check         run the self-check, print a summary, exit non-zero on failure
//	-sessions N    concurrent sessions in the self-check (default 30)
//	-calls N       whoami calls per session in the self-check (default 5)
//	-backends N    number of backend processes (default 3)
//	-verbose       show Caddy's logs and the Caddyfile
//
// Everything listens on loopback only.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/examples/whoami"
)

// backendCommand is the hidden first argument with which the demo re-executes
// itself to run one whoami backend.
const backendCommand = "serve-backend"

// config holds the demo's command-line flags.
type config struct {
	listen   string
	json     bool
	stock    bool
	check    bool
	sessions int
	calls    int
	backends int
	verbose  bool
}

func main() {
	var err error
	if len(os.Args) > 1 && os.Args[1] == backendCommand {
		err = whoami.Main(os.Args[2:])
	} else {
		err = run(os.Args[1:])
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// parseFlags parses the demo's command line.
func parseFlags(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.StringVar(&cfg.listen, "listen", "", "proxy `address` (default 127.0.0.1 on a free port)")
	fs.BoolVar(&cfg.json, "json", false, "backends answer with application/json instead of text/event-stream")
	fs.BoolVar(&cfg.stock, "stock", false, "use stock reverse_proxy with lb_policy round_robin instead of mcp_proxy")
	fs.BoolVar(&cfg.check, "check", false, "run a self-check with real MCP clients instead of serving until Ctrl-C")
	fs.IntVar(&cfg.sessions, "sessions", 30, "concurrent `sessions` in the self-check")
	fs.IntVar(&cfg.calls, "calls", 5, "whoami `calls` per session in the self-check")
	fs.IntVar(&cfg.backends, "backends", 3, "`number` of backend processes")
	fs.BoolVar(&cfg.verbose, "verbose", false, "show Caddy's logs and the generated Caddyfile")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if cfg.sessions < 1 || cfg.calls < 1 || cfg.backends < 1 {
		return config{}, errors.New("-sessions, -calls and -backends must be at least 1")
	}
	if cfg.listen != "" {
		if _, _, err := net.SplitHostPort(cfg.listen); err != nil {
			return config{}, fmt.Errorf("-listen %q: %w", cfg.listen, err)
		}
	}
	return cfg, nil
}

// run starts the backends and the proxy, then either runs the self-check or
// waits for Ctrl-C. Everything it started is stopped before it returns.
func run(args []string) error {
	cfg, err := parseFlags(args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	backends, err := startBackends(ctx, cfg.backends, cfg.json)
	defer stopBackends(backends)
	if err != nil {
		return err
	}
	proxy, err := startProxy(cfg, backendAddrs(backends))
	if err != nil {
		return err
	}
	defer stopProxy()

	printInfo(cfg, proxy, backends)
	if cfg.check {
		return selfCheck(ctx, cfg, proxy.url, backendNames(backends))
	}
	fmt.Println("Press Ctrl-C to stop.")
	<-ctx.Done()
	fmt.Println("\nstopping")
	return nil
}

// printInfo tells the user what is running and where to connect.
func printInfo(cfg config, p *proxy, backends []*backend) {
	if cfg.verbose || !cfg.check {
		fmt.Printf("Caddyfile:\n%s\n", p.caddyfile)
	}
	fmt.Println("Backends (separate processes, each with its own in-memory sessions):")
	for _, b := range backends {
		fmt.Printf("  %s  http://%s/mcp  (pid %d)\n", b.name, b.addr, b.cmd.Process.Pid)
	}
	if cfg.stock {
		fmt.Println("Proxy: Caddy, stock reverse_proxy with lb_policy round_robin (no session affinity)")
	} else {
		fmt.Println("Proxy: Caddy with mcp_proxy (each Mcp-Session-Id stays on the backend that created it)")
	}
	fmt.Printf("\nMCP server URL for any client (Streamable HTTP):\n  %s\n\n", p.url)
	switch {
	case cfg.check:
	case cfg.stock:
		fmt.Println(`Call the "whoami" tool a few times: most sessions break with "session not found", the failure mcp_proxy fixes.`)
	default:
		fmt.Println(`Call the "whoami" tool a few times: every call of one session names the same backend.`)
	}
}
