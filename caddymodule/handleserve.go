package caddymodule

import (
	"bytes"
	"io"
	"net/http"
	"strconv"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// CodeHandleNotFound is the JSON-RPC error code of a request whose handle
// the proxy refuses: JSON-RPC 2.0's "Invalid params" (§5.1), since the
// handle is a tool argument.
const CodeHandleNotFound = -32602

// serveHandles serves a request without a session when the handler has
// handle rules: one carrying a handle in a rule's header is pinned to the
// handle's upstream; a tools/call of a minting tool has its result read.
func (h *Handler) serveHandles(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	handle, header, problem := h.handles.carried(r, h.MaxSessionIDLength)
	if problem != "" {
		decide(r, decisionRejected, "")
		return mismatch("%s", problem).write(w)
	}
	if handle == "" {
		return h.forwardMinting(w, r, next)
	}
	t := h.handles.table
	up, mismatched := t.LookupAs(handle, principalOf(r, t.BindPrincipal()))
	switch {
	case mismatched: // never forwarded: the handle's upstream would serve it
		t.Stats.CountMismatch()
		decide(r, decisionUnknown, "")
		h.debug("handle_principal_mismatch", handle, "", headerField(header))
		return h.handles.writeNotFound(w, header, "Handle not found")
	case up == nil:
		return h.serveUnknownHandle(w, r, next, handle, header)
	}
	return h.servePinnedHandle(w, r, next, handle, header, up)
}

// serveUnknownHandle answers a request whose handle the table does not
// hold: balanced (the server answers the handle it does not know), or
// refused with unknown_handle reject.
func (h *Handler) serveUnknownHandle(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, handle, header string) error {
	h.handles.table.Stats.CountUnknown()
	decide(r, decisionUnknown, "")
	h.debug("handle_unknown", handle, "", headerField(header))
	if h.handles.reject {
		return h.handles.writeNotFound(w, header, "Handle not found")
	}
	return h.forwardMinting(w, r, next)
}

// servePinnedHandle proxies a request carrying a known handle to its
// upstream. When the upstream is unavailable (failing active health checks
// within the grace) it answers 503 and keeps the handle; when it is gone
// the handle is forgotten, and the request is balanced or refused as an
// unknown handle is.
func (h *Handler) servePinnedHandle(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, handle, header string, up *session.Upstream) error {
	t := h.handles.table
	pin(r, up)
	t.Stats.CountPinned()
	h.debug("handle_pinned", handle, up.Dial(), headerField(header))
	ex := exchangeOf(r)
	err := h.forwardMinting(w, r, next)
	if err == nil || ex.status != 0 {
		return err
	}
	if retryAfter := exchangeOf(r).unavailable; retryAfter > 0 && !refused(r, up.Dial()) {
		t.Stats.CountUnavailable()
		h.debug("handle_upstream_unavailable", handle, up.Dial(), headerField(header))
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
		return mcpwire.WriteError(w, http.StatusServiceUnavailable, nil, CodeUpstreamUnavailable,
			"Service Unavailable: the upstream that holds this handle is failing health checks; retry later")
	}
	if !upstreamGone(r, err, up.Dial()) {
		return err
	}
	t.Stats.CountGone()
	t.Evict(handle, session.EvictUpstreamGone)
	decide(r, decisionGone, up.Dial())
	h.debug("handle_upstream_gone", handle, up.Dial(), headerField(header))
	if h.handles.reject || !rewind(r, ex) {
		return h.handles.writeNotFound(w, header, "Handle not found: the upstream that held it is gone")
	}
	r = withOwnVars(r) // the failed attempt may still be dialing
	clearSelection(r)
	ex.replay = true // to any upstream but the one gone
	return h.forwardMinting(w, r, next)
}

// rewind gives r its body again for another upstream, and reports whether
// it could: the handler holds the whole body of a request of known length
// up to MaxInMemoryBody (readWhole).
func rewind(r *http.Request, ex *exchange) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return true
	}
	if ex.sent == nil {
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(ex.sent))
	return true
}

// forwardMinting forwards r as a request without a session; when it calls
// a tool that mints handles, the result is read for the handle first.
func (h *Handler) forwardMinting(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	ex := exchangeOf(r)
	rule := h.handles.minter(ex.method(), ex.name())
	if rule == nil {
		return h.forwardNew(w, r, next)
	}
	hw := newHandleWriter(w, h, r, rule)
	err := h.forwardNew(hw, r, next)
	if ferr := hw.finish(); err == nil {
		err = ferr
	}
	return err
}

// writeNotFound refuses a request whose handle, carried in header,
// the proxy does not route: unknown_handle_status with a JSON-RPC error.
func (hr *handleRules) writeNotFound(w http.ResponseWriter, header, message string) error {
	return mcpwire.WriteError(w, hr.status, nil, CodeHandleNotFound,
		message+" ("+header+"); call the tool that opens one again")
}

// headerField is the debug log's field naming the header a handle came in.
func headerField(header string) zap.Field { return zap.String("header", header) }
