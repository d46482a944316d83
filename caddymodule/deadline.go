package caddymodule

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Caddy's server timeouts bound the writing of a response as a whole:
// `timeouts { write D }` is a deadline D after the request came
// (http.Server.WriteTimeout over HTTP/1.1 and HTTP/2, and the ceiling of
// Caddy's write_idle writer over every protocol, HTTP/3 included), and
// `write_idle T min_rate R` cuts a response that sent fewer than R bytes
// a second since the request came. Either cuts an SSE stream that stays
// open, and the answer of a tool call that takes longer, which MCP makes
// the usual case. So the handler lifts both while the upstream answers a
// GET or a POST (the requests whose answer may be a stream, or come after
// a long call), and puts them back at the response's headers unless the
// response is a stream (text/event-stream): such a response gets D to be
// written counted from its headers, and its R counted from them. A stream
// keeps write_idle's T, which drops a client that stops reading, and gets
// D again once the upstream ends it, for what is left to write.
//
// The deadlines are set through http.ResponseController, which finds
// Caddy's write_idle writer or, without one, the connection's writer
// through the Unwrap method of the writers between. A writer in between
// without Unwrap (a third-party handler's) hides them: the handler then
// logs a warning once, naming the setting and what it cuts.

// writeLimits is what the handler lifted of the server's write limits for
// one request.
type writeLimits struct {
	// on: the limits are lifted, and not yet put back.
	on bool
	// stream: the response is a stream, which keeps them lifted.
	stream bool
	// timeout is the server's write timeout, 0 if none.
	timeout time.Duration
	// idle is Caddy's write_idle writer of the request, nil if none.
	idle *caddyhttp.IdleTimeoutWriter
}

// liftWriteLimits lifts the server's write timeout for r, a GET or a
// POST, whose response ex writes, while the upstream answers (see above),
// and records the limits to put back. It does nothing when neither a
// write timeout nor write_idle's minimum rate is set. It returns the
// server's write timeout and why it could not be lifted, if it could not.
func liftWriteLimits(ex *exchange, r *http.Request) (time.Duration, error) {
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		return 0, nil
	}
	var timeout time.Duration
	if srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); srv != nil {
		timeout = time.Duration(srv.WriteTimeout)
	}
	_, idle := caddyhttp.IdleTimeoutsFromContext(r.Context())
	if timeout <= 0 && (idle == nil || idle.Deadline.MinRate <= 0) {
		return 0, nil
	}
	l := writeLimits{on: true, timeout: max(timeout, 0), idle: idle}
	if err := l.setDeadline(ex.ResponseWriter, time.Time{}); err != nil {
		return timeout, err
	}
	ex.limits = l
	return timeout, nil
}

// atHeaders puts the limits back at the response's final headers, written
// through w, unless header makes the response a stream: a stream only
// loses write_idle's minimum rate, which a quiet stream never meets.
func (l *writeLimits) atHeaders(w http.ResponseWriter, header http.Header) {
	if l.stream = isEventStream(header); !l.stream {
		l.putBack(w)
		return
	}
	if l.idle != nil && l.idle.Deadline.MinRate > 0 {
		l.idle.Override(l.idle.Deadline.Timeout, 0, 0)
	}
}

// putBack applies the write timeout, and write_idle's minimum rate, of a
// response that is not a stream again, counted from now; of a stream, the
// write timeout alone, for what is left to write.
func (l *writeLimits) putBack(w http.ResponseWriter) {
	if !l.on {
		return
	}
	if l.idle != nil && l.idle.Deadline.MinRate > 0 && !l.stream {
		l.idle.Override(l.idle.Deadline.Timeout, l.idle.Deadline.MinRate, 0)
	}
	if l.timeout > 0 {
		_ = l.setDeadline(w, time.Now().Add(l.timeout))
	}
	l.on = false
}

// setDeadline sets the write deadline of the response written through w
// to d (zero: none), also as the ceiling of Caddy's write_idle writer,
// which would otherwise put the server's write timeout back at its next
// write. It returns http.ErrNotSupported when no writer under w can set
// it; a hijacked connection is not an error.
func (l *writeLimits) setDeadline(w http.ResponseWriter, d time.Time) error {
	if l.timeout <= 0 {
		return nil
	}
	if l.idle != nil {
		l.idle.Deadline.HardDeadline = d
	}
	err := http.NewResponseController(w).SetWriteDeadline(d)
	if errors.Is(err, http.ErrHijacked) {
		return nil
	}
	return err
}

// isEventStream reports whether header makes a response an SSE stream.
func isEventStream(header http.Header) bool {
	const sse = "text/event-stream"
	ct := header.Get("Content-Type")
	return len(ct) >= len(sse) && strings.EqualFold(ct[:len(sse)], sse)
}
