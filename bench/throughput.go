package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// scenario is one row of the throughput table: a way to reach the servers.
type scenario struct {
	key     string
	label   string
	servers int    // how many whoami servers behind it
	kind    string // direct, caddy, replicas or haproxy
	route   func(upstreams []string) string
	group   string   // rows compared with each other: "3" or "1" servers
	sealed  bool     // the proxy seals session IDs: servers see IDs of their own
	env     []string // more environment of the Caddy process (variants: GOGC=400)
	h2c     bool     // proxies to the upstreams over h2c: only the doubles serve it
	global  string   // more global options of the Caddyfile (variants: proxy_log=off)
}

// scenarios are the rows, in the order they run and print.
var scenarios = []scenario{
	{key: "direct3", label: "direct (3 servers)", servers: 3, kind: "direct", group: "3"},
	{key: "mcp_proxy3", label: "Caddy mcp_proxy (3)", servers: 3, kind: "caddy", group: "3",
		route: func(u []string) string { return mcpProxyRoute(u, 0, "") }},
	{key: "mcp_proxy3_sealed", label: "Caddy mcp_proxy, sealed IDs (3)", servers: 3, kind: "caddy", group: "3", sealed: true,
		route: sealedRoute},
	{key: "mcp_proxy3_failover", label: "Caddy mcp_proxy, failover (3)", servers: 3, kind: "caddy", group: "3",
		route: func(u []string) string { return mcpProxyRoute(u, 0, "\t\tfailover reinitialize\n") }},
	{key: "haproxy3", label: "HAProxy stick table (3)", servers: 3, kind: "haproxy", group: "3"},
	{key: "replicas3", label: "2 Caddy replicas sharing Redis (3)", servers: 3, kind: "replicas", group: "3",
		route: func(u []string) string { return mcpProxyRoute(u, 0, "") }},
	{key: "rr3", label: "stock reverse_proxy round_robin (3)", servers: 3, kind: "caddy", group: "3",
		route: func(u []string) string { return stockRoute(u, "round_robin") }},
	{key: "direct1", label: "direct (1 server)", servers: 1, kind: "direct", group: "1"},
	{key: "stock1", label: "stock Caddy reverse_proxy (1)", servers: 1, kind: "caddy", group: "1",
		route: func(u []string) string { return stockRoute(u, "") }},
	{key: "mcp_proxy1", label: "Caddy mcp_proxy (1)", servers: 1, kind: "caddy", group: "1",
		route: func(u []string) string { return mcpProxyRoute(u, 0, "") }},
	{key: "haproxy1", label: "HAProxy stick table (1)", servers: 1, kind: "haproxy", group: "1"},
}

// defaultScenarios runs every row but rr3, which only shows the failure the
// plugin fixes (almost every call misrouted).
const defaultScenarios = "direct3,mcp_proxy3,mcp_proxy3_sealed,mcp_proxy3_failover,replicas3,haproxy3,direct1,stock1,mcp_proxy1,haproxy1"

// tpResult is one measured row.
type tpResult struct {
	mode       string // json or sse
	sc         scenario
	load       loadResult
	proxyRSS   int64 // peak RSS (VmHWM) of the proxy process; 0 for direct
	proxyCPU   time.Duration
	serversCPU time.Duration
	otherCPU   time.Duration // CPU the rest of the machine used in the window
	// With a placement: CPU other processes than the row's used on the
	// proxy's CPUs, and on the generator's and upstreams' CPUs.
	otherOnProxy, otherOnRest time.Duration
	// byRound is the calls/s of the row's run in each round, in round
	// order (0 for a failed run), when the row ran in rounds.
	byRound []float64
	err     error
}

// runScenario starts fresh servers and the scenario's proxy, runs the load
// and stops them.
func (e *env) runScenario(o *options, mode string, sc scenario, round int) (res tpResult) {
	res = tpResult{mode: mode, sc: sc}
	if sc.h2c && (e.pl == nil || e.pl.part != "proxybound") {
		res.err = fmt.Errorf("h2c to the upstreams runs in the proxybound part only: the whoami servers (go-sdk on net/http) serve HTTP/1.1 only")
		return res
	}
	defer e.stopAll()
	servers, addrs, err := e.startUpstreams(sc.servers, mode)
	if err != nil {
		res.err = err
		return res
	}
	var px *proxyProc
	var others []*proxyProc // more processes of the proxy tier: the second replica, Redis
	name := fmt.Sprintf("%s-%s-r%d", sc.key, mode, round)
	if e.pl != nil {
		name = e.pl.part + "-" + name
	}
	switch sc.kind {
	case "caddy":
		px, err = e.startCaddyEnv(name, sc.global, sc.route(addrs), sc.env)
	case "replicas":
		var tier []*proxyProc
		if tier, err = e.startReplicas(name, sc.route(addrs)); err == nil {
			px, others = tier[0], tier[1:]
		}
	case "haproxy":
		px, err = e.startHAProxy(name, addrs, true)
	}
	if err != nil {
		res.err = err
		return res
	}
	targets := addrs
	var callTargets []string
	if px != nil {
		targets = []string{px.Addr()}
	}
	if sc.kind == "replicas" { // initialize on one replica, call through the other
		targets, callTargets = []string{px.Addr(), others[0].Addr()}, []string{others[0].Addr(), px.Addr()}
	}

	var cpu0, srv0 time.Duration
	var busy0 time.Duration
	var gen0, onProxy0, onRest0 time.Duration
	var profWG sync.WaitGroup
	cfg := loadConfig{addrs: targets, callAddrs: callTargets, sessions: o.sessions, warmup: o.warmup, duration: o.duration, sealed: sc.sealed}
	cfg.onWindow = func(open bool) {
		srv := time.Duration(0)
		for _, s := range servers {
			srv += procCPU(s.Pid())
		}
		busy, _ := machineCPU()
		gen := selfCPU()
		var pcpu time.Duration
		if px != nil {
			pcpu = procCPU(px.Pid())
		}
		for _, p := range others {
			pcpu += procCPU(p.Pid())
		}
		onProxy, onRest := cpusBusy(e.proxyCPUs()), cpusBusy(e.restCPUs())
		if open {
			cpu0, srv0, busy0, gen0, onProxy0, onRest0 = pcpu, srv, busy, gen, onProxy, onRest
			if o.pprofDir != "" && px != nil && px.admin != "" {
				e.profile(o, px, name, &profWG)
			}
			return
		}
		res.proxyCPU, res.serversCPU = pcpu-cpu0, srv-srv0
		res.otherCPU = max(busy-busy0-(gen-gen0)-res.proxyCPU-res.serversCPU, 0)
		if e.pl != nil {
			res.otherOnProxy = max(onProxy-onProxy0-res.proxyCPU, 0)
			res.otherOnRest = max(onRest-onRest0-(gen-gen0)-res.serversCPU, 0)
		}
	}
	res.load = runLoad(cfg)
	profWG.Wait()
	if px != nil {
		res.proxyRSS = procStatus(px.Pid(), "VmHWM")
		if px.Exited() {
			res.err = fmt.Errorf("%s exited during the run: %s", px.Name(), px.Log().Tail(2000))
		}
	}
	return res
}

// startUpstreams starts the row's upstreams: whoami servers, or in the
// proxy-bound part upstream doubles (which also serve h2c, for the h2c
// variant), answering POSTs in mode (json or sse).
func (e *env) startUpstreams(n int, mode string) ([]*testproc.Proc, []string, error) {
	if e.pl != nil && e.pl.part == "proxybound" {
		return e.startDoublesSSE(n, time.Millisecond, time.Hour, true, mode == "sse")
	}
	return e.startServers(n, mode == "json")
}

// profile fetches a CPU and an allocation profile of the Caddy process over
// the measured window, from its admin endpoint's /debug/pprof.
func (e *env) profile(o *options, px *proxyProc, name string, wg *sync.WaitGroup) {
	secs := max(int(o.duration.Seconds())-1, 1)
	for _, p := range []struct{ kind, file string }{
		{"profile", name + ".cpu.pprof"},
		{"allocs", name + ".allocs.pprof"},
	} {
		url := fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", px.admin, p.kind, secs)
		path := filepath.Join(o.pprofDir, p.file)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), o.duration+30*time.Second)
			defer cancel()
			if err := fetch(ctx, url, path); err != nil {
				fmt.Fprintf(e.log, "  pprof %s: %v\n", p.kind, err)
			}
		})
	}
}
