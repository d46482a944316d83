package caddymodule

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// observe serves the request with serve, around which it keeps the
// request's exchange: the placeholders, the status for the per-method
// metrics, the count of open subscriptions/listen streams. A request an
// `mcp` matcher found malformed is answered here without contacting an
// upstream, and so is one whose matcher, evaluated inside this handler's
// routes, failed it.
func (h *Handler) observe(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	ex := exchangeOf(r)
	if ex.serving { // an mcp_session handler further out observes the request
		return h.serve(w, r, next)
	}
	ex.serving, ex.ResponseWriter, ex.decision = true, w, decisionBalanced
	defer func() { ex.serving = false }()
	ex.mem.own()
	defer ex.mem.release() // the request's body bytes, also when the handler panics
	if timeout, err := liftWriteLimits(ex, r); err != nil {
		h.warnWriteLimits(err, timeout)
	}
	defer ex.limits.putBack(w)
	if r.Method == http.MethodPost && ex.method() == "subscriptions/listen" {
		h.table.Stats.Methods().AddListens(1)
		defer h.table.Stats.Methods().AddListens(-1)
	}
	err := h.serveChecked(ex, r, next)
	h.table.Stats.Methods().Count(ex.method(), answeredStatus(ex.status, err))
	return err
}

// serveChecked answers a faulty request, or serves it and answers the
// fault of a matcher evaluated inside, or the 502, 503 or 504 the next
// handler ended it with before any response (gateway.go).
func (h *Handler) serveChecked(ex *exchange, r *http.Request, next caddyhttp.Handler) error {
	if ex.fault != nil {
		ex.decision = decisionRejected
		return ex.fault.write(ex)
	}
	err := h.serve(ex, r, next)
	if err == nil || ex.status != 0 {
		return err
	}
	if f := asFault(err); f != nil {
		ex.decision = decisionRejected
		return f.write(ex)
	}
	if f := gatewayAnswer(err, r.Context().Err() != nil); f != nil { // gateway.go
		return answerGateway(h.logger, ex, r, f, err)
	}
	return err
}

// answeredStatus returns the status of a response: the one written, else the
// status of the error Caddy will answer with, else 200.
func answeredStatus(written int, err error) int {
	switch {
	case written != 0:
		return written
	case err == nil:
		return http.StatusOK
	}
	return errorStatus(err)
}

// warnWriteLimits logs once per handler that the server's write timeout
// cuts the site's streams, because its deadline could not be lifted.
func (h *Handler) warnWriteLimits(err error, timeout time.Duration) {
	if h.warnedDeadline.CompareAndSwap(false, true) {
		h.logger.Warn("the server's write timeout (servers > timeouts > write) cuts this site's MCP streams, and tool calls "+
			"that take longer: a handler before mcp_session hides the response's write deadline; "+
			"remove the write timeout, or that handler", zap.Duration("write_timeout", timeout), zap.Error(err))
	}
}
