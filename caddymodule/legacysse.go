package caddymodule

import (
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
)

// The legacy HTTP+SSE transport (MCP 2024-11-05, transports §HTTP with SSE)
// has two endpoints: a GET opens an SSE stream whose first event, `endpoint`,
// names the URL the client POSTs its messages to, and the server answers
// them on that stream. The spec names no session parameter; the SDKs put
// the session in that URL's query string. The session lives as long as its
// stream: every SDK server forgets it when the GET ends.
//
// The handler learns session -> upstream from the endpoint event as the
// stream passes, pins the POSTs that carry the session to the stream's
// upstream, and forgets the session when the stream closes.

// legacyStream is a GET's SSE response that the handler reads for its
// first event, and the legacy session it announced.
type legacyStream struct {
	held     []byte // bytes of the first event not passed on yet
	watching bool   // the first event has not ended yet
	id       string // the session the endpoint event announced; "" if none
	up       *session.Upstream
}

// legacyParams returns the query parameters that carry legacy sessions, or
// nil when legacy HTTP+SSE pinning is off.
func (h *Handler) legacyParams() []string {
	switch {
	case h.DisableLegacySSE:
		return nil
	case len(h.LegacySSEParams) > 0:
		return h.LegacySSEParams
	}
	return DefaultLegacySSEParams
}

// isLegacyPost reports whether r is a POST of a legacy HTTP+SSE session.
func isLegacyPost(r *http.Request) bool {
	return exchangeOf(r).legacyPost
}

// watchLegacyStream starts reading the response for an endpoint event if it
// can announce a legacy session: a 2xx, uncompressed SSE response to a GET
// without a session, with legacy pinning on.
func (sw *sessionWriter) watchLegacyStream(status int) {
	if sw.r.Method != http.MethodGet || status < 200 || status > 299 || sw.h.legacyParams() == nil {
		return
	}
	hdr := sw.Header()
	media, _, err := mime.ParseMediaType(hdr.Get("Content-Type"))
	if err != nil || media != "text/event-stream" || hdr.Get("Content-Encoding") != "" {
		return
	}
	sw.sse = &legacyStream{watching: true}
}

// maxEndpointEvent is the most bytes of a GET's SSE response held back
// while the proxy waits for the end of its first event. The `endpoint`
// event of the legacy HTTP+SSE transport is a short URL; a stream whose
// first event is longer passes on unread and teaches no session.
const maxEndpointEvent = 16 << 10

// writeWatched passes b on to the client, holding back only an incomplete
// first event: the client dispatches an event at its end, so holding its
// start delays nothing a client sees. Blocks without an event (comments)
// pass on as they end. It returns len(b) once b is accepted.
func (sw *sessionWriter) writeWatched(b []byte) (int, error) {
	ls := sw.sse
	ls.held = append(ls.held, b...)
	for ls.watching {
		end := mcpwire.BlockEnd(ls.held)
		if end < 0 && len(ls.held) <= maxEndpointEvent {
			return len(b), nil
		}
		if end < 0 {
			ls.watching = false
			sw.h.logger.Warn("the first event of a GET's SSE response is longer than 16 KiB; not read for a legacy HTTP+SSE session")
			break
		}
		if _, err := sw.ResponseWriter.Write(sw.readBlock(ls.held[:end])); err != nil {
			return 0, err
		}
		ls.held = ls.held[end:]
	}
	rest := ls.held
	ls.held = nil
	if len(rest) == 0 {
		return len(b), nil
	}
	if _, err := sw.ResponseWriter.Write(rest); err != nil {
		return 0, err
	}
	return len(b), nil
}

// readBlock reads one complete block of a watched stream and returns the
// bytes to pass on: the block itself, or the endpoint event with its URL
// rewritten for the client. The first event ends the watch.
func (sw *sessionWriter) readBlock(block []byte) []byte {
	ev := mcpwire.ParseEvent(block)
	if !ev.Dispatched() {
		return block
	}
	sw.sse.watching = false
	if ev.EventType() != "endpoint" || ev.DataLines != 1 {
		return block
	}
	endpoint := sw.h.learnEndpoint(sw, string(ev.Data))
	if endpoint == "" {
		return block
	}
	out := make([]byte, 0, len(block)+len(endpoint)-len(ev.Data))
	out = append(append(append(out, block[:ev.DataStart]...), endpoint...), block[ev.DataEnd:]...)
	return out
}

// learnEndpoint learns the session that an endpoint event's URL announces,
// pinned to the upstream that serves the stream, and returns the URL the
// client must be told instead, or "" to pass it on unchanged.
func (h *Handler) learnEndpoint(sw *sessionWriter, raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	id, problem := querySession(u.RawQuery, h.legacyParams(), h.MaxSessionIDLength)
	if problem != "" {
		h.logger.Warn("unusable legacy HTTP+SSE endpoint; session not pinned", zap.String("problem", problem))
	}
	sel := selectedUpstream(sw.r)
	if id == "" || sel == nil {
		return ""
	}
	if h.table.LearnFrom(id, sel.Dial, session.Origin{Principal: principalOf(sw.r, h.table.BindPrincipal())}) {
		decide(sw.r, decisionLearned, sel.Dial)
		h.debug("learned_legacy_sse", id, sel.Dial)
	}
	h.table.StreamOpened(id)
	sw.sse.id, sw.sse.up = id, h.table.UseUpstream(sel.Dial)
	sw.sse.up.AddStreams(1)
	return clientEndpoint(sw.r, u, sel.Dial)
}

// finishLegacyStream ends a watched stream when its response is done: it
// passes on what was held back (a stream that ended inside its first event)
// and forgets the session the stream announced, which ends with its stream.
func (sw *sessionWriter) finishLegacyStream() {
	ls := sw.sse
	if ls == nil {
		return
	}
	if len(ls.held) > 0 {
		_, _ = sw.ResponseWriter.Write(ls.held)
		ls.held = nil
	}
	if ls.id == "" {
		return
	}
	ls.up.AddStreams(-1)
	sw.h.table.Evict(ls.id, session.EvictStreamClosed)
	sw.h.debug("legacy_sse_stream_closed", ls.id, ls.up.Dial())
}

// clientEndpoint returns the endpoint URL u as the client must see it, or
// "" when u needs no change. Two rewrites, common reasons legacy clients
// fail behind a proxy:
//
//   - a path-absolute URL that lacks the path prefix the proxy stripped
//     (`handle_path /mcp/*`) gets it back;
//   - an absolute URL naming the upstream's own address becomes
//     path-absolute, so that the client resolves it against the URL it
//     connected to: the client-facing scheme, host and port, whatever
//     proxies or TLS terminators sit in front. (The TypeScript and Python
//     SDK clients refuse an endpoint of another origin.)
//
// Relative URLs resolve against the stream's URL, prefix included, and
// absolute URLs naming another host are the server's choice: both pass as
// they are.
func clientEndpoint(r *http.Request, u *url.URL, dial string) string {
	internal := u.Host != "" && internalAuthority(r, u, dial)
	switch {
	case u.Opaque != "" || u.Host != "" && !internal && u.Host != r.Host:
		return ""
	case u.Host == "" && !strings.HasPrefix(u.Path, "/"):
		return ""
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	if prefix := strippedPrefix(r); prefix != "" && path != prefix && !strings.HasPrefix(path, prefix+"/") {
		path = prefix + path
	}
	if !internal && path == u.EscapedPath() {
		return ""
	}
	out := *u
	out.Path, out.RawPath = "", "" // set below through the escaped form
	if internal {
		out.Scheme, out.Host, out.User = "", "", nil
	}
	return withEscapedPath(&out, path)
}

// withEscapedPath returns u as a string with the escaped path path.
func withEscapedPath(u *url.URL, path string) string {
	var b strings.Builder
	if u.Host != "" {
		b.WriteString(u.Scheme + "://")
		if u.User != nil {
			b.WriteString(u.User.String() + "@")
		}
		b.WriteString(u.Host)
	}
	b.WriteString(path)
	if u.ForceQuery || u.RawQuery != "" {
		b.WriteString("?" + u.RawQuery)
	}
	if u.Fragment != "" {
		b.WriteString("#" + u.EscapedFragment())
	}
	return b.String()
}

// strippedPrefix returns the path prefix that the routes before the
// handler stripped from the request (`handle_path`, `uri strip_prefix`):
// the start of the client's path that the request's path lacks, without a
// trailing slash; "" when the path was not shortened that way.
func strippedPrefix(r *http.Request) string {
	orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request)
	if !ok || orig.URL == nil {
		return ""
	}
	o, c := orig.URL.EscapedPath(), r.URL.EscapedPath()
	if len(o) <= len(c) || !strings.HasSuffix(o, c) {
		return ""
	}
	return strings.TrimSuffix(o[:len(o)-len(c)], "/")
}

// internalAuthority reports whether the absolute URL u names the upstream
// dialed at dial rather than the proxy: its host and port (the scheme's
// default port when none) are the upstream's, with any loopback name
// standing for any other; for a unix socket upstream, a loopback name on
// port 80, the Host the proxy sends such upstreams.
func internalAuthority(r *http.Request, u *url.URL, dial string) bool {
	if u.Host == r.Host {
		return false
	}
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		dial = repl.ReplaceAll(dial, "")
	}
	addr, err := caddy.ParseNetworkAddress(dial)
	if err != nil {
		return false
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if addr.IsUnixNetwork() {
		return port == "80" && isLoopbackHost(host)
	}
	if port != strconv.FormatUint(uint64(addr.StartPort), 10) {
		return false
	}
	return strings.EqualFold(host, addr.Host) || isLoopbackHost(host) && isLoopbackHost(addr.Host)
}
