package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// hashKeyEnv names the environment variable that carries the replicas'
// hash_key; the Caddyfile reads it with {env.MCP_SESSIONS_HASH_KEY}.
const hashKeyEnv = "MCP_SESSIONS_HASH_KEY"

// proc is a child process listening on addr.
type proc struct {
	name string
	addr string // host:port it listens on
	args []string
	env  []string
	cmd  *exec.Cmd
	out  *os.File
	done chan struct{} // closed when the process has exited
}

// start starts the process and waits until addr accepts connections.
func (p *proc) start(ctx context.Context) error {
	p.cmd = exec.Command(p.args[0], p.args[1:]...)
	p.cmd.Env = append(os.Environ(), p.env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	p.done = exited
	go func() { _ = p.cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", p.addr, time.Second); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited before listening on %s", p.name, p.addr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not listen on %s", p.name, p.addr)
		}
	}
}

// stop ends the process gracefully, or kills it after 10 s.
func (p *proc) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// fleet is Redis, the whoami servers and the Caddy replicas.
type fleet struct {
	dir      string
	redis    *proc
	backends []*proc
	replicas []*proc // addr is the replica's site
	admins   []string
	config   string
}

// freeAddr returns a host:port of 127.0.0.1 that was free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startFleet starts everything; on error, what was started is in the
// returned fleet, for stop.
func startFleet(ctx context.Context, cfg config) (*fleet, error) {
	dir, err := os.MkdirTemp("", "mcp-replicas-")
	if err != nil {
		return &fleet{}, err
	}
	f := &fleet{dir: dir}
	exe, err := os.Executable()
	if err != nil {
		return f, err
	}
	out := os.Stderr
	if !cfg.verbose {
		if out, err = os.Create(filepath.Join(dir, "log")); err != nil {
			return f, err
		}
	}
	if err := f.startRedis(ctx, out, cfg); err != nil {
		return f, err
	}
	for i := 1; i <= 3; i++ {
		addr, err := freeAddr()
		if err != nil {
			return f, err
		}
		b := &proc{name: fmt.Sprintf("s%d", i), addr: addr, out: out,
			args: []string{exe, backendCommand, "-name", fmt.Sprintf("s%d", i), "-listen", addr, "-json"}}
		f.backends = append(f.backends, b)
		if err := b.start(ctx); err != nil {
			return f, err
		}
	}
	return f, f.startReplicas(ctx, exe, out, cfg)
}

// startRedis starts redis-server with persistence off, unless the replicas
// keep sessions in memory.
func (f *fleet) startRedis(ctx context.Context, out *os.File, cfg config) error {
	if cfg.memory {
		return nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("redis-server is needed (Debian: apt-get install redis-server): %w", err)
	}
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(addr)
	f.redis = &proc{name: "redis-server", addr: addr, out: out,
		args: []string{bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", f.dir}}
	return f.redis.start(ctx)
}

// startReplicas writes the replicas' Caddyfiles and starts them.
func (f *fleet) startReplicas(ctx context.Context, exe string, out *os.File, cfg config) error {
	for i := 1; i <= cfg.replicas; i++ {
		site, err := freeAddr()
		if err != nil {
			return err
		}
		admin, err := freeAddr()
		if err != nil {
			return err
		}
		f.config = f.caddyfile(admin, site, cfg.memory)
		path := filepath.Join(f.dir, fmt.Sprintf("Caddyfile.c%d", i))
		if err := os.WriteFile(path, []byte(f.config), 0o644); err != nil {
			return err
		}
		r := &proc{name: fmt.Sprintf("c%d", i), addr: site, out: out,
			args: []string{exe, caddyCommand, "run", "--config", path, "--adapter", "caddyfile"}}
		f.replicas, f.admins = append(f.replicas, r), append(f.admins, admin)
	}
	key := rand.Text() + rand.Text() // one key for all replicas: they must hash session IDs alike
	for _, r := range f.replicas {
		r.env = []string{hashKeyEnv + "=" + key}
		if err := r.start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// caddyfile returns a replica's Caddyfile.
func (f *fleet) caddyfile(admin, site string, memory bool) string {
	ups := make([]string, len(f.backends))
	for i, b := range f.backends {
		ups[i] = b.addr
	}
	store := ""
	if !memory {
		store = fmt.Sprintf(`
	mcp_sessions {
		store redis {
			address %s
			hash_key {env.%s}
		}
	}`, f.redis.addr, hashKeyEnv)
	}
	_, port, _ := net.SplitHostPort(site)
	return fmt.Sprintf(`{
	admin %s
	auto_https off
	persist_config off
	grace_period 2s%s
}

http://127.0.0.1:%s {
	bind 127.0.0.1
	mcp_proxy %s
}
`, admin, store, port, strings.Join(ups, " "))
}

// urls returns the replicas' MCP endpoints.
func (f *fleet) urls() []string {
	urls := make([]string, len(f.replicas))
	for i, r := range f.replicas {
		urls[i] = "http://" + r.addr + "/mcp"
	}
	return urls
}

// print tells the user what runs where.
func (f *fleet) print(cfg config) {
	if cfg.verbose || !cfg.check {
		fmt.Printf("Caddyfile of c%d (the replicas differ only in ports):\n%s\n", len(f.replicas), f.config)
	}
	if f.redis != nil {
		fmt.Printf("Redis: %s (persistence off)\n", f.redis.addr)
	} else {
		fmt.Println("No Redis: each replica keeps its sessions in its own memory (-memory)")
	}
	for _, b := range f.backends {
		fmt.Printf("Server %s: http://%s/mcp\n", b.name, b.addr)
	}
	fmt.Println("\nCaddy replicas; put any balancer in front of them, or give a client either URL:")
	for i, u := range f.urls() {
		fmt.Printf("  c%d  %s  (admin http://%s/mcp_sessions/)\n", i+1, u, f.admins[i])
	}
	fmt.Println()
}

// stop stops everything and removes the temporary files.
func (f *fleet) stop() {
	for _, p := range f.replicas {
		p.stop()
	}
	for _, p := range f.backends {
		p.stop()
	}
	if f.redis != nil {
		f.redis.stop()
	}
	if f.dir != "" {
		os.RemoveAll(f.dir)
	}
}
