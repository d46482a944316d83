package tests

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// The MCP conformance suite (@modelcontextprotocol/conformance, server
// mode) acts as an MCP client against a URL and checks every scenario's
// wire messages. These tests run it against servers directly and through
// mcp_proxy over several processes of the same server: the proxy must be
// invisible, i.e. every check must come out the same.

var (
	// confScenarioLine is the suite's summary line of one scenario.
	confScenarioLine = regexp.MustCompile(`(?m)^[✓✗] (\S+): (\d+) passed, (\d+) failed`)
	// confTotalLine is the suite's final summary line.
	confTotalLine = regexp.MustCompile(`(?m)^Total: (\d+) passed, (\d+) failed`)
	// confResultDir is the name of the directory a scenario's checks.json is saved in.
	confResultDir = regexp.MustCompile(`^server-(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$`)
)

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
