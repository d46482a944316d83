package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// env is one benchmark run: the work directory, the binaries it built, and
// the child processes it started.
type env struct {
	dir     string // work directory: binaries, configs, logs
	caddy   string // Caddy with the plugin (./cmd/caddy)
	whoami  string // whoami MCP server (./examples/whoami-server)
	self    string // this program, for the upstream double
	haproxy string // HAProxy binary
	procs   []*testproc.Proc
	log     io.Writer
	// pl, when set, pins the processes started from now on: proxies to
	// pl.proxy, upstreams to pl.rest (sidecar and proxy-bound parts).
	pl *placement
}

// build compiles Caddy and the whoami server into the work directory.
func (e *env) build(goBin, repo string) error {
	for _, b := range []struct {
		out       *string
		name, pkg string
	}{
		{&e.whoami, "whoami-server", "./examples/whoami-server"},
		{&e.caddy, "caddy", "./cmd/caddy"},
	} {
		*b.out = filepath.Join(e.dir, b.name)
		fmt.Fprintf(e.log, "building %s (the first Caddy build takes a few minutes)...\n", b.pkg)
		start := time.Now()
		cmd := exec.Command(goBin, "build", "-o", *b.out, b.pkg)
		cmd.Dir = repo
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build %s: %w", b.pkg, err)
		}
		fmt.Fprintf(e.log, "  built in %v\n", time.Since(start).Round(100*time.Millisecond))
	}
	return nil
}

// start starts a child process logging to <dir>/<name>.log, waits until it
// listens on addr alone (see testproc.SoleListener) for at most timeout, and
// records it for stopAll. With cpus, the process runs on those CPUs only,
// with GOMAXPROCS set to their number (for Go programs).
func (e *env) start(name, addr string, timeout time.Duration, env []string, cpus []int, bin string, args ...string) (*testproc.Proc, error) {
	f, err := os.Create(filepath.Join(e.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var p *testproc.Proc
	if cpus == nil {
		p, err = testproc.Start(name, addr, cmd, f)
	} else {
		cmd.Env = append(cmd.Env, fmt.Sprintf("GOMAXPROCS=%d", len(cpus)))
		err = startPinned(cpus, func() (err error) {
			p, err = testproc.Start(name, addr, cmd, f)
			return err
		})
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	e.procs = append(e.procs, p)
	go func() {
		<-p.Done()
		f.Close()
	}()
	if err := p.Wait(timeout, testproc.Listening(), testproc.SoleListener()); err != nil {
		p.Stop(stopGrace)
		return nil, err
	}
	if cpus != nil {
		if ok, err := threadsOn(p.Pid(), cpus); err != nil || !ok {
			p.Stop(stopGrace)
			return nil, fmt.Errorf("%s: not every thread runs on CPUs %s only (%v)", name, formatCPUList(cpus), err)
		}
	}
	return p, nil
}

// proxyCPUs are the CPUs a proxy process is started on: nil (all) unless a
// placement is set.
func (e *env) proxyCPUs() []int {
	if e.pl == nil {
		return nil
	}
	return e.pl.proxy
}

// restCPUs are the CPUs an upstream is started on.
func (e *env) restCPUs() []int {
	if e.pl == nil {
		return nil
	}
	return e.pl.rest
}

// stopGrace is how long a child may take to end after SIGTERM.
const stopGrace = 3 * time.Second

// stopAll stops every child process still running.
func (e *env) stopAll() {
	for _, p := range e.procs {
		p.Stop(stopGrace)
	}
	e.procs = nil
}

// startServers starts n whoami servers named s1..sn, answering POSTs with
// JSON (jsonMode) or SSE, and returns them with their addresses.
func (e *env) startServers(n int, jsonMode bool) ([]*testproc.Proc, []string, error) {
	return e.startFleet(n, "whoami-", "s", e.whoami, func(name, addr string) []string {
		args := []string{"-name", name, "-listen", addr}
		if jsonMode {
			args = append(args, "-json")
		}
		return args
	})
}

// startFleet starts n processes of binary named <letter>1..<letter>n (logged
// as <logPrefix><name>), each on its own free port on 127.0.0.1 with the
// arguments args gives for its name and address, and waits until each
// listens. It returns them with their addresses.
func (e *env) startFleet(n int, logPrefix, letter, binary string, args func(name, addr string) []string) ([]*testproc.Proc, []string, error) {
	var ps []*testproc.Proc
	var addrs []string
	for i := 1; i <= n; i++ {
		addr, err := testproc.FreeAddr()
		if err != nil {
			return nil, nil, err
		}
		name := fmt.Sprintf("%s%d", letter, i)
		p, err := e.start(logPrefix+name, addr, 10*time.Second, nil, e.restCPUs(), binary, args(name, addr)...)
		if err != nil {
			return nil, nil, err
		}
		ps, addrs = append(ps, p), append(addrs, addr)
	}
	return ps, addrs, nil
}

// proxyProc is a running proxy: Caddy or HAProxy.
type proxyProc struct {
	*testproc.Proc
	admin string // Caddy's admin endpoint, host:port; "" for HAProxy
}

// startCaddy runs Caddy serving route on a free port.
func (e *env) startCaddy(name, route string) (*proxyProc, error) {
	return e.startCaddyWith(name, "", route)
}

// startReplicas runs redis-server (persistence off) and two Caddy
// replicas serving route with their session table in it. It returns the
// replicas and, last, Redis.
func (e *env) startReplicas(name, route string) ([]*proxyProc, error) {
	redis, err := e.startRedis(name + "-redis")
	if err != nil {
		return nil, err
	}
	var out []*proxyProc
	for _, r := range []string{"a", "b"} {
		px, err := e.startCaddyWith(name+"-"+r, redisStoreOption(redis.Addr()), route)
		if err != nil {
			return nil, err
		}
		out = append(out, px)
	}
	return append(out, &proxyProc{Proc: redis}), nil
}

// startRedis runs redis-server with persistence off on a free port, on the
// proxy's CPUs.
func (e *env) startRedis(name string) (*testproc.Proc, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%s needs redis-server: %w", name, err)
	}
	port, err := testproc.FreePort()
	if err != nil {
		return nil, err
	}
	return e.start(name, fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second, nil, e.proxyCPUs(), bin,
		"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", e.dir)
}

// startCaddyWith runs Caddy with more global options, serving route on a
// free port.
func (e *env) startCaddyWith(name, global, route string) (*proxyProc, error) {
	return e.startCaddyEnv(name, global, route, nil)
}

// startCaddyEnv is startCaddyWith with more environment variables (GOGC,
// GOMEMLIMIT) for the Caddy process.
func (e *env) startCaddyEnv(name, global, route string, extraEnv []string) (*proxyProc, error) {
	port, err := testproc.FreePort()
	if err != nil {
		return nil, err
	}
	adminPort, err := testproc.FreePort()
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(e.dir, name+".Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(caddyfileWith(port, adminPort, global, route)), 0o644); err != nil {
		return nil, err
	}
	xdg := filepath.Join(e.dir, "xdg")
	env := append([]string{"XDG_CONFIG_HOME=" + xdg, "XDG_DATA_HOME=" + xdg, sealKeyEnv + "=" + sealKey}, extraEnv...)
	p, err := e.start(name, fmt.Sprintf("127.0.0.1:%d", port), 30*time.Second, env, e.proxyCPUs(),
		e.caddy, "run", "--config", cfgPath, "--adapter", "caddyfile")
	if err != nil {
		return nil, err
	}
	return &proxyProc{Proc: p, admin: fmt.Sprintf("127.0.0.1:%d", adminPort)}, nil
}

// startHAProxy runs HAProxy (foreground, one process) in front of upstreams on a free port.
func (e *env) startHAProxy(name string, upstreams []string, noDelay bool) (*proxyProc, error) {
	port, err := testproc.FreePort()
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(e.dir, name+".cfg")
	if err := os.WriteFile(cfgPath, []byte(haproxyConfig(port, upstreams, noDelay, len(e.proxyCPUs()))), 0o644); err != nil {
		return nil, err
	}
	p, err := e.start(name, fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second, nil, e.proxyCPUs(), e.haproxy, "-db", "-f", cfgPath)
	if err != nil {
		return nil, err
	}
	return &proxyProc{Proc: p}, nil
}

// haproxyVersion returns the first line of `haproxy -v`.
func haproxyVersion(bin string) string {
	out, err := exec.Command(bin, "-v").Output()
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line)
}

// caddyVersion returns `caddy version`.
func caddyVersion(bin string) string {
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// fetch GETs url into path, for pprof profiles.
func fetch(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}
