package tests

import (
	"fmt"
	"strings"
	"testing"
)

// The interop pairs and the conformance suite again, through an mcp_proxy
// with seal_session_ids: the clients hold sealed values, the servers see
// their own session IDs, and everything comes out as without sealing.

// TestInteropSealedTSSDK: TypeScript SDK servers (SSE and JSON responses,
// 3 processes) behind an mcp_proxy with seal_session_ids, driven by 50
// TypeScript SDK client sessions and 50 go-sdk client sessions.
func TestInteropSealedTSSDK(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	t.Setenv("MCP_SESSION_KEY", newSealKey(t))
	const sessions, calls = 50, 5
	for _, mode := range []struct {
		name  string
		flags []string
	}{{"SSE responses", nil}, {"JSON responses", []string{"--json"}}} {
		t.Run(strings.Fields(mode.name)[0], func(t *testing.T) {
			ss := startTSServers(t, env, 3, "t", mode.flags...)
			p := startProxy(t, sealedProxy(upstreams(ss), "MCP_SESSION_KEY"))
			server := sealedRow(fmt.Sprintf("TypeScript SDK %s, stateful, %s (3 processes)", tsSDKVersion, mode.name))

			ts := runTSClients(t, env, p.url(), sessions, calls, "--sealed")
			t.Logf("TypeScript clients: %+v", ts)
			if ts.OK != sessions || ts.Calls != sessions*calls || ts.Deleted != sessions {
				t.Fatalf("TypeScript clients: want %d/%d sessions ok, %d pinned calls, %d DELETEs; got %+v",
					sessions, sessions, sessions*calls, sessions, ts)
			}
			recordInterop(interopRow{
				Server: server,
				Client: "TypeScript SDK " + tsSDKVersion,
				Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the session's server, which sees its own session ID; %d/%d DELETEs ok",
					ts.OK, sessions, ts.Calls, sessions*calls, ts.Deleted, sessions),
			})

			gores := runSessions(t, p.url(), sessions, sessionPlan{calls: calls, sealed: true})
			t.Logf("go-sdk clients: %s", gores)
			if gores.ok != sessions || gores.onCreator != sessions*calls {
				t.Fatalf("go-sdk clients: want %d/%d sessions and %d pinned calls; got %s", sessions, sessions, sessions*calls, gores)
			}
			recordInterop(interopRow{
				Server: server,
				Client: "go-sdk " + goSDKVersion,
				Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the session's server, which sees its own session ID",
					gores.ok, sessions, gores.onCreator, sessions*calls),
			})
		})
	}
}

// TestInteropSealedGoSDK: go-sdk servers and clients, SSE and JSON
// responses, through an mcp_proxy with seal_session_ids.
func TestInteropSealedGoSDK(t *testing.T) {
	t.Setenv("MCP_SESSION_KEY", newSealKey(t))
	for _, mode := range []struct {
		name string
		json bool
	}{{"SSE responses", false}, {"JSON responses", true}} {
		bs := startBackends(t, 3, mode.json)
		p := startProxy(t, sealedProxy(upstreams(bs), "MCP_SESSION_KEY"))
		res := runSessions(t, p.url(), 50, sessionPlan{calls: 5, sealed: true})
		if res.ok != 50 || res.onCreator != 250 {
			t.Fatalf("%s: want 50/50 sessions and 250 pinned calls; got %s", mode.name, res)
		}
		recordInterop(interopRow{
			Server: sealedRow(fmt.Sprintf("go-sdk %s, stateful, %s (3 processes)", goSDKVersion, mode.name)),
			Client: "go-sdk " + goSDKVersion,
			Result: fmt.Sprintf("%d/50 sessions ok; %d/250 calls answered by the session's server, which sees its own session ID", res.ok, res.onCreator),
		})
	}
}

// TestInteropSealedConformance runs the conformance suite against go-sdk's
// everything-server and the TypeScript server-everything, directly and
// through an mcp_proxy with seal_session_ids over two instances: every
// check comes out as direct (for server-everything, except the DNS
// rebinding check the proxy's own protection passes, as without sealing).
func TestInteropSealedConformance(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/conformance", "@modelcontextprotocol/server-everything")
	t.Setenv("MCP_SESSION_KEY", newSealKey(t))

	gs := startConformanceGoServers(t, 3)
	direct := runConformance(t, env, "direct", gs[0].URL())
	p := startProxy(t, sealedProxy(upstreams(gs[1:]), "MCP_SESSION_KEY"))
	sealed := runConformance(t, env, "sealed", p.url())
	t.Logf("go-sdk everything-server: direct %s; through mcp_proxy with seal_session_ids %s", direct, sealed)
	for _, g := range gs[1:] {
		if mustUpstream(t, "default", g.Addr()).LiveSessions == 0 {
			t.Errorf("no conformance session was pinned to %s", g.Name())
		}
	}
	if d := confDiff(direct, sealed); len(d) > 0 {
		t.Errorf("go-sdk everything-server: %d checks differ from direct (direct vs sealed):\n  %s", len(d), strings.Join(d, "\n  "))
	} else {
		recordInterop(interopRow{
			Server: sealedRow(fmt.Sprintf("go-sdk %s conformance everything-server, stateful (2 processes)", goSDKVersion)),
			Client: fmt.Sprintf("MCP conformance suite %s (spec %s)", conformanceVersion, confSpecVersion),
			Result: fmt.Sprintf("%s, every check as direct", sealed),
		})
	}

	es := startServerEverything(t, env, 3)
	direct = runConformance(t, env, "direct-everything", es[0].URL())
	p = startProxy(t, sealedProxy(upstreams(es[1:]), "MCP_SESSION_KEY"))
	sealed = runConformance(t, env, "sealed-everything", p.url())
	t.Logf("server-everything: direct %s; through mcp_proxy with seal_session_ids %s", direct, sealed)
	// As without sealing (TestInteropConformanceServerEverything), the
	// proxy's DNS rebinding protection passes the one check server-everything
	// fails alone; every other check must come out as direct.
	const rebinding = "dns-rebinding-protection/localhost-host-rebinding-rejected"
	if direct.checks[rebinding] != "FAILURE" || sealed.checks[rebinding] != "SUCCESS" {
		t.Errorf("check %s: direct %s, sealed %s; want FAILURE and SUCCESS", rebinding, direct.checks[rebinding], sealed.checks[rebinding])
	}
	sealed.checks[rebinding] = direct.checks[rebinding]
	if d := confDiff(direct, sealed); len(d) > 0 {
		t.Errorf("server-everything: %d checks differ from direct (direct vs sealed):\n  %s", len(d), strings.Join(d, "\n  "))
		return
	}
	recordInterop(interopRow{
		Server: sealedRow(fmt.Sprintf("TypeScript server-everything %s, streamable HTTP (2 processes)", serverEverythingVersion)),
		Client: fmt.Sprintf("MCP conformance suite %s (spec %s)", conformanceVersion, confSpecVersion),
		Result: fmt.Sprintf("%s: every check as direct, except that the proxy's DNS rebinding protection passes %s, as without sealing", direct, rebinding),
	})
}
