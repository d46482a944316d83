// Command replicas shows several Caddy replicas sharing MCP sessions
// through Redis, with nothing but Go and redis-server.
//
// It starts redis-server (from PATH) on a free port with persistence off,
// three whoami MCP servers (each keeps its sessions in its own memory) and
// two Caddy replicas with the same config, each a process of its own running
// this binary: mcp_proxy in front of the three servers, with its session
// table in Redis. It prints both replicas' URLs; any L4 or L7 balancer can
// spread clients over them.
//
//	go run ./examples/replicas                  # serve until Ctrl-C
//	go run ./examples/replicas -check           # self-check with real MCP clients
//	go run ./examples/replicas -check -memory   # the same with the memory store: sessions break
//
// The self-check sends the requests of every session to the replicas in
// turn, as a round-robin balancer would, then restarts one replica and
// checks that every session is still pinned to the server that created it.
//
// Flags:
//
//	-check         run the self-check, print a summary, exit non-zero on failure
//	-memory        keep sessions in each replica's memory instead of Redis
//	-replicas N    number of Caddy replicas (default 2)
//	-sessions N    concurrent sessions in the self-check (default 20)
//	-calls N       whoami calls per session in the self-check (default 4)
//	-verbose       show the Caddyfile and Caddy's logs
//
// Everything listens on loopback only.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/examples/whoami"
)

// The hidden first arguments with which the binary re-executes itself to
// run one whoami server or one Caddy replica.
const (
	backendCommand = "serve-backend"
	caddyCommand   = "serve-caddy"
)

// config holds the command-line flags.
type config struct {
	check    bool
	memory   bool
	replicas int
	sessions int
	calls    int
	verbose  bool
}

func main() {
	if served := serveChild(os.Args); served {
		return
	}
	err := run(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "replicas:", err)
		os.Exit(1)
	}
}

// serveChild runs a child process's part, if args name one, and reports
// whether it did.
func serveChild(args []string) bool {
	if len(args) < 2 {
		return false
	}
	switch args[1] {
	case backendCommand:
		if err := whoami.Main(args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "whoami:", err)
			os.Exit(1)
		}
		return true
	case caddyCommand:
		os.Args = append([]string{args[0]}, args[2:]...)
		caddycmd.Main()
		return true
	}
	return false
}

// parseFlags parses the command line.
func parseFlags(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("replicas", flag.ContinueOnError)
	fs.BoolVar(&cfg.check, "check", false, "run a self-check with real MCP clients instead of serving until Ctrl-C")
	fs.BoolVar(&cfg.memory, "memory", false, "keep sessions in each replica's memory instead of Redis (sessions break)")
	fs.IntVar(&cfg.replicas, "replicas", 2, "`number` of Caddy replicas")
	fs.IntVar(&cfg.sessions, "sessions", 20, "concurrent `sessions` in the self-check")
	fs.IntVar(&cfg.calls, "calls", 4, "whoami `calls` per session in the self-check")
	fs.BoolVar(&cfg.verbose, "verbose", false, "show the Caddyfile and Caddy's logs")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if cfg.replicas < 2 || cfg.sessions < 1 || cfg.calls < 1 {
		return config{}, errors.New("-replicas must be at least 2, -sessions and -calls at least 1")
	}
	return cfg, nil
}

// run starts Redis, the servers and the replicas, then runs the self-check
// or waits for Ctrl-C. Everything it started is stopped before it returns.
func run(args []string) error {
	cfg, err := parseFlags(args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	f, err := startFleet(ctx, cfg)
	defer f.stop()
	if err != nil {
		return err
	}
	f.print(cfg)
	if cfg.check {
		return selfCheck(ctx, cfg, f)
	}
	fmt.Println("Press Ctrl-C to stop.")
	<-ctx.Done()
	fmt.Println("\nstopping")
	return nil
}
