package tests

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// Caddy replicas: separate Caddy processes with the plugin, each with its
// own session table, as several Caddy instances behind a load balancer run.
// The binary is built with -race from ./cmd/caddy, once per test run and
// only when a test needs it, reusing the race build cache of this package.

var caddyBuild struct {
	once sync.Once
	path string
	err  error
}

// caddyBinary returns the path of the race-enabled Caddy binary, building it
// on first use.
func caddyBinary(t testing.TB) string {
	t.Helper()
	caddyBuild.once.Do(func() {
		caddyBuild.path = filepath.Join(binDir, "caddy")
		out, err := exec.Command("go", "build", "-race", "-o", caddyBuild.path, "../cmd/caddy").CombinedOutput()
		if err != nil {
			caddyBuild.err = fmt.Errorf("building ./cmd/caddy: %v\n%s", err, out)
		}
	})
	if caddyBuild.err != nil {
		t.Fatal(caddyBuild.err)
	}
	return caddyBuild.path
}

// replica is one Caddy process serving one site on a fixed port, which
// keeps its port across restarts.
type replica struct {
	name   string
	addr   string // the site's 127.0.0.1:port
	admin  string // its admin endpoint's 127.0.0.1:port
	global string // more global options, for example mcp_sessions
	env    []string
	dir    string
	proc   *testproc.Proc
}

// replicaTimeout bounds a replica's start (a -race Caddy starts slowly on a
// loaded machine).
const replicaTimeout = 60 * time.Second

// startReplica starts a Caddy process called name whose site holds body,
// with extra environment variables env ("KEY=value").
func startReplica(t testing.TB, name, body string, env ...string) *replica {
	t.Helper()
	return startReplicaWith(t, name, "", body, env...)
}

// startReplicaWith is startReplica with more global options.
func startReplicaWith(t testing.TB, name, global, body string, env ...string) *replica {
	t.Helper()
	r := &replica{name: name, addr: freeAddr(t), admin: freeAddr(t), global: global, env: env, dir: t.TempDir()}
	r.writeConfig(t, body)
	r.start(t)
	return r
}

// url returns the replica's MCP endpoint.
func (r *replica) url() string { return "http://" + r.addr + "/mcp" }

// config returns the replica's Caddyfile with body as its site.
func (r *replica) config(body string) string {
	logs := "log {\n\t\toutput discard\n\t}"
	if os.Getenv("MCP_TEST_CADDY_LOG") != "" {
		logs = "log {\n\t\tlevel DEBUG\n\t}"
	}
	_, port, _ := net.SplitHostPort(r.addr)
	return fmt.Sprintf(`{
	admin %s
	%s
	auto_https off
	persist_config off
	grace_period 1s
	servers {
		protocols h1 h2c
	}
	%s
}

http://:%s {
	bind 127.0.0.1
	%s
}
`, r.admin, logs, r.global, port, body)
}

// writeConfig writes the Caddyfile the replica starts with.
func (r *replica) writeConfig(t testing.TB, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(r.dir, "Caddyfile"), []byte(r.config(body)), 0o600); err != nil {
		t.Fatal(err)
	}
}

// start starts the process and waits until its site accepts connections.
func (r *replica) start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(caddyBinary(t), "run", "--config", filepath.Join(r.dir, "Caddyfile"), "--adapter", "caddyfile")
	r.proc = launch(t, r.name, r.addr, withEnv(cmd, append([]string{"XDG_DATA_HOME=" + r.dir, "XDG_CONFIG_HOME=" + r.dir}, r.env...)...))
	ready(t, replicaTimeout, []*testproc.Proc{r.proc}, testproc.Listening())
}

// stop shuts the process down gracefully (SIGTERM: in-flight requests
// finish within the grace period) and waits for it to exit.
func (r *replica) stop() { r.proc.Stop(30 * time.Second) }

// crash kills the process at once (SIGKILL), as a crash or OOM kill would.
func (r *replica) crash() { r.proc.Kill() }

// reload loads body as the replica's site through its admin endpoint, as
// `caddy reload` does.
func (r *replica) reload(t testing.TB, body string) {
	t.Helper()
	resp, err := http.Post("http://"+r.admin+"/load", "text/caddyfile", strings.NewReader(r.config(body)))
	if err != nil {
		t.Fatalf("reload %s: %v", r.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reload %s: %s", r.name, resp.Status)
	}
	r.writeConfig(t, body) // a later restart runs the same config
}

// balancer is the client side of several Caddy replicas behind one
// address: an http.RoundTripper that sends each request to a replica chosen
// at random among those in rotation, as an L4 balancer, DNS round robin or
// a Kubernetes Service does. A request whose connection is refused (a
// replica shutting down or not yet up) goes to another replica, for up to
// 30 s; nothing was sent, so nothing runs twice. It counts, per replica,
// the requests of existing sessions it answered.
type balancer struct {
	base http.RoundTripper

	mu       sync.Mutex
	rotation []string       // addresses in rotation
	served   map[string]int // requests carrying Mcp-Session-Id answered 2xx, by address
	failed   map[string]int // the same, answered otherwise
	fiveXX   []string       // every answer with a 5xx status: method, replica, status
	// learnOn, if set, takes every request without Mcp-Session-Id (an
	// initialize), so that sessions are learned on one replica; with
	// roundRobin, the others go to the replicas in rotation in turn rather
	// than at random.
	learnOn    string
	roundRobin bool
	turn       int
	answeredBy map[string]map[string]bool // session ID -> addresses that answered it 2xx
}

// newRoundRobin returns a balancer that sends each request to the next
// replica in rotation: every request of a session reaches another replica
// than the one before.
func newRoundRobin(rs ...*replica) *balancer {
	b := newBalancer(rs...)
	b.roundRobin = true
	return b
}

func newBalancer(rs ...*replica) *balancer {
	b := &balancer{base: &http.Transport{MaxIdleConnsPerHost: 64}, served: map[string]int{}, failed: map[string]int{}}
	for _, r := range rs {
		b.add(r)
	}
	return b
}

// client returns an HTTP client that goes through the balancer.
func (b *balancer) client() *http.Client { return &http.Client{Transport: b} }

// closeIdle drops the balancer's idle connections. After a reload the old
// server closes its keep-alive connections, and a POST that races onto one
// fails before reaching any handler (docs/behaviour.md, "What happens when": caddy
// reload); clients that see it reconnect, as tests do here.
func (b *balancer) closeIdle() { b.base.(*http.Transport).CloseIdleConnections() }

// drainDelay is how long the balancer keeps sending nothing to a replica
// taken out of rotation before it is stopped, so that requests already on
// their way finish: the deregistration delay of a load balancer, or a
// Kubernetes preStop sleep.
const drainDelay = 500 * time.Millisecond

// add puts the replica in rotation.
func (b *balancer) add(r *replica) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rotation = append(b.rotation, r.addr)
}

// remove takes the replica out of rotation, as a balancer does before a
// replica is stopped for a rolling restart.
func (b *balancer) remove(r *replica) {
	b.mu.Lock()
	defer b.mu.Unlock()
	kept := b.rotation[:0]
	for _, a := range b.rotation {
		if a != r.addr {
			kept = append(kept, a)
		}
	}
	b.rotation = kept
}

// pick returns the address for r: learnOn for a request without a session
// if set, else an address in rotation, at random or in turn; "" if there is
// none.
func (b *balancer) pick(r *http.Request) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.learnOn != "" && r.Header.Get("Mcp-Session-Id") == "":
		return b.learnOn
	case len(b.rotation) == 0:
		return ""
	case b.roundRobin:
		b.turn++
		return b.rotation[b.turn%len(b.rotation)]
	}
	return b.rotation[rand.IntN(len(b.rotation))]
}

// RoundTrip sends r to a random replica in rotation.
func (b *balancer) RoundTrip(r *http.Request) (*http.Response, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		addr := b.pick(r)
		if addr == "" {
			addr = r.URL.Host // nothing in rotation: wait for the caller's own
		}
		resp, err := b.base.RoundTrip(b.to(r, addr))
		if err == nil {
			b.count(addr, r, resp.StatusCode)
			return resp, nil
		}
		if !isRefused(err) || time.Now().After(deadline) || r.Context().Err() != nil {
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// to returns r addressed to addr, with a fresh body.
func (b *balancer) to(r *http.Request, addr string) *http.Request {
	out := r.Clone(r.Context())
	out.URL.Host, out.Host = addr, addr
	if r.GetBody != nil {
		out.Body, _ = r.GetBody()
	}
	return out
}

func (b *balancer) count(addr string, r *http.Request, status int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if status >= 500 {
		b.fiveXX = append(b.fiveXX, fmt.Sprintf("%s via %s: %d", r.Method, addr, status))
	}
	if r.Header.Get("Mcp-Session-Id") == "" {
		return
	}
	if status < 300 {
		b.served[addr]++
		b.noteAnswered(r.Header.Get("Mcp-Session-Id"), addr)
	} else {
		b.failed[addr]++
	}
}

// noteAnswered records that addr answered a request of session id 2xx;
// b.mu is held.
func (b *balancer) noteAnswered(id, addr string) {
	if b.answeredBy == nil {
		b.answeredBy = map[string]map[string]bool{}
	}
	if b.answeredBy[id] == nil {
		b.answeredBy[id] = map[string]bool{}
	}
	b.answeredBy[id][addr] = true
}

// replicasThatAnswered returns how many replicas answered a request of
// session id 2xx since the last resetAnswered.
func (b *balancer) replicasThatAnswered(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.answeredBy[id])
}

// resetAnswered forgets which replicas answered which sessions.
func (b *balancer) resetAnswered() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.answeredBy = nil
}

// servedBy returns the requests of existing sessions a replica answered 2xx and otherwise.
func (b *balancer) servedBy(r *replica) (ok, failed int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.served[r.addr], b.failed[r.addr]
}

// serverErrors returns the answers with a 5xx status the balancer passed on.
func (b *balancer) serverErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.fiveXX)
}

// isRefused reports whether err is a refused connection: nothing was sent.
func isRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}

// Interface guards
var _ http.RoundTripper = (*balancer)(nil)
