package caddymodule

import (
	"bytes"
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

func init() {
	caddy.RegisterModule(Transport{})
}

// MaxInMemoryBody is the largest request body, in bytes, that the mcp
// transport reads before it sends the request: 64 KiB, far above a
// tool call's JSON-RPC message.
const MaxInMemoryBody = 64 << 10

// Transport is reverse_proxy's http transport for MCP upstreams: every
// option of the `http` transport, and a request body of a known length up
// to MaxInMemoryBody is read before the request is sent.
//
// Go's transport writes a request's headers in a write of their own,
// before its body, unless the body is one it knows to be in memory
// (net/http, isKnownInMemoryReader); reverse_proxy hands it the client's
// streamed body. Read first, a small JSON-RPC POST goes out with its
// headers in one write, and one TCP segment reaches the upstream instead
// of two. The body read is also what Go's transport needs to send the
// request again on a new connection when a kept-alive one turns out
// closed before anything was written to it (Request.GetBody).
//
// A body of unknown length (chunked), one above MaxInMemoryBody, and a
// request with `Expect: 100-continue` are streamed as by the http
// transport.
type Transport struct {
	reverseproxy.HTTPTransport
}

// CaddyModule returns the Caddy module information.
func (Transport) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.transport.mcp",
		New: func() caddy.Module { return new(Transport) },
	}
}

// RoundTrip sends req to its upstream, its body in memory when it is
// small and of known length (see Transport).
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	body, partial := inMemoryBody(req)
	switch {
	case body != nil:
		out := *req
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		return t.HTTPTransport.RoundTrip(&out)
	case partial != nil:
		out := *req
		out.Body = partial
		return t.HTTPTransport.RoundTrip(&out)
	}
	return t.HTTPTransport.RoundTrip(req)
}

// inMemoryBody returns req's whole body, or nil to stream it: a body of
// unknown length, one over MaxInMemoryBody, or that of a request that
// expects `100 Continue`. A body that failed to read comes back as partial:
// the bytes read, then the rest of req's body, which fails as it did, so
// that the upstream and Caddy see what the http transport would have shown
// them.
//
// The body is read once per client request and kept in its exchange:
// reverse_proxy sends the same request again after a failed dial
// (lb_retries), and failover sends it to another upstream. Behind an
// mcp_session handler it was read there already, before the request was
// routed (see exchange.readWhole).
func inMemoryBody(req *http.Request) (body []byte, partial io.ReadCloser) {
	if req.Body == nil || req.Body == http.NoBody || req.ContentLength <= 0 ||
		req.ContentLength > MaxInMemoryBody || req.Header["Expect"] != nil {
		return nil, nil
	}
	ex := exchangeOf(req)
	if ex.sent == nil {
		if !ex.mem.charge(req.ContentLength) {
			return nil, nil // streamed: the budget is spent
		}
		buf := make([]byte, req.ContentLength)
		if n, err := io.ReadFull(req.Body, buf); err != nil {
			return nil, &replayBody{buf: buf[:n], rest: req.Body}
		}
		ex.sent = buf
	}
	if int64(len(ex.sent)) != req.ContentLength {
		return nil, nil
	}
	return ex.sent, nil
}

// UnmarshalCaddyfile sets up the transport from Caddyfile tokens, with
// the syntax and options of the `http` transport:
//
//	transport mcp {
//	    <http transport options>
//	}
func (t *Transport) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return t.HTTPTransport.UnmarshalCaddyfile(d)
}

// Interface guards
var (
	_ caddy.Provisioner                                = (*Transport)(nil)
	_ caddy.CleanerUpper                               = (*Transport)(nil)
	_ http.RoundTripper                                = (*Transport)(nil)
	_ caddyfile.Unmarshaler                            = (*Transport)(nil)
	_ reverseproxy.TLSTransport                        = (*Transport)(nil)
	_ reverseproxy.H2CTransport                        = (*Transport)(nil)
	_ reverseproxy.HealthCheckSchemeOverriderTransport = (*Transport)(nil)
	_ reverseproxy.ProxyProtocolTransport              = (*Transport)(nil)
	_ reverseproxy.RequestHeaderOpsTransport           = (*Transport)(nil)
)
