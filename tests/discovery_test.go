package tests

import (
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
)

// TestOAuthDiscoveryThroughPathScopedProxy runs the TypeScript SDK client's
// OAuth discovery (RFC 9728 protected-resource metadata, path-aware, then
// RFC 8414 authorization-server metadata) through docs/behaviour.md's
// path-scoped form, in front of TypeScript SDK servers that are their own
// authorization server: discovery finds both documents, an unrouted
// discovery path gets 404, and sessions stay pinned. The control, in the
// same run, is the path-scoped form without the discovery routes: the
// documents get Caddy's empty 200, and the SDK's discovery fails.
func TestOAuthDiscoveryThroughPathScopedProxy(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod", "express")
	servers := startTSServers(t, env, 2, "o", "--express", "--oauth")
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	t.Run("mcp_proxy /mcp* alone", func(t *testing.T) {
		p := startProxy(t, "mcp_proxy /mcp* "+upstreams(servers))
		if ex := send(t, hc, http.MethodGet, "http://"+p.addr+"/.well-known/oauth-protected-resource/mcp", nil, ""); ex.status != http.StatusOK || ex.body != "" {
			t.Fatalf("the control: GET of the metadata got %d %q; want Caddy's empty 200, which this test guards against", ex.status, ex.body)
		}
		if d := runTSDiscovery(t, env, p.url()); d.Error == "" {
			t.Errorf("the control: discovery succeeded (%+v); want it to fail on Caddy's empty 200", d)
		} else {
			t.Logf("the control: the SDK's discovery fails: %s", d.Error)
		}
	})

	t.Run("with the discovery routes", func(t *testing.T) {
		p := startProxy(t, discoverySite(upstreams(servers)))
		origin := "http://" + p.addr
		d := runTSDiscovery(t, env, p.url())
		if d.Error != "" || d.Resource != origin+"/mcp" || d.AuthorizationServer != origin || d.Issuer != origin {
			t.Errorf("discovery: %+v; want resource %s/mcp and authorization server and issuer %s", d, origin, origin)
		}
		for _, path := range []string{"/.well-known/openid-configuration", "/.well-known/oauth-protected-resource", "/favicon.ico"} {
			if ex := send(t, hc, http.MethodGet, origin+path, nil, ""); ex.status != http.StatusNotFound {
				t.Errorf("GET %s: %d %q; want 404", path, ex.status, ex.body)
			}
		}
		if ts := runTSClients(t, env, p.url(), 4, 3); ts.OK != 4 || ts.Calls != 12 {
			t.Errorf("TypeScript clients through the discovery form: %+v; want 4 sessions of 3 pinned calls", ts)
		}
	})
}

// TestTLSBalancerNeedsTrustedProxies puts a TLS-terminating balancer
// (HAProxy, setting X-Forwarded-Proto: https) in front of Caddy, in front
// of a TypeScript SDK server that builds its OAuth metadata from
// X-Forwarded-Proto and X-Forwarded-Host. With `trusted_proxies` naming the
// balancer, Caddy passes its https on, and the TypeScript SDK client,
// given the https URL, accepts the metadata's resource; without it (the
// control, same run) Caddy replaces it with http, and the client refuses
// the metadata (docs/behaviour.md, "Behind a TLS-terminating balancer").
func TestTLSBalancerNeedsTrustedProxies(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod", "express")
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		skipInterop(t, "haproxy missing: run .ci/install-deps")
	}
	servers := startTSServers(t, env, 1, "b", "--express", "--oauth")
	pemFile := selfSignedPEM(t)
	for _, tc := range []struct {
		name    string
		trusted bool
	}{{"trusted_proxies names the balancer", true}, {"without trusted_proxies", false}} {
		t.Run(tc.name, func(t *testing.T) {
			port := mustFreePort()
			cfg := globalOptions()
			if tc.trusted {
				cfg = strings.Replace(cfg, "protocols h1 h2c", "protocols h1 h2c\n\t\ttrusted_proxies static 127.0.0.1/32", 1)
			}
			loadCaddyfile(t, cfg+siteBlock(port, discoverySite(upstreams(servers))))
			front := startTLSBalancer(t, haproxy, pemFile, fmt.Sprintf("127.0.0.1:%d", port))
			url := "https://" + front + "/mcp"
			d := runTSDiscovery(t, env, url, "NODE_TLS_REJECT_UNAUTHORIZED=0", "NODE_NO_WARNINGS=1")
			switch {
			case tc.trusted && (d.Error != "" || d.Resource != url):
				t.Errorf("discovery through the balancer: %+v; want resource %s", d, url)
			case !tc.trusted && !strings.Contains(d.Error, "does not match expected https://"):
				t.Errorf("the control: discovery gave %+v; want the SDK to refuse the http resource", d)
			}
		})
	}
}
