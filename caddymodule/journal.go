package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/journal"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"go.uber.org/zap"
)

// The journal (the `journal` setting): the proxy keeps the recent events
// of each session's SSE streams, POST responses and GET streams, and
// answers a GET whose Last-Event-ID it issued from them (MCP 2025-11-25
// transports, "Resumability and Redelivery"). A client whose connection
// breaks loses nothing: the proxy keeps reading the upstream's response
// for the journal's window instead of cancelling it.

// headerLastEventID is the header a client resumes a stream with (HTML
// Living Standard §9.2.4; MCP 2025-11-25 transports).
const headerLastEventID = "Last-Event-Id"

// journaling is a handler's side of its table's journal (the events of
// its sessions' SSE streams, kept for resumption; internal/journal).
type journaling struct {
	table  *session.Table
	logger *zap.Logger
}

// journalHooks serves a pinned request of session id with the table's
// journal, when it is on: a GET resuming a stream the journal holds is
// answered from it (done true, with its error); any other GET or POST is
// given a writer that records its SSE events and a context that outlives
// the client's connection for the journal's window, which end must be
// called with once the request is served. A DELETE ends the session's
// journaled requests at once, and drops its events once end is called.
func (jn *journaling) journalHooks(w http.ResponseWriter, r *http.Request, id string) (_ http.ResponseWriter, _ *http.Request, end func(), done bool, err error) {
	j, limits := jn.table.Journal()
	if _, inner := w.(*journalWriter); j == nil || inner { // off, or a failover serving the request again
		return w, r, func() {}, false, nil
	}
	switch r.Method {
	case http.MethodDelete: // the client ends the session: its calls read on for it end first
		endDetached(jn.table, id)
		return w, r, func() { _ = j.Drop(context.Background(), id) }, false, nil
	case http.MethodGet, http.MethodPost:
	default:
		return w, r, func() {}, false, nil
	}
	if r.Method == http.MethodGet {
		if done, err := jn.resume(w, r, id, j); done {
			return w, r, func() {}, true, err
		}
		replaceGoneGETs(jn.table, id)
	}
	jw, r, end := jn.journaled(w, r, id, j, limits.Window)
	return jw, r, end, false, nil
}

// resume answers a GET whose Last-Event-ID the proxy issued from the
// journal, when it holds the events after it: those events, then the live
// rest of that stream, until it ends. For an ID the journal does not hold,
// it sets Last-Event-ID to the upstream's own ID, or removes it if the
// upstream sent none, for the upstream to answer (done false).
func (jn *journaling) resume(w http.ResponseWriter, r *http.Request, id string, j journal.Journal) (done bool, err error) {
	values := r.Header.Values(headerLastEventID)
	if len(values) != 1 {
		return false, nil
	}
	jid, ok := journal.ParseID(values[0])
	if !ok {
		return false, nil
	}
	started := false
	err = j.Follow(r.Context(), id, jid.Stream, jid.Seq, func(ev journal.Event) error {
		if !started {
			started = true
			writeStreamHeaders(w)
		}
		return writeEvent(w, jid.Stream, ev)
	})
	switch {
	case errors.Is(err, journal.ErrNotHeld) && !started:
		countResume(jn.table, false)
		logDebug(jn.logger, "resume_upstream", id, "")
		endGoneStream(jn.table, id, jid.Stream)
		if jid.Upstream != "" {
			r.Header.Set(headerLastEventID, jid.Upstream)
		} else {
			r.Header.Del(headerLastEventID)
		}
		return false, nil
	case !started && err == nil: // the stream ended with the event the client has
		writeStreamHeaders(w)
	}
	countResume(jn.table, true)
	logDebug(jn.logger, "resumed", id, "", zap.Bool("complete", err == nil))
	return true, nil // an error is the client's going away again: it may resume again
}

// writeStreamHeaders writes the headers of a resumed SSE stream.
func writeStreamHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
}

// writeEvent writes one journaled event of stream, with its ID, and
// flushes it.
func writeEvent(w http.ResponseWriter, stream string, ev journal.Event) error {
	if _, err := w.Write(eventBlock(stream, ev)); err != nil {
		return err
	}
	return http.NewResponseController(w).Flush()
}

// eventBlock returns the SSE block of a journaled event: its id field,
// the proxy's ID, then the upstream's block without its own.
func eventBlock(stream string, ev journal.Event) []byte {
	id := ev.ID(stream).String()
	b := make([]byte, 0, len("id: \n")+len(id)+len(ev.Block))
	b = append(b, "id: "...)
	b = append(b, id...)
	b = append(b, '\n')
	return append(b, ev.Block...)
}

// journaled wraps w in a journalWriter for session id, and gives r a
// context that the client's going away cancels only after window. The
// returned func ends the call once it is served.
func (jn *journaling) journaled(w http.ResponseWriter, r *http.Request, id string, j journal.Journal, window time.Duration) (*journalWriter, *http.Request, func()) {
	c := &journaledCall{key: detachedKey{jn.table, id}, get: r.Method == http.MethodGet, window: window}
	c.jw = journalWriter{ResponseWriter: w, j: j, session: id, logger: jn.logger}
	var ctx context.Context
	ctx, c.cancel = context.WithCancel(context.WithoutCancel(r.Context()))
	c.stopWatch = context.AfterFunc(r.Context(), c.clientGone)
	addDetached(c)
	return &c.jw, r.WithContext(ctx), c.end
}

// journaledCall is a journaled request in progress: its writer, and what
// ends the reading of the upstream's response.
type journaledCall struct {
	jw        journalWriter
	key       detachedKey
	get       bool // a GET: a stream of the session's own
	window    time.Duration
	cancel    context.CancelFunc // ends the request to the upstream
	stopWatch func() bool        // stops the watch on the client's context

	mu    sync.Mutex
	timer *time.Timer // from the client's going away, window long

	// Guarded by detached's lock:
	done       chan struct{}  // closed once the call is served; made by the first endGone waiting for it
	prev, next *journaledCall // the session's other calls in detached
}

// clientGone starts the window after which the call ends: the client's
// connection broke.
func (c *journaledCall) clientGone() {
	c.jw.gone.Store(true)
	c.mu.Lock()
	c.timer = time.AfterFunc(c.window, c.cancel)
	c.mu.Unlock()
}

// end ends the call once it is served: it stops its watch and timer,
// records the stream's end, and cancels the upstream request.
func (c *journaledCall) end() {
	c.stopWatch()
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	c.jw.finish()
	c.cancel()
	removeDetached(c)
}

// detachedKey names a session of a table.
type detachedKey struct {
	t  *session.Table
	id string
}

// detached holds each session's journaled calls, a list linked through
// the calls, which a DELETE of the session, or a new GET, ends.
var detached = struct {
	sync.Mutex
	m map[detachedKey]*journaledCall
}{m: map[detachedKey]*journaledCall{}}

func addDetached(c *journaledCall) {
	detached.Lock()
	defer detached.Unlock()
	if head := detached.m[c.key]; head != nil {
		c.next, head.prev = head, c
	}
	detached.m[c.key] = c
}

func removeDetached(c *journaledCall) {
	detached.Lock()
	defer detached.Unlock()
	if c.done != nil {
		close(c.done)
	}
	switch {
	case c.prev != nil:
		c.prev.next = c.next
	case c.next != nil:
		detached.m[c.key] = c.next
	default:
		delete(detached.m, c.key)
	}
	if c.next != nil {
		c.next.prev = c.prev
	}
	c.prev, c.next = nil, nil
}

// endDetached cancels the journaled calls of session id of t: a DELETE
// ended the session.
func endDetached(t *session.Table, id string) {
	detached.Lock()
	defer detached.Unlock()
	for c := detached.m[detachedKey{t, id}]; c != nil; c = c.next {
		c.cancel()
	}
}

// replaceGoneGETs ends the GET streams of session id of t that the proxy
// goes on reading for a client that went away, before a new GET of the
// session goes to the upstream: servers allow one GET stream per session
// (the TypeScript SDK answers a second one 409), and a client that opens
// a new one instead of resuming has given the old one up.
func replaceGoneGETs(t *session.Table, id string) {
	endGone(t, id, func(c *journaledCall) bool { return c.get })
}

// endGoneStream ends the reading of stream of session id of t for a client
// that went away, before the upstream is asked to replay it: a server
// replays a stream only once its first connection has closed (the
// TypeScript SDK answers 409 while it is open).
func endGoneStream(t *session.Table, id, stream string) {
	endGone(t, id, func(c *journaledCall) bool {
		p := c.jw.shared.Load()
		return p != nil && *p == stream
	})
}

// endGone cancels the journaled calls of session id of t whose client
// went away and that match, and waits for them to end, at most
// replaceWait.
func endGone(t *session.Table, id string, match func(*journaledCall) bool) {
	detached.Lock()
	var done []chan struct{}
	for c := detached.m[detachedKey{t, id}]; c != nil; c = c.next {
		if c.jw.gone.Load() && match(c) {
			c.cancel()
			if c.done == nil {
				c.done = make(chan struct{})
			}
			done = append(done, c.done)
		}
	}
	detached.Unlock()
	timeout := time.After(replaceWait)
	for _, d := range done {
		select {
		case <-d:
		case <-timeout:
			return
		}
	}
}

// replaceWait bounds how long a new GET waits for the streams it replaces.
const replaceWait = time.Second

// journalWriter records the SSE events of a response in the journal, each
// under an ID of the proxy's, which replaces the upstream's own in what
// the client gets. Once the client has gone away, it drops what it writes
// and reports success, so that reverse_proxy goes on reading the
// upstream's response into the journal. Responses that are not an SSE
// stream pass unchanged.
type journalWriter struct {
	http.ResponseWriter
	j       journal.Journal
	session string
	logger  *zap.Logger

	wroteHeader bool
	stream      string                 // the stream's ID; "" for a response that is not recorded
	shared      atomic.Pointer[string] // stream, for other requests of the session (endGone)
	seq         uint64                 // the last event's Seq
	partial     []byte                 // the start of a block not yet complete
	gone        atomic.Bool
	failed      bool // an Append failed: the rest of the stream is not recorded
}

// WriteHeader starts recording a 200 SSE response without a content
// coding (which the proxy could not read).
func (jw *journalWriter) WriteHeader(status int) {
	if !jw.wroteHeader && status >= 200 {
		jw.wroteHeader = true
		if status == http.StatusOK && isEventStream(jw.Header()) && identityCoded(jw.Header()) {
			jw.stream = journal.NewStreamID()
			jw.shared.Store(&jw.stream)
		}
	}
	if !jw.gone.Load() {
		jw.ResponseWriter.WriteHeader(status)
	}
}

// identityCoded reports whether a response's body has no content coding.
func identityCoded(h http.Header) bool {
	ce := h.Get("Content-Encoding")
	return ce == "" || ce == "identity"
}

// Write records each complete SSE block of b and writes it, with the
// proxy's ID, to the client while it is there.
func (jw *journalWriter) Write(b []byte) (int, error) {
	if !jw.wroteHeader {
		jw.WriteHeader(http.StatusOK)
	}
	if jw.stream == "" {
		return jw.pass(b)
	}
	rest := b
	if len(jw.partial) > 0 {
		jw.partial = append(jw.partial, b...)
		rest = jw.partial
	}
	for {
		end := mcpwire.BlockEnd(rest)
		if end < 0 {
			break
		}
		_, _ = jw.pass(jw.record(rest[:end]))
		rest = rest[end:]
	}
	jw.partial = append(jw.partial[:0], rest...)
	return len(b), nil
}

// pass writes b to the client, unless it has gone away; a write that
// fails means it has.
func (jw *journalWriter) pass(b []byte) (int, error) {
	if jw.gone.Load() {
		return len(b), nil
	}
	if _, err := jw.ResponseWriter.Write(b); err != nil {
		jw.gone.Store(true)
	}
	return len(b), nil
}

// record journals one complete block and returns what the client gets of
// it: a block with an id or data field gets the proxy's ID in place of
// the upstream's; comments and retry fields pass as they are.
func (jw *journalWriter) record(block []byte) []byte {
	stripped, upstreamID, hasID, hasData := stripIDs(block)
	if !hasID && !hasData {
		return block
	}
	if jw.failed {
		return block
	}
	jw.seq++
	ev := journal.Event{Seq: jw.seq, Upstream: upstreamID, Block: stripped}
	err := jw.j.Append(context.Background(), jw.session, jw.stream, ev)
	switch {
	case errors.Is(err, journal.ErrFull): // recorded, the last of the stream to be
		jw.failed = true
		_ = jw.j.End(context.Background(), jw.session, jw.stream)
	case err != nil:
		// The client gets the upstream's IDs from here on, and can resume
		// from the upstream; a resume from the journal ends where it ends.
		jw.failed = true
		_ = jw.j.End(context.Background(), jw.session, jw.stream)
		jw.logger.Warn("journal: recording an event failed; the rest of the stream is not journaled", zap.Error(err))
		return block
	}
	return eventBlock(jw.stream, ev)
}

// stripIDs returns block without its id fields, the value of the last of
// them, whether it had one, and whether it had a data field (HTML Living
// Standard §9.2.6: a field is its line up to the first colon).
func stripIDs(block []byte) (stripped []byte, id string, hasID, hasData bool) {
	stripped = make([]byte, 0, len(block))
	for from := 0; from < len(block); {
		end, next := lineBounds(block, from)
		line := block[from:end]
		name, value, found := bytes.Cut(line, []byte(":"))
		switch string(name) {
		case "id":
			hasID = true
			if found {
				value, _ = bytes.CutPrefix(value, []byte(" "))
			}
			id = string(value)
		case "data":
			hasData = true
			fallthrough
		default:
			stripped = append(stripped, block[from:next]...)
		}
		from = next
	}
	return stripped, id, hasID, hasData
}

// lineBounds returns the end of the line of block that starts at from,
// and where the next line starts (after CRLF, LF or CR).
func lineBounds(block []byte, from int) (end, next int) {
	i := bytes.IndexAny(block[from:], "\r\n")
	if i < 0 {
		return len(block), len(block)
	}
	end = from + i
	if block[end] == '\r' && end+1 < len(block) && block[end+1] == '\n' {
		return end, end + 2
	}
	return end, end + 1
}

// finish writes what is left of an incomplete block, and records the
// stream's end.
func (jw *journalWriter) finish() {
	if len(jw.partial) > 0 {
		_, _ = jw.pass(jw.partial)
		jw.partial = nil
	}
	if jw.stream != "" && !jw.failed {
		_ = jw.j.End(context.Background(), jw.session, jw.stream)
	}
}

// FlushError flushes the response to the client while it is there.
func (jw *journalWriter) FlushError() error {
	if !jw.wroteHeader {
		jw.WriteHeader(http.StatusOK)
	}
	if jw.gone.Load() {
		return nil
	}
	if err := http.NewResponseController(jw.ResponseWriter).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		jw.gone.Store(true)
	}
	return nil
}

// Flush implements http.Flusher on top of FlushError.
func (jw *journalWriter) Flush() { _ = jw.FlushError() }

// Unwrap returns the wrapped writer, for http.ResponseController.
func (jw *journalWriter) Unwrap() http.ResponseWriter { return jw.ResponseWriter }

// Interface guards
var (
	_ http.ResponseWriter = (*journalWriter)(nil)
	_ http.Flusher        = (*journalWriter)(nil)
)
