package caddymodule

import (
	"net/http"

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
