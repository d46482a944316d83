package caddymodule

import (
	"bytes"
	"errors"
	"io"
	"net/http"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// maxInitPrefix is the most bytes of a POST body the handler reads to tell
// whether a request carrying an unknown or gone session is an initialize.
// SDK clients send the method before the params, in the first 100 bytes.
const maxInitPrefix = 4096

// staleInitialize reports whether r, a request carrying a session the
// table does not hold or whose upstream is gone, is an initialize request,
// alone or in a batch: the client wants a new session and sent its old ID
// along. It reads at most maxInitPrefix bytes of the body (or looks at
// what pf kept of it) and passes the body on unchanged. f refuses the
// request: the proxy holds MaxBodyMemory of bodies already
// (refuseBodyMemory).
//
// A legacy HTTP+SSE POST never is: its session is in its URL, which the
// handler cannot drop, and a new legacy session starts with a GET.
func staleInitialize(r *http.Request, pf *pinnedFailover) (stale bool, f *fault) {
	if r.Method != http.MethodPost || isLegacyPost(r) {
		return false, nil
	}
	if m := r.Header.Get(HeaderMethod); m != "" {
		return m == "initialize", nil
	}
	if pf != nil && pf.kept {
		return isInitialize(pf.body[:min(len(pf.body), maxInitPrefix)], true), nil
	}
	buf, _, err := exchangeOf(r).readHead(r, maxInitPrefix)
	if errors.Is(err, errBodyMemory) {
		return false, refuseBodyMemory(r)
	}
	return isInitialize(buf[:min(len(buf), maxInitPrefix)], true), nil
}

// serveAsNew serves an initialize that carried the stale session id as a
// request without a session: the header is dropped and the request
// balanced, and the old session, if the table holds it, ends.
func (h *Handler) serveAsNew(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, id string, pf *pinnedFailover) error {
	h.table.Evict(id, session.EvictUpstreamGone)
	h.debug("reinitialize_stale_session", id, "")
	r = withOwnVars(r) // the attempt before may still be dialing
	clearSelection(r)
	delete(r.Header, HeaderSessionID)
	if pf != nil && pf.kept {
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(pf.body)), int64(len(pf.body))
		if pf.held {
			clear(w.Header())
			for k, v := range pf.header {
				w.Header()[k] = v
			}
		}
	}
	decide(r, decisionBalanced, "")
	return h.serveNew(w, r, next)
}
