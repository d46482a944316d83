package caddymodule

import (
	"errors"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// decision is what the mcp_session handler did with a request: the value of
// the {mcp.decision} placeholder.
type decision string

// The handler's decisions.
const (
	// decisionBalanced: no session; the request went to the fallback policy.
	decisionBalanced decision = "balanced"
	// decisionLearned: balanced, and its response created a session the table learned.
	decisionLearned decision = "learned"
	// decisionPinned: sent to its session's upstream.
	decisionPinned decision = "pinned"
	// decisionUnknown: its session is not in the table (404, or forwarded with unknown_session forward).
	decisionUnknown decision = "unknown"
	// decisionFailedOver: its session's upstream was gone; the session
	// failed over to another upstream, which got the request.
	decisionFailedOver decision = "failed_over"
	// decisionGone: its session's upstream is gone (404, session dropped).
	decisionGone decision = "gone"
	// decisionRejected: answered 4xx by the proxy for a malformed request.
	decisionRejected decision = "rejected"
)

// placeholder returns the value of an {mcp.*} placeholder of the request.
// Values are computed when a placeholder is used, not per request.
func (ex *exchange) placeholder(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, "mcp.")
	if !ok {
		return nil, false
	}
	switch name {
	case "method":
		return ex.method(), true
	case "name":
		return ex.name(), true
	case "era":
		return ex.era.String(), true
	case "protocol_version":
		return ex.version, true
	case "session_fingerprint":
		if ex.sessionID == "" {
			return "", true
		}
		return fingerprint(ex.sessionID), true
	case "pinned_upstream":
		return ex.pinned, true
	case "decision":
		return string(ex.decision), true
	case "host_for_upstream":
		return hostForUpstream(ex.repl), true
	}
	return nil, false
}

// decide records the handler's decision for the request, and the upstream
// its session is pinned to, if any.
func decide(r *http.Request, d decision, upstream string) {
	ex, ok := caddyhttp.GetVar(r.Context(), varExchange).(*exchange)
	if !ok {
		return
	}
	ex.decision = d
	if upstream != "" {
		ex.pinned = upstream
	}
}

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
	defer ex.mem.release() // the request's body bytes, also when the handler panics
	h.liftWriteLimits(ex, r)
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
// fault of a matcher evaluated inside.
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
	return err
}

// asFault returns the fault err carries, if any.
func asFault(err error) *fault {
	var f *fault
	if errors.As(err, &f) {
		return f
	}
	return nil
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

// errorStatus returns the status Caddy answers err with.
func errorStatus(err error) int {
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		return he.StatusCode
	}
	return http.StatusInternalServerError
}
