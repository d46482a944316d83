package caddymodule

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// The proxy's answers to the errors a request ends with before any
// response was written: reverse_proxy's 502 (no upstream answered: every
// dial failed, or the upstream broke the connection), 503 (no upstream
// available: all draining, out of service, or at max_requests) and 504
// (it timed out), and the mcp_sessions app failing to start. Caddy would
// answer them with a bare status and an empty body, which MCP clients
// show without a reason; the handler writes a JSON-RPC error instead, and
// logs the cause, which the answer does not name.

// CodeInternalError is JSON-RPC 2.0's "Internal error" (JSON-RPC 2.0
// §5.1): the proxy itself cannot serve the request (its mcp_sessions app
// did not start).
const CodeInternalError = mcpwire.CodeInternalError

// gatewayAnswer returns the answer the handler writes for err, the error
// a request it served ended with, or nil when err goes to Caddy as it is.
// Only 502, 503 and 504 are answered: they are the gateway's statuses,
// which reverse_proxy returns for an upstream that did not answer; any
// other status is a later handler's own (an authentication's 401, a
// file_server's 404, a config error's 500), for Caddy's error handling.
// A client that went away (499, or a cancelled request) gets nothing, and
// a fault is answered as such by the caller. The answer's id is left to
// the caller.
func gatewayAnswer(err error, clientGone bool) *fault {
	if err == nil || clientGone || asFault(err) != nil {
		return nil
	}
	switch status := errorStatus(err); status {
	case http.StatusBadGateway:
		return &fault{status: status, code: CodeUpstreamUnavailable,
			message: "Bad Gateway: no upstream answered this request; the proxy's log has the cause"}
	case http.StatusServiceUnavailable:
		return &fault{status: status, code: CodeUpstreamUnavailable,
			message: "Service Unavailable: no upstream can take this request now (all are draining, failing health checks, " +
				"or at their request limit); retry later; the proxy's log has the cause"}
	case http.StatusGatewayTimeout:
		return &fault{status: status, code: CodeUpstreamTimeout,
			message: "Gateway Timeout: the upstream did not answer in time; the proxy's log has the cause"}
	}
	return nil
}

// answerGateway writes f, the answer of [gatewayAnswer] to err, on ex with
// the request's id, and logs err: the answer does not name the cause,
// and Caddy, which would have logged the error, no longer sees it.
func answerGateway(logger *zap.Logger, ex *exchange, r *http.Request, f *fault, err error) error {
	f.id = ex.requestID()
	fields := append(errorFields(err), zap.Int("status", f.status), zap.String("method", ex.method()),
		zap.String("path", r.URL.Path), zap.String("decision", string(ex.decision)))
	if sel := ex.selected; sel != nil {
		fields = append(fields, zap.String("upstream", sel.Dial))
	}
	if ex.sessionID != "" {
		fields = append(fields, zap.String("session", fingerprint(ex.sessionID)))
	}
	logger.Error("no upstream answered; the client got a JSON-RPC error", fields...)
	return f.write(ex)
}

// errorFields returns the log fields of err as Caddy's error log has
// them: the error's text, and a HandlerError's id and trace.
func errorFields(err error) []zap.Field {
	var he caddyhttp.HandlerError
	if !errors.As(err, &he) || he.Err == nil {
		return []zap.Field{zap.Error(err)}
	}
	return []zap.Field{zap.Error(he.Err), zap.String("err_id", he.ID), zap.String("err_trace", he.Trace)}
}

// answerStartFailure answers a request that the handler cannot serve
// because the mcp_sessions app failed to start with err: 503 with a
// JSON-RPC error, the cause logged. For a client that went away, err goes
// to Caddy as before.
func answerStartFailure(logger *zap.Logger, w http.ResponseWriter, r *http.Request, err error) error {
	if r.Context().Err() != nil {
		return caddyhttp.Error(http.StatusServiceUnavailable, err)
	}
	logger.Error("the mcp_sessions app did not start; the client got 503", append(errorFields(err), zap.String("path", r.URL.Path))...)
	return mcpwire.WriteError(w, http.StatusServiceUnavailable, exchangeOf(r).requestID(), CodeInternalError,
		"Service Unavailable: the proxy's session table did not start; the proxy's log has the cause")
}

// requestID returns the JSON-RPC id of the request's body, as JSON text,
// when the proxy read the body: nil when it did not, or the body has no
// id (a notification, a batch, a body that is not JSON-RPC). It parses a
// body read whole but not parsed without keeping what it finds, so that
// the {mcp.*} placeholders stay as they were.
func (ex *exchange) requestID() json.RawMessage {
	if ex.body != nil {
		return ex.body.ID
	}
	if ex.sent == nil {
		return nil
	}
	if head, bad := parseRPC(ex.sent); bad == nil {
		return head.ID
	}
	return nil
}

// asFault returns the fault err carries, if any.
func asFault(err error) *fault {
	var f *fault
	if errors.As(err, &f) {
		return f
	}
	return nil
}

// errorStatus returns the status Caddy answers err with.
func errorStatus(err error) int {
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		return he.StatusCode
	}
	return http.StatusInternalServerError
}
