package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// transportFixture is a provisioned reverse_proxy handler whose transport
// counts the writes on its upstream connections, and the bodies its
// upstream received.
type transportFixture struct {
	h      *reverseproxy.Handler
	writes atomic.Int64
	bodies chan string
}

// newTransportFixture provisions reverse_proxy with the transport of the
// given protocol ("mcp" or "http"), retries after a failed dial, and dials
// in the order given (round_robin picks the last first). "live" in dials
// is replaced by an upstream that echoes the body it read.
func newTransportFixture(t *testing.T, protocol string, retries int, dials ...string) *transportFixture {
	t.Helper()
	f := &transportFixture{bodies: make(chan string, 8)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			f.bodies <- "read error: " + err.Error()
			return
		}
		f.bodies <- string(b)
		fmt.Fprintf(w, "%d", len(b))
	}))
	t.Cleanup(srv.Close)
	var ups reverseproxy.UpstreamPool
	for _, d := range dials {
		if d == "live" {
			d = srv.Listener.Addr().String()
		}
		ups = append(ups, &reverseproxy.Upstream{Dial: d})
	}
	f.h = &reverseproxy.Handler{
		TransportRaw: json.RawMessage(`{"protocol":"` + protocol + `"}`),
		Upstreams:    ups,
		LoadBalancing: &reverseproxy.LoadBalancing{
			Retries:            retries,
			SelectionPolicyRaw: json.RawMessage(`{"policy":"round_robin"}`),
		},
	}
	if err := f.h.Provision(newContext(t)); err != nil {
		t.Fatal(err)
	}
	var tr *http.Transport
	switch rt := f.h.Transport.(type) {
	case *Transport:
		tr = rt.Transport
	case *reverseproxy.HTTPTransport:
		tr = rt.Transport
	}
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, writes: &f.writes}, nil
	}
	return f
}

// post sends a POST with body through the handler and returns the status
// the client got (the handler's error's status, if it returned one).
func (f *transportFixture) post(t *testing.T, body io.Reader, length int64) int {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "http://example.com/mcp", body)
	req.ContentLength = length
	req = caddyhttp.PrepareRequest(req, caddy.NewReplacer(), nil, &caddyhttp.Server{})
	rec := httptest.NewRecorder()
	err := f.h.ServeHTTP(rec, req, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		return he.StatusCode
	}
	if err != nil {
		t.Fatalf("proxying: %v", err)
	}
	return rec.Code
}

// countingConn counts its writes.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestTransportWritesSmallBodyWithHeaders: through reverse_proxy, the mcp
// transport sends a tool call's POST, headers and body, in one write; the
// http transport, the negative control, in two (its headers are flushed
// before a body it does not know to be in memory). Bodies of unknown
// length or over MaxInMemoryBody are streamed, and every body arrives
// whole.
func TestTransportWritesSmallBodyWithHeaders(t *testing.T) {
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`
	big := strings.Repeat("x", MaxInMemoryBody+1)
	for _, tc := range []struct {
		protocol, name, body string
		length               int64
		writes               int64 // -1: more than one
	}{
		{"mcp", "tool call", call, int64(len(call)), 1},
		{"http", "tool call", call, int64(len(call)), 2},
		{"mcp", "unknown length", call, -1, -1},
		{"mcp", "over MaxInMemoryBody", big, int64(len(big)), -1},
	} {
		t.Run(tc.protocol+"/"+tc.name, func(t *testing.T) {
			f := newTransportFixture(t, tc.protocol, 0, "live")
			if got := f.post(t, io.NopCloser(strings.NewReader(tc.body)), tc.length); got != http.StatusOK {
				t.Fatalf("status %d, want 200", got)
			}
			if got := <-f.bodies; got != tc.body {
				t.Errorf("the upstream got a body of %d bytes, want the %d sent", len(got), len(tc.body))
			}
			switch n := f.writes.Load(); {
			case tc.writes > 0 && n != tc.writes:
				t.Errorf("%d writes to the upstream, want %d", n, tc.writes)
			case tc.writes < 0 && n < 2:
				t.Errorf("%d writes to the upstream: a streamed body should follow its headers", n)
			}
		})
	}
}

// TestTransportRetrySendsWholeBody: the mcp transport reads the body
// before it dials, so when the dial fails and reverse_proxy retries on
// another upstream (lb_retries), the body must come from what was read,
// not from the client's body, which is spent. The http transport, which
// never read it, shows the same.
func TestTransportRetrySendsWholeBody(t *testing.T) {
	call := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`
	for _, protocol := range []string{"mcp", "http"} {
		t.Run(protocol, func(t *testing.T) {
			f := newTransportFixture(t, protocol, 1, "live", deadAddr(t))
			if got := f.post(t, io.NopCloser(strings.NewReader(call)), int64(len(call))); got != http.StatusOK {
				t.Fatalf("status %d after a retry, want 200", got)
			}
			if got := <-f.bodies; got != call {
				t.Errorf("after a retry the upstream got %q, want %q", got, call)
			}
		})
	}
}

// TestTransportBodyReadError: a client body that fails mid-way gets the
// same answer through the mcp transport as through the http transport, and
// no upstream takes a truncated body for a whole one.
func TestTransportBodyReadError(t *testing.T) {
	for _, protocol := range []string{"mcp", "http"} {
		t.Run(protocol, func(t *testing.T) {
			f := newTransportFixture(t, protocol, 0, "live")
			body := io.MultiReader(strings.NewReader(`{"jsonrpc":"2.0",`), iotestErrReader{})
			if got := f.post(t, io.NopCloser(body), 100); got != http.StatusBadGateway {
				t.Errorf("status %d, want 502", got)
			}
			select {
			case got := <-f.bodies:
				if !strings.HasPrefix(got, "read error") {
					t.Errorf("the upstream read %q as a whole body", got)
				}
			default:
			}
		})
	}
}

// iotestErrReader fails every read, as a client connection that broke.
type iotestErrReader struct{}

func (iotestErrReader) Read([]byte) (int, error) { return 0, errors.New("connection reset by peer") }

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
