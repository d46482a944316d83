package caddymodule

import (
	"io"
	"net/http"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// sessionWriter sees the upstream's response headers as reverse_proxy writes
// them to the client, before any body: there it learns the session a
// response creates, or applies the answer to a pinned request to the table.
// It changes nothing in the response, except that with sealed session IDs
// the response's Mcp-Session-Id becomes the client's value. The wrapper is
// embedded by value, so that wrapping costs one allocation per request,
// not two.
type sessionWriter struct {
	caddyhttp.ResponseWriterWrapper
	h *Handler
	r *http.Request
	// id and up are the request's session and its upstream; empty and nil
	// for a request without a session, whose response may teach one.
	id          string
	up          *session.Upstream
	wroteHeader bool
	// fo is set for a session that can fail over (failover.go).
	fo *pinnedFailover
	// sse is the GET's SSE stream read for a legacy HTTP+SSE session; nil
	// for other responses.
	sse *legacyStream
}

func newSessionWriter(w http.ResponseWriter, h *Handler, r *http.Request, id string, up *session.Upstream) *sessionWriter {
	return &sessionWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, h: h, r: r, id: id, up: up}
}

// WriteHeader observes the final status and headers once, then writes them.
// Informational (1xx) responses pass through unobserved.
func (sw *sessionWriter) WriteHeader(status int) {
	if sw.held() {
		return
	}
	if !sw.wroteHeader && status >= 200 && sw.fo.holds404(sw.r, sw.up, status) {
		sw.fo.held = true // a failover answers instead
		return
	}
	if !sw.wroteHeader && status >= 200 {
		sw.wroteHeader = true
		sw.observe(status)
	}
	sw.ResponseWriter.WriteHeader(status)
}

// held reports whether the upstream's answer is held back for a failover.
func (sw *sessionWriter) held() bool { return sw.fo != nil && sw.fo.held }

func (sw *sessionWriter) observe(status int) {
	if sw.h.sealer != nil {
		sw.h.sealer.sealResponse(sw.r, sw.Header(), sw.id, sw.up)
	} else if sw.fo != nil && sw.fo.sent != sw.id {
		restoreSessionID(sw.Header(), sw.fo.sent, sw.id)
	}
	sw.h.answered(sw.r, sw.up)
	switch {
	case sw.up != nil:
		sw.h.evictAfter(sw.r, sw.id, status)
		if status == http.StatusOK && sw.r.Method == http.MethodGet {
			sw.up.MarkServedStream()
		}
	case status >= 200 && status < 300:
		sw.h.learn(sw.r, sw.Header())
		sw.watchLegacyStream(status)
	}
}

// Write writes the header first, as http.ResponseWriter does, so that it is observed.
func (sw *sessionWriter) Write(b []byte) (int, error) {
	if sw.held() {
		return len(b), nil
	}
	if !sw.wroteHeader {
		sw.WriteHeader(http.StatusOK)
	}
	if sw.sse != nil && (sw.sse.watching || len(sw.sse.held) > 0) {
		return sw.writeWatched(b)
	}
	return sw.ResponseWriter.Write(b)
}

// ReadFrom writes the header first, so that it is observed, then copies
// from r as the wrapped writer does.
func (sw *sessionWriter) ReadFrom(r io.Reader) (int64, error) {
	if sw.held() {
		return io.Copy(io.Discard, r)
	}
	if !sw.wroteHeader {
		sw.WriteHeader(http.StatusOK)
	}
	if sw.sse != nil {
		return io.Copy(struct{ io.Writer }{sw}, r) // through Write, which reads the stream
	}
	return sw.ResponseWriterWrapper.ReadFrom(r)
}

// FlushError flushes the response to the client; a flush before any header
// writes a 200, which is observed first. reverse_proxy flushes SSE through
// http.ResponseController, which finds this method.
func (sw *sessionWriter) FlushError() error {
	if sw.held() {
		return nil
	}
	if !sw.wroteHeader {
		sw.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(sw.ResponseWriter).Flush()
}

// Flush implements http.Flusher on top of FlushError.
func (sw *sessionWriter) Flush() { _ = sw.FlushError() }

// Interface guards
var (
	_ http.ResponseWriter = (*sessionWriter)(nil)
	_ http.Flusher        = (*sessionWriter)(nil)
	_ io.ReaderFrom       = (*sessionWriter)(nil)
)
