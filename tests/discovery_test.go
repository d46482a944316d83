package tests

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// discoverySite is docs/behaviour.md's path-scoped form for a server with
// OAuth ("OAuth discovery"): the MCP endpoint through mcp_proxy, the
// discovery documents straight to the servers, and 404 for every other
// path, so that a client's discovery of a document nobody serves ends at a
// 404 instead of Caddy's empty 200.
func discoverySite(ups string) string {
	return fmt.Sprintf(`handle /mcp* {
		mcp_proxy %[1]s
	}
	handle /.well-known/oauth-protected-resource* {
		reverse_proxy %[1]s
	}
	handle /.well-known/oauth-authorization-server* {
		reverse_proxy %[1]s
	}
	handle {
		respond 404
	}`, ups)
}

// tsDiscovery is tests/node/discover.mjs's report.
type tsDiscovery struct {
	Resource            string `json:"resource"`
	AuthorizationServer string `json:"authorizationServer"`
	Issuer              string `json:"issuer"`
	Error               string `json:"error"`
}

// runTSDiscovery runs the TypeScript SDK client's OAuth discovery for url
// (tests/node/discover.mjs); env is added to the process's environment.
func runTSDiscovery(t *testing.T, env tsNodeEnv, url string, extra ...string) tsDiscovery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.node, filepath.Join(env.dir, "discover.mjs"), "--url", url)
	cmd.Dir = env.dir
	cmd.Env = append(os.Environ(), extra...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var d tsDiscovery
	if err == nil {
		err = json.Unmarshal(bytes.TrimSpace(out), &d)
	}
	if err != nil {
		t.Fatalf("discover.mjs: %v\n%s%s", err, out, stderr.String())
	}
	return d
}

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

// startTLSBalancer starts HAProxy terminating TLS (certificate and key in
// pemFile) on a new port in front of backend, as a cloud load balancer
// does, setting X-Forwarded-Proto: https; it returns its address.
func startTLSBalancer(t *testing.T, haproxy, pemFile, backend string) string {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", mustFreePort())
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	conf := fmt.Sprintf(`global
	maxconn 256
defaults
	mode http
	timeout connect 5s
	timeout client 30s
	timeout server 30s
frontend tls
	bind %s ssl crt %s
	http-request set-header X-Forwarded-Proto https
	default_backend caddy
backend caddy
	server caddy %s
`, addr, pemFile, backend)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ready(t, 10*time.Second, []*testproc.Proc{launch(t, "haproxy", addr, exec.Command(haproxy, "-db", "-f", cfg))}, testproc.Listening())
	return addr
}

// selfSignedPEM writes a self-signed certificate for 127.0.0.1 and its key
// to one PEM file, as HAProxy's `crt` takes them, and returns its path.
func selfSignedPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})...)
	path := filepath.Join(t.TempDir(), "balancer.pem")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
