package caddymodule

import (
	"bytes"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"go.uber.org/zap"
)

// An upstream that refuses new sessions (a server at its session cap
// answering initialize 503, one whose dependency is down answering 500, one
// rate limiting with 429) must not become a black hole: least_sessions
// favours the upstream with the fewest sessions, and one that opens none
// always has the fewest. A refused initialize, which opened no session the
// client could use, is sent to another upstream instead, and the upstream
// gets no new sessions for a while; its pinned sessions keep working.

// Bounds of the time a refusing upstream gets no new sessions: its
// Retry-After (RFC 9110 §10.2.3) within them, else DefaultRefusalCooloff.
const (
	DefaultRefusalCooloff = 10 * time.Second
	minRefusalCooloff     = time.Second
	maxRefusalCooloff     = time.Minute
)

// maxHeldAnswer is the most bytes of a held refusal's body kept to send the
// client when no other upstream takes the session.
const maxHeldAnswer = 64 << 10

// refusal reports whether an answer of status with header to a request
// opening a session refuses it: 429, or any 5xx without an Mcp-Session-Id
// (the client never got a session, so sending the request elsewhere is
// safe).
func refusal(status int, header http.Header) bool {
	return (status == http.StatusTooManyRequests || status >= 500) && len(header[HeaderSessionID]) == 0
}

// refusalCooloff returns how long an upstream that refused with header gets
// no new sessions: its Retry-After, in seconds or as an HTTP date, within
// [minRefusalCooloff, maxRefusalCooloff]; DefaultRefusalCooloff without one.
func refusalCooloff(header http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(header.Get("Retry-After"))
	d := DefaultRefusalCooloff
	if secs, err := strconv.Atoi(v); err == nil {
		d = time.Duration(secs) * time.Second
	} else if at, err := http.ParseTime(v); err == nil {
		d = at.Sub(now)
	}
	return min(max(d, minRefusalCooloff), maxRefusalCooloff)
}

// heldAnswer is a refusal held back from the client while the request is
// sent to another upstream: what the client gets when none takes it.
type heldAnswer struct {
	status int
	header http.Header
	body   bytes.Buffer
}

// Write keeps b, up to maxHeldAnswer bytes in all.
func (a *heldAnswer) Write(b []byte) (int, error) {
	if room := maxHeldAnswer - a.body.Len(); room > 0 {
		a.body.Write(b[:min(len(b), room)])
	}
	return len(b), nil
}

// write sends the held answer to w, whose header is as before the attempt.
func (a *heldAnswer) write(w http.ResponseWriter) error {
	clear(w.Header())
	maps.Copy(w.Header(), a.header)
	w.Header().Del("Content-Length")
	w.WriteHeader(a.status)
	_, err := io.Copy(w, &a.body)
	return err
}

// leftRefusing records in t, and logs, that the upstream the request was
// sent to refused to open its session with answer a: the upstream gets no
// new sessions for its cooloff, and this request is not sent there again. It returns the
// upstream's dial address, "" if none was selected.
func leftRefusing(t *session.Table, logger *zap.Logger, r *http.Request, a *heldAnswer) string {
	sel := selectedUpstream(r)
	if sel == nil {
		return ""
	}
	cooloff := refusalCooloff(a.header, time.Now())
	t.MarkRefusing(sel.Dial, cooloff)
	noteTried(r, sel.Dial)
	logger.Warn("upstream refused a new session; it gets no new sessions for a while, and the request goes to another upstream",
		zap.String("upstream", sel.Dial), zap.Int("status", a.status), zap.Duration("cooloff", cooloff))
	return sel.Dial
}
