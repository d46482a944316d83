package caddymodule

import (
	"net/http"
	"strings"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/seal"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

// route is where the mcp_session handler sends a request, decided from the
// request and the table before anything is forwarded. [Handler.route] is
// the one place that decides it, and the rows of docs/behaviour.md's "What
// happens when" that depend on the request and the table read against it;
// what an upstream's answer decides after that (gone, unavailable, failed
// over, a stale initialize found on a gone upstream) is servePinned's and
// serveFailed's.
type route struct {
	kind    routeKind
	era     session.Era       // the era the request is counted in
	key     string            // the session's key in the table (for a sealed ID, its decoded bytes)
	up      *session.Upstream // routePinned: the session's upstream
	problem string            // routeBadSession: why the session cannot be used
	fault   *fault            // routeFault: the answer
}

// routeKind names a route.
type routeKind uint8

// The routes of a request.
const (
	// routeNew: no session; the request is balanced, and its answer may
	// create a session, which the table learns.
	routeNew routeKind = iota
	// routeBadSession: 400, the Mcp-Session-Id or the legacy query cannot
	// be used, or they name two sessions.
	routeBadSession
	// routeFault: answered by the proxy with fault (a stale initialize the
	// proxy cannot serve).
	routeFault
	// routeMismatch: the session is bound to another principal; answered
	// as an unknown session, never forwarded.
	routeMismatch
	// routeUnknown: the table does not hold the session (404, or forwarded
	// with unknown_session forward).
	routeUnknown
	// routeStaleInitialize: an initialize carrying a session the table does
	// not hold: served as a new session.
	routeStaleInitialize
	// routePinned: sent to the session's upstream.
	routePinned
)

// route decides where r goes (see [route]). A legacy HTTP+SSE POST is
// marked as such on the request's exchange; a sealed session is marked
// too, a replica that had not seen it adopts it, and r's Mcp-Session-Id
// becomes the upstream's own ID.
func (h *Handler) route(r *http.Request) route {
	ids := r.Header[HeaderSessionID]
	legacy, problem := legacySessionOf(r, h.legacyParams(), h.MaxSessionIDLength)
	era := eraOf(r, len(ids))
	if len(ids) == 0 {
		if legacy != "" || problem != "" {
			era = session.EraLegacySession // with legacy_sse naming other parameters too
		}
		switch {
		case problem != "":
			return route{kind: routeBadSession, era: era, problem: problem}
		case legacy != "":
			return h.routeLegacyPost(r, era, legacy)
		}
		return route{kind: routeNew, era: era}
	}
	id, problem := h.headerSession(r, legacy, problem)
	switch {
	case problem != "":
		return route{kind: routeBadSession, era: era, problem: problem}
	case legacy != "": // named twice, in the header and the query: served as the legacy POST it is
		return h.routeLegacyPost(r, era, legacy)
	}
	if h.sealer != nil {
		if key, ss, ok := h.sealer.open(id); ok {
			return h.routeSealed(r, era, key, ss)
		}
	}
	return h.routeKnown(r, era, id)
}

// routeLegacyPost routes a POST of legacy HTTP+SSE session id to its
// stream's upstream, or as a request of an unknown session.
func (h *Handler) routeLegacyPost(r *http.Request, era session.Era, id string) route {
	exchangeOf(r).legacyPost = true
	return h.routeKnown(r, era, id)
}

// routeKnown routes a request of session id by the table: to its
// upstream, or as a request of another principal's or an unknown session.
func (h *Handler) routeKnown(r *http.Request, era session.Era, id string) route {
	up, mismatch := h.table.LookupAs(id, principalOf(r, h.table.BindPrincipal()))
	if mismatch {
		return route{kind: routeMismatch, era: era, key: id}
	}
	if up == nil {
		return routeUnknownSession(r, era, id)
	}
	return route{kind: routePinned, era: era, key: id, up: up}
}

// routeUnknownSession routes a request of session id, which the table
// does not hold: an initialize carrying it starts a new session.
func routeUnknownSession(r *http.Request, era session.Era, id string) route {
	if stale, f := staleInitialize(r, nil); f != nil {
		return route{kind: routeFault, era: era, key: id, fault: f}
	} else if stale {
		return route{kind: routeStaleInitialize, era: era, key: id}
	}
	return route{kind: routeUnknown, era: era, key: id}
}

// routeSealed routes a request whose Mcp-Session-Id opened to ss; key is
// its table key. A session bound to another principal than the request's
// gets the unknown session's 404, as in the table. A replica that has not
// seen the session yet records it in its table, with the initialize
// request the value carries when the table fails sessions over: the
// replica can then fail the session over on its own, once, after which its
// table routes it. A session that ended for good (a DELETE, an operator's
// eviction), as a tombstone here or in the shared store says, is not
// adopted: it is routed as an unknown session. The upstream receives its
// own session ID (or, once the session moved, the one its new upstream
// knows).
func (h *Handler) routeSealed(r *http.Request, era session.Era, key string, ss seal.Session) route {
	bind := h.table.BindPrincipal()
	principal := principalOf(r, bind)
	if ss.Bound != "" && bind != session.BindPrincipalOff && ss.Bound != principalDigest(principal) {
		return route{kind: routeMismatch, era: era, key: key}
	}
	ex := exchangeOf(r)
	ex.sealed, ex.issued = true, ss.Issued
	up, mismatch, ended := h.table.LookupEnded(key, principal)
	if mismatch {
		return route{kind: routeMismatch, era: era, key: key}
	}
	if up == nil && !ended {
		origin := session.Origin{}
		if ss.Bound != "" {
			origin.Principal = principal
		}
		key = strings.Clone(key) // not the buffer that holds the plaintext too
		if up = h.table.Adopt(key, ss.Dial, origin); up != nil {
			h.debug("adopted", key, ss.Dial)
			if init := sessionInitOf(ss.Init); init != nil && h.table.Failover().On {
				h.table.AdoptInit(key, init)
			}
		}
	}
	if up == nil { // ended for good, here or as the shared store says
		h.debug("ended", key, "")
		return routeUnknownSession(r, era, key)
	}
	r.Header[HeaderSessionID] = []string{ss.ID}
	return route{kind: routePinned, era: era, key: key, up: up}
}
