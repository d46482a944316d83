package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/journal"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"
)

// The journal (the `journal` setting): the proxy keeps the recent events
// of each session's SSE streams, POST responses and GET streams, and
// answers a GET whose Last-Event-ID it issued from them (MCP 2025-11-25
// transports, "Resumability and Redelivery"). A client whose connection
// breaks loses nothing: the proxy keeps reading the upstream's response
// for the journal's window instead of cancelling it.

// Values of [Handler.Journal].
const (
	JournalOn  = "on"
	JournalOff = "off"
)

// headerLastEventID is the header a client resumes a stream with (HTML
// Living Standard §9.2.4; MCP 2025-11-25 transports).
const headerLastEventID = "Last-Event-Id"

// journalOption returns the parser of the journal setting name.
func (s *TableSettings) journalOption(d *caddyfile.Dispenser, name string) func(string) error {
	switch name {
	case "journal":
		return func(v string) error {
			if v != JournalOn && v != JournalOff {
				return d.Errf("journal: '%s' must be '%s' or '%s'", v, JournalOn, JournalOff)
			}
			s.Journal = v
			return nil
		}
	case "journal_window":
		return func(v string) error {
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("journal_window: '%s' is not a positive duration such as 30s or 5m", v)
			}
			s.JournalWindow = caddy.Duration(dur)
			return nil
		}
	case "journal_session_bytes":
		return func(v string) error { return parseSize(d, name, v, &s.JournalSessionBytes) }
	}
	return func(v string) error { return parseSize(d, name, v, &s.JournalTotalBytes) }
}

// validateJournal checks the journal settings of s.
func (s TableSettings) validateJournal() error {
	switch {
	case s.Journal != "" && s.Journal != JournalOn && s.Journal != JournalOff:
		return fmt.Errorf("journal must be %q or %q, got %q", JournalOn, JournalOff, s.Journal)
	case s.JournalWindow < 0 || s.JournalSessionBytes < 0 || s.JournalTotalBytes < 0:
		return fmt.Errorf("journal_window, journal_session_bytes and journal_total_bytes must be positive, got %s, %d, %d",
			time.Duration(s.JournalWindow), s.JournalSessionBytes, s.JournalTotalBytes)
	}
	return nil
}

// configureJournal applies the journal settings of cfg to t, once its
// store is set: while the setting is on, a journal in Redis with the
// redis store, shared by the replicas, else in this process's memory;
// either is kept across reloads.
func configureJournal(t *session.Table, cfg TableConfig) {
	if cfg.Journal != JournalOn {
		t.SetJournal(nil, journal.Limits{})
		return
	}
	limits := journal.Limits{
		Window: time.Duration(cfg.JournalWindow), SessionBytes: int64(cfg.JournalSessionBytes), TotalBytes: int64(cfg.JournalTotalBytes),
	}.WithDefaults()
	if shared, ok := t.Store().(interface {
		Journal(journal.Limits) journal.Journal
	}); ok {
		t.SetJournal(shared.Journal(limits), limits)
		return
	}
	j, _ := t.Journal()
	m, _ := j.(*journal.Memory)
	if m == nil {
		m = journal.NewMemory(limits)
	}
	m.SetLimits(limits)
	t.SetJournal(m, limits)
}

// parseSize parses v, a positive size such as 4MiB or 1048576, into dst.
func parseSize(d *caddyfile.Dispenser, name, v string, dst *int) error {
	n, err := humanize.ParseBytes(v)
	if err != nil || n == 0 || n > math.MaxInt32*1024 {
		return d.Errf("%s: '%s' is not a positive size such as 4MiB or 1048576", name, v)
	}
	*dst = int(n)
	return nil
}

// journalHooks serves a pinned request of session id with the table's
// journal, when it is on: a GET resuming a stream the journal holds is
// answered from it (done true, with its error); any other GET or POST is
// given a writer that records its SSE events and a context that outlives
// the client's connection for the journal's window, which end must be
// called with once the request is served. A DELETE ends the session's
// journaled requests at once, and drops its events once end is called.
func (h *Handler) journalHooks(w http.ResponseWriter, r *http.Request, id string) (_ http.ResponseWriter, _ *http.Request, end func(), done bool, err error) {
	j, limits := h.table.Journal()
	if _, inner := w.(*journalWriter); j == nil || inner { // off, or a failover serving the request again
		return w, r, func() {}, false, nil
	}
	switch r.Method {
	case http.MethodDelete: // the client ends the session: its calls read on for it end first
		endDetached(h.table, id)
		return w, r, func() { _ = j.Drop(context.Background(), id) }, false, nil
	case http.MethodGet, http.MethodPost:
	default:
		return w, r, func() {}, false, nil
	}
	if r.Method == http.MethodGet {
		if done, err := h.resume(w, r, id, j); done {
			return w, r, func() {}, true, err
		}
		replaceGoneGETs(h.table, id)
	}
	jw, r, end := h.journaled(w, r, id, j, limits.Window)
	return jw, r, end, false, nil
}

// resume answers a GET whose Last-Event-ID the proxy issued from the
// journal, when it holds the events after it: those events, then the live
// rest of that stream, until it ends. For an ID the journal does not hold,
// it sets Last-Event-ID to the upstream's own ID, or removes it if the
// upstream sent none, for the upstream to answer (done false).
func (h *Handler) resume(w http.ResponseWriter, r *http.Request, id string, j journal.Journal) (done bool, err error) {
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
		countResume(h.table, false)
		h.debug("resume_upstream", id, "")
		endGoneStream(h.table, id, jid.Stream)
		if jid.Upstream != "" {
			r.Header.Set(headerLastEventID, jid.Upstream)
		} else {
			r.Header.Del(headerLastEventID)
		}
		return false, nil
	case !started && err == nil: // the stream ended with the event the client has
		writeStreamHeaders(w)
	}
	countResume(h.table, true)
	h.debug("resumed", id, "", zap.Bool("complete", err == nil))
	return true, nil // an error is the client's going away again: it may resume again
}

// resumeCounts counts a table's GETs with a Last-Event-ID the proxy
// issued, by who answered them.
type resumeCounts struct{ journal, upstream atomic.Uint64 }

// resumes holds the resumeCounts of each table (*session.Table).
var resumes sync.Map

// countResume counts a resuming GET of t, answered from the journal or not.
func countResume(t *session.Table, fromJournal bool) {
	v, _ := resumes.LoadOrStore(t, new(resumeCounts))
	c := v.(*resumeCounts)
	if fromJournal {
		c.journal.Add(1)
	} else {
		c.upstream.Add(1)
	}
}

// resumeCountsOf returns t's resuming GETs answered from the journal and
// sent to the upstream.
func resumeCountsOf(t *session.Table) (fromJournal, toUpstream uint64) {
	if v, ok := resumes.Load(t); ok {
		c := v.(*resumeCounts)
		return c.journal.Load(), c.upstream.Load()
	}
	return 0, 0
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
// context that the client's going away cancels only after window.
func (h *Handler) journaled(w http.ResponseWriter, r *http.Request, id string, j journal.Journal, window time.Duration) (*journalWriter, *http.Request, func()) {
	jw := &journalWriter{ResponseWriter: w, j: j, session: id, logger: h.logger}
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	var mu sync.Mutex
	var timer *time.Timer
	stop := context.AfterFunc(r.Context(), func() {
		jw.gone.Store(true)
		mu.Lock()
		timer = time.AfterFunc(window, cancel)
		mu.Unlock()
	})
	key := detachedKey{h.table, id}
	addDetached(key, jw, journaledRequest{cancel: cancel, get: r.Method == http.MethodGet, done: make(chan struct{})})
	return jw, r.WithContext(ctx), func() {
		stop()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		jw.finish()
		cancel()
		removeDetached(key, jw)
	}
}

// detachedKey names a session of a table.
type detachedKey struct {
	t  *session.Table
	id string
}

// journaledRequest is a journaled request in progress.
type journaledRequest struct {
	cancel context.CancelFunc
	get    bool          // a GET: a stream of the session's own
	done   chan struct{} // closed once the request is served
}

// detached holds each session's journaled requests, which a DELETE of the
// session, or a new GET, ends.
var detached = struct {
	sync.Mutex
	m map[detachedKey]map[*journalWriter]journaledRequest
}{m: map[detachedKey]map[*journalWriter]journaledRequest{}}

func addDetached(k detachedKey, jw *journalWriter, req journaledRequest) {
	detached.Lock()
	defer detached.Unlock()
	if detached.m[k] == nil {
		detached.m[k] = map[*journalWriter]journaledRequest{}
	}
	detached.m[k][jw] = req
}

func removeDetached(k detachedKey, jw *journalWriter) {
	detached.Lock()
	defer detached.Unlock()
	if req, ok := detached.m[k][jw]; ok {
		close(req.done)
	}
	delete(detached.m[k], jw)
	if len(detached.m[k]) == 0 {
		delete(detached.m, k)
	}
}

// endDetached cancels the journaled requests of session id of t: a DELETE
// ended the session.
func endDetached(t *session.Table, id string) {
	detached.Lock()
	defer detached.Unlock()
	for _, req := range detached.m[detachedKey{t, id}] {
		req.cancel()
	}
}

// replaceGoneGETs ends the GET streams of session id of t that the proxy
// goes on reading for a client that went away, before a new GET of the
// session goes to the upstream: servers allow one GET stream per session
// (the TypeScript SDK answers a second one 409), and a client that opens
// a new one instead of resuming has given the old one up.
func replaceGoneGETs(t *session.Table, id string) {
	endGone(t, id, func(_ *journalWriter, req journaledRequest) bool { return req.get })
}

// endGoneStream ends the reading of stream of session id of t for a client
// that went away, before the upstream is asked to replay it: a server
// replays a stream only once its first connection has closed (the
// TypeScript SDK answers 409 while it is open).
func endGoneStream(t *session.Table, id, stream string) {
	endGone(t, id, func(jw *journalWriter, _ journaledRequest) bool {
		p := jw.shared.Load()
		return p != nil && *p == stream
	})
}

// endGone cancels the journaled requests of session id of t whose client
// went away and that match, and waits for them to end, at most
// replaceWait.
func endGone(t *session.Table, id string, match func(*journalWriter, journaledRequest) bool) {
	detached.Lock()
	var done []chan struct{}
	for jw, req := range detached.m[detachedKey{t, id}] {
		if jw.gone.Load() && match(jw, req) {
			req.cancel()
			done = append(done, req.done)
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
