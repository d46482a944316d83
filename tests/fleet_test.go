package tests

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// fleet is what a scenario runs against: upstream MCP servers, the Caddy in
// front of them (replicas, each a process of its own, or a site of the
// in-process Caddy), and, when asked for, a Redis the replicas share and
// go-sdk sessions held open on the servers. newFleet builds one from
// options; it is torn down when the test ends.
type fleet struct {
	redis *redistest.Server // withRedis; nil without
	srv   []*testproc.Proc  // the upstream servers started as processes (withServers, withServersOf)
	ups   []string          // every upstream's dial address (host:port), in order
	names []string          // every upstream's name, in order
	down  []string          // withHealthDown: the down file of each of srv
	name  string            // withReplicas: the replicas' name prefix
	rs    []*replica        // withReplicas: the Caddy replicas
	lb    *balancer         // withLearnOnFirst: a balancer over rs
	p     proxy             // withSite: the site of the in-process Caddy
	hc    *http.Client      // the fleet's own HTTP client, for withHeldSessions

	// withHeldSessions: the sessions held open, by the server that answered
	// their first call, and that first answer.
	sessions map[string][]*mcp.ClientSession
	first    map[*mcp.ClientSession]identity

	// withScriptedServers: the upstreams are whoami servers that a control
	// script (scriptCtl) starts on fixed ports and replaces, recording each
	// one's PID in dir/PORT.pid.
	dir   string
	ctl   string
	ports []int
	pids  []int // the first version's PIDs
}

// fleetSpec is what the options ask newFleet for.
type fleetSpec struct {
	servers, held, replicas int
	json                    bool
	health                  bool
	given                   []*testproc.Proc
	scripted                []string
	redis                   bool
	prefix                  string
	global, body, site      func(f *fleet) string
	env                     []string
	learnOnFirst            bool
}

// fleetOption is one option of newFleet.
type fleetOption func(*fleetSpec)

// withServers starts n go-sdk whoami servers s1..sn, answering POSTs with
// JSON (json) or SSE.
func withServers(n int, json bool) fleetOption {
	return func(s *fleetSpec) { s.servers, s.json = n, json }
}

// withHealthDown gives every server a health endpoint (GET /healthz) that
// fails while its down file exists (see fleet.setDown).
func withHealthDown() fleetOption { return func(s *fleetSpec) { s.health = true } }

// withServersOf uses servers started elsewhere (for example shared by two
// fleets, or TypeScript SDK servers) as the upstreams.
func withServersOf(srv []*testproc.Proc) fleetOption {
	return func(s *fleetSpec) { s.given = srv }
}

// withScriptedServers starts one whoami server per name through the
// control script scriptCtl, each on a free port, so that a shell script
// (the rolling deploy example) can stop and replace them.
func withScriptedServers(names ...string) fleetOption {
	return func(s *fleetSpec) { s.scripted = names }
}

// withRedis starts a Redis for the replicas' tables (see redisStore).
func withRedis() fleetOption { return func(s *fleetSpec) { s.redis = true } }

// withReplicas starts n Caddy replicas <prefix>1..<prefix>n with the
// global options global(f) and the site body(f) (nil for none), and the
// environment variables env on top of the shared MCP_SESSIONS_HASH_KEY.
// When the test ends each is stopped and checked for a reported data race.
func withReplicas(n int, prefix string, global, body func(f *fleet) string, env ...string) fleetOption {
	return func(s *fleetSpec) { s.replicas, s.prefix, s.global, s.body, s.env = n, prefix, global, body, env }
}

// withLearnOnFirst puts a balancer in front of the replicas that sends
// every initialize to the first replica and every other request to the
// replicas in turn.
func withLearnOnFirst() fleetOption { return func(s *fleetSpec) { s.learnOnFirst = true } }

// withSite serves body(f) on a site of the in-process Caddy (f.p).
func withSite(body func(f *fleet) string) fleetOption { return func(s *fleetSpec) { s.site = body } }

// withHeldSessions opens n go-sdk sessions through the site, learns with a
// first call which server answers each, and checks that every server got
// some; they are closed when the test ends.
func withHeldSessions(n int) fleetOption { return func(s *fleetSpec) { s.held = n } }

// newFleet starts what the options ask for, in order: Redis, servers,
// replicas (and their balancer), the in-process site, held sessions.
func newFleet(t *testing.T, opts ...fleetOption) *fleet {
	t.Helper()
	var s fleetSpec
	for _, o := range opts {
		o(&s)
	}
	f := &fleet{hc: newHTTPClient()}
	t.Cleanup(f.teardown)
	if s.redis {
		f.redis = redistest.Start(t)
	}
	f.startServers(t, s)
	if s.replicas > 0 {
		global, body := "", ""
		if s.global != nil {
			global = s.global(f)
		}
		if s.body != nil {
			body = s.body(f)
		}
		f.name = s.prefix
		f.rs = startRaceCheckedReplicas(t, s.replicas, s.prefix, global, body, s.env...)
	}
	if s.learnOnFirst {
		f.lb = newBalancer(f.rs...)
		f.lb.learnOn, f.lb.roundRobin = f.rs[0].addr, true
	}
	if s.site != nil {
		f.p = startProxy(t, s.site(f))
	}
	if s.held > 0 {
		f.holdSessions(t, s.held)
	}
	return f
}

// startServers starts (or takes) the upstream servers.
func (f *fleet) startServers(t *testing.T, s fleetSpec) {
	t.Helper()
	switch {
	case len(s.given) > 0:
		f.srv = s.given
	case s.servers > 0:
		var flags func(name string) []string
		if s.health {
			dir := t.TempDir()
			for i := range s.servers {
				f.down = append(f.down, filepath.Join(dir, fmt.Sprintf("s%d.down", i+1)))
			}
			flags = func(name string) []string { return []string{"-down-file", filepath.Join(dir, name+".down")} }
		}
		f.srv = startBackendsWith(t, s.servers, s.json, flags)
	case len(s.scripted) > 0:
		f.startScripted(t, s.scripted)
		return
	}
	for _, p := range f.srv {
		f.ups, f.names = append(f.ups, p.Addr()), append(f.names, p.Name())
	}
}

// holdSessions opens n sessions through the site (see withHeldSessions).
func (f *fleet) holdSessions(t *testing.T, n int) {
	t.Helper()
	f.sessions, f.first = map[string][]*mcp.ClientSession{}, map[*mcp.ClientSession]identity{}
	ctx := context.Background()
	for range n {
		cs, err := connect(ctx, f.p.url(), f.hc)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		t.Cleanup(func() { cs.Close() })
		id, err := whoami(ctx, cs)
		if err != nil {
			t.Fatalf("whoami: %v", err)
		}
		f.sessions[id.Server] = append(f.sessions[id.Server], cs)
		f.first[cs] = id
	}
	for _, name := range f.names {
		if len(f.sessions[name]) == 0 {
			t.Fatalf("want sessions on every server, got %v", f.sessions)
		}
	}
}

// teardown releases what the fleet holds itself; processes stop through
// their own cleanups (launch, startRaceCheckedReplicas, startScripted).
func (f *fleet) teardown() { f.hc.CloseIdleConnections() }

// startRaceCheckedReplicas starts n replicas <prefix>1..<prefix>n with
// global options, body and more environment variables env, and checks,
// when the test ends, that none reported a data race.
func startRaceCheckedReplicas(t *testing.T, n int, prefix, global, body string, env ...string) []*replica {
	rs := make([]*replica, n)
	for i := range rs {
		rs[i] = startReplicaWith(t, fmt.Sprintf("%s%d", prefix, i+1), global, body, append([]string{"MCP_SESSIONS_HASH_KEY=" + replicaHashKey}, env...)...)
		r := rs[i]
		t.Cleanup(func() {
			r.stop()
			if log := r.proc.Log().String(); strings.Contains(log, "DATA RACE") {
				t.Errorf("replica %s (built with -race) reported a data race:\n%s", r.name, log)
			}
		})
	}
	return rs
}

// startStoreReplicas starts n replicas c1..cn (see startRaceCheckedReplicas).
func startStoreReplicas(t *testing.T, n int, global, body string, env ...string) []*replica {
	return startRaceCheckedReplicas(t, n, "c", global, body, env...)
}

// urls returns the replicas' MCP endpoints, the first replica's first.
func (f *fleet) urls() []string {
	us := make([]string, len(f.rs))
	for i, r := range f.rs {
		us[i] = r.url()
	}
	return us
}

// setDown makes server i fail (or pass) its health checks.
func (f *fleet) setDown(t *testing.T, i int, down bool) {
	t.Helper()
	var err error
	if down {
		err = os.WriteFile(f.down[i], nil, 0o644)
	} else {
		err = os.Remove(f.down[i])
	}
	if err != nil {
		t.Fatal(err)
	}
}

// scriptCtl is a control script that starts a whoami server on a given
// port and records its PID in DIR/PORT.pid, so the rolling deploy script's
// --stop can be `kill $(cat DIR/{port}.pid)`. Without a name, it starts the
// next version of the server last started on the port: NAME-v2.
const scriptCtl = `#!/usr/bin/env bash
# usage: ctl.sh start HOST PORT [NAME]
set -euo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
bin=%s
[ "$1" = start ] || { echo "usage: ctl.sh start HOST PORT [NAME]" >&2; exit 2; }
host=$2 port=$3
if [ -n "${4:-}" ]; then
	name=$4
	echo "$name" >"$dir/$port.name"
else
	name=$(cat "$dir/$port.name")-v2
fi
"$bin" -listen "$host:$port" -name "$name" >>"$dir/$port.log" 2>&1 &
echo $! >"$dir/$port.pid"
`

// startScripted starts one whoami server per name through scriptCtl.
func (f *fleet) startScripted(t *testing.T, names []string) {
	t.Helper()
	f.dir, f.names = t.TempDir(), names
	// Registered after the directory, so it runs before the directory is
	// removed: the PID files of every version are still there to read.
	t.Cleanup(f.killScripted)
	f.ctl = filepath.Join(f.dir, "ctl.sh")
	if err := os.WriteFile(f.ctl, fmt.Appendf(nil, scriptCtl, shellQuote(whoamiBin)), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		port := mustFreePort()
		up := fmt.Sprintf("127.0.0.1:%d", port)
		out, err := exec.Command("bash", f.ctl, "start", "127.0.0.1", strconv.Itoa(port), name).CombinedOutput()
		if err != nil {
			t.Fatalf("starting %s: %v\n%s", name, err, out)
		}
		f.ups, f.ports = append(f.ups, up), append(f.ports, port)
		f.pids = append(f.pids, f.pid(t, len(f.ports)-1))
		waitAccepting(t, up)
	}
}

// pid returns the PID recorded for scripted server i.
func (f *fleet) pid(t testing.TB, i int) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(f.dir, fmt.Sprintf("%d.pid", f.ports[i])))
	if err != nil {
		t.Fatalf("reading the PID of %s: %v", f.ups[i], err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("PID file of %s: %v", f.ups[i], err)
	}
	return pid
}

// killScripted kills every scripted server, old and new versions.
func (f *fleet) killScripted() {
	pids := slices.Clone(f.pids)
	for _, port := range f.ports {
		if data, err := os.ReadFile(filepath.Join(f.dir, fmt.Sprintf("%d.pid", port))); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	for _, pid := range pids {
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
	}
}

// stopCmd is the --stop command: `kill $(cat DIR/{port}.pid)`, the usual
// way to stop a server that wrote a PID file.
func (f *fleet) stopCmd() string {
	return fmt.Sprintf("kill $(cat %s/{port}.pid)", shellQuote(f.dir))
}

// startCmd is the --start command, which starts the next version.
func (f *fleet) startCmd() string {
	return fmt.Sprintf("bash %s start {host} {port}", shellQuote(f.ctl))
}

// log returns the output of the scripted servers that ran on port i.
func (f *fleet) log(i int) string {
	data, _ := os.ReadFile(filepath.Join(f.dir, fmt.Sprintf("%d.log", f.ports[i])))
	return string(data)
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// waitAccepting waits until addr accepts TCP connections. The server was
// started by the control script, not by launch, so there is no process to
// watch: only its port.
func waitAccepting(t testing.TB, addr string) {
	t.Helper()
	if !testproc.Until(whoamiTimeout, func() bool { return testproc.Accepts(addr) }) {
		t.Fatalf("%s does not accept connections after %v", addr, whoamiTimeout)
	}
}
