package whoami

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// ShutdownTimeout bounds how long Serve waits for in-flight requests after
// its context is done.
const ShutdownTimeout = 5 * time.Second

// Config is the command-line configuration of a whoami server process.
type Config struct {
	// Listen is the TCP address to listen on; port 0 picks a free port.
	Listen string
	// AddrFile, if set, receives the actual listen address once listening.
	AddrFile string
	// Options configures the MCP server.
	Options Options
}

// Main runs a whoami server configured by args (without the program name)
// until SIGINT or SIGTERM. Flags: -listen, -name, -json, -era, -addr-file,
// -transport, -down-file, -session-timeout, -bearer-token, -any-host,
// -initialize-delay. It returns Run's errors.
func Main(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, args, os.Stdout)
}

// Run is Main with an explicit context and output: it serves until ctx is
// done and prints the listening line to stdout. It returns ParseFlags's
// error, the error of listening or of writing the address file, or Serve's.
func Run(ctx context.Context, args []string, stdout io.Writer) error {
	cfg, err := ParseFlags(args)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	if cfg.AddrFile != "" {
		if err := WriteFileAtomic(cfg.AddrFile, []byte(addr+"\n")); err != nil {
			ln.Close()
			return err
		}
	}
	fmt.Fprintf(stdout, "whoami %s listening on http://%s/mcp\n", cfg.Options.Name, addr)
	return Serve(ctx, ln, cfg.Options)
}

// ParseFlags parses the whoami command line. It returns the flag
// package's error for an unknown flag or a bad value, and an error listing
// any arguments left after the flags.
func ParseFlags(args []string) (Config, error) {
	var cfg Config
	fs := flag.NewFlagSet("whoami", flag.ContinueOnError)
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:0", "TCP `address` to listen on (port 0 picks a free port)")
	fs.StringVar(&cfg.Options.Name, "name", "whoami", "server `name` reported by the whoami tool")
	fs.BoolVar(&cfg.Options.JSONResponse, "json", false, "answer with application/json instead of text/event-stream")
	fs.StringVar(&cfg.Options.Era, "era", EraLegacy, "protocol eras served: legacy (sessions), modern (2026-07-28, no sessions) or dual")
	fs.StringVar(&cfg.Options.Transport, "transport", TransportStreamable, "HTTP transport: streamable, or sse (legacy HTTP+SSE, protocol 2024-11-05)")
	fs.StringVar(&cfg.AddrFile, "addr-file", "", "write the actual listen address to this `file` once listening")
	fs.StringVar(&cfg.Options.DownFile, "down-file", "", "GET /healthz answers 503 while this `file` exists")
	fs.DurationVar(&cfg.Options.SessionTimeout, "session-timeout", 0, "close sessions idle for this `duration` (0: keep them until DELETE)")
	fs.StringVar(&cfg.Options.BearerToken, "bearer-token", "", "require this bearer `token`; the 401 names OAuth resource metadata at a URL built from the request's Host")
	fs.DurationVar(&cfg.Options.InitializeDelay, "initialize-delay", 0, "answer initialize after this `duration`, as a server with a cold start does (each is logged)")
	fs.BoolVar(&cfg.Options.AnyHost, "any-host", false, "accept any Host on loopback (turn off go-sdk's DNS-rebinding protection)")
	fs.IntVar(&cfg.Options.MaxSessions, "max-sessions", 0, "answer initialize 503 past this many live `sessions`, as the Python SDK at its cap (0: no cap)")
	fs.IntVar(&cfg.Options.InitializeStatus, "initialize-status", 0, "answer every initialize with this HTTP `status` (0: serve it)")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if t := cfg.Options.Transport; t != TransportStreamable && t != TransportSSE {
		return Config{}, fmt.Errorf("-transport %q: use streamable or sse", t)
	}
	switch cfg.Options.Era {
	case EraLegacy, EraModern, EraDual:
	default:
		return Config{}, fmt.Errorf("-era %q: use legacy, modern or dual", cfg.Options.Era)
	}
	return cfg, nil
}

// Serve serves the whoami MCP server on ln until ctx is done, then shuts
// down: open streams are cancelled and in-flight requests get up to
// ShutdownTimeout to finish. It returns the server's error if it stops
// serving before ctx is done, and otherwise the error of shutting down
// (nil when every connection closed in time).
func Serve(ctx context.Context, ln net.Listener, opts Options) error {
	baseCtx, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	conns := newConnTracker()
	srv := &http.Server{
		Handler:           NewHandler(opts),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ConnState:         conns.track,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	cancelBase() // ends long-lived SSE streams, which Shutdown would wait for
	conns.closeNew()
	return shutdown(srv)
}

// connTracker records the state of a server's connections.
type connTracker struct {
	mu    sync.Mutex
	conns map[net.Conn]http.ConnState
}

// newConnTracker returns an empty connTracker.
func newConnTracker() *connTracker {
	return &connTracker{conns: make(map[net.Conn]http.ConnState)}
}

// track is an http.Server ConnState hook.
func (t *connTracker) track(c net.Conn, state http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if state == http.StateClosed || state == http.StateHijacked {
		delete(t.conns, c)
		return
	}
	t.conns[c] = state
}

// closeNew closes the connections that have not sent a request yet.
// Clients' HTTP pools often hold such spare connections, and
// http.Server.Shutdown would otherwise wait 5 seconds for each of them.
func (t *connTracker) closeNew() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for c, state := range t.conns {
		if state == http.StateNew {
			c.Close()
		}
	}
}

// shutdown stops srv gracefully, forcing it closed after ShutdownTimeout.
func shutdown(srv *http.Server) error {
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return srv.Close()
	}
	return err
}

// WriteFileAtomic writes data to path through a temporary file in the same
// directory and a rename, so that a reader never sees a partial file. It
// returns the error of creating, writing, closing or renaming the file; the
// temporary file is removed on failure.
func WriteFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
