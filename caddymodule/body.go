package caddymodule

import (
	"bytes"
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
// the plugin reads twice or under a key that folds to its name (400).
func (ex *exchange) readBody(r *http.Request, limit int64) (*mcpwire.Head, *fault) {
	if !ex.bodyRead {
		ex.bodyRead = true
		ex.body, ex.bodyFault = readRPC(r, limit)
		if rb, ok := r.Body.(*replayBody); ok && ex.bodyFault == nil {
			ex.raw = rb.buf // the whole body, before anything reads it
		}
	}
	return ex.body, ex.bodyFault
}

// readRPC reads and parses r's body; see readBody.
func readRPC(r *http.Request, limit int64) (*mcpwire.Head, *fault) {
	if r.ContentLength > limit {
		return nil, tooLarge(r.ContentLength, limit)
	}
	if r.Body == nil || r.Body == http.NoBody {
		return parseRPC(nil)
	}
	buf, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	r.Body = &replayBody{buf: buf, rest: r.Body}
	switch {
	case err != nil:
		return nil, &fault{status: http.StatusBadRequest, code: CodeInvalidRequest, message: "Bad Request: reading the request body: " + err.Error()}
	case int64(len(buf)) > limit:
		return nil, tooLarge(-1, limit)
	}
	return parseRPC(buf)
}

// readWhole reads a request body of known length up to MaxInMemoryBody
// into the exchange, where the mcp transport sends it from, and puts it
// back for anything else that reads r. The body is read before the
// request is routed, so that its upload is not counted against the
// upstream (pinned_timeout) and a body that ends early, or breaks, is the
// client's fault, answered without contacting an upstream. It returns the
// read's error; other bodies are left to stream.
func (ex *exchange) readWhole(r *http.Request) error {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength <= 0 || r.ContentLength > MaxInMemoryBody || ex.sent != nil {
		return nil
	}
	buf := make([]byte, r.ContentLength)
	if n, err := io.ReadFull(r.Body, buf); err != nil {
		r.Body = &replayBody{buf: buf[:n], rest: r.Body}
		return err
	}
	ex.sent = buf
	r.Body = io.NopCloser(bytes.NewReader(buf))
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
	buf  []byte
	rest io.ReadCloser
}

// Read reads the bytes read before, then the rest of the original body.
func (b *replayBody) Read(p []byte) (int, error) {
	if len(b.buf) > 0 {
		n := copy(p, b.buf)
		b.buf = b.buf[n:]
		return n, nil
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
