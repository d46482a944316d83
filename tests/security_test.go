package tests

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"
)

// Security and abuse: hop-by-hop tricks, DNS rebinding over every listener
// type, short session TTLs.

// TestConnectionCannotStripSession: a request that lists Mcp-Session-Id in
// Connection would be pinned on the session, then forwarded without it
// (a proxy strips the fields Connection names). The proxy answers 400
// itself, in every spelling and position of the token, and the session
// keeps working. The control lists another field and is pinned as usual.
func TestConnectionCannotStripSession(t *testing.T) {
	bs := startBackends(t, 2, true)
	p := startProxy(t, "mcp_proxy "+upstreams(bs))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := openLiveSession(ctx, t, p.url(), hc)
	cs, owner := s.cs, s.first.Server
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`
	request := func(connection string) string {
		return fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"+
			"Accept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-11-25\r\n"+
			"Mcp-Session-Id: %s\r\nConnection: %s\r\nContent-Length: %d\r\n\r\n%s",
			p.addr, cs.ID(), connection, len(call), call)
	}
	for _, connection := range []string{"Mcp-Session-Id", "close, mcp-session-id", "keep-alive,MCP-SESSION-ID ", "Mcp-Session-Id, close"} {
		resp, body := rawRequest(t, p.addr, http.MethodPost, request(connection))
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "Connection names Mcp-Session-Id") {
			t.Errorf("Connection: %s: %d %q; want the proxy's 400", connection, resp.StatusCode, body)
		}
	}
	resp, body := rawRequest(t, p.addr, http.MethodPost, request("close, X-Other"))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, owner) {
		t.Errorf("control, Connection: close, X-Other: %d %q; want 200 from %s", resp.StatusCode, body, owner)
	}
	if again, err := whoami(ctx, cs); err != nil || again.Server != owner {
		t.Fatalf("the session after the rejected requests: %+v, %v; want it alive on %s", again, err, owner)
	}
}

// TestDNSRebindingProtectionOverHTTP3: on a loopback TLS site, a request
// naming a foreign Host gets the proxy's 403 over HTTP/3 (a real quic-go
// client) as over HTTP/1.1 and HTTP/2: the check reads the listener's local
// address whatever its network (UDP for QUIC). Loopback names pass over
// every protocol. The control, localhost_protection off, lets the foreign
// Host through to the go-sdk server over HTTP/3, so the 403 is the check's.
func TestDNSRebindingProtectionOverHTTP3(t *testing.T) {
	b := startBackends(t, 1, true)[0]
	port := mustFreePort()
	tlsConf := &tls.Config{ServerName: "localhost", InsecureSkipVerify: true} //nolint:gosec // Caddy's internal CA, loopback test
	h3 := &http.Client{Transport: &http3.Transport{TLSClientConfig: tlsConf.Clone()}, Timeout: 10 * time.Second}
	h2 := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf.Clone(), Protocols: protocols((*http.Protocols).SetHTTP2)}, Timeout: 10 * time.Second}
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf.Clone(), Protocols: protocols((*http.Protocols).SetHTTP1)}, Timeout: 10 * time.Second}
	clients := []struct {
		proto string
		hc    *http.Client
	}{{"HTTP/3.0", h3}, {"HTTP/2.0", h2}, {"HTTP/1.1", h1}}
	url := fmt.Sprintf("https://127.0.0.1:%d/mcp", port)
	try := func(hc *http.Client, host string) exchange {
		t.Helper()
		return sendWithHost(t, hc, http.MethodPost, url, host, mcpPOSTHeaders(""), initBody)
	}

	loadCaddyfile(t, tlsSiteConfig(t, port, "mcp_proxy "+b.Addr()))
	waitForHTTP3(t, h3, url)
	for _, c := range clients {
		for _, host := range []string{"evil.example", fmt.Sprintf("evil.example:%d", port)} {
			ex := try(c.hc, host)
			if ex.proto != c.proto || ex.status != http.StatusForbidden || rpcErrorCode(ex.body) != -32600 {
				t.Errorf("%s, Host %s: %s %d %q; want the proxy's 403 over %s", c.proto, host, ex.proto, ex.status, ex.body, c.proto)
			}
		}
		ex := try(c.hc, fmt.Sprintf("localhost:%d", port))
		if ex.proto != c.proto || ex.status != http.StatusOK || ex.header.Get("Mcp-Session-Id") == "" {
			t.Errorf("%s, Host localhost: %s %d %q; want the go-sdk server's 200 with a session", c.proto, ex.proto, ex.status, ex.body)
		}
	}

	loadCaddyfile(t, tlsSiteConfig(t, port, "mcp_proxy "+b.Addr()+" {"+behindTunnel+"\n\t}"))
	waitForHTTP3(t, h3, url)
	if ex := try(h3, "evil.example"); ex.proto != "HTTP/3.0" || ex.status != http.StatusOK {
		t.Fatalf("control, localhost_protection off over HTTP/3: %s %d %q; want the go-sdk server's 200", ex.proto, ex.status, ex.body)
	}
}

// TestShortTTLSessionInUseNeverExpires: with session_ttl 1s, sessions on
// go-sdk servers that call a tool 300 ms after each answer stay pinned for
// 10 calls (each call is well under a TTL after the previous one, with room
// for a slow, loaded machine), however the calls fall against the idle
// clock's resolution. The sessions are opened with raw
// requests and hold no GET stream, which would keep them alive by itself.
// The control in the same run: a session left idle for 2 s is forgotten
// (the proxy's 404).
func TestShortTTLSessionInUseNeverExpires(t *testing.T) {
	bs := startBackends(t, 2, true)
	p := startProxy(t, "mcp_proxy "+upstreams(bs)+" {\n\t\tsession_ttl 1s\n\t}")
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	const sessions, calls = 5, 10
	call := `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`
	ids := make([]string, sessions)
	errs := make(chan error, sessions)
	for i := range ids {
		ids[i] = goSDKSession(t, hc, p.url())
		go func(id string) {
			for n := range calls {
				time.Sleep(300 * time.Millisecond)
				req, _ := http.NewRequest(http.MethodPost, p.url(), strings.NewReader(fmt.Sprintf(call, n+2)))
				for k, v := range mcpPOSTHeaders(id) {
					req.Header[k] = v
				}
				resp, err := hc.Do(req)
				if err != nil {
					errs <- err
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), id) {
					errs <- fmt.Errorf("call %d of session %s: %d %q", n+1, id, resp.StatusCode, body)
					return
				}
			}
			errs <- nil
		}(ids[i])
	}
	for range sessions {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	time.Sleep(2 * time.Second)
	ex := send(t, hc, http.MethodPost, p.url(), mcpPOSTHeaders(ids[0]), `{"jsonrpc":"2.0","id":99,"method":"ping"}`)
	if ex.status != http.StatusNotFound || !strings.Contains(ex.body, "Session not found") {
		t.Fatalf("control: a session idle for 2s with session_ttl 1s: %d %q; want the proxy's 404", ex.status, ex.body)
	}
}
