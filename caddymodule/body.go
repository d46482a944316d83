package caddymodule

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
)

// DefaultMaxBodySize is the default bound, in bytes, of the request body
// an `mcp` matcher reads: 4 MiB, the MCP Go SDK server's default
// (StreamableHTTPOptions.MaxRequestBodyBytes), so a body it would accept
// can always be checked.
const DefaultMaxBodySize = 4 << 20

// readBody reads the request body, at most limit bytes, once per request,
// and parses it; a later call returns the first one's outcome. It puts the
// body back so that the upstream receives it unchanged, even when it was
// too large to read whole. Errors are faults: a body over the limit (413),
// one that could not be read, is not a single JSON object, or names a field
// the plugin reads twice or under a key that folds to its name (400); or
// the proxy holds MaxBodyMemory of bodies already (503, refuseBodyMemory).
func (ex *exchange) readBody(r *http.Request, limit int64) (*mcpwire.Head, *fault) {
	if !ex.bodyRead {
		ex.bodyRead = true
		var buf []byte
		buf, ex.body, ex.bodyFault = ex.readRPC(r, limit)
		if ex.bodyFault == nil {
			ex.raw = buf // the whole body, before anything reads it
		}
	}
	return ex.body, ex.bodyFault
}

// readRPC reads and parses r's body; see readBody. buf is the body read.
func (ex *exchange) readRPC(r *http.Request, limit int64) (buf []byte, head *mcpwire.Head, f *fault) {
	if r.ContentLength > limit {
		return nil, nil, tooLarge(r.ContentLength, limit)
	}
	buf, whole, err := ex.readHead(r, limit)
	switch {
	case errors.Is(err, errBodyMemory):
		return nil, nil, refuseBodyMemory(r)
	case err != nil:
		return nil, nil, &fault{status: http.StatusBadRequest, code: CodeInvalidRequest, message: "Bad Request: reading the request body: " + err.Error()}
	case !whole:
		return nil, nil, tooLarge(-1, limit)
	}
	head, f = parseRPC(buf)
	return buf, head, f
}

// readWhole reads a request body of known length up to MaxInMemoryBody
// into the exchange, where the mcp transport sends it from, and puts it
// back for anything else that reads r. The body is read before the
// request is routed, so that its upload is not counted against the
// upstream (pinned_timeout) and a body that ends early, or breaks, is the
// client's fault, answered without contacting an upstream. It reads
// through readHead: a body an mcp matcher read whole already is not read
// or charged again, and the later reads of the request (failover's kept
// body, a stale initialize's check) get these bytes back too. It returns
// the read's error, errBodyMemory when the budget is spent (what was read
// is put back then); other bodies are left to stream.
func (ex *exchange) readWhole(r *http.Request) error {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength <= 0 || r.ContentLength > MaxInMemoryBody || ex.sent != nil {
		return nil
	}
	buf, _, err := ex.readHead(r, r.ContentLength)
	switch {
	case err != nil:
		return err
	case int64(len(buf)) != r.ContentLength: // net/http reports a short body as io.ErrUnexpectedEOF; a wrapped body may not
		return io.ErrUnexpectedEOF
	}
	ex.sent = buf
	return nil
}

// tooLarge is the fault of a body over the matcher's bound; size is -1 when unknown.
func tooLarge(size, limit int64) *fault {
	msg := fmt.Sprintf("Request body is larger than %d bytes, the most an mcp matcher of this proxy reads (max_body_size)", limit)
	if size >= 0 {
		msg = fmt.Sprintf("Request body of %d bytes is larger than %d bytes, the most an mcp matcher of this proxy reads (max_body_size)", size, limit)
	}
	return &fault{status: http.StatusRequestEntityTooLarge, code: CodeInvalidRequest, message: msg}
}

// replayBody is a request body that was partly or fully read: it returns
// the bytes read first, then the rest of the original body.
type replayBody struct {
	buf     []byte
	rest    io.ReadCloser
	eof     bool // rest is at its end: buf is the whole body
	started bool // Read was called: buf is what is left of the bytes read

	hold    *bodyHold // where buf is charged, when nothing else keeps it; nil otherwise
	charged int64     // bytes, given back to hold once buf is read
}

// Read reads the bytes read before, then the rest of the original body.
func (b *replayBody) Read(p []byte) (int, error) {
	b.started = true
	if len(b.buf) > 0 {
		n := copy(p, b.buf)
		b.buf = b.buf[n:]
		if len(b.buf) == 0 && b.hold != nil {
			b.buf = nil
			b.hold.giveBack(b.charged)
			b.hold = nil
		}
		return n, nil
	}
	if b.eof {
		return 0, io.EOF
	}
	return b.rest.Read(p)
}

// Close closes the original body.
func (b *replayBody) Close() error { return b.rest.Close() }

// parseRPC reads a JSON-RPC message with the head scanner
// (internal/mcpwire.Parse); a body it refuses is a 400 fault.
func parseRPC(body []byte) (*mcpwire.Head, *fault) {
	head, err := mcpwire.Parse(body)
	if err != nil {
		return nil, &fault{status: http.StatusBadRequest, code: err.Code, message: err.Message, id: err.ID}
	}
	return head, nil
}
