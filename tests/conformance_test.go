package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// The MCP conformance suite (@modelcontextprotocol/conformance, server
// mode) acts as an MCP client against a URL and checks every scenario's
// wire messages. These tests run it against servers directly and through
// mcp_proxy over several processes of the same server: the proxy must be
// invisible, i.e. every check must come out the same.

// confSpecVersion is the protocol version the suite's scenarios are filtered by.
const confSpecVersion = "2025-11-25"

// confResult is one run of the conformance suite's server scenarios.
type confResult struct {
	checks    map[string]string // "scenario/check-id" → status (SUCCESS, FAILURE, WARNING, …)
	details   map[string]string // "scenario/check-id" → the check's details and error message, if it did not pass
	scenarios int
	passed    int // checks with status SUCCESS
	failed    int // checks with status FAILURE
	output    string
}

func (r confResult) String() string {
	return fmt.Sprintf("%d passed, %d failed in %d scenarios", r.passed, r.failed, r.scenarios)
}

var (
	// confScenarioLine is the suite's summary line of one scenario.
	confScenarioLine = regexp.MustCompile(`(?m)^[✓✗] (\S+): (\d+) passed, (\d+) failed`)
	// confTotalLine is the suite's final summary line.
	confTotalLine = regexp.MustCompile(`(?m)^Total: (\d+) passed, (\d+) failed`)
	// confResultDir is the name of the directory a scenario's checks.json is saved in.
	confResultDir = regexp.MustCompile(`^server-(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$`)
)

// runConformance runs the suite's active server scenarios for
// confSpecVersion against url and reads the checks it saved (one
// checks.json per scenario, under -o). A scenario that crashed before
// saving counts as one failed check "scenario/(run)".
func runConformance(t *testing.T, env tsNodeEnv, label, url string) confResult {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "conformance-"+label)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.node,
		filepath.Join(env.dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js"),
		"server", "--url", url, "--spec-version", confSpecVersion, "-o", dir)
	cmd.Dir = env.dir
	out, err := cmd.CombinedOutput() // exits 1 when a check failed: judged below
	res := confResult{checks: map[string]string{}, details: map[string]string{}, output: string(out)}
	total := confTotalLine.FindStringSubmatch(res.output)
	if total == nil {
		t.Fatalf("conformance %s: no summary (%v):\n%s", label, err, out)
	}
	scenarios := map[string]bool{}
	for _, m := range confScenarioLine.FindAllStringSubmatch(res.output, -1) {
		scenarios[m[1]] = true
	}
	res.scenarios = len(scenarios)
	entries, _ := os.ReadDir(dir)
	saved := map[string]bool{}
	for _, e := range entries {
		m := confResultDir.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, e.Name(), "checks.json"))
		if err != nil {
			t.Fatalf("conformance %s: %v", label, err)
		}
		var checks []struct {
			ID           string          `json:"id"`
			Status       string          `json:"status"`
			ErrorMessage string          `json:"errorMessage"`
			Details      json.RawMessage `json:"details"`
		}
		if err := json.Unmarshal(raw, &checks); err != nil {
			t.Fatalf("conformance %s: %s: %v", label, e.Name(), err)
		}
		saved[m[1]] = true
		seen := map[string]int{}
		for _, c := range checks {
			key := m[1] + "/" + c.ID
			if seen[c.ID]++; seen[c.ID] > 1 {
				key += "#" + strconv.Itoa(seen[c.ID])
			}
			res.checks[key] = c.Status
			if c.Status != "SUCCESS" {
				var details bytes.Buffer
				_ = json.Compact(&details, c.Details)
				res.details[key] = strings.TrimSpace(c.ErrorMessage + " " + details.String())
			}
		}
	}
	for s := range scenarios {
		if !saved[s] {
			res.checks[s+"/(run)"] = "FAILURE"
		}
	}
	for _, st := range res.checks {
		switch st {
		case "SUCCESS":
			res.passed++
		case "FAILURE":
			res.failed++
		}
	}
	if want := total[1] + "/" + total[2]; fmt.Sprintf("%d/%d", res.passed, res.failed) != want {
		t.Logf("conformance %s: checks read %d/%d, summary says %s passed/failed", label, res.passed, res.failed, want)
	}
	if res.scenarios == 0 || len(res.checks) == 0 {
		t.Fatalf("conformance %s: no scenarios ran:\n%s", label, out)
	}
	return res
}

// confDiff lists the checks whose status differs between a and b.
func confDiff(a, b confResult) []string {
	var diff []string
	for k, sa := range a.checks {
		if sb, ok := b.checks[k]; !ok || sa != sb {
			diff = append(diff, fmt.Sprintf("%s: %s vs %s %s", k, sa, confOrMissing(sb, ok), b.details[k]))
		}
	}
	for k, sb := range b.checks {
		if _, ok := a.checks[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s: missing vs %s", k, sb))
		}
	}
	slices.Sort(diff)
	return diff
}

func confOrMissing(s string, ok bool) string {
	if !ok {
		return "missing"
	}
	return s
}

// confFailures lists the checks of r that did not pass.
func confFailures(r confResult) []string {
	var f []string
	for k, st := range r.checks {
		if st != "SUCCESS" {
			f = append(f, k+" "+st)
		}
	}
	slices.Sort(f)
	return f
}

// startConformanceGoServers builds go-sdk's conformance everything-server
// and starts n stateful instances on free 127.0.0.1 ports.
func startConformanceGoServers(t *testing.T, n int) []*testproc.Proc {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "everything-server")
	build := exec.Command("go", "build", "-o", bin, "github.com/modelcontextprotocol/go-sdk/conformance/everything-server")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building go-sdk's conformance everything-server: %v\n%s", err, out)
	}
	ps := make([]*testproc.Proc, n)
	for i := range ps {
		addr := freeAddr(t)
		ps[i] = launch(t, fmt.Sprintf("g%d", i+1), addr, exec.Command(bin, "-http="+addr, "-stateless=false"))
	}
	ready(t, whoamiTimeout, ps, testproc.Listening())
	return ps
}

// TestInteropConformanceGoSDK runs the conformance suite against go-sdk's
// conformance everything-server (stateful): against one instance directly,
// and through mcp_proxy over two instances. Every check must come out the
// same through the proxy as direct, and both upstreams must have served
// sessions (else the comparison would prove nothing). Through stock
// reverse_proxy with round_robin over the same two instances the results
// must differ (negative control: the suite can see misrouted sessions).
//
// It also runs the suite through `mcp_proxy { header_up Host {host} }`,
// which passes the client's Host as stock reverse_proxy does, and requires
// every check to come out as direct there too. The two runs differ only in
// mcp_proxy's default Host, the upstream's own host:port for these loopback
// upstreams (`header_up Host {mcp.host_for_upstream}`): when the
// default run differs from direct and this one does not, the difference
// comes from the Host rewrite (see the dns-rebinding-protection scenario).
func TestInteropConformanceGoSDK(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/conformance")
	gs := startConformanceGoServers(t, 2)

	direct := runConformance(t, env, "direct", gs[0].URL())
	t.Logf("direct (%s): %s; not passed: %v", gs[0].Name(), direct, confFailures(direct))

	p := startProxy(t, "mcp_proxy "+upstreams(gs))
	proxied := runConformance(t, env, "mcp_proxy", p.url())
	t.Logf("mcp_proxy over %d servers: %s; not passed: %v", len(gs), proxied, confFailures(proxied))
	for _, g := range gs {
		if n := mustUpstream(t, "default", g.Addr()).LiveSessions; n == 0 {
			t.Errorf("mcp_proxy pinned no conformance session to %s (%s)", g.Name(), g.Addr())
		} else {
			t.Logf("mcp_proxy pinned %d conformance sessions to %s", n, g.Name())
		}
	}
	diffDefault := confDiff(direct, proxied)
	if len(diffDefault) > 0 {
		t.Errorf("through mcp_proxy, %d checks differ from direct (direct vs proxy):\n  %s",
			len(diffDefault), strings.Join(diffDefault, "\n  "))
	}

	pHost := startProxy(t, "mcp_proxy "+upstreams(gs)+" {\n\t\theader_up Host {host}\n\t}")
	proxiedHost := runConformance(t, env, "mcp_proxy-host", pHost.url())
	t.Logf("mcp_proxy with header_up Host {host}: %s; not passed: %v", proxiedHost, confFailures(proxiedHost))
	if d := confDiff(direct, proxiedHost); len(d) > 0 {
		t.Errorf("through mcp_proxy with header_up Host {host}, %d checks differ from direct (direct vs proxy):\n  %s",
			len(d), strings.Join(d, "\n  "))
	} else if len(diffDefault) > 0 {
		t.Errorf("the difference through mcp_proxy comes from its default Host for loopback upstreams, their own host:port: " +
			"the upstream sees its own address instead of the client's Host, so its DNS-rebinding protection " +
			"(reject a non-localhost Host) never fires, and the proxy accepts what the server alone rejects")
	}

	stock := startProxy(t, stockRoundRobin(gs))
	ctrl := runConformance(t, env, "stock", stock.url())
	d := confDiff(direct, ctrl)
	t.Logf("stock round_robin (negative control): %s; %d checks differ from direct:\n  %s", ctrl, len(d), strings.Join(d, "\n  "))
	if len(d) == 0 {
		t.Errorf("negative control: stock round_robin gave the same results as direct, so this test cannot see misrouting")
	}
	if t.Failed() {
		return
	}
	recordInterop(interopRow{
		Server: fmt.Sprintf("go-sdk %s conformance everything-server, stateful (2 processes)", goSDKVersion),
		Client: fmt.Sprintf("MCP conformance suite %s (spec %s)", conformanceVersion, confSpecVersion),
		Result: fmt.Sprintf("%s, every check as direct; stock `round_robin`: differs", proxied),
	})
}

// startServerEverything starts n server-everything processes in streamable
// HTTP mode on 127.0.0.1 (see TestInteropConformanceServerEverything).
func startServerEverything(t *testing.T, env tsNodeEnv, n int) []*testproc.Proc {
	t.Helper()
	ss := startTSPeers(t, n, "e", func(name string) *exec.Cmd {
		cmd := exec.Command(env.node, "--import", filepath.Join(env.dir, "loopback.mjs"),
			filepath.Join(env.dir, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js"), "streamableHttp")
		cmd.Dir = env.dir
		cmd.Env = append(os.Environ(), "PORT=0")
		return cmd
	})
	for _, s := range ss {
		if host, _, _ := net.SplitHostPort(s.Addr()); host != "127.0.0.1" {
			t.Fatalf("server-everything %s listens on %s; want 127.0.0.1", s.Name(), s.Addr())
		}
	}
	return ss
}

// TestInteropConformanceServerEverything runs the conformance suite
// against the TypeScript reference server, server-everything, in
// streamable HTTP mode: against one instance directly, and through
// mcp_proxy over two instances. Every check must come out the same through
// the proxy as direct (many fail in both: server-everything lacks the
// suite's fixture tools, resources and prompts).
//
// server-everything listens on every interface and has no host setting;
// tests/node/loopback.mjs, preloaded with --import, makes it listen on
// 127.0.0.1 and report the port it got for PORT=0.
func TestInteropConformanceServerEverything(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/conformance", "@modelcontextprotocol/server-everything")
	ss := startServerEverything(t, env, 3)
	directServer, ups := ss[0], ss[1:]

	direct := runConformance(t, env, "direct", directServer.URL())
	t.Logf("direct: %s; not passed: %v", direct, confFailures(direct))

	p := startProxy(t, "mcp_proxy "+upstreams(ups))
	proxied := runConformance(t, env, "mcp_proxy", p.url())
	t.Logf("mcp_proxy over %d servers: %s", len(ups), proxied)
	for _, u := range ups {
		if n := mustUpstream(t, "default", u.Addr()).LiveSessions; n == 0 {
			t.Errorf("mcp_proxy pinned no conformance session to %s (%s)", u.Name(), u.Addr())
		} else {
			t.Logf("mcp_proxy pinned %d conformance sessions to %s", n, u.Name())
		}
	}
	// server-everything has no DNS rebinding protection of its own; the
	// proxy's (localhost_protection) makes that one check pass through it.
	// Every other check must come out as direct.
	const rebinding = "dns-rebinding-protection/localhost-host-rebinding-rejected"
	if direct.checks[rebinding] != "FAILURE" || proxied.checks[rebinding] != "SUCCESS" {
		t.Errorf("check %s: direct %s, through mcp_proxy %s; want FAILURE direct (server-everything has no protection) and SUCCESS through the proxy's",
			rebinding, direct.checks[rebinding], proxied.checks[rebinding])
	}
	proxied.checks[rebinding] = direct.checks[rebinding]
	if d := confDiff(direct, proxied); len(d) > 0 {
		t.Fatalf("through mcp_proxy, %d checks differ from direct (direct vs proxy):\n  %s", len(d), strings.Join(d, "\n  "))
	}
	recordInterop(interopRow{
		Server: fmt.Sprintf("TypeScript server-everything %s, streamable HTTP (2 processes)", serverEverythingVersion),
		Client: fmt.Sprintf("MCP conformance suite %s (spec %s)", conformanceVersion, confSpecVersion),
		Result: fmt.Sprintf("%s: every check as direct, except that the proxy's DNS rebinding protection passes %s, which server-everything alone fails (its other failures are fixtures it lacks)", direct, rebinding),
	})
}
