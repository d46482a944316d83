package tests

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Raw HTTP requests, for what the go-sdk client does not show: exact
// header spellings, status codes and bodies.

// exchange is a raw HTTP exchange through the proxy.
type exchange struct {
	step   string // what the exchange was, for messages; "METHOD url" unless named with as
	status int
	header http.Header
	body   string
	proto  string
}

// send makes one request. Header names in hdr are sent exactly as written
// (not canonicalized), so tests control the spelling on the wire.
func send(t testing.TB, hc *http.Client, method, url string, hdr map[string][]string, body string) exchange {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	if body != "" && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return exchange{step: method + " " + url, status: resp.StatusCode, header: resp.Header, body: string(b), proto: resp.Proto}
}

// as names the exchange's step.
func (ex exchange) as(step string) exchange {
	ex.step = step
	return ex
}

// sid is a header map carrying session id in the Go spelling.
func sid(id string) map[string][]string { return map[string][]string{"Mcp-Session-Id": {id}} }

// initialize sends an initialize-like POST without a session and returns the
// session the response carries.
func initialize(t testing.TB, hc *http.Client, url string) string {
	t.Helper()
	ex := send(t, hc, http.MethodPost, url, nil, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
	if ex.status != http.StatusOK || len(ex.header.Values("Mcp-Session-Id")) != 1 {
		t.Fatalf("initialize: %d %v %s", ex.status, ex.header, ex.body)
	}
	return ex.header.Get("Mcp-Session-Id")
}

// initBody is a raw initialize request for protocol 2025-11-25.
const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`

// mcpPOSTHeaders are the headers of a raw MCP POST; session may be empty.
func mcpPOSTHeaders(session string) http.Header {
	h := http.Header{
		"Content-Type": {"application/json"},
		"Accept":       {"application/json, text/event-stream"},
	}
	if session != "" {
		h["Mcp-Session-Id"] = []string{session}
		h["Mcp-Protocol-Version"] = []string{"2025-11-25"}
	}
	return h
}

// newH2CClient returns a client that speaks only cleartext HTTP/2 (prior
// knowledge) to the proxy.
func newH2CClient() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}}
}

// rawRequest sends a request written byte for byte over a new connection to
// addr and returns the response with its body read.
func rawRequest(t testing.TB, addr, method, raw string) (*http.Response, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s: reading the response: %v", method, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: reading the body: %v", method, err)
	}
	return resp, string(body)
}
